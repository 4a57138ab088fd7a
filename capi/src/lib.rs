//! brand's stable C ABI. `include/brand.h` is generated from this crate by
//! cbindgen and checked in; `tests/header.rs` fails when the two differ
//! (`BRAND_BLESS=1 cargo test -p brand-capi --test header` rewrites it).
//!
//! The conventions (ownership, errors, threads) are written once, in the
//! header's preamble (`cbindgen.toml`), for C readers. In short:
//!
//! * Every entry point runs inside `catch_unwind`: no panic crosses the
//!   boundary; it becomes `BRAND_ERR_PANIC` with the panic text in
//!   `brand_last_error()`.
//! * A loader handle is an id in a registry, not a pointer to memory: a
//!   stale or closed handle is looked up, not dereferenced, and gives
//!   `BRAND_ERR_CLOSED`. Calls on one loader are serialised by a lock.
//! * A batch is a heap object owned by the caller until `brand_batch_free`;
//!   its samples point into it (zero-copy, 64-byte aligned).

// The entry points take raw pointers from C, with the contracts written in
// brand.h, and are not `unsafe fn` in Rust: the crate builds no rlib, so no
// Rust code but its own tests (which pass valid pointers) can call them.
#![allow(
    clippy::not_unsafe_ptr_arg_deref,
    reason = "extern \"C\" entry points for C; every pointer is checked as brand.h documents (the rlib serves this crate's own tests; Rust code uses brand-loader)"
)]

mod reader;
mod state;
mod status;

use std::collections::BTreeMap;
use std::ffi::{CStr, OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ::brand_loader::elastic::{SavedWorld, global_position};
use ::brand_loader::{Batch, Loader, LoaderState};
use brand_format::Dataset;
use brand_nodes::Config;
use brand_plan::Planner;

use reader::{Node, NodeStart, Reader};

use state::Fingerprint;
pub use status::brand_status;
use status::brand_status::*;
use status::{Failure, Outcome, boundary, guard};

/// The ABI this header describes. Compare it with `brand_abi_version()` at
/// start-up to catch a header/library mismatch. It changes whenever a
/// signature, a struct layout or a status value changes incompatibly.
pub const BRAND_ABI_VERSION: u32 = 1;

/// `brand_metrics.read_gap` when whole chunks are read (the paper's way).
pub const BRAND_READ_GAP_WHOLE: u64 = u64::MAX;

/// The alignment of every sample's `data` pointer, in bytes.
pub const BRAND_SAMPLE_ALIGN: usize = 64;

/// An open loader. Opaque: the pointer is a handle, never dereference it.
#[allow(non_camel_case_types)]
pub struct brand_loader {
    _opaque: (),
}

/// A batch of samples, owned by the caller from `brand_next` until
/// `brand_batch_free`. Opaque.
#[allow(non_camel_case_types)]
pub struct brand_batch {
    batch: Batch,
}

/// One sample of a batch, borrowed from it: every pointer stays valid until
/// the batch is freed.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct brand_sample {
    /// The sample's bytes, `BRAND_SAMPLE_ALIGN`-aligned (never NULL, even
    /// when `len` is 0). Not a copy: it points into the batch.
    pub data: *const u8,
    pub len: usize,
    /// The sample's key (its source path, `file:record`, or LMDB key): raw
    /// bytes, `key_len` of them, NOT NUL-terminated and not necessarily
    /// UTF-8. Print it with `printf("%.*s", (int)key_len, key)`.
    pub key: *const c_char,
    pub key_len: usize,
    /// The sample id: its position in the packed dataset, `0..samples`.
    pub id: u64,
    /// The class label, -1 where the source had none.
    pub label: i64,
}

