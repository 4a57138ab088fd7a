//! The plan: Brand's protocol and the other policies, from metadata only.
//!
//! Given the index (only sample count, chunk size and total decoded bytes
//! matter, see [`Layout`]), a [`PlanConfig`] and an epoch, the plan says, for
//! each rank, which chunk records are read when and which sample each
//! request gets, as a stream of [`Event`]s. It never touches a file and
//! never looks at a clock: the stream is a pure function of (metadata,
//! config, epoch) and of where memory starts cold.
//!
//! # Model
//!
//! * Sample ids are packed positions: chunk `c = id / K`, record `j = id % K`
//!   of it (the slot `j` of an abstract chunk it is served from).
//! * Memory: each rank's budget becomes `M` abstract slots (a byte budget
//!   divided by the mean *decoded* sample size, a percentage of the samples,
//!   at least one chunk); [`Geometry::rank_memory_bytes`] is `M` back in
//!   decoded bytes, what the loader holds. The protocol runs on
//!   the world's abstract memory, `world × M` slots, in `A = slots / K`
//!   abstract chunks; group `g` is chunks `[g·n, (g+1)·n)`, `n = ⌈chunks/A⌉`.
//! * Requests: epoch permutation π of `[0, N)` from `(seed, epoch)`. Global
//!   position `p` is taken by rank `p mod world` (DistributedSampler).
//! * Ranks share one global protocol state. The plan runs the protocol over
//!   the whole global request stream (positions `0..N` in order, which
//!   interleaves the ranks) and cuts each rank's events out of it: its own
//!   serves, and every read restricted to the records this rank will serve.
//!   So the served sequence does not depend on the world size, only on the
//!   total number of slots, and every sample is read by exactly the rank
//!   that serves it.
//! * Padding (default): every rank makes `⌈N/world⌉` serves; positions
//!   `q ≥ N` repeat the sample served at `q mod N` and are marked
//!   `padding`. They are outside the protocol: each is a fresh one-record
//!   read followed by its serve. `drop_last`: every rank makes `⌊N/world⌋`
//!   serves and the tail positions are served by nobody (the protocol still
//!   runs over them, so the order of the others does not change).
//! * Resident mode, when a rank's budget holds the whole dataset (`M ≥ N`):
//!   nothing is ever invalidated. Brand-family and direct epochs serve the
//!   permutation itself. A rank plan started cold reads every chunk once
//!   (when the global stream first touches it, and any chunk the rest of the
//!   epoch does not touch at its end); every later epoch of the same process
//!   ([`Start::Continue`]) has no reads at all. A resume after a restart is
//!   cold, so it reads everything once again.
//! * Resume: [`Planner::seek`] recomputes the global epoch from metadata,
//!   re-reads what the protocol holds at that position for this rank, then
//!   continues exactly as an uninterrupted run: same serves, same reads.
//! * Ranges: [`GlobalEpoch::range_plan`] plans global positions
//!   `[from, to)` alone for a world of one (a split of the epoch), its
//!   reads cut down to the samples it serves.

mod brand;
mod config;
mod global;
pub mod order;
mod rank;
pub mod simulate;
pub mod tier;

use std::sync::Arc;

use serde::Serialize;

pub use config::{MAX_RUN_LENGTH, Memory, PlanConfig, Policy};
pub use global::{GlobalEpoch, GlobalRead};
pub use rank::{EpochPlan, Start};

use brand_format::MAX_CHUNK_SIZE;
use brand_format::error::{Error, Result};
use brand_format::index::Index;

/// What the plan needs from a dataset: nothing else of the index matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub samples: u64,
    pub chunk_size: u32,
    /// Sum of the samples' sizes as served, decompressed (`raw_len`): a
    /// byte budget bounds what resident samples hold, whatever the
    /// compression (equal to the stored sizes for uncompressed datasets).
    pub sample_bytes: u64,
}

impl Layout {
    pub fn of(index: &Index) -> Self {
        Layout {
            samples: index.samples(),
            chunk_size: index.chunk_size(),
            sample_bytes: index.raw_lens().map(|l| l as u64).sum(),
        }
    }
}

