//! The samples the loader holds: read and not yet served (or kept, when a
//! rank's memory holds the whole dataset), decoded, and the bytes they take.

use brand_format::ids::IdMap;

use crate::SampleBytes;

/// Samples in memory, each with the number of reads that brought it: across
/// an epoch boundary a sample can be read for the next epoch before this one
/// serves it, and each serve that frees takes one.
#[derive(Default)]
pub(crate) struct Held {
    samples: IdMap<(SampleBytes, u32)>,
    bytes: u64,
}

impl Held {
    /// Holds `id` (once more, if it is held already: its bytes count once).
    pub fn hold(&mut self, id: u64, bytes: SampleBytes) {
        let len = bytes.len() as u64;
        let entry = self.samples.entry(id).or_insert_with(|| (bytes, 0));
        if entry.1 == 0 {
            self.bytes += len;
        }
        entry.1 += 1;
    }

    /// Takes one hold of `id`; its bytes leave memory with the last.
    pub fn release(&mut self, id: u64) -> Option<SampleBytes> {
        let entry = self.samples.get_mut(&id)?;
        entry.1 -= 1;
        let bytes = entry.0.clone();
        if entry.1 == 0 {
            self.samples.remove(&id);
            self.bytes -= bytes.len() as u64;
        }
        Some(bytes)
    }

    /// `id`'s bytes, which stay held.
    pub fn get(&self, id: u64) -> Option<SampleBytes> {
        self.samples.get(&id).map(|h| h.0.clone())
    }

    pub fn contains(&self, id: u64) -> bool {
        self.samples.contains_key(&id)
    }

    /// Decoded bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Samples held.
    pub fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    pub fn clear(&mut self) {
        self.samples.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brand_format::buffer::AlignedBuf;
    use std::sync::Arc;

    #[test]
    fn a_sample_held_twice_counts_once_and_leaves_with_its_last_release() {
        let mut h = Held::default();
        let b = Arc::new(AlignedBuf::copy_of(&[7u8; 100]));
        h.hold(3, b.clone());
        h.hold(3, b);
        assert_eq!((h.len(), h.bytes()), (1, 100));
        assert!(h.release(3).is_some());
        assert_eq!((h.len(), h.bytes()), (1, 100));
        assert!(h.release(3).is_some());
        assert_eq!((h.len(), h.bytes()), (0, 0));
        assert!(h.release(3).is_none());
    }
}
