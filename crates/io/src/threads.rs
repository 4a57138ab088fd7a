//! The portable backend: `queue_depth` threads doing `pread` (O_DIRECT
//! where allowed) into aligned buffers, each decoding what it read; they
//! share one file cache and one buffer pool, each behind a mutex. It
//! needs nothing but ordinary syscalls, so it runs where io_uring is
//! refused (Docker's default seccomp profile, Kubernetes RuntimeDefault,
//! gVisor, `kernel.io_uring_disabled`).

use std::sync::{Arc, Mutex, MutexGuard};

use brand_format::buffer::AlignedBuf;
use brand_format::decode::ExtentBytes;
use brand_format::error::Result;
use brand_format::extents::Extent;

use crate::files::FileCache;
use crate::job::{Completion, Job, Shared, Started};
use crate::pool::BufferPool;
use crate::read::{ReadLoop, Step, reads_in_place};

/// Most reader threads: beyond this, more threads only cost memory.
const MAX_THREADS: usize = 256;

/// What the reader threads share; the file cache and the buffer pool are
/// locked for the moment a thread takes or gives back (never during a read).
struct Readers {
    shared: Shared,
    files: Mutex<FileCache<Arc<std::fs::File>>>,
    pool: Mutex<BufferPool>,
}

pub(crate) fn start(shared: Shared) -> Result<Started> {
    let count = shared.cfg.queue_depth.clamp(1, MAX_THREADS);
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
    let (exit_tx, exit_rx) = crossbeam_channel::bounded::<()>(0);
    let readers = Arc::new(Readers {
        files: Mutex::new(FileCache::new(shared.ds.clone(), shared.stats.clone(), Arc::new)),
        pool: Mutex::new(BufferPool::new(shared.cfg.queue_depth, shared.stats.clone())),
        shared,
    });
    let mut threads = Vec::with_capacity(count);
    for i in 0..count {
        let (rx, exit, r) = (job_rx.clone(), exit_tx.clone(), readers.clone());
        let t = std::thread::Builder::new()
            .name(format!("brand-read-{i}"))
            .stack_size(256 << 10)
            .spawn(move || {
                let _exit = exit;
                for job in rx {
                    let c = r.execute(job);
                    if r.shared.done.send(c).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| brand_format::Error::io("<brand-read thread>", e))?;
        threads.push(t);
    }
    Ok(Started {
        jobs: Box::new(job_tx),
        threads,
        exited: exit_rx,
    })
}

/// The guarded value even if another thread panicked holding the lock: a
/// file cache or an idle buffer list stays consistent between calls.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Readers {
    fn execute(&self, job: Job) -> Completion {
        let ext = &job.extent;
        let (ds, verify) = (&self.shared.ds, self.shared.cfg.verify);
        let result = if reads_in_place(ds, ext) {
            // The buffer becomes the sample (freed with it on an error).
            let mut buf = AlignedBuf::for_extent(ext.len as usize);
            self.read_exact(ext, &mut buf)
                .map(|()| ds.decode_extent(ext, ExtentBytes::Owned(buf), verify))
        } else {
            let mut buf = lock(&self.pool).take(ext.len as usize);
            let result = self
                .read_exact(ext, &mut buf)
                .map(|()| ds.decode_extent(ext, ExtentBytes::Borrowed(&buf), verify));
            lock(&self.pool).give_back(buf);
            result
        };
        Completion {
            tag: job.tag,
            extent: job.extent,
            result,
        }
    }

    /// Reads the whole extent into the start of `buf`; its data is then
    /// exactly the extent's bytes.
    fn read_exact(&self, ext: &Extent, buf: &mut AlignedBuf) -> Result<()> {
        let len = ext.len as usize;
        let mut lp = ReadLoop::new(&self.shared.ds, ext, self.shared.cfg.direct);
        loop {
            let file = lock(&self.files).get(ext.segment, lp.direct)?;
            let res = read_into(&file, buf, lp.done..len, lp.pos());
            match lp.step(res, &self.shared.stats) {
                Step::Again => {}
                Step::Done => {
                    buf.set_len(len);
                    return Ok(());
                }
                Step::Reopen => lock(&self.files).forget(ext.segment),
                Step::Fail(e) => return Err(e),
            }
        }
    }
}

/// `pread` into `range` of `buf`'s capacity, through a raw pointer: an
/// extent buffer's bytes are uninitialised until read into.
fn read_into(
    file: &std::fs::File,
    buf: &mut AlignedBuf,
    range: std::ops::Range<usize>,
    pos: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    assert!(
        range.start <= range.end && range.end <= buf.capacity(),
        "read of {range:?} past the buffer"
    );
    let pos = libc::off_t::try_from(pos).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: [start, end) lies inside buf's allocation (checked above),
    // uniquely borrowed; the kernel writes at most end - start bytes there.
    let n = unsafe {
        libc::pread(
            file.as_raw_fd(),
            buf.spare_ptr().add(range.start).cast(),
            range.end - range.start,
            pos,
        )
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
