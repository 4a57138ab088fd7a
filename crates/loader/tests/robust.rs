//! The loader where things go wrong or run long: backends and their
//! fallback under seccomp, resume at an epoch's end, errors at the sample
//! they concern, skipping corrupt samples, FIFOs, fork, a ring whose
//! submissions are refused, memory held in decoded bytes, and a soak.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_format::Dataset;
use brand_loader::{IoBackend, IoConfig, Loader, LoaderConfig, LoaderState, OnCorrupt, ReadGapSetting};
use brand_pack::PackOptions;
use brand_pack::synthetic::{GenOptions, generate_and_pack};
use brand_plan::{Memory, PlanConfig, Policy};

fn dataset(root: &Path, samples: u64) -> Arc<Dataset> {
    Arc::new(common::small_dataset(root, samples))
}

fn config(memory: Memory, rank: u32, world: u32, readahead: u64) -> LoaderConfig {
    LoaderConfig {
        plan: PlanConfig {
            memory,
            policy: Policy::Brand,
            seed: 5,
            rank,
            world,
            drop_last: false,
            run_length: 1,
        },
        batch_size: 8,
        readahead_bytes: readahead,
        io: IoConfig {
            queue_depth: 8,
            read_gap: ReadGapSetting::Bytes(0),
            ..IoConfig::default()
        },
        ..LoaderConfig::default()
    }
}

/// One epoch's ids, each checked against a buffered read.
fn epoch(l: &mut Loader, ds: &Dataset) -> Vec<u64> {
    let mut ids = Vec::new();
    while let Some(b) = l.next_batch().expect("batch") {
        for s in b.iter() {
            assert_eq!(s.data, &ds.read_sample(s.id).expect("buffered")[..], "sample {}", s.id);
            assert_eq!(s.data.as_ptr() as usize % 64, 0);
            ids.push(s.id);
        }
    }
    ids
}

fn exactly_once(ids: &[u64], n: u64) -> bool {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v == (0..n).collect::<Vec<_>>()
}

/// Plain and zstd datasets alike (only compressed records go to the
/// decode pool, so `decode_threads` changes the path for zstd alone).
#[test]
fn the_threads_backend_serves_what_io_uring_serves() {
    let t = tempfile::tempdir().expect("tempdir");
    let plain = dataset(&t.path().join("plain"), 300);
    let zstd = zstd_dataset(&t.path().join("zstd"), 300, 3);
    for ds in [plain, zstd] {
        let mut runs = Vec::new();
        for backend in [IoBackend::Uring, IoBackend::Threads] {
            for decode_threads in [0, 2] {
                let mut c = config(Memory::Percent(15.0), 0, 1, 1 << 20);
                c.io.backend = backend;
                c.io.decode_threads = decode_threads;
                let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
                let e = (epoch(&mut l, &ds), epoch(&mut l, &ds));
                assert!(exactly_once(&e.0, 300) && exactly_once(&e.1, 300));
                assert_eq!(l.metrics().threads_backend, backend == IoBackend::Threads);
                runs.push(e);
            }
        }
        assert!(runs.windows(2).all(|w| w[0] == w[1]), "same order on every backend");
    }
}

/// Child-process tests re-run this test binary with one test selected and
/// an env var saying what to do.
const CHILD: &str = "BRAND_ROBUST_CHILD";

fn run_child(test: &str, mode: &str, dir: &Path) -> (bool, String) {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{mode}:{}", dir.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut out = String::new();
            use std::io::Read;
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut out);
            }
            return (status.success(), out);
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("child {mode} hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Installs a seccomp filter that makes syscall `nr` fail with EPERM, on
/// every thread of the process (TSYNC).
#[cfg(target_arch = "x86_64")]
fn refuse_syscall(nr: u32) {
    fail_syscall(nr, libc::EPERM)
}

/// Installs a seccomp filter that makes syscall `nr` fail with `errno`, on
/// every thread of the process (TSYNC): a device error on demand.
#[cfg(target_arch = "x86_64")]
fn fail_syscall(nr: u32, errno: i32) {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let prog = [
        // if arch != x86_64: allow
        SockFilter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 4,
        },
        SockFilter {
            code: JEQ_K,
            jt: 0,
            jf: 3,
            k: AUDIT_ARCH_X86_64,
        },
        // if nr == `nr`: errno
        SockFilter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        SockFilter {
            code: JEQ_K,
            jt: 0,
            jf: 1,
            k: nr,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: RET_ERRNO | errno as u32,
        },
        SockFilter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: RET_ALLOW,
        },
    ];
    let fprog = SockFprog {
        len: prog.len() as u16,
        filter: prog.as_ptr(),
    };
    // SAFETY: plain prctl/seccomp calls; fprog and prog outlive them, and
    // the kernel copies the program.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0, "no_new_privs");
        let r = libc::syscall(
            libc::SYS_seccomp,
            1, /* SET_MODE_FILTER */
            1, /* TSYNC */
            &fprog as *const SockFprog,
        );
        assert_eq!(r, 0, "seccomp: {}", std::io::Error::last_os_error());
    }
}

