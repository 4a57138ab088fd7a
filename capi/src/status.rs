//! Status codes, the thread-local last-error message and the panic boundary
//! every entry point goes through.

use std::cell::{Cell, RefCell};
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What a call did. A fixed-width `int32_t` in C: `BRAND_OK` is 0, the
/// other non-errors are positive and every error is negative.
#[allow(non_camel_case_types)]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum brand_status {
    /// Success.
    BRAND_OK = 0,
    /// `brand_next`: the epoch is over (`*out` is NULL); the next call starts
    /// the next epoch.
    BRAND_END_OF_EPOCH = 1,
    /// A NULL pointer where one is not allowed, a config that is not UTF-8,
    /// a sample index out of range.
    BRAND_ERR_INVALID_ARGUMENT = -1,
    /// The config TOML is malformed or asks for something that cannot work
    /// (the message names the key).
    BRAND_ERR_CONFIG = -2,
    /// The dataset (or one of its files) does not exist.
    BRAND_ERR_NOT_FOUND = -3,
    /// Any other operating-system error (permissions, io_uring unavailable, ...).
    BRAND_ERR_IO = -4,
    /// A dataset file is malformed (manifest, index, chunk header).
    BRAND_ERR_FORMAT = -5,
    /// Data loss: a record does not match its checksum or length. The
    /// message names the segment file, chunk, byte offset and sample.
    BRAND_ERR_CORRUPT = -6,
    /// A state blob that is not a brand loader state: truncated, damaged
    /// (checksum), or from a newer library.
    BRAND_ERR_INVALID_STATE = -7,
    /// A valid state saved for a different dataset or plan configuration
    /// (the message lists what differs).
    BRAND_ERR_STATE_MISMATCH = -8,
    /// `brand_state_save`: the buffer is too small; `*written` holds the size needed.
    BRAND_ERR_BUFFER_TOO_SMALL = -9,
    /// The loader handle is not open: it was closed already (a stale copy
    /// of the pointer) or never came from `brand_open`.
    BRAND_ERR_CLOSED = -10,
    /// A bug inside brand (a Rust panic) was caught at the boundary. The
    /// message holds the panic text. A loader that panicked stays unusable:
    /// close it.
    BRAND_ERR_PANIC = -11,
}

use brand_status::*;

/// Every status brand.h defines, for `brand_status_name` and the tests.
///
/// cbindgen:ignore
pub const ALL_STATUSES: [brand_status; 13] = [
    BRAND_OK,
    BRAND_END_OF_EPOCH,
    BRAND_ERR_INVALID_ARGUMENT,
    BRAND_ERR_CONFIG,
    BRAND_ERR_NOT_FOUND,
    BRAND_ERR_IO,
    BRAND_ERR_FORMAT,
    BRAND_ERR_CORRUPT,
    BRAND_ERR_INVALID_STATE,
    BRAND_ERR_STATE_MISMATCH,
    BRAND_ERR_BUFFER_TOO_SMALL,
    BRAND_ERR_CLOSED,
    BRAND_ERR_PANIC,
];

impl brand_status {
    /// The name as a NUL-terminated static string.
    pub fn name(self) -> &'static std::ffi::CStr {
        match self {
            BRAND_OK => c"BRAND_OK",
            BRAND_END_OF_EPOCH => c"BRAND_END_OF_EPOCH",
            BRAND_ERR_INVALID_ARGUMENT => c"BRAND_ERR_INVALID_ARGUMENT",
            BRAND_ERR_CONFIG => c"BRAND_ERR_CONFIG",
            BRAND_ERR_NOT_FOUND => c"BRAND_ERR_NOT_FOUND",
            BRAND_ERR_IO => c"BRAND_ERR_IO",
            BRAND_ERR_FORMAT => c"BRAND_ERR_FORMAT",
            BRAND_ERR_CORRUPT => c"BRAND_ERR_CORRUPT",
            BRAND_ERR_INVALID_STATE => c"BRAND_ERR_INVALID_STATE",
            BRAND_ERR_STATE_MISMATCH => c"BRAND_ERR_STATE_MISMATCH",
            BRAND_ERR_BUFFER_TOO_SMALL => c"BRAND_ERR_BUFFER_TOO_SMALL",
            BRAND_ERR_CLOSED => c"BRAND_ERR_CLOSED",
            BRAND_ERR_PANIC => c"BRAND_ERR_PANIC",
        }
    }
}

