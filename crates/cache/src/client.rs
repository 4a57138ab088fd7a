//! A job attached to a cache: the same batches, states and errors as a
//! [`brand_loader::Loader`], with the samples mapped from the cache's
//! shared memory instead of read from storage.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use brand_format::Dataset;
use brand_format::buffer::AlignedBuf;
use brand_format::error::{Error, Result};
use brand_format::ids::IdBits;
use brand_loader::{Batch, LoaderConfig, LoaderState, Metrics, SampleBytes};

use crate::shm::{Mapping, recv_with_fd, send_all};
use crate::wire::{Digest, Hello, ToCache, ToJob, read_frame};

/// The connection, shared with the batches (their releases).
struct Link {
    stream: UnixStream,
    write: Mutex<()>,
}

impl Link {
    fn send(&self, m: &ToCache) -> io::Result<()> {
        let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        send_all(self.stream.as_raw_fd(), &m.encode())
    }
}

/// One batch's samples: kept alive (and the shared memory mapped) while any
/// of them is; the last to go tells the cache.
struct Lease {
    link: Arc<Link>,
    _memory: Arc<Mapping>,
    ids: Vec<u32>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The cache may be gone already: then there is nothing to release.
        let _ = self.link.send(&ToCache::Release(std::mem::take(&mut self.ids)));
    }
}

/// Where a job stands in its epoch, with which samples it served (what a
/// resume needs when the order depends on timing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub epoch: u64,
    /// The samples of `epoch` served, of all the dataset's.
    pub ids: IdBits,
}

pub struct Attached {
    ds: Arc<Dataset>,
    socket: PathBuf,
    link: Arc<Link>,
    memory: Arc<Mapping>,
    seed: u64,
    batch_size: usize,
    epoch: u64,
    served: IdBits,
    /// The epoch's last batch went out: the next call ends the epoch.
    end_pending: bool,
    failed: Option<String>,
    metrics: Metrics,
}

impl Attached {
    /// Attaches to the cache listening at `socket`, starting where `from`
    /// says (its epoch; the samples it marks served are not served again).
    pub fn open(ds: Arc<Dataset>, cfg: &LoaderConfig, socket: &Path, from: Served) -> Result<Self> {
        cfg.check()?;
        if cfg.plan.world > 1 {
            return Err(Error::config(format!(
                "cache = {:?} with world {}: an attached job is one consumer; shard by running one job per rank",
                socket.display(),
                cfg.plan.world
            )));
        }
        let n = ds.index.samples();
        if from.ids.samples() != n {
            return Err(Error::InvalidState(format!(
                "the samples served are of a dataset of {} samples, this one has {n}",
                from.ids.samples()
            )));
        }
        // None served: sent as no words (the protocol's "none").
        let words = if from.ids.is_empty() { &[][..] } else { from.ids.words() };
        let (link, memory) = connect(&ds, socket, cfg, from.epoch, words)?;
        let mut a = Attached {
            ds,
            socket: socket.to_path_buf(),
            link,
            memory,
            seed: cfg.plan.seed,
            batch_size: cfg.batch_size,
            epoch: from.epoch,
            served: from.ids,
            end_pending: false,
            failed: None,
            metrics: Metrics::default(),
        };
        if a.served.len() == n {
            a.next_epoch();
        }
        Ok(a)
    }

    fn next_epoch(&mut self) {
        self.epoch += 1;
        self.served.clear();
    }

    fn lost(&self, why: impl Into<String>) -> Error {
        Error::io(
            &self.socket,
            io::Error::new(io::ErrorKind::ConnectionAborted, why.into()),
        )
    }

