//! The Loader: runs the plan, keeps the engine busy with the plan's future
//! reads (clairvoyant prefetch, bounded by `readahead_bytes`), and hands out
//! batches in the plan's served order (DESIGN.md §4–5).
//!
//! The served sequence is the plan's and nothing else: I/O timing, the read
//! gap and the queue depth change only how fast it arrives.

pub mod config;
pub mod stats;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::{Extent, ReadGap, extents};
use brand_io::engine::{Completion, Engine, EngineConfig, Job};
use brand_plan::{Event, PlanConfig, Planner};
pub use stats::Metrics;
use stats::StallLog;

/// A sample's bytes: 64-byte aligned, shared (a sample that stays resident
/// across epochs is handed out without copying).
pub type SampleBytes = Arc<AlignedBuf>;

/// Produces this rank's plan events for `epoch`, starting after its first
/// `served` serves (a resume when `served > 0`).
pub type EventSource = Box<dyn FnMut(u64, u64) -> Result<Box<dyn Iterator<Item = Event> + Send>> + Send>;

/// The event source of a real plan.
pub fn plan_events(mut planner: Planner) -> EventSource {
    Box::new(move |epoch, served| {
        let plan = if served == 0 {
            planner.epoch(epoch)
        } else {
            let position = planner.position_of_step(served);
            planner.seek(epoch, position)?
        };
        Ok(Box::new(plan))
    })
}

/// Everything a loader is configured with: the plan and the I/O.
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub plan: PlanConfig,
    pub io: IoConfig,
}

/// How to choose the read gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadGapSetting {
    /// Read whole chunks (the paper).
    Whole,
    /// Read only filled records, merging gaps up to this many bytes.
    Bytes(u64),
    /// Measure the device once and choose.
    Auto,
}

impl std::str::FromStr for ReadGapSetting {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "whole" => Ok(ReadGapSetting::Whole),
            "auto" => Ok(ReadGapSetting::Auto),
            n => brand_format::units::parse_bytes(n)
                .map(ReadGapSetting::Bytes)
                .map_err(|why| Error::config(format!("read gap {s:?}: {why}; expected whole, auto or a byte count"))),
        }
    }
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
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            batch_size: 256,
            readahead_bytes: 64 << 20,
            queue_depth: 32,
            read_gap: ReadGapSetting::Auto,
            verify: true,
            direct: true,
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
    engine: Engine,
    source: EventSource,
    epoch: u64,
    served: u64,
    events: Option<Box<dyn Iterator<Item = Event> + Send>>,
    /// Events taken from the plan but not yet reached by the consumer.
    lookahead: VecDeque<Event>,
    /// Bytes of the reads issued for events still in `lookahead`, oldest first.
    ahead: VecDeque<u64>,
    ahead_bytes: u64,
    next_tag: u64,
    /// Samples read and not yet served (or kept: resident mode).
    resident: HashMap<u64, SampleBytes>,
    resident_bytes: u64,
    /// Samples whose read is in flight.
    pending: HashSet<u64>,
    /// The samples of each in-flight job, by tag. Completions with a tag not
    /// here are stale (from before a reset) and are dropped.
    in_flight: HashMap<u64, Vec<u64>>,
    /// A read error, reported again on every call until the loader is reset:
    /// the sample it stopped on cannot be served.
    failed: Option<Error>,
    stalls: StallLog,
    metrics: Metrics,
}

/// Most plan events held ahead of the consumer (bounds memory when a long
/// run of serves needs no reads).
const MAX_LOOKAHEAD_EVENTS: usize = 1 << 16;

impl Loader {
    /// A loader over `ds` running the plan of `cfg`, starting at `state`
    /// (`LoaderState::default()` for the first epoch).
    pub fn open(ds: Arc<Dataset>, cfg: &LoaderConfig, state: LoaderState) -> Result<Self> {
        let planner = Planner::new(&ds.index, &cfg.plan)?;
        Self::new(ds, cfg.io.clone(), plan_events(planner), state)
    }