/// A failed call: its status and message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: brand_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: brand_status, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(BRAND_ERR_INVALID_ARGUMENT, message)
    }
}

impl From<brand_format::Error> for Failure {
    fn from(e: brand_format::Error) -> Self {
        let status = match &e {
            brand_format::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                BRAND_ERR_NOT_FOUND
            }
            brand_format::Error::Io { .. } => BRAND_ERR_IO,
            brand_format::Error::Format { .. } | brand_format::Error::Input { .. } => BRAND_ERR_FORMAT,
            brand_format::Error::Corrupt { .. } => BRAND_ERR_CORRUPT,
            brand_format::Error::Config(_) => BRAND_ERR_CONFIG,
            brand_format::Error::StateMismatch(_) => BRAND_ERR_STATE_MISMATCH,
            brand_format::Error::InvalidState(_) => BRAND_ERR_INVALID_STATE,
        };
        Failure::new(status, e.to_string())
    }
}

pub(crate) type Outcome = Result<brand_status, Failure>;

thread_local! {
    /// The message of the last call on this thread that returned a status
    /// (None: it succeeded).
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
    /// Whether LAST_ERROR holds a message: a plain flag (no destructor to
    /// register), so clearing after a success is one thread-local load.
    static HAS_ERROR: Cell<bool> = const { Cell::new(false) };
}

/// Records the message of the call that is returning (None on success).
#[inline]
pub(crate) fn set_last_error(message: Option<&str>) {
    if message.is_none() && !HAS_ERROR.get() {
        return;
    }
    store_last_error(message);
}

#[cold]
fn store_last_error(message: Option<&str>) {
    HAS_ERROR.set(message.is_some());
    let text = message.map(|m| {
        // Interior NULs (possible in a panic message) would cut the C string.
        CString::new(m.replace('\0', "\u{FFFD}")).unwrap_or_default()
    });
    // A thread being torn down has no message to keep: ignore that case.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = text;
        }
    });
}

/// The pointer `brand_last_error` returns: the thread's message or "".
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| match slot.try_borrow() {
            Ok(s) => s.as_ref().map(|c| c.as_ptr()),
            Err(_) => None,
        })
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs the body of an entry point that returns a status: a panic becomes
/// `BRAND_ERR_PANIC`, an error becomes its status, and the thread's last
/// error describes the outcome either way.
#[inline]
pub(crate) fn boundary(body: impl FnOnce() -> Outcome) -> brand_status {
    let outcome = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(o) => o,
        Err(payload) => {
            let text = panic_text(payload.as_ref());
            // Dropping a payload can itself panic; keep that inside too.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            Err(Failure::new(
                BRAND_ERR_PANIC,
                format!("internal error (panic) in brand: {text}"),
            ))
        }
    };
    match outcome {
        Ok(status) => {
            set_last_error(None);
            status
        }
        Err(f) => {
            set_last_error(Some(&f.message));
            f.status
        }
    }
}

/// Runs the body of an entry point that returns a plain value (no status,
/// no last error): a panic gives `fallback`.
pub(crate) fn guard<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: last_error_ptr returns a NUL-terminated string valid until
        // the next call on this thread.
        unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_brand_err_panic_with_its_text() {
        let status = boundary(|| panic!("a deliberate panic"));
        assert_eq!(status, BRAND_ERR_PANIC);
        let msg = last_error();
        assert!(msg.contains("panic") && msg.contains("a deliberate panic"), "{msg}");
        // A formatted (String) payload too, and success clears the message.
        let n = 7;
        assert_eq!(boundary(|| panic!("panic number {n}")), BRAND_ERR_PANIC);
        assert!(last_error().contains("panic number 7"));
        assert_eq!(boundary(|| Ok(BRAND_OK)), BRAND_OK);
        assert_eq!(last_error(), "");
        assert_eq!(guard(5, || panic!("in guard")), 5);
    }
}
