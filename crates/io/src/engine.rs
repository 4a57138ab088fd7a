//! The reactor: a `tokio-uring` runtime on its own thread that executes
//! extent reads with O_DIRECT, up to `queue_depth` at a time, verifies every
//! record it was asked for (crc32c, zstd) and hands the samples back.
//!
//! The engine never decides what to read: jobs arrive in plan order from the
//! loader, and completions go back tagged, so the loader matches them to
//! plan events whatever order the device finishes in.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_uring::buf::BoundedBuf;
use tokio_uring::buf::fixed::{FixedBuf, FixedBufPool};
use tokio_uring::fs::{File, OpenOptions};

use brand_format::buffer::AlignedBuf;

use crate::page_buf::PageBuf;
use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::Extent;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Reads in flight at once.
    pub queue_depth: usize,
    /// Try O_DIRECT (falls back to buffered reads, with one warning, where
    /// the filesystem refuses it).
    pub direct: bool,
    /// Check every record's crc32c.
    pub verify: bool,
    /// Read into buffers registered with the ring (io_uring fixed buffers:
    /// about half the CPU per read). Reads larger than [`FIXED_BUF_BYTES`],
    /// or beyond the registered count, use ordinary aligned buffers.
    pub fixed_buffers: bool,
}

/// Size of each registered buffer: holds any sparse record read of a
/// typical image dataset; whole chunks are larger and go unregistered.
pub const FIXED_BUF_BYTES: usize = 512 << 10;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            queue_depth: 32,
            direct: true,
            verify: true,
            fixed_buffers: true,
        }
    }
}

/// One extent to read; `tag` comes back with its completion.
pub struct Job {
    pub tag: u64,
    pub extent: Extent,
}

/// A finished job: the samples it carried, or the error that stopped it.
pub struct Completion {
    pub tag: u64,
    pub bytes_read: u64,
    pub result: Result<Vec<(u64, AlignedBuf)>>,
}

pub struct Engine {
    jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
    done: crossbeam_channel::Receiver<Completion>,
    thread: Option<std::thread::JoinHandle<()>>,
    buffered_fallback: Arc<AtomicBool>,
    fixed_in_use: Arc<AtomicBool>,
}

impl Engine {
    /// Starts the reactor thread. Fails if io_uring is unavailable.
    pub fn start(ds: Arc<Dataset>, cfg: EngineConfig) -> Result<Self> {
        if cfg.queue_depth == 0 {
            return Err(Error::config("queue depth must be at least 1"));
        }
        let (job_tx, job_rx) = tokio::sync::mpsc::unbounded_channel();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let fallback = Arc::new(AtomicBool::new(false));
        let fallback2 = fallback.clone();
        let fixed_in_use = Arc::new(AtomicBool::new(false));
        let fixed2 = fixed_in_use.clone();
        let thread = std::thread::Builder::new()
            .name("brand-io".into())
            .spawn(move || {
                let entries = (cfg.queue_depth * 2).next_power_of_two().clamp(8, 4096) as u32;
                let rt = match tokio_uring::Runtime::new(tokio_uring::builder().entries(entries)) {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                // Built inside the runtime: registering fixed buffers needs its context.
                rt.block_on(async move {
                    let reactor = Reactor::new(ds, cfg, done_tx, fallback2);
                    fixed2.store(reactor.fixed.is_some(), Ordering::Relaxed);
                    let _ = ready_tx.send(Ok(()));
                    reactor.run(job_rx).await
                });
            })
            .map_err(|e| Error::io("<brand-io thread>", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(Error::io("<io_uring>", e));
            }
            Err(_) => return Err(Error::config("the io thread died while starting")),
        }
        Ok(Engine {
            jobs: Some(job_tx),
            done: done_rx,
            thread: Some(thread),
            buffered_fallback: fallback,
            fixed_in_use,
        })
    }

    pub fn submit(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| Error::config("the io engine has stopped"))
    }

    /// The next completion, waiting for it.
    pub fn recv(&self) -> Result<Completion> {
        self.done.recv().map_err(|_| Error::config("the io engine has stopped"))
    }

    /// Whether reads use buffers registered with the ring.
    pub fn fixed_buffers_in_use(&self) -> bool {
        self.fixed_in_use.load(Ordering::Relaxed)
    }

