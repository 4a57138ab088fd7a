//! `brand serve`: runs one node of a multi-node job (DESIGN.md §6) and reads
//! epochs through it, reporting per epoch what this node served, read,
//! pushed and received, and how often it waited.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use brand_format::{Dataset, Error};
use brand_loader::LoaderState;
use brand_nodes::{Config, NodeLoader, NodeMetrics};

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
    /// Cumulative since the node opened.
    metrics: NodeMetrics,
}

#[derive(Debug, Serialize)]
struct ServeReport {
    epochs: Vec<EpochReport>,
    /// Totals once the node closed (after serving what its peers were owed).
    closed: NodeMetrics,
}

fn config(a: &ServeArgs) -> brand_format::Result<Config> {
    let text = match &a.config {
        Some(p) => std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?,
        None => String::new(),
    };
    let mut t: toml::Table = toml::from_str(&text).map_err(|e| {
        Error::config(format!(
            "{}: {}",
            a.config.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            e.message().trim()
        ))
    })?;
    let mut set = |k: &str, v: Option<toml::Value>| {
        if let Some(v) = v {
            t.insert(k.to_string(), v);
        }
    };
    let string = |v: &Option<String>| v.clone().map(toml::Value::String);
    set(
        "nodes",
        (!a.nodes.is_empty()).then(|| toml::Value::Array(a.nodes.iter().cloned().map(toml::Value::String).collect())),
    );
    set("rank", a.rank.map(|r| toml::Value::Integer(r as i64)));
    set("memory", string(&a.memory));
    set("remote_memory", string(&a.remote_memory));
    set("peer_timeout", string(&a.peer_timeout));
    set("read_gap", string(&a.read_gap));
    set("seed", a.seed.map(|s| toml::Value::Integer(s as i64)));
    set("batch_size", a.batch.map(|b| toml::Value::Integer(b as i64)));
    let (loader, dist) = brand_nodes::config::from_table(t, &|k| std::env::var(k).ok())?;
    Ok(Config { loader, nodes: dist })
}

pub fn run(a: &ServeArgs) -> brand_format::Result<()> {
    let cfg = config(a)?;
    // A partition (`brand pack --partitions`) is this node's share.
    let ds = Arc::new(Dataset::open_any(&a.dataset)?);
    let rank = cfg.nodes.rank;
    let mut node = NodeLoader::open(ds, &cfg, LoaderState::default())?;
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
    for epoch in 0..a.epochs {
        let start = Instant::now();
        let mut samples = 0u64;
        while let Some(batch) = node.next_batch()? {
            for s in batch.iter() {
                std::hint::black_box(s.data.first());
            }
            samples += batch.len() as u64;
        }
        let seconds = start.elapsed().as_secs_f64();
        let r = EpochReport {
            epoch,
            rank,
            samples,
            seconds,
            samples_per_sec: samples as f64 / seconds,
            metrics: node.metrics(),
        };
        if !a.json {
            let m = &r.metrics;
            println!(
                "epoch {}: {} samples in {:.2}s ({:.0}/s); read {:.1} MB; pushed {} ({:.1} MB), received {} ({:.1} MB), local {}; {} stalls ({:.3}s, p50 {:.2} ms, p99 {:.2} ms); remote memory peak {:.1} MB, owner peak {:.1} MB",
                r.epoch,
                r.samples,
                r.seconds,
                r.samples_per_sec,
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
    let closed = node.close();
    if a.json {
        let out = ServeReport {
            epochs: reports,
            closed,
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
