//! A start's first fill: plan reads fetched record by record as each comes
//! due.
//!
//! A Brand refill from an empty group reads the whole chunk, but the serve
//! that asked for it needs one record; the others are served as later
//! requests reach the group. Memory is empty at a start, so, read whole,
//! the first requests each wait for a chunk: about a memory's worth of
//! bytes before the first batch (5.0 s from process start for a 5.4 GB
//! dataset at 10 % memory over 1 Gbit/s), and at 10 % of 1 TB of 110 KiB
//! samples (15,000 groups of 7 MiB) some 60 GB before the 15,000th sample.
//! Read as they come due, the first batch waits for its own records and
//! memory fills as fast as samples are served. The served order and the
//! bytes read do not change, only when they are read. Each record costs a
//! request, so only a start's first fill is read so (its reads of many
//! bytes, up to a memory's worth): later epochs' first reads are made ahead,
//! whole, while the epoch before them ends, and later refills ahead of
//! their serves.

use brand_format::extents::ReadGap;
use brand_format::ids::IdMap;
use brand_plan::{PlanConfig, Policy};

/// The fewest bytes of a plan read a start splits: a local device reads a
/// smaller one in about the time of a request, so no wait is saved.
const SPLIT_MIN_BYTES: u64 = 1 << 20;

/// How many bytes of a start's plan reads may be split: a memory's worth
/// (its first fill: later refills are read ahead of their serves, and split
/// would cost a request for each record they merge); none without
/// read-ahead (reads are then issued one at a time as the consumer reaches
/// them), with runs of records (read in one request by choice) or under
/// the tiered policy (whole chunks by design, few requests: its plan grows
/// its buffer from one chunk at a start instead). A loader and a multi-node
/// owner split by this and [`worth_splitting`].
pub fn split_budget(readahead_bytes: u64, plan: &PlanConfig, memory_bytes: u64) -> u64 {
    if readahead_bytes == 0 || plan.run_length > 1 || plan.policy == Policy::Tiered {
        0
    } else {
        memory_bytes
    }
}

/// Whether a start's plan read of `bytes`, its records filled one by one,
/// is worth fetching record by record: by a read gap (whole chunks are asked
/// for whole), when its bytes are many requests' worth (16 read gaps, at
/// least 1 MiB). The multi-node owner splits its start's reads by this too.
pub fn worth_splitting(gap: ReadGap, bytes: u64) -> bool {
    match gap {
        ReadGap::Whole => false,
        ReadGap::Bytes(gap) => bytes >= gap.saturating_mul(16).max(SPLIT_MIN_BYTES),
    }
}

/// The samples whose plan read was deferred, each with the read's number
/// among the loader's reads (its bytes count there). A due sample's read is
/// its own record: its chunk and bit follow from its id.
#[derive(Default)]
pub(crate) struct Deferred {
    read_of: IdMap<u64>,
}

impl Deferred {
    /// Defers the read numbered `seq` of `mask`'s records of the chunk whose
    /// first sample id is `first`. Refused (false: read it now) when one of
    /// its samples is deferred already, so a sample never waits on two reads.
    pub fn defer(&mut self, first: u64, mask: u64, seq: u64) -> bool {
        if records(mask).any(|r| self.read_of.contains_key(&(first + r))) {
            return false;
        }
        for r in records(mask) {
            self.read_of.insert(first + r, seq);
        }
        true
    }

    /// `sample` is due: the number of its deferred read, if it has one (and
    /// it is no longer deferred).
    pub fn due(&mut self, sample: u64) -> Option<u64> {
        self.read_of.remove(&sample)
    }

    /// Samples deferred.
    pub fn len(&self) -> usize {
        self.read_of.len()
    }

    pub fn clear(&mut self) {
        self.read_of.clear();
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
    fn each_sample_of_a_deferred_read_is_due_once() {
        let mut d = Deferred::default();
        assert!(d.defer(128, 0b1011, 7));
        assert_eq!(d.len(), 3);
        assert_eq!(d.due(129), Some(7));
        assert_eq!(d.due(129), None, "fetched already");
        assert_eq!(d.due(130), None, "not in the read");
        assert_eq!((d.due(131), d.due(128)), (Some(7), Some(7)));
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn a_sample_already_deferred_is_not_deferred_twice() {
        let mut d = Deferred::default();
        assert!(d.defer(0, 0b110, 0));
        assert!(!d.defer(0, 0b011, 1));
        assert_eq!(d.len(), 2);
        assert_eq!(d.due(0), None, "the refused read is the caller's");
        assert_eq!(d.due(1), Some(0));
    }

    #[test]
    fn the_last_record_of_a_chunk_is_a_record() {
        let mut d = Deferred::default();
        assert!(d.defer(320, (1 << 63) | 1, 1));
        assert_eq!((d.due(383), d.due(320), d.len()), (Some(1), Some(1), 0));
    }

    #[test]
    fn a_start_splits_large_reads_of_single_records_up_to_a_memory_with_read_ahead() {
        let plan = |run_length, policy| PlanConfig {
            run_length,
            policy,
            ..PlanConfig::new(brand_plan::Memory::Percent(10.0))
        };
        assert_eq!(split_budget(64 << 20, &plan(1, Policy::Brand), 500 << 20), 500 << 20);
        assert_eq!(split_budget(0, &plan(1, Policy::Brand), 500 << 20), 0, "read-ahead off");
        assert_eq!(
            split_budget(64 << 20, &plan(4, Policy::Brand), 500 << 20),
            0,
            "runs of records"
        );
        assert_eq!(split_budget(64 << 20, &plan(1, Policy::Tiered), 500 << 20), 0, "tiered");
        let gap = ReadGap::Bytes(80 << 10);
        assert!(worth_splitting(gap, 2 << 20));
        assert!(!worth_splitting(gap, (80 << 10) * 16 - 1), "fewer than 16 gaps' worth");
        assert!(!worth_splitting(ReadGap::Bytes(4096), (1 << 20) - 1), "under 1 MiB");
        assert!(
            !worth_splitting(ReadGap::Whole, 1 << 30),
            "whole chunks asked for whole"
        );
    }
}
