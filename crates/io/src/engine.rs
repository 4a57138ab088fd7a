//! The engine: executes extent reads (O_DIRECT, up to `queue_depth` at a
//! time) on one of two backends, verifies every record it was asked for
//! (crc32c, zstd) off the caller's thread and hands the samples back.
//!
//! * [`IoBackend::Uring`]: `tokio-uring` reactors (up to two rings, jobs
//!   round-robin), each on its own thread. A reactor checks the
//!   uncompressed records it read itself (their bytes are in its cache);
//!   compressed ones are checked and decompressed by a small pool
//!   (`decode_threads`, by default the cores the reactors leave: see
//!   [`default_decode_threads`]), so decompression does not hold up the
//!   reactors where there are cores to spare.
//! * [`IoBackend::Threads`]: `queue_depth` threads doing `pread` (portable:
//!   works where io_uring is refused by seccomp, gVisor or
//!   `kernel.io_uring_disabled`); each thread decodes what it read.
//!
//! The engine never decides what to read: jobs arrive in plan order from the
//! loader, and completions go back tagged, so the loader matches them to
//! plan events whatever order the device finishes in.

use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::Extent;

/// Which I/O backend runs the reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoBackend {
    /// io_uring where the kernel allows it, else threads (one warning).
    Auto,
    Uring,
    Threads,
}

impl std::str::FromStr for IoBackend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(IoBackend::Auto),
            "uring" => Ok(IoBackend::Uring),
            "threads" => Ok(IoBackend::Threads),
            _ => Err(Error::config(format!(
                "io_backend {s:?}: expected auto, uring or threads"
            ))),
        }
    }
}

impl std::fmt::Display for IoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoBackend::Auto => "auto",
            IoBackend::Uring => "uring",
            IoBackend::Threads => "threads",
        })
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Reads in flight at once.
    pub queue_depth: usize,
    /// Try O_DIRECT (falls back to buffered reads, with one warning, where
    /// the filesystem refuses it).
    pub direct: bool,
    /// Check every record's crc32c.
    pub verify: bool,
    /// Read into buffers registered with the ring (io_uring fixed buffers:
    /// about half the CPU per read). Reads larger than [`FIXED_BUF_BYTES`],
    /// or beyond the registered count, use ordinary aligned buffers.
    pub fixed_buffers: bool,
    /// Most bytes of registered buffers (the loader passes its readahead,
    /// capped by the dataset's size); less than one buffer registers none.
    pub fixed_buffer_bytes: u64,
    pub backend: IoBackend,
    /// Threads that verify and decompress compressed records read by
    /// io_uring (0: the reactor that read them does; uncompressed ones it
    /// always checks itself; the threads backend decodes on its reader
    /// threads). Default: [`default_decode_threads`].
    pub decode_threads: usize,
    /// How long [`Engine::drop`] waits for reads still in flight before it
    /// leaves them to finish on their own.
    pub io_timeout: Duration,
}

/// Size of each registered buffer: holds any merged read of filled records
/// where the gap is small ([`MERGED_READ_BYTES`]); whole chunks and longer
/// records go unregistered.
///
/// [`MERGED_READ_BYTES`]: brand_format::extents::MERGED_READ_BYTES
pub const FIXED_BUF_BYTES: usize = brand_format::extents::MERGED_READ_BYTES as usize;

/// Retries of a read that failed with EAGAIN or EINTR before it is an error.
const TRANSIENT_RETRIES: u32 = 16;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            queue_depth: 32,
            direct: true,
            verify: true,
            fixed_buffers: true,
            fixed_buffer_bytes: 64 << 20,
            backend: IoBackend::Auto,
            decode_threads: default_decode_threads(),
            io_timeout: Duration::from_secs(60),
        }
    }
}

/// Most decode threads by default: 8 cores decompress zstd faster than a
/// fast NVMe drive reads it (~1.7 GB/s of stored bytes per core here).
const MAX_DEFAULT_DECODE_THREADS: usize = 8;

