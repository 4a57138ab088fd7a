//! The io_uring backend: one plain loop per ring (up to two rings, each on
//! its own thread, jobs round-robin). A loop takes every job waiting on its
//! channel (up to `queue_depth` reads in flight), pushes one read per job
//! into a slot table indexed by the SQE's user_data, submits them all in one
//! io_uring_enter and reaps the completions in a batch: no future, waker or
//! channel hop per read. It checks the uncompressed records it read itself;
//! compressed ones are verified and decompressed by a small pool of decode
//! threads (`decode_threads`), which send the completion and hand the read
//! buffer back, or by the loop when the pool has none (the default where no
//! core is left beside the rings). Each loop keeps its own file cache and
//! buffer pool (no lock per read). A loop with nothing to do sleeps in
//! io_uring_enter; a read it always keeps queued on an eventfd, which the
//! senders write only when it is asleep, wakes it for new jobs. Before any
//! ring starts, one NOP on a ring of its own checks that submissions are
//! allowed, not only ring setup.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};

use io_uring::{IoUring, opcode, squeue, types};

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::decode::ExtentBytes;
use brand_format::error::Error;
use brand_format::extents::Extent;

use crate::config::FIXED_BUF_BYTES;
use crate::files::FileCache;
use crate::job::{Completion, Job, JobSender, Shared, Started};
use crate::page_buf::PageBuf;
use crate::pool::BufferPool;
use crate::read::{ReadLoop, Step, reads_in_place};

/// Why the backend did not start: the call that failed and how, and the
/// settings back for another backend (None once some of its threads ran).
pub(crate) struct NotStarted {
    pub call: &'static str,
    pub error: std::io::Error,
    /// Boxed: the error travels by value and the settings are large.
    pub shared: Option<Box<Shared>>,
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

/// Starts the ring loops; on failure hands `shared` back (for a fallback backend).
pub(crate) fn start(shared: Shared) -> Result<Started, NotStarted> {
    if let Err((call, error)) = check_submissions() {
        return Err(NotStarted {
            call,
            error,
            shared: Some(Box::new(shared)),
        });
    }
    let (exit_tx, exit_rx) = crossbeam_channel::bounded::<()>(0);
    // Only compressed records go to the pool: a loop checks an uncompressed
    // record itself, while its bytes are still in this core's cache
    // (crc32c runs at 22 GB/s over cached bytes and 10 GB/s over cold ones
    // on this machine, and handing it over costs a wake-up besides).
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
                    call: "starting an io_uring ring",
                    error,
                    shared: Some(Box::new(shared)),
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
        jobs: Box::new(Rings {
            senders,
            next: Default::default(),
        }),
        threads,
        exited: exit_rx,
    })
}

/// Wakes a ring's loop asleep in io_uring_enter: the loop always keeps a
/// read queued on this eventfd, and says when it is about to sleep.
pub(crate) struct Wake {
    sleeping: AtomicBool,
    fd: OwnedFd,
}

impl Wake {
    fn new() -> std::io::Result<Self> {
        // Blocking (no EFD_NONBLOCK): io_uring then waits for a count
        // instead of completing the read with EAGAIN.
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Wake {
            sleeping: AtomicBool::new(false),
            // SAFETY: a new descriptor, owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Wakes the loop if it said it sleeps; called after handing it something.
    fn if_asleep(&self) {
        // Pairs with the loop's fence between saying it sleeps and looking
        // at its channels: either it sees what was sent, or this sees it asleep.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::Relaxed) {
            self.ring();
        }
    }

    /// Adds one to the eventfd's count, completing the loop's read on it.
    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which outlives the call.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if n != 8 {
            tracing::error!("io_uring: waking a ring failed: {}", std::io::Error::last_os_error());
        }
    }
}

/// Where one ring's jobs go.
/// The rings' senders: jobs go round-robin.
struct Rings {
    senders: Vec<RingSender>,
    next: std::sync::atomic::AtomicUsize,
}

impl JobSender for Rings {
    fn send(&self, job: Job) -> bool {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.senders.len();
        self.senders[i].send(job)
    }
}

