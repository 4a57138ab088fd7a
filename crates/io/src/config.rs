//! How to read: the settings a user gives ([`IoConfig`]: backend, queue
//! depth, read gap, ...) and the engine's own ([`EngineConfig`]), with their
//! defaults.

use std::time::Duration;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};

/// Which I/O backend runs the reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoBackend {
    /// io_uring where the kernel allows it, else threads (one warning).
    Auto,
    Uring,
    Threads,
    /// Ranged GETs to an object store: always, and only, for a dataset at
    /// a URL (not a setting: the dataset's location chooses it).
    Objects,
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
            IoBackend::Objects => "objects",
        })
    }
}

/// How to choose the read gap ([`ReadGap`](brand_format::extents::ReadGap)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadGapSetting {
    /// Read whole chunks (the paper).
    Whole,
    /// Read only filled records, merging gaps up to this many bytes.
    Bytes(u64),
    /// Measure the device once and choose ([`probe`](crate::probe)).
    Auto,
}

impl From<brand_format::extents::ReadGap> for ReadGapSetting {
    /// A decided read gap, as the configuration holds it.
    fn from(gap: brand_format::extents::ReadGap) -> Self {
        match gap {
            brand_format::extents::ReadGap::Whole => ReadGapSetting::Whole,
            brand_format::extents::ReadGap::Bytes(b) => ReadGapSetting::Bytes(b),
        }
    }
}

impl std::str::FromStr for ReadGapSetting {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "whole" => Ok(ReadGapSetting::Whole),
            "auto" => Ok(ReadGapSetting::Auto),
            n => brand_format::units::parse_bytes(n)
                .map(ReadGapSetting::Bytes)
                .map_err(|why| Error::config(format!("read gap {s:?}: {why}; expected whole, auto or a byte count"))),
        }
    }
}

/// How many GETs a dataset at a URL keeps in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetsInFlight {
    /// Sized as GETs complete: grown while first bytes show no queue,
    /// shrunk when they do (`brand_store::limiter`).
    Auto,
    /// At most this many (halved while the store throttles).
    Fixed(usize),
}

impl std::str::FromStr for GetsInFlight {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(GetsInFlight::Auto),
            n => n
                .parse()
                .map(GetsInFlight::Fixed)
                .map_err(|_| Error::config(format!("gets_in_flight {s:?}: expected \"auto\" or a whole number"))),
        }
    }
}

impl std::fmt::Display for GetsInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GetsInFlight::Auto => f.write_str("auto"),
            GetsInFlight::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// The I/O settings a user chooses; [`engine_config`](Self::engine_config)
/// makes the engine's from them.
#[derive(Debug, Clone)]
pub struct IoConfig {
    /// Reads in flight at once.
    pub queue_depth: usize,
    pub read_gap: ReadGapSetting,
    /// Check every record's crc32c.
    pub verify: bool,
    /// O_DIRECT reads (the default: the plan is the cache). `false` reads
    /// through the page cache, for datasets that stay in RAM between runs.
    pub direct: bool,
    pub backend: IoBackend,
    /// Threads decompressing zstd records read by io_uring (0: on the io
    /// thread). Default: [`default_decode_threads`].
    pub decode_threads: usize,
    /// A read that does not complete within this is an error naming its
    /// file and offset; a reader waits no longer than this for reads in
    /// flight when it stops.
    pub io_timeout: Duration,
    /// How a dataset in object storage is read.
    pub store: StoreSettings,
    /// A local tier for a dataset at a URL: the directory its chunks are
    /// kept in on this machine (key `disk_cache`; none by default).
    pub disk_cache: Option<std::path::PathBuf>,
    /// How much the tier may hold (key `disk_cache_limit`; default: what
    /// its disk has, leaving 10 % of it free).
    pub disk_cache_limit: Option<brand_store::tier::TierLimit>,
}

/// How the object-storage backend reads (a dataset at a URL only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreSettings {
    /// GETs in flight: sized as they complete, or at most a number. Key
    /// `gets_in_flight`.
    pub gets_in_flight: GetsInFlight,
    /// Neighbouring extents merge into GETs of at most this many bytes, and
    /// a longer extent is fetched in parts of this size. Key `get_size`.
    pub get_bytes: u64,
    /// A GET that receives nothing for this long is retried (the most a GET
    /// waits: less once first bytes are timed, `brand_store::get`). Key `stall_timeout`.
    pub stall_timeout: Duration,
    /// Retries of one GET before its error.
    pub retries: u32,
}

impl Default for StoreSettings {
    /// 8 MiB GETs (AWS's guidance for S3 byte ranges), GETs in flight
    /// sized as they complete, and the store's own stall timeout and
    /// retries (`GetPolicy::default`: 10 s without a byte, 10 retries).
    fn default() -> Self {
        let policy = brand_store::GetPolicy::default();
        StoreSettings {
            gets_in_flight: GetsInFlight::Auto,
            get_bytes: 8 << 20,
            stall_timeout: policy.stall,
            retries: policy.retries,
        }
    }
}

impl StoreSettings {
    /// The store's policy for every request of a reader configured so:
    /// its reads, and its dataset's open.
    pub fn get_policy(&self) -> brand_store::GetPolicy {
        brand_store::GetPolicy {
            stall: self.stall_timeout,
            retries: self.retries,
            ..brand_store::GetPolicy::default()
        }
    }
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            queue_depth: 32,
            read_gap: ReadGapSetting::Auto,
            verify: true,
            direct: true,
            backend: IoBackend::Auto,
            decode_threads: default_decode_threads(),
            io_timeout: Duration::from_secs(60),
            store: StoreSettings::default(),
            disk_cache: None,
            disk_cache_limit: None,
        }
    }
}

