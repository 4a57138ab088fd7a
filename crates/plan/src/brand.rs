//! Brand's local data-access protocol (paper §3.3) on abstract memory.
//!
//! Each group of `n` consecutive chunks shares one abstract chunk of `K`
//! slots. A request for sample `x` (chunk `c = x / K`, slot `s = x % K`) is
//! answered from slot `s` of group `c / n`: whatever sample is there is
//! served and the slot is invalidated; if the slot is empty, one chunk of the
//! group is "read" into every empty slot it can fill, then slot `s` is
//! served. Nothing is ever evicted, and a sample is filled at most once per
//! epoch.
//!
//! Runs (a run length `L` above 1): the slots of every chunk are cut into
//! runs of `L` neighbouring records (the first run of an epoch shorter, at a
//! seed-derived offset, so that runs differ between epochs). A run is filled
//! whole or not at all, into slots whose whole run is empty, so that a
//! refill's records lie in contiguous runs on disk and one request reads
//! each run. A request whose slot is empty is served from another held slot
//! of its run (the next one after it), so a request still takes one sample
//! of its group and run position; a refill happens only when the request's
//! whole run is empty. The counting argument below holds per run: requests
//! to run `u` of group `g` equal its records, and each fill of a run is
//! consumed by that many requests. `L = 1` is the protocol above exactly.
//!
//! All state is per group except the per-chunk `unfilled` masks, and a
//! group's requests only touch its own chunks, so one group's plan can be
//! computed without the others.

use brand_format::rng::{Prng, domain};

/// A chunk read by a refill: the slots it filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refill {
    pub chunk: u32,
    pub mask: u64,
}

/// Brand's abstract memory for one epoch.
pub(crate) struct BrandState {
    k: u32,
    group_size: u32,
    chunks: u32,
    /// Choose the refill chunk uniformly instead of by fill rate.
    random: bool,
    /// Per chunk: records not yet filled this epoch (bit j = record j).
    unfilled: Vec<u64>,
    /// Per group: empty slots of its abstract chunk (bit j = slot j). Bits
    /// at or above `K` stay set and are never looked at on their own.
    empty: Vec<u64>,
    /// Per group and slot: the chunk whose record occupies the slot, valid
    /// while the slot is not empty.
    holder: Vec<u32>,
    /// Per slot: the slots of its run (one bit each with run length 1).
    run_of_slot: Vec<u64>,
    /// The distinct runs, in slot order.
    runs: Vec<u64>,
}

impl BrandState {
    /// Empty abstract memory at the start of an epoch: `samples` records in
    /// chunks of `k`, groups of `group_size` chunks.
    #[cfg(test)]
    pub fn new(samples: u64, k: u32, group_size: u32, random: bool) -> Self {
        Self::with_runs(samples, k, group_size, random, 1, 0)
    }

    /// [`new`](Self::new) with runs of `run_length` slots (1..=64), the
    /// first one `first_run` long (`0` or at least `run_length`: all full).
    pub fn with_runs(samples: u64, k: u32, group_size: u32, random: bool, run_length: u32, first_run: u32) -> Self {
        let run_length = run_length.clamp(1, 64);
        let first_run = if first_run == 0 || first_run >= run_length {
            run_length
        } else {
            first_run
        };
        let mut runs = Vec::new();
        let mut start = 0u32;
        while start < k {
            let len = if start == 0 { first_run } else { run_length }.min(k - start);
            runs.push(low_bits(len) << start);
            start += len;
        }
        let run_of_slot = (0..k)
            .map(|s| runs.iter().copied().find(|r| r & (1u64 << s) != 0).unwrap_or(1u64 << s))
            .collect();
        let chunks = samples.div_ceil(k as u64) as u32;
        let groups = chunks.div_ceil(group_size);
        let unfilled = (0..chunks as u64)
            .map(|c| low_bits((samples - c * k as u64).min(k as u64) as u32))
            .collect();
        BrandState {
            k,
            group_size,
            chunks,
            random,
            unfilled,
            empty: vec![u64::MAX; groups as usize],
            holder: vec![0; groups as usize * k as usize],
            run_of_slot,
            runs,
        }
    }

    /// Heap bytes of the abstract memory's state.
    pub fn heap_bytes(&self) -> u64 {
        (self.unfilled.capacity() * 8
            + self.empty.capacity() * 8
            + self.holder.capacity() * 4
            + self.run_of_slot.capacity() * 8
            + self.runs.capacity() * 8) as u64
    }

    #[cfg(test)]
    pub fn group_of_chunk(&self, chunk: u32) -> u32 {
        chunk / self.group_size
    }

