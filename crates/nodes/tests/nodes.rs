//! Several nodes on loopback, as threads of this process: each rank serves
//! the single-process plan's sequence, every sample once per epoch, the
//! source's bytes, every chunk read by its owner only, within the remote
//! memory; and a peer that disagrees, is missing or dies is a named error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_loader::Metrics;
use brand_nodes::NodeLoader;
use common::Config;

mod common;
use brand_plan::Planner;
use common::{
    Served, addresses, global_read_bytes, node_config, plan_order, run_ranks_serving_their_plans, serve_epochs,
};

const SAMPLES: u64 = 600;

fn dataset(root: &std::path::Path) -> Arc<Dataset> {
    let dir = small_dataset(root, SAMPLES).expect("gen and pack");
    Arc::new(Dataset::open(dir).expect("open"))
}

fn config(nodes: &[String], rank: u32, remote_memory: u64, timeout: Duration) -> Config {
    let mut cfg = node_config(nodes, rank, "test");
    cfg.nodes.remote_memory = remote_memory;
    cfg.nodes.peer_timeout = timeout;
    cfg
}

fn run_node(ds: Arc<Dataset>, cfg: Config, epochs: u64) -> Result<(Served, Metrics), String> {
    run_node_then(ds, cfg, epochs, None)
}

/// Runs `epochs` epochs, then waits at `all_done` (every node finished, so
/// every owner has pushed all it owed) before taking the metrics.
fn run_node_then(
    ds: Arc<Dataset>,
    cfg: Config,
    epochs: u64,
    all_done: Option<Arc<std::sync::Barrier>>,
) -> Result<(Served, Metrics), String> {
    // Exact counts below: nothing of an epoch past the last is read.
    let mut cfg = cfg;
    cfg.nodes.last_epoch = Some(epochs - 1);
    let mut l = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
    let out = serve_epochs(&mut l, epochs)?;
    if let Some(b) = all_done {
        b.wait();
    }
    let m = l.metrics();
    Ok((out, m))
}

#[test]
fn three_nodes_serve_the_plan_once_and_read_each_chunk_at_its_owner_only() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(3);
    let remote_memory = 64 << 10;
    let cfgs: Vec<Config> = (0..3)
        .map(|r| config(&nodes, r, remote_memory, Duration::from_secs(20)))
        .collect();
    let node_ds = ds.clone();
    let results = run_ranks_serving_their_plans(&cfgs, &ds, SAMPLES, move |_, c, b| {
        run_node_then(node_ds.clone(), c, 2, Some(b))
    });
    // Whole-chunk reads: the nodes together read exactly what one global
    // protocol reads, so no chunk was read twice.
    let planner = Planner::new(&ds.index, &cfgs[0].loader.plan).expect("planner");
    let expected = global_read_bytes(&ds, &planner, 2, |_| true);
    let read: u64 = results.iter().map(|(_, m)| m.bytes_read).sum();
    assert_eq!(read, expected, "bytes read across nodes");
    for (rank, (_, m)) in results.iter().enumerate() {
        assert!(m.bytes_read > 0, "rank {rank} reads its own groups");
        assert!(m.samples_local > 0 && m.samples_received > 0, "rank {rank}: {m:?}");
        assert_eq!(m.samples_local + m.samples_received, 2 * SAMPLES / 3, "rank {rank}");
        assert!(
            m.remote_memory_peak <= remote_memory,
            "rank {rank}: held {} > {remote_memory}",
            m.remote_memory_peak
        );
    }
    let pushed: u64 = results.iter().map(|(_, m)| m.samples_pushed).sum();
    let received: u64 = results.iter().map(|(_, m)| m.samples_received).sum();
    assert_eq!(pushed, received, "every push arrives once");
}

