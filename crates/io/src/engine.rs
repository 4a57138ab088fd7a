//! The engine: executes extent reads (O_DIRECT, up to `queue_depth` at a
//! time) on one of two backends, verifies every record it was asked for
//! (crc32c, zstd; [`brand_format::decode`]) off the caller's thread and
//! hands the samples back. This module chooses and starts the backend and
//! is the front callers use; the backends share only the vocabulary
//! modules (`job`, `read`, `files`, `pool`), never this one.
//!
//! * [`IoBackend::Uring`]: plain io_uring loops (up to two rings, jobs
//!   round-robin), each on its own thread. A loop checks the
//!   uncompressed records it read itself (their bytes are in its cache);
//!   compressed ones are checked and decompressed by a small pool
//!   (`decode_threads`, by default the cores the ring loops leave: see
//!   [`default_decode_threads`]), so decompression does not hold up the
//!   loops where there are cores to spare.
//! * [`IoBackend::Threads`]: `queue_depth` threads doing `pread` (portable:
//!   works where io_uring is refused by seccomp, gVisor or
//!   `kernel.io_uring_disabled`); each thread decodes what it read.
//!
//! The engine never decides what to read: jobs arrive in plan order from the
//! loader, and completions go back tagged, so the loader matches them to
//! plan events whatever order the device finishes in.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};

pub use crate::config::{EngineConfig, FIXED_BUF_BYTES, IoBackend, default_decode_threads};
pub use crate::job::{Completion, Job, RecordResult};
use crate::job::{EngineStats, JobSender, Shared};
use crate::uring::NotStarted;

pub struct Engine {
    jobs: Option<Box<dyn JobSender>>,
    done: crossbeam_channel::Receiver<Completion>,
    threads: Vec<std::thread::JoinHandle<()>>,
    exited: crossbeam_channel::Receiver<()>,
    stats: Arc<EngineStats>,
    backend: IoBackend,
    uring_refused: bool,
    io_timeout: Duration,
    /// The local tier under the object backend, if it has one (for its report).
    tier: Option<Arc<crate::tier::TierPath>>,
}

impl Engine {
    /// Starts the backend `cfg.backend` names; `Auto` falls back from
    /// io_uring to threads, with one warning, where io_uring is refused
    /// (setting up a ring, or submitting to one: found out here, not at the
    /// first read).
    pub fn start(ds: Arc<Dataset>, cfg: EngineConfig) -> Result<Self> {
        if cfg.queue_depth == 0 {
            return Err(Error::config("queue depth must be at least 1"));
        }
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let stats = Arc::new(EngineStats::default());
        let shared = Shared {
            ds,
            cfg: cfg.clone(),
            done: done_tx,
            stats: stats.clone(),
        };
        let mut tier_path = None;
        let (started, backend, uring_refused) = if shared.ds.is_remote() {
            let tier = match &cfg.tier {
                Some(settings) => tier_disk(&shared, settings)?,
                None => None,
            };
            tier_path = tier.as_ref().map(|t| t.path.clone());
            (crate::objects::start(shared, tier)?, IoBackend::Objects, false)
        } else {
            start_disk(shared)?
        };
        Ok(Engine {
            jobs: Some(started.jobs),
            done: done_rx,
            threads: started.threads,
            exited: started.exited,
            stats,
            backend,
            uring_refused,
            io_timeout: cfg.io_timeout,
            tier: tier_path,
        })
    }

    pub fn submit(&self, job: Job) -> Result<()> {
        match &self.jobs {
            Some(jobs) if jobs.send(job) => Ok(()),
            _ => Err(stopped()),
        }
    }

    /// The next completion, waiting for it.
    pub fn recv(&self) -> Result<Completion> {
        self.done.recv().map_err(|_| stopped())
    }

    /// A completion that has arrived already, if any (never waits).
    pub fn try_recv(&self) -> Result<Option<Completion>> {
        match self.done.try_recv() {
            Ok(c) => Ok(Some(c)),
            Err(crossbeam_channel::TryRecvError::Empty) => Ok(None),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(stopped()),
        }
    }

    /// The next completion, or `Ok(None)` if none arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Completion>> {
        match self.done.recv_timeout(timeout) {
            Ok(c) => Ok(Some(c)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(None),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(stopped()),
        }
    }

    /// The backend in use (never `Auto`).
    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    /// Whether `auto` wanted io_uring, was refused, and fell back to threads.
    pub fn uring_refused(&self) -> bool {
        self.uring_refused
    }

    /// Whether reads use buffers registered with the ring.
    pub fn fixed_buffers_in_use(&self) -> bool {
        self.stats.fixed_in_use.load(Ordering::Relaxed)
    }

    /// Whether reads fell back from O_DIRECT to buffered I/O.
    pub fn buffered_fallback(&self) -> bool {
        self.stats.buffered_fallback.load(Ordering::Relaxed)
    }

    /// Bytes registered with the ring (fixed buffers).
    pub fn registered_bytes(&self) -> u64 {
        self.stats.registered_bytes.load(Ordering::Relaxed)
    }

