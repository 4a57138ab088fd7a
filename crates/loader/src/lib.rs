//! The Loader: runs the plan, keeps the engine busy with the plan's future
//! reads (clairvoyant prefetch, bounded by `readahead_bytes`), and hands out
//! batches in the plan's served order (DESIGN.md §4–5).
//!
//! The served sequence is the plan's and nothing else: I/O timing, the read
//! gap, the queue depth and the backend change only how fast it arrives.
//!
//! Memory is held in bytes: the budget becomes abstract slots through the
//! mean *decoded* sample size, and the loader holds back read-ahead while
//! the decoded bytes it holds (resident samples plus reads in flight)
//! reach the plan's resident bound (its slots in decoded bytes) plus
//! `readahead`. The next epoch is planned in the background and read ahead
//! across the boundary within the same bounds.
//!
//! Fork: a loader belongs to the process that opened it (its engine's
//! threads do not survive `fork()`). Used in a forked child it fails at
//! once with an error; open a new loader in the child instead.

pub mod config;
pub mod elastic;
pub mod stats;

use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::{Extent, ReadGap, extents};
use brand_io::engine::{Completion, Engine, EngineConfig, Job};
pub use brand_io::{IoBackend, ReadGapSetting};
use brand_plan::{Event, Geometry, Layout, PlanConfig, Planner};
pub use stats::Metrics;
use stats::StallLog;

/// A sample's bytes: 64-byte aligned, shared (a sample that stays resident
/// across epochs is handed out without copying).
pub type SampleBytes = Arc<AlignedBuf>;

/// A rank's plan events for one epoch.
pub type Events = Box<dyn Iterator<Item = Event> + Send>;

/// Produces this rank's plan events for `epoch`, starting after its first
/// `served` serves (a resume when `served > 0`). `warm` says memory holds
/// what the previous epoch left (this process ran it to its end); when
/// false, memory is empty.
pub type EventSource = Box<dyn FnMut(u64, u64, bool) -> Result<Events> + Send>;

/// The event source of a real plan.
pub fn plan_events(mut planner: Planner) -> EventSource {
    Box::new(move |epoch, served, warm| {
        if served >= planner.geometry().steps {
            // Saved after the epoch's last serve: nothing is left of it.
            return Ok(Box::new(std::iter::empty()));
        }
        let plan = if served == 0 && warm {
            planner.epoch(epoch)
        } else {
            let position = planner.position_of_step(served);
            planner.seek(epoch, position)?
        };
        Ok(Box::new(plan))
    })
}

/// The plan's resident bound in decoded bytes: its rank slots (what the
/// budget became, after the plan's own rounding, e.g. of a percentage up to
/// one chunk) times the mean decoded sample size, rounded up; never more
/// than the whole dataset.
pub fn memory_bound_bytes(layout: &Layout, geometry: &Geometry) -> u64 {
    let slots = geometry.rank_slots.min(layout.samples) as u128;
    (slots * layout.sample_bytes as u128)
        .div_ceil(layout.samples.max(1) as u128)
        .min(layout.sample_bytes as u128) as u64
}

/// What to do with a sample whose record is corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnCorrupt {
    /// Fail the batch it is due in (after every good sample before it).
    Error,
    /// Leave it out of the epoch, count it (`skipped_corrupt`) and log it.
    Skip,
}

impl std::str::FromStr for OnCorrupt {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "error" => Ok(OnCorrupt::Error),
            "skip" => Ok(OnCorrupt::Skip),
            _ => Err(Error::config(format!("on_corrupt {s:?}: expected error or skip"))),
        }
    }
}

/// Everything a loader is configured with: the plan and the I/O.
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub plan: PlanConfig,
    pub io: IoConfig,
}

/// Where a loader is: enough to resume it exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    /// Samples of `epoch` already handed out by this rank.
    pub served: u64,
}