/// The shape of the abstract memory and of an epoch, derived from the
/// layout and the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Geometry {
    pub samples: u64,
    pub chunk_size: u32,
    pub chunks: u64,
    /// Abstract slots of one rank's budget, `M`.
    pub rank_slots: u64,
    /// The world's abstract slots, `world × M`: what the protocol runs on.
    pub world_slots: u64,
    /// `A = max(1, slots / K)`.
    pub abstract_chunks: u64,
    /// Chunks per group, `n = ⌈chunks / A⌉`.
    pub group_size: u64,
    pub groups: u64,
    /// A rank's budget holds the whole dataset: nothing is ever invalidated
    /// (samples stay in memory across epochs).
    pub holds_all: bool,
    /// What a rank's resident samples may hold, in decoded bytes: its slots
    /// times the mean decoded sample size, rounded up, at most the dataset.
    /// The loader bounds its memory by this.
    pub rank_memory_bytes: u64,
    pub world: u32,
    /// Serves per rank per epoch.
    pub steps: u64,
    /// Global positions per epoch that ranks serve, `world × steps`
    /// (more than `N` with padding, at most `N` with `drop_last`).
    pub positions: u64,
}

impl Geometry {
    pub fn group_of_chunk(&self, chunk: u64) -> u64 {
        chunk / self.group_size
    }
}

pub(crate) struct PlanSpec {
    config: PlanConfig,
    geometry: Geometry,
    memory: PlanMemory,
}

/// Bytes of per-sample plan state (epochs' served orders, reads, inverse
/// orders) that a planner and its copies hold now, and the most they held:
/// metadata outside the sample budget, reported beside it.
#[derive(Debug, Clone, Default)]
pub struct PlanMemory(Arc<PlanMemoryCounts>);

#[derive(Debug, Default)]
struct PlanMemoryCounts {
    now: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
}

impl PlanMemory {
    pub(crate) fn add(&self, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self.0.now.fetch_add(bytes, Relaxed) + bytes;
        self.0.peak.fetch_max(now, Relaxed);
    }
    pub(crate) fn sub(&self, bytes: u64) {
        self.0.now.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
    }
    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.0.now.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// The most bytes held at once.
    pub fn peak_bytes(&self) -> u64 {
        self.0.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One step of a rank's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Read the records of `chunk` whose bits are set in `mask` (bit `j` =
    /// record `j` of the chunk) into memory. Always before the serves that need them.
    Read { chunk: u64, mask: u64 },
    /// Hand out `sample`, which is in memory.
    Serve {
        /// Global position in the epoch (`rank + i·world` for step `i`).
        position: u64,
        sample: u64,
        /// The chunk slot it is served from (`sample % K`): the abstract
        /// chunk location of the protocol.
        slot: u32,
        /// A repeat that pads this rank to the common step count.
        padding: bool,
        /// The sample leaves memory once served (everywhere except in
        /// resident mode).
        frees: bool,
    },
}

impl Event {
    /// Change in the number of samples this rank holds.
    pub fn held_delta(&self) -> i64 {
        match *self {
            Event::Read { mask, .. } => mask.count_ones() as i64,
            Event::Serve { frees, .. } => -(frees as i64),
        }
    }
}

/// Counts the samples a rank holds while its events are executed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residency {
    /// Samples held now.
    pub held: u64,
    pub peak: u64,
}

impl Residency {
    pub fn observe(&mut self, event: &Event) {
        self.held = self.held.saturating_add_signed(event.held_delta());
        self.peak = self.peak.max(self.held);
    }
}

/// The part of an epoch's global stream that one Brand group produces: its
/// serves `(global position, sample)` and its reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    pub serves: Vec<(u64, u32)>,
    pub reads: Vec<GlobalRead>,
}

/// Plans epochs for one rank (and, through [`GlobalEpoch`], for any rank).
/// Cloning is cheap (the geometry is shared): an open builds one planner
/// and hands copies to whoever plans (the loader's planning thread, a
/// node's owner).
#[derive(Clone)]
pub struct Planner {
    shared: Arc<PlanSpec>,
    /// The next plan starts with empty memory.
    cold: bool,
}

impl Planner {
    pub fn new(index: &Index, config: &PlanConfig) -> Result<Self> {
        Self::from_layout(Layout::of(index), config)
    }

