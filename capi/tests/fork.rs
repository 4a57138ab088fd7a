//! A loader handle used in a `fork()`ed child fails at once, and closing
//! it there returns without touching the parent's threads or peers: even a
//! node of a multi-node job, whose threads and connections are the
//! parent's. The parent's loaders are unaffected. Loopback only; bounded.

use std::ffi::{CStr, CString};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use brand::brand_status::*;
use brand::*;

const SAMPLES: u64 = 240;

fn last_error() -> String {
    // SAFETY: brand_last_error returns a NUL-terminated string valid until
    // the next brand call on this thread.
    unsafe { CStr::from_ptr(brand_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn addresses(n: usize) -> Vec<String> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").to_string())
        .collect()
}

fn config(nodes: &[String], rank: usize) -> CString {
    let list: Vec<String> = nodes.iter().map(|a| format!("\"{a}\"")).collect();
    CString::new(format!(
        "nodes = [{}]\nrank = {rank}\nmemory = \"16 slots\"\nbatch_size = 7\nread_gap = \"whole\"\nremote_memory = \"64KiB\"\npeer_timeout = \"10s\"\nseed = 5\njob = \"capi-fork\"\n",
        list.join(", ")
    ))
    .expect("no NUL")
}

/// Samples of up to `limit` batches of the current epoch (stops at its end).
fn take(l: usize, limit: usize) -> Result<u64, String> {
    let l = l as *mut brand_loader;
    let mut samples = 0;
    for _ in 0..limit {
        let mut b = null_mut();
        match brand_next(l, &mut b) {
            BRAND_OK => {
                samples += brand_batch_len(b) as u64;
                brand_batch_free(&mut b);
            }
            BRAND_END_OF_EPOCH => break,
            st => return Err(format!("brand_next: {st:?}: {}", last_error())),
        }
    }
    Ok(samples)
}

/// In the child: every handle refuses a batch naming fork, and closes.
fn child(handles: &[usize]) -> i32 {
    for &h in handles {
        let mut l = h as *mut brand_loader;
        let mut b = null_mut();
        if brand_next(l, &mut b) != BRAND_ERR_CONFIG || !last_error().contains("fork") || !b.is_null() {
            return 1;
        }
        if brand_close(&mut l) != BRAND_OK || !l.is_null() {
            return 2;
        }
    }
    0
}

#[test]
fn handles_used_in_a_forked_child_fail_fast_and_close_without_the_parents_threads() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = brand_pack::synthetic::small_dataset(t.path(), SAMPLES).expect("gen and pack");
    let path = CString::new(dir.to_str().expect("utf-8")).expect("no NUL");
    let nodes = addresses(2);
    // Two nodes of one job, each opened and two batches in, on threads.
    let opened: Vec<_> = (0..2)
        .map(|rank| {
            let (path, cfg) = (path.clone(), config(&nodes, rank));
            std::thread::spawn(move || -> Result<(usize, u64), String> {
                let mut l = null_mut();
                if brand_open(path.as_ptr(), cfg.as_ptr(), &mut l) != BRAND_OK {
                    return Err(format!("brand_open: {}", last_error()));
                }
                let h = l as usize;
                Ok((h, take(h, 2)?))
            })
        })
        .collect();
    let opened: Vec<(usize, u64)> = opened
        .into_iter()
        .map(|t| t.join().expect("thread").expect("open and two batches"))
        .collect();
    let handles: Vec<usize> = opened.iter().map(|&(h, _)| h).collect();

    // SAFETY: the child only calls brand (which must not wait on the
    // parent's threads or locks) and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = child(&handles);
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let start = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: pid is our child; status is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child; reaped right after.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(libc::WIFEXITED(status), "status {status}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "1: brand_next did not fail naming fork; 2: brand_close failed"
    );

    // The parent's nodes finish their epoch together and close.
    let finished: Vec<_> = opened
        .into_iter()
        .map(|(h, before)| {
            std::thread::spawn(move || -> Result<u64, String> {
                let n = before + take(h, 1000)?;
                let mut l = h as *mut brand_loader;
                if brand_close(&mut l) != BRAND_OK {
                    return Err(format!("brand_close: {}", last_error()));
                }
                Ok(n)
            })
        })
        .collect();
    let served: u64 = finished
        .into_iter()
        .map(|t| t.join().expect("thread").expect("the parent's epoch"))
        .sum();
    assert_eq!(served, SAMPLES, "the parent's nodes served the whole epoch");
}
