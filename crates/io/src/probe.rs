//! `read_gap = auto`: measure, through an engine set up as the reader's
//! (its backend, queue depth and O_DIRECT setting), what one more request
//! costs against what reading more bytes costs, and choose the gap at which
//! they break even ([`read_gap`] resolves any setting). On fast NVMe the answer is a few KiB (read only
//! what is used); on throttled or network storage it grows past a chunk
//! (read whole chunks, as the paper does).
//!
//! On a store every byte the probe reads is fetched (and billed), so it
//! reads at most about the dataset's size: a probe of a dataset too small
//! for a full one is kept apart from full ones, and a larger dataset in the
//! same place measures again.
//!
//! Results are cached per device (st_dev), queue depth, O_DIRECT and blkio
//! cgroup (per bucket, endpoint and GETs in flight for a store): in memory
//! for the process, and in `read-gap.toml` under the first writable of
//! `$XDG_CACHE_HOME/brand`, `~/.cache/brand` and a per-user directory
//! under the system temp dir. A cache that cannot be
//! read or written never fails the open. Processes that open together probe
//! one at a time (`read-gap.lock` there): the first measures, the others
//! take its result.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use brand_format::ALIGN;
use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::{Extent, ReadGap, Records};
use brand_format::rng::Prng;

use crate::config::{EngineConfig, ReadGapSetting};
use crate::engine::{Engine, Job};

/// What the probe measured.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ProbeResult {
    /// Seconds per small (4 KiB) request at the probe's queue depth.
    pub small_request_secs: f64,
    /// Bytes per second of large (1 MiB) reads.
    pub large_bytes_per_sec: f64,
    /// The break-even gap in bytes (a multiple of 4 KiB).
    pub gap: u64,
    /// Fewer reads than a full probe, to fetch at most about the dataset's
    /// size from a store.
    pub bounded: bool,
}

/// How many reads of each kind, how long, how often.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Rounds, keeping each kind's best: other load only ever makes a run slower.
    rounds: u64,
    /// Small (4 KiB) reads per round at most (fewer if the time budget runs out first).
    small_reads: usize,
    /// The large reads' length.
    large: u64,
    /// Large reads per round at most.
    large_reads: usize,
}

/// A device: large reads as large as one block-layer request usually gets
/// (4 MiB), so that a device limited in requests per second shows its real
/// bandwidth; three rounds, as a disk's rate swings.
const DEVICE: Shape = Shape {
    rounds: 3,
    small_reads: 2048,
    large: 4 << 20,
    large_reads: 48,
};

/// A store: every byte is fetched and billed, and the probe delays the open
/// it runs in (the first on a machine): one wave of 1 MiB GETs, half as many
/// as are in flight (16 MiB by default: several round trips' worth of a
/// 1 Gbit/s link at 60 ms), then 3 × in flight small GETs over the
/// connections those opened; one round. A link faster than the wave
/// measures short, and the gap with it: the cheap error (past the
/// break-even a larger gap fetches more for fewer GETs, smaller only sends
/// more GETs in parallel).
fn store_shape(queue_depth: usize) -> Shape {
    Shape {
        rounds: 1,
        small_reads: 3 * queue_depth,
        large: 1 << 20,
        large_reads: queue_depth.div_ceil(2),
    }
}

/// Each measurement stops after this long (and at least a few reads), so the
/// probe stays short on slow or throttled storage.
const ROUND_SECS: f64 = 0.25;
const MIN_READS: usize = 8;
/// The gap never exceeds this: beyond it, whole chunks are the better read anyway.
const MAX_GAP: u64 = 64 << 20;

/// The probe's shape over `ds` read at `queue_depth`.
fn shape(ds: &Dataset, queue_depth: usize) -> Shape {
    if ds.is_remote() {
        store_shape(queue_depth)
    } else {
        DEVICE
    }
}

/// The bytes one measurement of a probe of `ds` may read, where it is
/// bounded: on a store, a share of the dataset (all of the probe's rounds of
/// small and large reads then fetch about its size), when that is less than
/// a full probe reads.
fn byte_budget(ds: &Dataset, shape: Shape) -> Option<u64> {
    let budget = ds.manifest.segments.iter().map(|s| s.bytes).sum::<u64>() / (2 * shape.rounds);
    (ds.is_remote() && budget < shape.large * shape.large_reads as u64).then_some(budget)
}

