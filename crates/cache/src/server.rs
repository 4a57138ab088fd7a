//! The cache process: one abstract memory for every job of a dataset on
//! this machine (DESIGN.md §9).
//!
//! One reader thread reads chunk extents through a [`ReadSession`] into the
//! shared memory; every job's connection has a thread that takes its
//! messages (releases are applied at once) and one that answers its
//! requests for batches. All of them share one [`State`] under a mutex.
//!
//! What is read: a sample is *needed* by each attached job that has not
//! served it in its current epoch. The reader follows the reads of the
//! cache's own plan (`brand_plan`, the policy, seed and run length it is
//! configured with, over its memory), epoch after epoch: Brand's fill of
//! the abstract memory, records of many chunks at Brand's fill rates. Of
//! each planned read it reads the records some job needs that are not in
//! memory, and skips the rest; a plan epoch covers every sample once, so a
//! job's epoch is one turn of the fill from wherever it joined.
//! What is served: a job takes, uniformly at random with its own seed, any
//! sample in memory it has not served this epoch ("substitutable", as
//! Quiver says, and "whatever is available", as Brand does).
//! What stays: a sample needed by no job stays until its room is wanted;
//! when the budget is full and a job waits, the cache drops samples that no
//! waiting job needs, fewest needers first: what only a laggard (a job not
//! asking) still needs goes, and that job reads it again later (counted in
//! `dropped_needed`). Samples in a job's live batch are never dropped.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use brand_format::Dataset;
use brand_format::error::{Error, Result};
use brand_format::ids::IdBits;
use brand_format::rng::Prng;
use brand_io::engine::Completion;
use brand_io::{IoConfig, ReadSession};
use brand_loader::OnCorrupt;
use brand_plan::{Layout, Memory, PlanConfig, Planner, Policy};

use crate::arena::{Arena, footprint};
use crate::shm::{Mapping, send_all, send_with_fd};
use crate::wire::{Digest, Hello, Placed, ToCache, ToJob, attached_frame_max, hello_frame_max, read_frame_within};

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

/// What the cache did, for its report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CacheReport {
    pub memory_bytes: u64,
    /// The fill plan's run length (records per run).
    pub run_length: u32,
    pub jobs_attached: u64,
    pub jobs_now: u64,
    pub jobs_refused: u64,
    /// Bytes the device delivered, and the records they held.
    pub bytes_read: u64,
    pub samples_read: u64,
    pub reads_issued: u64,
    /// Samples handed to jobs (a sample to two jobs counts twice).
    pub samples_served: u64,
    /// Samples dropped while some job still needed them (the laggard
    /// policy's cost: each is read again for that job).
    pub dropped_needed: u64,
    /// Samples dropped that no job needed any more.
    pub dropped_idle: u64,
    /// Corrupt records read (with `on_corrupt = "skip"` each is left out
    /// of the epoch of every job that needed it).
    pub corrupt_records: u64,
    /// Turns of the fill's plan begun (plan epochs).
    pub fill_epochs: u64,
    pub peak_used_bytes: u64,
}

/// A job waits at most this long for a batch without any read or release
/// in between before the cache gives up on it (everything held by batches).
const STUCK_AFTER: Duration = Duration::from_secs(120);
/// A job must introduce itself within this (its whole hello, however
/// slowly its bytes come).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections whose hello is awaited at once, each on its own thread (so
/// one that says nothing holds up no other); more are refused at once.
const MAX_INTRODUCING: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Where {
    Absent,
    /// Being read.
    Pending,
    Resident(u64),
    /// Its read failed (the error is in `State::bad`).
    Bad,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Where,
    /// Attached jobs that have not served it this epoch.
    need: u32,
    /// Samples of live batches (every job's).
    leases: u32,
    /// Index in `State::present` while resident or bad.
    slot: u32,
}

struct Job {
    epoch: u64,
    served: IdBits,
    rng: Prng,
    seed: u64,
    batch_size: usize,
    waiting: bool,
    leases: HashMap<u32, u32>,
    /// Bytes of its live batches, and how many.
    held_bytes: u64,
    live_batches: u32,
}

impl Job {
    fn has_served(&self, id: u32) -> bool {
        self.served.contains(id as u64)
    }
}

/// A record whose read failed: why, and whether it is the record itself
/// (corrupt: `on_corrupt` applies) or its read (an I/O error).
struct Bad {
    why: String,
    corrupt: bool,
}

