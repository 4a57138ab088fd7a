//! Partitioned placement (`brand pack --partitions`, paper §3.4): three
//! nodes on loopback, each with only its own partition's files, serve the
//! single-process plan exactly once per epoch with the source's bytes; a
//! partition of another pack, or opened by the wrong node, is refused; and
//! a rank far ahead of a slow one is held back (the owner's memory bound).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use brand_format::Dataset;
use brand_import::files::FileSource;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_loader::Metrics;
use brand_nodes::NodeLoader;
use brand_nodes::routes::Ownership;
use brand_pack::{PackOptions, Partitioning, partition_dir};
use brand_plan::{Layout, Memory, Planner};
use common::Config;

mod common;
use common::{Served, addresses, global_read_bytes, node_config, run_ranks_serving_their_plans, serve_epochs};

const SAMPLES: u64 = 600;
const NODES: u32 = 3;

fn config(nodes: &[String], rank: u32, memory: Memory, remote_memory: u64) -> Config {
    let mut cfg = node_config(nodes, rank, "partitions");
    cfg.loader.plan.memory = memory;
    cfg.loader.readahead_bytes = 64 << 10;
    cfg.nodes.remote_memory = remote_memory;
    cfg
}

/// The whole dataset (`root/ds`, for the expected bytes) and the same
/// source packed as `NODES` partitions (`root/parts`) for `cfg`'s groups;
/// each partition then moved to its own "node disk" `root/node-w`.
fn whole_and_partitions(root: &Path, samples: u64, seed: u64, cfg: &Config) -> (Arc<Dataset>, Vec<PathBuf>) {
    let whole = small_dataset(root, samples).expect("gen and pack");
    let ds = Arc::new(Dataset::open(&whole).expect("open"));
    let own = Ownership::of_layout(Layout::of(&ds.index), &cfg.loader.plan).expect("groups");
    let source = FileSource::image_folder(&root.join("src")).expect("source");
    let opts = PackOptions {
        chunk_size: 16,
        seed,
        partitions: Some(Partitioning {
            count: NODES,
            group_chunks: own.group_chunks,
        }),
        ..Default::default()
    };
    let out = root.join("parts");
    brand_pack::pack(&source, &out, &opts, &|_, _, _| {}).expect("pack partitions");
    let dirs = (0..NODES)
        .map(|w| {
            let disk = root.join(format!("node-{w}"));
            std::fs::rename(partition_dir(&out, w), &disk).expect("move partition");
            disk
        })
        .collect();
    (ds, dirs)
}

fn run_node(
    dir: PathBuf,
    cfg: Config,
    epochs: u64,
    all_done: Arc<std::sync::Barrier>,
) -> Result<(Served, Metrics), String> {
    let ds = Arc::new(Dataset::open_any(&dir).map_err(|e| e.to_string())?);
    // Exact counts below: nothing of an epoch past the last is read.
    let mut cfg = cfg;
    cfg.nodes.last_epoch = Some(epochs - 1);
    let mut l = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
    let out = serve_epochs(&mut l, epochs)?;
    all_done.wait();
    Ok((out, l.metrics()))
}

#[test]
fn three_nodes_serve_from_their_own_partitions_only() {
    let t = tempfile::tempdir().expect("tempdir");
    let nodes = addresses(NODES as usize);
    let cfgs: Vec<Config> = (0..NODES)
        .map(|r| config(&nodes, r, Memory::Slots(64), 64 << 10))
        .collect();
    let (whole, dirs) = whole_and_partitions(t.path(), SAMPLES, 0, &cfgs[0]);
    // Each node's directory lacks every other node's segment files, so a
    // read of a chunk it does not own would fail: success means each node
    // read only its partition.
    for (w, dir) in dirs.iter().enumerate() {
        let ds = Dataset::open_any(dir).expect("partition");
        let present = std::fs::read_dir(dir).expect("ls").count() - 2;
        let held = (0..ds.manifest.segments.len() as u32)
            .filter(|&s| ds.holds_segment(s))
            .count();
        assert_eq!(present, held, "node {w}: only its own segment files");
        assert!(
            held > 0 && held < ds.manifest.segments.len(),
            "node {w}: {held} segments"
        );
    }
    let results = run_ranks_serving_their_plans(&cfgs, &whole, SAMPLES, move |r, c, b| {
        run_node(dirs[r].clone(), c, 2, b)
    });
    // Whole-chunk reads: each node read exactly its own chunks' share of
    // the global protocol's reads.
    let planner = Planner::new(&whole.index, &cfgs[0].loader.plan).expect("planner");
    let own = Ownership::of_plan(&planner);
    for (rank, (_, m)) in results.iter().enumerate() {
        let expected = global_read_bytes(&whole, &planner, 2, |c| own.owner_of_chunk(c) == rank as u32);
        assert_eq!(m.bytes_read, expected, "rank {rank}: bytes read");
        assert!(m.samples_local > 0 && m.samples_received > 0, "rank {rank}: {m:?}");
        assert!(m.stall_p50_secs <= m.stall_p99_secs && m.stall_p99_secs <= m.stall_max_secs);
    }
}

