//! The async runtime a reader of a store owns. One per reader, made where
//! the reader is opened: a `fork()`ed child (a DataLoader worker) that
//! opens its own reader makes its own runtime and its own connections,
//! never the parent's (a tokio runtime does not survive a fork: LitData's
//! workers hung on one their parent made).

use brand_format::error::{Error, Result};

pub struct IoRuntime {
    rt: Option<tokio::runtime::Runtime>,
}

impl IoRuntime {
    /// A runtime of `threads` worker threads named `brand-store`, and at
    /// most a thread per core (2..=8) for blocking work (decoding): tokio's
    /// default of 512 made a thread per GET completing at once, and each
    /// thread's allocator arena kept its freed buffers: reading 0.9 GB from
    /// a local S3 server at 10 % memory, peak RSS 324 (289–346) MiB with
    /// 13 threads, 274 (272–276) MiB with 2, at the same rate (5 rounds).
    pub fn new(threads: usize) -> Result<IoRuntime> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .max_blocking_threads(cores.clamp(2, 8))
            .thread_name("brand-store")
            .on_thread_start(block_sigpipe)
            .enable_all()
            .build()
            .map_err(|e| Error::io("<brand-store runtime>", e))?;
        Ok(IoRuntime { rt: Some(rt) })
    }

    pub fn handle(&self) -> tokio::runtime::Handle {
        match &self.rt {
            Some(rt) => rt.handle().clone(),
            None => unreachable!("the runtime is only taken on drop"),
        }
    }

    /// Stops the runtime where blocking is allowed, waiting at most `limit`
    /// for its threads: once this returns, none of its tasks runs, so no
    /// request of a closed reader reaches the store after its close (a
    /// GET's task is dropped, not finished; only blocking work is waited
    /// for, up to `limit`).
    pub fn shutdown(mut self, limit: std::time::Duration) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(limit);
        }
    }

    /// Runs `f` to completion on this runtime (from a thread outside it),
    /// with SIGPIPE blocked in the calling thread meanwhile: `f` itself is
    /// polled here, so its requests (the open's, a single PUT, a TLS
    /// handshake's alert) write to sockets from this thread.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        let _blocked = SigpipeBlocked::here();
        self.handle().block_on(f)
    }
}

/// SIGPIPE blocked in the calling thread until dropped, then its old mask
/// back, with any SIGPIPE raised meanwhile discarded first (unblocking a
/// pending one would deliver it: the kill this prevents).
struct SigpipeBlocked {
    /// It was blocked already (a runtime thread, a caller's own choice):
    /// nothing to undo.
    was_blocked: bool,
}

impl SigpipeBlocked {
    fn here() -> SigpipeBlocked {
        let set = sigpipe_only();
        // SAFETY: `old` is plain data that sigemptyset initialises; the mask
        // changes only this thread's blocked set.
        unsafe {
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut old);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            SigpipeBlocked {
                was_blocked: libc::sigismember(&old, libc::SIGPIPE) == 1,
            }
        }
    }
}

impl Drop for SigpipeBlocked {
    fn drop(&mut self) {
        if self.was_blocked {
            return;
        }
        let set = sigpipe_only();
        // SAFETY: a zero timeout makes sigtimedwait only take a pending
        // SIGPIPE, never wait; the mask changes only this thread's blocked set.
        unsafe {
            let now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            while libc::sigtimedwait(&set, std::ptr::null_mut(), &now) == libc::SIGPIPE {}
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }
}

/// Blocks SIGPIPE in the calling thread: a write to a connection its peer
/// has reset then fails with EPIPE, an error the caller handles (a GET or
/// an upload retries it), instead of killing the process. hyper writes with
/// writev, which has no MSG_NOSIGNAL, and SIGPIPE's action is the default
/// in a C program and in `brand`'s pipe-writing commands: behind a proxy
/// that reset every other new connection, `brand pack -o s3://…` died by
/// SIGPIPE (exit 141, its staging directory left behind). Every runtime
/// thread that may touch a socket calls this when it starts.
pub fn block_sigpipe() {
    let set = sigpipe_only();
    // SAFETY: the mask changes only this thread's blocked set.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// The signal set holding SIGPIPE alone.
fn sigpipe_only() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data that sigemptyset initialises.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        set
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        // A GET stuck on a server that stopped answering must not hold up
        // the reader's close: its task is abandoned, not waited for.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether SIGPIPE is blocked in the calling thread.
    fn sigpipe_blocked() -> bool {
        // SAFETY: a null new set only reads the thread's mask into `set`,
        // plain data that sigemptyset initialised.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
            libc::sigismember(&set, libc::SIGPIPE) == 1
        }
    }

    #[test]
    fn every_runtime_thread_blocks_sigpipe() {
        let rt = IoRuntime::new(2).expect("runtime");
        let h = rt.handle();
        let workers = rt.block_on(async {
            let tasks: Vec<_> = (0..8).map(|_| tokio::spawn(async { sigpipe_blocked() })).collect();
            let mut all = Vec::new();
            for t in tasks {
                all.push(t.await.expect("task"));
            }
            all
        });
        assert!(workers.iter().all(|&b| b), "{workers:?}");
        let blocking = rt.block_on(h.spawn_blocking(sigpipe_blocked)).expect("blocking task");
        assert!(blocking);
    }

    /// The thread whose SIGPIPEs `count_sigpipe` counts, and how many.
    static WATCHED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    static SIGPIPES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    extern "C" fn count_sigpipe(_: libc::c_int) {
        use std::sync::atomic::Ordering::SeqCst;
        // SAFETY: gettid has no preconditions and is async-signal-safe.
        if unsafe { libc::gettid() } == WATCHED.load(SeqCst) {
            SIGPIPES.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn block_on_blocks_sigpipe_in_its_caller_and_discards_what_it_raised() {
        use std::sync::atomic::Ordering::SeqCst;
        // A thread of its own: the harness's other tests keep their masks.
        std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            WATCHED.store(unsafe { libc::gettid() }, SeqCst);
            // A handler that counts what reaches this thread, where the
            // harness ignores SIGPIPE (a delivered one would go unseen).
            // SAFETY: the actions are plain data, zeroed then filled; the
            // handler only reads and adds to atomics; the old one is put back.
            let old = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = count_sigpipe as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGPIPE, &action, &mut old);
                old
            };
            let rt = IoRuntime::new(1).expect("runtime");
            assert!(!sigpipe_blocked());
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
            drop(theirs);
            let (blocked, wrote) = rt.block_on(async {
                // A write(2) to a socket whose peer is gone raises SIGPIPE in
                // this thread (write has no MSG_NOSIGNAL, as hyper's writev).
                use std::os::fd::AsRawFd;
                // SAFETY: a valid fd and a 1-byte buffer that outlives the call.
                let n = unsafe { libc::write(ours.as_raw_fd(), b"x".as_ptr().cast(), 1) };
                (sigpipe_blocked(), (n, std::io::Error::last_os_error().raw_os_error()))
            });
            let delivered = SIGPIPES.load(SeqCst);
            // SAFETY: puts back the action saved above.
            unsafe { libc::sigaction(libc::SIGPIPE, &old, std::ptr::null_mut()) };
            assert!(blocked, "SIGPIPE not blocked while block_on polls");
            assert_eq!(wrote, (-1, Some(libc::EPIPE)));
            assert!(!sigpipe_blocked(), "the caller's mask is not restored");
            assert_eq!(delivered, 0, "the SIGPIPE raised was delivered when unblocked");
        })
        .join()
        .expect("the test's thread");
    }
}