/// The decode pool's default size: the cores the io_uring reactors leave
/// (one reactor per core, at most two), at most 8. Where no core is left
/// (2 cores, as on this project's machine) it is 0 and the reactors
/// decompress what they read: there a pool only adds a hand-off per read
/// and competes with the reactors for the same cores (zstd, direct policy,
/// tmpfs, 7 interleaved rounds: 0 threads took 0.86x the CPU per byte of 2
/// and read 1.15x the bytes/s).
pub fn default_decode_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores
        .saturating_sub(crate::uring::RINGS.min(cores))
        .min(MAX_DEFAULT_DECODE_THREADS)
}

/// One extent to read; `tag` comes back with its completion.
pub struct Job {
    pub tag: u64,
    pub extent: Extent,
}

/// One record's outcome: its decoded bytes, or why it cannot be served.
pub type RecordResult = Result<AlignedBuf>;

/// A finished job: each record it carried (decoded, or its own error), or
/// the I/O error that stopped the whole read.
pub struct Completion {
    pub tag: u64,
    pub bytes_read: u64,
    pub result: Result<Vec<(u64, RecordResult)>>,
}

/// Counters the engine keeps for the loader's metrics.
#[derive(Debug, Default)]
pub(crate) struct EngineStats {
    pub buffered_fallback: AtomicBool,
    pub fixed_in_use: AtomicBool,
    /// Bytes of buffers registered with the ring.
    pub registered_bytes: AtomicU64,
    /// Bytes of ordinary read buffers allocated (in use or pooled), and their peak.
    pub pool_bytes: AtomicU64,
    pub pool_peak_bytes: AtomicU64,
}

impl EngineStats {
    pub fn pool_grew(&self, by: u64) {
        let now = self.pool_bytes.fetch_add(by, Ordering::Relaxed) + by;
        self.pool_peak_bytes.fetch_max(now, Ordering::Relaxed);
    }
    pub fn pool_shrank(&self, by: u64) {
        self.pool_bytes.fetch_sub(by, Ordering::Relaxed);
    }
}

/// What both backends share: the dataset, the settings, where completions go.
#[derive(Clone)]
pub(crate) struct Shared {
    pub ds: Arc<Dataset>,
    pub cfg: EngineConfig,
    pub done: crossbeam_channel::Sender<Completion>,
    pub stats: Arc<EngineStats>,
}

pub(crate) enum JobSender {
    /// One sender per ring; jobs go round-robin.
    Uring(Vec<tokio::sync::mpsc::UnboundedSender<Job>>, AtomicUsize),
    Threads(crossbeam_channel::Sender<Job>),
}

/// A started backend: where jobs go, its threads, and a channel that
/// disconnects when every one of them has finished.
pub(crate) struct Started {
    pub jobs: JobSender,
    pub threads: Vec<std::thread::JoinHandle<()>>,
    pub exited: crossbeam_channel::Receiver<()>,
}

pub struct Engine {
    jobs: Option<JobSender>,
    done: crossbeam_channel::Receiver<Completion>,
    threads: Vec<std::thread::JoinHandle<()>>,
    exited: crossbeam_channel::Receiver<()>,
    stats: Arc<EngineStats>,
    backend: IoBackend,
    uring_refused: bool,
    io_timeout: Duration,
}

/// Whether an error from setting up io_uring means "not allowed here"
/// (seccomp, gVisor, `kernel.io_uring_disabled`), as opposed to a real failure.
pub fn uring_refused(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS | libc::EACCES))
}

impl Engine {
    /// Starts the backend `cfg.backend` names; `Auto` falls back from
    /// io_uring to threads, with one warning, where io_uring is refused.
    pub fn start(ds: Arc<Dataset>, cfg: EngineConfig) -> Result<Self> {
        if cfg.queue_depth == 0 {
            return Err(Error::config("queue depth must be at least 1"));
        }
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let stats = Arc::new(EngineStats::default());
        let shared = Shared {
            ds,
            cfg: cfg.clone(),
            done: done_tx,
            stats: stats.clone(),
        };
        let (started, backend, uring_refused) = match cfg.backend {
            IoBackend::Threads => (crate::threads::start(shared)?, IoBackend::Threads, false),
            IoBackend::Uring => match crate::uring::start(shared) {
                Ok(s) => (s, IoBackend::Uring, false),
                Err((e, _)) => return Err(Error::io("<io_uring>", e)),
            },
            IoBackend::Auto => match crate::uring::start(shared) {
                Ok(s) => (s, IoBackend::Uring, false),
                Err((e, Some(shared))) if uring_refused(&e) => {
                    tracing::warn!("io_uring refused ({e}); reading with the threads backend");
                    (crate::threads::start(shared)?, IoBackend::Threads, true)
                }
                Err((e, _)) => return Err(Error::io("<io_uring>", e)),
            },
        };
        Ok(Engine {
            jobs: Some(started.jobs),
            done: done_rx,
            threads: started.threads,
            exited: started.exited,
            stats,
            backend,
            uring_refused,
            io_timeout: cfg.io_timeout,
        })
    }

