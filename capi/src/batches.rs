//! Batches: `brand_next` hands them out, the caller owns them until
//! `brand_batch_free`, and their samples point into them (zero-copy).

use std::ffi::c_char;

use ::brand_loader::{Batch, SampleRef};

use crate::handles::{brand_loader, put, with_loader};
use crate::status::brand_status::{self, *};
use crate::status::{Failure, boundary, guard};

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
        let batch = with_loader(loader, |reader| Ok(reader.next_batch()?))?;
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

fn c_sample(s: SampleRef<'_>) -> brand_sample {
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
