//! The shared memory samples live in: one memfd per cache, mapped
//! read-write by the cache and read-only by every attached job, whose
//! descriptor travels over the job's socket (SCM_RIGHTS). A memfd has no
//! name in any file system: when the cache and every job have let go of it,
//! the kernel frees it, so nothing can be left behind in `/dev/shm`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// A mapping of a memfd: the cache's (writable) or a job's (read-only).
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory valid until drop; the cache writes a
// region only while no job has been told of it (its allocator's contract),
// so shared access never races with a write.
unsafe impl Send for Mapping {}
// SAFETY: as for Send.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new memfd of `len` bytes, sealed at that size (a job's mapping can
    /// never lose its pages to a shrink), mapped read-write.
    pub fn create(len: usize) -> io::Result<(Mapping, OwnedFd)> {
        // SAFETY: the name is a NUL-terminated literal.
        let raw = unsafe { libc::memfd_create(c"brand-cache".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
                return Err(io::Error::last_os_error());
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let m = Self::map(fd.as_raw_fd(), len, libc::PROT_READ | libc::PROT_WRITE)?;
        Ok((m, fd))
    }

    /// A job's read-only view of the cache's memfd `fd`, which must be at
    /// least `len` bytes.
    pub fn open_shared(fd: OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: fstat fills the zeroed struct it is given.
        let size = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                return Err(io::Error::last_os_error());
            }
            st.st_size as u64
        };
        if size < len as u64 {
            return Err(io::Error::other(format!(
                "the cache's shared memory is {size} bytes, {len} announced"
            )));
        }
        Self::map(fd.as_raw_fd(), len, libc::PROT_READ)
        // fd closes here: the mapping keeps the memory.
    }

    fn map(fd: RawFd, len: usize, prot: libc::c_int) -> io::Result<Mapping> {
        let len = len.max(1);
        // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel
        // picks the address.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    pub fn size(&self) -> usize {
        self.len
    }

    /// The bytes at `offset..offset + len`, if inside the mapping.
    pub fn ptr_at(&self, offset: u64, len: usize) -> Option<NonNull<u8>> {
        let end = offset.checked_add(len as u64)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: offset ≤ len of the mapping, checked above.
        NonNull::new(unsafe { self.ptr.as_ptr().add(offset as usize) })
    }

    /// Copies `bytes` to `offset` (the cache's writable mapping only).
    ///
    /// # Safety
    /// The mapping is writable and no job has been handed this region since
    /// it was last freed.
    pub unsafe fn write(&self, offset: u64, bytes: &[u8]) -> bool {
        let Some(dst) = self.ptr_at(offset, bytes.len()) else {
            return false;
        };
        // SAFETY: dst is inside the mapping (checked) and, by the caller's
        // contract, writable and read by no one.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_ptr(), bytes.len()) };
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mmap returned; no reference into
        // it outlives the Mapping (samples hold an Arc of it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Sends `bytes` over the socket `sock` with `fd` attached (SCM_RIGHTS).
pub fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the descriptor"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != bytes.len() {
            return Err(io::Error::other("short send of the descriptor message"));
        }
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes from `sock`, and the descriptor sent
/// with them, if any.
pub fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut got = 0usize;
    let mut fd = None;
    while got < buf.len() {
        let mut iov = libc::iovec {
            iov_base: buf[got..].as_mut_ptr().cast(),
            iov_len: buf.len() - got,
        };
        // SAFETY: msghdr is plain data; its pointers outlive the call, and
        // the control buffer is only read within what the kernel filled.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            got += n as usize;
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                    // The kernel installed a new descriptor for us.
                    fd = Some(OwnedFd::from_raw_fd(raw));
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    Ok(fd)
}

/// Writes all of `bytes` to `sock` without raising SIGPIPE in the process
/// when the peer has gone (a job may be a Python or C program that keeps
/// SIGPIPE's default action).
pub fn send_all(sock: RawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: sends from a live slice.
        let n = unsafe { libc::send(sock, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}
