//! Running the real `brand` binary from the end-to-end tests.

#![allow(dead_code)] // each test file uses some of it

use std::path::Path;
use std::process::{Command, Output};

#[allow(unused_imports)] // not every test binary starts nodes or writes tars
pub use brand_testkit::{addresses, ustar};

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
