//! `brand serve` as three processes on loopback: each serves its third of
//! every epoch, the chunks are read once across the nodes, and killing one
//! makes the others fail naming it within the timeout.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brand_pack::synthetic::small_dataset;

const SAMPLES: u64 = 900;

fn dataset(root: &std::path::Path) -> std::path::PathBuf {
    small_dataset(root, SAMPLES).expect("gen and pack")
}

fn addresses(n: usize) -> Vec<String> {
    let ls: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    ls.iter().map(|l| l.local_addr().expect("addr").to_string()).collect()
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
        String::from_utf8_lossy(&out.stderr).into_owned(),
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
    // What one process reading the whole world's plan reads: each chunk
    // read by its owner only, not once per node.
    let d = brand_format::Dataset::open(&ds).expect("open");
    let mut plan = brand_plan::PlanConfig::new(brand_plan::Memory::Slots(64));
    plan.world = 3;
    let planner = brand_plan::Planner::new(&d.index, &plan).expect("planner");
    let expected: u64 = (0..2)
        .flat_map(|e| planner.global_epoch(e).reads().to_vec())
        .map(|r| d.index.chunk_padded_len(r.chunk as u64))
        .sum();
    assert_eq!(read, expected, "bytes read across the nodes");
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