#[derive(Debug, Clone)]
pub struct IoConfig {
    pub batch_size: usize,
    /// Bytes of planned reads issued ahead of consumption; 0 reads only when
    /// a read is needed.
    pub readahead_bytes: u64,
    pub queue_depth: usize,
    pub read_gap: ReadGapSetting,
    pub verify: bool,
    /// O_DIRECT reads (the default: the plan is the cache). `false` reads
    /// through the page cache, for datasets that stay in RAM between runs.
    pub direct: bool,
    pub io_backend: IoBackend,
    /// Threads decompressing zstd records read by io_uring (0: on the io
    /// thread). Default: the cores the io threads leave, at most 8
    /// ([`brand_io::engine::default_decode_threads`]).
    pub decode_threads: usize,
    /// A read that does not complete within this is an error naming its
    /// file and offset; Drop waits no longer than this for reads in flight.
    pub io_timeout: Duration,
    pub on_corrupt: OnCorrupt,
}

impl IoConfig {
    /// The engine's part of these settings.
    fn engine_settings(&self) -> brand_io::IoConfig {
        brand_io::IoConfig {
            queue_depth: self.queue_depth,
            read_gap: self.read_gap,
            verify: self.verify,
            direct: self.direct,
            backend: self.io_backend,
            decode_threads: self.decode_threads,
            io_timeout: self.io_timeout,
        }
    }

    /// The engine these settings ask for over `ds` (the loader's, and any
    /// other reader that must read as the loader does): registered memory
    /// is read-ahead memory.
    pub fn engine_config(&self, ds: &Dataset) -> EngineConfig {
        self.engine_settings().engine_config(ds, self.readahead_bytes)
    }

    /// The read gap these settings ask for; `auto` probes the device through
    /// an engine like `engine` (same backend).
    pub fn read_gap(&self, ds: &Arc<Dataset>, engine: &Engine) -> Result<ReadGap> {
        let probe = EngineConfig {
            backend: engine.backend(),
            ..self.engine_config(ds)
        };
        brand_io::probe::read_gap(self.read_gap, ds, &probe)
    }
}

impl Default for IoConfig {
    fn default() -> Self {
        let io = brand_io::IoConfig::default();
        IoConfig {
            batch_size: 256,
            readahead_bytes: 64 << 20,
            queue_depth: io.queue_depth,
            read_gap: io.read_gap,
            verify: io.verify,
            direct: io.direct,
            io_backend: io.backend,
            decode_threads: io.decode_threads,
            io_timeout: io.io_timeout,
            on_corrupt: OnCorrupt::Error,
        }
    }
}

/// One sample of a batch: borrowed from the batch, no copies.
#[derive(Debug, Clone, Copy)]
pub struct SampleRef<'a> {
    pub id: u64,
    pub label: i64,
    pub data: &'a [u8],
    pub key: &'a [u8],
}

/// Samples handed out together. Owns their bytes.
#[derive(Debug)]
pub struct Batch {
    pub epoch: u64,
    ds: Arc<Dataset>,
    ids: Vec<u64>,
    data: Vec<SampleBytes>,
}

impl Batch {
    /// A batch of `ids` of `ds` with their bytes (`data[i]` is sample
    /// `ids[i]`), for readers other than [`Loader`] (the multi-node mode).
    pub fn new(epoch: u64, ds: Arc<Dataset>, ids: Vec<u64>, data: Vec<SampleBytes>) -> Self {
        debug_assert_eq!(ids.len(), data.len());
        Batch { epoch, ds, ids, data }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    pub fn get(&self, i: usize) -> Option<SampleRef<'_>> {
        let id = *self.ids.get(i)?;
        Some(SampleRef {
            id,
            label: self.ds.index.label[id as usize],
            data: &self.data[i],
            key: self.ds.index.key(id),
        })
    }
    pub fn iter(&self) -> impl Iterator<Item = SampleRef<'_>> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
    /// The sample ids and their bytes (for interfaces that hand them on).
    pub fn into_parts(self) -> (Vec<u64>, Vec<SampleBytes>) {
        (self.ids, self.data)
    }
}

