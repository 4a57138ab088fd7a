//! Maps keyed by sample ids and read tags: a hash that costs one multiply.
//! std's SipHash resists chosen keys, which ids (from the plan) and tags
//! (a counter) are not; on the per-sample path its cost showed (≈ 7 % of
//! the CPU reading 4 KiB samples from tmpfs, in three maps).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a `u64` id.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
/// A `HashSet` of `u64` ids.
pub type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// Folded multiply (the 128-bit product's halves xored): every input bit
/// reaches the low bits (the table index) and the high ones (its tag bits).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let p = (self.0 as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (p as u64) ^ ((p >> 64) as u64)
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are meant; anything else still hashes, byte by byte.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 ^= x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_ids_spread_over_low_and_high_bits() {
        let b = BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (0..4096u64).map(|x| b.hash_one(x)).collect();
        // Table index bits (low 12) and tag bits (top 7) both well used.
        let low: IdSet = hashes.iter().map(|h| h & 0xfff).collect();
        let top: IdSet = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 2500, "{}", low.len());
        assert_eq!(top.len(), 128);
        let mut m: IdMap<u64> = IdMap::default();
        for x in 0..1000 {
            m.insert(x * 64, x);
        }
        assert!((0..1000).all(|x| m.get(&(x * 64)) == Some(&x)));
    }
}
