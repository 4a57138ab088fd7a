//! Where a loader is and its checkpoints: the position (`brand_tell`,
//! `brand_start_epoch`), the epoch's size, and the state blob
//! (`brand_loader::Checkpoint`) that `brand_open_at` resumes from.

use ::brand_loader::LoaderState;

use crate::handles::{brand_loader, put, with_loader};
use crate::status::brand_status::{self, *};
use crate::status::{Failure, Outcome, boundary};

/// Jumps to the start of `epoch` (each epoch has its own order), dropping
/// anything read ahead. Also the way on after BRAND_ERR_CORRUPT. A node of
/// a multi-node job can only be told its start before its first
/// `brand_next` (BRAND_ERR_CONFIG after, unless it is there already).
#[unsafe(no_mangle)]
pub extern "C" fn brand_start_epoch(loader: *mut brand_loader, epoch: u64) -> brand_status {
    boundary(|| {
        with_loader(loader, |reader| {
            reader.start_epoch(epoch)?;
            Ok(BRAND_OK)
        })
    })
}

/// Reads ahead no further than the end of `epoch`, the last epoch the
/// caller reads (`epoch` < 0: no last epoch, the default: each epoch is read
/// ahead into the next so its first batch does not wait). Only what is
/// fetched changes: read-ahead into an epoch nobody reads is up to
/// `readahead` bytes read for nothing (GETs, from object storage). An epoch
/// asked for after it is served as ever, its reads starting then. A node of
/// a multi-node job or a loader attached to a cache reads what its job
/// reads: the call changes nothing there (BRAND_OK).
#[unsafe(no_mangle)]
pub extern "C" fn brand_set_last_epoch(loader: *mut brand_loader, epoch: i64) -> brand_status {
    boundary(|| {
        with_loader(loader, |reader| {
            reader.set_last_epoch(u64::try_from(epoch).ok());
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
        let s = with_loader(loader, |reader| Ok(reader.state()))?;
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
        let n = with_loader(loader, |reader| Ok(reader.epoch_len()))?;
        put(out, "out", n)?;
        Ok(BRAND_OK)
    })
}

/// The number of samples in the dataset, into `*out`.
#[unsafe(no_mangle)]
pub extern "C" fn brand_dataset_samples(loader: *const brand_loader, out: *mut u64) -> brand_status {
    boundary(|| {
        let n = with_loader(loader, |reader| Ok(reader.dataset().index.samples()))?;
        put(out, "out", n)?;
        Ok(BRAND_OK)
    })
}

/// The size in bytes of the largest state blob this loader saves, into
/// `*out`: a buffer of it always suffices for `brand_state_save`.
/// `BRAND_POSITION_STATE_SIZE` (88) for a loader alone or a node; for a job
/// attached to a cache (`cache = "PATH"`), or one resumed from such a job's
/// state, 88 + 8 × ceil(samples / 64),
/// because its state mid-epoch holds a bitmap of the samples served.
#[unsafe(no_mangle)]
pub extern "C" fn brand_state_size(loader: *const brand_loader, out: *mut usize) -> brand_status {
    boundary(|| {
        let n = with_loader(loader, |reader| Ok(reader.checkpoint_len()))?;
        put(out, "out", n)?;
        Ok(BRAND_OK)
    })
}

/// Saves where the loader is (after the last batch it returned) as a blob
/// for `brand_open_at`: versioned, little-endian, checksummed, and bound to
/// the dataset and plan config. Writes it to `buf[0..len]` and its size to
/// `*written`. If `len` is too small: BRAND_ERR_BUFFER_TOO_SMALL, nothing
/// is written to `buf`, and `*written` is the size needed.
///
/// The size varies: `BRAND_POSITION_STATE_SIZE` (88) bytes where the
/// position is a count (a loader alone, a node, any loader at an epoch's
/// start); mid-epoch, a job
/// attached to a cache saves which samples it served (its order depends on
/// timing), up to `brand_state_size`. Blobs of either kind resume with
/// `brand_open_at`, attached or alone.
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
    boundary(|| write_state(loader, None, buf, len, written))
}

/// As `brand_state_save`, for the position `served` samples into `epoch`:
/// one the loader has been at since the start of the last batch it
/// returned (`brand_tell` before that `brand_next`, plus the samples of the
/// batch the caller handed on). For a caller that hands a batch out sample
/// by sample and saves between them: a job attached to a cache cannot read
/// a batch again, so its state there must leave out the rest of the batch.
/// Another position of an attached job gives BRAND_ERR_INVALID_STATE; a
/// loader alone takes any count of its current epoch (on_corrupt = "skip"
/// makes a count inside a batch that skipped a sample inexact: save
/// between its batches).
#[unsafe(no_mangle)]
pub extern "C" fn brand_state_save_at(
    loader: *const brand_loader,
    epoch: u64,
    served: u64,
    buf: *mut u8,
    len: usize,
    written: *mut usize,
) -> brand_status {
    boundary(|| write_state(loader, Some(LoaderState { epoch, served }), buf, len, written))
}

/// The checkpoint at `at` (None: now) written as `brand_state_save` says.
fn write_state(
    loader: *const brand_loader,
    at: Option<LoaderState>,
    buf: *mut u8,
    len: usize,
    written: *mut usize,
) -> Outcome {
    if written.is_null() {
        return Err(Failure::invalid("written is NULL"));
    }
    let blob = with_loader(loader, |reader| {
        let checkpoint = match at {
            Some(state) => reader.checkpoint_at(state)?,
            None => reader.checkpoint()?,
        };
        Ok(checkpoint.to_bytes())
    })?;
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
    // bytes (contract); blob is our own allocation, so they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), buf, blob.len()) };
    Ok(BRAND_OK)
}