/// Seconds per read of `len` bytes at random aligned offsets over the
/// dataset's segments (shorter in a shorter segment), keeping `queue_depth`
/// reads in flight; stops after `max` reads, [`ROUND_SECS`] or (past two
/// reads) `max_bytes`. Returns seconds and bytes per read.
fn time_reads(
    engine: &Engine,
    ds: &Dataset,
    len: u64,
    (max, max_bytes): (usize, u64),
    queue_depth: usize,
    seed: u64,
) -> Result<(f64, f64)> {
    let mut rng = Prng::stream(seed, &[0x9e0b, len]);
    let sizes: Vec<u64> = ds.manifest.segments.iter().map(|s| s.bytes).collect();
    // Submits one read; returns its length.
    let mut submit = |tag: u64| -> Result<u64> {
        let seg = rng.below(sizes.len() as u64) as usize;
        let len = len.min(sizes[seg]).div_ceil(ALIGN) * ALIGN;
        let blocks = (sizes[seg].saturating_sub(len) / ALIGN).max(1);
        let offset = rng.below(blocks) * ALIGN;
        engine.submit(Job {
            tag,
            extent: Extent {
                segment: seg as u32,
                offset,
                len,
                records: Records::new(),
            },
            first_fill: false,
        })?;
        Ok(len)
    };
    let start = Instant::now();
    let (mut submitted, mut completed, mut bytes) = (0usize, 0usize, 0u64);
    let within = |submitted: usize, bytes: u64| submitted < max && (submitted < 2 || bytes < max_bytes);
    while submitted < queue_depth && within(submitted, bytes) {
        bytes += submit(submitted as u64)?;
        submitted += 1;
    }
    while completed < submitted {
        engine.recv()?.result?;
        completed += 1;
        let time_left = start.elapsed().as_secs_f64() < ROUND_SECS || submitted < MIN_READS;
        if within(submitted, bytes) && time_left {
            bytes += submit(submitted as u64)?;
            submitted += 1;
        }
    }
    Ok((
        start.elapsed().as_secs_f64() / completed as f64,
        bytes as f64 / completed as f64,
    ))
}

/// Measures the device under `ds` (no cache) through an engine set up as
/// `io` (its backend, queue depth and O_DIRECT setting: the loader's own).
pub fn measure(ds: Arc<Dataset>, io: &EngineConfig) -> Result<ProbeResult> {
    let queue_depth = io.queue_depth;
    let engine = Engine::start(
        ds.clone(),
        EngineConfig {
            verify: false,
            decode_threads: 0,
            // The store is measured, not a local tier (whose reads are the plan's).
            tier: None,
            ..io.clone()
        },
    )?;
    let shape = shape(&ds, queue_depth);
    let budget = byte_budget(&ds, shape);
    let max_bytes = budget.unwrap_or(u64::MAX) / 2;
    // Two large reads at least: no longer than half the bytes allowed.
    let large_len = (max_bytes / 2).clamp(ALIGN, shape.large);
    let mut small = f64::INFINITY;
    let mut bandwidth = 0f64;
    for round in 0..shape.rounds {
        // Large reads first: on a store they open the connections, so the
        // small ones time requests, not connection set-up.
        // Segments shorter than the large reads are read whole: a rate, not a time.
        let (secs, bytes) = time_reads(
            &engine,
            &ds,
            large_len,
            (shape.large_reads, max_bytes),
            queue_depth,
            round,
        )?;
        bandwidth = bandwidth.max(bytes / secs);
        let (secs, _) = time_reads(&engine, &ds, ALIGN, (shape.small_reads, max_bytes), queue_depth, round)?;
        small = small.min(secs);
    }
    // A request's cost beyond its own 4 KiB of transfer, in bytes of transfer.
    let overhead_bytes = ((small - ALIGN as f64 / bandwidth) * bandwidth).max(0.0);
    let gap = ((overhead_bytes / ALIGN as f64).round() as u64 * ALIGN).min(MAX_GAP);
    Ok(ProbeResult {
        small_request_secs: small,
        large_bytes_per_sec: bandwidth,
        gap,
        bounded: budget.is_some(),
    })
}