/// Where the fill is in the cache's plan: the reads of plan epoch `epoch`
/// (chunk, records), the next at `next`.
struct Fill {
    planner: Planner,
    epoch: u64,
    reads: Vec<(u64, u64)>,
    next: usize,
}

impl Fill {
    fn new(planner: Planner) -> Self {
        let reads = Self::plan(&planner, 0);
        Fill {
            planner,
            epoch: 0,
            reads,
            next: 0,
        }
    }

    /// The reads of plan epoch `epoch`. A budget that holds the dataset
    /// plans no reads (everything stays): then every chunk once, whole.
    fn plan(planner: &Planner, epoch: u64) -> Vec<(u64, u64)> {
        let g = planner.geometry();
        if g.holds_all {
            let k = g.chunk_size as u64;
            return (0..g.chunks)
                .map(|c| {
                    let records = (g.samples - c * k).min(k);
                    (c, if records >= 64 { u64::MAX } else { (1 << records) - 1 })
                })
                .collect();
        }
        let global = planner.global_epoch(epoch);
        global.reads().iter().map(|r| (r.chunk as u64, r.mask)).collect()
    }

    /// The planned read at the cursor (the next plan epoch begins when one
    /// ends; `true` then).
    fn current(&mut self) -> ((u64, u64), bool) {
        let mut turned = false;
        while self.next >= self.reads.len() {
            self.epoch += 1;
            self.reads = Self::plan(&self.planner, self.epoch);
            self.next = 0;
            turned = true;
        }
        (self.reads[self.next], turned)
    }

    fn advance(&mut self) {
        self.next += 1;
    }
}

struct State {
    samples: Vec<Sample>,
    /// Samples resident or bad, for serving.
    present: Vec<u32>,
    bad: HashMap<u32, Bad>,
    /// Samples not in memory that some job needs.
    wanted: u64,
    fill: Fill,
    skip_corrupt: bool,
    arena: Arena,
    /// Room promised to reads in flight.
    reserved: u64,
    jobs: HashMap<u64, Job>,
    next_job: u64,
    /// The reader failed: every job gets this.
    failed: Option<String>,
    stopping: Option<String>,
    /// Reads or releases since start: a waiting job's sign of progress.
    progress: u64,
    report: CacheReport,
}

struct Shared {
    ds: Arc<Dataset>,
    digest: Digest,
    state: Mutex<State>,
    changed: Condvar,
    memory: Mapping,
    memfd: OwnedFd,
    socket: PathBuf,
    stop: AtomicBool,
    links: Mutex<Vec<Attachment>>,
    /// Connections whose hello is being awaited.
    introducing: AtomicUsize,
}

/// A job's connection and its two threads.
type Attachment = (Arc<Link>, Vec<JoinHandle<()>>);

/// A job's connection; writes are whole frames under the lock.
struct Link {
    stream: UnixStream,
    write: Mutex<()>,
    /// A `Next` not yet answered: a job asks for its next batch once it
    /// has the answer to the last (so a flood of requests is refused, not
    /// served into memory nobody reads).
    asking: AtomicBool,
}

impl Link {
    fn send(&self, m: &ToJob) -> io::Result<()> {
        let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        send_all(self.stream.as_raw_fd(), &m.encode())
    }
}

/// A running cache; [`stop`](Self::stop) ends it (dropping it does too).
pub struct CacheHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    stopped: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        let state = State {
            samples: vec![
                Sample {
                    at: Where::Absent,
                    need: 0,
                    leases: 0,
                    slot: 0,
                };
                n as usize
            ],
            present: Vec::new(),
            bad: HashMap::new(),
            wanted: 0,
            fill: Fill::new(planner),
            skip_corrupt: policy.on_corrupt == OnCorrupt::Skip,
            arena: Arena::new(bytes),
            reserved: 0,
            jobs: HashMap::new(),
            next_job: 1,
            failed: None,
            stopping: None,
            progress: 0,
            report: CacheReport {
                memory_bytes: bytes,
                run_length: policy.run_length,
                fill_epochs: 1,
                ..CacheReport::default()
            },
        };
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
        let depth = cfg.io.queue_depth.max(1);
        let readahead = cfg.readahead.max(1);
        let s = shared.clone();
        let reader = std::thread::Builder::new()
            .name("brand-cache-read".into())
            .spawn(move || read_loop(&s, session, depth, readahead))
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
        r.jobs_now = s.jobs.len() as u64;
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

