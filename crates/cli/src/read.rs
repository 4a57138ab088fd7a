//! `brand read`: stream epochs through the real engine, discarding the data,
//! and report throughput, read amplification, stalls and memory per epoch.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use brand_cache::{Attached, Served};
use brand_format::Dataset;
use brand_format::ids::IdBits;
use brand_loader::{Loader, LoaderConfig, LoaderState, Metrics};
use brand_plan::order::{OrderMeter, OrderQuality};

use crate::configure::{Flag, resolve};

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    dataset: PathBuf,
    /// A loader configuration (TOML); the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// First epoch (each epoch has its own order).
    #[arg(long, default_value_t = 0)]
    start_epoch: u64,
    #[arg(long)]
    batch: Option<usize>,
    /// Memory budget per rank: bytes ("4GiB") or a percentage of the dataset ("10%").
    #[arg(long)]
    memory: Option<String>,
    /// brand, brand-random, direct, chunk-shuffle, sequential or tiered (with --disk-cache-limit: the tier's pinned chunks spread over the epoch, the rest read whole once).
    #[arg(long)]
    policy: Option<String>,
    /// whole, auto, or a byte count ("16KiB").
    #[arg(long)]
    read_gap: Option<String>,
    /// Brand policies: refill records in runs of this many neighbours, each
    /// run one request: auto (from the read gap) or 1..=64.
    #[arg(long)]
    run_length: Option<String>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    queue_depth: Option<usize>,
    /// Bytes of planned reads in flight ahead of consumption ("64MiB").
    #[arg(long)]
    readahead: Option<String>,
    #[arg(long)]
    rank: Option<u32>,
    #[arg(long)]
    world: Option<u32>,
    /// auto (io_uring, threads where refused), uring or threads.
    #[arg(long)]
    io_backend: Option<String>,
    /// Threads verifying and decompressing compressed records read by io_uring
    /// (0: on the io thread; uncompressed records are always checked there).
    /// Default: the cores the (at most 2) io threads leave, at most 8.
    #[arg(long)]
    decode_threads: Option<usize>,
    /// Attach to the `brand cache` at this socket instead of reading storage.
    #[arg(long)]
    cache: Option<String>,
    /// A dataset at a URL: ranged GETs in flight, "auto" (the default:
    /// sized as they complete, enough to fill the link) or at most 1..=1024.
    #[arg(long)]
    gets_in_flight: Option<String>,
    /// A dataset at a URL: neighbouring reads merge into GETs of at most this ("8MiB").
    #[arg(long)]
    get_size: Option<String>,
    /// A dataset at a URL: keep its chunks in this directory on a local
    /// disk (a tier the machine's processes share: each chunk fetched once).
    #[arg(long, value_name = "DIR")]
    disk_cache: Option<String>,
    /// The most the --disk-cache directory holds: bytes ("500GiB") or a
    /// share of the dataset ("50%"). Default: its disk, leaving 10 % free.
    #[arg(long, value_name = "BYTES|PCT")]
    disk_cache_limit: Option<String>,
    /// Milliseconds the consumer spends on each batch before asking for the
    /// next (a training step's compute), to see which reads the loader hides
    /// behind it. 0: the consumer takes batches as fast as they come.
    #[arg(long, default_value_t = 0.0)]
    compute_ms: f64,
    /// Skip the order-quality metrics: they keep two epochs' positions,
    /// 8 bytes a sample, which a memory measurement should not count.
    #[arg(long)]
    no_order: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: crate::configure::StoreFlags,
}