    /// Whether reads fell back from O_DIRECT to buffered I/O.
    pub fn buffered_fallback(&self) -> bool {
        self.buffered_fallback.load(Ordering::Relaxed)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the job channel ends the reactor once in-flight reads finish.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Reactor {
    ds: Arc<Dataset>,
    cfg: EngineConfig,
    done: crossbeam_channel::Sender<Completion>,
    fallback: Arc<AtomicBool>,
    files: RefCell<HashMap<u32, Rc<File>>>,
    pool: RefCell<Vec<PageBuf>>,
    fixed: Option<FixedBufPool<PageBuf>>,
}

/// A read's destination: a registered buffer or an ordinary aligned one.
enum ReadBuf {
    Fixed(FixedBuf),
    Plain(PageBuf),
}

impl ReadBuf {
    /// Reads into `[from, to)` of the buffer at `pos`.
    async fn read(self, file: &File, from: usize, to: usize, pos: u64) -> (Self, std::io::Result<usize>) {
        match self {
            ReadBuf::Fixed(b) => {
                let (res, slice) = file.read_fixed_at(b.slice(from..to), pos).await;
                (ReadBuf::Fixed(slice.into_inner()), res)
            }
            ReadBuf::Plain(b) => {
                let (res, slice) = file.read_at(b.slice(from..to), pos).await;
                (ReadBuf::Plain(slice.into_inner()), res)
            }
        }
    }

    fn bytes(&self, from: usize, len: usize) -> &[u8] {
        match self {
            ReadBuf::Fixed(b) => &b[from..from + len],
            ReadBuf::Plain(b) => &b.as_slice()[from..from + len],
        }
    }
}

impl Reactor {
    fn new(
        ds: Arc<Dataset>,
        cfg: EngineConfig,
        done: crossbeam_channel::Sender<Completion>,
        fallback: Arc<AtomicBool>,
    ) -> Rc<Self> {
        let fixed = cfg
            .fixed_buffers
            .then(|| Self::register_fixed(cfg.queue_depth))
            .flatten();
        Rc::new(Reactor {
            ds,
            cfg,
            done,
            fallback,
            files: RefCell::default(),
            pool: RefCell::default(),
            fixed,
        })
    }

    /// Registers one buffer per queue slot (no more reads are ever in
    /// flight); None, with a warning, where the kernel refuses (beyond
    /// RLIMIT_MEMLOCK without CAP_IPC_LOCK).
    fn register_fixed(queue_depth: usize) -> Option<FixedBufPool<PageBuf>> {
        let count = queue_depth.min(1024);
        let pool = FixedBufPool::new((0..count).map(|_| PageBuf::new(FIXED_BUF_BYTES)));
        match pool.register() {
            Ok(()) => Some(pool),
            Err(e) => {
                tracing::warn!("io_uring fixed buffers unavailable ({e}); using ordinary buffers");
                None
            }
        }
    }

    async fn run(self: Rc<Self>, mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>) {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.cfg.queue_depth));
        while let Some(job) = jobs.recv().await {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break;
            };
            let me = self.clone();
            tokio_uring::spawn(async move {
                let completion = me.execute(job).await;
                let _ = me.done.send(completion);
                drop(permit);
            });
        }
        // Wait for the reads still in flight before the runtime goes away.
        let _ = slots.acquire_many(self.cfg.queue_depth as u32).await;
    }

    async fn file(&self, segment: u32, direct: bool) -> std::io::Result<Rc<File>> {
        if let Some(f) = self.files.borrow().get(&segment) {
            return Ok(f.clone());
        }
        let path = self.ds.segment_path(segment);
        let mut opts = OpenOptions::new();
        opts.read(true);
        let file = if direct && !self.fallback.load(Ordering::Relaxed) {
            use std::os::unix::fs::OpenOptionsExt;
            opts.custom_flags(libc::O_DIRECT);
            match opts.open(&path).await {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.fall_back(&path);
                    OpenOptions::new().read(true).open(&path).await?
                }
                Err(e) => return Err(e),
            }
        } else {
            opts.open(&path).await?
        };
        let file = Rc::new(file);
        self.files.borrow_mut().insert(segment, file.clone());
        Ok(file)
    }

    fn fall_back(&self, path: &std::path::Path) {
        if !self.fallback.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "{}: O_DIRECT refused by the filesystem; using buffered reads",
                path.display()
            );
        }
    }

    /// A read buffer of at least `len` bytes. Sizes come in power-of-two
    /// classes (from 64 KiB) so recycled buffers fit later reads.
    fn take_buffer(&self, len: usize) -> PageBuf {
        let class = len.max(64 << 10).next_power_of_two();
        let mut pool = self.pool.borrow_mut();
        match pool.iter().position(|b| b.capacity() == class) {
            Some(i) => pool.swap_remove(i),
            None => PageBuf::new(class),
        }
    }

    fn return_buffer(&self, mut buf: PageBuf) {
        let mut pool = self.pool.borrow_mut();
        // At most two buffers per queue slot are kept; others are freed.
        if pool.len() < 2 * self.cfg.queue_depth {
            buf.clear();
            pool.push(buf);
        }
    }

    async fn execute(&self, job: Job) -> Completion {
        use tracing::Instrument;
        let ext = &job.extent;
        let span = tracing::trace_span!("read", segment = ext.segment, offset = ext.offset, len = ext.len);
        self.execute_in_span(&job).instrument(span).await
    }

    async fn execute_in_span(&self, job: &Job) -> Completion {
        let ext = &job.extent;
        let len = ext.len as usize;
        let fixed = (len <= FIXED_BUF_BYTES)
            .then(|| self.fixed.as_ref()?.try_next(FIXED_BUF_BYTES))
            .flatten();
        let buf = match fixed {
            Some(b) => ReadBuf::Fixed(b),
            None => ReadBuf::Plain(self.take_buffer(len)),
        };
        let (buf, result) = self.read_exact(ext, buf, len).await;
        let result = result.and_then(|()| {
            ext.records
                .iter()
                .map(|&(id, at)| {
                    let stored_len = self.ds.index.stored_len[id as usize] as usize;
                    self.ds
                        .decode(id, buf.bytes(at as usize, stored_len), self.cfg.verify)
                        .map(|b| (id, b))
                })
                .collect()
        });
        // A fixed buffer goes back to its pool when dropped.
        if let ReadBuf::Plain(b) = buf {
            self.return_buffer(b);
        }
        Completion {
            tag: job.tag,
            bytes_read: ext.len,
            result,
        }
    }

    /// Reads `len` bytes of the extent into `buf`, retrying short reads and
    /// falling back to buffered I/O if O_DIRECT is refused at read time.
    async fn read_exact(&self, ext: &Extent, mut buf: ReadBuf, len: usize) -> (ReadBuf, Result<()>) {
        let mut done = 0usize;
        let mut direct = self.cfg.direct;
        while done < len {
            let file = match self.file(ext.segment, direct).await {
                Ok(f) => f,
                Err(e) => return (buf, Err(Error::io(self.ds.segment_path(ext.segment), e))),
            };
            let (back, res) = buf.read(&file, done, len, ext.offset + done as u64).await;
            buf = back;
            match res {
                Ok(0) => return (buf, Err(self.short_read(ext, done))),
                Ok(n) => done += n,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && direct => {
                    self.fall_back(&self.ds.segment_path(ext.segment));
                    self.files.borrow_mut().remove(&ext.segment);
                    direct = false;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return (buf, Err(self.read_error(ext, done, e.to_string()))),
            }
        }
        (buf, Ok(()))
    }

    fn read_error(&self, ext: &Extent, done: usize, what: String) -> Error {
        let sample = ext.records.first().map(|r| r.0).unwrap_or(0);
        Error::Corrupt {
            segment: self.ds.segment_path(ext.segment),
            chunk: self.ds.index.chunk_of(sample),
            offset: ext.offset + done as u64,
            sample,
            what,
        }
    }

    fn short_read(&self, ext: &Extent, done: usize) -> Error {
        self.read_error(
            ext,
            done,
            format!(
                "segment ends at byte {} (truncated?): needed {} bytes",
                ext.offset + done as u64,
                ext.len
            ),
        )
    }
}
