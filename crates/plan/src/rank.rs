//! One rank's events for one epoch, cut from the global stream.

use std::collections::VecDeque;
use std::sync::Arc;

use super::brand::low_bits;
use super::global::{BrandRun, GlobalEpoch, GlobalRead, chunk_records};
use super::{Event, PlanSpec, Policy};
use brand_format::error::{Error, Result};
use brand_format::ids::IdBits;

/// What memory holds when a rank plan starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At position 0, right after this process executed the previous epoch
    /// (or at the very first epoch): memory holds what the plan left there,
    /// which is nothing, except in resident mode, where it is every sample
    /// read since the process started.
    Continue,
    /// After a restart, at global position `position`: memory is empty. The
    /// plan first re-reads what the protocol holds at that point (for this
    /// rank), then continues exactly as an uninterrupted run would.
    Cold { position: u64 },
}

/// A rank's ordered [`Event`]s for one epoch: its serves (global positions
/// `rank, rank + world, …`) with, before each, the reads it needs.
///
/// A global read is cut down to the records this rank will serve, and kept
/// where it happens in the global stream (before this rank's first serve at
/// or after the read's global position). Since ranks advance in lock step,
/// a rank holds about `1/world` of the world's resident samples.
///
/// A world of one running Brand from an epoch's start has nothing to cut:
/// its plan runs the protocol a position at a time as events are taken
/// ([`Streamed`]), so the first serve does not wait for the whole epoch to
/// be planned and no epoch's reads are held. The events are the same.
pub struct EpochPlan {
    streamed: Option<Streamed>,
    /// The world's epoch, until this rank's share is cut out of it
    /// ([`Own`]): then dropped, so a rank of many keeps `1/world` of it.
    global: Option<Arc<GlobalEpoch>>,
    own: Option<Own>,
    epoch: u64,
    rank: u64,
    world: u64,
    samples: u64,
    k: u32,
    steps: u64,
    next_step: u64,
    /// Global positions below this are served by some rank (the rest are
    /// the tail `drop_last` drops).
    served_limit: u64,
    holds_all: bool,
    /// Reads must be cut down to this rank's serves.
    project: bool,
    /// In resident mode, the reads that warm this rank's memory (from
    /// `Start::Cold`; none for `Start::Continue`). Otherwise unused.
    warm_reads: Vec<GlobalRead>,
    cursor: usize,
    queue: VecDeque<Event>,
    restore_reads: usize,
}

/// A rank's share of an epoch where reads are cut down to its serves
/// (several ranks, or `drop_last`): its samples by step and its reads, from
/// where the plan starts on.
struct Own {
    /// The sample of each step from `first_step` on.
    served: Vec<u32>,
    first_step: u64,
    /// This rank's reads (masks cut down), in time order.
    reads: Vec<GlobalRead>,
    memory: crate::PlanMemory,
}

impl Own {
    fn heap_bytes(&self) -> u64 {
        (self.served.capacity() * 4 + self.reads.capacity() * std::mem::size_of::<GlobalRead>()) as u64
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        self.memory.sub(self.heap_bytes());
    }
}

/// The protocol of a world of one, run as its events are taken.
struct Streamed {
    run: BrandRun,
    memory: crate::PlanMemory,
    bytes: u64,
}

impl Drop for Streamed {
    fn drop(&mut self) {
        self.memory.sub(self.bytes);
    }
}

impl EpochPlan {
    /// A world of one's Brand plan of `epoch` from its start (not resident).
    pub(super) fn streamed(shared: &PlanSpec, epoch: u64) -> Self {
        let geo = shared.geometry;
        debug_assert!(geo.world == 1 && shared.config.policy.is_brand() && !geo.holds_all);
        let run = BrandRun::new(
            &shared.config,
            epoch,
            geo.samples,
            geo.chunk_size,
            geo.group_size as u32,
        );
        let bytes = run.heap_bytes();
        shared.memory.add(bytes);
        EpochPlan {
            streamed: Some(Streamed {
                run,
                memory: shared.memory.clone(),
                bytes,
            }),
            global: None,
            own: None,
            epoch,
            rank: 0,
            world: 1,
            samples: geo.samples,
            k: geo.chunk_size,
            steps: geo.steps,
            next_step: 0,
            served_limit: geo.samples,
            holds_all: false,
            project: false,
            warm_reads: Vec::new(),
            cursor: 0,
            queue: VecDeque::new(),
            restore_reads: 0,
        }
    }

