//! Loader counters: `brand_metrics`, sized by the caller so that fields
//! appended later never overrun an older caller's struct. Its fields come
//! from brand-loader's metrics table, as `Metrics` does (see `c_struct`).

use ::brand_loader::Metrics;

use crate::handles::{brand_loader, with_loader};
use crate::status::brand_status::{self, *};
use crate::status::{Failure, boundary};

/// `brand_metrics.read_gap` when whole chunks are read (the paper's way).
pub const BRAND_READ_GAP_WHOLE: u64 = u64::MAX;

// `brand_metrics` and its `From<&Metrics>`, generated from brand-loader's
// metrics table (`crates/loader/src/stats.rs`) by `tests/header.rs`, as
// plain source for cbindgen to read (it does not expand macros).
#[rustfmt::skip]
mod c_struct;
pub use c_struct::brand_metrics;

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
        let m: Metrics = with_loader(loader, |reader| Ok(reader.metrics()))?;
        let n = caller.min(size_of::<brand_metrics>());
        let filled = brand_metrics {
            struct_size: n as u32,
            ..brand_metrics::from(&m)
        };
        // SAFETY: out points to at least `caller` >= n writable bytes
        // (contract: struct_size is the size of the caller's struct);
        // `filled` is a local repr(C) struct without padding (asserted in
        // c_struct), n <= its size.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const filled).cast::<u8>(), out.cast::<u8>(), n);
        }
        Ok(BRAND_OK)
    })
}
