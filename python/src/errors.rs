//! brand's errors as Python exceptions: `brand.BrandError` and one subclass
//! per kind, the same kinds as the C ABI's status codes (capi/src/status.rs),
//! with the Rust error's message.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use brand_format::error::Error;
use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::PyException;

create_exception!(
    brand,
    BrandError,
    PyException,
    "Any error brand reports; the message names the file, chunk or sample concerned."
);
create_exception!(
    brand,
    ConfigError,
    BrandError,
    "A configuration key or argument that cannot work; the message names the key."
);
create_exception!(
    brand,
    NotFoundError,
    BrandError,
    "The dataset, or one of its files, does not exist."
);
create_exception!(
    brand,
    IoError,
    BrandError,
    "Any other operating-system error (permissions, io_uring refused, a read that timed out, ...)."
);
create_exception!(
    brand,
    FormatError,
    BrandError,
    "A dataset file is malformed (manifest, index, chunk header)."
);
create_exception!(
    brand,
    DataLossError,
    BrandError,
    "A record does not match its checksum or length: the message names the segment file, chunk, byte offset and sample."
);
create_exception!(
    brand,
    InvalidStateError,
    BrandError,
    "A state that is not a brand loader state (truncated, damaged, from a newer brand), or a loader that cannot be used."
);
create_exception!(
    brand,
    StateMismatchError,
    BrandError,
    "A valid state saved for another dataset or plan configuration; the message lists what differs."
);

/// The exception of a brand error: its kind as the C ABI maps it, its
/// message as Rust prints it.
pub fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => NotFoundError::new_err(message),
        Error::Io { .. } => IoError::new_err(message),
        Error::Format { .. } | Error::Input { .. } => FormatError::new_err(message),
        Error::Corrupt { .. } => DataLossError::new_err(message),
        Error::Config(_) => ConfigError::new_err(message),
        Error::StateMismatch(_) => StateMismatchError::new_err(message),
        Error::InvalidState(_) => InvalidStateError::new_err(message),
    }
}

/// Why a call into brand failed: its error, or a panic (a bug in brand),
/// which must not unwind into Python.
#[derive(Debug)]
pub enum Failure {
    Brand(Error),
    Panic(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Brand(e)
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Brand(e) => to_py(e),
            Failure::Panic(text) => BrandError::new_err(text),
        }
    }
}

/// Runs a call into brand with its panics caught: a panic becomes
/// [`Failure::Panic`] (raised as `BrandError`), never a Python
/// `PanicException` (a `BaseException` that `except Exception` misses).
pub fn guarded<T>(body: impl FnOnce() -> Result<T, Error>) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r.map_err(Failure::Brand),
        Err(payload) => Err(Failure::Panic(panic_message(payload))),
    }
}

/// The message of a caught panic (its payload dropped inside a guard too:
/// dropping a payload can itself panic).
pub fn panic_message(payload: Box<dyn Any + Send>) -> String {
    let text = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    format!("internal error (panic) in brand: {text}")
}
