//! `brand serve` as three processes on loopback: each serves its third of
//! every epoch, the chunks are read once across the nodes, and killing one
//! makes the others fail naming it within the timeout.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brand_import::synthetic::small_dataset;

mod common;
use common::addresses;

const SAMPLES: u64 = 900;

fn dataset(root: &std::path::Path) -> std::path::PathBuf {
    small_dataset(root, SAMPLES).expect("gen and pack")
}

fn serve(ds: &std::path::Path, nodes: &[String], rank: usize, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_brand"))
        .arg("serve")
        .arg(ds)
        .args(["--nodes", &nodes.join(","), "--rank", &rank.to_string()])
        .args(["--memory", "64 slots", "--read-gap", "whole", "--batch", "8", "--json"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn brand serve")
}

/// The bytes one process reading the 3-node world's plan (64 slots, whole
/// chunks) reads in 2 epochs: what the serve processes must read together.
fn world_plan_read_bytes(ds: &std::path::Path) -> u64 {
    let d = brand_format::Dataset::open(ds).expect("open");
    let mut plan = brand_plan::PlanConfig::new(brand_plan::Memory::Slots(64));
    plan.world = 3;
    let planner = brand_plan::Planner::new(&d.index, &plan).expect("planner");
    (0..2)
        .flat_map(|e| planner.global_epoch(e).reads().to_vec())
        .map(|r| d.index.chunk_padded_len(r.chunk as u64))
        .sum()
}

/// Waits for `child` up to `limit`, killing it past that.
fn finish(mut child: Child, limit: Duration) -> (bool, String, String) {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => break,
            None if start.elapsed() > limit => {
                let _ = child.kill();
                break;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        // The status too: a process killed by a signal writes nothing.
        format!("{}\n{}", out.status, String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn three_serve_processes_share_the_epochs() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(3);
    let children: Vec<Child> = (0..3).map(|r| serve(&ds, &nodes, r, &["--epochs", "2"])).collect();
    let mut read = 0u64;
    let (mut pushed, mut received) = (0u64, 0u64);
    for (rank, c) in children.into_iter().enumerate() {
        let (ok, out, err) = finish(c, Duration::from_secs(60));
        assert!(ok, "rank {rank} failed: {err}");
        let report: serde_json::Value = serde_json::from_str(&out).expect("json");
        let epochs = report["epochs"].as_array().expect("array");
        assert_eq!(epochs.len(), 2);
        for e in epochs {
            assert_eq!(e["samples"], SAMPLES / 3, "rank {rank}");
        }
        let m = &report["closed"];
        let local = m["samples_local"].as_u64().expect("local");
        let got = m["samples_received"].as_u64().expect("received");
        assert_eq!(local + got, 2 * SAMPLES / 3, "rank {rank}");
        read += m["bytes_read"].as_u64().expect("read");
        pushed += m["samples_pushed"].as_u64().expect("pushed");
        received += got;
    }
    assert_eq!(pushed, received);
    // Each chunk read by its owner only, not once per node.
    assert_eq!(read, world_plan_read_bytes(&ds), "bytes read across the nodes");
}

#[test]
fn killing_a_serve_process_fails_the_others_naming_it() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(3);
    // Many epochs, so the kill lands mid-epoch.
    let args = ["--epochs", "1000", "--peer-timeout", "3s"];
    let mut children: Vec<Child> = (0..3).map(|r| serve(&ds, &nodes, r, &args)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let victim = children.pop().expect("three");
    let mut victim = victim;
    victim.kill().expect("kill");
    let _ = victim.wait();
    let killed_at = Instant::now();
    for (rank, c) in children.into_iter().enumerate() {
        let (ok, _, err) = finish(c, Duration::from_secs(30));
        assert!(!ok, "rank {rank} must fail");
        assert!(err.contains(&format!("node 2 ({})", nodes[2])), "rank {rank}: {err}");
    }
    assert!(
        killed_at.elapsed() < Duration::from_secs(15),
        "took {:?}",
        killed_at.elapsed()
    );
}

#[test]
fn pack_partitions_then_three_serve_processes_each_on_its_own_partition() {
    let t = tempfile::tempdir().expect("tempdir");
    let whole = dataset(t.path());
    let parts = t.path().join("parts");
    let brand = env!("CARGO_BIN_EXE_brand");
    let pack = Command::new(brand)
        .arg("pack")
        .arg(t.path().join("src"))
        .arg("-o")
        .arg(&parts)
        .args(["--chunk-size", "16", "--partitions", "3", "--memory", "64 slots"])
        .output()
        .expect("brand pack");
    assert!(pack.status.success(), "{}", String::from_utf8_lossy(&pack.stderr));
    // Each partition on its own "disk"; inspect and verify know what they are.
    let disks: Vec<std::path::PathBuf> = (0..3)
        .map(|w| {
            let disk = t.path().join(format!("disk-{w}"));
            std::fs::rename(parts.join(format!("part-{w}")), &disk).expect("move");
            disk
        })
        .collect();
    for (w, disk) in disks.iter().enumerate() {
        let out = Command::new(brand).arg("inspect").arg(disk).output().expect("inspect");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(&format!("partition    {w} of 3")),
            "{text}"
        );
        let out = Command::new(brand).arg("verify").arg(disk).output().expect("verify");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        // A loader of the whole dataset refuses a partition, naming it.
        let out = Command::new(brand).arg("read").arg(disk).output().expect("read");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("manifest.toml") && err.contains("partition"),
            "{err}"
        );
    }
    let nodes = addresses(3);
    let children: Vec<Child> = (0..3)
        .map(|r| serve(&disks[r], &nodes, r, &["--epochs", "2"]))
        .collect();
    let mut read = 0u64;
    for (rank, c) in children.into_iter().enumerate() {
        let (ok, out, err) = finish(c, Duration::from_secs(60));
        assert!(ok, "rank {rank} failed: {err}");
        let report: serde_json::Value = serde_json::from_str(&out).expect("json");
        for e in report["epochs"].as_array().expect("array") {
            assert_eq!(e["samples"], SAMPLES / 3, "rank {rank}");
        }
        let m = &report["closed"];
        assert!(m["stall_p99_secs"].as_f64().is_some(), "rank {rank}: {m}");
        read += m["bytes_read"].as_u64().expect("read");
    }
    assert_eq!(read, world_plan_read_bytes(&whole), "bytes read across the partitions");
}

/// The node a failing node's error blames: the first node named after its
/// own name (`node R (addr): node P (addr): why`).
fn blamed(err: &str, nodes: &[String], me: usize) -> Option<usize> {
    let own = format!("node {me} ({})", nodes[me]);
    let rest = err.find(&own).map_or(err, |at| &err[at + own.len()..]);
    (0..nodes.len())
        .filter_map(|r| rest.find(&format!("node {r} ({})", nodes[r])).map(|at| (at, r)))
        .min()
        .map(|(_, r)| r)
}

#[test]
fn a_serve_process_killed_at_any_point_is_named_by_every_survivor() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let timeout = Duration::from_secs(3);
    // Kill points from before the mesh is complete to deep into the epochs;
    // each victim in turn. A few runs: each costs up to the timeout.
    let points = [(2usize, 150u64), (0, 900), (1, 1700), (2, 2600)];
    let mut failures = Vec::new();
    for (victim, after_ms) in points {
        let nodes = addresses(3);
        let args = ["--epochs", "1000", "--peer-timeout", "3s"];
        let mut children: Vec<Option<Child>> = (0..3).map(|r| Some(serve(&ds, &nodes, r, &args))).collect();
        std::thread::sleep(Duration::from_millis(after_ms));
        let mut v = children[victim].take().expect("victim");
        v.kill().expect("kill");
        let _ = v.wait();
        let killed_at = Instant::now();
        for (rank, c) in children.into_iter().enumerate() {
            let Some(c) = c else { continue };
            let (ok, _, err) = finish(c, Duration::from_secs(30));
            let took = killed_at.elapsed();
            if ok {
                failures.push(format!("killed {victim} after {after_ms} ms: rank {rank} did not fail"));
            } else if blamed(&err, &nodes, rank) != Some(victim) {
                failures.push(format!(
                    "killed {victim} after {after_ms} ms: rank {rank} blames {:?}: {err}",
                    blamed(&err, &nodes, rank)
                ));
            }
            // Named within the timeout, plus slack for process exit on 2 loaded cores.
            if took > timeout + Duration::from_secs(4) {
                failures.push(format!(
                    "killed {victim} after {after_ms} ms: rank {rank} took {took:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Samples a rank serves in `batches` batches of `batch` over epochs of
/// `per_rank` samples (the last batch of an epoch may be short).
fn served_in(batches: u64, batch: u64, per_rank: u64, epochs: u64) -> u64 {
    let per_epoch = per_rank.div_ceil(batch);
    let whole = (batches / per_epoch).min(epochs);
    let rest = if whole < epochs { batches - whole * per_epoch } else { 0 };
    whole * per_rank + (rest * batch).min(per_rank)
}

#[test]
fn serve_processes_that_all_stop_after_k_batches_exit_cleanly() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    // 300 samples per rank and epoch in batches of 8: 38 batches, the last short.
    // From closing at once to mid-way through the second epoch.
    for k in [0u64, 1, 5, 37, 38, 60] {
        let nodes = addresses(3);
        let args = ["--epochs", "2", "--peer-timeout", "10s", "--batches", &k.to_string()];
        let started = Instant::now();
        let children: Vec<Child> = (0..3).map(|r| serve(&ds, &nodes, r, &args)).collect();
        for (rank, c) in children.into_iter().enumerate() {
            let (ok, out, err) = finish(c, Duration::from_secs(30));
            assert!(ok, "k {k}: rank {rank} failed: {err}");
            let report: serde_json::Value = serde_json::from_str(&out).expect("json");
            let served: u64 = report["epochs"]
                .as_array()
                .expect("array")
                .iter()
                .map(|e| e["samples"].as_u64().expect("samples"))
                .sum();
            assert_eq!(served, served_in(k, 8, SAMPLES / 3, 2), "k {k}: rank {rank}");
        }
        // Nobody waited out the peer timeout for a peer that stopped too.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "k {k}: took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn served_in_counts_short_last_batches() {
    assert_eq!(served_in(0, 8, 300, 2), 0);
    assert_eq!(served_in(37, 8, 300, 2), 296);
    assert_eq!(served_in(38, 8, 300, 2), 300);
    assert_eq!(served_in(60, 8, 300, 2), 476);
    assert_eq!(served_in(1000, 8, 300, 2), 600);
}
