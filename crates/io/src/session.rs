//! A read session: what every reader of a dataset does around the engine.
//! It resolves the read gap, turns plan reads into extents, tags each
//! extent it submits with the caller's payload, names the oldest read when
//! none completes within `io_timeout`, and waits for reads in flight before
//! the engine goes (or, once a read has hung, does not).

use std::sync::Arc;
use std::time::Duration;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::{Extent, ReadGap, extents, extents_into};
use brand_format::ids::IdMap;

use crate::config::{EngineConfig, IoBackend, ReadGapSetting};
use crate::engine::{Completion, Engine, Job};

/// An extent in flight: the caller's payload and where it reads.
struct InFlight<T> {
    payload: T,
    segment: u32,
    offset: u64,
    len: u64,
}

/// Reads of one dataset through one engine; `T` is what the caller keeps
/// with each extent it submits (handed back with its completion).
pub struct ReadSession<T> {
    engine: Engine,
    ds: Arc<Dataset>,
    gap: ReadGap,
    io_timeout: Duration,
    next_tag: u64,
    /// The extents in flight, by engine tag (tags only grow: the smallest
    /// is the oldest read).
    in_flight: IdMap<InFlight<T>>,
    in_flight_read_bytes: u64,
    /// A read did not complete within `io_timeout`: the engine is not
    /// waited for again.
    hung: bool,
}

impl<T> ReadSession<T> {
    /// Starts an engine set up as `cfg` over `ds` and resolves `gap`: `Auto`
    /// probes the device through an engine of the backend this one resolved
    /// to. A partition that holds no segments reads nothing and is not
    /// probed.
    pub fn open(ds: Arc<Dataset>, cfg: EngineConfig, gap: ReadGapSetting) -> Result<Self> {
        let engine = Engine::start(ds.clone(), cfg.clone())?;
        let probe = EngineConfig {
            backend: engine.backend(),
            ..cfg.clone()
        };
        let gap = resolve_gap(&ds, &probe, gap)?;
        Ok(ReadSession {
            engine,
            ds,
            gap,
            io_timeout: cfg.io_timeout,
            next_tag: 0,
            in_flight: IdMap::default(),
            in_flight_read_bytes: 0,
            hung: false,
        })
    }

    /// The extents that read the records of `chunk` in `mask`, with this
    /// session's gap.
    pub fn extents(&self, chunk: u64, mask: u64) -> Vec<Extent> {
        extents(&self.ds.index, chunk, mask, self.gap)
    }

    /// [`extents`](Self::extents), appended to `out`.
    pub fn extents_into(&self, chunk: u64, mask: u64, out: &mut Vec<Extent>) {
        extents_into(&self.ds.index, chunk, mask, self.gap, out)
    }

    /// Starts reading `extent`; `payload` comes back with its completion.
    pub fn submit(&mut self, extent: Extent, payload: T) -> Result<()> {
        self.submit_as(extent, payload, false)
    }

    /// [`submit`](Self::submit), saying whether `extent` is a read of a
    /// start's first fill made record by record (see [`Job::first_fill`]).
    pub fn submit_as(&mut self, extent: Extent, payload: T, first_fill: bool) -> Result<()> {
        self.next_tag += 1;
        let tag = self.next_tag;
        let read = InFlight {
            payload,
            segment: extent.segment,
            offset: extent.offset,
            len: extent.len,
        };
        self.engine.submit(Job {
            tag,
            extent,
            first_fill,
        })?;
        self.in_flight_read_bytes += read.len;
        self.in_flight.insert(tag, read);
        Ok(())
    }

    /// A completion that has arrived already, with its payload (never waits).
    pub fn try_recv(&mut self) -> Result<Option<(T, Completion)>> {
        while let Some(c) = self.engine.try_recv()? {
            if let Some(payload) = self.forget(c.tag) {
                return Ok(Some((payload, c)));
            }
        }
        Ok(None)
    }

    /// The next completion with its payload, waiting for it at most
    /// `io_timeout`; then the session is hung and the error names the
    /// oldest read still pending.
    pub fn recv(&mut self) -> Result<(T, Completion)> {
        if self.in_flight.is_empty() {
            return Err(Error::config("internal: waiting for a read with none in flight"));
        }
        loop {
            let c = self.recv_within_timeout()?;
            if let Some(payload) = self.forget(c.tag) {
                return Ok((payload, c));
            }
        }
    }