/// In a child process with syscall `nr` refused (seccomp), `auto` falls
/// back to threads at open and serves the same epoch as io_uring does here,
/// and `uring` fails at open: returns the child's `uring` error and how long
/// it took. `name` is the calling test (the child runs only it) and `mode`
/// its tag for the child.
#[cfg(target_arch = "x86_64")]
fn refused_syscall_falls_back_to_threads(name: &str, mode: &str, nr: u32) -> (String, u64) {
    let c = config(Memory::Percent(20.0), 0, 1, 1 << 20);
    if let Ok(v) = std::env::var(CHILD) {
        let dir = v.strip_prefix(&format!("{mode}:")).expect("mode");
        refuse_syscall(nr);
        let ds = Arc::new(Dataset::open(dir).expect("open"));
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("auto falls back");
        let ids = epoch(&mut l, &ds);
        let m = l.metrics();
        println!("REFUSED={} THREADS={}", m.uring_refused, m.threads_backend);
        println!("ORDER={ids:?}");
        let mut u = c.clone();
        u.io.backend = IoBackend::Uring;
        let start = Instant::now();
        let err = Loader::open(ds, &u, LoaderState::default())
            .err()
            .expect("uring must fail");
        println!("URING-ERR={err}");
        println!("URING-FAILED-AFTER-MS={}", start.elapsed().as_millis());
        std::process::exit(0);
    }
    assert_eq!(c.io.io_timeout, Duration::from_secs(60));
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 200);
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let want = epoch(&mut l, &ds);
    assert!(!l.metrics().threads_backend, "io_uring works in this process");
    drop(l);
    let (ok, out) = run_child(name, mode, ds.dir());
    assert!(ok, "child failed:\n{out}");
    assert!(out.contains("REFUSED=true THREADS=true"), "{out}");
    assert!(
        out.contains(&format!("ORDER={want:?}")),
        "same order and bytes as io_uring:\n{out}"
    );
    let line = |key: &str| out.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string);
    let err = line("URING-ERR=").unwrap_or_else(|| panic!("no uring error:\n{out}"));
    let ms = line("URING-FAILED-AFTER-MS=")
        .and_then(|ms| ms.trim().parse().ok())
        .unwrap_or_else(|| panic!("the child says how long uring took to fail:\n{out}"));
    (err, ms)
}

/// io_uring_setup (425) refused, as under Docker's default profile.
#[cfg(target_arch = "x86_64")]
#[test]
fn io_uring_refused_by_seccomp_falls_back_to_threads_with_the_same_epoch() {
    let (err, _) = refused_syscall_falls_back_to_threads(
        "io_uring_refused_by_seccomp_falls_back_to_threads_with_the_same_epoch",
        "refuse-setup",
        425,
    );
    assert!(err.starts_with("<io_uring>"), "{err}");
}

/// pread64 on x86_64.
#[cfg(target_arch = "x86_64")]
const SYS_PREAD64: u32 = 17;