    /// The next events of a streamed plan: a serve, after the refill it
    /// needs if any. The protocol's state goes once the epoch is served.
    fn next_streamed(&mut self) -> Option<Event> {
        let stepped = self.streamed.as_mut().and_then(|s| s.run.step(|_| true));
        let Some((position, sample, refill)) = stepped else {
            self.streamed = None;
            return None;
        };
        self.next_step += 1;
        let serve = Event::Serve {
            position: position as u64,
            sample: sample as u64,
            slot: sample % self.k,
            padding: false,
            frees: true,
        };
        match refill {
            Some(r) => {
                self.queue.push_back(serve);
                Some(Event::Read {
                    chunk: r.chunk as u64,
                    mask: r.mask,
                })
            }
            None => Some(serve),
        }
    }

    pub(super) fn new(global: Arc<GlobalEpoch>, rank: u32, start: Start) -> Result<Self> {
        let geo = global.shared.geometry;
        if rank >= geo.world {
            return Err(Error::config(format!(
                "rank {rank} out of range for world {}",
                geo.world
            )));
        }
        let (rank, world) = (rank as u64, geo.world as u64);
        let n = geo.samples;
        let from = match start {
            Start::Continue => 0,
            Start::Cold { position } => position,
        };
        if from > geo.positions.max(n) {
            return Err(Error::config(format!(
                "cannot resume at position {from}: epochs have {} positions",
                geo.positions.max(n)
            )));
        }
        let served_limit = geo.positions.min(n);
        let first_step = if from <= rank { 0 } else { (from - rank).div_ceil(world) }.min(geo.steps);
        let project = !geo.holds_all && (world > 1 || served_limit < n);
        let mut plan = Self::unread(global, rank, first_step..geo.steps, served_limit, project);
        if plan.holds_all {
            if let Start::Cold { position } = start {
                plan.warm_reads = plan.warm_up_reads(position);
            }
        } else {
            plan.start_at(from);
        }
        Ok(plan)
    }

    /// `rank`'s plan of `global` for its steps `steps`, serving global
    /// positions below `served_limit`, its reads cut down to its serves if
    /// `project` (resident mode otherwise, if the epoch is resident):
    /// nothing placed yet.
    fn unread(
        global: Arc<GlobalEpoch>,
        rank: u64,
        steps: std::ops::Range<u64>,
        served_limit: u64,
        project: bool,
    ) -> Self {
        let geo = global.shared.geometry;
        EpochPlan {
            rank,
            world: geo.world as u64,
            samples: geo.samples,
            k: geo.chunk_size,
            steps: steps.end,
            next_step: steps.start,
            served_limit,
            holds_all: geo.holds_all && !project,
            project,
            warm_reads: Vec::new(),
            cursor: 0,
            queue: VecDeque::new(),
            restore_reads: 0,
            epoch: global.epoch(),
            streamed: None,
            own: None,
            global: Some(global),
        }
    }

    /// Outside resident mode, at global position `from`: the reads from
    /// there on, after what the protocol holds there for this plan's
    /// serves; cut down to them if the plan projects.
    fn start_at(&mut self, from: u64) {
        self.cursor = self
            .global_epoch()
            .reads()
            .partition_point(|r| u64::from(r.time) < from);
        if from > 0 {
            self.restore(from);
        }
        if self.project {
            self.cut_out_own();
        }
    }

    /// A world of one's plan of global positions `[from, to)` of the epoch
    /// alone: a split of it served by whoever opens it (tf.data service, a
    /// Ray read task). Its serves are the epoch's at those positions; its
    /// reads are the epoch's cut down to the samples served in the range,
    /// after the records read before `from` for them, merged by chunk (as
    /// a cold resume at `from` re-reads them). So the ranges of any
    /// partition of `[0, N)` serve the epoch's order and read each sample
    /// once between them. In resident mode, where the protocol makes no
    /// reads, a range reads each chunk's records it serves when it first
    /// serves one of them.
    pub(super) fn range(global: Arc<GlobalEpoch>, from: u64, to: u64) -> Result<Self> {
        let geo = global.shared.geometry;
        if geo.world != 1 {
            return Err(Error::config(format!(
                "a range of an epoch is planned for a world of one (its ranges are its shards), not {}",
                geo.world
            )));
        }
        let n = geo.samples;
        if from > to || to > n {
            return Err(Error::config(format!(
                "range [{from}, {to}) of an epoch of {n} positions"
            )));
        }
        let mut plan = Self::unread(global, 0, from..to, to, true);
        if geo.holds_all {
            let reads = plan.first_serve_reads(from, to);
            plan.keep_own(reads);
        } else {
            plan.start_at(from);
        }
        Ok(plan)
    }

