//! What the C ABI test binaries share: the thread's last error as text,
//! free loopback addresses and a small multi-node job's configuration.

use std::ffi::{CStr, CString};
use std::ptr::null_mut;

use brand::brand_status::*;
use brand::{brand_batch_free, brand_batch_len, brand_last_error, brand_loader, brand_next};
#[allow(unused_imports)] // not every test binary runs nodes
pub use brand_testkit::addresses;

/// This thread's `brand_last_error()` as a String.
pub fn last_error() -> String {
    let p = brand_last_error();
    assert!(!p.is_null(), "brand_last_error never returns NULL");
    // SAFETY: a NUL-terminated string valid until the next brand call on
    // this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Node `rank` of a job of `nodes` (16 slots, batches of 7, whole-chunk
/// reads, 64 KiB of remote memory, seed 5).
#[allow(dead_code)] // not every test binary runs nodes
pub fn node_config(nodes: &[String], rank: usize, job: &str, peer_timeout_secs: u64) -> CString {
    let list: Vec<String> = nodes.iter().map(|a| format!("\"{a}\"")).collect();
    CString::new(format!(
        "nodes = [{}]\nrank = {rank}\nmemory = \"16 slots\"\nbatch_size = 7\nread_gap = \"whole\"\nremote_memory = \"64KiB\"\npeer_timeout = \"{peer_timeout_secs}s\"\nseed = 5\njob = \"{job}\"\n",
        list.join(", ")
    ))
    .expect("no NUL")
}

/// Takes up to `limit` batches of the current epoch: how many samples, and
/// whether the epoch ended; the error text on failure.
#[allow(dead_code)] // not every test binary runs nodes
pub fn take(l: *mut brand_loader, limit: usize) -> Result<(u64, bool), String> {
    let mut samples = 0;
    for _ in 0..limit {
        let mut b = null_mut();
        match brand_next(l, &mut b) {
            BRAND_OK => {
                samples += brand_batch_len(b) as u64;
                brand_batch_free(&mut b);
            }
            BRAND_END_OF_EPOCH => return Ok((samples, true)),
            st => return Err(format!("brand_next: {st:?}: {}", last_error())),
        }
    }
    Ok((samples, false))
}
