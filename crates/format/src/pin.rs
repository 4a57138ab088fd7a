//! Which chunks a local tier pins for the `tiered` policy (DESIGN.md §3):
//! a share of the dataset's chunks, taken in one fixed pseudo-random
//! order. The plan serves the pinned chunks' samples at random over the
//! whole epoch (read record by record from the tier) and streams the rest
//! whole from the store; the tier takes in only the pinned chunks.
//!
//! The order does not depend on a job's seed, so jobs with different seeds
//! pin the same chunks and share them. A share is a byte (255ths of the
//! chunks) so that a checkpoint records it in the byte it has for it; a
//! larger share pins a superset of a smaller one's chunks.

use crate::index::Index;
use crate::rng::{Prng, domain};

/// The share that pins every chunk.
pub const ALL: u8 = 255;

/// The fixed order in which chunks are pinned: a permutation of `[0, chunks)`.
pub fn order(chunks: u64) -> Vec<u32> {
    Prng::stream(0, &[domain::PIN]).permutation(chunks as usize)
}

/// How many chunks `share` (255ths) of `chunks` pins.
pub fn count(chunks: u64, share: u8) -> u64 {
    chunks * share as u64 / ALL as u64
}

/// `pinned[c]`: chunk `c` is among the first [`count`] of [`order`].
pub fn pinned(chunks: u64, share: u8) -> Vec<bool> {
    let mut pinned = vec![false; chunks as usize];
    for &c in order(chunks).iter().take(count(chunks, share) as usize) {
        pinned[c as usize] = true;
    }
    pinned
}

/// The largest share whose pinned chunks (padded, as the tier holds them)
/// fit in `limit_bytes`.
pub fn share_within(index: &Index, limit_bytes: u64) -> u8 {
    let chunks = index.chunk_count();
    let mut prefix = Vec::with_capacity(chunks as usize + 1);
    prefix.push(0u64);
    for c in order(chunks) {
        let last = prefix.last().copied().unwrap_or(0);
        prefix.push(last + index.chunk_padded_len(c as u64));
    }
    (0..=ALL)
        .rev()
        .find(|&s| prefix[count(chunks, s) as usize] <= limit_bytes)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_pin_nested_sets_independent_of_any_seed() {
        let (small, large) = (pinned(1000, 60), pinned(1000, 200));
        assert_eq!(small.iter().filter(|&&p| p).count() as u64, count(1000, 60));
        assert_eq!(large.iter().filter(|&&p| p).count() as u64, count(1000, 200));
        assert!(
            small.iter().zip(&large).all(|(&s, &l)| !s || l),
            "a larger share pins a superset"
        );
        assert!(pinned(1000, ALL).iter().all(|&p| p));
        assert!(!pinned(1000, 0).iter().any(|&p| p));
        // Pseudo-random, not a prefix of the chunk ids.
        assert!(small[600..].iter().any(|&p| p));
    }
}
