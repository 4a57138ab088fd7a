//! SIGINT and SIGTERM as ordinary events: blocked before any other thread
//! exists (threads inherit the mask) and taken with `sigwait`, so what they
//! stop (a pack's unfinished output, a cache's socket) is cleaned up by
//! ordinary code, not in a signal handler.

use brand_format::{Error, Result};

/// Blocks SIGINT and SIGTERM in this thread and every thread started after;
/// the returned set is what to `sigwait` on.
pub fn block_stop_signals() -> Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; SIGINT and SIGTERM are valid signals.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(Error::io("<signal mask>", std::io::Error::from_raw_os_error(rc)));
    }
    Ok(set)
}
