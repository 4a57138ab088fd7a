//! Elastic resume of a multi-node job: 3 nodes on loopback stop at one
//! global step, and 2 nodes continue from their 3 states the same global
//! order, every sample of the epoch once, bytes equal to the source.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_loader::elastic::SavedWorld;
use brand_nodes::NodeLoader;
use brand_plan::Memory;
use common::Config;

mod common;
use common::{addresses, node_config, plan_order};

const SAMPLES: u64 = 600;
/// 3 nodes × 64 slots = 2 × 96 = 1 × 192.
const TOTAL_SLOTS: u64 = 192;

fn config(nodes: &[String], rank: u32, slots: u64) -> Config {
    let mut cfg = node_config(nodes, rank, "elastic");
    cfg.loader.plan.memory = Memory::Slots(slots);
    cfg.loader.plan.seed = 9;
    cfg.loader.batch_size = 15;
    // Also how long the first nodes' close waits for peers that stopped
    // with them.
    cfg.nodes.peer_timeout = Duration::from_secs(5);
    cfg
}

/// The uninterrupted global sequence of epoch 0: one rank with all the memory.
fn global_order(ds: &Dataset) -> Vec<u64> {
    plan_order(ds, &config(&[], 0, TOTAL_SLOTS), 0)
}

#[test]
fn three_nodes_resume_on_two_continuing_the_global_order() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), SAMPLES).expect("pack")).expect("open"));
    let global = global_order(&ds);

    // 3 nodes serve 3 batches of 15 each (global positions 0..135), then stop together.
    let nodes = addresses(3);
    let stop = Arc::new(Barrier::new(3));
    let first: Vec<_> = (0..3)
        .map(|r| {
            let (ds, cfg, stop) = (ds.clone(), config(&nodes, r, TOTAL_SLOTS / 3), stop.clone());
            std::thread::spawn(move || {
                let mut l =
                    NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
                let mut ids = Vec::new();
                for _ in 0..3 {
                    let b = l.next_batch().map_err(|e| e.to_string())?.ok_or("early end")?;
                    ids.extend(b.iter().map(|s| s.id));
                }
                let state = l.state();
                stop.wait();
                Ok::<_, String>((ids, state))
            })
        })
        .collect();
    let mut served = Vec::new();
    let mut states = Vec::new();
    for h in first {
        let (ids, state) = h.join().expect("thread").expect("node");
        served.extend(ids);
        states.push(state);
    }
    assert!(states.iter().all(|s| *s == LoaderState { epoch: 0, served: 45 }));
    let saved = SavedWorld {
        plan: config(&nodes, 0, TOTAL_SLOTS / 3).loader.plan,
        states,
    };

    // 2 nodes, same total memory. 135 is odd: node 0 starts at step 68
    // (position 136), node 1 at step 67 (position 135).
    let nodes = addresses(2);
    let second: Vec<_> = (0..2)
        .map(|r| {
            let (ds, cfg, saved) = (ds.clone(), config(&nodes, r, TOTAL_SLOTS / 2), saved.clone());
            std::thread::spawn(move || {
                let mut l = NodeLoader::open_elastic(ds, &cfg.loader, &cfg.nodes, &saved).map_err(|e| e.to_string())?;
                let start = l.state();
                let mut got = Vec::new();
                while let Some(b) = l.next_batch().map_err(|e| e.to_string())? {
                    got.extend(b.iter().map(|s| (s.id, s.data.to_vec())));
                }
                Ok::<_, String>((start, got, l.state()))
            })
        })
        .collect();
    let results: Vec<_> = second
        .into_iter()
        .map(|h| h.join().expect("thread").expect("node"))
        .collect();
    let starts: Vec<u64> = results.iter().map(|r| r.0.served).collect();
    assert_eq!(starts, [68, 67]);
    for (r, (start, got, end)) in results.iter().enumerate() {
        assert_eq!(
            *end,
            LoaderState { epoch: 1, served: 0 },
            "node {r} ran to the epoch's end"
        );
        for (i, (id, bytes)) in got.iter().enumerate() {
            let p = r as u64 + 2 * (start.served + i as u64);
            assert_eq!(*id, global[p as usize], "node {r}: global position {p}");
            assert_eq!(bytes, &ds.read_sample(*id).expect("source"), "sample {id}");
        }
        served.extend(got.iter().map(|s| s.0));
    }
    served.sort_unstable();
    assert_eq!(served, (0..SAMPLES).collect::<Vec<_>>(), "the epoch exactly once");
}

#[test]
fn a_node_resumed_with_other_total_memory_is_refused_before_it_listens() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), SAMPLES).expect("pack")).expect("open"));
    let nodes = addresses(2);
    let saved = SavedWorld {
        plan: config(&addresses(3), 0, 64).loader.plan,
        states: vec![LoaderState { epoch: 0, served: 45 }; 3],
    };
    let cfg = config(&nodes, 0, 64);
    let e = match NodeLoader::open_elastic(ds, &cfg.loader, &cfg.nodes, &saved) {
        Ok(_) => panic!("opened"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("192 slots saved") && e.contains("128 slots now") && e.contains("\"96 slots\""),
        "{e}"
    );
}
