//! What passes between the engine and its backends: jobs in, completions
//! out, the settings and counters both backends share, and a started
//! backend's handles.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::Result;
use brand_format::extents::Extent;

use crate::config::EngineConfig;

/// One extent to read; `tag` comes back with its completion.
pub struct Job {
    pub tag: u64,
    pub extent: Extent,
    /// A read of a start's first fill, made record by record as samples
    /// come due: a local tier reads it from the store as asked rather than
    /// fetch its chunk whole first (the first batch would wait for every
    /// chunk the first fill touches: about the whole dataset).
    pub first_fill: bool,
}

impl Job {
    pub fn new(tag: u64, extent: Extent) -> Job {
        Job {
            tag,
            extent,
            first_fill: false,
        }
    }
}

/// One record's outcome: its decoded bytes, or why it cannot be served.
pub type RecordResult = Result<AlignedBuf>;

/// A finished job: its extent, handed back (the caller needs no copy of
/// its records), and each record it carried (decoded, or its own error),
/// or the I/O error that stopped the whole read.
pub struct Completion {
    pub tag: u64,
    pub extent: Extent,
    pub result: Result<Vec<(u64, RecordResult)>>,
}

/// Counters the engine keeps for the loader's metrics.
#[derive(Debug, Default)]
pub(crate) struct EngineStats {
    pub buffered_fallback: AtomicBool,
    pub fixed_in_use: AtomicBool,
    /// Bytes of buffers registered with the ring.
    pub registered_bytes: AtomicU64,
    /// Bytes of ordinary read buffers allocated (in use or pooled), and their peak.
    pub pool_bytes: AtomicU64,
    pub pool_peak_bytes: AtomicU64,
    /// The object backend's GET counters and limiter (set when it starts).
    pub store: std::sync::OnceLock<Arc<StoreStats>>,
}

impl EngineStats {
    pub fn pool_grew(&self, by: u64) {
        let now = self.pool_bytes.fetch_add(by, Ordering::Relaxed) + by;
        self.pool_peak_bytes.fetch_max(now, Ordering::Relaxed);
    }
    pub fn pool_shrank(&self, by: u64) {
        self.pool_bytes.fetch_sub(by, Ordering::Relaxed);
    }
}

/// What both backends share: the dataset, the settings, where completions go.
#[derive(Clone)]
pub(crate) struct Shared {
    pub ds: Arc<Dataset>,
    pub cfg: EngineConfig,
    pub done: crossbeam_channel::Sender<Completion>,
    pub stats: Arc<EngineStats>,
}

/// Where a started backend takes jobs. Each backend implements it for its
/// own sender, so this vocabulary module imports no backend (no circle).
pub(crate) trait JobSender: Send + Sync {
    /// Hands `job` to the backend; false if it has stopped.
    fn send(&self, job: Job) -> bool;
}

impl JobSender for crossbeam_channel::Sender<Job> {
    fn send(&self, job: Job) -> bool {
        crossbeam_channel::Sender::send(self, job).is_ok()
    }
}

impl JobSender for tokio::sync::mpsc::UnboundedSender<Job> {
    fn send(&self, job: Job) -> bool {
        tokio::sync::mpsc::UnboundedSender::send(self, job).is_ok()
    }
}

/// The object backend's GET counters and limiter (for the metrics).
#[derive(Debug)]
pub(crate) struct StoreStats {
    pub counters: brand_store::GetCounters,
    pub limiter: Arc<brand_store::Limiter>,
}

impl StoreStats {
    pub fn report(&self) -> brand_store::GetReport {
        self.counters.report(Some(&self.limiter))
    }
}

/// A started backend: where jobs go, its threads, and a channel that
/// disconnects when every one of them has finished.
pub(crate) struct Started {
    pub jobs: Box<dyn JobSender>,
    pub threads: Vec<std::thread::JoinHandle<()>>,
    pub exited: crossbeam_channel::Receiver<()>,
}
