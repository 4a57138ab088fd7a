//! The [`Loader`]: walks the plan's steps, keeps the engine busy with the
//! plan's future reads within the memory bound, and hands out batches in
//! the plan's served order.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Instant;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::{Extent, ReadGap, extents};
use brand_format::ids::IdMap;
use brand_io::engine::Completion;
use brand_io::{IoBackend, ReadSession};
use brand_plan::{Event, PlanMemory, Planner};

use crate::checkpoint::{Checkpoint, Fingerprint, LoaderState, Resume};
use crate::deferred::{Deferred, split_budget, worth_splitting};
use crate::held::Held;
use crate::planning::{EventSource, Next, PlanFeed, plan_events};
use crate::stats::{Metrics, StallLog};
use crate::{Batch, LoaderConfig, OnCorrupt, SampleBytes};

/// What a read in flight brings: its samples' decoded bytes (the samples
/// are its extent's records, which come back with its completion).
struct ReadFor {
    decoded: u64,
}

pub struct Loader {
    ds: Arc<Dataset>,
    cfg: LoaderConfig,
    /// The engine and the reads in flight. Not dropped in a forked child,
    /// whose engine threads are not there (see Drop).
    reads: ManuallyDrop<ReadSession<ReadFor>>,
    /// Decoded bytes of the samples the reads in flight bring.
    in_flight_decoded: u64,
    plan: PlanFeed,
    /// What a checkpoint of this loader is bound to (None for a loader made
    /// from an event source alone, which has no plan to bind it to).
    fingerprint: Option<Fingerprint>,
    epoch: u64,
    served: u64,
    /// Plan steps taken but not yet reached by the consumer.
    lookahead: VecDeque<Step>,
    /// Without read-ahead (`readahead = 0`), a read taken from the plan
    /// while earlier steps are unreached waits here: issued earlier, it
    /// could complete before the serves that make room for it, and memory
    /// would hold more than the plan's bound.
    held_read: Option<Event>,
    /// Bytes of the reads issued for events still in `lookahead`, oldest first.
    ahead: VecDeque<u64>,
    ahead_bytes: u64,
    /// Plan reads the consumer has reached: `ahead[i]` is read number
    /// `reached + i`.
    reached: u64,
    /// Large plan reads of a start's epoch, fetched as their records come
    /// due (see `deferred`), and the bytes of those deferred since the
    /// start: a memory's worth at most.
    deferred: Deferred,
    deferred_bytes: u64,
    /// The extents of the read being issued (kept: one vector for every read).
    extents: Vec<Extent>,
    held: Held,
    /// Samples whose record could not be read or decoded: the error is
    /// reported when the sample is due, not when its read completes.
    bad: IdMap<Error>,
    /// The plan's memory bound in decoded bytes
    /// ([`brand_plan::Geometry::rank_memory_bytes`]): read-ahead is held back
    /// while the decoded bytes held (in memory and in flight) reach it plus
    /// `readahead` (None: no plan, no byte bound).
    memory_bound: Option<u64>,
    /// An error, reported again on every call until the loader is reset:
    /// the sample it stopped on cannot be served.
    failed: Option<Error>,
    /// The process that opened the loader (see the crate docs on fork).
    pid: u32,
    stalls: StallLog,
    /// A sample was served: the engine hears of the consumer's waits from
    /// then on (a local tier's placement measures them; the first fill's
    /// wait is the start's, not the store's steady cost).
    consumer_started: bool,
    metrics: Metrics,
    /// The store's counters when the metrics were last reset.
    store_base: Option<brand_store::GetReport>,
    /// The tier's counters when the metrics were last reset.
    tier_base: Option<brand_io::tier::TierReport>,
    /// What the plan holds (None for a loader made from an event source).
    plan_memory: Option<PlanMemory>,
}

/// One step of the plan as the loader walks it.
#[derive(Debug, Clone, Copy)]
enum Step {
    Plan(Event),
    /// The end of an epoch: the consumer gets `None` here.
    EpochEnd,
}

/// What a batch took from the plan, so an error can put it all back.
enum Taken {
    Served(Event, u64, SampleBytes),
    Skipped(Event, u64, Error),
}

