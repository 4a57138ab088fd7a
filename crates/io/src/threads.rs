//! The portable backend: `queue_depth` threads doing `pread` (O_DIRECT
//! where allowed) into aligned buffers, each decoding what it read. It
//! needs nothing but ordinary syscalls, so it runs where io_uring is
//! refused (Docker's default seccomp profile, Kubernetes RuntimeDefault,
//! gVisor, `kernel.io_uring_disabled`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use brand_format::buffer::AlignedBuf;
use brand_format::decode::ExtentBytes;
use brand_format::error::Result;
use brand_format::extents::Extent;

use crate::engine::{
    Completion, Job, JobSender, ReadLoop, Shared, Started, Step, open_segment,
    reads_in_place,
};
use crate::page_buf::PageBuf;

/// Most reader threads: beyond this, more threads only cost memory.
const MAX_THREADS: usize = 256;

struct Readers {
    shared: Shared,
    files: Mutex<HashMap<u32, Arc<std::fs::File>>>,
    pool: Mutex<Vec<PageBuf>>,
}

pub(crate) fn start(shared: Shared) -> Result<Started> {
    let count = shared.cfg.queue_depth.clamp(1, MAX_THREADS);
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
    let (exit_tx, exit_rx) = crossbeam_channel::bounded::<()>(0);
    let readers = Arc::new(Readers {
        shared,
        files: Mutex::default(),
        pool: Mutex::default(),
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
        jobs: JobSender::Threads(job_tx),
        threads,
        exited: exit_rx,
    })
}

impl Readers {
    fn file(&self, segment: u32, direct: bool) -> Result<Arc<std::fs::File>> {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = files.get(&segment) {
            return Ok(f.clone());
        }
        let path = self.shared.ds.segment_path(segment);
        let f = Arc::new(open_segment(&path, direct, &self.shared.stats)?);
        files.insert(segment, f.clone());
        Ok(f)
    }

    fn take_buffer(&self, len: usize) -> PageBuf {
        let class = len.max(64 << 10).next_power_of_two();
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        match pool.iter().position(|b| b.capacity() == class) {
            Some(i) => pool.swap_remove(i),
            None => {
                self.shared.stats.pool_grew(class as u64);
                PageBuf::new(class)
            }
        }
    }

    fn return_buffer(&self, mut buf: PageBuf) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < 2 * self.shared.cfg.queue_depth {
            buf.clear();
            pool.push(buf);
        } else {
            self.shared.stats.pool_shrank(buf.capacity() as u64);
        }
    }

    fn execute(&self, job: Job) -> Completion {
        let ext = &job.extent;
        let (ds, verify) = (&self.shared.ds, self.shared.cfg.verify);
        let result = if reads_in_place(ds, ext) {
            // The buffer becomes the sample (freed with it on an error).
            let mut buf = AlignedBuf::for_extent(ext.len as usize);
            self.read_exact(ext, &mut buf)
                .map(|()| ds.decode_extent(ext, ExtentBytes::Owned(buf), verify))
        } else {
            let mut buf = self.take_buffer(ext.len as usize);
            let result = self
                .read_exact(ext, &mut buf)
                .map(|()| ds.decode_extent(ext, ExtentBytes::Borrowed(&buf), verify));
            self.return_buffer(buf);
            result
        };
        Completion {
            tag: job.tag,
            bytes_read: ext.len,
            result,
        }
    }

    /// Reads the whole extent into the start of `buf`; its data is then
    /// exactly the extent's bytes.
    fn read_exact(&self, ext: &Extent, buf: &mut AlignedBuf) -> Result<()> {
        let len = ext.len as usize;
        let mut lp = ReadLoop::new(&self.shared.ds, ext, self.shared.cfg.direct);
        loop {
            let file = self.file(ext.segment, lp.direct)?;
            let res = read_into(&file, buf, lp.done..len, lp.pos());
            match lp.step(res, &self.shared.stats) {
                Step::Again => {}
                Step::Done => {
                    buf.set_len(len);
                    return Ok(());
                }
                Step::Reopen => {
                    self.files
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&ext.segment);
                }
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