pub(crate) struct RingSender {
    jobs: Option<crossbeam_channel::Sender<Job>>,
    wake: Arc<Wake>,
}

impl RingSender {
    /// Hands `job` to the ring, waking its loop if asleep; false if it has stopped.
    pub fn send(&self, job: Job) -> bool {
        let Some(jobs) = &self.jobs else {
            return false;
        };
        if jobs.send(job).is_err() {
            return false;
        }
        self.wake.if_asleep();
        true
    }
}

impl Drop for RingSender {
    fn drop(&mut self) {
        // Close the channel, then wake the loop (asleep or about to be) to see it.
        drop(self.jobs.take());
        self.wake.ring();
    }
}

/// Starts ring `r`'s loop thread; the io error if its ring cannot be set up.
fn start_ring(
    shared: Shared,
    r: usize,
    exit: crossbeam_channel::Sender<()>,
    tasks: crossbeam_channel::Sender<DecodeTask>,
) -> std::io::Result<(RingSender, std::thread::JoinHandle<()>)> {
    let (job_tx, job_rx) = crossbeam_channel::unbounded();
    let wake = Arc::new(Wake::new()?);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let decode_threads = shared.cfg.decode_threads;
    let loop_wake = wake.clone();
    let thread = std::thread::Builder::new()
        .name(format!("brand-io-{r}"))
        .spawn(move || {
            let _exit = exit;
            let entries = (shared.cfg.queue_depth * 2).next_power_of_two().clamp(8, 4096) as u32;
            let mut builder = IoUring::builder();
            if shared.cfg.sqpoll {
                // The poller sleeps after 50 ms without submissions.
                builder.setup_sqpoll(50);
            }
            let ring = match builder.build(entries) {
                Ok(ring) => ring,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let decode = (decode_threads > 0).then_some(tasks);
            let ring_loop = RingLoop::new(ring, shared, job_rx, loop_wake, decode);
            let _ = ready_tx.send(Ok(()));
            ring_loop.run();
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((
            RingSender {
                jobs: Some(job_tx),
                wake,
            },
            thread,
        )),
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

/// Compressed records to decompress, on a decode thread, which sends their
/// completion and hands the read buffer back to the ring's pool.
struct DecodeTask {
    ds: Arc<Dataset>,
    tag: u64,
    ext: Extent,
    buf: PageBuf,
    verify: bool,
    done: crossbeam_channel::Sender<Completion>,
    back: crossbeam_channel::Sender<PageBuf>,
    wake: Arc<Wake>,
}

impl DecodeTask {
    fn run(self) {
        let out = self
            .ds
            .decode_extent(&self.ext, ExtentBytes::Borrowed(self.buf.as_slice()), self.verify);
        let _ = self.done.send(Completion {
            tag: self.tag,
            extent: self.ext,
            result: Ok(out),
        });
        // The ring may have stopped: the buffer is then freed here.
        if self.back.send(self.buf).is_ok() {
            // The buffer frees a read slot (see RingLoop::lent).
            self.wake.if_asleep();
        }
    }
}

/// The user_data of the read on the wake eventfd (slots are numbered from 0).
const WAKE: u64 = u64::MAX;

/// Where a read goes.
enum Dest {
    /// A registered buffer, by index.
    Fixed(u16),
    /// A read buffer from the pool.
    Pooled(PageBuf),
    /// A buffer that becomes the record's sample ([`reads_in_place`]).
    Sample(AlignedBuf),
}

/// A read in flight: its job, where it reads into, and its [`ReadLoop`] state.
struct Slot {
    tag: u64,
    ext: Extent,
    dest: Dest,
    /// The file read from, held while a read on it is in flight (a reopen
    /// drops the cache's handle).
    file: Option<Rc<std::fs::File>>,
    done: usize,
    direct: bool,
    transient: u32,
}

/// Buffers registered with the ring, and which are free.
struct FixedBufs {
    bufs: Vec<PageBuf>,
    free: Vec<u16>,
}

/// The decode pool, and the channel its threads hand read buffers back on.
struct Decode {
    tasks: crossbeam_channel::Sender<DecodeTask>,
    back_tx: crossbeam_channel::Sender<PageBuf>,
    back_rx: crossbeam_channel::Receiver<PageBuf>,
}

/// One ring's loop. Fields drop in order: the ring (and its registered
/// buffers) before the buffers reads went into.
struct RingLoop {
    ring: IoUring,
    shared: Shared,
    jobs: crossbeam_channel::Receiver<Job>,
    wake: Arc<Wake>,
    /// Where the read on the wake eventfd puts its count.
    wake_count: Box<u64>,
    files: FileCache<Rc<std::fs::File>>,
    pool: BufferPool,
    fixed: Option<FixedBufs>,
    /// Reads in flight by user_data; `free_slots` lists the empty ones.
    slots: Vec<Option<Slot>>,
    free_slots: Vec<usize>,
    /// Read buffers on the decode pool: each holds back a slot, so reads
    /// in flight and records waiting to decode stay within the queue depth
    /// (and the pool within its size).
    lent: usize,
    decode: Option<Decode>,
    /// Completions reaped, reused between batches.
    reaped: Vec<(u64, i32)>,
}

impl RingLoop {
    fn new(
        mut ring: IoUring,
        shared: Shared,
        jobs: crossbeam_channel::Receiver<Job>,
        wake: Arc<Wake>,
        decode: Option<crossbeam_channel::Sender<DecodeTask>>,
    ) -> Self {
        let fixed = if shared.cfg.fixed_buffers {
            register_fixed(&mut ring, &shared)
        } else {
            None
        };
        let depth = shared.cfg.queue_depth.max(1);
        let files = FileCache::new(shared.ds.clone(), shared.stats.clone(), Rc::new);
        let pool = BufferPool::new(depth, shared.stats.clone());
        let decode = decode.map(|tasks| {
            let (back_tx, back_rx) = crossbeam_channel::unbounded();
            Decode {
                tasks,
                back_tx,
                back_rx,
            }
        });
        RingLoop {
            ring,
            shared,
            jobs,
            wake,
            wake_count: Box::new(0),
            files,
            pool,
            fixed,
            slots: (0..depth).map(|_| None).collect(),
            free_slots: (0..depth).rev().collect(),
            lent: 0,
            decode,
            reaped: Vec::with_capacity(2 * depth + 1),
        }
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    fn run(mut self) {
        self.arm_wake();
        let mut closed = false;
        loop {
            let mut progress = false;
            if let Some(d) = &self.decode {
                for buf in d.back_rx.try_iter() {
                    self.pool.give_back(buf);
                    self.lent = self.lent.saturating_sub(1);
                }
            }
            while !closed && self.free_slots.len() > self.lent {
                match self.jobs.try_recv() {
                    Ok(job) => {
                        self.start(job);
                        progress = true;
                    }
                    Err(crossbeam_channel::TryRecvError::Empty) => break,
                    Err(crossbeam_channel::TryRecvError::Disconnected) => closed = true,
                }
            }
            if closed && self.in_flight() == 0 {
                break;
            }
            if progress
                && let Err(e) = self.ring.submit()
                && !transient_enter_error(&e)
            {
                return self.fail_all(e);
            }
            if self.reap() {
                continue;
            }
            if progress {
                continue;
            }
            // Nothing to do: sleep until a read completes, a job arrives
            // (if one can start) or a lent buffer comes back.
            let accepting = !closed && self.free_slots.len() > self.lent;
            if accepting || self.lent > 0 {
                self.wake.sleeping.store(true, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                let returned = self.decode.as_ref().is_some_and(|d| !d.back_rx.is_empty());
                if returned || (accepting && !self.jobs.is_empty()) {
                    self.wake.sleeping.store(false, Ordering::Relaxed);
                    continue;
                }
            }
            let waited = self.sleep();
            self.wake.sleeping.store(false, Ordering::Relaxed);
            if let Err(e) = waited
                && !transient_enter_error(&e)
            {
                return self.fail_all(e);
            }
        }
        self.finish_wake();
    }

    /// Submits what is queued, then sleeps until the completion queue has
    /// an entry: in poll(2) on the ring's fd, not in io_uring_enter with
    /// GETEVENTS, because valgrind (3.19) holds its one-thread-at-a-time
    /// lock across io_uring_enter, so a wake that another thread must
    /// write never came and a program under valgrind hung.
    fn sleep(&mut self) -> std::io::Result<()> {
        if !self.ring.submission().is_empty() {
            self.ring.submit()?;
        }
        if !self.ring.completion().is_empty() {
            return Ok(());
        }
        let mut ring_fd = libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, borrowed for the call only.
        if unsafe { libc::poll(&mut ring_fd, 1, -1) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Queues the read on the wake eventfd.
    fn arm_wake(&mut self) {
        let sqe = opcode::Read::new(
            types::Fd(self.wake.fd.as_raw_fd()),
            (&mut *self.wake_count as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(WAKE);
        // SAFETY: `wake_count` is boxed (its address never moves) and lives
        // as long as the loop, which waits for this read to complete before
        // it ends (finish_wake) or leaks the box (fail_all); the eventfd is
        // held by `wake`, as long.
        if let Err(e) = unsafe { self.push(&sqe) } {
            tracing::error!("io_uring: queueing the wake read failed ({e}); new jobs may wait for a completion");
        }
    }

    /// Before the loop ends: completes the wake read (a count of its own)
    /// and waits for it, so the kernel never writes `wake_count` after.
    fn finish_wake(mut self) {
        self.wake.ring();
        loop {
            let mut woke = false;
            for cqe in self.ring.completion() {
                woke |= cqe.user_data() == WAKE;
            }
            if woke {
                return;
            }
            if let Err(e) = self.ring.submit_and_wait(1)
                && !transient_enter_error(&e)
            {
                tracing::error!("io_uring: waiting for the wake read failed ({e}); leaking its buffer");
                std::mem::forget(std::mem::take(&mut self.wake_count));
                return;
            }
        }
    }

    /// Pushes `sqe`, submitting first if the queue is full (it holds twice
    /// the reads in flight, so only after many resubmissions); the error if
    /// submitting fails for good (the entry is then not queued).
    ///
    /// # Safety
    /// The entry's buffer and file must stay valid, and the buffer unused,
    /// until its completion is reaped.
    unsafe fn push(&mut self, sqe: &squeue::Entry) -> std::io::Result<()> {
        loop {
            // SAFETY: passed on to the caller (see above).
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            if let Err(e) = self.ring.submit()
                && !transient_enter_error(&e)
            {
                return Err(e);
            }
        }
    }

    /// Starts reading `job` in a free slot.
    fn start(&mut self, job: Job) {
        let Some(i) = self.free_slots.pop() else {
            // Never: the loop takes jobs only while a slot is free.
            let _ = self.shared.done.send(Completion {
                tag: job.tag,
                extent: job.extent,
                result: Err(Error::config("internal: io_uring job without a free slot")),
            });
            return;
        };
        let len = job.extent.len as usize;
        let dest = if reads_in_place(&self.shared.ds, &job.extent) {
            Dest::Sample(AlignedBuf::for_extent(len))
        } else {
            let fixed = match (&mut self.fixed, &self.decode) {
                // Compressed records decoded elsewhere take a pooled buffer the pool can own.
                (Some(f), None) if len <= FIXED_BUF_BYTES => f.free.pop(),
                _ => None,
            };
            match fixed {
                Some(idx) => Dest::Fixed(idx),
                None => Dest::Pooled(self.pool.take(len)),
            }
        };
        self.slots[i] = Some(Slot {
            tag: job.tag,
            ext: job.extent,
            dest,
            file: None,
            done: 0,
            direct: self.shared.cfg.direct,
            transient: 0,
        });
        self.issue(i);
    }

    /// Queues the read of what slot `i` still lacks.
    fn issue(&mut self, i: usize) {
        let Some(slot) = self.slots[i].as_mut() else {
            return;
        };
        let file = match self.files.get(slot.ext.segment, slot.direct) {
            Ok(f) => f,
            Err(e) => return self.finish(i, Err(e)),
        };
        let fd = types::Fd(file.as_raw_fd());
        let segment = slot.ext.segment;
        slot.file = Some(file);
        let (from, to) = (slot.done, slot.ext.len as usize);
        let pos = slot.ext.offset + from as u64;
        let Ok(len) = u32::try_from(to - from) else {
            let e = Error::config(format!("a read of {} bytes is too long for io_uring", to - from));
            return self.finish(i, Err(e));
        };
        let (base, cap) = match &mut slot.dest {
            Dest::Fixed(idx) => match &mut self.fixed {
                Some(f) => {
                    let b = &mut f.bufs[*idx as usize];
                    (b.spare_ptr(), b.capacity())
                }
                None => return self.finish(i, Err(Error::config("internal: fixed buffer without a table"))),
            },
            Dest::Pooled(b) => (b.spare_ptr(), b.capacity()),
            Dest::Sample(b) => (b.spare_ptr(), b.capacity()),
        };
        if to > cap {
            return self.finish(i, Err(Error::config("internal: read buffer smaller than its extent")));
        }
        // SAFETY: from < to <= cap: inside the allocation.
        let at = unsafe { base.add(from) };
        let sqe = match slot.dest {
            Dest::Fixed(idx) => opcode::ReadFixed::new(fd, at, len, idx).offset(pos).build(),
            _ => opcode::Read::new(fd, at, len).offset(pos).build(),
        }
        .user_data(i as u64);
        // SAFETY: the buffer is owned by slot i (or the fixed table, slot i
        // holding its index) and the file by slot i until this read's
        // completion is reaped; the allocation never moves.
        if let Err(e) = unsafe { self.push(&sqe) } {
            let error = Error::io(self.shared.ds.segment_path(segment), e);
            self.finish(i, Err(error));
        }
    }

    /// Reaps the completions there are; whether there were any.
    fn reap(&mut self) -> bool {
        let mut reaped = std::mem::take(&mut self.reaped);
        reaped.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        let any = !reaped.is_empty();
        for &(user_data, res) in &reaped {
            if user_data == WAKE {
                self.arm_wake();
            } else {
                self.completed(user_data as usize, res);
            }
        }
        reaped.clear();
        self.reaped = reaped;
        any
    }

    /// Slot `i`'s read returned `res`: on to its next read, or finished.
    fn completed(&mut self, i: usize, res: i32) {
        let res = if res < 0 {
            Err(std::io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        };
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            tracing::error!("io_uring: a completion for no read in flight ({i})");
            return;
        };
        slot.file = None;
        let mut lp = ReadLoop::new(&self.shared.ds, &slot.ext, slot.direct);
        lp.done = slot.done;
        lp.transient = slot.transient;
        let step = lp.step(res, &self.shared.stats);
        let (done, direct, transient) = (lp.done, lp.direct, lp.transient);
        slot.done = done;
        slot.direct = direct;
        slot.transient = transient;
        match step {
            Step::Again => self.issue(i),
            Step::Reopen => {
                let segment = slot.ext.segment;
                self.files.forget(segment);
                self.issue(i)
            }
            Step::Done => self.finish(i, Ok(())),
            Step::Fail(e) => self.finish(i, Err(e)),
        }
    }

    /// Slot `i` is read (or failed): decode and send its completion, free the slot.
    fn finish(&mut self, i: usize, read: brand_format::Result<()>) {
        let Some(slot) = self.slots[i].take() else {
            return;
        };
        self.free_slots.push(i);
        let (ds, verify) = (&self.shared.ds, self.shared.cfg.verify);
        let (ext, len) = (&slot.ext, slot.ext.len as usize);
        let result = match (read, slot.dest) {
            (Err(e), dest) => {
                self.put_back(dest);
                Err(e)
            }
            // Uncompressed (see reads_in_place): checked here, where it was read.
            (Ok(()), Dest::Sample(mut b)) => {
                b.set_len(len);
                Ok(ds.decode_extent(ext, ExtentBytes::Owned(b), verify))
            }
            (Ok(()), Dest::Fixed(idx)) => match &mut self.fixed {
                Some(f) => {
                    let b = &mut f.bufs[idx as usize];
                    b.set_len(len);
                    let out = ds.decode_extent(ext, ExtentBytes::Borrowed(b.as_slice()), verify);
                    b.clear();
                    f.free.push(idx);
                    Ok(out)
                }
                None => Err(Error::config("internal: fixed buffer without a table")),
            },
            (Ok(()), Dest::Pooled(mut b)) => {
                b.set_len(len);
                match &self.decode {
                    Some(d) => {
                        let task = DecodeTask {
                            ds: ds.clone(),
                            tag: slot.tag,
                            ext: slot.ext,
                            buf: b,
                            verify,
                            done: self.shared.done.clone(),
                            back: d.back_tx.clone(),
                            wake: self.wake.clone(),
                        };
                        self.lent += 1;
                        // No decode thread left: decode here.
                        if let Err(crossbeam_channel::SendError(task)) = d.tasks.send(task) {
                            task.run();
                        }
                        return;
                    }
                    None => {
                        let out = ds.decode_extent(ext, ExtentBytes::Borrowed(b.as_slice()), verify);
                        self.pool.give_back(b);
                        Ok(out)
                    }
                }
            }
        };
        let _ = self.shared.done.send(Completion {
            tag: slot.tag,
            extent: slot.ext,
            result,
        });
    }

    /// Returns an unused read buffer.
    fn put_back(&mut self, dest: Dest) {
        match dest {
            Dest::Fixed(idx) => {
                if let Some(f) = &mut self.fixed {
                    f.free.push(idx);
                }
            }
            Dest::Pooled(b) => self.pool.give_back(b),
            Dest::Sample(_) => {}
        }
    }

    /// The ring failed beyond retrying: every read in flight fails, and
    /// their buffers are leaked (the kernel may still write into them).
    fn fail_all(mut self, e: std::io::Error) {
        tracing::error!("io_uring: the ring failed ({e}); failing the reads in flight");
        for slot in self.slots.iter_mut().filter_map(Option::take) {
            let Slot {
                tag, ext, dest, file, ..
            } = slot;
            let error = Error::io(
                self.shared.ds.segment_path(ext.segment),
                std::io::Error::new(e.kind(), format!("io_uring failed: {e}")),
            );
            let _ = self.shared.done.send(Completion {
                tag,
                extent: ext,
                result: Err(error),
            });
            std::mem::forget((dest, file));
        }
        std::mem::forget(std::mem::take(&mut self.wake_count));
        if let Some(f) = self.fixed.take() {
            std::mem::forget(f);
        }
    }
}

/// Whether io_uring_enter failed only for now (a signal, a full completion queue).
fn transient_enter_error(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
}

/// Registers one buffer per read in flight (no more reads are ever in
/// flight), no more than `fixed_buffer_bytes` (none when that is less
/// than one buffer); None, with a warning, where the kernel refuses (beyond
/// RLIMIT_MEMLOCK without CAP_IPC_LOCK).
fn register_fixed(ring: &mut IoUring, shared: &Shared) -> Option<FixedBufs> {
    let by_bytes = (shared.cfg.fixed_buffer_bytes / FIXED_BUF_BYTES as u64) as usize;
    let count = shared.cfg.queue_depth.min(by_bytes).min(1024);
    if count == 0 {
        // Less read-ahead than one buffer: registering one would exceed it.
        return None;
    }
    let mut bufs: Vec<PageBuf> = (0..count).map(|_| PageBuf::new(FIXED_BUF_BYTES)).collect();
    let iovecs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.spare_ptr().cast(),
            iov_len: b.capacity(),
        })
        .collect();
    // SAFETY: each iovec is a whole allocation of `bufs`, which the loop
    // keeps (and never moves) for the ring's life, and drops after it.
    match unsafe { ring.submitter().register_buffers(&iovecs) } {
        Ok(()) => {
            let stats = &shared.stats;
            stats.fixed_in_use.store(true, Ordering::Relaxed);
            stats
                .registered_bytes
                .fetch_add((count * FIXED_BUF_BYTES) as u64, Ordering::Relaxed);
            Some(FixedBufs {
                bufs,
                free: (0..count as u16).rev().collect(),
            })
        }
        Err(e) => {
            tracing::warn!("io_uring fixed buffers unavailable ({e}); using ordinary buffers");
            None
        }
    }
}