/// Most plan events held ahead of the consumer (bounds memory when a long
/// run of serves needs no reads).
const MAX_LOOKAHEAD_EVENTS: usize = 1 << 16;

/// The fewest reads in flight [`Loader::max_reads_ahead`] allows: eight
/// times what two rings of the default queue depth hold.
const MIN_READS_AHEAD: usize = 512;

impl Loader {
    /// A loader over `ds` running the plan of `cfg`, starting where
    /// `resume` says (`LoaderState::default()` for the first epoch, a
    /// [`Checkpoint`], or every rank's checkpoints of another world).
    /// `cfg`'s automatic settings are decided by the reader that opens it
    /// (`brand_reader::decide`): `run_length = "auto"` is refused here, and
    /// `read_gap = "auto"` is measured by the engine only for a caller
    /// that did not decide it.
    pub fn open(ds: Arc<Dataset>, cfg: &LoaderConfig, resume: impl Into<Resume>) -> Result<Self> {
        if cfg.run_length == crate::RunLength::Auto {
            return Err(Error::config(
                "run_length = \"auto\" is decided by the reader that opens the dataset (brand_reader::decide): a loader takes a number",
            ));
        }
        let mut cfg = cfg.clone();
        cfg.pin(&ds);
        let planner = Planner::new(&ds.index, &cfg.plan)?;
        Self::open_planned(ds, &cfg, planner, resume.into())
    }

    /// [`open`](Self::open) with the plan already made (an open makes one
    /// planner and passes it down).
    pub fn open_planned(ds: Arc<Dataset>, cfg: &LoaderConfig, planner: Planner, resume: Resume) -> Result<Self> {
        let fingerprint = Fingerprint::of(&ds, &planner);
        let start = resume.start(&ds, &planner, &fingerprint)?;
        let memory_bound = planner.geometry().rank_memory_bytes;
        let plan_memory = planner.memory();
        let memory_slots = planner.geometry().rank_slots;
        let mut l = Self::start(ds, cfg.clone(), plan_events(planner), start.state, Some(memory_bound))?;
        l.metrics.memory_slots = memory_slots;
        l.fingerprint = Some(fingerprint);
        l.plan_memory = Some(plan_memory);
        Ok(l)
    }

    /// A loader over `ds` whose events come from `source`, starting at
    /// `state`, without a memory bound (`readahead` bounds what is read ahead).
    pub fn new(ds: Arc<Dataset>, cfg: LoaderConfig, source: EventSource, state: LoaderState) -> Result<Self> {
        Self::start(ds, cfg, source, state, None)
    }

    fn start(
        ds: Arc<Dataset>,
        cfg: LoaderConfig,
        source: EventSource,
        state: LoaderState,
        memory_bound: Option<u64>,
    ) -> Result<Self> {
        cfg.check()?;
        brand_format::buffer::size_recycling(memory_bound.unwrap_or(0).saturating_add(cfg.readahead_bytes));
        // Registered buffers are read-ahead memory.
        let mut engine = cfg.io.engine_config(&ds, cfg.readahead_bytes);
        if let Some(tier) = engine.tier.as_mut()
            && cfg.plan.policy == brand_plan::Policy::Tiered
        {
            tier.pinned_share = Some(cfg.plan.pinned_share);
        }
        let reads = ReadSession::open(ds.clone(), engine, cfg.io.read_gap)?;
        let metrics = Metrics {
            read_gap: match reads.gap() {
                ReadGap::Whole => None,
                ReadGap::Bytes(b) => Some(b),
            },
            run_length: cfg.plan.run_length,
            ..Default::default()
        };
        Ok(Loader {
            reads: ManuallyDrop::new(reads),
            in_flight_decoded: 0,
            ds,
            cfg,
            plan: PlanFeed::new(source, state.epoch),
            fingerprint: None,
            epoch: state.epoch,
            served: state.served,
            lookahead: VecDeque::new(),
            held_read: None,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            reached: 0,
            deferred: Deferred::default(),
            deferred_bytes: 0,
            extents: Vec::new(),
            held: Held::default(),
            bad: IdMap::default(),
            memory_bound,
            failed: None,
            pid: std::process::id(),
            stalls: StallLog::default(),
            consumer_started: false,
            metrics,
            store_base: None,
            tier_base: None,
            plan_memory: None,
        })
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Where the loader is: the current epoch and the samples of it handed
    /// out (after an epoch's end: the next epoch and 0).
    pub fn state(&self) -> LoaderState {
        LoaderState {
            epoch: self.epoch,
            served: self.served,
        }
    }

    /// The loader's state bound to its dataset and plan, to resume from
    /// with [`Resume::Checkpoint`]. Samples of batches already returned
    /// count as served.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let fingerprint = self
            .fingerprint
            .ok_or_else(|| Error::config("a loader made from an event source has no plan to checkpoint"))?;
        Ok(Checkpoint {
            state: self.state(),
            fingerprint,
            bitmap: None,
        })
    }

