//! A local tier of whole chunks under the abstract memory (issue 56): a
//! read of a chunk the tier holds costs the store nothing. Two rules for
//! what it holds:
//!
//! * [`simulate_kept`], the tier as built (`brand_store::tier`): a chunk is
//!   fetched whole and kept the first time it is read while there is room,
//!   and never evicted; a read of a chunk not kept once the tier is full
//!   costs what it costs without a tier.
//! * [`simulate_tier`], eviction by the plan: every read of a chunk the
//!   tier lacks fetches it whole, and because the plan is a pure function
//!   of seed and epoch, every future read is known, so the tier keeps what
//!   is needed soonest: Belady's rule, evicting the chunk whose next read is
//!   furthest away (a chunk needed later than everything held is not kept
//!   at all). With chunks of one size this fetches the fewest chunks any
//!   tier of that size can that fetches every miss whole; with padded
//!   lengths that differ, it is the usual heuristic.
//!
//! Below the dataset's size the first fetches less: Brand's protocol reads
//! each chunk ~9 times an epoch at 10 % memory, spread over the epoch, so
//! whole chunks evicted and fetched again cost more than the records a
//! read wants.
//!
//! Pure: a sequence of chunk reads in, per-epoch counts out.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use brand_format::extents::get_parts;
use brand_format::index::Index;

/// The tier's size and how a miss is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierModel {
    /// Bytes of whole (padded) chunks the tier may hold.
    pub limit_bytes: u64,
    /// A miss fetches its chunk in GETs of at most this many bytes.
    pub get_bytes: u64,
}

/// What one epoch's reads cost with a tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierEpoch {
    /// Plan reads of a chunk the tier held: read from the local disk.
    pub hits: u64,
    /// Plan reads of a chunk it lacked: the whole chunk fetched.
    pub misses: u64,
    /// Plan reads of a chunk it lacked and had no room for, read from the
    /// store as without a tier (the kept rule only).
    pub passed: u64,
    /// Bytes of the chunks fetched from the store.
    pub bytes_fetched: u64,
    /// GETs those fetches take.
    pub gets: u64,
    /// Chunks dropped from the tier to make room.
    pub evictions: u64,
    /// Bytes the tier held at the epoch's end.
    pub held_bytes: u64,
}

/// One plan read of `chunk` in `epoch`, in the order the job makes them,
/// with what it costs the store without a tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRead {
    pub epoch: u64,
    pub chunk: u64,
    pub store_bytes: u64,
    pub store_gets: u64,
}

/// Runs `reads` through the tier as built, starting empty: a chunk read
/// while there is room is fetched whole and kept for good; once full, a
/// read of a chunk not kept costs what it costs without a tier. With
/// `pinned` (the tiered policy) only those chunks are taken in. One
/// [`TierEpoch`] per epoch in `0..epochs`.
pub fn simulate_kept(
    index: &Index,
    reads: &[ChunkRead],
    epochs: u64,
    model: TierModel,
    pinned: Option<&[bool]>,
) -> Vec<TierEpoch> {
    let mut out = vec![TierEpoch::default(); epochs as usize];
    let mut held = std::collections::HashSet::new();
    let mut held_bytes = 0u64;
    for r in reads {
        let Some(e) = out.get_mut(r.epoch as usize) else {
            continue;
        };
        let len = index.chunk_padded_len(r.chunk);
        if held.contains(&r.chunk) {
            e.hits += 1;
        } else if held_bytes + len <= model.limit_bytes
            && pinned.is_none_or(|p| p.get(r.chunk as usize).copied().unwrap_or(false))
        {
            held.insert(r.chunk);
            held_bytes += len;
            e.misses += 1;
            e.bytes_fetched += len;
            e.gets += get_parts(len, model.get_bytes);
        } else {
            e.passed += 1;
            e.bytes_fetched += r.store_bytes;
            e.gets += r.store_gets;
        }
        e.held_bytes = held_bytes;
    }
    carry_held(&mut out);
    out
}

/// An epoch without reads ends with what the one before held.
fn carry_held(out: &mut [TierEpoch]) {
    for k in 1..out.len() {
        if out[k].hits + out[k].misses + out[k].passed == 0 {
            out[k].held_bytes = out[k - 1].held_bytes;
        }
    }
}