#[cfg(target_arch = "x86_64")]
#[test]
fn device_errors_are_io_errors_naming_the_file_and_transient_ones_end() {
    const NAME: &str = "device_errors_are_io_errors_naming_the_file_and_transient_ones_end";
    let mut c = config(Memory::Percent(20.0), 0, 1, 1 << 20);
    c.io.backend = IoBackend::Threads;
    c.io.read_gap = ReadGapSetting::Bytes(0);
    if let Ok(v) = std::env::var(CHILD) {
        let (mode, dir) = v.split_once(':').expect("mode:dir");
        let errno = match mode {
            "eio" => libc::EIO,
            "enomem" => libc::ENOMEM,
            "eagain" => libc::EAGAIN,
            _ => libc::EINTR,
        };
        let ds = Arc::new(Dataset::open(dir).expect("open"));
        let mut l = Loader::open(ds, &c, LoaderState::default()).expect("loader");
        // From now on every pread fails: the device is gone (or forever busy).
        fail_syscall(SYS_PREAD64, errno);
        let start = Instant::now();
        let err = l.next_batch().expect_err("no batch can be read");
        let kind = match &err {
            brand_format::Error::Io { .. } => "io",
            brand_format::Error::Corrupt { .. } => "corrupt",
            _ => "other",
        };
        println!("KIND={kind} ERR={err} after {:?}", start.elapsed());
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 100);
    for mode in ["eio", "enomem", "eagain", "eintr"] {
        let (ok, out) = run_child(NAME, mode, ds.dir());
        assert!(ok, "{mode}: child failed:\n{out}");
        // Not data corruption: an I/O error naming the segment and the offset.
        assert!(out.contains("KIND=io ERR="), "{mode}:\n{out}");
        assert!(
            out.contains("data-00000.brd") && out.contains("at byte"),
            "{mode}:\n{out}"
        );
        assert!(!out.contains("crc32c"), "{mode}:\n{out}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_ring_whose_submissions_are_refused_is_an_error_not_a_hang() {
    const NAME: &str = "a_ring_whose_submissions_are_refused_is_an_error_not_a_hang";
    let mut c = config(Memory::Percent(20.0), 0, 1, 1 << 20);
    c.io.backend = IoBackend::Uring;
    c.io.io_timeout = Duration::from_secs(2);
    if let Ok(v) = std::env::var(CHILD) {
        let dir = v.strip_prefix("refuse-enter:").expect("mode");
        let ds = Arc::new(Dataset::open(dir).expect("open"));
        let mut l = Loader::open(ds, &c, LoaderState::default()).expect("loader");
        // From now on io_uring_enter (426) fails.
        refuse_syscall(426);
        let start = Instant::now();
        let err = l.next_batch().expect_err("no batch can be read");
        println!("ERR={err} after {:?}", start.elapsed());
        let start = Instant::now();
        drop(l);
        println!("DROPPED in {:?}", start.elapsed());
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 100);
    let (ok, out) = run_child(NAME, "refuse-enter", ds.dir());
    assert!(ok, "child failed:\n{out}");
    assert!(out.contains("ERR=") && out.contains("DROPPED"), "{out}");
}

#[test]
fn a_state_saved_after_the_last_batch_restores_on_every_rank() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 230);
    let world = 3;
    for rank in 0..world {
        let c = config(Memory::Percent(15.0), rank, world, 1 << 20);
        let mut full = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        let e0 = epoch(&mut full, &ds);
        let e1 = epoch(&mut full, &ds);
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        let mut served = 0;
        while served < e0.len() {
            served += l.next_batch().expect("batch").expect("not yet the end").len();
        }
        // After the last batch, before the end of the epoch is seen.
        let state = l.state();
        assert_eq!(
            state,
            LoaderState {
                epoch: 0,
                served: e0.len() as u64
            }
        );
        drop(l);
        let mut resumed = Loader::open(ds.clone(), &c, state).expect("resume");
        assert!(resumed.next_batch().expect("end of epoch 0").is_none(), "rank {rank}");
        assert_eq!(epoch(&mut resumed, &ds), e1, "rank {rank}: epoch 1 as uninterrupted");
    }
}

#[test]
fn start_epoch_after_an_error_reads_a_fitting_dataset_in_whole_reads() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 200);
    let mut c = config(Memory::Percent(100.0), 0, 1, 1 << 20);
    c.io.read_gap = ReadGapSetting::Whole;
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    for _ in 0..3 {
        l.next_batch().expect("batch");
    }
    // Whatever stopped epoch 0 (an error, a restart), the caller starts over.
    l.start_epoch(1).expect("start epoch 1");
    l.reset_metrics();
    let ids = epoch(&mut l, &ds);
    assert!(exactly_once(&ids, 200));
    let m = l.metrics();
    assert_eq!(
        m.recovery_reads, 0,
        "memory was emptied: the plan must read it again whole"
    );
    assert!(m.reads_issued <= ds.index.chunk_count(), "{m:?}");
}