/// Where the cache may live, most preferred first.
fn cache_paths() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        out.push(PathBuf::from(x).join("brand"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        out.push(PathBuf::from(h).join(".cache/brand"));
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    out.push(std::env::temp_dir().join(format!("brand-cache-{uid}")));
    out.into_iter().map(|d| d.join("read-gap.toml")).collect()
}

fn load_cache(path: &std::path::Path) -> BTreeMap<String, u64> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| toml::from_str(&t).ok())
        .unwrap_or_default()
}

/// Writes `key = gap` into the first cache file that can be written.
fn store(key: &str, gap: u64) {
    for p in cache_paths() {
        let mut cache = load_cache(&p);
        cache.insert(key.to_string(), gap);
        let Ok(text) = toml::to_string(&cache) else { return };
        let Some(dir) = p.parent() else { continue };
        // Written whole then renamed, so a concurrent reader never sees half a file.
        let tmp = dir.join(format!(".read-gap.{}.tmp", std::process::id()));
        if std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, text).is_ok() {
            if std::fs::rename(&tmp, &p).is_ok() {
                return;
            }
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// The cache key of the device holding `ds`'s first segment, as `io` reads it.
fn device_key(ds: &Dataset, io: &EngineConfig) -> Result<String> {
    let seg0 = ds.segment_path(0);
    let dev = std::fs::metadata(&seg0).map_err(|e| Error::io(&seg0, e))?.dev();
    // Throttling (cgroup blkio) changes what a request costs: part of the key.
    let blkio = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.split_once(":blkio:").map(|(_, p)| p.to_string()))
        })
        .unwrap_or_default();
    let direct = if io.direct { "" } else { "-buffered" };
    Ok(format!("dev-{dev}-qd-{}{direct}-blkio-{blkio}", io.queue_depth))
}

/// How long a probe waits for another process's before measuring anyway
/// (a probe takes well under a second; one stuck on a stalled store must not
/// hold every other open).
const PROBE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The machine's probe lock (`read-gap.lock` beside the first cache file
/// that can be made), held until dropped; `None` where there is none to
/// take or another process held it past [`PROBE_LOCK_WAIT`].
fn probe_lock() -> Option<std::fs::File> {
    let file = cache_paths().into_iter().find_map(|p| {
        let dir = p.parent()?;
        std::fs::create_dir_all(dir).ok()?;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("read-gap.lock"))
            .ok()
    })?;
    let start = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < PROBE_LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(_) => return None,
        }
    }
}

/// Gaps measured by this process, by key: a probe runs at most once per
/// process per key, whatever the file cache does.
static MEASURED: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// The auto gap for the device holding `ds`: from the cache, or measured
/// (and cached) through an engine set up as `io`.
pub fn auto_gap(ds: Arc<Dataset>, io: &EngineConfig) -> Result<u64> {
    let key = if ds.is_remote() {
        // A store: what a request costs is the store's and the link's; the
        // bucket stands for both.
        let url = ds.dir().to_string_lossy().into_owned();
        let bucket: String = url.splitn(4, '/').take(3).collect::<Vec<_>>().join("/");
        let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
        format!("store-{bucket}-{endpoint}-gets-{}", io.store.gets_in_flight)
    } else {
        device_key(&ds, io)?
    };
    // A probe bounded by a small dataset is kept apart: a larger dataset in
    // the same place measures in full; a small one takes either.
    let bounded_key = format!("{key}-small-dataset");
    let bounded = byte_budget(&ds, shape(&ds, io.queue_depth)).is_some();
    let keys: &[&str] = if bounded { &[&key, &bounded_key] } else { &[&key] };
    let remembered = |k: &str| MEASURED.lock().ok()?.as_ref()?.get(k).copied();
    let remember = |k: &str, gap: u64| {
        if let Ok(mut m) = MEASURED.lock() {
            m.get_or_insert_with(HashMap::new).insert(k.to_string(), gap);
        }
    };
    if let Some(gap) = keys.iter().find_map(|k| remembered(k)) {
        return Ok(gap);
    }
    let cached = || {
        let caches: Vec<_> = cache_paths().iter().map(|p| load_cache(p)).collect();
        keys.iter()
            .find_map(|k| caches.iter().find_map(|c| Some((*k, *c.get(*k)?))))
    };
    if let Some((k, gap)) = cached() {
        remember(k, gap);
        return Ok(gap);
    }
    // One probe on the machine at a time: processes opening together (a
    // DataLoader's workers, the ranks of a node) would each measure a share
    // of the same device or link, and fetch the probe's bytes as many times.
    // The first measures; the others find its result when it is done.
    let _one_at_a_time = probe_lock();
    if let Some((k, gap)) = cached() {
        remember(k, gap);
        return Ok(gap);
    }
    let r = measure(ds, io)?;
    tracing::info!(
        "read_gap probe{}: {:.1} µs per 4 KiB request, {:.2} GB/s large reads → gap {} KiB",
        if r.bounded {
            " (bounded by the dataset's size)"
        } else {
            ""
        },
        r.small_request_secs * 1e6,
        r.large_bytes_per_sec / 1e9,
        r.gap >> 10
    );
    let key = if r.bounded { &bounded_key } else { &key };
    remember(key, r.gap);
    store(key, r.gap);
    Ok(r.gap)
}

