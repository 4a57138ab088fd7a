//! Opening and closing loaders: a loader alone or a node, fresh or from
//! checkpoints, configured by the same TOML text every interface takes.

use std::ffi::{OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ::brand_loader::{Checkpoint, LoaderState, Resume};
use brand_reader::{Config, Reader};

use crate::handles::{brand_loader, c_str, put, register, unregister};
use crate::status::brand_status::{self, *};
use crate::status::{Failure, Outcome, boundary};

/// The dataset path and the configuration (NULL: the defaults) of an open
/// call, resolved with the launcher's environment.
fn path_and_config<'a>(dataset_path: *const c_char, config_toml: *const c_char) -> Result<(&'a Path, Config), Failure> {
    let path = Path::new(OsStr::from_bytes(c_str(dataset_path, "dataset_path")?.to_bytes()));
    let text = if config_toml.is_null() {
        ""
    } else {
        c_str(config_toml, "config_toml")?
            .to_str()
            .map_err(|e| Failure::invalid(format!("config_toml is not UTF-8: {e}")))?
    };
    Ok((path, Config::from_toml(text)?))
}

/// Opens a reader where `resume` says and hands out its handle.
fn open_loader(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    resume: impl FnOnce() -> Result<Resume, Failure>,
    out: *mut *mut brand_loader,
) -> Outcome {
    if out.is_null() {
        return Err(Failure::invalid("out is NULL"));
    }
    // SAFETY: out is non-NULL and points to a writable pointer (contract).
    unsafe { out.write(std::ptr::null_mut()) };
    let (path, config) = path_and_config(dataset_path, config_toml)?;
    let reader = Reader::open(path, &config, resume()?)?;
    // SAFETY: as above.
    unsafe { out.write(register(reader)) };
    Ok(BRAND_OK)
}

/// Opens a loader over the dataset directory `dataset_path` (made by
/// `brand pack`), at the start of epoch 0.
///
/// `config_toml` is the configuration as TOML, the same text `brand read
/// --config` and `brand serve --config` accept (batch_size, memory, policy,
/// seed, rank, world, drop_last, readahead, queue_depth, read_gap,
/// run_length, verify, cache, ...; every key optional), or NULL for the defaults.
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
///
/// A loader belongs to the process that opened it (its threads and
/// connections do not survive `fork()`): in a forked child every call on
/// it fails at once with BRAND_ERR_CONFIG naming fork, and `brand_close`
/// there only forgets the handle. Open a new loader in the child.
#[unsafe(no_mangle)]
pub extern "C" fn brand_open(
    dataset_path: *const c_char,
    config_toml: *const c_char,
    out: *mut *mut brand_loader,
) -> brand_status {
    boundary(|| {
        open_loader(
            dataset_path,
            config_toml,
            || Ok(Resume::At(LoaderState::default())),
            out,
        )
    })
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
        put(out, "out", Reader::epoch_len_for(path, &config)?)?;
        Ok(BRAND_OK)
    })
}

/// Opens a loader that continues exactly where the loader whose state is
/// `state[0..state_len]` (from `brand_state_save`) stopped: the next batch
/// starts with the first sample that loader had not handed out.
///
/// The dataset and the plan-relevant config (policy, seed, memory, rank,
/// world, drop_last, run_length) must be those of the saved loader:
/// BRAND_ERR_STATE_MISMATCH says which differ (to continue on another
/// number of ranks, use `brand_open_at_elastic` with every rank's state). I/O settings (batch_size,
/// read_gap, queue_depth, readahead, verify) may change. A blob that is not
/// a state gives BRAND_ERR_INVALID_STATE. Otherwise as `brand_open`.
///
/// The state of a job attached to a cache saved mid-epoch holds the samples
/// it served: with `cache` in `config_toml` it attaches again and the cache
/// serves it only the others; without, a loader alone serves the rest of
/// that epoch in its plan's order, leaving those samples out (its batches
/// are shorter where it does). Each sample comes once in that epoch either
/// way. Such a state cannot open a node of a multi-node job; an attached job cannot resume from a count saved
/// mid-epoch by a loader that was not attached (BRAND_ERR_INVALID_STATE).
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
        open_loader(
            dataset_path,
            config_toml,
            || Ok(Resume::Checkpoint(Checkpoint::from_bytes(blob)?)),
            out,
        )
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
/// not a state gives BRAND_ERR_INVALID_STATE naming it (`state i`), as does
/// the mid-epoch state of a job attached to a cache (the samples it served,
/// not a position in a world's order: resume it with `brand_open_at`). With
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
        let checkpoints = || {
            let each = blobs.iter().enumerate().map(|(i, b)| {
                Checkpoint::from_bytes(b).map_err(|e| Failure::new(BRAND_ERR_INVALID_STATE, format!("state {i}: {e}")))
            });
            Ok(Resume::Elastic(each.collect::<Result<_, _>>()?))
        };
        open_loader(dataset_path, config_toml, checkpoints, out)
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
        match unregister(handle) {
            // Dropped outside the registry lock: it joins the io thread.
            // A call running on it in another thread keeps it alive until
            // that call returns.
            Some(open) if open.is_ours() => {
                drop(open);
                Ok(BRAND_OK)
            }
            // A forked child: dropping it would join threads that are not
            // here and say goodbye to the parent's peers; its memory stays.
            Some(open) => {
                std::mem::forget(open);
                Ok(BRAND_OK)
            }
            None => Err(Failure::new(
                BRAND_ERR_CLOSED,
                format!("loader {handle:p} is not open (closed already, or not from brand_open)"),
            )),
        }
    })
}