/// A dataset whose sample `victim` has a flipped bit, and the order a clean
/// loader serves.
fn corrupt_one(root: &Path, c: &LoaderConfig, victim_at: f64) -> (Arc<Dataset>, Vec<u64>, u64) {
    let ds = dataset(root, 240);
    let mut l = Loader::open(ds.clone(), c, LoaderState::default()).expect("loader");
    let order = epoch(&mut l, &ds);
    drop(l);
    let victim = order[(order.len() as f64 * victim_at) as usize];
    let (seg, offset, len) = ds.index.record_location(victim);
    let path = ds.segment_path(seg);
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[(offset + len as u64 / 2) as usize] ^= 0x40;
    std::fs::write(&path, bytes).expect("write");
    (ds, order, victim)
}

#[test]
fn a_corrupt_record_fails_exactly_when_its_sample_is_due() {
    let t = tempfile::tempdir().expect("tempdir");
    // Read-ahead covers the whole dataset: the bad read completes long
    // before its sample is due.
    let c = config(Memory::Percent(10.0), 0, 1, 64 << 20);
    let (ds, order, victim) = corrupt_one(t.path(), &c, 0.7);
    let at = order.iter().position(|&s| s == victim).expect("victim served");
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let mut got = Vec::new();
    let err = loop {
        match l.next_batch() {
            Ok(Some(b)) => got.extend(b.iter().map(|s| s.id)),
            Ok(None) => panic!("the corrupt sample went unnoticed"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        err.contains(&format!("sample {victim}")) && err.contains("crc32c"),
        "{err}"
    );
    // Every batch before the one holding the victim, and nothing else.
    let batch_start = at / 8 * 8;
    assert_eq!(got, order[..batch_start], "served up to the victim's batch");
    assert_eq!(l.state().served, batch_start as u64);
}

#[test]
fn on_corrupt_skip_leaves_the_sample_out_and_counts_it() {
    let t = tempfile::tempdir().expect("tempdir");
    let mut c = config(Memory::Percent(10.0), 0, 1, 1 << 20);
    c.on_corrupt = OnCorrupt::Skip;
    let (ds, order, victim) = corrupt_one(t.path(), &c, 0.4);
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let got = epoch(&mut l, &ds);
    let want: Vec<u64> = order.iter().copied().filter(|&s| s != victim).collect();
    assert_eq!(got, want, "every good sample once, in order");
    assert_eq!(l.metrics().skipped_corrupt, 1);
    assert_eq!(l.metrics().samples_served, 239);
}

#[test]
fn a_fifo_segment_is_refused_with_a_clear_error() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 50);
    let seg = ds.segment_path(0);
    std::fs::remove_file(&seg).expect("rm");
    let cpath = std::ffi::CString::new(seg.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    for backend in [IoBackend::Uring, IoBackend::Threads] {
        let (tx, rx) = std::sync::mpsc::channel();
        let ds2 = ds.clone();
        let mut c = config(Memory::Percent(50.0), 0, 1, 1 << 20);
        c.io.backend = backend;
        std::thread::spawn(move || {
            let r = Loader::open(ds2, &c, LoaderState::default()).and_then(|mut l| l.next_batch().map(|_| ()));
            let _ = tx.send(r.err().map(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a FIFO must not block")
            .expect("a FIFO must be refused");
        assert!(err.contains("data-00000.brd") && err.contains("FIFO"), "{err}");
        assert!(!err.contains("O_DIRECT"), "{err}");
    }
}

#[test]
fn a_loader_used_after_fork_fails_fast() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 80);
    let c = config(Memory::Percent(50.0), 0, 1, 1 << 20);
    let mut l = Loader::open(ds, &c, LoaderState::default()).expect("loader");
    l.next_batch().expect("batch in the parent");
    // SAFETY: the child only calls the loader (which must fail without
    // touching its threads' locks), drops it and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = match l.next_batch() {
            Err(e) if e.to_string().contains("fork") => 0,
            _ => 1,
        };
        drop(l);
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
        if start.elapsed() > Duration::from_secs(30) {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status}"
    );
    // The parent's loader is unaffected.
    assert!(l.next_batch().is_ok());
}

#[test]
fn registered_buffers_are_bounded_by_readahead_and_the_dataset() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 100);
    let data: u64 = ds.manifest.segments.iter().map(|s| s.bytes).sum();
    let mut c = config(Memory::Percent(50.0), 0, 1, 64 << 20);
    c.io.queue_depth = 1024;
    c.io.backend = IoBackend::Uring;
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    assert!(exactly_once(&epoch(&mut l, &ds), 100));
    let m = l.metrics();
    let one = brand_io::engine::FIXED_BUF_BYTES as u64;
    assert!(
        m.registered_buffer_bytes <= data.max(one),
        "{} registered for a {data}-byte dataset",
        m.registered_buffer_bytes
    );
}