/// Loader counters (`brand_get_metrics`), cumulative since the loader was opened. Set
/// `struct_size = sizeof(brand_metrics)` before the call: the library fills
/// at most that many bytes and sets `struct_size` to the bytes it filled,
/// so fields appended later never overrun an older caller's struct, and a
/// newer caller can tell which fields an older library filled.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct brand_metrics {
    /// In: the caller's `sizeof(brand_metrics)`. Out: the bytes filled.
    pub struct_size: u32,
    /// 1 if reads fell back from O_DIRECT to buffered I/O.
    pub buffered_fallback: u32,
    /// Bytes transferred from storage.
    pub bytes_read: u64,
    /// Bytes of samples handed out (as stored).
    pub bytes_served: u64,
    pub samples_served: u64,
    /// Device reads issued.
    pub reads_issued: u64,
    /// Memory refills of the plan (chunk reads).
    pub refills: u64,
    /// Single-record reads for samples the plan expected in memory (after a resume).
    pub recovery_reads: u64,
    /// Times the consumer waited for a read, and how long.
    pub stalls: u64,
    pub stall_secs_total: f64,
    pub stall_p50_secs: f64,
    pub stall_p95_secs: f64,
    pub stall_p99_secs: f64,
    pub stall_max_secs: f64,
    /// Peak bytes of resident samples as served (decoded).
    pub peak_resident_bytes: u64,
    pub peak_resident_samples: u64,
    /// The read gap in bytes, or `BRAND_READ_GAP_WHOLE`.
    pub read_gap: u64,
    /// `bytes_read / bytes_served` (0 before anything was served).
    pub read_amplification: f64,
    /// 1 if reads go through the threads backend (`pread`), not io_uring.
    /// (This field and those after it were appended in brand 0.1 without an
    /// ABI bump: `struct_size` tells a caller compiled against an older
    /// header from one that has them.)
    pub threads_backend: u32,
    /// 1 if `io_backend = "auto"` found io_uring refused and fell back to threads.
    pub uring_refused: u32,
    /// Peak bytes of reads in flight (issued, not yet taken in): bounded by
    /// `readahead`, which the last read issued may overshoot by its own size.
    pub peak_readahead_bytes: u64,
    /// Bytes of read buffers registered with io_uring (fixed buffers).
    pub registered_buffer_bytes: u64,
    /// Peak bytes of ordinary (unregistered) read buffers, in use or
    /// pooled: those of whole-chunk reads and of records over 512 KiB.
    pub peak_read_buffer_bytes: u64,
    /// Samples left out of their epoch because their record was corrupt
    /// (`on_corrupt = "skip"`).
    pub skipped_corrupt: u64,
    /// The number of nodes of the multi-node job this loader is a node of
    /// (0: a single-process loader; then the fields below are 0). Of a node,
    /// the fields above count: `bytes_read`/`reads_issued` its own storage
    /// reads (the chunks it owns), `samples_served`/`bytes_served` what it
    /// handed out, `stalls` and `stall_*_secs` its waits for a sample not
    /// yet read or pushed (on-demand waits; no percentiles). (Appended
    /// after `skipped_corrupt` without an ABI bump, like `threads_backend`.)
    pub nodes: u32,
    /// This node's rank (0 for a single-process loader).
    pub node_rank: u32,
    /// Samples served that this node read itself (never crossed the network).
    pub samples_local: u64,
    /// Samples other nodes pushed to this one, and their bytes.
    pub samples_received: u64,
    pub bytes_received: u64,
    /// Samples this node pushed to other nodes, and their bytes.
    pub samples_pushed: u64,
    pub bytes_pushed: u64,
    /// Most bytes of pushed and local samples held at once (high-water
    /// mark), and the limit (`remote_memory`).
    pub remote_memory_peak: u64,
    pub remote_memory_limit: u64,
    /// Most bytes this node held read but not yet pushed.
    pub owner_peak_bytes: u64,
}

/// The state of one open loader, behind its handle.
struct Open {
    loader: Reader,
    fingerprint: Fingerprint,
    /// Samples this loader serves per epoch.
    epoch_len: u64,
}

type Shared = Arc<Mutex<Open>>;

/// Open loaders by handle id. Ids are never reused, so a stale handle can
/// never reach a loader opened later.
static LOADERS: Mutex<BTreeMap<usize, Shared>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<usize, Shared>> {
    // Nothing panics while the registry is locked; a poisoned lock still
    // holds a consistent map.
    LOADERS.lock().unwrap_or_else(|e| e.into_inner())
}

fn handle_of(id: usize) -> *mut brand_loader {
    std::ptr::without_provenance_mut(id)
}

fn lookup(loader: *const brand_loader) -> Result<Shared, Failure> {
    if loader.is_null() {
        return Err(Failure::invalid("loader is NULL (closed, or never opened)"));
    }
    registry().get(&loader.addr()).cloned().ok_or_else(|| {
        Failure::new(
            BRAND_ERR_CLOSED,
            format!("loader {loader:p} is not open (closed already, or not from brand_open)"),
        )
    })
}

/// Runs `f` on the open loader behind `loader`, holding its lock.
fn with_loader<T>(loader: *const brand_loader, f: impl FnOnce(&mut Open) -> Result<T, Failure>) -> Result<T, Failure> {
    let shared = lookup(loader)?;
    let mut open = shared.lock().map_err(|_| {
        Failure::new(
            BRAND_ERR_PANIC,
            "this loader is unusable: an earlier call panicked inside it (see that call's message); close it",
        )
    })?;
    f(&mut open)
}

/// Writes `value` to `out` (checked non-NULL).
fn put<T>(out: *mut T, what: &str, value: T) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: out is non-NULL and, by the function's contract, points to a
    // writable T.
    unsafe { out.write(value) };
    Ok(())
}

/// A C string argument, or an error naming it.
fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a CStr, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: p is non-NULL and, by the contract, a NUL-terminated string
    // that outlives this call.
    Ok(unsafe { CStr::from_ptr(p) })
}