    pub fn metrics(&self) -> Metrics {
        let mut m = self.metrics.clone();
        self.stalls.fill(&mut m);
        let reads = &self.reads;
        m.buffered_fallback = reads.buffered_fallback();
        m.threads_backend = reads.backend() == IoBackend::Threads;
        m.uring_refused = reads.uring_refused();
        m.registered_buffer_bytes = reads.registered_bytes();
        m.peak_read_buffer_bytes = reads.peak_pool_bytes();
        if let Some(now) = reads.store_report() {
            m.set_store(&now, self.store_base.as_ref());
        }
        if let Some(now) = reads.tier_report() {
            m.set_tier(&now, self.tier_base.as_ref());
        }
        m.index_file_bytes = self.ds.index.file_bytes();
        m.index_heap_bytes = self.ds.index.heap_bytes();
        if let Some(p) = &self.plan_memory {
            (m.plan_bytes, m.plan_peak_bytes) = (p.bytes(), p.peak_bytes());
        }
        m
    }

    /// Starts the counters afresh (e.g. per epoch); peaks restart from what
    /// is held now.
    pub fn reset_metrics(&mut self) {
        self.metrics = Metrics {
            read_gap: self.metrics.read_gap,
            run_length: self.metrics.run_length,
            memory_slots: self.metrics.memory_slots,
            peak_resident_bytes: self.held.bytes(),
            peak_resident_samples: self.held.len(),
            peak_readahead_bytes: self.reads.in_flight_read_bytes(),
            ..Default::default()
        };
        self.store_base = self.reads.store_report();
        self.tier_base = self.reads.tier_report();
        self.stalls = StallLog::default();
    }

    /// The decoded bytes held samples may take, as the plan bounds them
    /// (None for a loader made from an event source alone).
    pub fn memory_bound(&self) -> Option<u64> {
        self.memory_bound
    }

    /// Reads ahead no further than the end of `epoch`, the last this run
    /// takes (`None`: every epoch is read ahead into the next). Only bytes
    /// fetched change: a batch asked for after it is served as ever, its
    /// epoch's reads starting then. Read-ahead into an epoch nobody takes
    /// is up to `readahead` bytes fetched for nothing (GETs, on a store).
    pub fn set_last_epoch(&mut self, epoch: Option<u64>) {
        self.plan.set_last_epoch(epoch);
    }