#[test]
fn a_truncated_segment_names_its_real_end() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 200);
    let seg = ds.segment_path(0);
    let len = std::fs::metadata(&seg).expect("stat").len();
    let cut = len / 2 / 4096 * 4096 + 100;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open")
        .set_len(cut)
        .expect("truncate");
    let mut c = config(Memory::Percent(20.0), 0, 1, 1 << 20);
    c.plan.policy = Policy::Sequential;
    let mut l = Loader::open(ds, &c, LoaderState::default()).expect("loader");
    let err = loop {
        match l.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a truncated segment went unnoticed"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(err.contains(&format!("segment ends at byte {cut}")), "{err}");
}

fn zstd_dataset(root: &Path, samples: u64, ratio: u32) -> Arc<Dataset> {
    let g = GenOptions {
        samples,
        mean_bytes: 16_000,
        min_bytes: 1000,
        max_bytes: 64_000,
        classes: 4,
        compressible: Some(ratio),
        ..Default::default()
    };
    let p = PackOptions {
        chunk_size: 16,
        zstd: Some(3),
        ..Default::default()
    };
    Arc::new(Dataset::open(generate_and_pack(root, &g, &p).expect("pack")).expect("open"))
}

#[test]
fn memory_bounds_decoded_bytes_of_a_compressed_dataset() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = zstd_dataset(t.path(), 600, 4);
    let stored: u64 = ds.index.stored_len.iter().map(|&l| l as u64).sum();
    let raw: u64 = ds.index.raw_len.iter().map(|&l| l as u64).sum();
    assert!(raw > 3 * stored, "compressible: {raw} raw vs {stored} stored");
    let (memory, readahead) = (raw / 10, 256 << 10);
    let c = config(Memory::Bytes(memory), 0, 1, readahead);
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    for _ in 0..2 {
        l.reset_metrics();
        assert!(exactly_once(&epoch(&mut l, &ds), 600));
        let m = l.metrics();
        // One chunk of decoded samples may be in flight beyond the bound
        // (a read is always allowed).
        let slack = 16 * 64_000;
        assert!(
            m.peak_resident_bytes <= memory + readahead + slack,
            "peak {} decoded bytes > memory {memory} + readahead {readahead}",
            m.peak_resident_bytes
        );
        assert!(m.peak_readahead_bytes <= readahead + slack, "{m:?}");
    }
}

/// A consumer that computes on each batch lets read-ahead fill memory; what
/// it may fill is the memory bound plus `readahead`, less the buffers
/// registered with the ring, which count as held.
#[test]
fn read_ahead_fills_memory_less_the_registered_buffers() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 600);
    let readahead = 2 << 20;
    let mut c = config(Memory::Percent(50.0), 0, 1, readahead);
    c.io.backend = IoBackend::Uring;
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let memory = l.memory_bound().expect("a plan's loader has a bound");
    let mut ids = Vec::new();
    while let Some(b) = l.next_batch().expect("batch") {
        ids.extend(b.iter().map(|s| s.id));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(exactly_once(&ids, 600));
    let m = l.metrics();
    assert!(m.registered_buffer_bytes > 0, "{m:?}");
    // A read is issued while below the bound: it may overshoot by one.
    let one_read = brand_io::engine::FIXED_BUF_BYTES as u64;
    assert!(
        m.peak_resident_bytes + m.registered_buffer_bytes <= memory + readahead + one_read,
        "{m:?}, memory {memory}"
    );
    // And read-ahead did fill it: more than the plan alone holds.
    assert!(m.peak_resident_bytes > memory, "{m:?}, memory {memory}");
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("rss");
    pages * 4096
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fds").count()
}