/// The version of the library as a static string, e.g. "brand 0.1.0".
#[unsafe(no_mangle)]
pub extern "C" fn brand_version() -> *const c_char {
    concat!("brand ", env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The ABI version of the library (see `BRAND_ABI_VERSION`).
#[unsafe(no_mangle)]
pub extern "C" fn brand_abi_version() -> u32 {
    BRAND_ABI_VERSION
}

/// The message of the last call on this thread that returned a
/// `brand_status`: "" (never NULL) if it succeeded. Valid until the next
/// brand call on this thread; copy it to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn brand_last_error() -> *const c_char {
    guard(c"".as_ptr(), status::last_error_ptr)
}

/// The name of a status, e.g. "BRAND_ERR_CORRUPT" (a static string;
/// "BRAND_UNKNOWN_STATUS" for values this library does not define).
#[unsafe(no_mangle)]
pub extern "C" fn brand_status_name(status: i32) -> *const c_char {
    status::ALL_STATUSES
        .into_iter()
        .find(|s| *s as i32 == status)
        .map_or(c"BRAND_UNKNOWN_STATUS".as_ptr(), |s| s.name().as_ptr())
}

/// The dataset path and the configuration (NULL: the defaults) of an open
/// call, with the launcher's environment (`brand_nodes::config`).
fn path_and_config<'a>(dataset_path: *const c_char, config_toml: *const c_char) -> Result<(&'a Path, Config), Failure> {
    let path = Path::new(OsStr::from_bytes(c_str(dataset_path, "dataset_path")?.to_bytes()));
    let text = if config_toml.is_null() {
        ""
    } else {
        c_str(config_toml, "config_toml")?
            .to_str()
            .map_err(|e| Failure::invalid(format!("config_toml is not UTF-8: {e}")))?
    };
    let (loader, dist) = brand_nodes::config::from_toml(text)?;
    Ok((path, Config { loader, nodes: dist }))
}

