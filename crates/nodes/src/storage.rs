//! The only module that reads: a node's chunk records through a brand-io
//! [`ReadSession`], with the same device-aware extents and read gap as the
//! loader.

use std::sync::Arc;

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::Result;
use brand_format::extents::ReadGap;
use brand_io::ReadSession;
use brand_loader::IoConfig;

/// One finished extent of a read.
pub struct Done {
    /// The caller's number for the read this extent belongs to.
    pub read: usize,
    pub bytes_read: u64,
    pub result: Result<Vec<(u64, AlignedBuf)>>,
}

/// Reads in flight, each extent tagged with the number of its read.
pub struct Storage {
    session: ReadSession<usize>,
}

impl Storage {
    /// Storage over `ds` with the engine `io` asks for, at most
    /// `registered_bytes` of buffers registered with io_uring.
    pub fn open(ds: Arc<Dataset>, io: &IoConfig, registered_bytes: u64) -> Result<Self> {
        let cfg = io.engine_config(&ds, registered_bytes);
        Ok(Storage {
            session: ReadSession::open(ds, cfg, io.read_gap)?,
        })
    }

    /// Starts reading the records of `chunk` in `mask`; returns the bytes
    /// the device will transfer.
    pub fn submit(&mut self, read: usize, chunk: u64, mask: u64) -> Result<u64> {
        self.submit_as(read, chunk, mask, false)
    }

    /// [`submit`](Self::submit) of a start's first fill, record by record
    /// (`brand_io::engine::Job::first_fill`).
    pub fn submit_first_fill(&mut self, read: usize, chunk: u64, mask: u64) -> Result<u64> {
        self.submit_as(read, chunk, mask, true)
    }

    fn submit_as(&mut self, read: usize, chunk: u64, mask: u64, first_fill: bool) -> Result<u64> {
        let mut bytes = 0;
        for extent in self.session.extents(chunk, mask) {
            bytes += extent.len;
            self.session.submit_as(extent, read, first_fill)?;
        }
        Ok(bytes)
    }

    /// The bytes the device would transfer for the records of `chunk` in
    /// `mask`.
    pub fn bytes(&self, chunk: u64, mask: u64) -> u64 {
        self.session.extents(chunk, mask).iter().map(|e| e.len).sum()
    }

    /// Extents submitted and not yet received.
    pub fn in_flight(&self) -> usize {
        self.session.in_flight()
    }

    /// The next finished extent (waits for one, at most `io_timeout`; call
    /// only with extents in flight).
    pub fn recv(&mut self) -> Result<Done> {
        let (read, c) = self.session.recv()?;
        // A record that fails its check fails the whole read: the owner
        // stops and its consumers name it (no on_corrupt skip in multi-node
        // mode yet).
        let result = c.result.and_then(|records| {
            records
                .into_iter()
                .map(|(id, record)| record.map(|bytes| (id, bytes)))
                .collect()
        });
        Ok(Done {
            read,
            bytes_read: c.extent.len,
            result,
        })
    }

    /// The read gap chosen (None: whole chunks).
    pub fn read_gap(&self) -> Option<u64> {
        match self.session.gap() {
            ReadGap::Whole => None,
            ReadGap::Bytes(b) => Some(b),
        }
    }

    pub fn gap(&self) -> ReadGap {
        self.session.gap()
    }

    pub fn buffered_fallback(&self) -> bool {
        self.session.buffered_fallback()
    }
}
