//! A parallel map over `0..n` on scoped threads, results in index order: all
//! the parallelism packing, generating and verifying need, without a thread
//! pool crate.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// `f(0), f(1), …, f(n - 1)` computed on up to one thread per core; the
/// results come back in index order. After the first error no new index is
/// started, and the error of the lowest failed index is returned, so the
/// outcome does not depend on scheduling.
pub fn try_map<T, E, F>(n: usize, f: F) -> Result<Vec<T>, E>
where
    T: Send,
    E: Send,
    F: Fn(usize) -> Result<T, E> + Sync,
{
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let worker = || {
        let mut done = Vec::new();
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            let r = f(i);
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            done.push((i, r));
        }
        done
    };
    let mut results: Vec<(usize, Result<T, E>)> = if threads <= 1 {
        worker()
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        })
    };
    results.sort_unstable_by_key(|&(i, _)| i);
    // Indices are taken in order, so without an error every one of 0..n is
    // here; with one, the first error in index order is the answer.
    results.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::try_map;

    #[test]
    fn results_in_index_order() {
        let v: Result<Vec<usize>, ()> = try_map(1000, |i| Ok(i * 2));
        assert_eq!(v, Ok((0..1000).map(|i| i * 2).collect()));
        let empty: Result<Vec<u8>, ()> = try_map(0, |_| Ok(1));
        assert_eq!(empty, Ok(vec![]));
    }

    #[test]
    fn the_lowest_failed_index_is_reported() {
        let r: Result<Vec<usize>, usize> = try_map(500, |i| if i % 100 == 37 { Err(i) } else { Ok(i) });
        assert_eq!(r, Err(37));
    }
}