    /// Waits for every read in flight and discards them; an error (and the
    /// session hung) if one does not complete within `io_timeout`.
    pub fn drain(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            let c = self.recv_within_timeout()?;
            self.forget(c.tag);
        }
        self.hung = false;
        Ok(())
    }

    /// Extents submitted and not yet received.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bytes the reads in flight transfer.
    pub fn in_flight_read_bytes(&self) -> u64 {
        self.in_flight_read_bytes
    }

    /// The read gap in use (resolved: never `auto`).
    pub fn gap(&self) -> ReadGap {
        self.gap
    }

    /// The backend in use (never `Auto`).
    pub fn backend(&self) -> IoBackend {
        self.engine.backend()
    }

    /// Whether `auto` wanted io_uring, was refused, and fell back to threads.
    pub fn uring_refused(&self) -> bool {
        self.engine.uring_refused()
    }

    /// Whether reads fell back from O_DIRECT to buffered I/O.
    pub fn buffered_fallback(&self) -> bool {
        self.engine.buffered_fallback()
    }

    /// Bytes registered with the ring (fixed buffers).
    pub fn registered_bytes(&self) -> u64 {
        self.engine.registered_bytes()
    }

    /// Peak bytes of ordinary read buffers (in use or idle).
    pub fn store_report(&self) -> Option<brand_store::GetReport> {
        self.engine.store_report()
    }

    pub fn tier_report(&self) -> Option<crate::tier::TierReport> {
        self.engine.tier_report()
    }

    /// The consumer took its first sample (a local tier's placement
    /// measures its waits from then on).
    pub fn consumer_started(&self) {
        self.engine.consumer_started();
    }

    /// The consumer waited `d` for a read.
    pub fn consumer_waited(&self, d: Duration) {
        self.engine.consumer_waited(d);
    }

    pub fn peak_pool_bytes(&self) -> u64 {
        self.engine.peak_pool_bytes()
    }

    /// The next completion, whatever its tag; a timeout marks the session
    /// hung. An engine that stopped leaves nothing in flight.
    fn recv_within_timeout(&mut self) -> Result<Completion> {
        match self.engine.recv_timeout(self.io_timeout) {
            Ok(Some(c)) => Ok(c),
            Ok(None) => {
                self.hung = true;
                Err(self.timeout_error())
            }
            Err(e) => {
                self.in_flight.clear();
                self.in_flight_read_bytes = 0;
                Err(e)
            }
        }
    }

    /// Takes tag `tag` out of flight; None if it is not (stale).
    fn forget(&mut self, tag: u64) -> Option<T> {
        let read = self.in_flight.remove(&tag)?;
        self.in_flight_read_bytes -= read.len;
        Some(read.payload)
    }

    /// The error for reads that stopped completing: names the oldest one.
    fn timeout_error(&self) -> Error {
        let secs = self.io_timeout.as_secs_f64();
        match self.in_flight.iter().min_by_key(|(tag, _)| **tag) {
            Some((_, read)) => Error::io(
                self.ds.segment_path(read.segment),
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no read completed within io_timeout ({secs}s): the read of {} bytes at byte {} is still pending (hung storage?)",
                        read.len, read.offset
                    ),
                ),
            ),
            None => Error::config(format!("no read completed within io_timeout ({secs}s)")),
        }
    }
}

impl<T> Drop for ReadSession<T> {
    fn drop(&mut self) {
        // Buffers go back before the engine does; reads stuck on hung
        // storage are not waited for again (the engine leaves them). GETs
        // hold no buffer of the engine's that outlives it: the objects
        // backend aborts them when the engine goes, rather than fetching a
        // closed reader's read-ahead first.
        if !self.hung && self.engine.backend() != IoBackend::Objects {
            let _ = self.drain();
        }
        if self.hung {
            self.engine.abandon();
        }
    }
}

/// The dataset as far as its directory holds it: for a partition, a view
/// listing only its own segment files, so that probing the device (the
/// `auto` read gap) touches only files that are here. Reads still go
/// through the whole dataset's numbering.
/// The read gap `gap` asks for over `ds` read through an engine set up as
/// `io`: `auto` probes the segments this node holds (whole chunks when it
/// holds none).
pub fn resolve_gap(ds: &Arc<Dataset>, io: &EngineConfig, gap: ReadGapSetting) -> Result<ReadGap> {
    match gap {
        ReadGapSetting::Auto => {
            let local = local_segments(ds);
            if local.manifest.segments.is_empty() {
                Ok(ReadGap::Whole)
            } else {
                crate::probe::read_gap(gap, &local, io)
            }
        }
        fixed => crate::probe::read_gap(fixed, ds, io),
    }
}

fn local_segments(ds: &Arc<Dataset>) -> Arc<Dataset> {
    if ds.manifest.partition.is_none() {
        return ds.clone();
    }
    let mut view = (**ds).clone();
    view.manifest.segments = (0..ds.manifest.segments.len() as u32)
        .filter(|&s| ds.holds_segment(s))
        .map(|s| ds.manifest.segments[s as usize].clone())
        .collect();
    Arc::new(view)
}
