//! Epoch boundaries: a node credits the next epoch's first steps while its
//! consumer finishes the current one, so a consumer that computes finds the
//! next epoch's first batch already pushed; each epoch is still served once,
//! in the plan's order, and nothing of an epoch past `last_epoch` is read.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::{LoaderState, Metrics};
use brand_nodes::NodeLoader;
use brand_plan::Planner;
use common::Config;

mod common;
use common::{Served, addresses, global_read_bytes, node_config, run_ranks_serving_their_plans};

const SAMPLES: u64 = 600;
const NODES: usize = 3;

/// What the consumer computes on the epoch's last batch: long enough for
/// the peers' pushes to arrive over loopback on a busy machine.
const LAST_STEP: Duration = Duration::from_millis(400);

fn dataset(root: &std::path::Path) -> Arc<Dataset> {
    let dir = small_dataset(root, SAMPLES).expect("gen and pack");
    Arc::new(Dataset::open(dir).expect("open"))
}

/// Serves 2 epochs, each batch followed by some compute (the last of epoch
/// 0 by `LAST_STEP`), and records the on-demand waits of epoch 1's first
/// batch in `first_batch_waits`.
fn serve_computing(
    ds: Arc<Dataset>,
    cfg: Config,
    all_done: Arc<Barrier>,
    first_batch_waits: Arc<Mutex<Vec<u64>>>,
) -> Result<(Served, Metrics), String> {
    let mut l = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default()).map_err(|e| e.to_string())?;
    let mut out: Served = Vec::new();
    for epoch in 0..2 {
        let mut served = Vec::new();
        loop {
            let before = l.metrics().stalls;
            let Some(b) = l.next_batch().map_err(|e| e.to_string())? else {
                break;
            };
            if epoch == 1 && served.is_empty() {
                first_batch_waits
                    .lock()
                    .expect("lock")
                    .push(l.metrics().stalls - before);
            }
            served.extend(b.iter().map(|s| (s.id, s.data.to_vec())));
            std::thread::sleep(Duration::from_millis(1));
        }
        if epoch == 0 {
            std::thread::sleep(LAST_STEP);
        }
        out.push(served);
    }
    all_done.wait();
    let m = l.metrics();
    Ok((out, m))
}

fn run(ds: &Arc<Dataset>, last_epoch: Option<u64>) -> (Vec<u64>, Vec<Metrics>) {
    let nodes = addresses(NODES);
    let cfgs: Vec<Config> = (0..NODES as u32)
        .map(|r| {
            let mut c = node_config(&nodes, r, "epochs");
            c.nodes.remote_memory = 256 << 10;
            c.nodes.last_epoch = last_epoch;
            c
        })
        .collect();
    let waits = Arc::new(Mutex::new(Vec::new()));
    let (node_ds, node_waits) = (ds.clone(), waits.clone());
    let results = run_ranks_serving_their_plans(&cfgs, ds, SAMPLES, move |_, c, b| {
        serve_computing(node_ds.clone(), c, b, node_waits.clone())
    });
    let waits = waits.lock().expect("lock").clone();
    (waits, results.into_iter().map(|(_, m)| m).collect())
}

#[test]
fn the_next_epochs_first_batch_is_pushed_before_the_consumer_asks() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let (waits, metrics) = run(&ds, Some(1));
    assert_eq!(
        waits,
        vec![0; NODES],
        "on-demand waits in epoch 1's first batch, per node"
    );
    // Nothing of epoch 2 (past the last) was read or pushed: each chunk of
    // epochs 0 and 1 read once, by its owner, and every push served.
    let planner = Planner::new(&ds.index, &node_config(&addresses(NODES), 0, "x").loader.plan).expect("plan");
    let read: u64 = metrics.iter().map(|m| m.bytes_read).sum();
    assert_eq!(read, global_read_bytes(&ds, &planner, 2, |_| true), "bytes read");
    let pushed: u64 = metrics.iter().map(|m| m.samples_pushed).sum();
    let received: u64 = metrics.iter().map(|m| m.samples_received).sum();
    assert_eq!(pushed, received, "every push served once");
}

#[test]
fn without_early_credit_the_next_epochs_first_batch_waits() {
    // The control: with no epoch after 0 credited early (last_epoch 0, as
    // before this was built), epoch 1 is credited only when the consumer
    // asks for it, so its first batch waits for pushes, however long the
    // consumer computed. This is what the test above would see without it.
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let (waits, _) = run(&ds, Some(0));
    assert_eq!(waits.len(), NODES);
    assert!(
        waits.iter().all(|&w| w > 0),
        "waits in epoch 1's first batch: {waits:?}"
    );
}