pub struct Loader {
    ds: Arc<Dataset>,
    cfg: IoConfig,
    gap: ReadGap,
    engine: ManuallyDrop<Engine>,
    /// The plan's event source; `None` while lent to the planning thread.
    source: Option<EventSource>,
    /// The next epoch's events, being planned in the background.
    planning: Option<(u64, Planning)>,
    /// Where plan events are taken from next (see [`Feed`]).
    feed: Feed,
    /// The epoch `feed` produces events of (ahead of `epoch` once the
    /// current epoch's events are all in `lookahead`).
    feed_epoch: u64,
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
    next_tag: u64,
    /// Samples read and not yet served (or kept: resident mode), decoded,
    /// with the number of reads that brought them (across an epoch
    /// boundary a sample can be read for the next epoch before this one
    /// serves it): each serve that frees takes one.
    resident: HashMap<u64, (SampleBytes, u32)>,
    resident_bytes: u64,
    /// Samples whose record could not be read or decoded: the error is
    /// reported when the sample is due, not when its read completes.
    bad: HashMap<u64, Error>,
    /// Samples whose read is in flight, with the number of such reads.
    pending: HashMap<u64, u32>,
    /// Each in-flight job, by tag. Completions with a tag not here are
    /// stale (from before a reset) and are dropped.
    in_flight: HashMap<u64, InFlight>,
    /// Decoded bytes of the records in flight.
    in_flight_bytes: u64,
    /// Bytes the reads in flight transfer: `readahead` bounds them.
    in_flight_read_bytes: u64,
    /// The plan's resident bound in decoded bytes ([`memory_bound_bytes`]):
    /// read-ahead is held back while the decoded bytes held (resident + in
    /// flight) reach it plus `readahead` (None: no byte budget known).
    memory_bound: Option<u64>,
    /// An error, reported again on every call until the loader is reset:
    /// the sample it stopped on cannot be served.
    failed: Option<Error>,
    /// A read timed out: Drop does not wait for the engine again.
    hung: bool,
    /// The process that opened the loader (see the module docs on fork).
    pid: u32,
    stalls: StallLog,
    metrics: Metrics,
}

/// A background plan: gives the source back with the events it made.
type Planning = std::thread::JoinHandle<(EventSource, Result<Events>)>;

/// One step of the plan as the loader walks it.
#[derive(Debug, Clone, Copy)]
enum Step {
    Plan(Event),
    /// The end of an epoch: the consumer gets `None` here.
    EpochEnd,
}

/// Where plan events come from next.
enum Feed {
    /// Not asked for yet: the next events are `(feed_epoch, served)`.
    Start {
        warm: bool,
    },
    Running(Events),
    /// The epoch's events are all taken; the next come from `planning`.
    Between,
}

struct InFlight {
    ids: Vec<u64>,
    segment: u32,
    offset: u64,
    len: u64,
    decoded: u64,
}

/// What a batch took from the plan, so an error can put it all back.
enum Taken {
    Served(Event, u64, SampleBytes),
    Skipped(Event, u64, Error),
}

/// Most plan events held ahead of the consumer (bounds memory when a long
/// run of serves needs no reads).
const MAX_LOOKAHEAD_EVENTS: usize = 1 << 16;

impl Loader {
    /// A loader over `ds` running the plan of `cfg`, starting at `state`
    /// (`LoaderState::default()` for the first epoch).
    pub fn open(ds: Arc<Dataset>, cfg: &LoaderConfig, state: LoaderState) -> Result<Self> {
        let planner = Planner::new(&ds.index, &cfg.plan)?;
        let memory = memory_bound_bytes(&Layout::of(&ds.index), planner.geometry());
        let mut l = Self::new(ds, cfg.io.clone(), plan_events(planner), state)?;
        l.memory_bound = Some(memory);
        Ok(l)
    }