    pub fn from_layout(layout: Layout, config: &PlanConfig) -> Result<Self> {
        let geometry = geometry(layout, config)?;
        Ok(Planner {
            shared: Arc::new(PlanSpec {
                config: config.clone(),
                geometry,
                memory: PlanMemory::default(),
            }),
            cold: true,
        })
    }

    pub fn config(&self) -> &PlanConfig {
        &self.shared.config
    }

    pub fn geometry(&self) -> &Geometry {
        &self.shared.geometry
    }

    /// What this planner's plans hold (shared with its copies).
    pub fn memory(&self) -> PlanMemory {
        self.shared.memory.clone()
    }

    /// Runs the protocol over all of `epoch`'s global positions.
    pub fn global_epoch(&self, epoch: u64) -> Arc<GlobalEpoch> {
        Arc::new(GlobalEpoch::compute(self.shared.clone(), epoch))
    }

    /// This rank's plan of `epoch` from its start. The first plan a planner
    /// makes starts with empty memory; each later one assumes this process
    /// executed the previous one (which matters only in resident mode).
    pub fn epoch(&mut self, epoch: u64) -> EpochPlan {
        let start = if self.cold {
            Start::Cold { position: 0 }
        } else {
            Start::Continue
        };
        self.cold = false;
        if self.streams() {
            return EpochPlan::streamed(&self.shared, epoch);
        }
        let rank = self.shared.config.rank;
        // The rank was checked against the world when the planner was made.
        match self.global_epoch(epoch).rank_plan(rank, start) {
            Ok(plan) => plan,
            Err(e) => unreachable!("rank checked in Planner::new: {e}"),
        }
    }

    /// Plans from an epoch's start are streamed (see [`EpochPlan`]): a world
    /// of one running Brand outside resident mode, where there is nothing
    /// to cut out of the world's epoch and memory starts empty either way.
    fn streams(&self) -> bool {
        let (cfg, g) = (&self.shared.config, &self.shared.geometry);
        cfg.policy.is_brand() && !g.holds_all && g.world == 1
    }

    /// The global position of this rank's serve number `step` (from 0), for
    /// loaders that count their own serves: `rank + step · world`.
    pub fn position_of_step(&self, step: u64) -> u64 {
        let c = &self.shared.config;
        c.rank as u64 + step * c.world as u64
    }

    /// Resume after a restart, before the first serve of this rank at global
    /// position `position` or later of `epoch` (for step `i`, `position =
    /// rank + i·world`). Memory is empty, so the plan first re-reads what
    /// the protocol holds there for this rank (see
    /// [`EpochPlan::restore_reads`]); after that it is identical to an
    /// uninterrupted run.
    pub fn seek(&mut self, epoch: u64, position: u64) -> Result<EpochPlan> {
        if position == 0 && self.streams() {
            self.cold = false;
            return Ok(EpochPlan::streamed(&self.shared, epoch));
        }
        let plan = self
            .global_epoch(epoch)
            .rank_plan(self.shared.config.rank, Start::Cold { position })?;
        self.cold = false;
        Ok(plan)
    }

    /// Group `group`'s share of `epoch` (Brand policies outside resident
    /// mode), computed without running the other groups: the basis of the
    /// multi-node mode, where each node plans the groups it owns.
    pub fn group_plan(&self, epoch: u64, group: u64) -> Result<GroupPlan> {
        let (cfg, g) = (&self.shared.config, &self.shared.geometry);
        if !cfg.policy.is_brand() || g.holds_all {
            return Err(Error::config(format!(
                "policy {} {}has no groups",
                cfg.policy,
                if g.holds_all { "in resident mode " } else { "" }
            )));
        }
        if group >= g.groups {
            return Err(Error::config(format!("group {group} of {}", g.groups)));
        }
        let (k, n) = (g.chunk_size, g.group_size);
        let in_group = |x: u32| (x / k) as u64 / n == group;
        let (served, reads) = global::brand_epoch(cfg, epoch, g.samples, k, n as u32, in_group);
        let serves = served
            .iter()
            .enumerate()
            .filter(|&(_, &y)| in_group(y))
            .map(|(p, &y)| (p as u64, y))
            .collect();
        Ok(GroupPlan { serves, reads })
    }
}

impl GlobalEpoch {
    /// `rank`'s events, starting as `start` says.
    pub fn rank_plan(self: &Arc<Self>, rank: u32, start: Start) -> Result<EpochPlan> {
        EpochPlan::new(self.clone(), rank, start)
    }

