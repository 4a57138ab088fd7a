//! What passes between the engine and its backends: jobs in, completions
//! out, the settings and counters both backends share, and a started
//! backend's handles.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::Result;
use brand_format::extents::Extent;

use crate::config::EngineConfig;

/// One extent to read; `tag` comes back with its completion.
pub struct Job {
    pub tag: u64,
    pub extent: Extent,
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
    pub store: std::sync::OnceLock<Arc<crate::objects::StoreStats>>,
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

pub(crate) enum JobSender {
    /// One sender per ring; jobs go round-robin.
    Uring(Vec<crate::uring::RingSender>, AtomicUsize),
    Threads(crossbeam_channel::Sender<Job>),
    Objects(tokio::sync::mpsc::UnboundedSender<Job>),
}

impl JobSender {
    /// Hands `job` to the backend; false if it has stopped.
    pub fn send(&self, job: Job) -> bool {
        match self {
            JobSender::Uring(rings, next) => {
                let i = next.fetch_add(1, Ordering::Relaxed) % rings.len();
                rings[i].send(job)
            }
            JobSender::Threads(jobs) => jobs.send(job).is_ok(),
            JobSender::Objects(jobs) => jobs.send(job).is_ok(),
        }
    }
}

/// A started backend: where jobs go, its threads, and a channel that
/// disconnects when every one of them has finished.
pub(crate) struct Started {
    pub jobs: JobSender,
    pub threads: Vec<std::thread::JoinHandle<()>>,
    pub exited: crossbeam_channel::Receiver<()>,
}
