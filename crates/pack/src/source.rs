//! Where `brand pack` gets samples from. A source lists its samples up front
//! (key and label, cheap) and reads any one on demand, from any thread, so the
//! packer can shuffle first and read in packed order without holding the
//! dataset in memory.

use brand_format::error::Result;

/// One sample as a source lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The sample's original name (relative path, `file:record`, LMDB key).
    pub key: Vec<u8>,
    /// Class label, or -1 where the source has none.
    pub label: i64,
}

pub trait Source: Sync {
    /// dir, list, tfrecord or lmdb.
    fn kind(&self) -> &'static str;

    /// Every sample, in the source's natural order (the order the pack seed
    /// shuffles; it must be deterministic for a given input).
    fn entries(&self) -> &[Entry];

    /// The bytes of sample `i` (an index into `entries()`). Errors name the
    /// file and position (path, record number, byte offset, key).
    fn read(&self, i: usize) -> Result<Vec<u8>>;

    /// Class names by label, where the source has them.
    fn label_names(&self) -> Vec<String> {
        Vec::new()
    }
}