#[test]
fn soak_hundreds_of_epochs_stay_exact_and_flat() {
    let t = tempfile::tempdir().expect("tempdir");
    let g = GenOptions {
        samples: 96,
        mean_bytes: 2000,
        min_bytes: 10,
        max_bytes: 8000,
        classes: 2,
        ..Default::default()
    };
    let p = PackOptions {
        chunk_size: 8,
        ..Default::default()
    };
    let ds = Arc::new(Dataset::open(generate_and_pack(t.path(), &g, &p).expect("pack")).expect("open"));
    let mut c = config(Memory::Percent(25.0), 0, 1, 64 << 10);
    c.batch_size = 7;
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let (mut rss_warm, mut fds_warm) = (0, 0);
    for e in 0..400u64 {
        let mut ids = Vec::new();
        while let Some(b) = l.next_batch().expect("batch") {
            assert_eq!(b.epoch, e);
            ids.extend(b.iter().map(|s| s.id));
        }
        assert!(exactly_once(&ids, 96), "epoch {e}");
        l.reset_metrics();
        if e == 50 {
            (rss_warm, fds_warm) = (rss_bytes(), open_fds());
        }
    }
    let (rss, fds) = (rss_bytes(), open_fds());
    // Other tests run in this process too: allow their noise, not a leak
    // per epoch.
    assert!(rss < rss_warm + (32 << 20), "RSS grew from {rss_warm} to {rss}");
    assert!(fds <= fds_warm + 16, "fds grew from {fds_warm} to {fds}");
    assert_eq!(l.state(), LoaderState { epoch: 400, served: 0 });
}

#[test]
fn the_memory_bound_is_the_plans_resident_bound_in_decoded_bytes() {
    let t = tempfile::tempdir().expect("tempdir");
    // 40 samples in chunks of 16: 1 % is less than one sample, which the
    // plan rounds up to one chunk (16 slots).
    let ds = zstd_dataset(t.path(), 40, 4);
    let raw: u64 = ds.index.raw_len.iter().map(|&l| l as u64).sum();
    let one_chunk = (16 * raw).div_ceil(40);
    for (memory, slots) in [
        (Memory::Percent(1.0), 16),
        (Memory::Slots(20), 20),
        (Memory::Bytes(raw / 2 + 1), 20),
        (Memory::Percent(400.0), 40),
    ] {
        let c = config(memory, 0, 1, 0);
        let planner = brand_plan::Planner::new(&ds.index, &c.plan).expect("plan");
        assert_eq!(planner.geometry().rank_slots.min(40), slots, "{memory}");
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        assert_eq!(l.memory_bound(), Some((slots * raw).div_ceil(40)), "{memory}");
        assert!(exactly_once(&epoch(&mut l, &ds), 40), "{memory}");
    }
    // What a percentage below one chunk used to give: its share of the
    // bytes, a tenth of a sample, far below the chunk the plan holds.
    let c = config(Memory::Percent(1.0), 0, 1, 0);
    let l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    assert!(l.memory_bound() == Some(one_chunk) && one_chunk > raw / 100 * 10);
}

