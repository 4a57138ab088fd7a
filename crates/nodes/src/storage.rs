//! The only module that talks to brand-io's engine: reads a node's chunk
//! records with the same device-aware extents as the loader
//! (`brand_format::extents`, read gap whole/bytes/auto).

use std::collections::HashMap;
use std::sync::Arc;

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::Result;
use brand_format::extents::{ReadGap, extents};
use brand_io::engine::{Engine, Job};
use brand_loader::IoConfig;

/// One finished extent of a read.
pub struct Done {
    /// The caller's number for the read this extent belongs to.
    pub read: usize,
    pub bytes_read: u64,
    pub result: Result<Vec<(u64, AlignedBuf)>>,
}

pub struct Storage {
    engine: Engine,
    ds: Arc<Dataset>,
    gap: ReadGap,
    next_tag: u64,
    /// Read number of each extent in flight, by engine tag.
    in_flight: HashMap<u64, usize>,
    io_timeout: std::time::Duration,
}

impl Storage {
    /// Storage over `ds` with the engine `io` asks for, at most
    /// `registered_bytes` of buffers registered with io_uring.
    pub fn open(ds: Arc<Dataset>, io: &IoConfig, registered_bytes: u64) -> Result<Self> {
        let local = local_segments(&ds);
        let engine = Engine::start(ds.clone(), io.engine_config(&local, registered_bytes))?;
        // A partition that holds nothing never reads (and has nothing to probe).
        let gap = if local.manifest.segments.is_empty() {
            ReadGap::Whole
        } else {
            io.read_gap(&local, &engine, registered_bytes)?
        };
        Ok(Storage {
            engine,
            ds,
            gap,
            next_tag: 0,
            in_flight: HashMap::new(),
            io_timeout: io.io_timeout,
        })
    }

    /// Starts reading the records of `chunk` in `mask`; returns the bytes
    /// the device will transfer.
    pub fn submit(&mut self, read: usize, chunk: u64, mask: u64) -> Result<u64> {
        let mut bytes = 0;
        for extent in extents(&self.ds.index, chunk, mask, self.gap) {
            bytes += extent.len;
            self.next_tag += 1;
            self.in_flight.insert(self.next_tag, read);
            self.engine.submit(Job {
                tag: self.next_tag,
                extent,
            })?;
        }
        Ok(bytes)
    }

    /// Extents submitted and not yet received.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The next finished extent (waits for one; call only with extents in flight).
    pub fn recv(&mut self) -> Result<Done> {
        loop {
            let c = self.engine.recv()?;
            if let Some(read) = self.in_flight.remove(&c.tag) {
                // A record that fails its check fails the whole read: the
                // owner stops and its consumers name it (no on_corrupt skip
                // in multi-node mode yet).
                let result = c.result.and_then(|records| {
                    records
                        .into_iter()
                        .map(|(id, record)| record.map(|bytes| (id, bytes)))
                        .collect()
                });
                return Ok(Done {
                    read,
                    bytes_read: c.bytes_read,
                    result,
                });
            }
        }
    }

    /// The read gap chosen (None: whole chunks).
    pub fn read_gap(&self) -> Option<u64> {
        match self.gap {
            ReadGap::Whole => None,
            ReadGap::Bytes(b) => Some(b),
        }
    }

    pub fn buffered_fallback(&self) -> bool {
        self.engine.buffered_fallback()
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // The engine finishes what is in flight; wait so buffers go back first.
        // A read stuck on hung storage is not waited for beyond io_timeout.
        while !self.in_flight.is_empty() {
            match self.engine.recv_timeout(self.io_timeout) {
                Ok(Some(c)) => {
                    self.in_flight.remove(&c.tag);
                }
                Ok(None) => {
                    self.engine.abandon();
                    break;
                }
                Err(_) => break,
            }
        }
    }
}

/// The dataset as far as this directory holds it: for a partition, a view
/// listing only its own segment files, so that what sizes the engine and
/// probes the device (the `auto` read gap) touches only files that are here.
/// Reads still go through the whole dataset's numbering; the owner reads
/// only its own chunks, which are all in these segments.
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
