//! The global request stream of one epoch: which sample every global
//! position is served and which chunk reads the protocol makes, before it is
//! split among ranks.

use std::sync::{Arc, OnceLock};

use super::brand::{BrandState, Refill, TieBreaks, low_bits};
use super::{PlanConfig, PlanSpec, Policy};
use brand_format::rng::{Prng, domain};

/// A read made by the global protocol: `mask` records of `chunk`, done just
/// before the serve at global position `time`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalRead {
    /// A global position `< N`, so 32 bits (a read is 16 bytes).
    pub time: u32,
    pub chunk: u32,
    pub mask: u64,
}

/// One epoch of the protocol over all `N` global positions, shared by every
/// rank's [`EpochPlan`](super::EpochPlan) (it is behind an `Arc`).
///
/// The protocol always runs over all `N` positions, whatever the world size
/// and `drop_last`: ranks only decide who gets which position. So the served
/// sequence does not depend on the world size, only on the total number of
/// slots.
pub struct GlobalEpoch {
    pub(super) shared: Arc<PlanSpec>,
    epoch: u64,
    /// `served[p]`: the sample served at global position `p < N`.
    served: Vec<u32>,
    /// Reads in time order. Empty in resident mode, where what must be read
    /// depends on whether memory starts cold (see `EpochPlan`).
    reads: Vec<GlobalRead>,
    /// `serve_pos[sample]`: inverse of `served`, built when first needed
    /// (splitting reads among several ranks, resuming).
    serve_pos: OnceLock<Vec<u32>>,
}

