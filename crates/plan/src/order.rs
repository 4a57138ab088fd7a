//! How random a served order is: the order-quality metrics of `brand
//! simulate`, measured the same way on any order (a plan's, a loader's, a
//! job attached to a cache), so that one definition is compared everywhere.

use std::collections::HashMap;

use serde::Serialize;

use brand_format::index::Index;

/// One epoch's order quality.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OrderQuality {
    /// Mean |served position difference| of records in adjacent slots of
    /// the same packed chunk, over its value for a uniform permutation,
    /// `(N + 1) / 3`. 1 is uniform; near 0, chunk-mates are served together.
    pub chunk_mate_dispersion: Option<f64>,
    /// Spearman correlation of each sample's position with the previous
    /// epoch's (samples served in both). Near 0 for independent epochs.
    pub spearman_vs_previous: Option<f64>,
    /// Mean distinct labels per batch over its expectation for a uniform
    /// random batch of the same size.
    pub label_diversity: Option<f64>,
}

/// Measures the orders of consecutive epochs: tell it each served sample's
/// position ([`served`](Self::served)) and each batch
/// ([`batch`](Self::batch)), then [`end_epoch`](Self::end_epoch).
pub struct OrderMeter<'a> {
    chunk_size: usize,
    index: &'a Index,
    expectation: LabelExpectation,
    position: Vec<u32>,
    previous: Option<Vec<u32>>,
    distinct: f64,
    expected: f64,
    scratch: Vec<i64>,
}

/// Not served in the epoch.
const UNSERVED: u32 = u32::MAX;

impl<'a> OrderMeter<'a> {
    pub fn new(index: &'a Index) -> Self {
        let n = index.samples();
        OrderMeter {
            chunk_size: index.chunk_size() as usize,
            index,
            expectation: LabelExpectation::new(index.labels(), n),
            position: vec![UNSERVED; n as usize],
            previous: None,
            distinct: 0.0,
            expected: 0.0,
            scratch: Vec::new(),
        }
    }

    /// `sample` was served at `position` of the epoch (a later serve of the
    /// same sample replaces it; positions past `u32::MAX - 1` are ignored).
    pub fn served(&mut self, sample: u64, position: u64) {
        if let Some(p) = self.position.get_mut(sample as usize)
            && position < UNSERVED as u64
        {
            *p = position as u32;
        }
    }

    /// Bytes the meter holds (two epochs' positions).
    pub fn heap_bytes(&self) -> u64 {
        let prev = self.previous.as_ref().map_or(0, Vec::capacity);
        ((self.position.capacity() + prev) * 4 + self.scratch.capacity() * 8) as u64
    }

    /// One batch's samples, for label diversity.
    pub fn batch(&mut self, samples: &[u64]) {
        if samples.is_empty() {
            return;
        }
        self.scratch.clear();
        self.scratch.extend(
            samples
                .iter()
                .filter(|&&s| s < self.index.samples())
                .map(|&s| self.index.label(s)),
        );
        self.scratch.sort_unstable();
        self.scratch.dedup();
        self.distinct += self.scratch.len() as f64;
        self.expected += self.expectation.distinct(samples.len() as u64);
    }

    /// The epoch's quality; the next epoch starts empty (and is compared
    /// with this one).
    pub fn end_epoch(&mut self) -> OrderQuality {
        let q = OrderQuality {
            chunk_mate_dispersion: dispersion(&self.position, self.chunk_size),
            spearman_vs_previous: self.previous.as_deref().and_then(|prev| spearman(prev, &self.position)),
            label_diversity: (self.expected > 0.0).then(|| self.distinct / self.expected),
        };
        let n = self.position.len();
        self.previous = Some(std::mem::replace(&mut self.position, vec![UNSERVED; n]));
        (self.distinct, self.expected) = (0.0, 0.0);
        q
    }
}

/// Chunk-mate dispersion over pairs of adjacent slots of each chunk (both
/// served), normalised by `(N + 1) / 3`, the mean distance of two distinct
/// uniform positions in `[0, N)`.
fn dispersion(position: &[u32], k: usize) -> Option<f64> {
    let (mut sum, mut pairs) = (0f64, 0u64);
    for chunk in position.chunks(k.max(1)) {
        for w in chunk.windows(2) {
            if w[0] != UNSERVED && w[1] != UNSERVED {
                sum += w[0].abs_diff(w[1]) as f64;
                pairs += 1;
            }
        }
    }
    let n = position.len() as f64;
    (pairs > 0).then(|| sum / pairs as f64 / ((n + 1.0) / 3.0))
}

