//! Running the real `brand` binary from the end-to-end tests.

#![allow(dead_code)] // each test file uses some of it

use std::path::Path;
use std::process::{Command, Output};

/// Runs `brand args…` to completion (no backtraces: errors are compared).
pub fn brand(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_brand"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the brand binary")
}

/// Runs a command that must succeed.
pub fn ok(args: &[&str]) -> Output {
    let out = brand(args);
    assert!(
        out.status.success(),
        "brand {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command that must fail cleanly: exit 1 and one `brand: error:`
/// line (warnings may come before it), never a panic or an abort. Returns
/// stderr.
pub fn fails(args: &[&str]) -> String {
    let out = brand(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "brand {args:?}: {err}");
    assert!(!err.contains("panicked"), "brand {args:?}: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("brand: error:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {err}");
    err
}

/// Runs `brand gen dir` (which must succeed): `samples` samples of
/// `min-kib 1..=max_kib` KiB, `mean_kib` KiB on average, in `classes`
/// classes, from `seed`.
pub fn gen_samples_with(dir: &Path, samples: u64, mean_kib: &str, max_kib: &str, classes: &str, seed: u64) {
    ok(&[
        "gen",
        s(dir),
        "--samples",
        &samples.to_string(),
        "--mean-kib",
        mean_kib,
        "--min-kib",
        "1",
        "--max-kib",
        max_kib,
        "--classes",
        classes,
        "--seed",
        &seed.to_string(),
    ]);
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Hidden entries of `parent` (a pack's temporary directories): nothing
/// but the datasets a test expects may be left.
pub fn hidden_entries(parent: &Path) -> Vec<String> {
    std::fs::read_dir(parent)
        .expect("read parent")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// Loopback addresses free now and never handed out before in this test
/// process: tests run in parallel, and a port one test was given and let go
/// can come back from the kernel to another test's node, which would then
/// answer the first test's hellos.
pub fn addresses(n: usize) -> Vec<String> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = Vec::new(); // bound until all n are chosen: distinct within the call
    let mut out = Vec::new();
    while out.len() < n {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        if !handed_out.contains(&addr.port()) {
            handed_out.push(addr.port());
            out.push(addr.to_string());
        }
        held.push(l);
    }
    out
}

/// A ustar archive of `(name, bytes)` members, with its end blocks.
pub fn ustar<N: AsRef<str>, B: AsRef<[u8]>>(members: &[(N, B)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in members {
        let (name, bytes) = (name.as_ref(), bytes.as_ref());
        let mut block = [0u8; 512];
        block[..name.len()].copy_from_slice(name.as_bytes());
        block[124..136].copy_from_slice(format!("{:011o}\0", bytes.len()).as_bytes());
        block[156] = b'0';
        block[257..263].copy_from_slice(b"ustar\0");
        block[148..156].fill(b' ');
        let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
        block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend(block);
        out.extend_from_slice(bytes);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.extend([0; 1024]);
    out
}
