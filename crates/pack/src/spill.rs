//! Samples handed over one at a time (Python's `brand.Writer`): each is
//! appended to an anonymous spill file as it comes, with only its end offset,
//! label and key held in memory, and the packer then reads them back through
//! [`SpillSource`] in packed order. The spill file has no name (unlinked at
//! creation), so however the process ends it leaves nothing behind.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use brand_format::error::{Error, IoContext, Result};

use crate::source::{Entries, Source};

/// What [`SpillSource::kind`] reports, and the manifest's provenance.
pub const KIND: &str = "writer";

/// Appends samples to an anonymous file in a directory.
pub struct SpillWriter {
    file: BufWriter<File>,
    /// The directory the spill file lives in (its only name, for errors).
    dir: PathBuf,
    /// Each sample's end offset in the file (it starts where the previous ends).
    ends: Vec<u64>,
    entries: Entries,
    /// Hashes of the keys so far: a repeated key is found without a second
    /// copy of every key (a hash match is confirmed against the keys).
    key_hashes: HashSet<u64, BuildHasherDefault<DefaultHasher>>,
}

impl SpillWriter {
    /// A writer spilling into a new anonymous file in `dir`.
    pub fn new(dir: &Path) -> Result<Self> {
        let file = tempfile::tempfile_in(dir).at(dir)?;
        Ok(SpillWriter {
            file: BufWriter::with_capacity(1 << 20, file),
            dir: dir.to_path_buf(),
            ends: Vec::new(),
            entries: Entries::new(),
            key_hashes: HashSet::default(),
        })
    }

    /// Samples written so far.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no sample was written.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Appends a sample. Its key defaults to its number in write order, in
    /// decimal ("0", "1", …); a key given twice is an error naming both samples
    /// (a key names one sample: `brand cat --key`).
    pub fn push(&mut self, data: &[u8], label: i64, key: Option<&[u8]>) -> Result<()> {
        let number = self.ends.len();
        let default_key;
        let key = match key {
            Some(k) => k,
            None => {
                default_key = number.to_string();
                default_key.as_bytes()
            }
        };
        let hash = self.key_hashes.hasher().hash_one(key);
        if !self.key_hashes.insert(hash)
            && let Some(first) = (0..self.entries.len()).find(|&i| self.entries.key(i) == key)
        {
            return Err(Error::config(format!(
                "key {:?} of sample {number} was already given to sample {first}: keys must be unique",
                String::from_utf8_lossy(key)
            )));
        }
        if u32::try_from(data.len()).is_err() {
            return Err(Error::config(format!(
                "sample {number} (key {:?}) is {} bytes; a record is limited to 4 GiB",
                String::from_utf8_lossy(key),
                data.len()
            )));
        }
        let end = self.ends.last().copied().unwrap_or(0) + data.len() as u64;
        self.file.write_all(data).map_err(|e| self.spill_error(e))?;
        self.ends.push(end);
        self.entries.push(key, label);
        Ok(())
    }

    fn spill_error(&self, e: std::io::Error) -> Error {
        Error::io(self.dir.join("<brand.Writer spill file>"), e)
    }

    /// The samples written, to pack.
    pub fn finish(self) -> Result<SpillSource> {
        let dir = self.dir.clone();
        let file = self
            .file
            .into_inner()
            .map_err(|e| Error::io(dir.join("<brand.Writer spill file>"), e.into_error()))?;
        let mut entries = self.entries;
        entries.shrink_to_fit();
        Ok(SpillSource {
            file,
            dir,
            ends: self.ends,
            entries,
        })
    }
}

/// The samples of a [`SpillWriter`], read back from its file.
pub struct SpillSource {
    file: File,
    dir: PathBuf,
    ends: Vec<u64>,
    entries: Entries,
}

impl Source for SpillSource {
    fn kind(&self) -> &'static str {
        KIND
    }
    fn len(&self) -> usize {
        self.ends.len()
    }
    fn key(&self, i: usize) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.entries.key(i))
    }
    fn label(&self, i: usize) -> i64 {
        self.entries.label(i)
    }
    fn read(&self, i: usize) -> Result<Vec<u8>> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        // At most 4 GiB (checked when written).
        let mut buf = vec![0; (self.ends[i] - start) as usize];
        self.file.read_exact_at(&mut buf, start).map_err(|e| {
            Error::io(
                self.dir
                    .join(format!("<brand.Writer spill file, sample {i} at byte {start}>")),
                e,
            )
        })?;
        Ok(buf)
    }
    fn listing_bytes(&self) -> usize {
        self.entries.heap_bytes() + self.ends.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: usize) -> Vec<u8> {
        (0..(i * 37) % 300).map(|b| (b ^ i) as u8).collect()
    }

    #[test]
    fn every_sample_reads_back_with_its_label_and_key_and_the_file_has_no_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SpillWriter::new(dir.path()).unwrap();
        for i in 0..500 {
            let key = (i % 3 != 0).then(|| format!("k/{i}"));
            w.push(&sample(i), i as i64 % 7 - 1, key.as_deref().map(str::as_bytes))
                .unwrap();
        }
        assert_eq!(w.len(), 500);
        // Nothing in the directory: the spill file is anonymous.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let s = w.finish().unwrap();
        assert_eq!((s.kind(), s.len()), (KIND, 500));
        for i in (0..500).rev() {
            assert_eq!(s.read(i).unwrap(), sample(i), "sample {i}");
            assert_eq!(s.label(i), i as i64 % 7 - 1);
            let key = if i % 3 != 0 { format!("k/{i}") } else { i.to_string() };
            assert_eq!(&*s.key(i), key.as_bytes());
        }
    }

    #[test]
    fn a_repeated_key_is_an_error_naming_both_samples() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SpillWriter::new(dir.path()).unwrap();
        w.push(b"a", 0, Some(b"x")).unwrap();
        w.push(b"b", 0, None).unwrap(); // key "1"
        w.push(b"c", 0, Some(b"y")).unwrap();
        let e = w.push(b"d", 0, Some(b"x")).unwrap_err().to_string();
        assert!(
            e.contains("\"x\"") && e.contains("sample 3") && e.contains("sample 0"),
            "{e}"
        );
        // A default key collides with a given one too.
        let e = w.push(b"e", 0, Some(b"1")).unwrap_err().to_string();
        assert!(e.contains("sample 1"), "{e}");
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn a_cancelled_pack_leaves_nothing() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let spill = dir.path().join("spill");
        std::fs::create_dir(&spill).unwrap();
        let mut w = SpillWriter::new(&spill).unwrap();
        (0..2000).for_each(|i| w.push(&sample(i), 0, None).unwrap());
        let source = w.finish().unwrap();
        let out = dir.path().join("ds");
        let opts = crate::PackOptions {
            chunk_size: 4,
            ..Default::default()
        };
        let cancel = AtomicBool::new(false);
        let calls = std::sync::atomic::AtomicU64::new(0);
        let hooks = crate::Hooks {
            progress: &|done, total, _| {
                assert!(done < total, "the pack went on after it was cancelled");
                calls.fetch_add(1, Ordering::Relaxed);
                cancel.store(true, Ordering::Relaxed);
            },
            cancel: &cancel,
        };
        let e = crate::pack_with(&source, &out, &opts, &hooks, &|_, _| Ok(())).unwrap_err();
        assert_eq!(e.to_string(), format!("invalid configuration: {}", crate::CANCELLED));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("spill")]);
        // Not cancelled, the same source packs.
        let m = crate::pack(&source, &out, &opts, &|_, _, _| {}).unwrap();
        assert_eq!(m.samples, 2000);
    }
}
