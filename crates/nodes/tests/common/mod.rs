//! Shared by the multi-node tests: loopback addresses, a node's config,
//! the single-process plan's order, and running and checking epochs.

#![allow(dead_code)] // each test file uses some of it

use std::sync::{Arc, Barrier};
use std::time::Duration;

use brand_format::Dataset;
use brand_loader::{LoaderConfig, Metrics, ReadGapSetting};
use brand_nodes::{NodeConfig, NodeLoader};
use brand_plan::{Event, Memory, Planner};

/// Ids and bytes a node served, per epoch.
#[allow(unused_imports)] // not every test binary starts nodes
pub use brand_testkit::addresses;

pub type Served = Vec<Vec<(u64, Vec<u8>)>>;

/// What a node opens with: the loader's configuration and the multi-node
/// one (an interface has both from `brand_reader::Config::resolve`).
#[derive(Debug, Clone)]
pub struct Config {
    pub loader: LoaderConfig,
    pub nodes: NodeConfig,
}

/// Node `rank` of `nodes` (world 1 when empty): 64 slots, seed 7, batches
/// of 10, whole-chunk reads, 256 KiB read-ahead, 64 KiB remote memory,
/// a 20 s peer timeout; tests change what they are about.
pub fn node_config(nodes: &[String], rank: u32, job: &str) -> Config {
    let mut loader = LoaderConfig::default();
    loader.plan.memory = Memory::Slots(64);
    loader.plan.world = nodes.len().max(1) as u32;
    loader.plan.rank = rank;
    loader.plan.seed = 7;
    loader.batch_size = 10;
    loader.io.read_gap = ReadGapSetting::Whole;
    loader.readahead_bytes = 256 << 10;
    Config {
        loader,
        nodes: NodeConfig {
            nodes: nodes.to_vec(),
            rank,
            remote_memory: 64 << 10,
            peer_timeout: Duration::from_secs(20),
            job: job.into(),
            last_epoch: None,
        },
    }
}

/// The samples the single-process plan of `cfg` serves in `epoch`, in order.
pub fn plan_order(ds: &Dataset, cfg: &Config, epoch: u64) -> Vec<u64> {
    let mut planner = Planner::new(&ds.index, &cfg.loader.plan).expect("planner");
    planner
        .seek(epoch, 0)
        .expect("plan")
        .filter_map(|e| match e {
            Event::Serve { sample, .. } => Some(sample),
            Event::Read { .. } => None,
        })
        .collect()
}

/// Serves `epochs` epochs of `l`, keeping what each served.
pub fn serve_epochs(l: &mut NodeLoader, epochs: u64) -> Result<Served, String> {
    let mut out = Vec::new();
    for _ in 0..epochs {
        let mut epoch = Vec::new();
        while let Some(b) = l.next_batch().map_err(|e| e.to_string())? {
            epoch.extend(b.iter().map(|s| (s.id, s.data.to_vec())));
        }
        out.push(epoch);
    }
    Ok(out)
}

/// Every rank served its single-process plan's order, with the bytes of
/// `ds`, and together each epoch's `samples` exactly once.
pub fn assert_ranks_serve_their_plans(served: &[&Served], cfgs: &[Config], ds: &Dataset, samples: u64) {
    let epochs = served.first().map_or(0, |s| s.len());
    for epoch in 0..epochs {
        let mut all = Vec::new();
        for (rank, s) in served.iter().enumerate() {
            let ids: Vec<u64> = s[epoch].iter().map(|x| x.0).collect();
            assert_eq!(
                ids,
                plan_order(ds, &cfgs[rank], epoch as u64),
                "rank {rank} epoch {epoch}: the single-process plan's order"
            );
            for (id, bytes) in &s[epoch] {
                assert_eq!(bytes, &ds.read_sample(*id).expect("source"), "sample {id}");
            }
            all.extend(ids);
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..samples).collect::<Vec<_>>(),
            "epoch {epoch}: every sample once"
        );
    }
}

/// Runs rank `r` of `cfgs` as `run(r, cfgs[r], all_done)` on a thread of its
/// own (`all_done`: a barrier of every rank), waits for them all, and checks
/// with [`assert_ranks_serve_their_plans`] that they served their plans with
/// the bytes of `ds`; what each rank served and its metrics.
pub fn run_ranks_serving_their_plans<F>(cfgs: &[Config], ds: &Dataset, samples: u64, run: F) -> Vec<(Served, Metrics)>
where
    F: Fn(usize, Config, Arc<Barrier>) -> Result<(Served, Metrics), String> + Send + Sync + 'static,
{
    let run = Arc::new(run);
    let all_done = Arc::new(Barrier::new(cfgs.len()));
    let handles: Vec<_> = cfgs
        .iter()
        .cloned()
        .enumerate()
        .map(|(r, c)| {
            let (run, b) = (run.clone(), all_done.clone());
            std::thread::spawn(move || run(r, c, b))
        })
        .collect();
    let results: Vec<(Served, Metrics)> = handles
        .into_iter()
        .map(|h| h.join().expect("thread").expect("node"))
        .collect();
    let served: Vec<&Served> = results.iter().map(|(s, _)| s).collect();
    assert_ranks_serve_their_plans(&served, cfgs, ds, samples);
    results
}

/// The bytes the global protocol of `planner` reads in epochs `0..epochs`
/// with whole-chunk reads, counting only chunks `keep` accepts.
pub fn global_read_bytes(ds: &Dataset, planner: &Planner, epochs: u64, keep: impl Fn(u64) -> bool) -> u64 {
    (0..epochs)
        .flat_map(|e| planner.global_epoch(e).reads().to_vec())
        .map(|r| r.chunk as u64)
        .filter(|&c| keep(c))
        .map(|c| ds.index.chunk_padded_len(c))
        .sum()
}