    /// For a range in resident mode: each chunk's records served in
    /// `[from, to)`, read just before the first of them is served.
    fn first_serve_reads(&self, from: u64, to: u64) -> Vec<GlobalRead> {
        let served = &self.global_epoch().served()[from as usize..to as usize];
        let mut wanted: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        for &y in served {
            *wanted.entry(y / self.k).or_default() |= 1u64 << (y % self.k);
        }
        let mut reads = Vec::with_capacity(wanted.len());
        for (t, &y) in (from..to).zip(served) {
            if let Some(mask) = wanted.remove(&(y / self.k)) {
                reads.push(GlobalRead {
                    time: t as u32,
                    chunk: y / self.k,
                    mask,
                });
            }
        }
        reads
    }

    fn global_epoch(&self) -> &GlobalEpoch {
        match &self.global {
            Some(g) => g,
            None => unreachable!("the global epoch is dropped only once this rank's share is cut out"),
        }
    }

    /// Keeps only this rank's samples and reads, and lets the world's epoch
    /// go (freed unless another rank of this process plans from it).
    fn cut_out_own(&mut self) {
        let mine = self.mine(0);
        let reads: Vec<GlobalRead> = self.global_epoch().reads()[self.cursor..]
            .iter()
            .filter_map(|r| {
                let mask = self.mask_for_rank(r, &mine);
                (mask != 0).then_some(GlobalRead { mask, ..*r })
            })
            .collect();
        self.keep_own(reads);
    }

