//! brand's stable C ABI: marshalling only. Every entry point checks its
//! pointers, calls the runtime (`brand_reader::Reader`, which opens a loader
//! alone or a node of a multi-node job, configured by
//! `brand_reader::Config::resolve` and checkpointed by `brand_loader`) and
//! turns the result into a status. `include/brand.h` is generated from this
//! crate by cbindgen and checked in; `tests/header.rs` fails when the two
//! differ (`BRAND_BLESS=1 cargo test -p brand-capi --test header` rewrites it).
//!
//! The conventions (ownership, errors, threads) are written once, in the
//! header's preamble (`cbindgen.toml`), for C readers. In short:
//!
//! * Every entry point runs inside `catch_unwind` ([`status`]): no panic
//!   crosses the boundary; it becomes `BRAND_ERR_PANIC` with the panic text
//!   in `brand_last_error()`.
//! * A loader handle is an id in a registry ([`handles`]), not a pointer to
//!   memory: a stale or closed handle is looked up, not dereferenced, and
//!   gives `BRAND_ERR_CLOSED`. Calls on one loader are serialised by a lock.
//! * A batch is a heap object owned by the caller until `brand_batch_free`
//!   ([`batches`]); its samples point into it (zero-copy, 64-byte aligned).
//!
//! Files by concern: `open` (open, close), `batches`, `state` (position and
//! checkpoints), `metrics`, `handles`, `status`.

// The entry points take raw pointers from C, with the contracts written in
// brand.h, and are not `unsafe fn` in Rust: Rust code uses brand-loader and
// brand-reader; the rlib serves this crate's own tests, which pass valid
// pointers.
#![allow(
    clippy::not_unsafe_ptr_arg_deref,
    reason = "extern \"C\" entry points for C; every pointer is checked as brand.h documents (the rlib serves this crate's own tests; Rust code uses brand-loader and brand-reader)"
)]

pub mod batches;
mod handles;
pub mod metrics;
pub mod open;
pub mod state;
mod status;

use std::ffi::c_char;

pub use batches::*;
pub use handles::brand_loader;
pub use metrics::*;
pub use open::*;
pub use state::*;
use status::guard;
pub use status::{ALL_STATUSES, brand_status};

/// The ABI this header describes. Compare it with `brand_abi_version()` at
/// start-up to catch a header/library mismatch. It changes whenever a
/// signature, a struct layout or a status value changes incompatibly.
pub const BRAND_ABI_VERSION: u32 = 1;

/// The alignment of every sample's `data` pointer, in bytes.
pub const BRAND_SAMPLE_ALIGN: usize = 64;

/// The size of a state (`brand_state_save`) that is a position in the
/// plan's order: a loader alone's, a node's, any loader's at an epoch's
/// start. A longer state is an attached job's mid-epoch, which holds the
/// samples it served (its batches depend on timing and cannot be read
/// again from the state saved before them).
pub const BRAND_POSITION_STATE_SIZE: usize = 88;
const _: () = assert!(BRAND_POSITION_STATE_SIZE == ::brand_loader::Checkpoint::LEN);

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