    /// A loader over `ds` whose events come from `source`, starting at `state`.
    pub fn new(ds: Arc<Dataset>, cfg: IoConfig, source: EventSource, state: LoaderState) -> Result<Self> {
        if cfg.batch_size == 0 {
            return Err(Error::config("batch size must be at least 1"));
        }
        let engine = Engine::start(
            ds.clone(),
            EngineConfig {
                queue_depth: cfg.queue_depth,
                direct: cfg.direct,
                verify: cfg.verify,
                fixed_buffers: true,
            },
        )?;
        let gap = match cfg.read_gap {
            ReadGapSetting::Whole => ReadGap::Whole,
            ReadGapSetting::Bytes(b) => ReadGap::Bytes(b),
            ReadGapSetting::Auto => ReadGap::Bytes(brand_io::probe::auto_gap(ds.clone(), cfg.queue_depth)?),
        };
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
            engine,
            source,
            epoch: state.epoch,
            served: state.served,
            events: None,
            lookahead: VecDeque::new(),
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            next_tag: 0,
            resident: HashMap::new(),
            resident_bytes: 0,
            pending: HashSet::new(),
            in_flight: HashMap::new(),
            failed: None,
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
        m
    }

    /// Starts the counters afresh (e.g. per epoch); peaks restart from what
    /// is resident now.
    pub fn reset_metrics(&mut self) {
        self.metrics = Metrics {
            read_gap: self.metrics.read_gap,
            peak_resident_bytes: self.resident_bytes,
            peak_resident_samples: self.resident.len() as u64,
            ..Default::default()
        };
        self.stalls = StallLog::default();
    }