/// Runs `reads` (every epoch's, in order: the future the rule looks at
/// spans epochs) through a tier of `model`, starting empty; one
/// [`TierEpoch`] per epoch in `0..epochs`.
pub fn simulate_tier(index: &Index, reads: &[ChunkRead], epochs: u64, model: TierModel) -> Vec<TierEpoch> {
    // next[i]: the index of the next read of the same chunk after i
    // (usize::MAX: none), from one backward pass.
    let mut next = vec![usize::MAX; reads.len()];
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (i, r) in reads.iter().enumerate().rev() {
        if let Some(&j) = seen.get(&r.chunk) {
            next[i] = j;
        }
        seen.insert(r.chunk, i);
    }
    let mut out = vec![TierEpoch::default(); epochs as usize];
    // Held chunks by their next read, furthest last; and each held chunk's key.
    let mut by_next: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut held: HashMap<u64, usize> = HashMap::new();
    let mut held_bytes = 0u64;
    for (i, r) in reads.iter().enumerate() {
        let Some(e) = out.get_mut(r.epoch as usize) else {
            continue;
        };
        let len = index.chunk_padded_len(r.chunk);
        if let Some(key) = held.remove(&r.chunk) {
            e.hits += 1;
            by_next.remove(&(key, r.chunk));
        } else {
            e.misses += 1;
            e.bytes_fetched += len;
            e.gets += get_parts(len, model.get_bytes);
            held_bytes += len;
        }
        // Held from here until its next read (or dropped below).
        by_next.insert((next[i], r.chunk));
        held.insert(r.chunk, next[i]);
        while held_bytes > model.limit_bytes {
            let Some((key, victim)) = by_next.pop_last() else { break };
            held.remove(&victim);
            held_bytes -= index.chunk_padded_len(victim);
            // The chunk just read, when it is needed furthest, is not kept:
            // no eviction to count, it never took the room.
            if !(victim == r.chunk && key == next[i]) {
                e.evictions += 1;
            }
        }
        e.held_bytes = held_bytes;
    }
    carry_held(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use brand_format::index::{ChunkLoc, SampleMeta};
    use brand_format::rng::Prng;

    /// `chunks` chunks of one record of 1000 bytes, each 4096 padded bytes.
    fn index(chunks: u64) -> Index {
        let samples = (0..chunks)
            .map(|_| SampleMeta {
                rel_offset: 200,
                stored_len: 1000,
                raw_len: 1000,
                crc: 0,
                label: 0,
                key: vec![],
            })
            .collect();
        let locs = (0..chunks)
            .map(|c| ChunkLoc {
                segment: 0,
                record_count: 1,
                offset: c * 4096,
            })
            .collect();
        Index::new(1, 1, locs, samples).expect("index")
    }

    /// Reads of one-record chunks that cost 1000 bytes in one GET without a tier.
    fn reads(seq: &[(u64, u64)]) -> Vec<ChunkRead> {
        seq.iter().map(|&(epoch, chunk)| read(epoch, chunk)).collect()
    }

    fn read(epoch: u64, chunk: u64) -> ChunkRead {
        ChunkRead {
            epoch,
            chunk,
            store_bytes: 1000,
            store_gets: 1,
        }
    }

    #[test]
    fn the_kept_rule_keeps_the_first_chunks_read_and_passes_the_rest_to_the_store() {
        let ix = index(4);
        // Room for two: 0 and 2 are kept; 1 and 3 pass, every time.
        let seq = reads(&[(0, 0), (0, 2), (0, 1), (0, 0), (1, 3), (1, 2), (1, 1), (1, 0)]);
        let t = simulate_kept(&ix, &seq, 2, model(2), None);
        assert_eq!((t[0].misses, t[0].hits, t[0].passed), (2, 1, 1));
        assert_eq!((t[1].misses, t[1].hits, t[1].passed), (0, 2, 2));
        assert_eq!(t[0].bytes_fetched, 2 * 4096 + 1000);
        assert_eq!((t[1].bytes_fetched, t[1].gets), (2000, 2));
        assert_eq!(t[1].held_bytes, 2 * 4096);
        assert!(t.iter().all(|e| e.evictions == 0));
        // As large as the dataset: each chunk once, then nothing, as eviction by the plan.
        let all = simulate_kept(&ix, &seq, 2, model(4), None);
        assert_eq!(all, simulate_tier(&ix, &seq, 2, model(4)));
        // Only chunks 1 and 3 pinned: 0 and 2 pass though there is room.
        let pins = [false, true, false, true];
        let t = simulate_kept(&ix, &seq, 2, model(4), Some(&pins));
        assert_eq!((t[0].misses, t[0].hits, t[0].passed), (1, 0, 3));
        assert_eq!((t[1].misses, t[1].hits, t[1].passed), (1, 1, 2));
        assert_eq!(t[1].held_bytes, 2 * 4096);
    }

    /// On random sequences: every read is a hit, a miss or passed; a chunk
    /// is fetched whole at most once; what passes costs what it costs
    /// without a tier; the tier never holds more than its limit.
    #[test]
    fn the_kept_rule_fetches_each_chunk_at_most_once_within_its_limit() {
        let ix = index(12);
        let mut rng = Prng::stream(9, &[56]);
        for round in 0..200 {
            let n = 1 + rng.below(60) as usize;
            let seq: Vec<ChunkRead> = (0..n).map(|i| read((i * 3 / n) as u64, rng.below(12))).collect();
            for cap in 0..=12u64 {
                let t = simulate_kept(&ix, &seq, 3, model(cap), None);
                let (hits, misses, passed): (u64, u64, u64) = t
                    .iter()
                    .fold((0, 0, 0), |a, e| (a.0 + e.hits, a.1 + e.misses, a.2 + e.passed));
                assert_eq!(hits + misses + passed, n as u64, "round {round}");
                assert!(misses <= cap.min(12), "round {round} cap {cap}");
                let fetched: u64 = t.iter().map(|e| e.bytes_fetched).sum();
                assert_eq!(fetched, misses * 4096 + passed * 1000, "round {round} cap {cap}");
                assert!(t.iter().all(|e| e.held_bytes <= cap * 4096));
            }
        }
    }

    fn model(chunks: u64) -> TierModel {
        TierModel {
            limit_bytes: chunks * 4096,
            get_bytes: 8 << 20,
        }
    }

    /// Misses of a tier of `cap` one-size chunks that evicts the least
    /// recently read: any rule's misses are at least Belady's.
    fn lru_misses(seq: &[u64], cap: usize) -> u64 {
        let mut held: Vec<u64> = Vec::new();
        let mut misses = 0;
        for &c in seq {
            if let Some(p) = held.iter().position(|&h| h == c) {
                held.remove(p);
            } else {
                misses += 1;
                if cap > 0 && held.len() == cap {
                    held.remove(0);
                }
            }
            if cap > 0 {
                held.push(c);
            }
        }
        misses
    }

    #[test]
    fn a_tier_that_holds_everything_fetches_each_chunk_once_then_nothing() {
        let ix = index(5);
        let seq = reads(&[(0, 0), (0, 3), (0, 0), (0, 4), (1, 3), (1, 0), (1, 4), (2, 1)]);
        let t = simulate_tier(&ix, &seq, 3, model(5));
        assert_eq!((t[0].misses, t[0].hits), (3, 1));
        assert_eq!((t[1].misses, t[1].hits), (0, 3));
        assert_eq!((t[2].misses, t[2].hits), (1, 0));
        assert_eq!(t[0].bytes_fetched, 3 * 4096);
        assert_eq!(t[0].gets, 3);
        assert_eq!(t[2].held_bytes, 4 * 4096);
        assert!(t.iter().all(|e| e.evictions == 0));
    }

    #[test]
    fn a_tier_of_nothing_fetches_every_read() {
        let ix = index(4);
        let seq = reads(&[(0, 0), (0, 0), (0, 1), (1, 1)]);
        let t = simulate_tier(&ix, &seq, 2, model(0));
        assert_eq!((t[0].misses, t[0].hits, t[0].evictions), (3, 0, 0));
        assert_eq!((t[1].misses, t[1].held_bytes), (1, 0));
    }

    #[test]
    fn belady_keeps_the_chunk_needed_soonest() {
        let ix = index(3);
        // Room for one: after 0, 1 is read; 0 is needed again next, 1 never.
        let seq = reads(&[(0, 0), (0, 1), (0, 0), (0, 2), (0, 0)]);
        let t = simulate_tier(&ix, &seq, 1, model(1));
        assert_eq!((t[0].misses, t[0].hits), (3, 2));
        assert_eq!(t[0].evictions, 0, "1 and 2 are never kept, so nothing is evicted");
    }

    /// Against LRU on random sequences of one-size chunks: never more
    /// misses, and never fewer than one per distinct chunk; and a larger
    /// tier never misses more.
    #[test]
    fn belady_never_misses_more_than_lru_nor_a_smaller_tier() {
        let ix = index(12);
        let mut rng = Prng::stream(7, &[56]);
        for round in 0..200 {
            let n = 1 + rng.below(60) as usize;
            let seq: Vec<u64> = (0..n).map(|_| rng.below(12)).collect();
            let tagged: Vec<ChunkRead> = seq.iter().map(|&chunk| read(0, chunk)).collect();
            let distinct = seq.iter().collect::<std::collections::HashSet<_>>().len() as u64;
            let mut last = u64::MAX;
            for cap in 0..=12u64 {
                let b = simulate_tier(&ix, &tagged, 1, model(cap))[0];
                assert_eq!(b.hits + b.misses, n as u64);
                assert!(
                    b.misses <= lru_misses(&seq, cap as usize),
                    "round {round} cap {cap}: {seq:?}"
                );
                assert!(b.misses >= distinct, "round {round} cap {cap}");
                assert!(
                    b.misses <= last,
                    "round {round}: cap {cap} misses more than cap {}",
                    cap - 1
                );
                assert!(b.held_bytes <= cap * 4096);
                last = b.misses;
            }
        }
    }
}
