//! A start's first fill, record by record: the loader's `deferred`, for an
//! owner.
//!
//! Memory is empty at a start. Read whole, each chunk of the first fill
//! holds about one record of every consumer's first steps, so the first
//! batch of every consumer waited for every owner's memory's worth: 13 s
//! from start for two nodes at 10 % of a 5.4 GB dataset over 1 Gbit/s with
//! 20 ms to an object store. Instead the start's large reads, up to a
//! memory's worth, are fetched record by record in serve order (position
//! `step × world + consumer`), and a whole read needed later waits until the
//! split records served before it are asked for: the engine starts requests
//! in the order they come, so the first steps' records come first. The
//! records and their bytes are the same; only their order changes. Later
//! epochs read whole, as their reads are made ahead of their steps.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use brand_format::extents::ReadGap;
use brand_loader::worth_splitting;

use crate::routes::OwnedRead;

/// The records of an epoch's split reads not yet asked for.
pub struct FirstFill {
    /// `(position, read, sample)`, the soonest served first.
    pending: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// Bytes of the reads split so far, and the most to split.
    split_bytes: u64,
    budget: u64,
}

impl FirstFill {
    /// Splits reads of up to `budget` bytes in all (0: none).
    pub fn new(budget: u64) -> Self {
        FirstFill {
            pending: BinaryHeap::new(),
            split_bytes: 0,
            budget,
        }
    }

    /// Whether reads may still be split (the budget is not spent).
    pub fn splitting(&self) -> bool {
        self.split_bytes < self.budget
    }

    /// Whether plan read number `read` (`r`, of `bytes`) is split: then its
    /// records wait here to be asked for one by one.
    pub fn split(&mut self, read: usize, r: &OwnedRead, bytes: u64, gap: ReadGap, world: u64) -> bool {
        if self.split_bytes >= self.budget || r.deliveries.len() < 2 || !worth_splitting(gap, bytes) {
            return false;
        }
        for &(sample, consumer, step) in &r.deliveries {
            self.pending
                .push(Reverse((position(step, consumer, world), read, sample)));
        }
        self.split_bytes += bytes;
        true
    }

    /// The serve position of the soonest record not yet asked for.
    pub fn soonest(&self) -> Option<u64> {
        self.pending.peek().map(|Reverse((p, _, _))| *p)
    }

    /// The soonest record not yet asked for: its read's number and sample.
    pub fn pop(&mut self) -> Option<(usize, u64)> {
        self.pending.pop().map(|Reverse((_, read, sample))| (read, sample))
    }
}

/// The global serve position of `consumer`'s `step`.
pub fn position(step: u64, consumer: u32, world: u64) -> u64 {
    step.saturating_mul(world).saturating_add(consumer as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(chunk: u64, deliveries: &[(u64, u32, u64)]) -> OwnedRead {
        OwnedRead {
            chunk,
            mask: deliveries.iter().fold(0, |m, d| m | 1 << (d.0 % 64)),
            deliveries: deliveries.to_vec(),
        }
    }

    #[test]
    fn records_are_asked_for_in_serve_order_across_reads_and_consumers() {
        let mut f = FirstFill::new(u64::MAX);
        let gap = ReadGap::Bytes(4096);
        assert!(f.split(0, &read(0, &[(0, 1, 5), (1, 0, 2)]), 2 << 20, gap, 2));
        assert!(f.split(1, &read(1, &[(64, 0, 0), (65, 1, 9)]), 2 << 20, gap, 2));
        assert_eq!(f.soonest(), Some(0));
        let order: Vec<_> = std::iter::from_fn(|| f.pop()).collect();
        assert_eq!(order, [(1, 64), (0, 1), (0, 0), (1, 65)]);
        assert_eq!(f.soonest(), None);
    }

    #[test]
    fn only_large_reads_of_several_records_within_the_budget_are_split() {
        let gap = ReadGap::Bytes(4096);
        let two = read(0, &[(0, 0, 0), (1, 0, 1)]);
        let mut f = FirstFill::new(3 << 20);
        assert!(!f.split(0, &read(0, &[(0, 0, 0)]), 2 << 20, gap, 1), "one record");
        assert!(!f.split(0, &two, 512 << 10, gap, 1), "under 1 MiB");
        assert!(!f.split(0, &two, 2 << 20, ReadGap::Whole, 1), "whole chunks asked for");
        assert!(f.split(0, &two, 2 << 20, gap, 1));
        assert!(f.split(1, &two, 2 << 20, gap, 1), "within the budget when it began");
        assert!(!f.split(2, &two, 2 << 20, gap, 1), "the budget is spent");
        assert!(!FirstFill::new(0).split(0, &two, 2 << 20, gap, 1), "none");
    }
}