#[derive(Debug, Serialize)]
pub struct EpochReport {
    pub epoch: u64,
    pub samples: u64,
    pub seconds: f64,
    pub samples_per_sec: f64,
    pub useful_mb_per_sec: f64,
    pub read_mb_per_sec: f64,
    pub read_amplification: f64,
    /// Every sample of the dataset served exactly once (single rank only).
    pub exactly_once: Option<bool>,
    pub peak_rss_bytes: Option<u64>,
    /// The process's anonymous memory at the epoch's end (its heap: not the
    /// mapped index or libraries), and how much of it is this command's own
    /// measuring (a bit a sample for `exactly_once`, and two epochs'
    /// positions, 8 bytes a sample, for `order` unless `--no-order`), which
    /// a training job does not hold.
    pub anon_bytes: Option<u64>,
    pub meter_bytes: u64,
    /// Of the first epoch read: seconds from the start of opening the
    /// dataset (index mapped and checked, manifest read) to a loader ready
    /// to be asked (its first plan made); the first batch came
    /// `first_batch_wait_secs` later.
    pub open_secs: Option<f64>,
    /// Seconds the consumer waited for the epoch's first batch.
    pub first_batch_wait_secs: f64,
    /// P99 and max of the waits for the epoch's other batches.
    pub batch_wait_p99_secs: f64,
    pub batch_wait_max_secs: f64,
    /// CPU time (user + system) the whole process spent during the epoch:
    /// the consumer's, the engine's and the planning threads'.
    pub cpu_seconds: f64,
    /// How random the epoch's served order was (`brand simulate`'s
    /// metrics, measured on the batches as they came; none with `--no-order`).
    pub order: OrderQuality,
    pub metrics: Metrics,
}

/// The loader configuration of the file and the flags (one process: a
/// configuration that makes this process a node is refused).
fn config(a: &ReadArgs) -> brand_format::Result<LoaderConfig> {
    let int = |v: Option<usize>| Flag::Int(v.map(|n| n as u64));
    let c = resolve(
        a.config.as_deref(),
        &[
            ("batch_size", int(a.batch)),
            ("memory", Flag::Text(&a.memory)),
            ("policy", Flag::Text(&a.policy)),
            ("seed", Flag::Int(a.seed)),
            ("rank", Flag::Int(a.rank.map(u64::from))),
            ("world", Flag::Int(a.world.map(u64::from))),
            ("readahead", Flag::Text(&a.readahead)),
            ("queue_depth", int(a.queue_depth)),
            ("read_gap", Flag::Text(&a.read_gap)),
            ("run_length", Flag::Text(&a.run_length)),
            ("io_backend", Flag::Text(&a.io_backend)),
            ("decode_threads", int(a.decode_threads)),
            ("cache", Flag::Text(&a.cache)),
            ("gets_in_flight", Flag::Text(&a.gets_in_flight)),
            ("get_size", Flag::Text(&a.get_size)),
            ("disk_cache", Flag::Text(&a.disk_cache)),
            ("disk_cache_limit", Flag::Text(&a.disk_cache_limit)),
        ]
        .into_iter()
        .chain(a.store.keys())
        .collect::<Vec<_>>(),
        true,
    )?;
    if c.nodes.world() > 1 {
        return Err(brand_format::Error::config(format!(
            "this configuration makes a node of a {}-node job (nodes, BRAND_NODES or TF_CONFIG): brand read reads in one process; run nodes with brand serve",
            c.nodes.world()
        )));
    }
    Ok(c.loader)
}

/// What `brand read` reads from: its own loader, or the cache the
/// configuration's `cache` key names.
enum Source {
    Alone(Box<Loader>),
    Attached(Box<Attached>),
}

impl Source {
    /// Reads epochs `epochs.start` on; no read-ahead past `epochs.end`.
    fn open(ds: Arc<Dataset>, cfg: &LoaderConfig, epochs: std::ops::Range<u64>) -> brand_format::Result<Self> {
        let epoch = epochs.start;
        Ok(match &cfg.cache {
            Some(socket) => {
                let ids = IdBits::new(ds.index.samples());
                Source::Attached(Box::new(Attached::open(ds, cfg, socket, Served { epoch, ids })?))
            }
            None => {
                let cfg = brand_reader::decide(&ds, cfg, brand_reader::Opening::Reads)?;
                let mut loader = Loader::open(ds, &cfg, LoaderState { epoch, served: 0 })?;
                loader.set_last_epoch(epochs.end.checked_sub(1));
                Source::Alone(Box::new(loader))
            }
        })
    }

