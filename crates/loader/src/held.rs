//! The samples the loader holds (read and not yet served, or kept when a
//! rank's memory holds the whole dataset, decoded) and the samples reads in
//! flight bring, in one map: a 4 KiB sample costs one lookup when its read
//! is issued, one when it arrives and one when it is served.

use std::collections::hash_map::Entry as MapEntry;

use brand_format::ids::IdMap;

use crate::SampleBytes;

/// One sample's place: its bytes while held, the holds on them (across an
/// epoch boundary a sample can be read for the next epoch before this one
/// serves it, and each serve that frees takes one), and the reads in
/// flight that bring it.
#[derive(Default)]
struct Place {
    bytes: Option<SampleBytes>,
    holds: u32,
    reads: u32,
}

#[derive(Default)]
pub(crate) struct Held {
    samples: IdMap<Place>,
    /// Decoded bytes held.
    bytes: u64,
    /// Samples held (at least one hold).
    held: u64,
}

impl Held {
    /// A read that brings `id` was issued.
    pub fn reading(&mut self, id: u64) {
        self.samples.entry(id).or_default().reads += 1;
    }

    /// A read that was bringing `id` completed: with its bytes (held once
    /// more; bytes already held stay and count once), or without (failed).
    pub fn arrived(&mut self, id: u64, bytes: Option<SampleBytes>) {
        let place = self.samples.entry(id).or_default();
        place.reads = place.reads.saturating_sub(1);
        match bytes {
            Some(b) => Self::add_hold(place, b, &mut self.bytes, &mut self.held),
            None => {
                if place.holds == 0 && place.reads == 0 {
                    self.samples.remove(&id);
                }
            }
        }
    }

    /// Holds `id` once more (a served sample put back).
    pub fn hold(&mut self, id: u64, bytes: SampleBytes) {
        let place = self.samples.entry(id).or_default();
        Self::add_hold(place, bytes, &mut self.bytes, &mut self.held);
    }

    fn add_hold(place: &mut Place, bytes: SampleBytes, held_bytes: &mut u64, held: &mut u64) {
        if place.holds == 0 {
            *held_bytes += bytes.len() as u64;
            *held += 1;
            place.bytes = Some(bytes);
        }
        place.holds += 1;
    }

    /// Takes one hold of `id`; its bytes leave memory with the last.
    pub fn release(&mut self, id: u64) -> Option<SampleBytes> {
        let MapEntry::Occupied(mut o) = self.samples.entry(id) else {
            return None;
        };
        let place = o.get_mut();
        if place.holds == 0 {
            return None;
        }
        place.holds -= 1;
        if place.holds > 0 {
            return place.bytes.clone();
        }
        let bytes = place.bytes.take();
        if place.reads == 0 {
            o.remove();
        }
        self.held -= 1;
        self.bytes -= bytes.as_ref().map_or(0, |b| b.len() as u64);
        bytes
    }

    /// `id`'s bytes, which stay held.
    pub fn get(&self, id: u64) -> Option<SampleBytes> {
        self.samples.get(&id).and_then(|p| p.bytes.clone())
    }

    /// Whether a read in flight brings `id`.
    pub fn is_reading(&self, id: u64) -> bool {
        self.samples.get(&id).is_some_and(|p| p.reads > 0)
    }

    /// Decoded bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Samples held.
    pub fn len(&self) -> u64 {
        self.held
    }

    /// Forgets every read in flight (they were drained); held samples stay.
    pub fn forget_reads(&mut self) {
        self.samples.retain(|_, p| {
            p.reads = 0;
            p.holds > 0
        });
    }

    pub fn clear(&mut self) {
        self.samples.clear();
        self.bytes = 0;
        self.held = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brand_format::buffer::AlignedBuf;
    use std::sync::Arc;

    fn bytes(n: usize) -> SampleBytes {
        Arc::new(AlignedBuf::copy_of(&vec![7u8; n]))
    }

    #[test]
    fn a_sample_held_twice_counts_once_and_leaves_with_its_last_release() {
        let mut h = Held::default();
        h.reading(3);
        h.reading(3);
        assert!(h.is_reading(3));
        h.arrived(3, Some(bytes(100)));
        assert!(h.is_reading(3), "one read is still in flight");
        h.arrived(3, Some(bytes(100)));
        assert!(!h.is_reading(3));
        assert_eq!((h.len(), h.bytes()), (1, 100));
        assert!(h.release(3).is_some());
        assert_eq!((h.len(), h.bytes()), (1, 100));
        assert!(h.release(3).is_some());
        assert_eq!((h.len(), h.bytes()), (0, 0));
        assert!(h.release(3).is_none());
        assert!(h.samples.is_empty(), "nothing held or read is left");
    }

    #[test]
    fn a_sample_released_while_read_again_stays_reading_and_unheld() {
        let mut h = Held::default();
        h.reading(5);
        h.arrived(5, Some(bytes(10)));
        h.reading(5);
        assert_eq!(h.release(5).map(|b| b.len()), Some(10));
        assert_eq!((h.len(), h.bytes()), (0, 0));
        assert!(h.is_reading(5) && h.get(5).is_none() && h.release(5).is_none());
        // Its read fails: nothing of it is left.
        h.arrived(5, None);
        assert!(!h.is_reading(5) && h.samples.is_empty());
    }

    #[test]
    fn forgetting_reads_keeps_what_is_held() {
        let mut h = Held::default();
        h.reading(1);
        h.reading(2);
        h.arrived(2, Some(bytes(8)));
        h.reading(2);
        h.forget_reads();
        assert!(!h.is_reading(1) && !h.is_reading(2));
        assert_eq!((h.len(), h.bytes()), (1, 8));
        assert_eq!(h.samples.len(), 1);
    }
}
