//! The one [`Source`] of the importers that list where each sample's bytes
//! lie (tar, MDS, Parquet, Arrow): [`Listed`] over [`Payloads`].

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use brand_format::error::{Error, IoContext, Result};
use brand_pack::source::{Entries, Ints, Source};

/// An importer whose listing is [`Payloads`] (tar, MDS, Parquet, Arrow):
/// what it and its samples are called.
pub trait ListedFormat: Send + Sync + std::fmt::Debug {
    /// [`Source::kind`]: "tar".
    const KIND: &'static str;
    /// The input's name in errors: "tar", "MDS".
    const NAME: &'static str;
    /// What a sample is called in errors: "sample", "row".
    const NOUN: &'static str;
}

/// The samples an importer listed: where each one's bytes are, its key and
/// label; the class names; every input's identity. One [`Source`] for every
/// [`ListedFormat`].
#[derive(Debug)]
pub struct Listed<F> {
    pub(crate) payloads: Payloads,
    pub(crate) label_names: Vec<String>,
    /// Every input's path and identity ([`Source::inputs_identity`]).
    pub(crate) inputs_identity: String,
    pub(crate) format: std::marker::PhantomData<F>,
}

impl<F: ListedFormat> Source for Listed<F> {
    fn kind(&self) -> &'static str {
        F::KIND
    }

    fn len(&self) -> usize {
        self.payloads.len()
    }

    fn key(&self, i: usize) -> Cow<'_, [u8]> {
        self.payloads.key(i)
    }

    fn label(&self, i: usize) -> i64 {
        self.payloads.label(i)
    }

    fn read(&self, i: usize) -> Result<Vec<u8>> {
        self.payloads.read(i)
    }

    fn label_names(&self) -> Vec<String> {
        self.label_names.clone()
    }

    fn inputs_identity(&self) -> &str {
        &self.inputs_identity
    }

    fn listing_bytes(&self) -> usize {
        self.payloads.heap_bytes()
    }
}

/// A file samples' payloads lie in, from sample `first` on: read in place,
/// or (`spooled`) copied into the spool in order, once, because the input
/// can only be read in order (gzip, zstd, Parquet pages, an object).
#[derive(Debug)]
pub(crate) struct PayloadFile {
    pub path: PathBuf,
    pub first: usize,
    pub spooled: bool,
}

/// Where each sample's bytes are — a byte range of its input file or of the
/// spool — with its key and label: what the tar, MDS, Parquet and Arrow
/// sources list, a few bytes a sample.
#[derive(Debug)]
pub(crate) struct Payloads {
    pub files: Vec<PayloadFile>,
    pub entries: Entries,
    pub offsets: Vec<u64>,
    pub lens: Ints,
    pub spool: Option<File>,
    /// What a sample is called in errors ("sample", "row").
    pub noun: &'static str,
    /// The input's name in errors ("tar", "MDS"…).
    pub format: &'static str,
}

impl Payloads {
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn key(&self, i: usize) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.entries.key(i))
    }

    pub fn label(&self, i: usize) -> i64 {
        self.entries.label(i)
    }

    /// The file sample `i` is in.
    fn file_of(&self, i: usize) -> Option<&PayloadFile> {
        let f = self.files.partition_point(|f| f.first <= i);
        f.checked_sub(1).and_then(|f| self.files.get(f))
    }

    /// Sample `i`'s bytes: one positioned read. Errors name the file, the
    /// sample's key and the byte.
    pub fn read(&self, i: usize) -> Result<Vec<u8>> {
        let out_of_range = || {
            Error::config(format!(
                "{} {i} out of range: the {} input has {}",
                self.noun,
                self.format,
                self.len()
            ))
        };
        let offset = *self.offsets.get(i).ok_or_else(out_of_range)?;
        let file = self.file_of(i).ok_or_else(out_of_range)?;
        let len = self.lens.get(i) as u64;
        let fail = |what: String| {
            Error::input(
                &file.path,
                format!(
                    "{} {:?} at byte {offset}{}",
                    self.noun,
                    String::from_utf8_lossy(self.entries.key(i)),
                    if file.spooled { " of the spooled payloads" } else { "" }
                ),
                what,
            )
        };
        let len_usize = usize::try_from(len).map_err(|_| fail(format!("cannot hold {len} bytes")))?;
        let mut data = Vec::new();
        data.try_reserve_exact(len_usize)
            .map_err(|_| fail(format!("cannot allocate {len} bytes")))?;
        data.resize(len_usize, 0);
        let result = match (&self.spool, file.spooled) {
            (Some(spool), true) => spool.read_exact_at(&mut data, offset),
            (None, true) => return Err(fail("internal: no spool".into())),
            _ => File::open(&file.path).at(&file.path)?.read_exact_at(&mut data, offset),
        };
        result.map_err(|e| {
            fail(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "the file ended early (truncated, or changed since it was listed)".into()
            } else {
                format!("reading: {e}")
            })
        })?;
        Ok(data)
    }

    /// Gives back the spare capacity the listing grew into.
    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
        self.offsets.shrink_to_fit();
        self.lens.shrink_to_fit();
        self.files.shrink_to_fit();
    }

    /// Heap bytes of the listing.
    pub fn heap_bytes(&self) -> usize {
        self.entries.heap_bytes()
            + self.offsets.capacity() * 8
            + self.lens.heap_bytes()
            + self.files.capacity() * size_of::<PayloadFile>()
    }
}
