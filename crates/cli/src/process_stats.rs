//! What this process has used so far, for the reports of `brand read` and
//! `brand bench device`.

/// User + system CPU time of the whole process (the engine's threads too).
pub fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Peak resident set size of this process (Linux), in bytes.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Anonymous memory of this process now (Linux `smaps_rollup`), in bytes:
/// its heap and stacks, not the files it maps (the index, libraries).
pub fn anon_bytes() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup.lines().find(|l| l.starts_with("Anonymous:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows_with_work_and_rss_is_reported() {
        // Spins until 20 ms of CPU are counted: on a busy machine the
        // spin gets the CPU slowly, so wall time bounds it only loosely; a
        // count that never grows fails at the bound.
        let before = super::cpu_seconds();
        let mut x = 0u64;
        let spin = std::time::Instant::now();
        while super::cpu_seconds() - before < 0.02 && spin.elapsed() < std::time::Duration::from_secs(20) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        assert!(
            super::cpu_seconds() - before >= 0.02,
            "{:?} of spinning counted as less than 20 ms of CPU",
            spin.elapsed()
        );
        let rss = super::peak_rss().expect("VmHWM in /proc/self/status");
        assert!(rss > 1 << 20, "peak RSS {rss} bytes");
        let before = super::anon_bytes().expect("Anonymous in smaps_rollup");
        let held = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = super::anon_bytes().expect("Anonymous in smaps_rollup");
        assert!(
            after >= before + (60 << 20),
            "64 MiB touched: {before} -> {after} bytes"
        );
        drop(held);
    }
}