/// Awaits a new connection's hello on a thread of its own: a connection
/// that says nothing, or says it slowly, holds up no other job's attach.
fn introduce(sh: &Arc<Shared>, stream: UnixStream) {
    let link = Arc::new(Link {
        stream,
        write: Mutex::new(()),
        asking: AtomicBool::new(false),
    });
    if sh.introducing.fetch_add(1, Ordering::SeqCst) >= MAX_INTRODUCING {
        sh.introducing.fetch_sub(1, Ordering::SeqCst);
        let why = format!("{MAX_INTRODUCING} connections are introducing themselves already: try again");
        let _ = link.stream.set_nonblocking(false);
        let _ = refuse(sh, &link, why);
        return;
    }
    let s = sh.clone();
    let spawned = std::thread::Builder::new()
        .name("brand-cache-hello".into())
        .spawn(move || {
            if let Err(e) = attach(&s, link) {
                tracing::warn!("a job could not attach: {e}");
            }
            s.introducing.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        sh.introducing.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("a job could not attach: no thread for its hello: {e}");
    }
}

/// Reads from a stream until `until`, however the bytes are spread out.
struct Until<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl io::Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no whole hello within {} s", HELLO_TIMEOUT.as_secs()),
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        io::Read::read(&mut &*self.stream, buf)
    }
}

/// Takes a job's hello and, if it fits, attaches it: its threads start.
fn attach(sh: &Arc<Shared>, link: Arc<Link>) -> io::Result<()> {
    link.stream.set_nonblocking(false)?;
    let mut hello_bytes = Until {
        stream: &link.stream,
        until: Instant::now() + HELLO_TIMEOUT,
    };
    let hello_max = hello_frame_max(sh.ds.index.samples());
    let hello = match read_frame_within(&mut hello_bytes, |_| Ok(hello_max)) {
        Ok(Some((kind, body))) => match ToCache::decode(kind, &body) {
            Ok(ToCache::Hello(h)) => h,
            Ok(_) => return refuse(sh, &link, "expected a hello first".into()),
            Err(why) => return refuse(sh, &link, format!("a malformed hello: {why}")),
        },
        Ok(None) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return refuse(sh, &link, format!("a malformed hello: {e}"));
        }
        Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
            return refuse(
                sh,
                &link,
                format!("no whole hello within {} s", HELLO_TIMEOUT.as_secs()),
            );
        }
        Err(e) => return Err(e),
    };
    let served = match check_hello(sh, &hello) {
        Ok(served) => served,
        Err(why) => return refuse(sh, &link, why),
    };
    if sh.stop.load(Ordering::SeqCst) {
        return refuse(sh, &link, format!("the cache at {} is stopping", sh.socket.display()));
    }
    let id = {
        let mut s = lock(&sh.state);
        let id = s.next_job;
        s.next_job += 1;
        s.add_job(id, &hello, served);
        s.report.jobs_attached += 1;
        id
    };
    let welcome = ToJob::Welcome {
        memory_len: sh.memory.size() as u64,
    }
    .encode();
    if let Err(e) = send_with_fd(link.stream.as_raw_fd(), &welcome, sh.memfd.as_raw_fd()) {
        lock(&sh.state).remove_job(id);
        return Err(e);
    }
    link.stream.set_read_timeout(None)?;
    let (tx, rx) = mpsc::channel::<()>();
    let (s1, l1) = (sh.clone(), link.clone());
    let (samples, batch_size) = (sh.ds.index.samples(), hello.batch_size);
    let frame_max = move |kind| attached_frame_max(samples, batch_size, kind);
    let taker = std::thread::Builder::new()
        .name(format!("brand-cache-job{id}"))
        .spawn(move || take_messages(&s1, &l1, id, frame_max, tx))?;
    let (s2, l2) = (sh.clone(), link.clone());
    let server = std::thread::Builder::new()
        .name(format!("brand-cache-serve{id}"))
        .spawn(move || serve_requests(&s2, &l2, id, rx))?;
    let mut links = sh.links.lock().unwrap_or_else(|e| e.into_inner());
    links.retain(|(l, threads)| {
        // Forget the links of jobs gone (their threads have ended).
        !(threads.iter().all(|t| t.is_finished()) && Arc::strong_count(l) == 1)
    });
    links.push((link, vec![taker, server]));
    sh.changed.notify_all();
    Ok(())
}

fn refuse(sh: &Shared, link: &Link, why: String) -> io::Result<()> {
    lock(&sh.state).report.jobs_refused += 1;
    link.send(&ToJob::Refused(why))
}

