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

    /// Runs `f` to completion on this runtime (from a thread outside it).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle().block_on(f)
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
    // SAFETY: sigset_t is plain data that sigemptyset initialises; the mask
    // changes only this thread's blocked set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
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
}
