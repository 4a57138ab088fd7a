//! The multi-node lifecycle through the C ABI, as a C program sees it:
//! three nodes opened with `brand_open` at the same moment all serve their
//! epoch; all closing (`brand_close`) after k batches close cleanly and
//! promptly; a node process killed mid-epoch is named by both survivors'
//! `brand_last_error` within `peer_timeout`, whether they close or end
//! their processes on the error. Loopback only; bounded runs.
//!
//! Each node of the killed-node tests is this test binary run again as a
//! child (the ignored test `killed_node_child`, selected by its exact name):
//! a real process using the C ABI; the victim is SIGKILLed after it served
//! some batches.

use std::ffi::{CStr, CString};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use brand::brand_status::*;
use brand::*;

mod common;
use common::{addresses, last_error, node_config, take};

const SAMPLES: u64 = 240;
const TIMEOUT_SECS: u64 = 4;

fn dataset(root: &std::path::Path) -> CString {
    let dir = brand_import::synthetic::small_dataset(root, SAMPLES).expect("gen and pack");
    CString::new(dir.to_str().expect("utf-8")).expect("no NUL")
}

fn config(nodes: &[String], rank: usize) -> CString {
    node_config(nodes, rank, "capi-lifecycle", TIMEOUT_SECS)
}

/// Opens a node; the error text on failure.
fn open(path: &CStr, cfg: &CStr) -> Result<*mut brand_loader, String> {
    let mut l = null_mut();
    match brand_open(path.as_ptr(), cfg.as_ptr(), &mut l) {
        BRAND_OK => Ok(l),
        st => Err(format!("brand_open: {st:?}: {}", last_error())),
    }
}

fn close(mut l: *mut brand_loader) -> Result<(), String> {
    match brand_close(&mut l) {
        BRAND_OK => Ok(()),
        st => Err(format!("brand_close: {st:?}: {}", last_error())),
    }
}

/// Three nodes opened together (a barrier, then a small stagger) each take
/// up to `batches` batches and close; the failures, one per rank.
fn three_nodes(path: &CString, batches: usize, stagger_ms: [u64; 3]) -> Vec<String> {
    let nodes = addresses(3);
    let go = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let (path, cfg, go) = (path.clone(), config(&nodes, rank), go.clone());
            std::thread::spawn(move || -> Result<(), String> {
                go.wait();
                std::thread::sleep(Duration::from_millis(stagger_ms[rank]));
                let l = open(&path, &cfg)?;
                let (samples, ended) = take(l, batches)?;
                let closing = Instant::now();
                close(l)?;
                // 80 samples per rank in batches of 7: 12 batches.
                let want = (batches as u64).saturating_mul(7).min(SAMPLES / 3);
                if samples != want || ended != (batches > 12) {
                    return Err(format!("served {samples} (ended {ended}), not {want}"));
                }
                if closing.elapsed() >= Duration::from_secs(TIMEOUT_SECS) {
                    return Err(format!("brand_close took {:?}", closing.elapsed()));
                }
                Ok(())
            })
        })
        .collect();
    threads
        .into_iter()
        .enumerate()
        .filter_map(|(r, t)| match t.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("rank {r}: {e}")),
            Err(_) => Some(format!("rank {r}: panicked")),
        })
        .collect()
}