    /// Keeps this plan's samples by step and `reads` (its own), and lets
    /// the world's epoch go.
    fn keep_own(&mut self, mut reads: Vec<GlobalRead>) {
        let g = self.global_epoch();
        let served = g.served();
        let steps: Vec<u32> = (self.next_step..self.steps)
            .map(|i| served[((self.rank + i * self.world) % self.samples) as usize])
            .collect();
        reads.shrink_to_fit();
        let memory = g.shared.memory.clone();
        let own = Own {
            served: steps,
            first_step: self.next_step,
            reads,
            memory,
        };
        own.memory.add(own.heap_bytes());
        self.own = Some(own);
        self.cursor = 0;
        self.global = None;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The protocol runs as events are taken ([`Streamed`]): each event
    /// may cost a refill's work, where a cut plan's is a lookup.
    pub fn is_streamed(&self) -> bool {
        self.streamed.is_some()
    }

    pub fn rank(&self) -> u32 {
        self.rank as u32
    }

    /// Serves this rank makes in the whole epoch (the same on every rank).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// How many of the first events re-read, after a cold resume, what the
    /// protocol held at that point (0 otherwise).
    pub fn restore_reads(&self) -> usize {
        self.restore_reads
    }

    /// Samples a rank holds at global position `from` after an uninterrupted
    /// run: read before `from`, served by this rank at or after it. After a
    /// restart they are read again, merged by chunk.
    fn restore(&mut self, from: u64) {
        let mine = self.mine(from);
        let mut pending: Vec<(u32, u64)> = self.global_epoch().reads()[..self.cursor]
            .iter()
            .filter_map(|r| {
                let mask = self.mask_for_rank(r, &mine);
                (mask != 0).then_some((r.chunk, mask))
            })
            .collect();
        pending.sort_unstable_by_key(|&(c, _)| c);
        let mut merged: Vec<(u32, u64)> = Vec::with_capacity(pending.len());
        for (c, m) in pending {
            match merged.last_mut() {
                Some((last, mask)) if *last == c => *mask |= m,
                _ => merged.push((c, m)),
            }
        }
        self.restore_reads = merged.len();
        self.queue.extend(merged.into_iter().map(|(chunk, mask)| Event::Read {
            chunk: chunk as u64,
            mask,
        }));
    }

    /// Resident mode from a cold start at `from`: every rank will keep the
    /// whole dataset, so each rank reads every chunk once, when the global
    /// stream first touches it (whole chunk; one record for `direct`), and
    /// at the end of the epoch whatever the rest of the epoch did not touch.
    fn warm_up_reads(&self, from: u64) -> Vec<GlobalRead> {
        let (n, k) = (self.samples, self.k);
        let per_record = self.global_epoch().shared.config.policy == Policy::Direct;
        let chunks = n.div_ceil(k as u64);
        let full = |c: u64| low_bits(chunk_records(n, k, c));
        let mut loaded = vec![0u64; chunks as usize];
        let mut reads = Vec::new();
        let served = self.global_epoch().served();
        let end = self.world * self.steps;
        for t in from..end.max(n) {
            let y = served[(t % n) as usize];
            let (c, bit) = ((y / k) as usize, 1u64 << (y % k));
            if loaded[c] & bit == 0 {
                let mask = if per_record { bit } else { full(c as u64) & !loaded[c] };
                loaded[c] |= mask;
                reads.push(GlobalRead {
                    // Past 2^32 - 1 (padding of a dataset that large): at the end.
                    time: u32::try_from(t).unwrap_or(u32::MAX),
                    chunk: c as u32,
                    mask,
                });
            }
        }
        for (c, have) in loaded.iter().enumerate() {
            let missing = full(c as u64) & !have;
            if missing != 0 {
                reads.push(GlobalRead {
                    time: u32::MAX,
                    chunk: c as u32,
                    mask: missing,
                });
            }
        }
        reads
    }

    /// The samples this rank serves at a global position at or after
    /// `from`: a bit a sample (not the inverse order, 4 bytes a sample),
    /// for cutting reads down to this rank.
    fn mine(&self, from: u64) -> IdBits {
        let served = self.global_epoch().served();
        let mut mine = IdBits::new(self.samples);
        let first = if from <= self.rank {
            self.rank
        } else {
            self.rank + (from - self.rank).div_ceil(self.world) * self.world
        };
        for p in (first..self.served_limit).step_by(self.world as usize) {
            mine.insert(served[p as usize] as u64);
        }
        mine
    }

    /// The records of `read` in `mine`.
    fn mask_for_rank(&self, read: &GlobalRead, mine: &IdBits) -> u64 {
        let first = read.chunk as u64 * self.k as u64;
        let mut out = 0;
        let mut m = read.mask;
        while m != 0 {
            let j = m.trailing_zeros();
            m &= m - 1;
            if mine.contains(first + j as u64) {
                out |= 1u64 << j;
            }
        }
        out
    }

    fn read_at(&self, i: usize) -> Option<GlobalRead> {
        if self.holds_all {
            self.warm_reads.get(i).copied()
        } else if let Some(own) = &self.own {
            own.reads.get(i).copied()
        } else {
            self.global_epoch().reads().get(i).copied()
        }
    }

    /// The sample this rank serves at global position `q`.
    fn sample_at(&self, q: u64) -> u32 {
        match &self.own {
            Some(own) => own.served[((q - self.rank) / self.world - own.first_step) as usize],
            None => self.global_epoch().served()[(q % self.samples) as usize],
        }
    }
}

impl Iterator for EpochPlan {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if let Some(e) = self.queue.pop_front() {
            return Some(e);
        }
        if self.streamed.is_some() {
            return self.next_streamed();
        }
        let next = (self.next_step < self.steps).then(|| self.rank + self.next_step * self.world);
        while let Some(read) = self.read_at(self.cursor) {
            match next {
                Some(q) if u64::from(read.time) > q => break,
                // Reads after this rank's last serve hold nothing for it,
                // except the resident warm-up, which every rank makes.
                None if !self.holds_all => break,
                _ => {}
            }
            self.cursor += 1;
            // Own reads are cut down already; without them, nothing is cut.
            let mask = read.mask;
            if mask != 0 {
                return Some(Event::Read {
                    chunk: read.chunk as u64,
                    mask,
                });
            }
        }
        let q = next?;
        self.next_step += 1;
        let padding = q >= self.samples;
        let sample = self.sample_at(q);
        let serve = Event::Serve {
            position: q,
            sample: sample as u64,
            slot: sample % self.k,
            padding,
            frees: !self.holds_all,
        };
        if padding && !self.holds_all {
            // A repeat of a sample served (and freed) long ago: read it again.
            self.queue.push_back(serve);
            return Some(Event::Read {
                chunk: (sample / self.k) as u64,
                mask: 1u64 << (sample % self.k),
            });
        }
        Some(serve)
    }
}