/// Where an open call starts.
enum Resume<'a> {
    Fresh,
    /// One state blob, of this rank.
    At(&'a [u8]),
    /// Every rank's state blob of a saved world (elastic resume).
    World(Vec<&'a [u8]>),
}

fn decode(blob: &[u8]) -> Result<(LoaderState, Fingerprint), Failure> {
    state::decode(blob).map_err(|why| Failure::new(BRAND_ERR_INVALID_STATE, why))
}

/// The saved world of every rank's blob, checked against `now` (what this
/// loader would save): the dataset and the order's settings must agree and
/// the blobs must be ranks 0..W of one world, each once.
fn saved_world(blobs: &[&[u8]], now: &Fingerprint) -> Result<SavedWorld, Failure> {
    let mismatch = |why: String| Failure::new(BRAND_ERR_STATE_MISMATCH, why);
    let mut saved: Vec<(LoaderState, Fingerprint)> = Vec::with_capacity(blobs.len());
    for (i, blob) in blobs.iter().enumerate() {
        let (s, f) = decode(blob).map_err(|e| Failure::new(e.status, format!("state {i}: {}", e.message)))?;
        if let Some(why) = f.elastic_mismatch(now) {
            return Err(mismatch(format!("state {i}: {why}")));
        }
        saved.push((s, f));
    }
    let Some(&(_, first)) = saved.first() else {
        return Err(Failure::invalid("no states (count is 0)"));
    };
    let world = first.world;
    if world as usize != saved.len() {
        return Err(mismatch(format!(
            "cannot restore the loader states: {} states given, of a world of {world} ranks (every rank's state is needed)",
            saved.len()
        )));
    }
    let mut states = vec![None; world as usize];
    for (i, (s, f)) in saved.iter().enumerate() {
        if f.world != world || f.slots != first.slots {
            return Err(mismatch(format!(
                "cannot restore the loader states: state {i} is of a world of {} ranks with {} slots per rank, state 0 of {world} with {}",
                f.world, f.slots, first.slots
            )));
        }
        match states.get_mut(f.rank as usize) {
            Some(slot @ None) => *slot = Some(*s),
            _ => {
                return Err(mismatch(format!(
                    "cannot restore the loader states: rank {} appears twice (state {i})",
                    f.rank
                )));
            }
        }
    }
    Ok(SavedWorld {
        plan: first
            .saved_plan()
            .map_err(|why| Failure::new(BRAND_ERR_INVALID_STATE, why))?,
        states: states.into_iter().flatten().collect(),
    })
}

fn open_loader(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    resume: Resume<'_>,
    out: *mut *mut brand_loader,
) -> Outcome {
    if out.is_null() {
        return Err(Failure::invalid("out is NULL"));
    }
    // SAFETY: out is non-NULL and points to a writable pointer (contract).
    unsafe { out.write(std::ptr::null_mut()) };
    let (path, config) = path_and_config(dataset_path, config_toml)?;
    let saved = match resume {
        Resume::At(blob) => Some(decode(blob)?),
        _ => None,
    };
    // A node may be given its partition of a partitioned pack; a single
    // loader needs the whole dataset (Dataset::open refuses a partition).
    let ds = Arc::new(if config.nodes.world() > 1 {
        Dataset::open_any(path)?
    } else {
        Dataset::open(path)?
    });
    let plan = &config.loader.plan;
    let planner = Planner::new(&ds.index, plan)?;
    let epoch_len = planner.geometry().steps;
    let fingerprint = Fingerprint::of(&ds, plan, planner.geometry());
    let mut elastic = None;
    let start = match (resume, saved) {
        (Resume::At(_), Some((s, f))) => {
            if let Some(why) = f.mismatch(&fingerprint) {
                return Err(Failure::new(BRAND_ERR_STATE_MISMATCH, why));
            }
            if s.served > epoch_len {
                return Err(Failure::new(
                    BRAND_ERR_INVALID_STATE,
                    format!(
                        "loader state has {} samples served of an epoch of {epoch_len}",
                        s.served
                    ),
                ));
            }
            s
        }
        (Resume::World(blobs), _) => {
            let world = saved_world(&blobs, &fingerprint)?;
            let at = global_position(&ds.index, &world, plan)
                .map_err(|e| Failure::new(BRAND_ERR_STATE_MISMATCH, e.to_string()))?;
            elastic = Some(world);
            at.rank_state(plan.rank, plan.world, epoch_len)
        }
        _ => LoaderState::default(),
    };
    let loader = if config.nodes.world() > 1 {
        let node_start = match elastic {
            Some(world) => NodeStart::Elastic(world),
            None => NodeStart::At(start),
        };
        Reader::Node(Box::new(Node::new(ds, config, node_start, start)))
    } else {
        Reader::Local(Box::new(Loader::open(ds, &config.loader, start)?))
    };
    let open = Arc::new(Mutex::new(Open {
        loader,
        fingerprint,
        epoch_len,
    }));
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    registry().insert(id, open);
    // SAFETY: as above.
    unsafe { out.write(handle_of(id)) };
    Ok(BRAND_OK)
}

/// Opens a loader over the dataset directory `dataset_path` (made by
/// `brand pack`), at the start of epoch 0.
///
/// `config_toml` is the configuration as TOML, the same text `brand read
/// --config` and `brand serve --config` accept (batch_size, memory, policy,
/// seed, rank, world, drop_last, readahead, queue_depth, read_gap, verify,
/// ...; every key optional), or NULL for the defaults.
///
/// Multi-node: with 2 or more `nodes = ["host:port", ...]` (or, without
/// `nodes`, the launcher's environment: `BRAND_NODES` with `RANK` and
/// `WORLD_SIZE`, or `TF_CONFIG`, whose chief and workers are the nodes at
/// their TensorFlow port + `tf_port_offset`, default 1000) the loader is
/// node `rank` of that job: it listens on its own address, reads only the
/// chunks it owns and pushes their samples to the nodes that serve them;
/// `remote_memory`, `peer_timeout` and `job` tune it. It connects to its
/// peers at the first `brand_next` (every node must be opened at the same
/// state; `brand_start_epoch` before the first `brand_next` sets it), which
/// fails naming a peer that is unreachable or disagrees within
/// `peer_timeout`. Without nodes nothing listens: a single-process loader.
///
/// On success `*out` is the new loader, to be closed with `brand_close`;
/// on failure `*out` is NULL. Errors: BRAND_ERR_NOT_FOUND (no such
/// dataset), BRAND_ERR_CONFIG, BRAND_ERR_FORMAT, BRAND_ERR_IO,
/// BRAND_ERR_INVALID_ARGUMENT (NULL path or out).
#[unsafe(no_mangle)]
pub extern "C" fn brand_open(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    out: *mut *mut brand_loader,
) -> brand_status {
    boundary(|| open_loader(dataset_path, config_toml, Resume::Fresh, out))
}

/// The number of samples a loader opened with these arguments serves per
/// epoch (what `brand_epoch_len` would say), from the dataset's metadata
/// only: reads manifest.toml and index.bin and plans, but starts no I/O
/// engine, allocates no buffers and probes no device. For callers that need
/// the epoch length before they open a loader (tf.data's cardinality).
///
/// Errors as `brand_open`; on failure `*out` is left unchanged.
#[unsafe(no_mangle)]
pub extern "C" fn brand_epoch_len_for(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    out: *mut u64,
) -> brand_status {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let (path, config) = path_and_config(dataset_path, config_toml)?;
        let ds = Dataset::open_any(path)?;
        let planner = Planner::new(&ds.index, &config.loader.plan)?;
        put(out, "out", planner.geometry().steps)?;
        Ok(BRAND_OK)
    })
}