/// Spearman's rank correlation of two epochs' positions over the samples
/// served in both. Positions are distinct, so ranks have no ties.
fn spearman(a: &[u32], b: &[u32]) -> Option<f64> {
    let both = |i: usize| a[i] != UNSERVED && b[i] != UNSERVED;
    let rank_of = |pos: &[u32]| {
        // Rank of a position among the positions of common samples.
        let mut rank = vec![0u32; pos.len() + 1];
        for (i, &p) in pos.iter().enumerate() {
            if both(i) && (p as usize) < pos.len() {
                rank[p as usize + 1] = 1;
            }
        }
        for i in 1..rank.len() {
            rank[i] += rank[i - 1];
        }
        rank
    };
    let (ra, rb) = (rank_of(a), rank_of(b));
    let (mut d2, mut m) = (0f64, 0f64);
    for i in 0..a.len() {
        if both(i) && (a[i] as usize) < a.len() && (b[i] as usize) < b.len() {
            let d = ra[a[i] as usize] as f64 - rb[b[i] as usize] as f64;
            d2 += d * d;
            m += 1.0;
        }
    }
    (m >= 2.0).then(|| 1.0 - 6.0 * d2 / (m * (m * m - 1.0)))
}

/// Expected distinct labels in a uniform random batch drawn without
/// replacement: `Σ_label 1 − C(N − n_l, B) / C(N, B)`.
struct LabelExpectation {
    samples: u64,
    /// `(n_l, number of labels with that count)`: labels sharing a count
    /// share a term, which keeps one-sample-per-label datasets cheap.
    counts: Vec<(u64, u64)>,
    cache: HashMap<u64, f64>,
}

impl LabelExpectation {
    fn new(labels: impl Iterator<Item = i64>, samples: u64) -> Self {
        let mut per_label: HashMap<i64, u64> = HashMap::new();
        for l in labels {
            *per_label.entry(l).or_default() += 1;
        }
        let mut by_count: HashMap<u64, u64> = HashMap::new();
        for c in per_label.into_values() {
            *by_count.entry(c).or_default() += 1;
        }
        let mut counts: Vec<(u64, u64)> = by_count.into_iter().collect();
        counts.sort_unstable();
        LabelExpectation {
            samples,
            counts,
            cache: HashMap::new(),
        }
    }

    fn distinct(&mut self, batch: u64) -> f64 {
        let (n, counts) = (self.samples, &self.counts);
        *self.cache.entry(batch).or_insert_with(|| {
            let b = batch.min(n);
            counts
                .iter()
                .map(|&(nl, labels)| {
                    // P(label absent) = Π_{i<B} (N − n_l − i) / (N − i); each
                    // factor is ≤ 1, so the product underflows to 0, never
                    // overflows.
                    let absent = if n - nl < b {
                        0.0
                    } else {
                        (0..b).map(|i| (n - nl - i) as f64 / (n - i) as f64).product()
                    };
                    labels as f64 * (1.0 - absent)
                })
                .sum()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_expectation_matches_small_cases() {
        // Two labels of 2 in N = 4, batches of 2: P(label absent) =
        // C(2,2)/C(4,2) = 1/6, so E = 2 · 5/6.
        let mut e = LabelExpectation::new([0, 0, 1, 1].into_iter(), 4);
        assert!((e.distinct(2) - 10.0 / 6.0).abs() < 1e-12);
        // A batch of the whole dataset sees every label; a batch of one, one.
        assert!((e.distinct(4) - 2.0).abs() < 1e-12);
        assert!((e.distinct(1) - 1.0).abs() < 1e-12);
        let mut unique = LabelExpectation::new([5, 6, 7, 8, 9].into_iter(), 5);
        assert!((unique.distinct(3) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn spearman_and_dispersion_known_values() {
        let id: Vec<u32> = (0..100).collect();
        let rev: Vec<u32> = (0..100).rev().collect();
        assert_eq!(spearman(&id, &id), Some(1.0));
        assert!(spearman(&id, &rev).is_some_and(|r| (r + 1.0).abs() < 1e-12));
        // Chunk-mates one position apart: dispersion 1 / ((N+1)/3).
        assert!(dispersion(&id, 10).is_some_and(|d| (d - 3.0 / 101.0).abs() < 1e-12));
        assert_eq!(dispersion(&id, 1), None);
    }
}