impl IoConfig {
    /// The engine these settings ask for over `ds`, registering at most
    /// `fixed_buffer_bytes` with the ring (a reader's read-ahead: registered
    /// memory is read-ahead memory), and no more than the bytes of the
    /// segments `ds`'s directory holds (all of a whole dataset's, a
    /// partition's own).
    pub fn engine_config(&self, ds: &Dataset, fixed_buffer_bytes: u64) -> EngineConfig {
        let held_bytes: u64 = (0..ds.manifest.segments.len() as u32)
            .filter(|&s| ds.holds_segment(s))
            .map(|s| ds.manifest.segments[s as usize].bytes)
            .sum();
        self.engine(fixed_buffer_bytes.min(held_bytes))
    }

    /// What the tier may hold (the disk's free space if no limit is given).
    fn tier_limit(&self) -> brand_store::tier::TierLimit {
        self.disk_cache_limit.unwrap_or(brand_store::tier::TierLimit::Disk)
    }

    /// The share of `ds`'s chunks a tiered plan pins
    /// (`brand_format::pin`): as many as the tier's limit holds; all of
    /// them with no limit but the disk's (a full disk refuses the rest,
    /// which are then read from the store); none without a tier.
    pub fn pinned_share(&self, ds: &Dataset) -> u8 {
        match &self.disk_cache {
            Some(_) => brand_format::pin::share_within(&ds.index, self.tier_limit().bytes_for(ds)),
            None => 0,
        }
    }

    /// The engine these settings ask for, registering at most
    /// `fixed_buffer_bytes`.
    fn engine(&self, fixed_buffer_bytes: u64) -> EngineConfig {
        EngineConfig {
            queue_depth: self.queue_depth,
            direct: self.direct,
            verify: self.verify,
            fixed_buffers: true,
            fixed_buffer_bytes,
            backend: self.backend,
            decode_threads: self.decode_threads,
            io_timeout: self.io_timeout,
            store: self.store,
            tier: self.disk_cache.clone().map(|dir| brand_store::tier::TierSettings {
                dir,
                limit: self.tier_limit(),
                pinned_share: None,
            }),
            rings: RINGS,
            sqpoll: false,
        }
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
    /// io_uring (0: the ring loop that read them does; uncompressed ones it
    /// always checks itself; the threads backend decodes on its reader
    /// threads). Default: [`default_decode_threads`].
    pub decode_threads: usize,
    /// How long dropping the [`Engine`](crate::engine::Engine) waits for
    /// reads still in flight before it leaves them to finish on their own.
    pub io_timeout: Duration,
    /// The object-storage backend's settings.
    pub store: StoreSettings,
    /// A local tier under the object-storage backend (a dataset at a URL only).
    pub tier: Option<brand_store::tier::TierSettings>,
    /// Most io_uring rings (each a loop on its own thread), at most one per core
    /// and per read in flight. Default [`RINGS`].
    pub rings: usize,
    /// Let a kernel thread poll each ring's submissions (SQPOLL), so that
    /// submitting costs no system call. Off by default: here it matched
    /// plain submission on a quiet machine while spinning a core, and
    /// collapsed under load (`brand bench device --sqpoll` shows what a
    /// device gives).
    pub sqpoll: bool,
}

impl Default for EngineConfig {
    /// The default settings' engine with 64 MiB of registered buffers (the
    /// loader's default read-ahead).
    fn default() -> Self {
        IoConfig::default().engine(64 << 20)
    }
}

/// Size of each registered buffer: holds any merged read of filled records
/// where the gap is small ([`MERGED_READ_BYTES`]); whole chunks and longer
/// records go unregistered.
///
/// [`MERGED_READ_BYTES`]: brand_format::extents::MERGED_READ_BYTES
pub const FIXED_BUF_BYTES: usize = brand_format::extents::MERGED_READ_BYTES as usize;

/// Most rings (each a loop on its own thread) the io_uring backend spreads reads
/// over, one per core at most. Why more than one: where the device is
/// memory (tmpfs, the page cache) the kernel copies each read on the thread
/// that submits it, and one thread's copies were the bottleneck (tmpfs, 2
/// cores: 0.68 of fio's bytes/s with one ring, 0.81 with two, at the same
/// CPU per byte).
pub const RINGS: usize = 2;

/// Most decode threads by default: 8 cores decompress zstd faster than a
/// fast NVMe drive reads it (~1.7 GB/s of stored bytes per core here).
const MAX_DEFAULT_DECODE_THREADS: usize = 8;

/// The decode pool's default size: the cores the io_uring ring loops leave
/// (one loop per core, at most two), at most 8. Where no core is
/// left (2 cores, as on this project's machine) it is 0 and the ring loops
/// decompress what they read: there a pool only adds a hand-off per read
/// and competes with the ring loops for the same cores (zstd, direct policy,
/// tmpfs, 7 interleaved rounds: 0 threads took 0.86x the CPU per byte of 2
/// and read 1.15x the bytes/s).
pub fn default_decode_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(RINGS.min(cores)).min(MAX_DEFAULT_DECODE_THREADS)
}
