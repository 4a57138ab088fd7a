//! Loader handles: ids in a registry, never pointers to memory, so a
//! stale or closed handle is looked up and refused, not dereferenced; and
//! the two helpers every entry point's marshalling uses.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use brand_reader::Reader;

use crate::status::Failure;
use crate::status::brand_status::*;

/// An open loader. Opaque: the pointer is a handle, never dereference it.
#[allow(non_camel_case_types)]
pub struct brand_loader {
    _opaque: (),
}

/// An open loader behind its handle; calls on it hold its lock.
pub(crate) type OpenReader = Arc<Opened>;

/// A loader and the process that opened it: in a `fork()`ed child its
/// threads, connections and lock holders are the parent's, so a call there
/// fails before taking the lock (a parent's thread may have held it across
/// the fork), and closing it leaves it alone.
pub(crate) struct Opened {
    pid: u32,
    reader: Mutex<Reader>,
}

impl Opened {
    /// Whether this process opened it (not a forked child).
    pub(crate) fn is_ours(&self) -> bool {
        self.pid == std::process::id()
    }
}

/// Open loaders by handle id. Ids are never reused, so a stale handle can
/// never reach a loader opened later.
static LOADERS: Mutex<BTreeMap<usize, OpenReader>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<usize, OpenReader>> {
    // Nothing panics while the registry is locked; a poisoned lock still
    // holds a consistent map.
    LOADERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `reader` under a new handle.
pub(crate) fn register(reader: Reader) -> *mut brand_loader {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let opened = Opened {
        pid: std::process::id(),
        reader: Mutex::new(reader),
    };
    registry().insert(id, Arc::new(opened));
    std::ptr::without_provenance_mut(id)
}

/// Takes `handle` out of the registry (None: not open).
pub(crate) fn unregister(handle: *mut brand_loader) -> Option<OpenReader> {
    registry().remove(&handle.addr())
}

fn lookup(loader: *const brand_loader) -> Result<OpenReader, Failure> {
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

/// Runs `f` on the reader behind `loader`, holding its lock.
pub(crate) fn with_loader<T>(
    loader: *const brand_loader,
    f: impl FnOnce(&mut Reader) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let shared = lookup(loader)?;
    if !shared.is_ours() {
        return Err(Failure::new(
            BRAND_ERR_CONFIG,
            format!(
                "loader {loader:p} was opened by process {} and cannot be used after fork() (in process {}): open a new loader in the child",
                shared.pid,
                std::process::id()
            ),
        ));
    }
    let mut reader = shared.reader.lock().map_err(|_| {
        Failure::new(
            BRAND_ERR_PANIC,
            "this loader is unusable: an earlier call panicked inside it (see that call's message); close it",
        )
    })?;
    f(&mut reader)
}

/// Writes `value` to `out` (checked non-NULL).
pub(crate) fn put<T>(out: *mut T, what: &str, value: T) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: out is non-NULL and, by the function's contract, points to a
    // writable T.
    unsafe { out.write(value) };
    Ok(())
}

/// A C string argument, or an error naming it.
pub(crate) fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a CStr, Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: p is non-NULL and, by the contract, a NUL-terminated string
    // that outlives this call.
    Ok(unsafe { CStr::from_ptr(p) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batches::{brand_batch_free, brand_next};
    use crate::open::{brand_close, brand_open};
    use crate::status::boundary;

    /// The panic path of an entry point working on a loader: what
    /// `brand_test_panic` tested before it left the shipped library.
    #[test]
    fn a_panic_inside_a_loader_poisons_only_that_loader() {
        let t = tempfile::tempdir().expect("tempdir");
        let opts = brand_import::synthetic::GenOptions {
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
        let ds = brand_import::synthetic::generate_and_pack(t.path(), &opts, &pack).expect("dataset");
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
