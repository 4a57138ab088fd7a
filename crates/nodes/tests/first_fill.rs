//! An owner's start: its first fill's large reads fetched record by record
//! in serve order (`first_fill`). Every rank still serves its single-process
//! plan's order with every byte equal and every sample once per epoch, on
//! two and three nodes, from the start and from a resume mid-epoch; exactly
//! the start's reads of ≥ 1 MiB up to a memory's worth are split, and only
//! in the epoch a node starts at; whole chunks asked for are never split.

mod common;

use std::sync::Arc;

use brand_format::Dataset;
use brand_format::extents::{ReadGap, extents};
use brand_import::synthetic::large_dataset;
use brand_loader::{LoaderState, Metrics, ReadGapSetting};
use brand_nodes::NodeLoader;
use brand_nodes::routes::{OwnerPlan, Ownership};
use brand_plan::{Memory, Planner};
use common::Config;
use common::{Served, addresses, node_config, plan_order, run_ranks_serving_their_plans, serve_epochs};

const SAMPLES: u64 = 480;

/// Chunks of 32 samples of 96 KiB (3 MiB): an owner's first reads are above
/// the 1 MiB a read must reach to be split.
fn large_chunks(root: &std::path::Path) -> Arc<Dataset> {
    Arc::new(Dataset::open(large_dataset(root, SAMPLES, 32).expect("pack")).expect("open"))
}

fn config(nodes: &[String], rank: u32, gap: ReadGapSetting) -> Config {
    let mut cfg = node_config(nodes, rank, "first-fill");
    cfg.loader.plan.memory = Memory::Percent(20.0);
    cfg.loader.io.read_gap = gap;
    cfg.loader.readahead_bytes = 8 << 20;
    cfg.nodes.remote_memory = 2 << 20;
    cfg
}

/// The reads `node` splits in the epoch it starts at (`from_step` on): its
/// plan reads in order, each of several records and at least 1 MiB (gap 0:
/// each record its own extent), until a memory's worth was split.
fn expected_splits(ds: &Dataset, cfg: &Config, node: u32, epoch: u64, from_step: u64) -> u64 {
    let planner = Planner::new(&ds.index, &cfg.loader.plan).expect("planner");
    let plan = OwnerPlan::new(&planner, &Ownership::of_plan(&planner), epoch, node, from_step);
    let budget = planner.geometry().rank_memory_bytes;
    let (mut split, mut bytes) = (0, 0);
    for r in &plan.reads {
        let b: u64 = extents(&ds.index, r.chunk, r.mask, ReadGap::Bytes(0))
            .iter()
            .map(|e| e.len)
            .sum();
        if bytes < budget && r.deliveries.len() > 1 && b >= 1 << 20 {
            split += 1;
            bytes += b;
        }
    }
    split
}

fn run_node(ds: Arc<Dataset>, mut cfg: Config, epochs: u64) -> Result<(Served, Metrics), String> {
    cfg.nodes.last_epoch = Some(epochs - 1);
    let mut l = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
    let served = serve_epochs(&mut l, 1)?;
    let first = l.metrics();
    let rest = serve_epochs(&mut l, epochs - 1)?;
    let after = l.metrics();
    assert_eq!(
        after.reads_deferred, first.reads_deferred,
        "rank {}: none split after the start's epoch",
        cfg.nodes.rank
    );
    Ok((served.into_iter().chain(rest).collect(), first))
}

#[test]
fn nodes_serve_their_plans_once_with_the_starts_large_reads_split() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = large_chunks(t.path());
    for world in [2, 3] {
        for gap in [ReadGapSetting::Bytes(0), ReadGapSetting::Whole] {
            let nodes = addresses(world);
            let cfgs: Vec<Config> = (0..world as u32).map(|r| config(&nodes, r, gap)).collect();
            let node_ds = ds.clone();
            let results =
                run_ranks_serving_their_plans(&cfgs, &ds, SAMPLES, move |_, c, _| run_node(node_ds.clone(), c, 2));
            let mut all_reads = 0;
            for (rank, (_, m)) in results.iter().enumerate() {
                let want = match gap {
                    ReadGapSetting::Whole => 0,
                    _ => expected_splits(&ds, &cfgs[rank], rank as u32, 0, 0),
                };
                assert_eq!(m.reads_deferred, want, "world {world} rank {rank} {gap:?}");
                all_reads += m.reads_issued;
            }
            if gap != ReadGapSetting::Whole {
                let split: u64 = results.iter().map(|(_, m)| m.reads_deferred).sum();
                assert!(
                    split > 0 && split < all_reads,
                    "world {world}: {split} of {all_reads} split"
                );
            }
        }
    }
}

#[test]
fn nodes_resumed_mid_epoch_split_their_fill_and_serve_the_rest_of_the_plan() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = large_chunks(t.path());
    let nodes = addresses(2);
    let state = LoaderState { epoch: 1, served: 37 };
    let cfgs: Vec<Config> = (0..2).map(|r| config(&nodes, r, ReadGapSetting::Bytes(0))).collect();
    let handles: Vec<_> = cfgs
        .iter()
        .cloned()
        .map(|mut c| {
            let ds = ds.clone();
            std::thread::spawn(move || {
                c.nodes.last_epoch = Some(1);
                let mut l = NodeLoader::open(ds, &c.loader, &c.nodes, state).map_err(|e| e.to_string())?;
                let served = serve_epochs(&mut l, 1)?;
                Ok::<_, String>((served, l.metrics()))
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let (served, m) = h.join().expect("thread").expect("node");
        let ids: Vec<u64> = served[0].iter().map(|s| s.0).collect();
        assert_eq!(ids, plan_order(&ds, &cfgs[rank], 1)[37..], "rank {rank}");
        for (id, bytes) in &served[0] {
            assert_eq!(bytes, &ds.read_sample(*id).expect("source"), "sample {id}");
        }
        let want = expected_splits(&ds, &cfgs[rank], rank as u32, 1, 37);
        assert!(want > 0, "rank {rank}: the resumed fill has large reads");
        assert_eq!(m.reads_deferred, want, "rank {rank}");
    }
}