#[test]
fn a_single_node_serves_the_single_process_plan() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let cfg = config(&[], 0, 1 << 20, Duration::from_secs(5));
    let (served, m) = run_node(ds.clone(), cfg.clone(), 2).expect("node");
    for (e, epoch) in served.iter().enumerate() {
        let ids: Vec<u64> = epoch.iter().map(|s| s.0).collect();
        assert_eq!(ids, plan_order(&ds, &cfg, e as u64));
    }
    assert_eq!(
        (m.samples_local, m.samples_received, m.samples_pushed),
        (2 * SAMPLES, 0, 0)
    );
}

#[test]
fn a_peer_with_another_plan_is_refused_naming_what_differs() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(2);
    let mut cfgs: Vec<Config> = (0..2)
        .map(|r| config(&nodes, r, 1 << 20, Duration::from_secs(5)))
        .collect();
    cfgs[1].loader.plan.seed = 8;
    let handles: Vec<_> = cfgs
        .into_iter()
        .map(|c| {
            let ds = ds.clone();
            std::thread::spawn(move || run_node(ds, c, 1).map(|_| ()))
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let e = h.join().expect("thread").expect_err("mismatch must fail");
        assert!(e.contains("seed 7") || e.contains("seed 8"), "rank {rank}: {e}");
    }
}

#[test]
fn an_unreachable_peer_is_an_error_within_the_timeout() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(2);
    let start = Instant::now();
    let e = run_node(ds, config(&nodes, 0, 1 << 20, Duration::from_secs(1)), 1).expect_err("alone");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert!(e.contains(&format!("node 1 ({})", nodes[1])), "{e}");
}

#[test]
fn a_node_killed_mid_epoch_fails_the_others_naming_it() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(3);
    let timeout = Duration::from_secs(3);
    let cfgs: Vec<Config> = (0..3).map(|r| config(&nodes, r, 64 << 10, timeout)).collect();
    let killed = {
        let (ds, c) = (ds.clone(), cfgs[2].clone());
        std::thread::spawn(move || {
            let mut l = NodeLoader::open(ds, &c.loader, &c.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
            for _ in 0..3 {
                l.next_batch().map_err(|e| e.to_string())?;
            }
            l.abort();
            Ok::<(), String>(())
        })
    };
    let others: Vec<_> = cfgs[..2]
        .iter()
        .cloned()
        .map(|c| {
            let ds = ds.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let r = run_node(ds, c, 1).map(|_| ());
                (r, start.elapsed())
            })
        })
        .collect();
    killed.join().expect("thread").expect("the killed node ran");
    for (rank, h) in others.into_iter().enumerate() {
        let (r, took) = h.join().expect("thread");
        let e = r.expect_err("a dead peer must fail the others");
        assert!(e.contains(&format!("node 2 ({})", nodes[2])), "rank {rank}: {e}");
        assert!(took < timeout * 4, "rank {rank} took {took:?}");
    }
}

#[test]
fn all_nodes_resume_mid_epoch_from_the_same_state() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let nodes = addresses(3);
    let state = LoaderState { epoch: 1, served: 53 };
    let cfgs: Vec<Config> = (0..3)
        .map(|r| config(&nodes, r, 64 << 10, Duration::from_secs(20)))
        .collect();
    let handles: Vec<_> = cfgs
        .iter()
        .cloned()
        .map(|c| {
            let ds = ds.clone();
            std::thread::spawn(move || {
                let mut l = NodeLoader::open(ds, &c.loader, &c.nodes, state).map_err(|e| e.to_string())?;
                let mut ids = Vec::new();
                while let Some(b) = l.next_batch().map_err(|e| e.to_string())? {
                    ids.extend(b.iter().map(|s| s.id));
                }
                Ok::<_, String>((ids, l.state()))
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (ids, end) = h.join().expect("thread").expect("node");
        assert_eq!(ids, plan_order(&ds, &cfgs[rank], 1)[53..], "rank {rank}");
        // After the epoch's end: the next epoch's start, as a Loader says.
        assert_eq!(end, LoaderState { epoch: 2, served: 0 });
    }
}