/// The read gap `setting` asks for over `ds`: `Auto` is the device's
/// ([`auto_gap`], through an engine set up as `io`: give it the backend the
/// reader's engine resolved to).
pub fn read_gap(setting: ReadGapSetting, ds: &Arc<Dataset>, io: &EngineConfig) -> Result<ReadGap> {
    Ok(match setting {
        ReadGapSetting::Whole => ReadGap::Whole,
        ReadGapSetting::Bytes(b) => ReadGap::Bytes(b),
        ReadGapSetting::Auto => ReadGap::Bytes(auto_gap(ds.clone(), io)?),
    })
}

/// What a run's one request may cost at most, as a share of what its bytes
/// cost: half, so that requests stay clear of being the limit where a device
/// caps requests and bytes separately (a throttled or network volume: at a
/// share of 1 both caps bind at once and each slows the other), and add at
/// most a third to the time where their costs add up.
const RUN_REQUEST_SHARE: f64 = 0.5;

/// `run_length = auto`: how many neighbouring records a Brand refill fills
/// as one run, from what a request costs in bytes (`gap`, the break-even gap
/// [`measure`] finds) against the mean stored sample: the shortest run whose
/// one request costs at most [`RUN_REQUEST_SHARE`] of its bytes, within
/// `1..=max` (a chunk). Where bytes are what costs (a small gap) it is 1, the
/// paper's record-by-record fill; whole-chunk reads need no runs either.
pub fn run_length(gap: ReadGap, mean_stored_bytes: f64, max: u32) -> u32 {
    let ReadGap::Bytes(gap) = gap else { return 1 };
    if mean_stored_bytes.is_nan() || mean_stored_bytes <= 0.0 {
        return 1;
    }
    let runs = (gap as f64 / (RUN_REQUEST_SHARE * mean_stored_bytes)).ceil();
    (runs.min(max as f64) as u32).clamp(1, max.max(1))
}

#[cfg(test)]
mod run_tests {
    use super::*;

    #[test]
    fn run_length_follows_the_request_cost() {
        // Fast device: requests cost less than a sample: record by record.
        assert_eq!(run_length(ReadGap::Bytes(4096), 110.0 * 1024.0, 64), 1);
        assert_eq!(run_length(ReadGap::Bytes(0), 4096.0, 64), 1);
        // The network profile (380 MB/s, 3,000 IOPS: a request ≈ 124 KiB).
        assert_eq!(run_length(ReadGap::Bytes(124 << 10), 110.0 * 1024.0, 64), 3);
        assert_eq!(run_length(ReadGap::Bytes(108 << 10), 110.0 * 1024.0, 64), 2);
        assert_eq!(run_length(ReadGap::Bytes(124 << 10), 16.0 * 1024.0, 64), 16);
        // Never past a chunk, never for whole-chunk reads or empty samples.
        assert_eq!(run_length(ReadGap::Bytes(64 << 20), 100.0, 64), 64);
        assert_eq!(run_length(ReadGap::Bytes(64 << 20), 100.0, 8), 8);
        assert_eq!(run_length(ReadGap::Whole, 100.0, 64), 1);
        assert_eq!(run_length(ReadGap::Bytes(1 << 20), 0.0, 64), 1);
    }
}