/// The samples the job served already, or why it cannot attach.
fn check_hello(sh: &Shared, h: &Hello) -> std::result::Result<IdBits, String> {
    let name = format!("the cache at {} ({})", sh.socket.display(), sh.ds.dir().display());
    h.check(&sh.digest, &name, sh.memory.size() as u64, |size| {
        batch_bytes(&sh.ds, size)
    })
}

/// About what a batch of `size` samples takes in the shared memory.
fn batch_bytes(ds: &Dataset, size: u64) -> u64 {
    let n = ds.index.samples();
    let mean = ds.index.raw_lens().map(|l| footprint(l as u64)).sum::<u64>() / n.max(1);
    size.min(n).saturating_mul(mean)
}

/// A job's messages (frames of at most `frame_max` bytes): releases are
/// applied at once, requests go to its server thread. The end of the
/// stream (the job closed, exited or was killed) detaches it; so does a
/// message that is wrong, after a `Failed` answer naming what was wrong.
fn take_messages(
    sh: &Shared,
    link: &Link,
    id: u64,
    frame_max: impl Fn(u8) -> std::result::Result<usize, String>,
    requests: mpsc::Sender<()>,
) {
    loop {
        let frame = match read_frame_within(&mut &link.stream, &frame_max) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let _ = link.send(&ToJob::Failed(format!("the job sent {e}")));
                break;
            }
            Err(_) => break,
        };
        let wrong = match ToCache::decode(frame.0, &frame.1) {
            Ok(ToCache::Next) if link.asking.swap(true, Ordering::SeqCst) => {
                Some("the job sent a request before it had the answer to its last".into())
            }
            Ok(ToCache::Next) => {
                if requests.send(()).is_err() {
                    break;
                }
                None
            }
            Ok(ToCache::Release(ids)) => {
                let mut s = lock(&sh.state);
                let r = s.release(&sh.ds, id, &ids);
                drop(s);
                sh.changed.notify_all();
                r.err()
            }
            Ok(ToCache::Hello(_)) => Some("the job sent a second hello (it is attached already)".into()),
            Err(why) => Some(format!("the job sent a malformed message: {why}")),
        };
        if let Some(why) = wrong {
            let _ = link.send(&ToJob::Failed(why));
            break;
        }
    }
    let _ = link.stream.shutdown(std::net::Shutdown::Both);
    lock(&sh.state).remove_job(id);
    sh.changed.notify_all();
}

fn serve_requests(sh: &Shared, link: &Link, id: u64, requests: mpsc::Receiver<()>) {
    for () in requests {
        let reply = next_batch(sh, id);
        // Answered: the job may ask again once it has this.
        link.asking.store(false, Ordering::SeqCst);
        let end = matches!(reply, None | Some(ToJob::Failed(_)));
        if let Some(r) = reply
            && link.send(&r).is_err()
        {
            break;
        }
        if end {
            let _ = link.stream.shutdown(std::net::Shutdown::Both);
            break;
        }
    }
}