    /// Marks a record as already filled this epoch (for tests that start
    /// from the middle of an epoch, like the paper's Figure 4).
    #[cfg(test)]
    pub fn mark_filled(&mut self, sample: u32) {
        let (c, s) = (sample / self.k, sample % self.k);
        self.unfilled[c as usize] &= !(1u64 << s);
    }

    /// Answers the request for sample `x`: returns the sample served and the
    /// refill done first, if any. `pick(group, choices)` returns an index in
    /// `0..choices` to break a tie between equally good refill chunks.
    #[inline]
    pub fn request(&mut self, x: u32, pick: &mut impl FnMut(u32, u64) -> u64) -> (u32, Option<Refill>) {
        let k = self.k;
        let c = x / k;
        let s = x % k;
        let g = c / self.group_size;
        let run = self.run_of_slot[s as usize];
        let empty = self.empty[g as usize];
        if !empty & run != 0 {
            // Serve what the run holds and self-invalidate (§3.3).
            let t = next_held(!empty & run, s);
            self.empty[g as usize] = empty | (1u64 << t);
            return (self.holder[g as usize * k as usize + t as usize] * k + t, None);
        }
        let refill = self.refill(g, run, empty, pick);
        let held = !self.empty[g as usize] & run;
        // The refill filled this run (counting argument in `refill`).
        let t = next_held(held, s);
        self.empty[g as usize] |= 1u64 << t;
        (self.holder[g as usize * k as usize + t as usize] * k + t, Some(refill))
    }

    /// Slots whose whole run is empty: what a refill may fill.
    fn fillable(&self, empty: u64) -> u64 {
        if self.runs.len() == self.k as usize {
            return empty;
        }
        self.runs.iter().filter(|&&r| empty & r == r).fold(0, |m, r| m | r)
    }

    /// Fills the empty runs of group `g` from the best chunk whose run
    /// `run` (a slot's bit with run length 1) is still unfilled.
    fn refill(&mut self, g: u32, run: u64, empty: u64, pick: &mut impl FnMut(u32, u64) -> u64) -> Refill {
        let bit = run;
        let empty = self.fillable(empty);
        let first = g * self.group_size;
        let end = first.saturating_add(self.group_size).min(self.chunks);
        let group = &self.unfilled[first as usize..end as usize];
        // First pass: how good the best candidate is and how many tie.
        // `fillable = |empty ∧ unfilled|`; for brand-random every candidate
        // counts as equally good.
        let score = |u: u64| {
            if self.random { 0 } else { (empty & u).count_ones() }
        };
        let mut best = 0u32;
        let mut ties = 0u64;
        for &u in group {
            if u & bit == 0 {
                continue;
            }
            let f = score(u);
            if ties == 0 || f > best {
                best = f;
                ties = 1;
            } else if f == best {
                ties += 1;
            }
        }
        // Counting argument: requests to (g, s) in an epoch equal the records
        // at slot s in g, and each request fills at most one of them, so an
        // unfilled one is left whenever slot s is empty.
        assert!(
            ties > 0,
            "plan invariant broken: no chunk of group {g} can fill run {run:#x}"
        );
        let mut nth = if ties > 1 { pick(g, ties) } else { 0 };
        debug_assert!(nth < ties);
        let mut chosen = first;
        for (i, &u) in group.iter().enumerate() {
            if u & bit != 0 && score(u) == best {
                if nth == 0 {
                    chosen = first + i as u32;
                    break;
                }
                nth -= 1;
            }
        }
        let mask = empty & self.unfilled[chosen as usize];
        self.unfilled[chosen as usize] &= !mask;
        self.empty[g as usize] &= !mask;
        let base = g as usize * self.k as usize;
        let mut m = mask;
        while m != 0 {
            self.holder[base + m.trailing_zeros() as usize] = chosen;
            m &= m - 1;
        }
        Refill { chunk: chosen, mask }
    }
}

/// The refill tie-breaks of one epoch: one stream per group,
/// `[REFILL, epoch, group]`, created on first use so that groups stay
/// independent and groups without ties cost nothing.
pub(crate) struct TieBreaks {
    seed: u64,
    epoch: u64,
    streams: Vec<Option<Box<Prng>>>,
}

impl TieBreaks {
    pub fn new(seed: u64, epoch: u64, groups: u32) -> Self {
        TieBreaks {
            seed,
            epoch,
            streams: (0..groups).map(|_| None).collect(),
        }
    }

    pub fn below(&mut self, group: u32, choices: u64) -> u64 {
        let (seed, epoch) = (self.seed, self.epoch);
        self.streams[group as usize]
            .get_or_insert_with(|| Box::new(Prng::stream(seed, &[domain::REFILL, epoch, group as u64])))
            .below(choices)
    }
}