#[test]
fn a_partition_of_another_pack_or_node_is_refused() {
    let t = tempfile::tempdir().expect("tempdir");
    let nodes = addresses(2);
    let cfgs: Vec<Config> = (0..2).map(|r| config(&nodes, r, Memory::Slots(64), 1 << 20)).collect();
    // Two packs of the same samples with different pack seeds (the dataset
    // differs), for 3 nodes; this job has 2.
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&a).expect("mkdir");
    std::fs::create_dir_all(&b).expect("mkdir");
    let three: Vec<Config> = (0..NODES)
        .map(|r| config(&addresses(3), r, Memory::Slots(64), 1 << 20))
        .collect();
    let (_, dirs_a) = whole_and_partitions(&a, SAMPLES, 0, &three[0]);
    let (_, dirs_b) = whole_and_partitions(&b, SAMPLES, 1, &three[0]);

    // A partition of a 3-node pack in a 2-node job: named, at open.
    let ds = Arc::new(Dataset::open_any(&dirs_a[0]).expect("open"));
    let e = NodeLoader::open(ds, &cfgs[0].loader, &cfgs[0].nodes, LoaderState::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("partition 0 of 3") && e.contains("node 0 of 2"), "{e}");
    // Node 0 given node 1's partition: named.
    let ds = Arc::new(Dataset::open_any(&dirs_a[1]).expect("open"));
    let e = NodeLoader::open(ds, &three[0].loader, &three[0].nodes, LoaderState::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("partition 1 of 3") && e.contains("node 0 of 3"), "{e}");

    // Partitions of two packs: refused at the handshake by the fingerprint.
    let nodes3 = addresses(3);
    let mixed = [&dirs_a[0], &dirs_b[1], &dirs_a[2]];
    let handles: Vec<_> = (0..NODES)
        .map(|r| {
            let mut cfg = config(&nodes3, r, Memory::Slots(64), 1 << 20);
            cfg.nodes.peer_timeout = Duration::from_secs(5);
            let dir = mixed[r as usize].clone();
            std::thread::spawn(move || {
                let ds = Arc::new(Dataset::open_any(&dir).map_err(|e| e.to_string())?);
                NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let e = h.join().expect("thread").expect_err("another pack must be refused");
        assert!(
            e.contains("dataset fingerprint") || e.contains("did not connect") || e.contains("refused"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn a_rank_far_ahead_of_a_slow_one_is_held_back() {
    // One chunk of budget per rank and many steps: without the drift limit
    // the fast ranks finish the epoch while the slow one has barely begun,
    // and every owner holds the slow rank's share of the epoch.
    const N: u64 = 1500;
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), N).expect("pack")).expect("open"));
    let nodes = addresses(NODES as usize);
    let remote_memory = 48 << 10;
    let cfgs: Vec<Config> = (0..NODES)
        .map(|r| config(&nodes, r, Memory::Slots(16), remote_memory))
        .collect();
    let drift = ((remote_memory as f64 / ds.manifest.mean_sample_bytes) as u64).max(64);
    let slow_served = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..NODES)
        .map(|r| {
            let (ds, cfg, slow) = (ds.clone(), cfgs[r as usize].clone(), slow_served.clone());
            std::thread::spawn(move || {
                let mut l =
                    NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
                let (mut served, mut max_lead) = (0u64, 0u64);
                while let Some(b) = l.next_batch().map_err(|e| e.to_string())? {
                    served += b.len() as u64;
                    if r == 2 {
                        slow.store(served, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(100));
                    } else {
                        max_lead = max_lead.max(served.saturating_sub(slow.load(Ordering::SeqCst)));
                    }
                }
                Ok::<_, String>((served, max_lead, l.metrics()))
            })
        })
        .collect();
    let steps = N / NODES as u64;
    for (rank, h) in handles.into_iter().enumerate() {
        let (served, lead, m) = h.join().expect("thread").expect("node");
        assert_eq!(served, steps, "rank {rank}");
        // The window of a consumer (remote_memory), the drift limit, a
        // batch, and what readahead and credit batching let through.
        let slack = 100;
        assert!(
            lead <= drift + slack,
            "rank {rank} ran {lead} steps ahead of the slow rank (limit {drift} + {slack}; the epoch has {steps})"
        );
        assert!(m.owner_peak_bytes > 0, "rank {rank}: {m:?}");
    }
}
