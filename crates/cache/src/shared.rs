//! What the cache's threads share: the dataset, the state under its lock
//! and the condition its changes are told by, the shared memory, and the
//! jobs' connections ([`Link`]).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use brand_format::Dataset;

use crate::shm::{Mapping, send_all};
use crate::state::State;
use crate::wire::{Digest, ToJob};

pub(crate) struct Shared {
    pub(crate) ds: Arc<Dataset>,
    pub(crate) digest: Digest,
    pub(crate) state: Mutex<State>,
    pub(crate) changed: Condvar,
    pub(crate) memory: Mapping,
    pub(crate) memfd: OwnedFd,
    pub(crate) socket: PathBuf,
    pub(crate) stop: AtomicBool,
    pub(crate) links: Mutex<Vec<Attachment>>,
    /// Connections whose hello is being awaited.
    pub(crate) introducing: AtomicUsize,
}

/// A job's connection and its two threads.
type Attachment = (Arc<Link>, Vec<JoinHandle<()>>);

pub(crate) fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A job's connection; writes are whole frames under the lock.
pub(crate) struct Link {
    pub(crate) stream: UnixStream,
    write: Mutex<()>,
    /// A `Next` not yet answered: a job asks for its next batch once it
    /// has the answer to the last (so a flood of requests is refused, not
    /// served into memory nobody reads).
    pub(crate) asking: AtomicBool,
}

impl Link {
    pub(crate) fn new(stream: UnixStream) -> Self {
        Link {
            stream,
            write: Mutex::new(()),
            asking: AtomicBool::new(false),
        }
    }

    pub(crate) fn send(&self, m: &ToJob) -> io::Result<()> {
        let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        send_all(self.stream.as_raw_fd(), &m.encode())
    }
}
