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
    /// A runtime of `threads` worker threads named `brand-store-N`.
    pub fn new(threads: usize) -> Result<IoRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("brand-store")
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

    /// Runs `f` to completion on this runtime (from a thread outside it).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle().block_on(f)
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
