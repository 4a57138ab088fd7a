//! A start's first fill: plan reads fetched record by record as each comes
//! due.
//!
//! A Brand refill from an empty group reads the whole chunk, but the serve
//! that asked for it needs one record; the others are served as later
//! requests reach the group. Memory is empty at a start, so, read whole,
//! the first requests each wait for a chunk: about a memory's worth of
//! bytes before the first batch (5.0 s from process start for a 5.2 GB
//! dataset at 10 % memory over 1 Gbit/s), and at 10 % of 1 TB of 110 KiB
//! samples (15,000 groups of 7 MiB) some 60 GB before the 15,000th sample.
//! Read as they come due, the first batch waits for its own records and
//! memory fills as fast as samples are served. The served order and the
//! bytes read do not change, only when they are read. Each record costs a
//! request, so only a start's first fill is read so (its reads of many
//! bytes, up to a memory's worth): later epochs' first reads are made ahead,
//! whole, while the epoch before them ends, and later refills ahead of
//! their serves.

use brand_format::ids::IdMap;

/// One deferred plan read.
struct Pending {
    chunk: u64,
    /// Records not yet fetched.
    mask: u64,
    /// The read's place among the loader's reads (to count its bytes there).
    seq: u64,
}

/// What to fetch now for a due sample: `mask`'s records of `chunk`, for the
/// plan read numbered `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub chunk: u64,
    pub mask: u64,
    pub seq: u64,
}

#[derive(Default)]
pub(crate) struct Deferred {
    reads: Vec<Option<Pending>>,
    free: Vec<u32>,
    /// Each deferred sample's read.
    of: IdMap<u32>,
}

impl Deferred {
    /// Defers the read of `mask`'s records of `chunk` (whose first sample
    /// id is `first`), numbered `seq`. Refused (false: read it now) when one
    /// of its samples is deferred already, so a sample is never waiting on
    /// two reads.
    pub fn defer(&mut self, chunk: u64, first: u64, mask: u64, seq: u64) -> bool {
        if records(mask).any(|r| self.of.contains_key(&(first + r))) {
            return false;
        }
        let key = match self.free.pop() {
            Some(k) => k,
            None => {
                self.reads.push(None);
                (self.reads.len() - 1) as u32
            }
        };
        self.reads[key as usize] = Some(Pending { chunk, mask, seq });
        for r in records(mask) {
            self.of.insert(first + r, key);
        }
        true
    }

    /// `sample` is due: its record, if it is deferred.
    pub fn due(&mut self, sample: u64, first: u64) -> Option<Part> {
        let key = self.of.remove(&sample)?;
        let slot = &mut self.reads[key as usize];
        let p = slot.as_mut()?;
        let bit = 1u64 << (sample - first);
        p.mask &= !bit;
        let part = Part {
            chunk: p.chunk,
            mask: bit,
            seq: p.seq,
        };
        if p.mask == 0 {
            *slot = None;
            self.free.push(key);
        }
        Some(part)
    }

    /// Samples deferred.
    pub fn len(&self) -> usize {
        self.of.len()
    }

    pub fn clear(&mut self) {
        self.reads.clear();
        self.free.clear();
        self.of.clear();
    }
}

/// The records (bit numbers) of `mask`.
fn records(mut mask: u64) -> impl Iterator<Item = u64> {
    std::iter::from_fn(move || {
        let r = mask.trailing_zeros();
        mask &= mask.wrapping_sub(1);
        (r < 64).then_some(r as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_fetched_a_record_at_a_time_as_each_comes_due() {
        let mut d = Deferred::default();
        assert!(d.defer(2, 128, 0b1011, 7));
        assert_eq!(d.len(), 3);
        assert_eq!(
            d.due(129, 128),
            Some(Part {
                chunk: 2,
                mask: 0b0010,
                seq: 7
            })
        );
        assert_eq!(d.due(129, 128), None, "fetched already");
        assert_eq!(d.due(130, 128), None, "not in the read");
        assert_eq!(
            d.due(131, 128),
            Some(Part {
                chunk: 2,
                mask: 0b1000,
                seq: 7
            })
        );
        assert_eq!(
            d.due(128, 128),
            Some(Part {
                chunk: 2,
                mask: 0b0001,
                seq: 7
            })
        );
        assert_eq!(d.len(), 0);
        // The slot is reused.
        assert!(d.defer(3, 192, 0b11, 8));
        assert_eq!(d.reads.len(), 1);
    }

    #[test]
    fn a_sample_already_deferred_is_not_deferred_twice() {
        let mut d = Deferred::default();
        assert!(d.defer(0, 0, 0b110, 0));
        assert!(!d.defer(0, 0, 0b011, 1));
        assert_eq!(d.len(), 2);
        assert_eq!(d.due(0, 0), None, "the refused read is the caller's");
    }

    #[test]
    fn a_read_of_one_record_left_ends_with_its_first_due() {
        let mut d = Deferred::default();
        assert!(d.defer(5, 320, 1 << 63, 1));
        assert_eq!(
            d.due(383, 320),
            Some(Part {
                chunk: 5,
                mask: 1 << 63,
                seq: 1
            })
        );
        assert_eq!(d.len(), 0);
        assert!(d.reads[0].is_none());
    }
}
