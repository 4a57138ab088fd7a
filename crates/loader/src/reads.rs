//! The loader's reads in flight: the engine, what each read is for, and
//! the bytes in flight. (To become brand-io's read session, shared with the
//! multi-node storage.)

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::Extent;
use brand_io::engine::{Completion, Engine, Job};

/// One read in flight.
pub(crate) struct InFlight {
    pub ids: Vec<u64>,
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
    /// Decoded bytes of its records.
    pub decoded: u64,
}

pub(crate) struct Reads {
    ds: Arc<Dataset>,
    pub engine: ManuallyDrop<Engine>,
    io_timeout: Duration,
    next_tag: u64,
    /// Each in-flight job, by tag. Completions with a tag not here are
    /// stale (from before a reset) and are dropped.
    in_flight: HashMap<u64, InFlight>,
    /// Decoded bytes of the records in flight.
    pub decoded_bytes: u64,
    /// Bytes the reads in flight transfer.
    pub read_bytes: u64,
    /// A read timed out: Drop does not wait for the engine again.
    pub hung: bool,
    closed: bool,
}

impl Reads {
    pub fn new(ds: Arc<Dataset>, engine: Engine, io_timeout: Duration) -> Self {
        Reads {
            ds,
            engine: ManuallyDrop::new(engine),
            io_timeout,
            next_tag: 0,
            in_flight: HashMap::new(),
            decoded_bytes: 0,
            read_bytes: 0,
            hung: false,
            closed: false,
        }
    }

    pub fn submit(&mut self, e: Extent) -> Result<()> {
        let ids: Vec<u64> = e.records.iter().map(|r| r.0).collect();
        let decoded: u64 = ids.iter().map(|&id| self.ds.index.raw_len[id as usize] as u64).sum();
        self.next_tag += 1;
        self.decoded_bytes += decoded;
        self.read_bytes += e.len;
        self.in_flight.insert(
            self.next_tag,
            InFlight {
                ids,
                segment: e.segment,
                offset: e.offset,
                len: e.len,
                decoded,
            },
        );
        self.engine.submit(Job {
            tag: self.next_tag,
            extent: e,
        })
    }

    /// The read a completion is for (None: stale), no longer in flight.
    pub fn finish(&mut self, c: &Completion) -> Option<InFlight> {
        let f = self.in_flight.remove(&c.tag)?;
        self.decoded_bytes -= f.decoded;
        self.read_bytes -= f.len;
        Some(f)
    }

    pub fn try_recv(&self) -> Result<Option<Completion>> {
        self.engine.try_recv()
    }

    /// The next completion, or the timeout error naming the oldest read.
    pub fn recv(&mut self) -> Result<Completion> {
        match self.engine.recv_timeout(self.io_timeout)? {
            Some(c) => Ok(c),
            None => {
                self.hung = true;
                Err(self.timeout_error())
            }
        }
    }

    /// Waits (at most `io_timeout` per completion) for every read in
    /// flight; their data is discarded.
    pub fn drain(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            match self.engine.recv_timeout(self.io_timeout) {
                Ok(Some(c)) => {
                    self.finish(&c);
                }
                Ok(None) => {
                    self.hung = true;
                    return Err(self.timeout_error());
                }
                Err(_) => {
                    self.in_flight.clear();
                    self.decoded_bytes = 0;
                    self.read_bytes = 0;
                }
            }
        }
        Ok(())
    }

    /// The error for reads that stopped completing: names the oldest one.
    fn timeout_error(&self) -> Error {
        let secs = self.io_timeout.as_secs_f64();
        match self.in_flight.iter().min_by_key(|(tag, _)| **tag) {
            Some((_, f)) => Error::io(
                self.ds.segment_path(f.segment),
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no read completed within io_timeout ({secs}s): the read of {} bytes at byte {} is still pending (hung storage?)",
                        f.len, f.offset
                    ),
                ),
            ),
            None => Error::config(format!("no read completed within io_timeout ({secs}s)")),
        }
    }

    /// Ends the engine: waits for reads in flight unless one hung.
    pub fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if !self.hung {
            let _ = self.drain();
        }
        if self.hung {
            self.engine.abandon();
        }
        // SAFETY: `closed` makes this the only drop, and nothing uses the
        // engine after close (the loader calls it from its Drop).
        unsafe { ManuallyDrop::drop(&mut self.engine) };
    }
}