impl GlobalEpoch {
    pub(super) fn compute(shared: Arc<PlanSpec>, epoch: u64) -> Self {
        let g = &shared.geometry;
        let seed = shared.config.seed;
        let (n, k) = (g.samples, g.chunk_size);
        let (served, reads) = match shared.config.policy {
            // Everything stays in memory: serve the permutation itself and
            // let the rank plans read each chunk once when memory is cold.
            Policy::Brand | Policy::BrandRandom | Policy::Tiered if g.holds_all => {
                (permutation(seed, epoch, n), Vec::new())
            }
            Policy::Brand | Policy::BrandRandom => {
                brand_epoch(&shared.config, epoch, n, k, g.group_size as u32, |_| true)
            }
            Policy::Direct => {
                let served = permutation(seed, epoch, n);
                let reads = served
                    .iter()
                    .enumerate()
                    .map(|(p, &x)| GlobalRead {
                        time: p as u32,
                        chunk: x / k,
                        mask: 1u64 << (x % k),
                    })
                    .collect();
                (served, reads)
            }
            Policy::ChunkShuffle => chunk_shuffle_epoch(seed, epoch, n, k, g.world_slots),
            Policy::Tiered => tiered_epoch(seed, epoch, n, k, g.world_slots, shared.config.pinned_share),
            Policy::Sequential => {
                let served = (0..n as u32).collect();
                let reads = (0..g.chunks)
                    .map(|c| GlobalRead {
                        time: (c * k as u64) as u32,
                        chunk: c as u32,
                        mask: low_bits(chunk_records(n, k, c)),
                    })
                    .collect();
                (served, reads)
            }
        };
        let mut reads = if g.holds_all { Vec::new() } else { reads };
        reads.shrink_to_fit();
        shared.memory.add(heap_bytes(&served, &reads));
        GlobalEpoch {
            shared,
            epoch,
            served,
            reads,
            serve_pos: OnceLock::new(),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sample served at each global position `0..N`.
    pub fn served(&self) -> &[u32] {
        &self.served
    }

    /// The protocol's reads in time order (none in resident mode).
    pub fn reads(&self) -> &[GlobalRead] {
        &self.reads
    }

    /// The global position at which each sample is served.
    pub fn serve_positions(&self) -> &[u32] {
        self.serve_pos.get_or_init(|| {
            let mut pos = vec![0u32; self.served.len()];
            for (p, &y) in self.served.iter().enumerate() {
                pos[y as usize] = p as u32;
            }
            self.shared.memory.add(pos.capacity() as u64 * 4);
            pos
        })
    }

    /// Most samples resident at once in the world's memory under this
    /// protocol: read and not yet served (counting samples no rank takes
    /// under `drop_last`, which the protocol still fills).
    pub fn peak_resident(&self) -> u64 {
        let (mut resident, mut peak) = (0u64, 0u64);
        let mut reads = self.reads.iter().peekable();
        for p in 0..self.served.len() as u64 {
            while let Some(r) = reads.next_if(|r| u64::from(r.time) <= p) {
                resident += r.mask.count_ones() as u64;
            }
            peak = peak.max(resident);
            resident = resident.saturating_sub(1);
        }
        peak
    }
}

impl Drop for GlobalEpoch {
    fn drop(&mut self) {
        let inverse = self.serve_pos.get().map_or(0, |p| p.capacity() as u64 * 4);
        self.shared.memory.sub(heap_bytes(&self.served, &self.reads) + inverse);
    }
}

/// Heap bytes of an epoch's served order and reads.
fn heap_bytes(served: &[u32], reads: &Vec<GlobalRead>) -> u64 {
    (std::mem::size_of_val(served) + reads.capacity() * std::mem::size_of::<GlobalRead>()) as u64
}

/// Records in chunk `c` of `n` samples in chunks of `k`.
pub(crate) fn chunk_records(n: u64, k: u32, c: u64) -> u32 {
    (n - c * k as u64).min(k as u64) as u32
}

/// The request permutation π of epoch `epoch`.
fn permutation(seed: u64, epoch: u64, n: u64) -> Vec<u32> {
    Prng::stream(seed, &[domain::EPOCH, epoch]).permutation(n as usize)
}

/// Brand (or brand-random, as the config says) over one epoch's requests,
/// one global position at a time: what both a whole epoch computed at once
/// and a plan streamed as it is served run, so they cannot differ.
pub(crate) struct BrandRun {
    state: BrandState,
    ties: TieBreaks,
    /// The epoch's permutation; a position's request becomes the sample
    /// served there once it is answered.
    slots: Vec<u32>,
    next: usize,
}

impl BrandRun {
    /// Empty abstract memory before the first request of `epoch`: `n`
    /// samples in chunks of `k`, groups of `group_size` chunks. With a
    /// `run_length` above 1 refills fill records in runs of that many
    /// neighbours (see [`BrandState`]).
    pub fn new(config: &PlanConfig, epoch: u64, n: u64, k: u32, group_size: u32) -> Self {
        let (seed, run_length) = (config.seed, config.run_length);
        let random = config.policy == Policy::BrandRandom;
        let first_run = if run_length > 1 {
            // Where this epoch's runs start: pairs of records that share a run
            // change from epoch to epoch.
            1 + Prng::stream(seed, &[domain::RUNS, epoch]).below(run_length as u64) as u32
        } else {
            0
        };
        let groups = n.div_ceil(k as u64).div_ceil(group_size as u64) as u32;
        BrandRun {
            state: BrandState::with_runs(n, k, group_size, random, run_length, first_run),
            ties: TieBreaks::new(seed, epoch, groups),
            slots: permutation(seed, epoch, n),
            next: 0,
        }
    }

    /// Answers the request at the next position if `keep` accepts it:
    /// `(position, sample served, refill done first)`; a position not kept
    /// keeps its request and gives `(position, request, None)`. `None` after
    /// the last position.
    #[inline]
    pub fn step(&mut self, keep: impl Fn(u32) -> bool) -> Option<(u32, u32, Option<Refill>)> {
        let p = self.next;
        let slot = self.slots.get_mut(p)?;
        self.next += 1;
        if !keep(*slot) {
            return Some((p as u32, *slot, None));
        }
        let ties = &mut self.ties;
        let (y, refill) = self.state.request(*slot, &mut |g, choices| ties.below(g, choices));
        *slot = y;
        Some((p as u32, y, refill))
    }

    /// Heap bytes held: the permutation and the abstract memory.
    pub fn heap_bytes(&self) -> u64 {
        self.slots.capacity() as u64 * 4 + self.state.heap_bytes()
    }

    /// The sample served at every position answered so far, and the
    /// requests of the rest.
    fn into_served(self) -> Vec<u32> {
        self.slots
    }
}

/// Runs [`BrandRun`] over all of an epoch's positions, answering those whose
/// requested sample satisfies `keep` (all of them, or one group's). Returns
/// the sample served at every position (a position that is not kept holds
/// its request, which is in another group) and the reads, at global
/// positions.
pub(super) fn brand_epoch(
    config: &PlanConfig,
    epoch: u64,
    n: u64,
    k: u32,
    group_size: u32,
    keep: impl Fn(u32) -> bool,
) -> (Vec<u32>, Vec<GlobalRead>) {
    let mut run = BrandRun::new(config, epoch, n, k, group_size);
    let mut reads = Vec::new();
    while let Some((time, _, refill)) = run.step(&keep) {
        if let Some(r) = refill {
            reads.push(GlobalRead {
                time,
                chunk: r.chunk,
                mask: r.mask,
            });
        }
    }
    (run.into_served(), reads)
}

/// DIESEL's chunk-wise shuffle: chunks in a shuffled order, cut into windows
/// of consecutive chunks whose samples fit `slots`; each window's chunks are
/// read whole when it starts and its samples served in shuffled order.
fn chunk_shuffle_epoch(seed: u64, epoch: u64, n: u64, k: u32, slots: u64) -> (Vec<u32>, Vec<GlobalRead>) {
    let chunks = n.div_ceil(k as u64);
    let order = Prng::stream(seed, &[domain::CHUNK_ORDER, epoch]).permutation(chunks as usize);
    let mut served = Vec::with_capacity(n as usize);
    let mut reads = Vec::with_capacity(chunks as usize);
    let mut window = 0u64;
    let mut i = 0;
    while i < order.len() {
        let start = served.len();
        let mut held = 0u64;
        // At least one chunk per window: the budget holds a chunk.
        while let Some(&c) = order.get(i) {
            let records = chunk_records(n, k, c as u64);
            if served.len() > start && held + records as u64 > slots {
                break;
            }
            held += records as u64;
            reads.push(GlobalRead {
                time: start as u32,
                chunk: c,
                mask: low_bits(records),
            });
            let first = c * k;
            served.extend(first..first + records);
            i += 1;
        }
        Prng::stream(seed, &[domain::WINDOW, epoch, window]).shuffle(&mut served[start..]);
        window += 1;
    }
    (served, reads)
}

/// The `tiered` policy (`brand_format::pin`): the pinned chunks' samples,
/// in a random order of their own, are spread uniformly over the epoch,
/// each read alone just before its serve (from the local tier); the other
/// chunks are read whole, in a shuffled order, into a buffer of `slots`
/// samples from which a uniformly random one is served. At each position
/// the next serve is pinned with the probability of the pinned share of
/// what is left, so both kinds are spread evenly. A streamed chunk is read
/// only when a streamed sample is to be served and it fits, so what is
/// held never exceeds `slots` (at least one chunk). The buffer grows from
/// one chunk at the epoch's start by two slots per streamed serve: a
/// start's first batch waits for a few chunks, not a memory's worth
/// (these reads are whole, never split record by record).
fn tiered_epoch(seed: u64, epoch: u64, n: u64, k: u32, slots: u64, share: u8) -> (Vec<u32>, Vec<GlobalRead>) {
    let chunks = n.div_ceil(k as u64);
    let pinned = brand_format::pin::pinned(chunks, share);
    let mut pinned_samples: Vec<u32> = (0..chunks as u32)
        .filter(|&c| pinned[c as usize])
        .flat_map(|c| c * k..c * k + chunk_records(n, k, c as u64))
        .collect();
    Prng::stream(seed, &[domain::EPOCH, epoch]).shuffle(&mut pinned_samples);
    let streamed: Vec<u32> = Prng::stream(seed, &[domain::CHUNK_ORDER, epoch])
        .permutation(chunks as usize)
        .into_iter()
        .filter(|&c| !pinned[c as usize])
        .collect();
    let mut rng = Prng::stream(seed, &[domain::TIERED, epoch]);
    let mut served = Vec::with_capacity(n as usize);
    let mut reads = Vec::new();
    let mut buffer: Vec<u32> = Vec::with_capacity(slots.min(n) as usize);
    let (mut next_pinned, mut next_chunk) = (0usize, 0usize);
    let streamed_samples = n - pinned_samples.len() as u64;
    let mut streamed_served = 0u64;
    for time in 0..n as u32 {
        let pinned_left = (pinned_samples.len() - next_pinned) as u64;
        if rng.below(pinned_left + streamed_samples - streamed_served) < pinned_left {
            let x = pinned_samples[next_pinned];
            next_pinned += 1;
            reads.push(GlobalRead {
                time,
                chunk: x / k,
                mask: 1u64 << (x % k),
            });
            served.push(x);
            continue;
        }
        let room = slots.min(k as u64 + 2 * streamed_served);
        while let Some(&c) = streamed.get(next_chunk) {
            let records = chunk_records(n, k, c as u64);
            if !buffer.is_empty() && buffer.len() as u64 + records as u64 > room {
                break;
            }
            reads.push(GlobalRead {
                time,
                chunk: c,
                mask: low_bits(records),
            });
            buffer.extend(c * k..c * k + records);
            next_chunk += 1;
        }
        let i = rng.below(buffer.len() as u64) as usize;
        served.push(buffer.swap_remove(i));
        streamed_served += 1;
    }
    (served, reads)
}
