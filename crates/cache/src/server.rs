//! The cache process: one abstract memory for every job of a dataset on
//! this machine (DESIGN.md §9).
//!
//! One reader thread reads chunk extents through a [`ReadSession`] into the
//! shared memory; every job's connection has a thread that takes its
//! messages (releases are applied at once) and one that answers its
//! requests for batches. All of them share one [`State`] under a mutex.
//!
//! This module binds the socket, starts the threads and wires them:
//! [`fill`](crate::fill) reads, [`session`](crate::session) serves each
//! job, [`state`](crate::state) is what they share.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use brand_format::Dataset;
use brand_format::error::{Error, Result};
use brand_io::{IoConfig, ReadSession};
use brand_loader::OnCorrupt;
use brand_plan::{Layout, Memory, PlanConfig, Planner, Policy};

use crate::arena::footprint;
use crate::cursor::Fill;
use crate::fill::read_loop;
use crate::session::introduce;
use crate::shared::{Shared, lock};
use crate::shm::Mapping;
use crate::state::{CacheReport, State};
use crate::wire::{Digest, ToJob};

/// How the cache is set up: its memory and how it reads.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// The whole budget, for every job together.
    pub memory: Memory,
    pub io: IoConfig,
    /// Bytes of reads in flight at most.
    pub readahead: u64,
}

/// What the cache decides: the plan whose reads fill its memory (the
/// policy, seed and run length keys of a lone loader's plan) and what a
/// corrupt record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    pub policy: Policy,
    pub seed: u64,
    pub run_length: u32,
    /// `Skip`: a corrupt record is left out of the epoch of every job that
    /// needs it (counted); `Error`: the job that draws it fails.
    pub on_corrupt: OnCorrupt,
}

impl Default for CachePolicy {
    /// Brand's plan, seed 0, record by record; a corrupt record an error.
    fn default() -> Self {
        CachePolicy {
            policy: Policy::Brand,
            seed: 0,
            run_length: 1,
            on_corrupt: OnCorrupt::Error,
        }
    }
}

/// A running cache; [`stop`](Self::stop) ends it (dropping it does too).
pub struct CacheHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    stopped: bool,
}

/// The budget in bytes: a percentage of the samples' decoded bytes, or
/// slots of the mean decoded sample.
pub fn budget_bytes(ds: &Dataset, memory: Memory) -> Result<u64> {
    memory.check()?;
    let total: u64 = ds.index.raw_lens().map(|l| footprint(l as u64)).sum();
    let n = ds.index.samples().max(1);
    let b = match memory {
        Memory::Bytes(b) => b,
        Memory::Percent(p) => (total as f64 * p / 100.0) as u64,
        Memory::Slots(s) => s.saturating_mul(total / n),
    };
    let largest = ds.index.raw_lens().map(|l| footprint(l as u64)).max().unwrap_or(64);
    if b < largest {
        return Err(Error::config(format!(
            "cache memory {memory} is {b} bytes, less than the largest sample ({largest} bytes)"
        )));
    }
    Ok(b)
}

/// Listens at `socket`: a stale socket (nothing accepting) is replaced; a
/// live one is an error (another cache runs there).
fn listen(socket: &Path) -> Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !meta.file_type().is_socket() {
            return Err(Error::config(format!(
                "{} exists and is not a socket: choose another --socket path",
                socket.display()
            )));
        }
        match UnixStream::connect(socket) {
            Ok(_) => {
                return Err(Error::config(format!(
                    "a cache already listens at {}",
                    socket.display()
                )));
            }
            Err(_) => {
                // Left by a cache that was killed: nobody accepts on it.
                std::fs::remove_file(socket).map_err(|e| Error::io(socket, e))?;
            }
        }
    }
    let l = UnixListener::bind(socket).map_err(|e| Error::io(socket, e))?;
    // Owner-only: other users cannot connect (connect needs write access).
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(|e| Error::io(socket, e))?;
    l.set_nonblocking(true).map_err(|e| Error::io(socket, e))?;
    Ok(l)
}

