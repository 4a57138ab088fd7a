//! A loader handle used in a `fork()`ed child fails at once, and closing
//! it there returns without touching the parent's threads or peers: even a
//! node of a multi-node job, whose threads and connections are the
//! parent's. The parent's loaders are unaffected. Loopback only; bounded.

use std::ffi::CString;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use brand::brand_status::*;
use brand::*;

mod common;
use common::{addresses, last_error, node_config, take};

const SAMPLES: u64 = 240;

fn config(nodes: &[String], rank: usize) -> CString {
    node_config(nodes, rank, "capi-fork", 10)
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
    let dir = brand_import::synthetic::small_dataset(t.path(), SAMPLES).expect("gen and pack");
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
                Ok((h, take(l, 2)?.0))
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
                let n = before + take(h as *mut brand_loader, 1000)?.0;
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
