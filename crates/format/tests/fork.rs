//! A forked child can make and free sample buffers while other threads of
//! the parent were doing so at the fork (PyTorch's DataLoader forks its
//! workers from a process whose loader threads are busy).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use brand_format::buffer::AlignedBuf;

/// Sizes across the small recycler's classes (and one large buffer).
const SIZES: [usize; 9] = [1, 100, 700, 1500, 4096, 5000, 9000, 40_000, 70_000];

fn churn(round: usize) {
    let bufs: Vec<AlignedBuf> = SIZES.iter().map(|&n| AlignedBuf::for_sample(n + round % 64)).collect();
    drop(bufs);
}

#[test]
fn a_forked_child_makes_and_frees_buffers_while_the_parent_churns() {
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    churn(round);
                    round += 1;
                }
            })
        })
        .collect();
    let mut hung = 0;
    let mut failed = 0;
    for _ in 0..300 {
        // SAFETY: the child only makes and frees buffers, then _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            for round in 0..200 {
                churn(round);
            }
            // SAFETY: ends the child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let start = Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: pid is our child; status is a valid out pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                    failed += 1;
                }
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                hung += 1;
                // SAFETY: our own child; reaped right after.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in churners {
        c.join().expect("churner");
    }
    assert_eq!((hung, failed), (0, 0), "children hung, failed (of 300)");
}
