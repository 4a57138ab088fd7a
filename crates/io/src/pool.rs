//! The read buffers a reader reuses (those that do not become samples):
//! sized in power-of-two classes so a recycled buffer fits later reads, and
//! counted in the engine's pool bytes and their peak.

use std::sync::Arc;

use crate::job::EngineStats;
use crate::page_buf::PageBuf;

/// Smallest size class: reads smaller than this still get a buffer this large.
const MIN_CLASS: usize = 64 << 10;

/// One reader's idle read buffers. Not locked: the backend puts it behind
/// what its readers need (a mutex shared by reader threads, a `RefCell` on a
/// ring's own thread).
pub(crate) struct BufferPool {
    idle: Vec<PageBuf>,
    /// Most idle buffers kept: two per read in flight; others are freed.
    keep: usize,
    stats: Arc<EngineStats>,
}

impl BufferPool {
    /// A pool for a reader with `queue_depth` reads in flight at most.
    pub fn new(queue_depth: usize, stats: Arc<EngineStats>) -> Self {
        BufferPool {
            idle: Vec::new(),
            keep: 2 * queue_depth,
            stats,
        }
    }

    /// An empty read buffer of at least `len` bytes: an idle one of its
    /// size class, or a new one.
    pub fn take(&mut self, len: usize) -> PageBuf {
        let class = len.max(MIN_CLASS).next_power_of_two();
        match self.idle.iter().position(|b| b.capacity() == class) {
            Some(i) => self.idle.swap_remove(i),
            None => {
                self.stats.pool_grew(class as u64);
                PageBuf::new(class)
            }
        }
    }

    /// Takes back a buffer from [`take`](Self::take), to reuse or free.
    pub fn give_back(&mut self, mut buf: PageBuf) {
        if self.idle.len() < self.keep {
            buf.clear();
            self.idle.push(buf);
        } else {
            self.stats.pool_shrank(buf.capacity() as u64);
        }
    }
}
