//! An opened dataset: its manifest and index, checked against each other.

use std::path::{Path, PathBuf};

use crate::buffer::AlignedBuf;
use crate::error::{Error, Result};
use crate::index::Index;
use crate::manifest::Manifest;
use crate::{INDEX_FILE, MANIFEST_FILE};

#[derive(Debug, Clone)]
pub struct Dataset {
    dir: PathBuf,
    pub manifest: Manifest,
    pub index: Index,
}

impl Dataset {
    /// Opens the dataset directory `dir`: loads the manifest and the index and
    /// checks that they describe the same dataset. Segments are not touched.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::io(
                &dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "not a dataset directory"),
            ));
        }
        let mpath = dir.join(MANIFEST_FILE);
        let manifest = Manifest::load(&mpath)?;
        let ipath = dir.join(INDEX_FILE);
        let index = Index::load(&ipath)?;
        Self::check(&ipath, &manifest, &index)?;
        Ok(Dataset { dir, manifest, index })
    }

    fn check(ipath: &Path, m: &Manifest, idx: &Index) -> Result<()> {
        let mismatch = |what: &str, a: u64, b: u64| {
            Error::format(ipath, 0, format!("index has {a} {what}, manifest.toml says {b}"))
        };
        if idx.samples() != m.samples {
            return Err(mismatch("samples", idx.samples(), m.samples));
        }
        if idx.chunk_size() != m.chunk_size {
            return Err(mismatch("as chunk size", idx.chunk_size() as u64, m.chunk_size as u64));
        }
        if idx.segment_count() as usize != m.segments.len() {
            return Err(mismatch(
                "segments",
                idx.segment_count() as u64,
                m.segments.len() as u64,
            ));
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn segment_path(&self, segment: u32) -> PathBuf {
        self.dir.join(&self.manifest.segments[segment as usize].name)
    }

    pub fn zstd(&self) -> bool {
        self.manifest.compression == "zstd"
    }

    /// The sample's original bytes from its stored bytes: checks the crc32c
    /// and decompresses. `stored` must be exactly the record's bytes.
    pub fn decode_record(&self, id: u64, stored: &[u8]) -> Result<Vec<u8>> {
        self.decode(id, stored, true).map(|b| b.to_vec())
    }

    /// Decodes into a fresh [`SAMPLE_ALIGN`](crate::buffer::SAMPLE_ALIGN)-aligned
    /// buffer, with the crc32c check optional (lengths and zstd frames are
    /// always checked). The io engine's path: one copy from the read buffer.
    pub fn decode(&self, id: u64, stored: &[u8], check_crc: bool) -> Result<AlignedBuf> {
        self.check_stored(id, stored, check_crc)?;
        if !self.zstd() {
            return Ok(AlignedBuf::copy_of(stored));
        }
        let raw_len = self.index.raw_len[id as usize] as usize;
        let mut out = AlignedBuf::for_sample(raw_len);
        let n = zstd::bulk::decompress_to_buffer(stored, out.as_mut_slice())
            .map_err(|e| self.corrupt(id, format!("zstd: {e}")))?;
        if n != raw_len {
            return Err(self.corrupt(id, format!("decompressed to {n} bytes, index says {raw_len}")));
        }
        Ok(out)
    }

    fn corrupt(&self, id: u64, what: String) -> Error {
        let (segment, offset, _) = self.index.record_location(id);
        Error::Corrupt {
            segment: self.segment_path(segment),
            chunk: self.index.chunk_of(id),
            offset,
            sample: id,
            what,
        }
    }

    /// Checks a record's length and (optionally) crc32c against the index.
    fn check_stored(&self, id: u64, stored: &[u8], check_crc: bool) -> Result<()> {
        let want = self.index.stored_len[id as usize] as usize;
        if stored.len() != want {
            return Err(self.corrupt(id, format!("record is {} bytes, index says {want}", stored.len())));
        }
        if check_crc {
            let (crc, expected) = (crc32c::crc32c(stored), self.index.crc[id as usize]);
            if crc != expected {
                return Err(self.corrupt(
                    id,
                    format!("crc32c mismatch (stored {expected:#010x}, computed {crc:#010x})"),
                ));
            }
        }
        Ok(())
    }

    /// Reads one sample with ordinary buffered I/O (for `cat`, `verify`,
    /// tests). The loader uses the io engine instead.
    pub fn read_sample(&self, id: u64) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        if id >= self.index.samples() {
            return Err(Error::config(format!(
                "sample {id} out of range: the dataset has {}",
                self.index.samples()
            )));
        }
        let (segment, offset, len) = self.index.record_location(id);
        let path = self.segment_path(segment);
        let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset).map_err(|e| Error::Corrupt {
            segment: path.clone(),
            chunk: self.index.chunk_of(id),
            offset,
            sample: id,
            what: format!("cannot read {len} bytes: {e}"),
        })?;
        self.decode_record(id, &buf)
    }
}
