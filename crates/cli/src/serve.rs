//! `brand serve`: runs one node of a multi-node job (DESIGN.md §6) and reads
//! epochs through it (or stops after `--batches`, as a job stopped at a
//! step), reporting per epoch what this node served, read, pushed and
//! received, and how often it waited.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use brand_format::Error;
use brand_loader::{LoaderState, Metrics};
use brand_nodes::NodeLoader;
use brand_reader::Config;

use crate::configure::{Flag, resolve};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    dataset: PathBuf,
    /// A configuration (TOML: the loader's keys and nodes, remote_memory,
    /// peer_timeout, job); the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Every node's host:port, in rank order (else BRAND_NODES or TF_CONFIG).
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    /// This node's index in --nodes.
    #[arg(long)]
    rank: Option<u32>,
    /// Memory budget per rank: bytes ("4GiB") or a percentage ("10%").
    #[arg(long)]
    memory: Option<String>,
    /// Pushed samples held ahead of use ("256MiB").
    #[arg(long)]
    remote_memory: Option<String>,
    /// A peer silent or unreachable this long is an error ("30s").
    #[arg(long)]
    peer_timeout: Option<String>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    batch: Option<usize>,
    /// whole, auto, or a byte count ("16KiB").
    #[arg(long)]
    read_gap: Option<String>,
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Stop after this many batches in all (a job stopped at a step), then
    /// close: the node still serves its peers what they are owed.
    #[arg(long)]
    batches: Option<u64>,
    /// Milliseconds the consumer spends on each batch before asking for the
    /// next (a training step's compute). 0: it takes batches as they come.
    #[arg(long, default_value_t = 0.0)]
    compute_ms: f64,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct EpochReport {
    epoch: u64,
    rank: u32,
    samples: u64,
    seconds: f64,
    samples_per_sec: f64,
    /// On-demand waits (a sample not yet read or pushed when asked for) in
    /// this epoch, and those after its first batch: once the pipeline is
    /// warm, the push from the known plan should leave none.
    stalls: u64,
    stalls_warm: u64,
    /// How long the epoch's first batch was waited for (in the first
    /// epoch: the start's first fill, every owner's).
    first_batch_wait_secs: f64,
    /// Cumulative since the node opened.
    metrics: Metrics,
}

#[derive(Debug, Serialize)]
struct ServeReport {
    epochs: Vec<EpochReport>,
    /// Totals once the node closed (after serving what its peers were owed).
    closed: Metrics,
    /// How long closing took: waiting until the peers had what this node
    /// owed them (a node that finishes first waits for the others).
    close_secs: f64,
}

fn config(a: &ServeArgs) -> brand_format::Result<Config> {
    resolve(
        a.config.as_deref(),
        &[
            ("nodes", Flag::List(&a.nodes)),
            ("rank", Flag::Int(a.rank.map(u64::from))),
            ("memory", Flag::Text(&a.memory)),
            ("remote_memory", Flag::Text(&a.remote_memory)),
            ("peer_timeout", Flag::Text(&a.peer_timeout)),
            ("read_gap", Flag::Text(&a.read_gap)),
            ("seed", Flag::Int(a.seed)),
            ("batch_size", Flag::Int(a.batch.map(|b| b as u64))),
        ],
        true,
    )
}

pub fn run(a: &ServeArgs) -> brand_format::Result<()> {
    let mut cfg = config(a)?;
    // The next epoch is credited early, but none past the last.
    cfg.nodes.last_epoch = Some(a.epochs.saturating_sub(1));
    let compute = Duration::try_from_secs_f64(a.compute_ms / 1e3)
        .map_err(|_| Error::config(format!("--compute-ms {}: expected milliseconds ≥ 0", a.compute_ms)))?;
    // A partition (`brand pack --partitions`) is this node's share.
    let ds = Arc::new(brand_store::open_any_with(
        &a.dataset,
        &cfg.loader.io.store.get_policy(),
    )?);
    let rank = cfg.nodes.rank;
    // A node keeps its plan: run_length auto plans 1 on every node alike.
    let loader = brand_reader::decide(&ds, &cfg.loader, brand_reader::Opening::Keeps)?;
    let mut node = NodeLoader::open(ds, &loader, &cfg.nodes, LoaderState::default())?;
    if !a.json {
        println!(
            "{} of {}: policy {}, memory {} per rank, remote memory {} bytes",
            cfg.nodes.name(rank),
            cfg.nodes.world(),
            cfg.loader.plan.policy,
            cfg.loader.plan.memory,
            cfg.nodes.remote_memory
        );
    }
    let mut reports = Vec::new();
    let mut batches_left = a.batches.unwrap_or(u64::MAX);
    for epoch in 0..a.epochs {
        if batches_left == 0 {
            break;
        }
        let start = Instant::now();
        let stalls_before = node.metrics().stalls;
        let mut stalls_warm_from = None;
        let mut samples = 0u64;
        let mut first_batch_wait_secs = None;
        while batches_left > 0 {
            let Some(batch) = node.next_batch()? else { break };
            first_batch_wait_secs.get_or_insert_with(|| start.elapsed().as_secs_f64());
            batches_left -= 1;
            stalls_warm_from.get_or_insert_with(|| node.metrics().stalls);
            for s in batch.iter() {
                std::hint::black_box(s.data.first());
            }
            samples += batch.len() as u64;
            drop(batch);
            if !compute.is_zero() {
                std::thread::sleep(compute);
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let metrics = node.metrics();
        let r = EpochReport {
            epoch,
            rank,
            samples,
            seconds,
            samples_per_sec: samples as f64 / seconds,
            stalls: metrics.stalls - stalls_before,
            stalls_warm: metrics.stalls - stalls_warm_from.unwrap_or(metrics.stalls),
            first_batch_wait_secs: first_batch_wait_secs.unwrap_or(0.0),
            metrics,
        };
        if !a.json {
            let m = &r.metrics;
            println!(
                "epoch {}: {} samples in {:.2}s ({:.0}/s); {} waits ({} after the first batch); read {:.1} MB; pushed {} ({:.1} MB), received {} ({:.1} MB), local {}; {} stalls in all ({:.3}s, p50 {:.2} ms, p99 {:.2} ms); remote memory peak {:.1} MB, owner peak {:.1} MB",
                r.epoch,
                r.samples,
                r.seconds,
                r.samples_per_sec,
                r.stalls,
                r.stalls_warm,
                m.bytes_read as f64 / 1e6,
                m.samples_pushed,
                m.bytes_pushed as f64 / 1e6,
                m.samples_received,
                m.bytes_received as f64 / 1e6,
                m.samples_local,
                m.stalls,
                m.stall_secs_total,
                m.stall_p50_secs * 1e3,
                m.stall_p99_secs * 1e3,
                m.remote_memory_peak as f64 / 1e6,
                m.owner_peak_bytes as f64 / 1e6
            );
        }
        reports.push(r);
    }
    // Waits until the peers have what this node owed them.
    let closing = Instant::now();
    let closed = node.close();
    let close_secs = closing.elapsed().as_secs_f64();
    if a.json {
        let out = ServeReport {
            epochs: reports,
            closed,
            close_secs,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| Error::config(e.to_string()))?
        );
    } else {
        println!(
            "closed: read {:.1} MB in total, pushed {} samples, received {}",
            closed.bytes_read as f64 / 1e6,
            closed.samples_pushed,
            closed.samples_received
        );
    }
    Ok(())
}
