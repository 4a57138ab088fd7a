//! A file's bytes mapped read-only and shared: the page cache holds one copy
//! for every process on the machine that maps the same file (ranks,
//! DataLoader workers, the TF op, the cache), and only the pages a process
//! touches are in its resident set — none of them anonymous memory.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};

/// The bytes of a file, mapped with `MAP_SHARED | PROT_READ`.
///
/// brand never writes a dataset file in place (a pack writes a new
/// directory and renames it), so the mapping's bytes do not change under
/// it; a file truncated by someone else while mapped would raise SIGBUS on
/// access, the same risk every mmap reader (LMDB, Arrow) takes.
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value until drop; the
// bytes behind `ptr` are never mutated through it, so sharing `&[u8]` views
// across threads is as safe as sharing a `&[u8]` of a `Vec`.
unsafe impl Send for Mapped {}
// SAFETY: see `Send`: only shared reads go through the pointer.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps all of `path`. An empty file is refused (there is nothing to
    /// map, and every brand file has a header).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let len = usize::try_from(len).map_err(|_| Error::format(path, 0, format!("{len} bytes: too large to map")))?;
        if len == 0 {
            return Err(Error::format(path, 0, "empty file".to_string()));
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh read-only shared mapping of an open descriptor, of
        // the file's length; the result is checked against MAP_FAILED before
        // use, and the descriptor may close once the mapping exists.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::io(path, std::io::Error::last_os_error()));
        }
        Ok(Mapped { ptr, len })
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of exactly `len` readable bytes
        // until `self` is dropped, and `&self` outlives the slice.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `open`, once; no slice of it
        // outlives `self` (they borrow it).
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapped({} bytes)", self.len)
    }
}

/// A new file's bytes mapped writable and shared, its blocks allocated
/// first: what is written lands in the page cache (reclaimable, not this
/// process's heap), and no write through the mapping can find the disk
/// full (that would be SIGBUS, not an error).
pub struct MappedMut {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by this value until drop and only reached
// through `&mut self` (writes) or `&self` (reads), as a `Vec<u8>` is.
unsafe impl Send for MappedMut {}

impl MappedMut {
    /// Sizes `file` (opened for reading and writing, empty) to `len` bytes,
    /// allocates them and maps them. Fails where the file system cannot
    /// allocate (no space, or no `fallocate`): write the file another way.
    pub fn allocate(file: &File, len: usize) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "nothing to map"));
        }
        let off = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
        // SAFETY: a descriptor this function borrows, open for the call;
        // posix_fallocate returns an error number instead of setting errno.
        let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, off) };
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(err));
        }
        // SAFETY: a fresh shared mapping of `len` bytes of an open descriptor
        // whose file now has `len` allocated bytes; checked against
        // MAP_FAILED before use; the descriptor may close once it exists.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedMut { ptr, len })
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live writable mapping of exactly `len` bytes
        // until `self` is dropped, and `&mut self` makes the slice the only
        // view of it while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

impl Drop for MappedMut {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `allocate`, once; no slice of
        // it outlives `self` (they borrow it).
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}