    /// Drop stops waiting for reads in flight (they are stuck: the caller
    /// has seen a read time out).
    pub fn abandon(&mut self) {
        self.io_timeout = Duration::ZERO;
    }

    /// What the GETs did, for a dataset in object storage.
    pub fn store_report(&self) -> Option<brand_store::GetReport> {
        self.stats.store.get().map(|s| s.report())
    }

    /// What the local tier did, for a dataset at a URL read with one.
    pub fn tier_report(&self) -> Option<crate::tier::TierReport> {
        self.tier.as_ref().map(|t| t.report())
    }

    /// The consumer took its first sample: a local tier measures from now
    /// how long it waits for reads (its benefit, for the placement).
    pub fn consumer_started(&self) {
        if let Some(t) = &self.tier {
            t.consumer_started();
        }
    }

    /// The consumer waited `d` for a read.
    pub fn consumer_waited(&self, d: std::time::Duration) {
        if let Some(t) = &self.tier {
            t.consumer_waited(d);
        }
    }

    /// Peak bytes of ordinary read buffers (in use or idle).
    pub fn peak_pool_bytes(&self) -> u64 {
        self.stats.pool_peak_bytes.load(Ordering::Relaxed)
    }
}

/// Starts the disk backend `shared.cfg.backend` names: `Auto` falls back
/// from io_uring to threads, with one warning, where io_uring is refused.
fn start_disk(shared: Shared) -> Result<(crate::job::Started, IoBackend, bool)> {
    match shared.cfg.backend {
        IoBackend::Threads => Ok((crate::threads::start(shared)?, IoBackend::Threads, false)),
        IoBackend::Objects => Err(Error::config(format!(
            "{}: the objects backend reads datasets at a URL only",
            shared.ds.dir().display()
        ))),
        IoBackend::Uring => match crate::uring::start(shared) {
            Ok(s) => Ok((s, IoBackend::Uring, false)),
            Err(e) => Err(e.into_error()),
        },
        IoBackend::Auto => match crate::uring::start(shared) {
            Ok(s) => Ok((s, IoBackend::Uring, false)),
            Err(NotStarted {
                call,
                error,
                shared: Some(shared),
            }) if crate::uring::refused(&error) => {
                tracing::warn!("io_uring refused ({call}: {error}); reading with the threads backend");
                Ok((crate::threads::start(*shared)?, IoBackend::Threads, true))
            }
            Err(e) => Err(e.into_error()),
        },
    }
}

/// The local tier of a dataset at a URL, with a disk backend reading its
/// files (the user's `io_backend`); None, with one warning, where the
/// tier cannot be opened (the store is read without it).
fn tier_disk(shared: &Shared, settings: &brand_store::tier::TierSettings) -> Result<Option<crate::objects::TierDisk>> {
    let ds = &shared.ds;
    let url = ds.dir().to_string_lossy().into_owned();
    let tier = match brand_store::tier::Tier::open(settings, &url, ds.clone()) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(
                "{}: the local tier cannot be used ({e}); reading {url} from the store without it",
                settings.dir.display()
            );
            return Ok(None);
        }
    };
    // The same dataset, its segments the tier's files: a disk backend
    // reads (and errors name) them there.
    let local = Dataset::from_parts(
        tier.dir().to_path_buf(),
        ds.manifest.clone(),
        ds.index.clone(),
        brand_format::dataset::Origin::Dir,
    )?;
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    let disk = Shared {
        ds: Arc::new(local),
        cfg: EngineConfig {
            tier: None,
            // A tier's bytes are checked on every read, whatever `verify`
            // says: a chunk damaged on its disk is read from the store.
            verify: true,
            ..shared.cfg.clone()
        },
        done: done_tx,
        stats: shared.stats.clone(),
    };
    let (started, _, _) = start_disk(disk)?;
    // Whole chunks in flight are read-ahead memory too: at most the
    // reader's read-ahead (what it registers), or two GETs' worth.
    let budget = shared.cfg.fixed_buffer_bytes.max(2 * shared.cfg.store.get_bytes);
    let pinned = settings
        .pinned_share
        .map(|share| brand_format::pin::pinned(ds.index.chunk_count(), share));
    let path = Arc::new(crate::tier::TierPath::new(
        tier,
        ds.clone(),
        started.jobs,
        budget,
        pinned,
    ));
    Ok(Some(crate::objects::TierDisk {
        path,
        done: done_rx,
        threads: started.threads,
    }))
}

fn stopped() -> Error {
    Error::config("the io engine has stopped")
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the job channel ends the backend once in-flight reads
        // finish; a read stuck on hung storage is not waited for beyond
        // io_timeout: its thread is left to finish (or not) on its own.
        self.jobs.take();
        let deadline = self.io_timeout.max(Duration::from_millis(1));
        match self.exited.recv_timeout(deadline) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "io engine: reads still in flight after {:?}; not waiting for them",
                    deadline
                );
                self.threads.clear();
            }
            _ => {
                for t in self.threads.drain(..) {
                    let _ = t.join();
                }
            }
        }
    }
}