/// Opens a loader that continues exactly where the loader whose state is
/// `state[0..state_len]` (from `brand_state_save`) stopped: the next batch
/// starts with the first sample that loader had not handed out.
///
/// The dataset and the plan-relevant config (policy, seed, memory, rank,
/// world, drop_last) must be those of the saved loader:
/// BRAND_ERR_STATE_MISMATCH says which differ (to continue on another
/// number of ranks, use `brand_open_at_elastic` with every rank's state). I/O settings (batch_size,
/// read_gap, queue_depth, readahead, verify) may change. A blob that is not
/// a state gives BRAND_ERR_INVALID_STATE. Otherwise as `brand_open`.
#[unsafe(no_mangle)]
pub extern "C" fn brand_open_at(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    state: *const u8,
    state_len: usize,
    out: *mut *mut brand_loader,
) -> brand_status {
    boundary(|| {
        if state.is_null() {
            if !out.is_null() {
                // SAFETY: out is non-NULL and points to a writable pointer (contract).
                unsafe { out.write(std::ptr::null_mut()) };
            }
            return Err(Failure::invalid("state is NULL"));
        }
        // SAFETY: state is non-NULL and points to state_len readable bytes
        // (contract); they are only read during this call.
        let blob = unsafe { std::slice::from_raw_parts(state, state_len) };
        open_loader(dataset_path, config_toml, Resume::At(blob), out)
    })
}

/// Opens rank `rank` of a world of `world` (from `config_toml`, as in
/// `brand_open`, a single-process loader or a node) where a world of any
/// other number of ranks stopped: `states[i][0..state_lens[i]]`, `count` of
/// them, are the `brand_state_save` blobs of EVERY rank of that world, in
/// any order, saved at one global step (each rank after the same number of
/// batches). The ranks of the new world together serve the rest of that
/// epoch's global order, every sample once, then every later epoch as the
/// new world would from the start.
///
/// The served order depends on the total memory, not on the world: the new
/// world must have the same total memory (world × memory per rank; a budget
/// of "N slots" per rank is exact), the same dataset, policy, seed and
/// drop_last. Otherwise BRAND_ERR_STATE_MISMATCH says what differs (and the
/// memory per rank that would match); missing or repeated ranks, and states
/// not of one global step, are BRAND_ERR_STATE_MISMATCH too. A blob that is
/// not a state gives BRAND_ERR_INVALID_STATE naming it (`state i`). With
/// the same world this is the same as `brand_open_at` with this rank's
/// state. Otherwise as `brand_open`.
#[unsafe(no_mangle)]
pub extern "C" fn brand_open_at_elastic(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    states: *const *const u8,
    state_lens: *const usize,
    count: usize,
    out: *mut *mut brand_loader,
) -> brand_status {
    boundary(|| {
        let refuse = |why: String| {
            if !out.is_null() {
                // SAFETY: out is non-NULL and points to a writable pointer (contract).
                unsafe { out.write(std::ptr::null_mut()) };
            }
            Err(Failure::invalid(why))
        };
        if count == 0 {
            return refuse("count is 0: every rank's state is needed".into());
        }
        if states.is_null() || state_lens.is_null() {
            return refuse("states or state_lens is NULL".into());
        }
        // SAFETY: both are non-NULL and point to `count` readable elements
        // (contract); only read during this call.
        let (ptrs, lens) = unsafe {
            (
                std::slice::from_raw_parts(states, count),
                std::slice::from_raw_parts(state_lens, count),
            )
        };
        let mut blobs = Vec::with_capacity(count);
        for (i, (&p, &len)) in ptrs.iter().zip(lens).enumerate() {
            if p.is_null() {
                return refuse(format!("states[{i}] is NULL"));
            }
            // SAFETY: p is non-NULL and points to `len` readable bytes
            // (contract); only read during this call.
            blobs.push(unsafe { std::slice::from_raw_parts(p, len) });
        }
        open_loader(dataset_path, config_toml, Resume::World(blobs), out)
    })
}

/// Closes `*loader` and sets `*loader` to NULL. `loader == NULL` or
/// `*loader == NULL` is a no-op returning BRAND_OK.
///
/// Closing waits for the loader's in-flight reads. Batches it handed out
/// stay valid (each owns its samples) until they are freed. Using the
/// handle afterwards: the NULLed variable gives BRAND_ERR_INVALID_ARGUMENT,
/// any other copy of the old pointer gives BRAND_ERR_CLOSED (handles are
/// never reused), including a second `brand_close` through such a copy.
#[unsafe(no_mangle)]
pub extern "C" fn brand_close(loader: *mut *mut brand_loader) -> brand_status {
    boundary(|| {
        if loader.is_null() {
            return Ok(BRAND_OK);
        }
        // SAFETY: loader is non-NULL and points to a readable and writable
        // handle variable (contract).
        let handle = unsafe { loader.read() };
        if handle.is_null() {
            return Ok(BRAND_OK);
        }
        // SAFETY: as above.
        unsafe { loader.write(std::ptr::null_mut()) };
        let removed = registry().remove(&handle.addr());
        match removed {
            // Dropped outside the registry lock: it joins the io thread.
            // A call running on it in another thread keeps it alive until
            // that call returns.
            Some(open) => {
                drop(open);
                Ok(BRAND_OK)
            }
            None => Err(Failure::new(
                BRAND_ERR_CLOSED,
                format!("loader {handle:p} is not open (closed already, or not from brand_open)"),
            )),
        }
    })
}