    /// The events of global positions `[from, to)` alone, for a world of
    /// one (see [`EpochPlan`]'s ranges): one epoch computed once serves
    /// every range of it.
    pub fn range_plan(self: &Arc<Self>, from: u64, to: u64) -> Result<EpochPlan> {
        EpochPlan::range(self.clone(), from, to)
    }
}

fn geometry(layout: Layout, config: &PlanConfig) -> Result<Geometry> {
    let Layout {
        samples: n,
        chunk_size: k,
        sample_bytes,
    } = layout;
    if config.world == 0 {
        return Err(Error::config("world size must be at least 1"));
    }
    if config.rank >= config.world {
        return Err(Error::config(format!(
            "rank {} out of range for world {}",
            config.rank, config.world
        )));
    }
    if k == 0 || k > MAX_CHUNK_SIZE {
        return Err(Error::config(format!("chunk size {k} outside 1..={MAX_CHUNK_SIZE}")));
    }
    if n == 0 {
        return Err(Error::config("the dataset has no samples"));
    }
    if n > u32::MAX as u64 {
        return Err(Error::config(format!("{n} samples: at most 2^32 - 1 are supported")));
    }
    config.memory.check()?;
    if !(1..=MAX_RUN_LENGTH).contains(&config.run_length) {
        return Err(Error::config(format!(
            "run length {} outside 1..={MAX_RUN_LENGTH}",
            config.run_length
        )));
    }
    let rank_slots = match config.memory {
        // Mean size zero: any budget holds everything.
        Memory::Bytes(_) if sample_bytes == 0 => u64::MAX,
        Memory::Bytes(b) => (b as u128 * n as u128 / sample_bytes as u128).min(u64::MAX as u128) as u64,
        // A share of a small dataset (10 % of fewer than 10 chunks) rounds
        // up to one chunk, the least the protocol runs on: small datasets
        // just work with the default budget. Budgets of a chunk or more are
        // unchanged, and so are their orders.
        Memory::Percent(p) => ((p * n as f64 / 100.0).floor() as u64).max(n.min(k as u64)),
        Memory::Slots(m) => m,
    };
    let one_chunk = n.min(k as u64);
    if rank_slots < one_chunk {
        let bytes = (one_chunk as u128 * sample_bytes as u128).div_ceil(n as u128);
        return Err(Error::config(format!(
            "memory {} holds {rank_slots} samples, less than one chunk ({one_chunk} samples, about {bytes} bytes)",
            config.memory
        )));
    }
    let world = config.world as u64;
    let slots = rank_slots.saturating_mul(world);
    let chunks = n.div_ceil(k as u64);
    let abstract_chunks = (slots / k as u64).max(1);
    let group_size = chunks.div_ceil(abstract_chunks);
    let steps = if config.drop_last { n / world } else { n.div_ceil(world) };
    if steps == 0 {
        return Err(Error::config(format!(
            "drop_last with world {world} and {n} samples leaves every rank an empty epoch: use at most {n} ranks or padding"
        )));
    }
    Ok(Geometry {
        samples: n,
        chunk_size: k,
        chunks,
        rank_slots,
        world_slots: slots,
        abstract_chunks,
        group_size,
        groups: chunks.div_ceil(group_size),
        holds_all: rank_slots >= n,
        rank_memory_bytes: (rank_slots.min(n) as u128 * sample_bytes as u128).div_ceil(n as u128) as u64,
        world: config.world,
        steps,
        positions: steps * world,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(samples: u64, chunk_size: u32) -> Layout {
        Layout {
            samples,
            chunk_size,
            sample_bytes: samples * 1000,
        }
    }

    #[test]
    fn geometry_follows_the_budget() {
        let cfg = PlanConfig::new(Memory::Percent(10.0));
        let g = geometry(layout(20_000, 64), &cfg).expect("valid");
        assert_eq!(g.rank_slots, 2_000);
        assert_eq!(g.abstract_chunks, 31);
        assert_eq!(g.chunks, 313);
        assert_eq!(g.group_size, 11);
        assert_eq!(g.groups, 29);
        assert!(!g.holds_all);
        // 2 MB at 1000 bytes a sample is the same budget.
        let g2 = geometry(layout(20_000, 64), &PlanConfig::new(Memory::Bytes(2_000_000))).expect("valid");
        assert_eq!(g2, g);
        let whole = geometry(layout(20_000, 64), &PlanConfig::new(Memory::Percent(100.0))).expect("valid");
        assert!(whole.holds_all);
        let almost = geometry(layout(20_000, 64), &PlanConfig::new(Memory::Slots(19_999))).expect("valid");
        assert!(!almost.holds_all);
    }

    #[test]
    fn world_multiplies_slots_and_splits_steps() {
        let mut cfg = PlanConfig::new(Memory::Slots(100));
        cfg.world = 3;
        cfg.rank = 2;
        let g = geometry(layout(1_000, 10), &cfg).expect("valid");
        assert_eq!((g.world_slots, g.steps, g.positions), (300, 334, 1_002));
        cfg.drop_last = true;
        let g = geometry(layout(1_000, 10), &cfg).expect("valid");
        assert_eq!((g.steps, g.positions), (333, 999));
    }

    #[test]
    fn impossible_configs_are_errors() {
        let l = layout(1_000, 64);
        let with = |f: &dyn Fn(&mut PlanConfig)| {
            let mut c = PlanConfig::new(Memory::Percent(50.0));
            f(&mut c);
            geometry(l, &c)
        };
        assert!(with(&|_| {}).is_ok());
        assert!(with(&|c| c.memory = Memory::Slots(63)).is_err());
        assert!(with(&|c| c.memory = Memory::Bytes(63_000)).is_err());
        assert!(with(&|c| c.memory = Memory::Bytes(64_000)).is_ok());
        assert!(with(&|c| c.memory = Memory::Percent(-1.0)).is_err());
        assert!(with(&|c| c.memory = Memory::Percent(f64::NAN)).is_err());
        assert!(with(&|c| c.world = 0).is_err());
        assert!(with(&|c| c.rank = 1).is_err());
        assert!(geometry(layout(0, 64), &PlanConfig::new(Memory::Percent(50.0))).is_err());
        let msg = with(&|c| c.memory = Memory::Bytes(1_000))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("less than one chunk") && msg.contains("64000 bytes"),
            "{msg}"
        );
        // Fewer samples than a chunk: one chunk is the whole dataset.
        assert!(geometry(layout(5, 64), &PlanConfig::new(Memory::Slots(5))).is_ok_and(|g| g.holds_all));
    }

    #[test]
    fn a_percentage_below_one_chunk_rounds_up_to_one_chunk() {
        // 10 % of 300 samples is 30 < 64: one chunk, not an error.
        let g = geometry(layout(300, 64), &PlanConfig::new(Memory::Percent(10.0))).expect("one chunk");
        assert_eq!(g.rank_slots, 64);
        assert!(!g.holds_all);
        // Fewer samples than a chunk: the whole dataset.
        let g = geometry(layout(40, 64), &PlanConfig::new(Memory::Percent(10.0))).expect("whole");
        assert!(g.holds_all);
        // At or above one chunk nothing changes.
        let g = geometry(layout(640, 64), &PlanConfig::new(Memory::Percent(10.0))).expect("valid");
        assert_eq!(g.rank_slots, 64);
        let g = geometry(layout(20_000, 64), &PlanConfig::new(Memory::Percent(10.0))).expect("valid");
        assert_eq!(g.rank_slots, 2_000);
        // Byte and slot budgets say exactly what they mean: still refused.
        assert!(geometry(layout(300, 64), &PlanConfig::new(Memory::Slots(30))).is_err());
    }

    #[test]
    fn drop_last_with_more_ranks_than_samples_is_a_config_error() {
        let mut cfg = PlanConfig::new(Memory::Percent(50.0));
        cfg.drop_last = true;
        cfg.world = 301;
        let msg = geometry(layout(300, 16), &cfg)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("drop_last") && msg.contains("empty epoch"), "{msg}");
        cfg.world = 300;
        assert!(geometry(layout(300, 16), &cfg).is_ok_and(|g| g.steps == 1));
        // Padding gives every rank a sample.
        cfg.drop_last = false;
        cfg.world = 1_000;
        assert!(geometry(layout(300, 16), &cfg).is_ok_and(|g| g.steps == 1));
    }
}