    pub fn submit(&self, job: Job) -> Result<()> {
        let sent = match &self.jobs {
            Some(JobSender::Uring(rings, next)) => {
                let i = next.fetch_add(1, Ordering::Relaxed) % rings.len();
                rings[i].send(job).is_ok()
            }
            Some(JobSender::Threads(j)) => j.send(job).is_ok(),
            None => false,
        };
        if sent { Ok(()) } else { Err(stopped()) }
    }

    /// The next completion, waiting for it.
    pub fn recv(&self) -> Result<Completion> {
        self.done.recv().map_err(|_| stopped())
    }

    /// A completion that has arrived already, if any (never waits).
    pub fn try_recv(&self) -> Result<Option<Completion>> {
        match self.done.try_recv() {
            Ok(c) => Ok(Some(c)),
            Err(crossbeam_channel::TryRecvError::Empty) => Ok(None),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(stopped()),
        }
    }

    /// The next completion, or `Ok(None)` if none arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Completion>> {
        match self.done.recv_timeout(timeout) {
            Ok(c) => Ok(Some(c)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(None),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(stopped()),
        }
    }

    /// The backend in use (never `Auto`).
    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    /// Whether `auto` wanted io_uring, was refused, and fell back to threads.
    pub fn uring_refused(&self) -> bool {
        self.uring_refused
    }

    /// Whether reads use buffers registered with the ring.
    pub fn fixed_buffers_in_use(&self) -> bool {
        self.stats.fixed_in_use.load(Ordering::Relaxed)
    }

    /// Whether reads fell back from O_DIRECT to buffered I/O.
    pub fn buffered_fallback(&self) -> bool {
        self.stats.buffered_fallback.load(Ordering::Relaxed)
    }

    /// Bytes registered with the ring (fixed buffers).
    pub fn registered_bytes(&self) -> u64 {
        self.stats.registered_bytes.load(Ordering::Relaxed)
    }

    /// Drop stops waiting for reads in flight (they are stuck: the caller
    /// has seen a read time out).
    pub fn abandon(&mut self) {
        self.io_timeout = Duration::ZERO;
    }

    /// Peak bytes of ordinary read buffers (in use or idle).
    pub fn peak_pool_bytes(&self) -> u64 {
        self.stats.pool_peak_bytes.load(Ordering::Relaxed)
    }
}

fn stopped() -> Error {
    Error::config("the io engine has stopped")
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the job channel ends the backend once in-flight reads
        // finish; a read stuck on hung storage is not waited for beyond
        // io_timeout: its thread is left to finish (or not) on its own.
        self.jobs.take();
        let deadline = self.io_timeout.max(Duration::from_millis(1));
        match self.exited.recv_timeout(deadline) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "io engine: reads still in flight after {:?}; not waiting for them",
                    deadline
                );
                self.threads.clear();
            }
            _ => {
                for t in self.threads.drain(..) {
                    let _ = t.join();
                }
            }
        }
    }
}