/// The job's next batch, waiting for reads; `None` if the job is gone.
fn next_batch(sh: &Shared, id: u64) -> Option<ToJob> {
    let mut s = lock(&sh.state);
    let mut seen = (s.progress, Instant::now());
    loop {
        if let Some(why) = s.stopping.clone().or_else(|| s.failed.clone()) {
            return Some(ToJob::Failed(why));
        }
        let State {
            jobs,
            samples,
            present,
            bad,
            skip_corrupt,
            ..
        } = &mut *s;
        let job = jobs.get_mut(&id)?;
        match pick(job, samples, present, bad, *skip_corrupt) {
            Ok(Some((ids, skipped))) => {
                job.waiting = false;
                let batch = s.serve(&sh.ds, id, &ids, &skipped);
                drop(s);
                sh.changed.notify_all();
                return Some(batch);
            }
            Ok(None) => {}
            Err(why) => return Some(ToJob::Failed(why)),
        }
        if !job.waiting {
            job.waiting = true;
            sh.changed.notify_all();
        }
        if s.deadlocked(&sh.ds) {
            return Some(ToJob::Failed(s.deadlock(&sh.ds)));
        }
        if s.progress != seen.0 {
            seen = (s.progress, Instant::now());
        } else if seen.1.elapsed() > STUCK_AFTER {
            return Some(ToJob::Failed(format!(
                "no progress for {} s: the cache's memory ({} bytes, {} in jobs' live batches) cannot take the samples this job lacks; start the cache with more --memory",
                STUCK_AFTER.as_secs(),
                s.arena.size(),
                s.leased_bytes(&sh.ds)
            )));
        }
        s = sh
            .changed
            .wait_timeout(s, Duration::from_millis(100))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// The job's next batch, drawn at random from the samples in memory it has
/// not served, and the corrupt records it skips (with `skip`, every one in
/// memory it has not served): `None` while fewer than a batch (or the
/// epoch's rest) are there and none is skipped; an error if a drawn sample
/// is bad and not skipped.
type Picked = (Vec<u32>, Vec<u32>);

fn pick(
    job: &mut Job,
    samples: &[Sample],
    present: &[u32],
    bad: &HashMap<u32, Bad>,
    skip: bool,
) -> std::result::Result<Option<Picked>, String> {
    let n = samples.len() as u64;
    let (skipped, mut open): (Vec<u32>, Vec<u32>) = present
        .iter()
        .copied()
        .filter(|&i| !job.has_served(i))
        .partition(|i| skip && bad.get(i).is_some_and(|b| b.corrupt));
    let rest = n - job.served.len() - skipped.len() as u64;
    let want = (job.batch_size as u64).min(rest) as usize;
    if open.len() < want {
        return Ok((!skipped.is_empty()).then_some((Vec::new(), skipped)));
    }
    for k in 0..want {
        let j = k + job.rng.below((open.len() - k) as u64) as usize;
        open.swap(k, j);
    }
    open.truncate(want);
    if let Some(b) = open.iter().find_map(|i| bad.get(i)) {
        return Err(b.why.clone());
    }
    Ok(Some((open, skipped)))
}

impl State {
    /// One more job needs `id`.
    fn need_more(&mut self, id: u32) {
        let s = &mut self.samples[id as usize];
        s.need += 1;
        if s.at == Where::Absent && s.need == 1 {
            self.wanted += 1;
        }
    }

    fn need_less(&mut self, id: u32) {
        let s = &mut self.samples[id as usize];
        s.need -= 1;
        if s.at == Where::Absent && s.need == 0 {
            self.wanted -= 1;
        }
    }

    /// Attaches job `id`, which `h` introduced and which served `served`.
    fn add_job(&mut self, id: u64, h: &Hello, served: IdBits) {
        let n = self.samples.len();
        let mut job = Job {
            epoch: h.epoch,
            served,
            rng: Prng::stream(h.seed, &[0xcac4e, h.epoch]),
            seed: h.seed,
            batch_size: h.batch_size.max(1) as usize,
            waiting: false,
            leases: HashMap::new(),
            held_bytes: 0,
            live_batches: 0,
        };
        if job.served.len() == n as u64 {
            // Saved after the epoch's last sample: the next one starts.
            job.served.clear();
            job.epoch += 1;
            job.rng = Prng::stream(h.seed, &[0xcac4e, job.epoch]);
        }
        for i in 0..n as u32 {
            if !job.has_served(i) {
                self.need_more(i);
            }
        }
        self.jobs.insert(id, job);
    }

    /// The job is gone: what it still needed and held is let go.
    fn remove_job(&mut self, id: u64) {
        let Some(job) = self.jobs.remove(&id) else {
            return;
        };
        for i in 0..self.samples.len() as u32 {
            if !job.has_served(i) {
                self.need_less(i);
            }
        }
        for (i, k) in job.leases {
            self.samples[i as usize].leases -= k;
        }
        self.progress += 1;
    }

    /// The job let go of these samples (one batch). Every one must be
    /// held by the job (else nothing is let go, and the error names the
    /// first that is not): a job releases only what it was handed.
    fn release(&mut self, ds: &Dataset, id: u64, ids: &[u32]) -> std::result::Result<(), String> {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Ok(());
        };
        let mut count: HashMap<u32, u32> = HashMap::new();
        for &i in ids {
            let k = count.entry(i).or_insert(0);
            *k += 1;
            if job.leases.get(&i).copied().unwrap_or(0) < *k {
                return Err(format!(
                    "the job sent a release of sample {i}, which it does not hold{}",
                    if *k > 1 { " that many times" } else { "" }
                ));
            }
        }
        for &i in ids {
            if let Some(k) = job.leases.get_mut(&i) {
                *k -= 1;
                if *k == 0 {
                    job.leases.remove(&i);
                }
                self.samples[i as usize].leases -= 1;
                job.held_bytes = job
                    .held_bytes
                    .saturating_sub(footprint(ds.index.raw_len(i as u64) as u64));
            }
        }
        job.live_batches = job.live_batches.saturating_sub(1);
        self.progress += 1;
        Ok(())
    }

    /// Hands `ids` (in memory, unserved by the job) to job `id`, and marks
    /// `skipped` (corrupt, left out) served for it.
    fn serve(&mut self, ds: &Dataset, id: u64, ids: &[u32], skipped: &[u32]) -> ToJob {
        let mut placed = Vec::with_capacity(ids.len());
        for &i in ids {
            let Where::Resident(offset) = self.samples[i as usize].at else {
                continue;
            };
            placed.push(Placed {
                id: i,
                offset,
                len: ds.index.raw_len(i as u64),
            });
            self.samples[i as usize].leases += 1;
            self.need_less(i);
        }
        for &i in skipped {
            self.need_less(i);
        }
        let n = self.samples.len() as u64;
        let Some(job) = self.jobs.get_mut(&id) else {
            return ToJob::Failed("internal: job gone while served".into());
        };
        let epoch = job.epoch;
        for p in &placed {
            job.served.insert(p.id as u64);
            *job.leases.entry(p.id).or_insert(0) += 1;
            job.held_bytes += footprint(p.len as u64);
        }
        for &i in skipped {
            job.served.insert(i as u64);
        }
        if !placed.is_empty() {
            job.live_batches += 1;
        }
        self.report.samples_served += placed.len() as u64;
        if job.served.len() == n {
            // The job's next epoch starts now: it needs every sample again.
            job.epoch += 1;
            job.served.clear();
            job.rng = Prng::stream(job.seed, &[0xcac4e, job.epoch]);
            for i in 0..n as u32 {
                self.need_more(i);
            }
        }
        ToJob::Batch {
            epoch,
            samples: placed,
            skipped: skipped.to_vec(),
        }
    }

    fn leased_bytes(&self, ds: &Dataset) -> u64 {
        self.present
            .iter()
            .filter(|&&i| self.samples[i as usize].leases > 0)
            .map(|&i| footprint(ds.index.raw_len(i as u64) as u64))
            .sum()
    }

    /// Every job waits for a batch, and the memory their batches leave
    /// cannot hold the next batch of any of them: nobody can go on until
    /// one lets go, and each waits instead.
    fn deadlocked(&self, ds: &Dataset) -> bool {
        if self.jobs.is_empty() || !self.jobs.values().all(|j| j.waiting) {
            return false;
        }
        let room = self.arena.size().saturating_sub(self.leased_bytes(ds));
        let n = self.samples.len() as u64;
        self.jobs.values().all(|j| {
            let want = (j.batch_size as u64).min(n - j.served.len());
            batch_bytes(ds, want) > room
        })
    }

    /// Why every job waits for ever: the message a deadlock fails them with.
    fn deadlock(&self, ds: &Dataset) -> String {
        let held: u64 = self.jobs.values().map(|j| j.held_bytes).sum();
        let batches: u32 = self.jobs.values().map(|j| j.live_batches).sum();
        let most = self.jobs.values().map(|j| j.live_batches).max().unwrap_or(0);
        let need: u64 = self
            .jobs
            .values()
            .map(|j| (j.live_batches as u64 + 1) * batch_bytes(ds, j.batch_size as u64))
            .sum();
        format!(
            "the jobs attached to the cache ({}) hold {batches} batches ({held} bytes, up to {most} per job) and each waits for another: the cache's memory ({} bytes) cannot take what they lack. {} such jobs need about {need} bytes (what they hold and one batch more): start the cache with more --memory, use a smaller batch_size or keep fewer batches",
            self.jobs.len(),
            self.arena.size(),
            self.jobs.len()
        )
    }

    /// `id` leaves memory (or its pending read is given up): jobs that need
    /// it will have it read again.
    fn make_absent(&mut self, ds: &Dataset, id: u32) {
        let s = self.samples[id as usize];
        if let Where::Resident(at) = s.at {
            self.arena.free(at, ds.index.raw_len(id as u64) as u64);
        }
        if matches!(s.at, Where::Resident(_) | Where::Bad) {
            let slot = s.slot as usize;
            self.present.swap_remove(slot);
            if let Some(&moved) = self.present.get(slot) {
                self.samples[moved as usize].slot = slot as u32;
            }
            self.bad.remove(&id);
        }
        self.samples[id as usize].at = Where::Absent;
        if s.need > 0 {
            self.wanted += 1;
        }
    }

    fn make_present(&mut self, id: u32, at: Where) {
        self.samples[id as usize].at = at;
        self.samples[id as usize].slot = self.present.len() as u32;
        self.present.push(id);
    }

    /// Records of `chunk` in `mask` that some job needs and memory lacks.
    fn lacking(&self, ds: &Dataset, chunk: u64, mask: u64) -> u64 {
        let first = chunk * ds.index.chunk_size() as u64;
        let mut m = mask;
        let mut lacking = 0;
        while m != 0 {
            let r = m.trailing_zeros();
            m &= m - 1;
            let s = &self.samples[(first + r as u64) as usize];
            if s.at == Where::Absent && s.need > 0 {
                lacking |= 1 << r;
            }
        }
        lacking
    }

    /// The next read of the fill's plan with records some job lacks (planned
    /// reads none lacks are passed over): the chunk and those records; the
    /// cursor stays on it until it is read whole. `None` if no job lacks
    /// anything.
    fn choose(&mut self, ds: &Dataset) -> Option<(u64, u64)> {
        if self.wanted == 0 {
            return None;
        }
        // A plan epoch reads every sample, each read at least one record:
        // within 2 N steps every lacking sample is passed.
        for _ in 0..2 * self.samples.len() + 2 {
            let ((chunk, mask), turned) = self.fill.current();
            if turned {
                self.report.fill_epochs += 1;
            }
            let lacking = self.lacking(ds, chunk, mask);
            if lacking != 0 {
                return Some((chunk, lacking));
            }
            self.fill.advance();
        }
        None
    }

    /// Frees room for `bytes` more: first samples no job needs; when `force`
    /// (a job waits), then samples no waiting job needs, fewest needers
    /// first, then the rest. Never a sample of a live batch. False if the
    /// room cannot be made.
    fn make_room(&mut self, ds: &Dataset, bytes: u64, force: bool) -> bool {
        if self.free() >= bytes {
            return true;
        }
        for (_, need, i) in self.victims(force) {
            if self.free() >= bytes {
                break;
            }
            self.drop_sample(ds, i, need);
        }
        self.free() >= bytes
    }

    fn free(&self) -> u64 {
        self.arena.available().saturating_sub(self.reserved)
    }

    /// The records of `mask` (of `chunk`) to read now: all of them if room
    /// can be made; when `force` and it cannot, the first that fit (so a
    /// waiting job gets what little room is left, rather than nothing).
    fn room_for(&mut self, ds: &Dataset, chunk: u64, mask: u64, force: bool) -> Option<u64> {
        let first = chunk * ds.index.chunk_size() as u64;
        let size = |r: u32| footprint(ds.index.raw_len(first + r as u64) as u64);
        let mut bytes = 0;
        let mut m = mask;
        while m != 0 {
            bytes += size(m.trailing_zeros());
            m &= m - 1;
        }
        if self.make_room(ds, bytes, force) {
            return Some(mask);
        }
        if !force {
            return None;
        }
        let (mut fit, mut room) = (0u64, self.free());
        let mut m = mask;
        while m != 0 {
            let r = m.trailing_zeros();
            m &= m - 1;
            if size(r) <= room {
                room -= size(r);
                fit |= 1 << r;
            }
        }
        (fit != 0).then_some(fit)
    }

    /// Room for a sample of `len` bytes: its reservation is free in bytes,
    /// but the free bytes may be scattered; then victims go (in
    /// [`make_room`](Self::make_room)'s order) until a region fits.
    fn place(&mut self, ds: &Dataset, len: u64) -> Option<u64> {
        if let Some(at) = self.arena.alloc(len) {
            return Some(at);
        }
        for (_, need, i) in self.victims(true) {
            self.drop_sample(ds, i, need);
            if let Some(at) = self.arena.alloc(len) {
                return Some(at);
            }
        }
        None
    }

    /// Samples that may leave memory, in the order they should: (waiting
    /// jobs that need it, jobs that need it, id).
    fn victims(&self, force: bool) -> Vec<(u32, u32, u32)> {
        let waiting: Vec<&Job> = self.jobs.values().filter(|j| j.waiting).collect();
        let mut victims: Vec<(u32, u32, u32)> = self
            .present
            .iter()
            .filter(|&&i| {
                let s = &self.samples[i as usize];
                s.leases == 0 && (force || s.need == 0)
            })
            .map(|&i| {
                let wanted = waiting.iter().filter(|j| !j.has_served(i)).count() as u32;
                (wanted, self.samples[i as usize].need, i)
            })
            .collect();
        victims.sort_unstable();
        victims
    }

    fn drop_sample(&mut self, ds: &Dataset, i: u32, need: u32) {
        if need > 0 {
            self.report.dropped_needed += 1;
        } else {
            self.report.dropped_idle += 1;
        }
        self.make_absent(ds, i);
    }

    /// Marks the records of `chunk` in `mask` as being read.
    fn reading(&mut self, ds: &Dataset, chunk: u64, mask: u64) -> u64 {
        let first = chunk * ds.index.chunk_size() as u64;
        let mut bytes = 0;
        for r in 0..64 {
            if mask >> r & 1 == 0 {
                continue;
            }
            let id = (first + r) as u32;
            if self.samples[id as usize].need > 0 {
                self.wanted -= 1;
            }
            self.samples[id as usize].at = Where::Pending;
            bytes += footprint(ds.index.raw_len(id as u64) as u64);
        }
        self.reserved += bytes;
        bytes
    }

    /// Takes a finished read in: each record into the shared memory (the
    /// samples it was asked for are its extent's records).
    fn accept(&mut self, sh: &Shared, c: Completion) {
        let ds = &sh.ds;
        self.report.bytes_read += c.extent.len;
        self.progress += 1;
        let ids = c.extent.records.iter().map(|&(id, _)| id as u32);
        for id in ids.clone() {
            self.reserved -= footprint(ds.index.raw_len(id as u64) as u64);
        }
        let records = match c.result {
            Ok(r) => r,
            Err(e) => {
                for id in ids {
                    self.make_present(id, Where::Bad);
                    self.bad.insert(
                        id,
                        Bad {
                            why: e.to_string(),
                            corrupt: false,
                        },
                    );
                }
                return;
            }
        };
        for (id, r) in records {
            let id = id as u32;
            self.report.samples_read += 1;
            let bytes = match r {
                Ok(b) => b,
                Err(e) => {
                    self.report.corrupt_records += 1;
                    if self.skip_corrupt {
                        tracing::warn!("skipping a corrupt record for every job: {e}");
                    }
                    self.make_present(id, Where::Bad);
                    self.bad.insert(
                        id,
                        Bad {
                            why: e.to_string(),
                            corrupt: true,
                        },
                    );
                    continue;
                }
            };
            match self.place(ds, bytes.len() as u64) {
                // SAFETY: the region was just allocated: no job has been
                // told of it since it was freed.
                Some(at) if unsafe { sh.memory.write(at, &bytes) } => {
                    self.make_present(id, Where::Resident(at));
                }
                Some(at) => {
                    self.arena.free(at, bytes.len() as u64);
                    self.make_absent(ds, id);
                }
                // No room (fragmented, or held by batches): read it again later.
                None => self.make_absent(ds, id),
            }
        }
        self.report.peak_used_bytes = self.report.peak_used_bytes.max(self.arena.used());
    }
}

fn read_loop(sh: &Shared, mut session: ReadSession<()>, depth: usize, readahead: u64) {
    loop {
        {
            let mut s = lock(&sh.state);
            if s.stopping.is_some() {
                break;
            }
            while s.failed.is_none() && session.in_flight() < depth && session.in_flight_read_bytes() < readahead {
                let Some((chunk, lacking)) = s.choose(&sh.ds) else {
                    break;
                };
                let force = s.jobs.values().any(|j| j.waiting) && session.in_flight() == 0;
                let Some(mask) = s.room_for(&sh.ds, chunk, lacking, force) else {
                    break;
                };
                s.reading(&sh.ds, chunk, mask);
                if mask == lacking {
                    s.fill.advance();
                }
                s.report.reads_issued += 1;
                for ext in session.extents(chunk, mask) {
                    if let Err(e) = session.submit(ext, ()) {
                        s.failed = Some(format!("the cache's reads failed: {e}"));
                        break;
                    }
                }
            }
            if session.in_flight() == 0 {
                let _ = sh.changed.wait_timeout(s, Duration::from_millis(100));
                continue;
            }
        }
        match session.recv() {
            Ok(((), c)) => {
                let mut s = lock(&sh.state);
                s.accept(sh, c);
            }
            Err(e) => {
                lock(&sh.state).failed = Some(format!("the cache's reads failed: {e}"));
            }
        }
        sh.changed.notify_all();
    }
    let _ = session.drain();
}