    /// A loader over `ds` whose events come from `source`, starting at `state`.
    pub fn new(ds: Arc<Dataset>, cfg: IoConfig, source: EventSource, state: LoaderState) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::config("batch size must be at least 1"));
        }
        let engine = Engine::start(ds.clone(), cfg.engine_config(&ds))?;
        let gap = cfg.read_gap(&ds, &engine)?;
        let metrics = Metrics {
            read_gap: match gap {
                ReadGap::Whole => None,
                ReadGap::Bytes(b) => Some(b),
            },
            ..Default::default()
        };
        Ok(Loader {
            ds,
            cfg,
            gap,
            engine: ManuallyDrop::new(engine),
            source: Some(source),
            planning: None,
            feed: Feed::Start { warm: true },
            feed_epoch: state.epoch,
            epoch: state.epoch,
            served: state.served,
            lookahead: VecDeque::new(),
            held_read: None,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            next_tag: 0,
            resident: HashMap::new(),
            resident_bytes: 0,
            bad: HashMap::new(),
            pending: HashMap::new(),
            in_flight: HashMap::new(),
            in_flight_bytes: 0,
            in_flight_read_bytes: 0,
            memory_bound: None,
            failed: None,
            hung: false,
            pid: std::process::id(),
            stalls: StallLog::default(),
            metrics,
        })
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    pub fn state(&self) -> LoaderState {
        LoaderState {
            epoch: self.epoch,
            served: self.served,
        }
    }

    pub fn metrics(&self) -> Metrics {
        let mut m = self.metrics.clone();
        self.stalls.fill(&mut m);
        m.buffered_fallback = self.engine.buffered_fallback();
        m.threads_backend = self.engine.backend() == IoBackend::Threads;
        m.uring_refused = self.engine.uring_refused();
        m.registered_buffer_bytes = self.engine.registered_bytes();
        m.peak_read_buffer_bytes = self.engine.peak_pool_bytes();
        m
    }

    /// Starts the counters afresh (e.g. per epoch); peaks restart from what
    /// is resident now.
    pub fn reset_metrics(&mut self) {
        self.metrics = Metrics {
            read_gap: self.metrics.read_gap,
            peak_resident_bytes: self.resident_bytes,
            peak_resident_samples: self.resident.len() as u64,
            peak_readahead_bytes: self.in_flight_read_bytes,
            ..Default::default()
        };
        self.stalls = StallLog::default();
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
        self.drain_in_flight()?;
        // Memory is emptied below: the next plan must not assume it warm.
        self.take_planning();
        self.feed = Feed::Start { warm: false };
        self.feed_epoch = state.epoch;
        self.epoch = state.epoch;
        self.served = state.served;
        self.lookahead.clear();
        self.held_read = None;
        self.ahead.clear();
        self.ahead_bytes = 0;
        self.resident.clear();
        self.resident_bytes = 0;
        self.bad.clear();
        self.failed = None;
        Ok(())
    }

    /// Waits (at most `io_timeout` per completion) for every in-flight
    /// read; their data is discarded.
    fn drain_in_flight(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            match self.engine.recv_timeout(self.cfg.io_timeout) {
                Ok(Some(c)) => {
                    self.forget(c.tag);
                }
                Ok(None) => {
                    let e = self.timeout_error();
                    self.hung = true;
                    self.failed = Some(e.duplicate());
                    return Err(e);
                }
                Err(_) => {
                    self.in_flight.clear();
                    self.in_flight_bytes = 0;
                    self.in_flight_read_bytes = 0;
                }
            }
        }
        self.pending.clear();
        Ok(())
    }

    fn forget(&mut self, tag: u64) -> Option<InFlight> {
        let f = self.in_flight.remove(&tag)?;
        self.in_flight_bytes -= f.decoded;
        self.in_flight_read_bytes -= f.len;
        for id in &f.ids {
            if let Some(n) = self.pending.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    self.pending.remove(id);
                }
            }
        }
        Some(f)
    }

    /// The error for reads that stopped completing: names the oldest one.
    fn timeout_error(&self) -> Error {
        let secs = self.cfg.io_timeout.as_secs_f64();
        match self.in_flight.iter().min_by_key(|(tag, _)| **tag) {
            Some((_, f)) => Error::io(
                self.ds.segment_path(f.segment),
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no read completed within io_timeout ({secs}s): the read of {} bytes at byte {} is still pending (hung storage?)",
                        f.len, f.offset
                    ),
                ),
            ),
            None => Error::config(format!("no read completed within io_timeout ({secs}s)")),
        }
    }

    /// Gets the source back from the planning thread (its plan is dropped).
    fn take_planning(&mut self) {
        if let Some((_, handle)) = self.planning.take()
            && let Ok((source, _)) = handle.join()
        {
            self.source = Some(source);
        }
    }

    /// Starts planning `epoch` (from its start, memory warm) in the background.
    fn plan_ahead(&mut self, epoch: u64) {
        let Some(mut source) = self.source.take() else {
            return;
        };
        let spawned = std::thread::Builder::new().name("brand-plan".into()).spawn(move || {
            let events = source(epoch, 0, true);
            (source, events)
        });
        match spawned {
            Ok(h) => self.planning = Some((epoch, h)),
            // No thread: the source was moved into the closure that failed
            // to spawn and is lost; the next epoch reports it.
            Err(e) => tracing::warn!("cannot start the planning thread: {e}"),
        }
    }

    /// The events of `feed_epoch`: the background plan if it is that one,
    /// else planned now.
    fn events_for_feed(&mut self, warm: bool) -> Result<Events> {
        let epoch = self.feed_epoch;
        if let Some((planned, _)) = &self.planning
            && *planned == epoch
            && warm
        {
            let Some((_, handle)) = self.planning.take() else {
                unreachable!("checked above")
            };
            let (source, events) = handle
                .join()
                .map_err(|_| Error::config("the planning thread panicked"))?;
            self.source = Some(source);
            return events;
        }
        self.take_planning();
        let served = if epoch == self.epoch { self.served } else { 0 };
        let source = self
            .source
            .as_mut()
            .ok_or_else(|| Error::config("the plan is unavailable (its thread could not start)"))?;
        source(epoch, served, warm)
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
        Ok(Some(Batch {
            epoch: self.epoch,
            ds: self.ds.clone(),
            ids,
            data,
        }))
    }

    /// The decoded bytes resident samples may hold, as the plan bounds
    /// them (None for a loader made from an event source alone).
    pub fn memory_bound(&self) -> Option<u64> {
        self.memory_bound
    }

    /// Whether read-ahead must wait: the bytes of reads in flight reach
    /// `readahead`, or the bytes held (resident and in-flight samples,
    /// decoded, and the buffers registered with the ring) reach the memory
    /// bound plus `readahead`. (Ordinary read buffers are those of the
    /// reads in flight, reused: merged sparse reads fit the registered
    /// buffers, so only whole chunks and records over 512 KiB use them.) Reads that completed ahead
    /// of the consumer count only as memory: where the plan leaves memory
    /// unused (its start, its tail, sparse policies) read-ahead fills it,
    /// so the next epoch's first batch, which needs a memory's worth of
    /// reads, is read while this one ends. At least one read is always
    /// allowed, so the consumer can progress. Without a memory bound (a
    /// loader made from an event source alone) the bytes of reads issued
    /// ahead, completed or not, are what `readahead` bounds.
    fn ahead_full(&self) -> bool {
        if self.ahead.is_empty() {
            return false;
        }
        let readahead = self.cfg.readahead_bytes;
        match self.memory_bound {
            Some(memory) => {
                let held = self.resident_bytes + self.in_flight_bytes + self.engine.registered_bytes();
                self.in_flight_read_bytes >= readahead || held >= memory.saturating_add(readahead)
            }
            None => self.ahead_bytes >= readahead,
        }
    }

    /// Fills the lookahead window: takes plan steps, across the end of an
    /// epoch into the next, and issues their reads while [`ahead_full`]
    /// allows.
    fn fill_lookahead(&mut self) -> Result<()> {
        self.accept_arrived()?;
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
            let ev = match &mut self.feed {
                Feed::Running(events) => match events.next() {
                    Some(ev) => ev,
                    None => {
                        self.lookahead.push_back(Step::EpochEnd);
                        self.feed = Feed::Between;
                        self.feed_epoch += 1;
                        continue;
                    }
                },
                Feed::Start { warm } => {
                    let warm = *warm;
                    let events = self.events_for_feed(warm)?;
                    self.feed = Feed::Running(events);
                    self.plan_ahead(self.feed_epoch + 1);
                    continue;
                }
                Feed::Between => {
                    // Take the next epoch's plan once it is ready, or when the
                    // consumer has nothing else to do.
                    let ready = self.planning.as_ref().is_none_or(|(_, h)| h.is_finished());
                    if !ready && !self.lookahead.is_empty() {
                        break;
                    }
                    let events = self.events_for_feed(true)?;
                    self.feed = Feed::Running(events);
                    self.plan_ahead(self.feed_epoch + 1);
                    continue;
                }
            };
            if let Event::Read { .. } = ev {
                if self.cfg.readahead_bytes == 0 && !self.lookahead.is_empty() {
                    self.held_read = Some(ev);
                    break;
                }
                self.issue_read(ev)?;
            }
            self.lookahead.push_back(Step::Plan(ev));
            if self.cfg.readahead_bytes == 0 && matches!(ev, Event::Read { .. }) {
                break;
            }
        }
        Ok(())
    }

    /// Takes in every completion that has arrived (while the consumer was
    /// away), so their memory and in-flight bytes are current.
    fn accept_arrived(&mut self) -> Result<()> {
        while let Some(c) = self.engine.try_recv()? {
            self.accept(c);
        }
        Ok(())
    }

    /// Submits a plan read's extents and counts its bytes as read ahead.
    fn issue_read(&mut self, ev: Event) -> Result<()> {
        let Event::Read { chunk, mask } = ev else {
            return Ok(());
        };
        let ext = extents(&self.ds.index, chunk, mask, self.gap);
        let bytes: u64 = ext.iter().map(|e| e.len).sum();
        for e in ext {
            self.submit(e)?;
        }
        self.ahead.push_back(bytes);
        self.ahead_bytes += bytes;
        self.metrics.refills += 1;
        Ok(())
    }

    fn submit(&mut self, e: Extent) -> Result<()> {
        let ids: Vec<u64> = e.records.iter().map(|r| r.0).collect();
        let decoded: u64 = ids.iter().map(|&id| self.ds.index.raw_len[id as usize] as u64).sum();
        for &id in &ids {
            *self.pending.entry(id).or_default() += 1;
        }
        self.metrics.reads_issued += 1;
        self.next_tag += 1;
        self.in_flight_bytes += decoded;
        self.in_flight_read_bytes += e.len;
        self.metrics.peak_readahead_bytes = self.metrics.peak_readahead_bytes.max(self.in_flight_read_bytes);
        self.in_flight.insert(
            self.next_tag,
            InFlight {
                ids,
                segment: e.segment,
                offset: e.offset,
                len: e.len,
                decoded,
            },
        );
        self.engine.submit(Job {
            tag: self.next_tag,
            extent: e,
        })
    }

    /// Takes a completion in: each record becomes resident, or bad (its
    /// error waits for the sample to be due).
    fn accept(&mut self, c: Completion) {
        let Some(job) = self.forget(c.tag) else {
            return;
        };
        match c.result {
            Ok(records) => {
                for (id, r) in records {
                    match r {
                        Ok(bytes) => self.hold(id, Arc::new(bytes)),
                        Err(e) => {
                            self.bad.insert(id, e);
                        }
                    }
                }
                self.metrics.peak_resident_bytes = self.metrics.peak_resident_bytes.max(self.resident_bytes);
                self.metrics.peak_resident_samples = self.metrics.peak_resident_samples.max(self.resident.len() as u64);
            }
            Err(e) => {
                for id in job.ids {
                    self.bad.insert(id, e.duplicate());
                }
            }
        }
    }

    /// Makes `id` resident (once more, if it already is: its bytes are
    /// held once).
    fn hold(&mut self, id: u64, bytes: SampleBytes) {
        let len = bytes.len() as u64;
        let entry = self.resident.entry(id).or_insert_with(|| (bytes, 0));
        if entry.1 == 0 {
            self.resident_bytes += len;
        }
        entry.1 += 1;
    }

    /// Takes one hold of `id`; its bytes leave memory with the last.
    fn release(&mut self, id: u64) -> Option<SampleBytes> {
        let entry = self.resident.get_mut(&id)?;
        entry.1 -= 1;
        let bytes = entry.0.clone();
        if entry.1 == 0 {
            self.resident.remove(&id);
            self.resident_bytes -= bytes.len() as u64;
        }
        Some(bytes)
    }

    fn untake(&mut self, t: Taken) {
        self.served -= 1;
        match t {
            Taken::Served(ev, id, bytes) => {
                self.metrics.samples_served -= 1;
                self.metrics.bytes_served -= self.ds.index.stored_len[id as usize] as u64;
                if let Event::Serve { frees: true, .. } = ev {
                    self.hold(id, bytes);
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
                        self.ahead_bytes -= bytes;
                        self.metrics.bytes_read += bytes;
                    }
                    // Room in the window: read further ahead.
                    self.fill_lookahead()?;
                }
                Event::Serve { sample, frees, .. } => {
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
                                return Ok(Some(Taken::Skipped(ev, sample, kept.unwrap_or(e))));
                            }
                            // The serve stays unserved: state() points at it.
                            self.lookahead.push_front(Step::Plan(ev));
                            self.failed = Some(e.duplicate());
                            return Err(e);
                        }
                    };
                    self.served += 1;
                    self.metrics.samples_served += 1;
                    self.metrics.bytes_served += self.ds.index.stored_len[sample as usize] as u64;
                    return Ok(Some(Taken::Served(ev, sample, bytes)));
                }
            }
        }
    }

    /// The bytes of `sample`, waiting for its read (or issuing one if the
    /// plan expected it resident but this process never read it). With
    /// `frees` the sample leaves memory; otherwise it stays resident. A
    /// sample whose read or record failed returns that error now.
    fn wait_for(&mut self, sample: u64, frees: bool) -> Result<SampleBytes> {
        if !self.resident.contains_key(&sample)
            && !self.pending.contains_key(&sample)
            && !self.bad.contains_key(&sample)
        {
            let chunk = self.ds.index.chunk_of(sample);
            let slot = sample - chunk * self.ds.index.chunk_size() as u64;
            for e in extents(&self.ds.index, chunk, 1 << slot, ReadGap::Bytes(0)) {
                self.metrics.bytes_read += e.len;
                self.submit(e)?;
            }
            self.metrics.recovery_reads += 1;
        }
        let mut stalled: Option<Instant> = None;
        loop {
            if let Some(e) = self.bad.get(&sample) {
                return Err(e.duplicate());
            }
            let found = if frees {
                self.release(sample)
            } else {
                self.resident.get(&sample).map(|r| r.0.clone())
            };
            if let Some(bytes) = found {
                if let Some(t) = stalled {
                    self.stalls.record(t.elapsed());
                }
                return Ok(bytes);
            }
            if stalled.is_none() {
                stalled = Some(Instant::now());
            }
            let _span = tracing::trace_span!("stall", sample).entered();
            match self.engine.recv_timeout(self.cfg.io_timeout)? {
                Some(c) => self.accept(c),
                None => {
                    self.hung = true;
                    return Err(self.timeout_error());
                }
            }
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child: the engine's threads are not here, and its
            // locks may be held by threads that were: leave it (and the
            // planning thread's handle) alone.
            if let Some(p) = self.planning.take() {
                std::mem::forget(p);
            }
            return;
        }
        if !self.hung {
            let _ = self.drain_in_flight();
        }
        if self.hung {
            self.engine.abandon();
        }
        self.take_planning();
        // SAFETY: dropped once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.engine) };
    }
}