/// Opens a segment for reading: refuses anything but a regular file (a FIFO
/// would block every read), tries O_DIRECT first when asked and falls back,
/// with one warning, where the filesystem refuses it. Never blocks on open
/// (O_NONBLOCK, which regular files ignore).
pub(crate) fn open_segment(path: &Path, direct: bool, stats: &EngineStats) -> Result<std::fs::File> {
    let open = |flags: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | flags)
            .open(path)
    };
    let direct = direct && !stats.buffered_fallback.load(Ordering::Relaxed);
    let (file, refused) = if direct {
        match open(libc::O_DIRECT) {
            Ok(f) => (f, false),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0).map_err(|e| Error::io(path, e))?, true),
            Err(e) => return Err(Error::io(path, e)),
        }
    } else {
        (open(0).map_err(|e| Error::io(path, e))?, false)
    };
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.file_type().is_file() {
        let kind = if meta.file_type().is_fifo() {
            "a FIFO"
        } else if meta.is_dir() {
            "a directory"
        } else if meta.file_type().is_socket() {
            "a socket"
        } else {
            "a device or special file"
        };
        return Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("segment is {kind}, not a regular file"),
            ),
        ));
    }
    if refused {
        fall_back(path, stats);
    }
    Ok(file)
}

/// Records (once, with a warning) that O_DIRECT was refused for `path`.
pub(crate) fn fall_back(path: &Path, stats: &EngineStats) {
    if !stats.buffered_fallback.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{}: O_DIRECT refused by the filesystem; using buffered reads",
            path.display()
        );
    }
}

/// How one attempt at a read ended, for [`ReadLoop`].
pub(crate) enum Step {
    /// Read more (or retry).
    Again,
    /// The extent is read.
    Done,
    /// Reopen without O_DIRECT and retry.
    Reopen,
    Fail(Error),
}

/// The bookkeeping of reading one extent completely, shared by both
/// backends: short reads continue, EOF names the file's real end, transient
/// errors are retried a bounded number of times, O_DIRECT refused at read
/// time falls back, and every other errno is an I/O error (not corruption).
pub(crate) struct ReadLoop<'a> {
    pub ds: &'a Dataset,
    pub ext: &'a Extent,
    pub done: usize,
    pub direct: bool,
    transient: u32,
}

