//! The io_uring backend: `tokio-uring` reactors (up to two rings, each on
//! its own thread) submit and complete reads and check the uncompressed
//! records they read; compressed ones are verified and decompressed by a
//! small pool of decode threads (`decode_threads`), or by the reactor that
//! read them when the pool has none (the default where no core is left
//! beside the reactors). Each reactor keeps its own file cache and buffer
//! pool (no lock per read). Before any ring starts, one NOP on a ring of
//! its own checks that submissions are allowed, not only ring setup.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_uring::buf::BoundedBuf;
use tokio_uring::buf::fixed::{FixedBuf, FixedBufPool};
use tokio_uring::fs::File;

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::decode::ExtentBytes;
use brand_format::error::Error;
use brand_format::extents::Extent;

use crate::config::FIXED_BUF_BYTES;
use crate::files::FileCache;
use crate::job::{Completion, Job, JobSender, RecordResult, Shared, Started};
use crate::page_buf::PageBuf;
use crate::pool::BufferPool;
use crate::read::{ReadLoop, Step, reads_in_place};

/// Why the backend did not start: the call that failed and how, and the
/// settings back for another backend (None once some of its threads ran).
pub(crate) struct NotStarted {
    pub call: &'static str,
    pub error: std::io::Error,
    pub shared: Option<Shared>,
}

impl NotStarted {
    /// The error to report, naming the call that failed.
    pub fn into_error(self) -> Error {
        let what = format!("{}: {}", self.call, self.error);
        Error::io("<io_uring>", std::io::Error::new(self.error.kind(), what))
    }
}

/// Whether an io_uring call's error means "not allowed here" (seccomp,
/// gVisor, `kernel.io_uring_disabled`), as opposed to a real failure.
pub(crate) fn refused(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS | libc::EACCES))
}

/// Checks that this process may submit to a ring, not only set one up: a
/// seccomp profile may refuse io_uring_enter alone, and then no read would
/// ever complete (found out only at io_timeout). A NOP on a ring of its
/// own, waited for: it completes within the call.
fn check_submissions() -> Result<(), (&'static str, std::io::Error)> {
    let mut ring = io_uring::IoUring::new(1).map_err(|e| ("io_uring_setup", e))?;
    let nop = io_uring::opcode::Nop::new().build();
    // SAFETY: a NOP refers to no buffer or file that would have to outlive it.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| ("io_uring_enter", std::io::Error::other("an empty queue refused a NOP")))?;
    ring.submit_and_wait(1).map_err(|e| ("io_uring_enter", e))?;
    Ok(())
}

/// Starts the reactors; on failure hands `shared` back (for a fallback backend).
pub(crate) fn start(shared: Shared) -> Result<Started, NotStarted> {
    if let Err((call, error)) = check_submissions() {
        return Err(NotStarted {
            call,
            error,
            shared: Some(shared),
        });
    }
    let (exit_tx, exit_rx) = crossbeam_channel::bounded::<()>(0);
    // Only compressed records go to the pool: a reactor checks an
    // uncompressed record itself, while its bytes are still in this core's
    // cache (crc32c runs at 22 GB/s over cached bytes and 10 GB/s over cold
    // ones on this machine, and handing it over costs a wake-up besides).
    let decode_threads = if shared.ds.zstd() { shared.cfg.decode_threads } else { 0 };
    let (task_tx, task_rx) = crossbeam_channel::unbounded::<DecodeTask>();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rings = shared.cfg.rings.min(cores).min(shared.cfg.queue_depth).max(1);
    let mut senders = Vec::with_capacity(rings);
    let mut threads = Vec::with_capacity(rings + decode_threads);
    for r in 0..rings {
        // Each ring gets its share of the queue depth and registered buffers.
        let mut mine = shared.clone();
        mine.cfg.queue_depth = shared.cfg.queue_depth.div_ceil(rings);
        mine.cfg.fixed_buffer_bytes = shared.cfg.fixed_buffer_bytes / rings as u64;
        mine.cfg.decode_threads = decode_threads;
        match start_ring(mine, r, exit_tx.clone(), task_tx.clone()) {
            Ok((tx, thread)) => {
                senders.push(tx);
                threads.push(thread);
            }
            Err(error) if r == 0 => {
                return Err(NotStarted {
                    call: "starting the io_uring runtime",
                    error,
                    shared: Some(shared),
                });
            }
            Err(e) => {
                tracing::warn!("io_uring: a second ring failed to start ({e}); reading with {r}");
                break;
            }
        }
    }
    drop(task_tx);
    for i in 0..decode_threads {
        let (rx, exit) = (task_rx.clone(), exit_tx.clone());
        let t = std::thread::Builder::new()
            .name(format!("brand-decode-{i}"))
            .spawn(move || {
                let _exit = exit;
                for task in rx {
                    task.run();
                }
            })
            .map_err(|error| NotStarted {
                call: "starting a decode thread",
                error,
                shared: None,
            })?;
        threads.push(t);
    }
    Ok(Started {
        jobs: JobSender::Uring(senders, Default::default()),
        threads,
        exited: exit_rx,
    })
}

