//! The lifecycle of a multi-node job on loopback, run many times over tiny
//! datasets (epochs of milliseconds) so the races of joining, finishing and
//! stopping show: nodes started at once or staggered within half of
//! `peer_timeout` all finish; nodes that all close after k batches all close
//! cleanly and promptly; a node that dies is named by every survivor, never
//! a messenger that left because of it.
//!
//! Each scenario runs a bounded number of times and stops at the first few
//! failures (each failing run costs up to `peer_timeout`), so the tests stay
//! bounded; `BRAND_LIFECYCLE_ALL=1` runs every repetition and prints the
//! count of failures (how the counts in the history were measured).

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_nodes::NodeLoader;
use brand_plan::Memory;
use common::Config;

mod common;
use common::{node_config, plan_order};

const SAMPLES: u64 = 120;
const TIMEOUT: Duration = Duration::from_secs(4);
/// Failing runs tolerated before a test stops repeating (it fails anyway).
const STOP_AFTER: usize = 3;

fn dataset(root: &std::path::Path) -> Arc<Dataset> {
    Arc::new(Dataset::open(small_dataset(root, SAMPLES).expect("gen and pack")).expect("open"))
}

fn config(nodes: &[String], rank: u32) -> Config {
    let mut cfg = node_config(nodes, rank, "lifecycle");
    cfg.loader.plan.memory = Memory::Slots(16);
    cfg.loader.batch_size = 7;
    cfg.nodes.peer_timeout = TIMEOUT;
    // A whole epoch's share fits the credit (as with the default remote
    // memory and a small dataset): an owner can push all it owes at once
    // and be done before its peers have even met each other.
    cfg.nodes.remote_memory = 32 << 20;
    cfg
}

/// Free loopback addresses below the ephemeral range. `common::addresses`
/// frees ephemeral ports at once, and a node started up to seconds later
/// may find its port taken meanwhile, by another test's `addresses` or by
/// the local end of some outgoing connection: both draw from the ephemeral
/// range, these ports do not. Each is checked free, and never handed out
/// twice by this process.
fn addresses(n: usize) -> Vec<String> {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 1000) as u16 * 10;
    let mut out = Vec::new();
    while out.len() < n {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % 12_000;
        let addr = format!("127.0.0.1:{}", 20_000 + (base - 20_000 + offset) % 12_000);
        if std::net::TcpListener::bind(&addr).is_ok() {
            out.push(addr);
        }
    }
    out
}

fn run_all() -> bool {
    std::env::var_os("BRAND_LIFECYCLE_ALL").is_some()
}