/// The next batch of the current epoch.
///
/// BRAND_OK: `*out` is a batch of 1..=batch_size samples, owned by the
/// caller until `brand_batch_free`. BRAND_END_OF_EPOCH: `*out` is NULL and
/// the epoch is complete (every sample of this rank's share served exactly
/// once); the next call starts the next epoch. On an error `*out` is NULL
/// and nothing was consumed: a corrupt record (BRAND_ERR_CORRUPT; the
/// message names segment, chunk, offset and sample) is reported again on
/// every call until `brand_start_epoch`, and the state still points at it.
#[unsafe(no_mangle)]
pub extern "C" fn brand_next(loader: *mut brand_loader, out: *mut *mut brand_batch) -> brand_status {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        // SAFETY: out is non-NULL and points to a writable pointer (contract).
        unsafe { out.write(std::ptr::null_mut()) };
        let batch = with_loader(loader, |open| Ok(open.loader.next_batch()?))?;
        match batch {
            None => Ok(BRAND_END_OF_EPOCH),
            Some(batch) => {
                let raw = Box::into_raw(Box::new(brand_batch { batch }));
                // SAFETY: as above.
                unsafe { out.write(raw) };
                Ok(BRAND_OK)
            }
        }
    })
}

/// Jumps to the start of `epoch` (each epoch has its own order), dropping
/// anything read ahead. Also the way on after BRAND_ERR_CORRUPT. A node of
/// a multi-node job can only be told its start before its first
/// `brand_next` (BRAND_ERR_CONFIG after, unless it is there already).
#[unsafe(no_mangle)]
pub extern "C" fn brand_start_epoch(loader: *mut brand_loader, epoch: u64) -> brand_status {
    boundary(|| {
        with_loader(loader, |open| {
            open.loader.start_epoch(epoch)?;
            Ok(BRAND_OK)
        })
    })
}

/// Where the loader is: the current epoch and the samples of it already
/// handed out (after BRAND_END_OF_EPOCH: the next epoch and 0). Either out
/// pointer may be NULL.
#[unsafe(no_mangle)]
pub extern "C" fn brand_tell(loader: *const brand_loader, epoch: *mut u64, served: *mut u64) -> brand_status {
    boundary(|| {
        let s = with_loader(loader, |open| Ok(open.loader.state()))?;
        if !epoch.is_null() {
            put(epoch, "epoch", s.epoch)?;
        }
        if !served.is_null() {
            put(served, "served", s.served)?;
        }
        Ok(BRAND_OK)
    })
}

/// The number of samples this loader serves per epoch (its rank's share,
/// with padding unless drop_last), into `*out`.
#[unsafe(no_mangle)]
pub extern "C" fn brand_epoch_len(loader: *const brand_loader, out: *mut u64) -> brand_status {
    boundary(|| {
        let n = with_loader(loader, |open| Ok(open.epoch_len))?;
        put(out, "out", n)?;
        Ok(BRAND_OK)
    })
}

/// The number of samples in the dataset, into `*out`.
#[unsafe(no_mangle)]
pub extern "C" fn brand_dataset_samples(loader: *const brand_loader, out: *mut u64) -> brand_status {
    boundary(|| {
        let n = with_loader(loader, |open| Ok(open.loader.dataset().index.samples()))?;
        put(out, "out", n)?;
        Ok(BRAND_OK)
    })
}

/// The size in bytes of this loader's state blob, into `*out` (the same
/// for every loader of this library version; ask anyway).
#[unsafe(no_mangle)]
pub extern "C" fn brand_state_size(loader: *const brand_loader, out: *mut usize) -> brand_status {
    boundary(|| {
        with_loader(loader, |_| Ok(()))?;
        put(out, "out", state::LEN)?;
        Ok(BRAND_OK)
    })
}

/// Saves where the loader is (after the last batch it returned) as a blob
/// for `brand_open_at`: versioned, little-endian, checksummed, and bound to
/// the dataset and plan config. Writes it to `buf[0..len]` and its size to
/// `*written`. If `len` is too small: BRAND_ERR_BUFFER_TOO_SMALL, nothing
/// is written to `buf`, and `*written` is the size needed.
///
/// Samples in batches not yet consumed by the caller count as served: save
/// after the training step that consumed the last batch.
#[unsafe(no_mangle)]
pub extern "C" fn brand_state_save(
    loader: *const brand_loader,
    buf: *mut u8,
    len: usize,
    written: *mut usize,
) -> brand_status {
    boundary(|| {
        if written.is_null() {
            return Err(Failure::invalid("written is NULL"));
        }
        let blob = with_loader(loader, |open| Ok(state::encode(open.loader.state(), &open.fingerprint)))?;
        put(written, "written", blob.len())?;
        if len < blob.len() {
            return Err(Failure::new(
                BRAND_ERR_BUFFER_TOO_SMALL,
                format!("the state needs {} bytes, the buffer has {len}", blob.len()),
            ));
        }
        if buf.is_null() {
            return Err(Failure::invalid("buf is NULL"));
        }
        // SAFETY: buf is non-NULL and points to len >= blob.len() writable
        // bytes (contract); blob is a local array, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), buf, blob.len()) };
        Ok(BRAND_OK)
    })
}