#[test]
fn three_c_abi_nodes_started_at_once_serve_their_epoch() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = dataset(t.path());
    let mut failed = Vec::new();
    for run in 0..12u64 {
        let stagger = [run * 7 % 40, run * 13 % 40, run * 29 % 40];
        let errors = three_nodes(&path, usize::MAX, stagger);
        if !errors.is_empty() {
            failed.push(format!("run {run}: {}", errors.join("; ")));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 12 runs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn three_c_abi_nodes_all_closing_after_k_batches_close_cleanly() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = dataset(t.path());
    let mut failed = Vec::new();
    // From closing right after opening to past the epoch's 12 batches.
    for k in [0usize, 1, 2, 5, 8, 11, 12, 13] {
        let errors = three_nodes(&path, k, [0, 10, 20]);
        if !errors.is_empty() {
            failed.push(format!("k {k}: {}", errors.join("; ")));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A node of the killed-node tests, as a process of its own: serves epochs
/// through the C ABI, printing a line per batch, until killed (the victim)
/// or until a batch fails (a survivor: it prints the error, then closes,
/// or with `BRAND_CHILD_EXIT` set ends its process at once, as a C program
/// that calls `exit` on an error does). Run only as the child of the tests
/// below, with the job's configuration in its environment.
#[test]
#[ignore = "the child process of the killed-node tests"]
fn killed_node_child() {
    let var = |k: &str| std::env::var(k).expect("set by the parent test");
    let path = CString::new(var("BRAND_CHILD_DATASET")).expect("no NUL");
    let cfg = CString::new(var("BRAND_CHILD_CONFIG")).expect("no NUL");
    let l = match open(&path, &cfg) {
        Ok(l) => l,
        Err(e) => {
            println!("error: {e}");
            return;
        }
    };
    loop {
        let mut b = null_mut();
        match brand_next(l, &mut b) {
            BRAND_OK => brand_batch_free(&mut b),
            BRAND_END_OF_EPOCH => continue,
            st => {
                println!("error: brand_next: {st:?}: {}", last_error());
                if std::env::var_os("BRAND_CHILD_EXIT").is_some() {
                    std::process::exit(1);
                }
                break;
            }
        }
        println!("batch");
    }
    let _ = close(l);
}

/// A node process of a job of three (see `killed_node_child`); `exits`:
/// it ends its process at once on an error, without `brand_close`.
fn node_process(path: &CString, config: &CString, exits: bool) -> std::process::Child {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    if exits {
        c.env("BRAND_CHILD_EXIT", "1");
    }
    c.args([
        "--exact",
        "killed_node_child",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("BRAND_CHILD_DATASET", path.to_str().expect("utf-8"))
    .env("BRAND_CHILD_CONFIG", config.to_str().expect("utf-8"))
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn a node process")
}

/// A job of three node processes whose configuration `config(nodes, rank)`
/// gives, `victim` SIGKILLed after it served `after_batches` batches; the
/// survivors take epochs until they fail, then close or (`exits`) end their
/// process at once. Each failure to name the victim first (after the
/// survivor's own name), or to fail within `peer_timeout + slack` of the
/// kill, is a line of the result.
fn kill_one_node(
    path: &CString,
    victim: usize,
    after_batches: usize,
    exits: bool,
    config: &dyn Fn(&[String], usize) -> CString,
    peer_timeout: Duration,
    slack: Duration,
) -> Vec<String> {
    let nodes = addresses(3);
    let mut children: Vec<_> = (0..3)
        .map(|rank| node_process(path, &config(&nodes, rank), exits))
        .collect();
    // Each survivor's last line (its error), and when it came.
    let survivors: Vec<_> = (0..3)
        .filter(|&r| r != victim)
        .map(|rank| {
            let out = children[rank].stdout.take().expect("stdout");
            std::thread::spawn(move || -> (usize, Result<(String, Instant), String>) {
                let mut last = Vec::new();
                for line in BufReader::new(out).split(b'\n') {
                    let Ok(line) = line else { break };
                    let line = String::from_utf8_lossy(&line).into_owned();
                    if let Some(at) = line.find("error: ") {
                        return (rank, Ok((line[at..].to_string(), Instant::now())));
                    }
                    last.push(line);
                }
                let n = last.len();
                (rank, Err(last[n.saturating_sub(4)..].join(" | ")))
            })
        })
        .collect();
    // Kill it once it served `after_batches` batches (it lives only as
    // long as the others let it: they fail it if it never got going).
    let mut lines = BufReader::new(children[victim].stdout.take().expect("stdout")).lines();
    let mut served = 0;
    while served < after_batches {
        match lines.next() {
            // The harness's "test killed_node_child ... " may lead the first.
            Some(Ok(l)) if l.ends_with("batch") => served += 1,
            Some(Ok(_)) => {}
            _ => break,
        }
    }
    children[victim].kill().expect("kill");
    let killed_at = Instant::now();
    let mut failed = Vec::new();
    let victim_name = format!("node {victim} ({})", nodes[victim]);
    for s in survivors {
        let (rank, got) = s.join().expect("survivor thread");
        let (e, failed_at) = match got {
            Ok(got) => got,
            Err(last) => {
                let status = children[rank].wait();
                failed.push(format!(
                    "victim {victim}: rank {rank} ended with no error ({status:?}; its last lines: {last})"
                ));
                continue;
            }
        };
        // "node R (addr): node V (addr): why": the first node named after its own.
        let own = format!("node {rank} ({})", nodes[rank]);
        let rest = e.find(&own).map_or(e.as_str(), |at| &e[at + own.len()..]);
        let first = (0..3)
            .filter_map(|r| rest.find(&format!("node {r} ({})", nodes[r])).map(|at| (at, r)))
            .min();
        if served < after_batches || first.map(|f| f.1) != Some(victim) {
            failed.push(format!(
                "victim {victim} (killed after {served} batches): rank {rank} does not blame {victim_name}: {e}"
            ));
        }
        let took = failed_at.saturating_duration_since(killed_at);
        if took > peer_timeout + slack {
            failed.push(format!("victim {victim}: rank {rank} failed {took:?} after the kill"));
        }
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    failed
}

#[test]
fn a_killed_c_abi_node_is_named_by_both_survivors() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = dataset(t.path());
    let timeout = Duration::from_secs(TIMEOUT_SECS);
    let mut failed = Vec::new();
    for (victim, after_batches) in [(2usize, 1usize), (0, 4), (1, 9)] {
        // Named within the timeout, plus slack for two loaded cores.
        failed.extend(kill_one_node(
            &path,
            victim,
            after_batches,
            false,
            &config,
            timeout,
            Duration::from_secs(4),
        ));
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Issue 54's case, repeated (a race shows only under repetition): 2,400
/// samples, 30 slots a node, `peer_timeout` 8 s, a node killed after 3
/// batches; both survivors name it within `peer_timeout` + 10 s, whichever
/// node it is, whether they close or end their process on the error. A
/// survivor that ended its process before telling the other why was blamed
/// by it in 1 to 3 of 26 such runs (`connection lost`).
#[test]
fn a_killed_node_is_blamed_by_both_survivors_every_time() {
    const TIMEOUT: u64 = 8;
    let t = tempfile::tempdir().expect("tempdir");
    let dir = brand_import::synthetic::small_dataset(t.path(), 2400).expect("gen and pack");
    let path = CString::new(dir.to_str().expect("utf-8")).expect("no NUL");
    let config = |nodes: &[String], rank: usize| {
        let list: Vec<String> = nodes.iter().map(|a| format!("\"{a}\"")).collect();
        CString::new(format!(
            "nodes = [{}]\nrank = {rank}\nmemory = \"30 slots\"\npeer_timeout = \"{TIMEOUT}s\"\nseed = 5\njob = \"capi-killed\"\n",
            list.join(", ")
        ))
        .expect("no NUL")
    };
    let timeout = Duration::from_secs(TIMEOUT);
    let mut failed = Vec::new();
    let victims = std::iter::repeat_n(2usize, 26)
        .chain(std::iter::repeat_n(0, 7))
        .chain(std::iter::repeat_n(1, 7));
    let mut runs = 0;
    for (run, victim) in victims.enumerate() {
        runs += 1;
        // Mostly survivors that end their process: the case that raced.
        let exits = run % 4 != 3;
        for f in kill_one_node(&path, victim, 3, exits, &config, timeout, Duration::from_secs(10)) {
            failed.push(format!(
                "run {run} (survivors {}): {f}",
                if exits { "exit" } else { "close" }
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} failures in {runs} runs:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