    /// Jumps to the start of `epoch` (dropping anything read ahead).
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        self.reset_to(LoaderState { epoch, served: 0 })
    }

    fn reset_to(&mut self, state: LoaderState) -> Result<()> {
        self.drain_in_flight();
        self.epoch = state.epoch;
        self.served = state.served;
        self.events = None;
        self.lookahead.clear();
        self.ahead.clear();
        self.ahead_bytes = 0;
        self.resident.clear();
        self.resident_bytes = 0;
        self.failed = None;
        Ok(())
    }

    /// Waits for every in-flight read; their data is discarded.
    fn drain_in_flight(&mut self) {
        while !self.in_flight.is_empty() {
            match self.engine.recv() {
                Ok(c) => {
                    self.in_flight.remove(&c.tag);
                }
                Err(_) => self.in_flight.clear(),
            }
        }
        self.pending.clear();
    }

    /// The next batch of the current epoch, or `None` at its end; the call
    /// after `None` starts the next epoch. Errors (a corrupt record, a
    /// vanished segment) name the file and position; the loader's `state()`
    /// stays that of the last sample handed out.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        if self.events.is_none() {
            let events = (self.source)(self.epoch, self.served)?;
            self.events = Some(events);
        }
        let mut taken: Vec<(Event, u64, SampleBytes)> = Vec::with_capacity(self.cfg.batch_size);
        while taken.len() < self.cfg.batch_size {
            match self.next_sample() {
                Ok(Some(t)) => taken.push(t),
                Ok(None) => break,
                Err(e) => {
                    // All or nothing: put the batch's samples back, so state()
                    // and a resume still count them as unserved.
                    for (ev, id, bytes) in taken.into_iter().rev() {
                        self.unserve(ev, id, bytes);
                    }
                    return Err(e);
                }
            }
        }
        let (ids, data): (Vec<u64>, Vec<SampleBytes>) = taken.into_iter().map(|(_, id, b)| (id, b)).unzip();
        if ids.is_empty() {
            // End of the epoch: the next call starts the next one.
            self.epoch += 1;
            self.served = 0;
            self.events = None;
            return Ok(None);
        }
        Ok(Some(Batch {
            epoch: self.epoch,
            ds: self.ds.clone(),
            ids,
            data,
        }))
    }

    /// Fills the lookahead window: takes plan events and issues their reads
    /// while the bytes read ahead stay within `readahead_bytes` (at least
    /// one read is always allowed, so the consumer can progress).
    fn fill_lookahead(&mut self) -> Result<()> {
        while self.lookahead.len() < MAX_LOOKAHEAD_EVENTS {
            let ahead_full = !self.ahead.is_empty() && self.ahead_bytes >= self.cfg.readahead_bytes;
            if ahead_full {
                break;
            }
            let Some(ev) = self.events.as_mut().and_then(|e| e.next()) else {
                break;
            };
            if let Event::Read { chunk, mask } = ev {
                let ext = extents(&self.ds.index, chunk, mask, self.gap);
                let bytes: u64 = ext.iter().map(|e| e.len).sum();
                for e in ext {
                    self.submit(e)?;
                }
                self.ahead.push_back(bytes);
                self.ahead_bytes += bytes;
                self.metrics.refills += 1;
            }
            self.lookahead.push_back(ev);
            if self.cfg.readahead_bytes == 0 && matches!(ev, Event::Read { .. }) {
                break;
            }
        }
        Ok(())
    }

    fn submit(&mut self, e: Extent) -> Result<()> {
        let ids: Vec<u64> = e.records.iter().map(|r| r.0).collect();
        self.pending.extend(&ids);
        self.metrics.reads_issued += 1;
        self.next_tag += 1;
        self.in_flight.insert(self.next_tag, ids);
        self.engine.submit(Job {
            tag: self.next_tag,
            extent: e,
        })
    }

    fn accept(&mut self, c: Completion) -> Result<()> {
        let Some(ids) = self.in_flight.remove(&c.tag) else {
            return Ok(());
        };
        for id in ids {
            self.pending.remove(&id);
        }
        self.metrics.bytes_read += c.bytes_read;
        match c.result {
            Ok(samples) => {
                for (id, bytes) in samples {
                    self.resident_bytes += bytes.len() as u64;
                    self.resident.insert(id, Arc::new(bytes));
                }
                self.metrics.peak_resident_bytes = self.metrics.peak_resident_bytes.max(self.resident_bytes);
                self.metrics.peak_resident_samples = self.metrics.peak_resident_samples.max(self.resident.len() as u64);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn unserve(&mut self, ev: Event, id: u64, bytes: SampleBytes) {
        self.served -= 1;
        self.metrics.samples_served -= 1;
        self.metrics.bytes_served -= self.ds.index.stored_len[id as usize] as u64;
        if !self.resident.contains_key(&id) {
            self.resident_bytes += bytes.len() as u64;
            self.resident.insert(id, bytes);
        }
        self.lookahead.push_front(ev);
    }

    fn next_sample(&mut self) -> Result<Option<(Event, u64, SampleBytes)>> {
        if let Some(e) = &self.failed {
            return Err(e.duplicate());
        }
        loop {
            if self.lookahead.is_empty() {
                self.fill_lookahead()?;
            }
            let Some(ev) = self.lookahead.pop_front() else {
                return Ok(None);
            };
            match ev {
                Event::Read { .. } => {
                    if let Some(bytes) = self.ahead.pop_front() {
                        self.ahead_bytes -= bytes;
                    }
                    // Room in the window: read further ahead.
                    self.fill_lookahead()?;
                }
                Event::Serve { sample, frees, .. } => {
                    let bytes = match self.wait_for(sample, frees) {
                        Ok(b) => b,
                        Err(e) => {
                            // The serve stays unserved: state() points at it.
                            self.lookahead.push_front(ev);
                            self.failed = Some(e.duplicate());
                            return Err(e);
                        }
                    };
                    self.served += 1;
                    self.metrics.samples_served += 1;
                    self.metrics.bytes_served += self.ds.index.stored_len[sample as usize] as u64;
                    return Ok(Some((ev, sample, bytes)));
                }
            }
        }
    }

    /// The bytes of `sample`, waiting for its read (or issuing one if the
    /// plan expected it resident but this process never read it). With
    /// `frees` the sample leaves memory; otherwise it stays resident.
    fn wait_for(&mut self, sample: u64, frees: bool) -> Result<SampleBytes> {
        if !self.resident.contains_key(&sample) && !self.pending.contains(&sample) {
            let chunk = self.ds.index.chunk_of(sample);
            let slot = sample - chunk * self.ds.index.chunk_size() as u64;
            for e in extents(&self.ds.index, chunk, 1 << slot, ReadGap::Bytes(0)) {
                self.submit(e)?;
            }
            self.metrics.recovery_reads += 1;
        }
        let mut stalled: Option<Instant> = None;
        loop {
            let found = if frees {
                self.resident
                    .remove(&sample)
                    .inspect(|b| self.resident_bytes -= b.len() as u64)
            } else {
                self.resident.get(&sample).cloned()
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
            let c = self.engine.recv()?;
            self.accept(c)?;
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.drain_in_flight();
    }
}