/// Starts ring `r`'s reactor thread; the io error if its ring cannot be set up.
fn start_ring(
    shared: Shared,
    r: usize,
    exit: crossbeam_channel::Sender<()>,
    tasks: crossbeam_channel::Sender<DecodeTask>,
) -> std::io::Result<(tokio::sync::mpsc::UnboundedSender<Job>, std::thread::JoinHandle<()>)> {
    let (job_tx, job_rx) = tokio::sync::mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let decode_threads = shared.cfg.decode_threads;
    let thread = std::thread::Builder::new()
        .name(format!("brand-io-{r}"))
        .spawn(move || {
            let _exit = exit;
            let entries = (shared.cfg.queue_depth * 2).next_power_of_two().clamp(8, 4096) as u32;
            let mut ring = tokio_uring::uring_builder();
            if shared.cfg.sqpoll {
                // The poller sleeps after 50 ms without submissions.
                ring.setup_sqpoll(50);
            }
            let rt = match tokio_uring::Runtime::new(tokio_uring::builder().entries(entries).uring_builder(&ring)) {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            // Built inside the runtime: registering fixed buffers needs its context.
            rt.block_on(async move {
                let decode = (decode_threads > 0).then_some(tasks);
                let reactor = Reactor::new(shared, decode);
                let _ = ready_tx.send(Ok(()));
                reactor.run(job_rx).await
            });
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((job_tx, thread)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(std::io::Error::other("the io thread died while starting"))
        }
    }
}

/// A pointer to bytes that stay valid and unchanged until the task replies
/// (see [`Lent`]).
struct RawBytes(*const u8, usize);
// SAFETY: the bytes are only read, and [`Lent`] keeps their buffer alive and
// untouched until the decode thread has replied or dropped its reply sender.
unsafe impl Send for RawBytes {}

/// Compressed records to decompress: the task reads them from a read
/// buffer the reactor keeps (and reuses) once the task replies.
struct DecodeTask {
    ds: Arc<Dataset>,
    ext: Extent,
    bytes: RawBytes,
    verify: bool,
    reply: tokio::sync::oneshot::Sender<Vec<(u64, RecordResult)>>,
}

impl DecodeTask {
    fn run(self) {
        // SAFETY: see RawBytes: the buffer outlives this borrow, which ends
        // before the reply is sent.
        let bytes = unsafe { std::slice::from_raw_parts(self.bytes.0, self.bytes.1) };
        let out = self
            .ds
            .decode_extent(&self.ext, ExtentBytes::Borrowed(bytes), self.verify);
        let _ = self.reply.send(out);
    }
}

/// A read buffer lent to a decode thread: owns the buffer, so it cannot be
/// reused or freed before the decode thread is done with it, even if the
/// task awaiting it is dropped (its Drop then waits for the reply).
struct Lent {
    buf: Option<ReadBuf>,
    rx: tokio::sync::oneshot::Receiver<Vec<(u64, RecordResult)>>,
    finished: bool,
}

impl std::future::Future for Lent {
    type Output = (ReadBuf, Option<Vec<(u64, RecordResult)>>);
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.rx).poll(cx) {
            std::task::Poll::Ready(r) => {
                this.finished = true;
                match this.buf.take() {
                    Some(b) => std::task::Poll::Ready((b, r.ok())),
                    None => std::task::Poll::Pending,
                }
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        use tokio::sync::oneshot::error::TryRecvError;
        while !self.finished {
            match self.rx.try_recv() {
                Err(TryRecvError::Empty) => std::thread::sleep(std::time::Duration::from_micros(200)),
                _ => self.finished = true,
            }
        }
    }
}

/// One ring's reader. Its file cache and buffer pool are its own, on its
/// own thread: a `RefCell`, no lock per read.
struct Reactor {
    shared: Shared,
    files: RefCell<FileCache<Rc<File>>>,
    pool: RefCell<BufferPool>,
    fixed: Option<FixedBufPool<PageBuf>>,
    decode: Option<crossbeam_channel::Sender<DecodeTask>>,
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

    fn bytes(&self, len: usize) -> &[u8] {
        match self {
            ReadBuf::Fixed(b) => &b[..len.min(b.len())],
            ReadBuf::Plain(b) => &b.as_slice()[..len.min(b.len())],
        }
    }
}

impl Reactor {
    fn new(shared: Shared, decode: Option<crossbeam_channel::Sender<DecodeTask>>) -> Rc<Self> {
        let fixed = shared
            .cfg
            .fixed_buffers
            .then(|| Self::register_fixed(&shared))
            .flatten();
        let files = FileCache::new(shared.ds.clone(), shared.stats.clone(), |f| Rc::new(File::from_std(f)));
        let pool = BufferPool::new(shared.cfg.queue_depth, shared.stats.clone());
        Rc::new(Reactor {
            shared,
            files: RefCell::new(files),
            pool: RefCell::new(pool),
            fixed,
            decode,
        })
    }

    /// Registers one buffer per read in flight (no more reads are ever in
    /// flight), no more than `fixed_buffer_bytes` (none when that is less
    /// than one buffer); None, with a warning, where the kernel refuses (beyond RLIMIT_MEMLOCK
    /// without CAP_IPC_LOCK).
    fn register_fixed(shared: &Shared) -> Option<FixedBufPool<PageBuf>> {
        let by_bytes = (shared.cfg.fixed_buffer_bytes / FIXED_BUF_BYTES as u64) as usize;
        let count = shared.cfg.queue_depth.min(by_bytes).min(1024);
        if count == 0 {
            // Less read-ahead than one buffer: registering one would exceed it.
            return None;
        }
        let pool = FixedBufPool::new((0..count).map(|_| PageBuf::new(FIXED_BUF_BYTES)));
        match pool.register() {
            Ok(()) => {
                let stats = &shared.stats;
                stats.fixed_in_use.store(true, Ordering::Relaxed);
                stats
                    .registered_bytes
                    .fetch_add((count * FIXED_BUF_BYTES) as u64, Ordering::Relaxed);
                Some(pool)
            }
            Err(e) => {
                tracing::warn!("io_uring fixed buffers unavailable ({e}); using ordinary buffers");
                None
            }
        }
    }

    /// Hands each job to an idle one of `queue_depth` worker tasks started
    /// once, not to a task spawned per read: a tokio task is an aligned
    /// allocation, and posix_memalign took ≈ 11 % of the CPU reading 4 KiB
    /// samples from tmpfs.
    async fn run(self: Rc<Self>, mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>) {
        let depth = self.shared.cfg.queue_depth.max(1);
        // One permit per idle worker; `idle` lists them.
        let permits = Rc::new(tokio::sync::Semaphore::new(depth));
        let idle = Rc::new(RefCell::new((0..depth).collect::<Vec<usize>>()));
        let mut workers = Vec::with_capacity(depth);
        for w in 0..depth {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
            workers.push(tx);
            let (me, idle, permits) = (self.clone(), idle.clone(), permits.clone());
            tokio_uring::spawn(async move {
                while let Some(job) = rx.recv().await {
                    let completion = me.execute(job).await;
                    let _ = me.shared.done.send(completion);
                    idle.borrow_mut().push(w);
                    permits.add_permits(1);
                }
            });
        }
        while let Some(job) = jobs.recv().await {
            let Ok(permit) = permits.acquire().await else {
                break;
            };
            permit.forget();
            let w = idle.borrow_mut().pop();
            // A permit is an idle worker, whose receiver lives until `workers` is dropped.
            if let Some(w) = w
                && workers[w].send(job).is_ok()
            {
                continue;
            }
            tracing::error!("io_uring: no idle reader for a permit (internal); stopping this ring");
            break;
        }
        // Wait for the reads still in flight before the runtime goes away;
        // then the workers' channels close and they end.
        let _ = permits.acquire_many(depth as u32).await;
        drop(workers);
    }

    async fn execute(&self, job: Job) -> Completion {
        use tracing::Instrument;
        let ext = &job.extent;
        let span = tracing::trace_span!("read", segment = ext.segment, offset = ext.offset, len = ext.len);
        self.execute_in_span(job).instrument(span).await
    }

    async fn execute_in_span(&self, job: Job) -> Completion {
        if reads_in_place(&self.shared.ds, &job.extent) {
            return self.execute_in_place(job).await;
        }
        let len = job.extent.len as usize;
        let fixed = (len <= FIXED_BUF_BYTES)
            .then(|| self.fixed.as_ref()?.try_next(FIXED_BUF_BYTES))
            .flatten();
        let buf = match fixed {
            Some(b) => ReadBuf::Fixed(b),
            None => ReadBuf::Plain(self.pool.borrow_mut().take(len)),
        };
        let (buf, read) = self.read_exact(&job.extent, buf).await;
        let (buf, result) = match read {
            Err(e) => (buf, Err(e)),
            Ok(()) => match &self.decode {
                None => {
                    let bytes = ExtentBytes::Borrowed(buf.bytes(len));
                    let out = self.shared.ds.decode_extent(&job.extent, bytes, self.shared.cfg.verify);
                    (buf, Ok(out))
                }
                Some(decode) => self.decode_elsewhere(decode, &job.extent, buf, len).await,
            },
        };
        // A fixed buffer goes back to its pool when dropped.
        if let ReadBuf::Plain(b) = buf {
            self.pool.borrow_mut().give_back(b);
        }
        Completion {
            tag: job.tag,
            bytes_read: job.extent.len,
            result,
        }
    }

    /// Reads an extent into a buffer that becomes its record's sample (not a
    /// registered one: those go back to the ring's pool), and checks it
    /// here: such records are uncompressed.
    async fn execute_in_place(&self, job: Job) -> Completion {
        let ext = job.extent;
        let len = ext.len as usize;
        let buf = ReadBuf::Plain(PageBuf(AlignedBuf::for_extent(len)));
        let (buf, read) = self.read_exact(&ext, buf).await;
        let result = match (read, buf) {
            (Err(e), _) => Err(e),
            (Ok(()), ReadBuf::Plain(PageBuf(mut buf))) => {
                buf.set_len(len);
                // Uncompressed (see reads_in_place): checked here, where it was read.
                Ok(self
                    .shared
                    .ds
                    .decode_extent(&ext, ExtentBytes::Owned(buf), self.shared.cfg.verify))
            }
            (Ok(()), ReadBuf::Fixed(_)) => Err(Error::config("internal: an in-place read used a fixed buffer")),
        };
        Completion {
            tag: job.tag,
            bytes_read: ext.len,
            result,
        }
    }

    /// Decodes on the decode pool, lending it the buffer until it replies.
    async fn decode_elsewhere(
        &self,
        decode: &crossbeam_channel::Sender<DecodeTask>,
        ext: &Extent,
        buf: ReadBuf,
        len: usize,
    ) -> (ReadBuf, brand_format::Result<Vec<(u64, RecordResult)>>) {
        let bytes = buf.bytes(len);
        let raw = RawBytes(bytes.as_ptr(), bytes.len());
        let (reply, rx) = tokio::sync::oneshot::channel();
        let task = DecodeTask {
            ds: self.shared.ds.clone(),
            ext: ext.clone(),
            bytes: raw,
            verify: self.shared.cfg.verify,
            reply,
        };
        // The buffer is owned by the guard before the task can run.
        let lent = Lent {
            buf: Some(buf),
            rx,
            finished: false,
        };
        if let Err(crossbeam_channel::SendError(task)) = decode.send(task) {
            // No decode thread left: decode here.
            task.run();
        }
        let (buf, out) = lent.await;
        let out = out.ok_or_else(|| Error::config("a decode thread stopped"));
        (buf, out)
    }

    /// Reads the whole extent into `buf`, retrying short reads and
    /// transient errors and falling back to buffered I/O if O_DIRECT is
    /// refused at read time.
    async fn read_exact(&self, ext: &Extent, mut buf: ReadBuf) -> (ReadBuf, brand_format::Result<()>) {
        let mut lp = ReadLoop::new(&self.shared.ds, ext, self.shared.cfg.direct);
        loop {
            let file = match self.files.borrow_mut().get(ext.segment, lp.direct) {
                Ok(f) => f,
                Err(e) => return (buf, Err(e)),
            };
            let (back, res) = buf.read(&file, lp.done, lp.len(), lp.pos()).await;
            buf = back;
            match lp.step(res, &self.shared.stats) {
                Step::Again => {}
                Step::Done => return (buf, Ok(())),
                Step::Reopen => self.files.borrow_mut().forget(ext.segment),
                Step::Fail(e) => return (buf, Err(e)),
            }
        }
    }
}