impl CacheHandle {
    /// Starts a cache of `ds` listening at `socket`, with the default
    /// [`CachePolicy`].
    pub fn start(ds: Arc<Dataset>, cfg: &CacheConfig, socket: &Path) -> Result<CacheHandle> {
        Self::start_with(ds, cfg, &CachePolicy::default(), socket)
    }

    /// Starts a cache of `ds` listening at `socket`.
    pub fn start_with(ds: Arc<Dataset>, cfg: &CacheConfig, policy: &CachePolicy, socket: &Path) -> Result<CacheHandle> {
        let n = ds.index.samples();
        if n > u32::MAX as u64 {
            return Err(Error::config(format!("{n} samples: a cache serves at most 2^32 - 1")));
        }
        let bytes = budget_bytes(&ds, cfg.memory)?;
        let (memory, memfd) = Mapping::create(bytes as usize)
            .map_err(|e| Error::config(format!("cannot create the cache's shared memory of {bytes} bytes: {e}")))?;
        let plan = PlanConfig {
            policy: policy.policy,
            seed: policy.seed,
            run_length: policy.run_length,
            ..PlanConfig::new(Memory::Bytes(bytes))
        };
        let planner = Planner::from_layout(Layout::of(&ds.index), &plan)?;
        let engine = cfg.io.engine_config(&ds, cfg.readahead);
        let session: ReadSession<()> = ReadSession::open(ds.clone(), engine, cfg.io.read_gap)?;
        let listener = listen(socket)?;
        let state = State::new(
            n as usize,
            bytes,
            policy.on_corrupt == OnCorrupt::Skip,
            policy.run_length,
        );
        let shared = Arc::new(Shared {
            digest: Digest::of(&ds),
            ds,
            state: Mutex::new(state),
            changed: Condvar::new(),
            memory,
            memfd,
            socket: socket.to_path_buf(),
            stop: AtomicBool::new(false),
            links: Mutex::new(Vec::new()),
            introducing: AtomicUsize::new(0),
        });
        let fill = Fill::new(planner);
        let depth = cfg.io.queue_depth.max(1);
        let readahead = cfg.readahead.max(1);
        let s = shared.clone();
        let reader = std::thread::Builder::new()
            .name("brand-cache-read".into())
            .spawn(move || read_loop(&s, session, fill, depth, readahead))
            .map_err(|e| Error::config(format!("cannot start the cache's reader: {e}")))?;
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("brand-cache-accept".into())
            .spawn(move || accept_loop(&s, listener))
            .map_err(|e| Error::config(format!("cannot start the cache's listener: {e}")))?;
        Ok(CacheHandle {
            shared,
            threads: vec![reader, acceptor],
            stopped: false,
        })
    }

    pub fn report(&self) -> CacheReport {
        let s = lock(&self.shared.state);
        let mut r = s.report.clone();
        r.jobs_now = s.jobs_now();
        r
    }

    /// Stops: every attached job gets an error saying `why`, the socket is
    /// removed, the shared memory goes with the last job's mapping.
    pub fn stop(mut self, why: &str) -> CacheReport {
        self.shutdown(why);
        self.report()
    }

    fn shutdown(&mut self, why: &str) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let sh = &self.shared;
        let msg = format!("the cache at {} stopped: {why}", sh.socket.display());
        lock(&sh.state).stopping = Some(msg.clone());
        sh.stop.store(true, Ordering::SeqCst);
        sh.changed.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let links = std::mem::take(&mut *sh.links.lock().unwrap_or_else(|e| e.into_inner()));
        for (link, _) in &links {
            let _ = link.send(&ToJob::Failed(msg.clone()));
            let _ = link.stream.shutdown(std::net::Shutdown::Both);
        }
        for (_, threads) in links {
            for t in threads {
                let _ = t.join();
            }
        }
        let _ = std::fs::remove_file(&sh.socket);
    }
}

impl Drop for CacheHandle {
    fn drop(&mut self) {
        self.shutdown("it was closed");
    }
}

fn accept_loop(sh: &Arc<Shared>, listener: UnixListener) {
    while !sh.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => introduce(sh, stream),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                tracing::warn!("accept on {}: {e}", sh.socket.display());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
