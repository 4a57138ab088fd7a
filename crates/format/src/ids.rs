//! Sets and maps of sample ids. [`IdMap`] and [`IdSet`] hash with one
//! multiply: std's SipHash resists chosen keys, which ids (from the plan)
//! and tags (a counter) are not; on the per-sample path its cost showed
//! (≈ 7 % of the CPU reading 4 KiB samples from tmpfs, in three maps).
//! [`IdBits`] is a dense set of the ids `0..n`, one bit each.

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

/// A set of the sample ids `0..n`, one bit each. Mostly the samples an
/// epoch served so far: what a job attached to a cache saves in its
/// checkpoint (served in an order that depends on timing, a count cannot
/// say which) and what the cache protocol carries to resume it; bit
/// `id % 64` of word `id / 64`, `ceil(n / 64)` words, never a bit at or
/// past `n`, is the layout of both formats. Ids at or past `n` are in no
/// set and cannot be inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdBits {
    words: Vec<u64>,
    samples: u64,
    /// The bits set, kept as they change (a set can hold 2^32 ids).
    len: u64,
}

impl IdBits {
    /// The empty set of the ids `0..samples`.
    pub fn new(samples: u64) -> Self {
        IdBits {
            words: vec![0; samples.div_ceil(64) as usize],
            samples,
            len: 0,
        }
    }

    /// Every id `0..samples`.
    pub fn full(samples: u64) -> Self {
        let mut words = vec![u64::MAX; samples.div_ceil(64) as usize];
        if let Some(last) = words.last_mut().filter(|_| !samples.is_multiple_of(64)) {
            *last = (1 << (samples % 64)) - 1;
        }
        IdBits {
            words,
            samples,
            len: samples,
        }
    }

    /// The set `words` stores (as [`words`](Self::words) gives it), of the
    /// ids `0..samples`: the error names what is wrong (its number of words,
    /// or a bit at or past `samples`).
    pub fn from_words(words: Vec<u64>, samples: u64) -> Result<Self, String> {
        let need = samples.div_ceil(64);
        if words.len() as u64 != need {
            return Err(format!(
                "has {} words for {samples} samples (needs {need})",
                words.len()
            ));
        }
        let tail = samples % 64;
        if let Some(&last) = words.last()
            && tail != 0
            && last >> tail != 0
        {
            let past = (need - 1) * 64 + u64::from(63 - last.leading_zeros());
            return Err(format!("marks sample {past}, past the dataset's {samples}"));
        }
        let len = words.iter().map(|w| u64::from(w.count_ones())).sum();
        Ok(IdBits { words, samples, len })
    }

    pub fn contains(&self, id: u64) -> bool {
        self.words
            .get((id / 64) as usize)
            .is_some_and(|w| id < self.samples && w >> (id % 64) & 1 == 1)
    }

    /// Adds `id`: false if it was in the set already or is not below
    /// [`samples`](Self::samples) (then the set is unchanged).
    pub fn insert(&mut self, id: u64) -> bool {
        if id >= self.samples || self.contains(id) {
            return false;
        }
        self.words[(id / 64) as usize] |= 1 << (id % 64);
        self.len += 1;
        true
    }

    /// Takes `id` out: false if it was not in the set.
    pub fn remove(&mut self, id: u64) -> bool {
        if !self.contains(id) {
            return false;
        }
        self.words[(id / 64) as usize] &= !(1 << (id % 64));
        self.len -= 1;
        true
    }

    /// How many ids the set holds.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.words.fill(0);
        self.len = 0;
    }

    /// The bits, `ceil(samples / 64)` words.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// The ids the set can hold: `0..samples`.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn id_bits_insert_once_and_keep_their_count() {
        let mut s = IdBits::new(130);
        assert_eq!((s.words().len(), s.samples(), s.len()), (3, 130, 0));
        assert!(s.is_empty());
        for id in [0, 63, 64, 129] {
            assert!(s.insert(id), "{id}");
        }
        assert!(!s.insert(64), "a second insert says it was there");
        assert!(!s.insert(130) && !s.insert(u64::MAX), "past the end: refused");
        assert!(!s.contains(130) && !s.contains(u64::MAX) && !s.contains(1));
        assert_eq!(s.len(), 4);
        assert_eq!(s.words(), &[1 | 1 << 63, 1, 1 << 1]);
        assert!(s.remove(63) && !s.remove(63) && !s.remove(1000));
        assert_eq!((s.len(), s.contains(63), s.contains(0)), (3, false, true));
        s.clear();
        assert_eq!((s.len(), s.words()), (0, &[0u64, 0, 0][..]));
    }

    #[test]
    fn id_bits_full_holds_every_id_below_samples() {
        for n in [0, 1, 63, 64, 65, 130] {
            let s = IdBits::full(n);
            assert_eq!(s.len(), n);
            assert!((0..n).all(|id| s.contains(id)) && !s.contains(n));
            assert_eq!(IdBits::from_words(s.words().to_vec(), n), Ok(s), "{n}");
        }
    }

    #[test]
    fn id_bits_from_words_counts_and_refuses_what_does_not_fit() {
        let s = IdBits::from_words(vec![0b1011, 1 << 1], 66).expect("fits");
        assert_eq!(s.len(), 4);
        assert!(s.contains(65) && s.contains(3) && !s.contains(2));
        let short = IdBits::from_words(vec![0], 66).expect_err("a word short");
        assert_eq!(short, "has 1 words for 66 samples (needs 2)");
        let long = IdBits::from_words(vec![0; 2], 64).expect_err("a word long");
        assert_eq!(long, "has 2 words for 64 samples (needs 1)");
        let past = IdBits::from_words(vec![0, 1 << 2 | 1 << 5], 66).expect_err("bits past 66");
        assert_eq!(past, "marks sample 69, past the dataset's 66");
        assert!(IdBits::from_words(vec![u64::MAX], 64).is_ok_and(|s| s.len() == 64));
        assert_eq!(IdBits::from_words(Vec::new(), 0), Ok(IdBits::new(0)));
    }

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