/// Fills `*out` with the loader's counters. The caller sets
/// `out->struct_size` first (at least 4); see `brand_metrics`.
#[unsafe(no_mangle)]
pub extern "C" fn brand_get_metrics(loader: *const brand_loader, out: *mut brand_metrics) -> brand_status {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        // SAFETY: out is non-NULL; its first field, the caller-set size, is
        // readable (contract). Read as bytes: nothing else is assumed yet.
        let caller = unsafe { out.cast::<u32>().read_unaligned() } as usize;
        if caller < size_of::<u32>() {
            return Err(Failure::invalid(format!(
                "out->struct_size is {caller}: set it to sizeof(brand_metrics)"
            )));
        }
        let (m, node) = with_loader(loader, |open| Ok(open.loader.metrics()))?;
        let (d, node_rank, nodes) = node.unwrap_or_default();
        let n = caller.min(size_of::<brand_metrics>());
        let filled = brand_metrics {
            struct_size: n as u32,
            buffered_fallback: m.buffered_fallback as u32,
            bytes_read: m.bytes_read,
            bytes_served: m.bytes_served,
            samples_served: m.samples_served,
            reads_issued: m.reads_issued,
            refills: m.refills,
            recovery_reads: m.recovery_reads,
            stalls: m.stalls,
            stall_secs_total: m.stall_secs_total,
            stall_p50_secs: m.stall_p50_secs,
            stall_p95_secs: m.stall_p95_secs,
            stall_p99_secs: m.stall_p99_secs,
            stall_max_secs: m.stall_max_secs,
            peak_resident_bytes: m.peak_resident_bytes,
            peak_resident_samples: m.peak_resident_samples,
            read_gap: m.read_gap.unwrap_or(BRAND_READ_GAP_WHOLE),
            read_amplification: m.read_amplification(),
            threads_backend: m.threads_backend as u32,
            uring_refused: m.uring_refused as u32,
            peak_readahead_bytes: m.peak_readahead_bytes,
            registered_buffer_bytes: m.registered_buffer_bytes,
            peak_read_buffer_bytes: m.peak_read_buffer_bytes,
            skipped_corrupt: m.skipped_corrupt,
            nodes,
            node_rank,
            samples_local: d.samples_local,
            samples_received: d.samples_received,
            bytes_received: d.bytes_received,
            samples_pushed: d.samples_pushed,
            bytes_pushed: d.bytes_pushed,
            remote_memory_peak: d.remote_memory_peak,
            remote_memory_limit: d.remote_memory_limit,
            owner_peak_bytes: d.owner_peak_bytes,
        };
        // SAFETY: out points to at least `caller` >= n writable bytes
        // (contract: struct_size is the size of the caller's struct);
        // `filled` is a local repr(C) struct without padding, n <= its size.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const filled).cast::<u8>(), out.cast::<u8>(), n);
        }
        Ok(BRAND_OK)
    })
}

fn c_sample(s: ::brand_loader::SampleRef<'_>) -> brand_sample {
    brand_sample {
        data: s.data.as_ptr(),
        len: s.data.len(),
        key: s.key.as_ptr().cast(),
        key_len: s.key.len(),
        id: s.id,
        label: s.label,
    }
}

/// The number of samples in `batch` (0 for NULL).
#[unsafe(no_mangle)]
pub extern "C" fn brand_batch_len(batch: *const brand_batch) -> usize {
    guard(0, || {
        // SAFETY: a non-NULL batch is a live batch from brand_next (contract).
        unsafe { batch.as_ref() }.map_or(0, |b| b.batch.len())
    })
}

/// The epoch `batch` belongs to (0 for NULL).
#[unsafe(no_mangle)]
pub extern "C" fn brand_batch_epoch(batch: *const brand_batch) -> u64 {
    guard(0, || {
        // SAFETY: a non-NULL batch is a live batch from brand_next (contract).
        unsafe { batch.as_ref() }.map_or(0, |b| b.batch.epoch)
    })
}

/// Sample `index` (0..brand_batch_len) of `batch`, into `*out`. Zero-copy:
/// `out->data` and `out->key` point into the batch and stay valid until
/// `brand_batch_free`. BRAND_ERR_INVALID_ARGUMENT for NULLs or an index out
/// of range.
#[unsafe(no_mangle)]
pub extern "C" fn brand_batch_sample(batch: *const brand_batch, index: usize, out: *mut brand_sample) -> brand_status {
    boundary(|| {
        // SAFETY: a non-NULL batch is a live batch from brand_next (contract).
        let b = unsafe { batch.as_ref() }.ok_or_else(|| Failure::invalid("batch is NULL"))?;
        let s = b
            .batch
            .get(index)
            .ok_or_else(|| Failure::invalid(format!("sample {index} of a batch of {}", b.batch.len())))?;
        put(out, "out", c_sample(s))?;
        Ok(BRAND_OK)
    })
}