/// The held slot of `held` (not 0) at or after slot `s`, else its first.
fn next_held(held: u64, s: u32) -> u32 {
    let after = held & (u64::MAX << s);
    if after != 0 {
        after.trailing_zeros()
    } else {
        held.trailing_zeros()
    }
}

/// The low `n` bits set (`n` ≤ 64).
pub(crate) fn low_bits(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The paper's Figure 4, chunk size 3, group 0 = chunks 0..3:
    //   chunk 0 = (c, f, q), chunk 1 = (j, p, b), chunk 2 = (·, e, o)
    // with b already consumed this epoch and the abstract chunk empty.
    const C: u32 = 0;
    const F: u32 = 1;
    const Q: u32 = 2;
    const P: u32 = 4;
    const B: u32 = 5;
    const E: u32 = 7;
    const O: u32 = 8;

    fn figure4() -> BrandState {
        let mut st = BrandState::new(9, 3, 3, false);
        st.mark_filled(B);
        st
    }

    #[test]
    fn figure4_serves_what_is_there_and_refills_by_fill_rate() {
        let mut st = figure4();
        let mut ties_seen = Vec::new();
        // ❶ request p: slot 1 is empty. Chunks 0 and 2 fill all three slots,
        // chunk 1 only two (b is consumed), so the tie is between 0 and 2;
        // the paper's example takes chunk 0.
        let mut take_first = |g: u32, n: u64| {
            ties_seen.push((g, n));
            0
        };
        let (served, refill) = st.request(P, &mut take_first);
        assert_eq!(ties_seen, vec![(0, 2)]);
        assert_eq!(refill, Some(Refill { chunk: 0, mask: 0b111 }));
        assert_eq!(served, F, "❷ f is returned for p");
        let mut no_ties = |g: u32, n: u64| -> u64 { panic!("unexpected tie of {n} in group {g}") };
        // ❸ request o: slot 2 holds q, which is served without a read.
        assert_eq!(st.request(O, &mut no_ties), (Q, None), "❹ q is returned for o");
        // ❺ request e: slot 1 is empty again (f self-invalidated). Chunk 1
        // can fill one slot (p), chunk 2 two (e, o): chunk 2 wins outright,
        // and c in slot 0 is not evicted.
        let (served, refill) = st.request(E, &mut no_ties);
        assert_eq!(refill, Some(Refill { chunk: 2, mask: 0b110 }));
        assert_eq!(served, E);
        // c is still resident and is what the next slot-0 request gets.
        assert_eq!(st.request(0, &mut no_ties), (C, None));
    }

    #[test]
    fn figure4_other_tie_choice_reads_chunk_2() {
        let mut st = figure4();
        let (served, refill) = st.request(P, &mut |_, _| 1);
        assert_eq!(refill, Some(Refill { chunk: 2, mask: 0b111 }));
        assert_eq!(served, E);
    }

    #[test]
    fn brand_random_draws_among_all_candidates() {
        // After the first refill from chunk 0, a slot-1 request has chunks 1
        // (fills 1) and 2 (fills 2) as candidates; brand-random must offer
        // both, where brand would take chunk 2 outright.
        let mut st = BrandState::new(9, 3, 3, true);
        st.mark_filled(B);
        let (_, refill) = st.request(P, &mut |_, n| {
            assert_eq!(n, 3);
            0
        });
        assert_eq!(refill, Some(Refill { chunk: 0, mask: 0b111 }));
        // f was served, so slot 1 is empty again.
        let mut choices = 0;
        let (_, refill) = st.request(E, &mut |_, n| {
            choices = n;
            0
        });
        assert_eq!(choices, 2);
        assert_eq!(refill, Some(Refill { chunk: 1, mask: 0b010 }));
    }

    #[test]
    fn an_epoch_serves_every_sample_once_and_never_overfills() {
        // A partial last chunk and a partial last group.
        let (n, k, group) = (103u64, 8u32, 3u32);
        let mut st = BrandState::new(n, k, group, false);
        let mut ties = TieBreaks::new(9, 0, 5);
        let perm = Prng::stream(1, &[]).permutation(n as usize);
        let mut seen = vec![false; n as usize];
        let mut resident = 0i64;
        for &x in &perm {
            let (y, refill) = st.request(x, &mut |g, c| ties.below(g, c));
            if let Some(r) = refill {
                resident += r.mask.count_ones() as i64;
            }
            // Same group and slot as requested.
            assert_eq!(y % k, x % k);
            assert_eq!(st.group_of_chunk(y / k), st.group_of_chunk(x / k));
            assert!(!std::mem::replace(&mut seen[y as usize], true), "{y} twice");
            resident -= 1;
            assert!((0..=5 * k as i64).contains(&resident));
        }
        assert_eq!(resident, 0);
    }
}