/// A small deterministic generator (splitmix64): delays and stop points
/// that differ between runs but repeat between test invocations.
struct Mix(u64);
impl Mix {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// One run of `world` nodes: node r starts after `delays[r]`, serves up to
/// `batches` batches of epoch 0 (all of it when None) and closes. Checks
/// every node served its plan's prefix; the failures, one line per node.
fn run_once(ds: &Arc<Dataset>, world: usize, delays: &[Duration], batches: Option<usize>) -> Vec<String> {
    let nodes = addresses(world);
    let go = Arc::new(Barrier::new(world));
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let (ds, cfg, go, delay) = (ds.clone(), config(&nodes, r as u32), go.clone(), delays[r]);
            std::thread::spawn(move || {
                go.wait();
                std::thread::sleep(delay);
                let mut l = NodeLoader::open(ds.clone(), &cfg.loader, &cfg.nodes, LoaderState::default())
                    .map_err(|e| e.to_string())?;
                let mut ids = Vec::new();
                while batches.is_none_or(|k| ids.len() < k * cfg.loader.batch_size) {
                    match l.next_batch().map_err(|e| e.to_string())? {
                        Some(b) => ids.extend(b.iter().map(|s| s.id)),
                        None => break,
                    }
                }
                let closing = Instant::now();
                l.close();
                let order = plan_order(&ds, &cfg, 0);
                let want = batches.map_or(order.len(), |k| (k * cfg.loader.batch_size).min(order.len()));
                if ids != order[..want] {
                    return Err(format!("served {} samples, not the plan's first {want}", ids.len()));
                }
                // Closing waits for peers that still need this node, never
                // for peers that stopped too (they said goodbye).
                if closing.elapsed() >= TIMEOUT {
                    return Err(format!("close took {:?}", closing.elapsed()));
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .filter_map(|(r, h)| match h.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("rank {r}: {e}")),
            Err(_) => Some(format!("rank {r}: panicked")),
        })
        .collect()
}

/// Runs `runs` scenarios (`scenario(i)`: delays and batches of run i),
/// stopping after `STOP_AFTER` failing runs unless told to run them all;
/// panics listing the failures.
fn repeat(name: &str, world: usize, runs: usize, scenario: impl Fn(usize) -> (Vec<Duration>, Option<usize>)) {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let start = Instant::now();
    let mut failed = Vec::new();
    let mut tried = 0;
    for i in 0..runs {
        let (delays, batches) = scenario(i);
        tried += 1;
        let errors = run_once(&ds, world, &delays, batches);
        if !errors.is_empty() {
            failed.push(format!(
                "run {i} (batches {batches:?}, delays {delays:?}): {}",
                errors.join("; ")
            ));
            if failed.len() >= STOP_AFTER && !run_all() {
                break;
            }
        }
    }
    eprintln!(
        "{name}: {} of {tried} runs failed in {:?}",
        failed.len(),
        start.elapsed()
    );
    assert!(
        failed.is_empty(),
        "{name}: {} of {tried} runs failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Start delays of `world` nodes for `runs` runs, each below `spread`.
fn delays(seed: u64, runs: usize, world: usize, spread: Duration) -> Vec<Vec<Duration>> {
    let mut mix = Mix(seed);
    (0..runs)
        .map(|_| {
            (0..world)
                .map(|_| Duration::from_millis(mix.below(spread.as_millis() as u64)))
                .collect()
        })
        .collect()
}

/// Processes started "at the same moment" are up within some tens of
/// milliseconds of each other: about the time a tiny epoch takes, which is
/// where a node can finish before its peers have all met.
const AT_ONCE: Duration = Duration::from_millis(120);

#[test]
fn three_nodes_started_at_once_all_finish() {
    let d = delays(3, 50, 3, AT_ONCE);
    repeat("3 nodes at once", 3, d.len(), |i| (d[i].clone(), None));
}

#[test]
fn four_nodes_started_at_once_all_finish() {
    let d = delays(4, 50, 4, AT_ONCE);
    repeat("4 nodes at once", 4, d.len(), |i| (d[i].clone(), None));
}

#[test]
fn nodes_started_up_to_half_the_timeout_apart_all_finish() {
    let d = delays(11, 12, 3, TIMEOUT / 2);
    repeat("3 nodes staggered", 3, d.len(), |i| (d[i].clone(), None));
}

#[test]
fn nodes_that_all_close_after_k_batches_close_cleanly() {
    // Epoch 0 has SAMPLES / 3 = 40 samples per rank: 6 batches of 7;
    // every k from 0 (close right after opening) to past the end, 4 times.
    let ks: Vec<usize> = (0..=7).cycle().take(32).collect();
    let d = delays(5, ks.len(), 3, AT_ONCE);
    repeat("3 nodes close after k batches", 3, ks.len(), |i| {
        (d[i].clone(), Some(ks[i]))
    });
}

#[test]
fn four_nodes_that_all_close_after_k_batches_close_cleanly() {
    // 30 samples per rank: 5 batches of 7.
    let ks: Vec<usize> = (0..=6).cycle().take(14).collect();
    let d = delays(6, ks.len(), 4, AT_ONCE);
    repeat("4 nodes close after k batches", 4, ks.len(), |i| {
        (d[i].clone(), Some(ks[i]))
    });
}

/// The first node named in `e` after the failing node's own prefix: the one
/// it blames.
fn blamed(e: &str, nodes: &[String]) -> Option<usize> {
    // "node R (addr): ..." is the failing node itself; what follows names the cause.
    let rest = e.split_once("): ").map_or(e, |(_, r)| r);
    (0..nodes.len())
        .filter_map(|r| rest.find(&format!("node {r} ({})", nodes[r])).map(|at| (at, r)))
        .min()
        .map(|(_, r)| r)
}

#[test]
fn a_node_that_dies_is_named_by_every_survivor_not_a_messenger() {
    let t = tempfile::tempdir().expect("tempdir");
    // Bigger, so a node dying after a few batches dies mid-epoch.
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), 900).expect("pack")).expect("open"));
    let mut failed = Vec::new();
    let runs = 8;
    for run in 0..runs {
        let nodes = addresses(3);
        let victim = run % 3;
        let go = Arc::new(Barrier::new(3));
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let mut cfg = config(&nodes, r as u32);
                // Credit for a few samples only: the victim still owes the
                // survivors most of the epoch when it dies.
                cfg.nodes.remote_memory = 64 << 10;
                let (ds, go) = (ds.clone(), go.clone());
                std::thread::spawn(move || -> Result<(), (String, Duration)> {
                    go.wait();
                    let start = Instant::now();
                    let err = |e: String| (e, start.elapsed());
                    let mut l = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default())
                        .map_err(|e| err(e.to_string()))?;
                    if r == victim {
                        for _ in 0..1 + run % 4 {
                            l.next_batch().map_err(|e| err(e.to_string()))?;
                        }
                        l.abort();
                        return Ok(());
                    }
                    loop {
                        match l.next_batch() {
                            Ok(Some(_)) => {}
                            Ok(None) => return Err(err("finished an epoch a dead node owed samples of".into())),
                            Err(e) => return Err(err(e.to_string())),
                        }
                    }
                })
            })
            .collect();
        for (r, h) in handles.into_iter().enumerate() {
            let res = h.join().expect("thread");
            match (r == victim, res) {
                (true, Ok(())) => {}
                (true, Err((e, _))) => failed.push(format!("run {run}: the victim {r} failed before dying: {e}")),
                (false, Ok(())) => failed.push(format!("run {run}: rank {r} did not fail")),
                (false, Err((e, took))) => {
                    if blamed(&e, &nodes) != Some(victim) {
                        failed.push(format!(
                            "run {run}: rank {r} blames {:?}, not {victim}: {e}",
                            blamed(&e, &nodes)
                        ));
                    }
                    // Noticed within the peer timeout (plus slack for 2 loaded cores).
                    if took > TIMEOUT + Duration::from_secs(3) {
                        failed.push(format!("run {run}: rank {r} took {took:?}: {e}"));
                    }
                }
            }
        }
        if failed.len() >= STOP_AFTER && !run_all() {
            break;
        }
    }
    eprintln!("a node dies: {} failures in {runs} runs", failed.len());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