impl<'a> ReadLoop<'a> {
    pub fn new(ds: &'a Dataset, ext: &'a Extent, direct: bool) -> Self {
        ReadLoop {
            ds,
            ext,
            done: 0,
            direct,
            transient: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.ext.len as usize
    }

    pub fn pos(&self) -> u64 {
        self.ext.offset + self.done as u64
    }

    /// Accounts for one read's result.
    pub fn step(&mut self, res: std::io::Result<usize>, stats: &EngineStats) -> Step {
        match res {
            Ok(0) => Step::Fail(self.short_read()),
            Ok(n) => {
                self.done += n;
                if self.done >= self.len() {
                    Step::Done
                } else {
                    Step::Again
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && self.direct => {
                let path = self.ds.segment_path(self.ext.segment);
                fall_back(&path, stats);
                self.direct = false;
                Step::Reopen
            }
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR))
                    && self.transient < TRANSIENT_RETRIES =>
            {
                self.transient += 1;
                Step::Again
            }
            Err(e) => Step::Fail(self.io_error(e)),
        }
    }

    /// An I/O error of this read, naming the file and the offset.
    pub fn io_error(&self, e: std::io::Error) -> Error {
        Error::io(
            self.ds.segment_path(self.ext.segment),
            std::io::Error::new(
                e.kind(),
                format!("reading {} bytes at byte {}: {e}", self.len() - self.done, self.pos()),
            ),
        )
    }

    /// The segment ended before the extent did: data is missing.
    fn short_read(&self) -> Error {
        let path = self.ds.segment_path(self.ext.segment);
        let end = std::fs::metadata(&path).map(|m| m.size()).unwrap_or(self.pos());
        let sample = self.ext.records.first().map(|r| r.0).unwrap_or(0);
        Error::Corrupt {
            chunk: self.ds.index.chunk_of(sample),
            segment: path,
            offset: self.pos(),
            sample,
            what: format!(
                "segment ends at byte {end} (truncated?): needed bytes {}..{}",
                self.ext.offset,
                self.ext.offset + self.ext.len
            ),
        }
    }
}

/// Uncompressed records of at least this many bytes that are alone in their
/// extent are read into a buffer of their own that becomes the sample
/// ([`ExtentBytes::Owned`](brand_format::decode::ExtentBytes::Owned)): no copy out of a read buffer. Smaller ones are
/// copied (their page slack would be a larger share of resident memory).
pub(crate) const IN_PLACE_MIN: usize = brand_format::extents::READ_ALONE_BYTES as usize;

/// Whether `ext` is read into a buffer that becomes its record's sample
/// (see [`IN_PLACE_MIN`]). Compressed records are decompressed into a
/// buffer of their own anyway.
pub(crate) fn reads_in_place(ds: &Dataset, ext: &Extent) -> bool {
    !ds.zstd()
        && matches!(ext.records.as_slice(), [(id, _)]
            if ds.index.stored_len.get(*id as usize).is_some_and(|&n| n as usize >= IN_PLACE_MIN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brand_format::buffer::SAMPLE_ALIGN;
    use brand_format::decode::ExtentBytes;
    use brand_pack::PackOptions;
    use brand_pack::synthetic::{GenOptions, generate_and_pack};

    /// A dataset packed from generated samples under `root/src`.
    fn dataset(root: &Path, zstd: Option<i32>) -> Dataset {
        let g = GenOptions {
            samples: 24,
            mean_bytes: 90_000,
            min_bytes: 100,
            max_bytes: 200_000,
            classes: 2,
            compressible: zstd.map(|_| 3),
            ..Default::default()
        };
        let p = PackOptions {
            chunk_size: 8,
            zstd,
            ..Default::default()
        };
        Dataset::open(generate_and_pack(root, &g, &p).expect("pack")).expect("open")
    }

    /// The generator's file for sample `id` (its key is the path under
    /// `root/src`): what decoding must give back, found without the decoder.
    fn source_bytes(root: &Path, ds: &Dataset, id: u64) -> Vec<u8> {
        let key = std::str::from_utf8(ds.index.key(id)).expect("utf-8 key");
        std::fs::read(root.join("src").join(key)).expect("source file")
    }

    /// Record `id` exactly as stored in its segment.
    fn stored_bytes(ds: &Dataset, id: u64) -> Vec<u8> {
        let (segment, offset, len) = ds.index.record_location(id);
        let seg = std::fs::read(ds.segment_path(segment)).expect("segment");
        seg[offset as usize..offset as usize + len as usize].to_vec()
    }

    /// A record read alone into a buffer of its own is served from that very
    /// buffer, 64-aligned, with the generator's bytes, wherever it starts in
    /// it (on a 64-byte boundary or not); a damaged record gets its crc
    /// error, not a sample; one that runs past its read, its own error.
    #[test]
    fn in_place_decode_serves_the_record_aligned_and_names_damage() {
        let t = tempfile::tempdir().expect("tempdir");
        let ds = dataset(t.path(), None);
        let id = (0..ds.index.samples())
            .find(|&i| ds.index.stored_len[i as usize] as usize >= IN_PLACE_MIN)
            .expect("a record of at least IN_PLACE_MIN bytes");
        let segment = ds.index.record_location(id).0;
        let record = stored_bytes(&ds, id);
        let want = source_bytes(t.path(), &ds, id);
        let len = record.len();
        for at in [0usize, 64, 4096 + 192, 1, 63, 100, 4095] {
            for damaged in [false, true] {
                let ext = Extent {
                    segment,
                    offset: 0,
                    len: brand_format::align_up((at + len) as u64),
                    records: vec![(id, at as u64)],
                };
                assert!(reads_in_place(&ds, &ext));
                let mut buf = AlignedBuf::for_extent(ext.len as usize);
                buf.spare_mut()[..ext.len as usize].fill(0xee);
                buf.spare_mut()[at..at + len].copy_from_slice(&record);
                if damaged {
                    buf.spare_mut()[at + len / 2] ^= 0x01;
                }
                buf.set_len(ext.len as usize);
                let base = buf.as_ptr() as usize;
                let mut out = ds.decode_extent(&ext, ExtentBytes::Owned(buf), true);
                assert_eq!(out.len(), 1);
                let (got, result) = out.remove(0);
                assert_eq!(got, id);
                if damaged {
                    let err = result.expect_err("a damaged record is no sample").to_string();
                    assert!(
                        err.contains("crc32c mismatch") && err.contains(&format!("sample {id}")),
                        "at {at}: {err}"
                    );
                    continue;
                }
                let sample = result.expect("good record");
                assert_eq!(&sample[..], &want[..], "at {at}");
                assert_eq!(sample.as_ptr() as usize % SAMPLE_ALIGN, 0, "at {at}");
                assert_eq!(
                    sample.as_ptr() as usize,
                    base + at / SAMPLE_ALIGN * SAMPLE_ALIGN,
                    "at {at}: served from the buffer it was read into"
                );
            }
        }
        // The record runs past the bytes read: its own error, no panic.
        let ext = Extent {
            segment,
            offset: 0,
            len: brand_format::align_up(len as u64) - 4096,
            records: vec![(id, 0)],
        };
        let mut buf = AlignedBuf::for_extent(ext.len as usize);
        buf.set_len(ext.len as usize);
        let out = ds.decode_extent(&ext, ExtentBytes::Owned(buf), true);
        let err = out[0].1.as_ref().expect_err("short").to_string();
        assert!(err.contains("runs past its read"), "{err}");
        // Compressed records and small ones take the copying path.
        let small = (0..ds.index.samples())
            .find(|&i| (ds.index.stored_len[i as usize] as usize) < IN_PLACE_MIN)
            .expect("a small record");
        let ext_of = |id| Extent {
            segment,
            offset: 0,
            len: 4096,
            records: vec![(id, 0)],
        };
        assert!(!reads_in_place(&ds, &ext_of(small)));
        let t = tempfile::tempdir().expect("tempdir");
        assert!(!reads_in_place(&dataset(t.path(), Some(3)), &ext_of(id)));
    }

    /// Decoding a record (the one-pass copy and crc32c where uncompressed,
    /// zstd where compressed) gives the generator's bytes, alone or among
    /// its extent's records; a damaged record gets its named error, not a
    /// sample, and spoils no neighbour.
    #[test]
    fn fast_decode_matches_the_source_and_names_damage() {
        for zstd in [None, Some(3)] {
            let t = tempfile::tempdir().expect("tempdir");
            let ds = dataset(t.path(), zstd);
            for id in 0..ds.index.samples() {
                let want = source_bytes(t.path(), &ds, id);
                let mut stored = stored_bytes(&ds, id);
                let decoded = ds.decode(id, &stored, true).expect("good record");
                assert_eq!(&decoded[..], &want[..], "{zstd:?} sample {id}");
                assert_eq!(decoded.as_ptr() as usize % SAMPLE_ALIGN, 0);
                let last = stored.len() - 1;
                stored[last] ^= 0x10;
                let err = ds.decode(id, &stored, true).expect_err("damaged record");
                assert!(
                    err.to_string().contains("crc32c mismatch"),
                    "{zstd:?} sample {id}: {err}"
                );
                let err = ds.decode(id, &stored[..last], true).expect_err("short record");
                assert!(err.to_string().contains("index says"), "{zstd:?} sample {id}: {err}");
            }
            // Whole chunks, one record damaged in the read buffer.
            for chunk in 0..ds.index.chunk_count() {
                let ext = brand_format::extents::extents(
                    &ds.index,
                    chunk,
                    u64::MAX,
                    brand_format::extents::ReadGap::Whole,
                );
                let [ext] = &ext[..] else { panic!("one extent per whole chunk") };
                let seg = std::fs::read(ds.segment_path(ext.segment)).expect("segment");
                let mut bytes = seg[ext.offset as usize..(ext.offset + ext.len) as usize].to_vec();
                let (bad, at) = ext.records[1];
                bytes[at as usize] ^= 0x01;
                let out = ds.decode_extent(ext, ExtentBytes::Borrowed(&bytes), true);
                assert_eq!(out.len(), ext.records.len());
                for (id, result) in out {
                    if id == bad {
                        let err = result.expect_err("damaged record").to_string();
                        assert!(err.contains("crc32c mismatch"), "{zstd:?} sample {id}: {err}");
                    } else {
                        let sample = result.expect("good record");
                        assert_eq!(&sample[..], &source_bytes(t.path(), &ds, id)[..], "{zstd:?} sample {id}");
                    }
                }
            }
        }
    }
}