    /// The next batch; `None` ends the epoch (the next call starts the next).
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        if let Some(why) = &self.failed {
            return Err(self.lost(why.clone()));
        }
        if self.end_pending {
            self.end_pending = false;
            return Ok(None);
        }
        let asked = Instant::now();
        loop {
            let (epoch, samples) = self.ask()?;
            if !samples.is_empty() {
                return self.batch(epoch, samples, asked).map(Some);
            }
            // Only skipped records: the epoch may have ended with them.
            if self.served.is_empty() && epoch != self.epoch {
                self.metrics.stall_secs_total += asked.elapsed().as_secs_f64();
                return Ok(None);
            }
        }
    }

    /// One `Next` answered: the batch's epoch and samples, its skipped
    /// records taken as served (an epoch they complete has ended).
    fn ask(&mut self) -> Result<(u64, Vec<crate::wire::Placed>)> {
        // A cache that stopped has sent why before closing: read it even
        // when the request can no longer be sent.
        let sent = self.link.send(&ToCache::Next);
        let reply = read_frame(&mut &self.link.stream);
        let (kind, body) = match (reply, sent) {
            (Ok(Some(frame)), _) => frame,
            (Ok(None), _) => return Err(self.fail("the cache closed the connection (it was stopped or killed)")),
            (Err(e), Ok(())) | (Err(_), Err(e)) => {
                return Err(self.fail(format!("the connection to the cache broke: {e}")));
            }
        };
        let (samples, skipped) = match ToJob::decode(kind, &body) {
            Ok(ToJob::Batch {
                epoch,
                samples,
                skipped,
            }) if epoch == self.epoch => (samples, skipped),
            Ok(ToJob::Batch { epoch, .. }) => {
                return Err(self.fail(format!("the cache sent epoch {epoch}'s batch in epoch {}", self.epoch)));
            }
            Ok(ToJob::Failed(why)) => return Err(self.fail(why)),
            Ok(other) => return Err(self.fail(format!("unexpected answer from the cache: {other:?}"))),
            Err(why) => return Err(self.fail(format!("a malformed answer from the cache: {why}"))),
        };
        let n = self.ds.index.samples();
        let epoch = self.epoch;
        for &id in &skipped {
            if id as u64 >= n {
                return Err(self.fail(format!("the cache skipped sample {id} of {n}")));
            }
            if !self.served.insert(id as u64) {
                return Err(self.fail(format!(
                    "the cache skipped sample {id} after serving it in epoch {}",
                    self.epoch
                )));
            }
            self.metrics.skipped_corrupt += 1;
        }
        for p in &samples {
            let ok = (p.id as u64) < n
                && p.len == self.ds.index.raw_len(p.id as u64)
                && self.memory.ptr_at(p.offset, p.len as usize).is_some()
                && p.offset.is_multiple_of(crate::arena::ALIGN);
            if !ok {
                return Err(self.fail(format!("the cache placed sample {} wrongly", p.id)));
            }
            if !self.served.insert(p.id as u64) {
                return Err(self.fail(format!(
                    "the cache served sample {} twice in epoch {}",
                    p.id, self.epoch
                )));
            }
        }
        if samples.is_empty() && self.served.len() == n {
            self.next_epoch();
        }
        Ok((epoch, samples))
    }

    /// The placed samples as a batch of epoch `epoch`, views of the mapping.
    fn batch(&mut self, epoch: u64, samples: Vec<crate::wire::Placed>, asked: Instant) -> Result<Batch> {
        let n = self.ds.index.samples();
        let lease = Arc::new(Lease {
            link: self.link.clone(),
            _memory: self.memory.clone(),
            ids: samples.iter().map(|p| p.id).collect(),
        });
        let mut ids = Vec::with_capacity(samples.len());
        let mut data: Vec<SampleBytes> = Vec::with_capacity(samples.len());
        for p in &samples {
            let Some(ptr) = self.memory.ptr_at(p.offset, p.len as usize) else {
                return Err(self.fail(format!("the cache placed sample {} wrongly", p.id)));
            };
            let ptr: NonNull<u8> = ptr;
            // SAFETY: checked inside the mapping and 64-byte aligned; the
            // cache does not reuse the region while the lease (the owner)
            // lives, and the buffer is only handed out behind an Arc.
            let buf = unsafe { AlignedBuf::foreign(ptr, p.len as usize, Box::new(lease.clone())) };
            ids.push(p.id as u64);
            data.push(Arc::new(buf));
            self.metrics.bytes_served += p.len as u64;
        }
        self.metrics.samples_served += samples.len() as u64;
        self.metrics.stall_secs_total += asked.elapsed().as_secs_f64();
        if self.served.len() == n {
            self.next_epoch();
            self.end_pending = true;
        }
        Ok(Batch::new(epoch, self.ds.clone(), ids, data))
    }

    fn fail(&mut self, why: impl Into<String>) -> Error {
        let why = why.into();
        self.failed = Some(why.clone());
        self.lost(why)
    }

    /// Where the job is (after an epoch's end: the next epoch and 0).
    pub fn state(&self) -> LoaderState {
        if self.end_pending {
            return LoaderState {
                epoch: self.epoch,
                served: 0,
            };
        }
        LoaderState {
            epoch: self.epoch,
            served: self.served.len(),
        }
    }

    /// Which samples of the current epoch the job served.
    pub fn served(&self) -> Served {
        Served {
            epoch: self.epoch,
            ids: self.served.clone(),
        }
    }

    /// Starts `epoch` afresh (reattaches, so the cache forgets this
    /// epoch's progress).
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        if self.state() == (LoaderState { epoch, served: 0 }) && !self.end_pending {
            return Ok(());
        }
        let cfg = {
            let mut c = LoaderConfig::default();
            c.plan.seed = self.seed;
            c.batch_size = self.batch_size;
            c
        };
        let (link, memory) = connect(&self.ds, &self.socket, &cfg, epoch, &[])?;
        let _ = self.link.stream.shutdown(std::net::Shutdown::Both);
        self.link = link;
        self.memory = memory;
        self.epoch = epoch;
        self.served.clear();
        self.end_pending = false;
        self.failed = None;
        Ok(())
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    pub fn reset_metrics(&mut self) {
        self.metrics = Metrics::default();
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // Detach now; batches still alive keep the memory mapped.
        let _ = self.link.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Attaches, starting in `epoch` with the samples `served` (a bitmap's
/// words, none if empty) served already.
fn connect(
    ds: &Dataset,
    socket: &Path,
    cfg: &LoaderConfig,
    epoch: u64,
    served: &[u64],
) -> Result<(Arc<Link>, Arc<Mapping>)> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        Error::io(
            socket,
            io::Error::new(
                e.kind(),
                format!("no brand cache listens here (start one with brand cache): {e}"),
            ),
        )
    })?;
    let link = Arc::new(Link {
        stream,
        write: Mutex::new(()),
    });
    let hello = ToCache::Hello(Hello {
        digest: Digest::of(ds),
        seed: cfg.plan.seed,
        batch_size: u32::try_from(cfg.batch_size).unwrap_or(u32::MAX),
        epoch,
        served: served.to_vec(),
    });
    let io_err = |e: io::Error| Error::io(socket, e);
    link.send(&hello).map_err(io_err)?;
    // The welcome carries the descriptor: read its frame with recvmsg.
    let mut head = [0u8; 5];
    let fd = recv_with_fd(link.stream.as_raw_fd(), &mut head).map_err(io_err)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if !(1..=1 << 20).contains(&len) {
        return Err(io_err(io::Error::other(format!(
            "the cache answered a frame of {len} bytes"
        ))));
    }
    let mut body = vec![0u8; len - 1];
    std::io::Read::read_exact(&mut &link.stream, &mut body).map_err(io_err)?;
    match ToJob::decode(head[4], &body) {
        Ok(ToJob::Welcome { memory_len }) => {
            let fd = fd.ok_or_else(|| io_err(io::Error::other("the cache's welcome carried no shared memory")))?;
            let memory = Mapping::open_shared(fd, memory_len as usize).map_err(io_err)?;
            Ok((link, Arc::new(memory)))
        }
        Ok(ToJob::Refused(why)) => Err(Error::config(format!("{}: {why}", socket.display()))),
        Ok(other) => Err(io_err(io::Error::other(format!(
            "unexpected answer from the cache: {other:?}"
        )))),
        Err(why) => Err(io_err(io::Error::other(why))),
    }
}