    fn next_batch(&mut self) -> brand_format::Result<Option<brand_loader::Batch>> {
        match self {
            Source::Alone(l) => l.next_batch(),
            Source::Attached(a) => a.next_batch(),
        }
    }

    fn metrics(&self) -> Metrics {
        match self {
            Source::Alone(l) => l.metrics(),
            Source::Attached(a) => a.metrics(),
        }
    }

    fn reset_metrics(&mut self) {
        match self {
            Source::Alone(l) => l.reset_metrics(),
            Source::Attached(a) => a.reset_metrics(),
        }
    }
}

/// How [`run_epochs`] reads and measures.
pub struct EpochRun {
    pub start_epoch: u64,
    pub epochs: u64,
    /// Spent on each batch before the next is asked for.
    pub compute: Duration,
    pub progress: bool,
    pub measure_order: bool,
    /// When opening the dataset began (for `open_secs`).
    pub opening: Instant,
}

/// Reads `run.epochs` epochs, spending `run.compute` on each batch; calls
/// `report` after each epoch.
pub fn run_epochs(
    ds: Arc<Dataset>,
    cfg: &LoaderConfig,
    run: EpochRun,
    mut report: impl FnMut(&EpochReport),
) -> brand_format::Result<Vec<EpochReport>> {
    let EpochRun {
        start_epoch,
        epochs,
        compute,
        progress,
        measure_order,
        opening,
    } = run;
    let n = ds.index.samples();
    let mut loader = Source::open(ds.clone(), cfg, start_epoch..start_epoch.saturating_add(epochs))?;
    let mut open_secs = Some(opening.elapsed().as_secs_f64());
    let mut order = measure_order.then(|| OrderMeter::new(&ds.index));
    let mut batch_ids = Vec::new();
    let mut out = Vec::new();
    for epoch in start_epoch..start_epoch + epochs {
        loader.reset_metrics();
        let bar = if progress {
            indicatif::ProgressBar::new(n)
        } else {
            indicatif::ProgressBar::hidden()
        };
        // Served once each: every id inserted, none twice.
        let (mut seen, mut twice) = (brand_format::ids::IdBits::new(n), false);
        let mut samples = 0u64;
        let start = Instant::now();
        let cpu_start = crate::process_stats::cpu_seconds();
        let mut waits = Vec::new();
        loop {
            let asked = Instant::now();
            let Some(batch) = loader.next_batch()? else { break };
            waits.push(asked.elapsed().as_secs_f64());
            batch_ids.clear();
            // Ids and bytes only: a sample's label and key (`Batch::get`) are
            // two more index lookups per sample that a measurement should not pay.
            for (&id, data) in batch.ids().iter().zip(batch.buffers()) {
                twice |= !seen.insert(id);
                if let Some(o) = &mut order {
                    o.served(id, samples + batch_ids.len() as u64);
                }
                batch_ids.push(id);
                // Touch the data so it is really delivered.
                std::hint::black_box(data.first());
            }
            if let Some(o) = &mut order {
                o.batch(&batch_ids);
            }
            samples += batch.len() as u64;
            bar.set_position(samples);
            drop(batch);
            if !compute.is_zero() {
                std::thread::sleep(compute);
            }
        }
        bar.finish_and_clear();
        let secs = start.elapsed().as_secs_f64();
        let cpu_seconds = crate::process_stats::cpu_seconds() - cpu_start;
        let m = loader.metrics();
        let first_batch_wait_secs = waits.first().copied().unwrap_or(0.0);
        let mut rest: Vec<f64> = waits.iter().skip(1).copied().collect();
        rest.sort_by(f64::total_cmp);
        let batch_wait_p99_secs = rest
            .get(((rest.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0);
        let r = EpochReport {
            epoch,
            samples,
            seconds: secs,
            samples_per_sec: samples as f64 / secs,
            useful_mb_per_sec: m.bytes_served as f64 / secs / 1e6,
            read_mb_per_sec: m.bytes_read as f64 / secs / 1e6,
            read_amplification: m.read_amplification(),
            exactly_once: (cfg.plan.world == 1).then(|| !twice && seen.len() == n),
            peak_rss_bytes: crate::process_stats::peak_rss(),
            open_secs: open_secs.take(),
            anon_bytes: crate::process_stats::anon_bytes(),
            meter_bytes: seen.words().len() as u64 * 8 + order.as_ref().map_or(0, OrderMeter::heap_bytes),
            first_batch_wait_secs,
            batch_wait_p99_secs,
            batch_wait_max_secs: rest.last().copied().unwrap_or(0.0),
            cpu_seconds,
            order: order.as_mut().map(OrderMeter::end_epoch).unwrap_or_default(),
            metrics: m,
        };
        report(&r);
        out.push(r);
    }
    Ok(out)
}

pub fn run(a: &ReadArgs) -> brand_format::Result<bool> {
    let cfg = config(a)?;
    let compute = Duration::try_from_secs_f64(a.compute_ms / 1e3).map_err(|_| {
        brand_format::Error::config(format!("--compute-ms {}: expected milliseconds ≥ 0", a.compute_ms))
    })?;
    let opening = Instant::now();
    let ds = Arc::new(brand_store::open_with(&a.dataset, &cfg.io.store.get_policy())?);
    if !a.json {
        match &cfg.cache {
            Some(socket) => println!(
                "{}: {} samples, attached to the cache at {}, batch {}, seed {}",
                a.dataset.display(),
                ds.index.samples(),
                socket.display(),
                cfg.batch_size,
                cfg.plan.seed
            ),
            None => println!(
                "{}: {} samples, policy {}, memory {} per rank, batch {}, read gap {:?}, queue depth {}",
                a.dataset.display(),
                ds.index.samples(),
                cfg.plan.policy,
                cfg.plan.memory,
                cfg.batch_size,
                cfg.io.read_gap,
                cfg.io.queue_depth
            ),
        }
        println!(
            "{:>5} {:>9} {:>8} {:>10} {:>9} {:>9} {:>6} {:>5} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6}",
            "epoch",
            "samples",
            "secs",
            "samples/s",
            "useful/s",
            "read/s",
            "amp",
            "once",
            "stall50",
            "stall99",
            "stallmax",
            "peak RSS",
            "CPU s/GB",
            "disp"
        );
    }
    let json = a.json;
    let reports = run_epochs(
        ds,
        &cfg,
        EpochRun {
            start_epoch: a.start_epoch,
            epochs: a.epochs,
            compute,
            progress: std::io::stderr().is_terminal(),
            measure_order: !a.no_order,
            opening,
        },
        |r| {
            if !json {
                let m = &r.metrics;
                println!(
                    "{:>5} {:>9} {:>8.2} {:>10.0} {:>7.0}MB {:>7.0}MB {:>6.2} {:>5} {:>6.2}ms {:>6.2}ms {:>6.2}ms {:>7.0}MiB {:>9.3} {:>6}",
                    r.epoch,
                    r.samples,
                    r.seconds,
                    r.samples_per_sec,
                    r.useful_mb_per_sec,
                    r.read_mb_per_sec,
                    r.read_amplification,
                    match r.exactly_once {
                        Some(true) => "ok",
                        Some(false) => "NO",
                        None => "-",
                    },
                    m.stall_p50_secs * 1e3,
                    m.stall_p99_secs * 1e3,
                    m.stall_max_secs * 1e3,
                    r.peak_rss_bytes.unwrap_or(0) as f64 / (1 << 20) as f64,
                    // Per GB read from storage (what the device delivered);
                    // a job attached to a cache reads none: per GB served.
                    r.cpu_seconds
                        / (if m.bytes_read > 0 {
                            m.bytes_read
                        } else {
                            m.bytes_served.max(1)
                        } as f64
                            / 1e9),
                    // Chunk-mate dispersion: 1 is a uniform shuffle.
                    r.order
                        .chunk_mate_dispersion
                        .map_or("-".to_string(), |d| format!("{d:.3}"))
                );
            }
        },
    )?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).map_err(|e| brand_format::Error::config(e.to_string()))?
        );
    }
    Ok(reports.iter().all(|r| r.exactly_once != Some(false)))
}
