//! `brand cache` with `brand read --cache` jobs as processes: three jobs
//! exactly once per epoch, one SIGKILLed mid-epoch and one joining late;
//! the cache stopped by SIGTERM (its jobs name why, the socket goes, no
//! shared memory stays) and SIGKILLed (its jobs fail, a new cache takes
//! over the stale socket).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brand_import::synthetic::small_dataset;

const SAMPLES: u64 = 900;

fn brand() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brand"))
}

fn cache(ds: &Path, socket: &Path) -> Child {
    cache_with(ds, socket, &["--read-gap", "whole"])
}

fn cache_with(ds: &Path, socket: &Path, args: &[&str]) -> Child {
    let c = brand()
        .arg("cache")
        .arg(ds)
        .args(["--memory", "25%", "--json", "--socket"])
        .arg(socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn brand cache");
    let start = Instant::now();
    // Listening: a connection is accepted (and, without a hello, dropped).
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "the cache did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    c
}

fn job(ds: &Path, socket: &Path, seed: u64, epochs: u64, compute_ms: u32) -> Child {
    brand()
        .arg("read")
        .arg(ds)
        .args(["--batch", "10", "--json", "--seed", &seed.to_string()])
        .args(["--epochs", &epochs.to_string(), "--compute-ms", &compute_ms.to_string()])
        .arg("--cache")
        .arg(socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn brand read")
}

/// Waits for `child` up to `limit` (then kills it): success, stdout, stderr.
fn finish(mut child: Child, limit: Duration) -> (bool, String, String) {
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every epoch of a `brand read --json` report served each sample once.
fn each_epoch_once(report: &str, epochs: usize) {
    let r: serde_json::Value = serde_json::from_str(report).expect("json report");
    let list = r.as_array().expect("epochs");
    assert_eq!(list.len(), epochs, "{report}");
    for e in list {
        assert_eq!(e["samples"], SAMPLES, "{e}");
        assert_eq!(e["exactly_once"], true, "{e}");
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

fn shared_memory_of_brand() -> Vec<PathBuf> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().contains("brand-cache"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn jobs_share_a_cache_and_survive_a_job_killed_and_one_joining() {
    let t = tempfile::tempdir().expect("tmp");
    let ds = small_dataset(t.path(), SAMPLES).expect("pack");
    let socket = t.path().join("cache.sock");
    let c = cache(&ds, &socket);
    let a = job(&ds, &socket, 1, 2, 3);
    let b = job(&ds, &socket, 2, 2, 3);
    let victim = job(&ds, &socket, 3, 2, 3);
    std::thread::sleep(Duration::from_millis(400));
    signal(&victim, libc::SIGKILL);
    let (ok, _, _) = finish(victim, Duration::from_secs(10));
    assert!(!ok, "killed");
    let late = job(&ds, &socket, 4, 1, 0);
    for (name, j, epochs) in [("a", a, 2), ("b", b, 2), ("late", late, 1)] {
        let (ok, out, err) = finish(j, Duration::from_secs(60));
        assert!(ok, "job {name}: {err}");
        each_epoch_once(&out, epochs);
    }
    signal(&c, libc::SIGINT);
    let (ok, out, err) = finish(c, Duration::from_secs(20));
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("cache report");
    assert_eq!(r["jobs_attached"], 4, "{out}");
    assert_eq!(r["jobs_now"], 0, "{out}");
}

/// `--run-length auto` resolves from the read gap as a loader alone does:
/// runs where a request costs more than a sample's bytes, 1 where it does not.
#[test]
fn the_cache_resolves_run_length_auto_from_the_read_gap() {
    let t = tempfile::tempdir().expect("tmp");
    let ds = small_dataset(t.path(), SAMPLES).expect("pack");
    for (gap, runs) in [("256KiB", "more than 1"), ("0", "1")] {
        let socket = t.path().join(format!("cache-{gap}.sock"));
        let c = cache_with(&ds, &socket, &["--run-length", "auto", "--read-gap", gap]);
        let (ok, out, err) = finish(job(&ds, &socket, 1, 1, 0), Duration::from_secs(60));
        assert!(ok, "gap {gap}: {err}");
        each_epoch_once(&out, 1);
        signal(&c, libc::SIGINT);
        let (ok, out, err) = finish(c, Duration::from_secs(20));
        assert!(ok, "{err}");
        let r: serde_json::Value = serde_json::from_str(&out).expect("cache report");
        let got = r["run_length"].as_u64().expect("run_length in the report");
        assert_eq!(if got > 1 { "more than 1" } else { "1" }, runs, "gap {gap}: {out}");
    }
}

#[test]
fn a_stopped_or_killed_cache_fails_its_jobs_and_a_new_one_takes_the_path() {
    let t = tempfile::tempdir().expect("tmp");
    let ds = small_dataset(t.path(), SAMPLES).expect("pack");
    let socket = t.path().join("cache.sock");

    let c = cache(&ds, &socket);
    let long = job(&ds, &socket, 1, 1000, 5);
    std::thread::sleep(Duration::from_millis(300));
    signal(&c, libc::SIGTERM);
    let (ok, _, err) = finish(c, Duration::from_secs(20));
    assert!(ok, "the cache stops cleanly on SIGTERM: {err}");
    let (ok, _, err) = finish(long, Duration::from_secs(20));
    assert!(
        !ok && err.contains("stopped: SIGTERM") && err.contains("cache.sock"),
        "{err}"
    );
    assert!(!socket.exists(), "the socket is removed");
    assert!(shared_memory_of_brand().is_empty(), "nothing in /dev/shm");

    let c = cache(&ds, &socket);
    let long = job(&ds, &socket, 2, 1000, 5);
    std::thread::sleep(Duration::from_millis(300));
    signal(&c, libc::SIGKILL);
    let _ = finish(c, Duration::from_secs(10));
    let (ok, _, err) = finish(long, Duration::from_secs(20));
    assert!(!ok && err.contains("cache.sock") && err.contains("cache"), "{err}");
    assert!(socket.exists(), "a killed cache leaves its socket");

    let c = cache(&ds, &socket);
    let (ok, out, err) = finish(job(&ds, &socket, 3, 1, 0), Duration::from_secs(60));
    assert!(ok, "a new cache on the stale path serves: {err}");
    each_epoch_once(&out, 1);
    signal(&c, libc::SIGTERM);
    assert!(finish(c, Duration::from_secs(20)).0);
    assert!(shared_memory_of_brand().is_empty(), "nothing in /dev/shm");
}