#[test]
fn the_next_epochs_first_reads_are_issued_before_this_epoch_ends() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path(), 320);
    // Across the boundary the next epoch's reads are held by the byte
    // bound and by the bytes of reads in flight (`readahead`, here a third
    // of what the first batch reads), not by the bytes read ahead: a
    // consumer that computes on each batch gives the reads time to land,
    // and the room the epoch's tail frees takes the next epoch's first batch.
    let mut c = config(Memory::Percent(25.0), 0, 1, 0);
    c.batch_size = 16;
    let planner = brand_plan::Planner::new(&ds.index, &c.plan).expect("plan");
    let mut plan = planner;
    let read_of = |ev: &brand_plan::Event| match *ev {
        brand_plan::Event::Read { chunk, mask } => {
            let e = brand_format::extents::extents(&ds.index, chunk, mask, brand_format::extents::ReadGap::Bytes(0));
            (e.len() as u64, e.iter().map(|e| e.len).sum::<u64>())
        }
        _ => (0, 0),
    };
    let extents_of = |ev: &brand_plan::Event| read_of(ev).0;
    // The largest plan read of both epochs: the overshoot of one read.
    let largest_read = [0, 1]
        .iter()
        .flat_map(|&e| plan.epoch(e).map(|ev| read_of(&ev).1).collect::<Vec<_>>())
        .max()
        .unwrap_or(0);
    let epoch0: u64 = plan.epoch(0).map(|ev| extents_of(&ev)).sum();
    // Epoch 1's reads up to its first batch's last serve, and their bytes.
    let (mut serves, mut first_batch, mut first_bytes, mut first_read) = (0, 0, 0u64, 0u64);
    for ev in plan.epoch(1) {
        first_batch += extents_of(&ev);
        first_read += read_of(&ev).1;
        if let brand_plan::Event::Read { chunk, mask } = ev {
            for j in (0..16).filter(|j| mask & (1 << j) != 0) {
                first_bytes += ds.index.raw_len[(chunk * 16 + j) as usize] as u64;
            }
        }
        if matches!(ev, brand_plan::Event::Serve { .. }) {
            serves += 1;
            if serves == 16 {
                break;
            }
        }
    }
    c.readahead_bytes = first_read / 3;
    assert!(
        first_read > c.readahead_bytes + largest_read,
        "the first batch reads {first_read} bytes"
    );
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let memory = l.memory_bound().expect("a plan's loader has a bound");
    assert!(first_batch > 1, "the first batch needs several reads: {first_batch}");
    assert!(
        first_bytes < memory,
        "the first batch's {first_bytes} bytes fit memory {memory}"
    );
    let mut served = 0;
    while served < 320 {
        let b = l.next_batch().expect("batch").expect("epoch 0 is not over");
        served += b.len();
        // A training step: time for the reads in flight to land.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(l.next_batch().expect("end").is_none());
    // Epoch 0 is over and epoch 1's first batch not asked for yet: its
    // reads are issued already, in the memory epoch 0 has freed.
    let issued = l.metrics().reads_issued;
    assert!(
        issued >= epoch0 + first_batch,
        "{issued} reads issued at the end of epoch 0: {epoch0} of epoch 0 + {first_batch} for epoch 1's first batch expected"
    );
    let mut ids = epoch(&mut l, &ds);
    ids.sort_unstable();
    assert_eq!(ids, (0..320).collect::<Vec<u64>>());
    let m = l.metrics();
    assert!(m.peak_readahead_bytes <= c.readahead_bytes + largest_read, "{m:?}");
}

/// io_uring_setup allowed but io_uring_enter (426) refused, from the start:
/// the engine finds out when it starts, not at the first read's
/// io_timeout. `auto` falls back to threads at open (same epoch as
/// io_uring); `uring` fails at once, naming io_uring_enter.
#[cfg(target_arch = "x86_64")]
#[test]
fn io_uring_enter_refused_alone_falls_back_or_fails_at_open() {
    let (err, ms) = refused_syscall_falls_back_to_threads(
        "io_uring_enter_refused_alone_falls_back_or_fails_at_open",
        "refuse-enter-only",
        426,
    );
    assert!(err.starts_with("<io_uring>: io_uring_enter"), "{err}");
    assert!(ms < 5_000, "uring failed after {ms} ms, not at open");
}

/// Reads in flight stop at two batches' worth (at least 512), whatever the
/// bytes `readahead` allows: 2,000 records of one block each, read one by
/// one (`direct`, gap 0) with 64 MiB of readahead and the whole dataset as
/// memory, never have more than that many blocks in flight; a batch of
/// 1,024 allows 2,048; every sample still comes once.
#[test]
fn reads_in_flight_stop_at_two_batches_whatever_the_bytes() {
    let t = tempfile::tempdir().expect("tempdir");
    let options = GenOptions {
        samples: 2000,
        mean_bytes: 1000,
        min_bytes: 1000,
        max_bytes: 1000,
        ..GenOptions::default()
    };
    let pack = PackOptions {
        chunk_size: 16,
        ..PackOptions::default()
    };
    let ds = Arc::new(Dataset::open(generate_and_pack(t.path(), &options, &pack).expect("pack")).expect("open"));
    let block = brand_format::ALIGN;
    for (batch_size, reads) in [(8usize, 512u64), (1024, 2048)] {
        let mut c = config(Memory::Percent(100.0), 0, 1, 64 << 20);
        c.plan.policy = Policy::Direct;
        c.batch_size = batch_size;
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        let ids = epoch(&mut l, &ds);
        assert!(exactly_once(&ids, 2000));
        let m = l.metrics();
        assert_eq!(m.reads_issued, 2000, "one read per record: {m:?}");
        assert!(
            m.peak_readahead_bytes <= reads * block,
            "batch {batch_size}: {} blocks in flight at the peak, {reads} allowed",
            m.peak_readahead_bytes / block
        );
        assert!(
            m.peak_readahead_bytes >= reads * block / 2,
            "batch {batch_size}: read-ahead still runs far ahead: {} blocks at the peak",
            m.peak_readahead_bytes / block
        );
    }
}