    /// Jumps to the start of `epoch` (dropping anything read ahead).
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        self.check_process()?;
        self.reset_to(LoaderState { epoch, served: 0 })
    }

    /// Fails in a process other than the one that opened the loader.
    fn check_process(&self) -> Result<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(Error::config(format!(
                "this loader was opened by process {} and cannot be used after fork() (in process {now}): open a new loader in the child",
                self.pid
            )));
        }
        Ok(())
    }

    fn reset_to(&mut self, state: LoaderState) -> Result<()> {
        self.drain()?;
        // Memory is emptied below: the next plan must not assume it warm.
        self.plan.restart(state.epoch);
        self.epoch = state.epoch;
        self.served = state.served;
        self.lookahead.clear();
        self.held_read = None;
        self.ahead.clear();
        self.ahead_bytes = 0;
        self.deferred.clear();
        self.deferred_bytes = 0;
        self.held.clear();
        self.bad.clear();
        self.failed = None;
        Ok(())
    }

    /// Waits for every read in flight; their data is discarded.
    fn drain(&mut self) -> Result<()> {
        let drained = self.reads.drain();
        self.held.forget_reads();
        self.in_flight_decoded = 0;
        drained.inspect_err(|e| self.failed = Some(e.duplicate()))
    }

    /// The next batch of the current epoch, or `None` at its end; the call
    /// after `None` starts the next epoch. Errors (a corrupt record, a
    /// vanished segment, a read that timed out) name the file and position,
    /// and come when the sample they concern is due; the loader's `state()`
    /// stays that of the last sample handed out.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        self.check_process()?;
        if let Some(e) = &self.failed {
            return Err(e.duplicate());
        }
        self.fill_lookahead()?;
        let mut taken: Vec<Taken> = Vec::with_capacity(self.cfg.batch_size);
        let mut served = 0usize;
        while served < self.cfg.batch_size {
            match self.next_sample() {
                Ok(Some(t)) => {
                    served += matches!(t, Taken::Served(..)) as usize;
                    taken.push(t);
                }
                Ok(None) => break,
                Err(e) => {
                    // All or nothing: put the batch's samples back, so state()
                    // and a resume still count them as unserved.
                    for t in taken.into_iter().rev() {
                        self.untake(t);
                    }
                    return Err(e);
                }
            }
        }
        let (ids, data): (Vec<u64>, Vec<SampleBytes>) = taken
            .into_iter()
            .filter_map(|t| match t {
                Taken::Served(_, id, b) => Some((id, b)),
                Taken::Skipped(..) => None,
            })
            .unzip();
        if ids.is_empty() {
            // End of the epoch: the next call starts the next one.
            if matches!(self.lookahead.front(), Some(Step::EpochEnd)) {
                self.lookahead.pop_front();
            }
            self.epoch += 1;
            self.served = 0;
            return Ok(None);
        }
        Ok(Some(Batch::new(self.epoch, self.ds.clone(), ids, data)))
    }

    /// Whether read-ahead must wait: the bytes of reads in flight reach
    /// `readahead`, or the bytes held (held and in-flight samples, decoded,
    /// and the buffers registered with the ring) reach the memory bound plus
    /// `readahead`. (Ordinary read buffers are those of the reads in
    /// flight, reused: merged sparse reads fit the registered buffers, so
    /// only whole chunks and records over 512 KiB use them.) Reads that
    /// completed ahead of the consumer count only as memory: where the plan
    /// leaves memory unused (its start, its tail, sparse policies)
    /// read-ahead fills it, so the next epoch's first batch, which needs a
    /// memory's worth of reads, is read while this one ends. At least one
    /// read is always allowed, so the consumer can progress. Without a
    /// memory bound the bytes of reads issued ahead, completed or not, are
    /// what `readahead` bounds. Whatever the bytes, reads in flight stop at
    /// [`max_reads_ahead`](Self::max_reads_ahead).
    fn ahead_full(&self) -> bool {
        if self.ahead.is_empty() {
            return false;
        }
        if self.reads.in_flight() >= self.max_reads_ahead() {
            return true;
        }
        let readahead = self.cfg.readahead_bytes;
        match self.memory_bound {
            Some(memory) => {
                let held = self.held.bytes() + self.in_flight_decoded + self.reads.registered_bytes();
                self.reads.in_flight_read_bytes() >= readahead || held >= memory.saturating_add(readahead)
            }
            None => self.ahead_bytes >= readahead,
        }
    }

    /// Most reads in flight: two batches' worth (what the device reads
    /// while the consumer is away between batches), at least
    /// [`MIN_READS_AHEAD`]. Far more than the rings hold, and `readahead`'s
    /// 64 MiB is 16,384 reads of 4 KiB, whose per-read state (queued jobs,
    /// the held map, and the samples read early) the consumer then walks
    /// through cold caches: at 4 KiB on tmpfs 4.1 µs of CPU per sample
    /// against 3.1 with 512 reads (docs/bench/engine-results.md).
    fn max_reads_ahead(&self) -> usize {
        self.cfg.batch_size.saturating_mul(2).max(MIN_READS_AHEAD)
    }

    /// Fills the lookahead window: takes plan steps, across the end of an
    /// epoch into the next, and issues their reads while [`ahead_full`]
    /// allows.
    fn fill_lookahead(&mut self) -> Result<()> {
        self.accept_arrived()?;
        let no_readahead = self.cfg.readahead_bytes == 0;
        while self.lookahead.len() < MAX_LOOKAHEAD_EVENTS && !self.ahead_full() {
            if let Some(ev) = self.held_read {
                if !self.lookahead.is_empty() {
                    break;
                }
                self.held_read = None;
                self.issue_read(ev)?;
                self.lookahead.push_back(Step::Plan(ev));
                break;
            }
            let ev = match self.plan.next(self.epoch, self.served, !self.lookahead.is_empty())? {
                Next::Event(ev) => ev,
                Next::EpochEnd => {
                    self.lookahead.push_back(Step::EpochEnd);
                    continue;
                }
                Next::NotYet => break,
            };
            if let Event::Read { .. } = ev {
                if no_readahead && !self.lookahead.is_empty() {
                    self.held_read = Some(ev);
                    break;
                }
                self.issue_read(ev)?;
            }
            if let Event::Serve { sample, .. } = ev {
                self.issue_due(sample)?;
            }
            self.lookahead.push_back(Step::Plan(ev));
            if no_readahead && matches!(ev, Event::Read { .. }) {
                break;
            }
        }
        Ok(())
    }

    /// Takes in every completion that has arrived (while the consumer was
    /// away), so their memory and in-flight bytes are current.
    fn accept_arrived(&mut self) -> Result<()> {
        while let Some((read, c)) = self.reads.try_recv()? {
            self.accept(read, c);
        }
        Ok(())
    }

    /// Submits a plan read's extents and counts its bytes as read ahead,
    /// or, in the epoch the loader started at, defers a large one to when
    /// its records come due ([`issue_due`](Self::issue_due)).
    fn issue_read(&mut self, ev: Event) -> Result<()> {
        let Event::Read { chunk, mask } = ev else {
            return Ok(());
        };
        self.metrics.refills += 1;
        let seq = self.reached + self.ahead.len() as u64;
        let (mut ext, bytes) = self.extents_of(chunk, mask);
        let first = chunk * self.ds.index.chunk_size() as u64;
        if mask.count_ones() > 1 && self.plan.starting() && self.defers(bytes) && self.deferred.defer(first, mask, seq)
        {
            ext.clear();
            self.extents = ext;
            self.metrics.reads_deferred += 1;
            self.deferred_bytes += bytes;
            self.ahead.push_back(0);
            return Ok(());
        }
        self.submit_extents(ext)?;
        self.ahead.push_back(bytes);
        self.ahead_bytes += bytes;
        Ok(())
    }

    /// The extents of `mask`'s records of `chunk`, in the vector kept for
    /// every read, and their bytes.
    fn extents_of(&mut self, chunk: u64, mask: u64) -> (Vec<Extent>, u64) {
        let mut ext = std::mem::take(&mut self.extents);
        self.reads.extents_into(chunk, mask, &mut ext);
        let bytes = ext.iter().map(|e| e.len).sum();
        (ext, bytes)
    }

    /// Submits every extent of `ext`, and keeps the vector for the next read.
    fn submit_extents(&mut self, mut ext: Vec<Extent>) -> Result<()> {
        let submitted = ext.drain(..).try_for_each(|e| self.submit(e));
        self.extents = ext;
        submitted
    }

    /// Whether a plan read of `bytes` is deferred: while the reads deferred
    /// since the start are within [`split_budget`], when [`worth_splitting`].
    fn defers(&self, bytes: u64) -> bool {
        let budget = split_budget(
            self.cfg.readahead_bytes,
            &self.cfg.plan,
            self.memory_bound.unwrap_or(u64::MAX),
        );
        self.deferred_bytes < budget && worth_splitting(self.reads.gap(), bytes)
    }

    /// `sample` is due (its serve entered the look-ahead): submits its
    /// record if its read was deferred, counting the bytes with that read.
    fn issue_due(&mut self, sample: u64) -> Result<()> {
        if self.deferred.len() == 0 {
            return Ok(());
        }
        let Some(seq) = self.deferred.due(sample) else {
            return Ok(());
        };
        let chunk = self.ds.index.chunk_of(sample);
        let record = sample - chunk * self.ds.index.chunk_size() as u64;
        let (mut ext, bytes) = self.extents_of(chunk, 1 << record);
        let submitted = ext.drain(..).try_for_each(|e| self.submit_as(e, true));
        self.extents = ext;
        submitted?;
        match seq
            .checked_sub(self.reached)
            .and_then(|i| self.ahead.get_mut(i as usize))
        {
            Some(b) => {
                *b += bytes;
                self.ahead_bytes += bytes;
            }
            // The consumer passed the read: its bytes count now.
            None => self.metrics.bytes_read += bytes,
        }
        Ok(())
    }

    fn submit(&mut self, e: Extent) -> Result<()> {
        self.submit_as(e, false)
    }

    /// [`submit`](Self::submit), saying whether `e` reads a start's first
    /// fill record by record (`brand_io::engine::Job::first_fill`).
    fn submit_as(&mut self, e: Extent, first_fill: bool) -> Result<()> {
        let mut decoded = 0;
        for &(id, _) in &e.records {
            decoded += self.ds.index.raw_len(id) as u64;
            self.held.reading(id);
        }
        self.metrics.reads_issued += 1;
        self.reads.submit_as(e, ReadFor { decoded }, first_fill)?;
        self.in_flight_decoded += decoded;
        let in_flight = self.reads.in_flight_read_bytes();
        self.metrics.peak_readahead_bytes = self.metrics.peak_readahead_bytes.max(in_flight);
        Ok(())
    }

    /// Takes a completed read in: each record is held, or bad (its error
    /// waits for the sample to be due).
    fn accept(&mut self, read: ReadFor, c: Completion) {
        self.in_flight_decoded -= read.decoded;
        let asked = &c.extent.records;
        match c.result {
            Ok(records) => {
                if records.len() != asked.len() {
                    // Never: the engine returns every record of the read.
                    // Should it not, no sample stays waiting for it.
                    tracing::error!("a read brought {} of its {} records", records.len(), asked.len());
                    for &(id, _) in asked {
                        if !records.iter().any(|&(r, _)| r == id) {
                            self.held.arrived(id, None);
                        }
                    }
                }
                for (id, r) in records {
                    match r {
                        Ok(bytes) => self.held.arrived(id, Some(Arc::new(bytes))),
                        Err(e) => {
                            self.held.arrived(id, None);
                            self.bad.insert(id, e);
                        }
                    }
                }
                self.metrics.peak_resident_bytes = self.metrics.peak_resident_bytes.max(self.held.bytes());
                self.metrics.peak_resident_samples = self.metrics.peak_resident_samples.max(self.held.len());
            }
            Err(e) => {
                for &(id, _) in asked {
                    self.held.arrived(id, None);
                    self.bad.insert(id, e.duplicate());
                }
            }
        }
    }

    fn untake(&mut self, t: Taken) {
        self.served -= 1;
        match t {
            Taken::Served(ev, id, bytes) => {
                self.metrics.samples_served -= 1;
                self.metrics.bytes_served -= self.ds.index.stored_len(id) as u64;
                if let Event::Serve { frees: true, .. } = ev {
                    self.held.hold(id, bytes);
                }
                self.lookahead.push_front(Step::Plan(ev));
            }
            Taken::Skipped(ev, id, e) => {
                self.metrics.skipped_corrupt -= 1;
                self.bad.insert(id, e);
                self.lookahead.push_front(Step::Plan(ev));
            }
        }
    }

    fn next_sample(&mut self) -> Result<Option<Taken>> {
        loop {
            if self.lookahead.is_empty() {
                self.fill_lookahead()?;
            }
            let Some(step) = self.lookahead.front().copied() else {
                return Ok(None);
            };
            let ev = match step {
                // Left in place: next_batch consumes it once the batch is handed out.
                Step::EpochEnd => return Ok(None),
                Step::Plan(ev) => ev,
            };
            self.lookahead.pop_front();
            match ev {
                Event::Read { .. } => {
                    // Its bytes count when the consumer reaches the read, so
                    // reads for the next epoch count in that epoch.
                    if let Some(bytes) = self.ahead.pop_front() {
                        self.reached += 1;
                        self.ahead_bytes -= bytes;
                        self.metrics.bytes_read += bytes;
                    }
                    // Room in the window: read further ahead.
                    self.fill_lookahead()?;
                }
                Event::Serve { sample, frees, .. } => return self.serve(ev, sample, frees).map(Some),
            }
        }
    }

    /// Serves `sample` (the plan's event `ev`), or skips it when it is
    /// corrupt and `on_corrupt = "skip"`.
    fn serve(&mut self, ev: Event, sample: u64, frees: bool) -> Result<Taken> {
        let bytes = match self.wait_for(sample, frees) {
            Ok(b) => b,
            Err(e) => {
                if self.cfg.on_corrupt == OnCorrupt::Skip
                    && matches!(e, Error::Corrupt { .. })
                    && self.bad.contains_key(&sample)
                {
                    let kept = if frees { self.bad.remove(&sample) } else { None };
                    tracing::warn!(
                        "skipping sample {sample} (chunk {}): {e}",
                        self.ds.index.chunk_of(sample)
                    );
                    self.served += 1;
                    self.metrics.skipped_corrupt += 1;
                    return Ok(Taken::Skipped(ev, sample, kept.unwrap_or(e)));
                }
                // The serve stays unserved: state() points at it.
                self.lookahead.push_front(Step::Plan(ev));
                self.failed = Some(e.duplicate());
                return Err(e);
            }
        };
        self.served += 1;
        self.metrics.samples_served += 1;
        self.metrics.bytes_served += self.ds.index.stored_len(sample) as u64;
        if !self.consumer_started {
            self.consumer_started = true;
            self.reads.consumer_started();
        }
        Ok(Taken::Served(ev, sample, bytes))
    }

    /// The bytes of `sample`, waiting for its read (or issuing one if the
    /// plan expected it in memory but this process never read it). With
    /// `frees` the sample leaves memory; otherwise it stays held. A sample
    /// whose read or record failed returns that error now.
    fn wait_for(&mut self, sample: u64, frees: bool) -> Result<SampleBytes> {
        let mut stalled: Option<Instant> = None;
        let mut recovering = false;
        loop {
            if let Some(e) = self.bad.get(&sample) {
                return Err(e.duplicate());
            }
            let found = if frees {
                self.held.release(sample)
            } else {
                self.held.get(sample)
            };
            if let Some(bytes) = found {
                if let Some(t) = stalled {
                    let waited = t.elapsed();
                    self.stalls.record(waited);
                    if self.consumer_started {
                        self.reads.consumer_waited(waited);
                    }
                }
                return Ok(bytes);
            }
            if !recovering && !self.held.is_reading(sample) {
                // Deferred (never, as its serve was taken into the look-ahead):
                // its read, not a recovery read.
                self.issue_due(sample)?;
                if !self.held.is_reading(sample) {
                    // Neither held, bad nor on its way: read it now.
                    let chunk = self.ds.index.chunk_of(sample);
                    let record = sample - chunk * self.ds.index.chunk_size() as u64;
                    for e in extents(&self.ds.index, chunk, 1 << record, ReadGap::Bytes(0)) {
                        self.metrics.bytes_read += e.len;
                        self.submit(e)?;
                    }
                    self.metrics.recovery_reads += 1;
                    recovering = true;
                }
            }
            if stalled.is_none() {
                stalled = Some(Instant::now());
            }
            let _span = tracing::trace_span!("stall", sample).entered();
            let (read, c) = self.reads.recv()?;
            self.accept(read, c);
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child: the engine's threads are not here, and its
            // locks may be held by threads that were: leave it (and the
            // planning thread's handle) alone.
            self.plan.forget_in_child();
            return;
        }
        self.plan.stop();
        // SAFETY: dropped once, here, and never used again; the session
        // waits for its reads in flight (no longer than io_timeout, not at
        // all once one hung) before the engine goes.
        unsafe { ManuallyDrop::drop(&mut self.reads) };
    }
}
