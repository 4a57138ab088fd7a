//! What the loader hands out: batches of samples that own their bytes.

use std::sync::Arc;

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;

/// A sample's bytes: 64-byte aligned, shared (a sample that stays in
/// memory across epochs is handed out without copying).
pub type SampleBytes = Arc<AlignedBuf>;

/// One sample of a batch: borrowed from the batch, no copies.
#[derive(Debug, Clone, Copy)]
pub struct SampleRef<'a> {
    pub id: u64,
    pub label: i64,
    pub data: &'a [u8],
    pub key: &'a [u8],
}

/// Samples handed out together. Owns their bytes.
#[derive(Debug)]
pub struct Batch {
    pub epoch: u64,
    ds: Arc<Dataset>,
    ids: Vec<u64>,
    data: Vec<SampleBytes>,
}

impl Batch {
    /// A batch of `ids` of `ds` with their bytes (`data[i]` is sample
    /// `ids[i]`).
    pub fn new(epoch: u64, ds: Arc<Dataset>, ids: Vec<u64>, data: Vec<SampleBytes>) -> Self {
        debug_assert_eq!(ids.len(), data.len());
        Batch { epoch, ds, ids, data }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<SampleRef<'_>> {
        let id = *self.ids.get(i)?;
        Some(SampleRef {
            id,
            label: self.ds.index.label(id),
            data: &self.data[i],
            key: self.ds.index.key(id),
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = SampleRef<'_>> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The sample ids, in order.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// The samples' shared buffers, in order: for interfaces that keep a
    /// sample alive beyond the batch without copying it (Python's arrays).
    pub fn buffers(&self) -> &[SampleBytes] {
        &self.data
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }
}