/// Samples `first..first + count` of `batch` into `out[0..count]` in one
/// call: the same as `brand_batch_sample` for each index, without a call per
/// sample (use it on hot paths). BRAND_ERR_INVALID_ARGUMENT for NULLs or a
/// range past the end, with nothing written. `out` may be NULL if `count` is 0.
#[unsafe(no_mangle)]
pub extern "C" fn brand_batch_samples(
    batch: *const brand_batch,
    first: usize,
    count: usize,
    out: *mut brand_sample,
) -> brand_status {
    boundary(|| {
        // SAFETY: a non-NULL batch is a live batch from brand_next (contract).
        let b = unsafe { batch.as_ref() }.ok_or_else(|| Failure::invalid("batch is NULL"))?;
        let len = b.batch.len();
        if first.checked_add(count).is_none_or(|end| end > len) {
            return Err(Failure::invalid(format!(
                "samples {first}..{first}+{count} of a batch of {len}"
            )));
        }
        if count == 0 {
            return Ok(BRAND_OK);
        }
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        // SAFETY: out is non-NULL and points to `count` writable brand_sample
        // structs (contract); brand_sample is Copy, so overwriting needs no drop.
        let dst = unsafe { std::slice::from_raw_parts_mut(out, count) };
        for (slot, i) in dst.iter_mut().zip(first..) {
            let s = b
                .batch
                .get(i)
                .ok_or_else(|| Failure::invalid(format!("sample {i} of a batch of {len}")))?;
            *slot = c_sample(s);
        }
        Ok(BRAND_OK)
    })
}

/// Frees `*batch` and sets `*batch` to NULL; `batch == NULL` or
/// `*batch == NULL` is a no-op. So freeing twice through the same variable
/// is safe; freeing through another copy of a freed pointer is not (batches
/// are plain heap objects: that is a double free). Samples taken from the
/// batch become invalid. A batch may be freed on any thread, and may be
/// freed after its loader was closed.
#[unsafe(no_mangle)]
pub extern "C" fn brand_batch_free(batch: *mut *mut brand_batch) {
    guard((), || {
        if batch.is_null() {
            return;
        }
        // SAFETY: batch is non-NULL and points to a readable, writable
        // variable holding NULL or a live batch from brand_next (contract).
        let b = unsafe { batch.read() };
        if b.is_null() {
            return;
        }
        // SAFETY: as above.
        unsafe { batch.write(std::ptr::null_mut()) };
        // SAFETY: b came from Box::into_raw in brand_next and, by the
        // contract, was not freed before: this takes back ownership once.
        drop(unsafe { Box::from_raw(b) });
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panic path of an entry point working on a loader: what
    /// `brand_test_panic` tested before it left the shipped library.
    #[test]
    fn a_panic_inside_a_loader_poisons_only_that_loader() {
        let t = tempfile::tempdir().expect("tempdir");
        let opts = brand_pack::synthetic::GenOptions {
            samples: 40,
            mean_bytes: 3000,
            min_bytes: 0,
            max_bytes: 12_000,
            classes: 4,
            seed: 1,
            ..Default::default()
        };
        let pack = brand_pack::PackOptions {
            chunk_size: 16,
            ..Default::default()
        };
        let ds = brand_pack::synthetic::generate_and_pack(t.path(), &opts, &pack).expect("dataset");
        let path = std::ffi::CString::new(ds.to_str().expect("utf-8")).expect("no NUL");
        let cfg = c"batch_size = 16\nmemory = \"32 slots\"\nread_gap = \"0\"\nqueue_depth = 8\n";
        let (mut l, mut other) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(brand_open(path.as_ptr(), cfg.as_ptr(), &mut l), BRAND_OK);
        assert_eq!(brand_open(path.as_ptr(), cfg.as_ptr(), &mut other), BRAND_OK);
        let status = boundary(|| {
            with_loader(l, |_| -> Result<(), Failure> {
                panic!("a deliberate panic inside a loader")
            })?;
            Ok(BRAND_OK)
        });
        assert_eq!(status, BRAND_ERR_PANIC);
        let mut b = std::ptr::null_mut();
        assert_eq!(
            brand_next(l, &mut b),
            BRAND_ERR_PANIC,
            "a loader that panicked stays unusable"
        );
        assert!(b.is_null());
        assert_eq!(brand_next(other, &mut b), BRAND_OK, "other loaders are unaffected");
        brand_batch_free(&mut b);
        assert_eq!(brand_close(&mut l), BRAND_OK);
        assert_eq!(brand_close(&mut other), BRAND_OK);
    }
}
