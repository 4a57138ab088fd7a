//! `brand cache`: one process holds the abstract memory of a dataset for
//! every job on this machine; jobs attach with `cache = "SOCKET"`.

use std::path::PathBuf;
use std::sync::Arc;

use brand_cache::{CacheConfig, CacheHandle, CachePolicy};
use brand_format::{Error, Result};

use crate::configure::{Flag, resolve};

#[derive(clap::Args, Debug)]
pub struct CacheArgs {
    dataset: PathBuf,
    /// The whole budget, for every attached job together: bytes ("4GiB") or a percentage of the dataset ("10%").
    #[arg(long)]
    memory: String,
    /// The Unix socket jobs attach to (created owner-only; a stale one is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// The plan whose reads fill the memory: brand, brand-random, direct,
    /// chunk-shuffle, sequential or tiered (the jobs' order follows its fill).
    #[arg(long)]
    policy: Option<String>,
    /// The fill plan's seed (each job draws with its own).
    #[arg(long)]
    seed: Option<u64>,
    /// Brand policies: fill records in runs of this many neighbours
    /// (1..=64), or auto: from the device's measured read gap, as a loader
    /// alone chooses it.
    #[arg(long)]
    run_length: Option<String>,
    /// error (the job that draws a corrupt record fails) or skip (left out
    /// of every job's epoch, counted).
    #[arg(long)]
    on_corrupt: Option<String>,
    /// whole, auto, or a byte count ("16KiB").
    #[arg(long)]
    read_gap: Option<String>,
    #[arg(long)]
    queue_depth: Option<usize>,
    /// Bytes of reads in flight ("64MiB").
    #[arg(long)]
    readahead: Option<String>,
    /// auto (io_uring, threads where refused), uring or threads.
    #[arg(long)]
    io_backend: Option<String>,
    /// Print the report at exit as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: &CacheArgs) -> Result<()> {
    let set = crate::signals::block_stop_signals()?;
    let int = |v: Option<usize>| Flag::Int(v.map(|n| n as u64));
    let memory = Some(a.memory.clone());
    let cfg = resolve(
        None,
        &[
            ("memory", Flag::Text(&memory)),
            ("policy", Flag::Text(&a.policy)),
            ("seed", Flag::Int(a.seed)),
            ("run_length", Flag::Text(&a.run_length)),
            ("on_corrupt", Flag::Text(&a.on_corrupt)),
            ("read_gap", Flag::Text(&a.read_gap)),
            ("queue_depth", int(a.queue_depth)),
            ("readahead", Flag::Text(&a.readahead)),
            ("io_backend", Flag::Text(&a.io_backend)),
        ],
        false,
    )?;
    let ds = Arc::new(brand_store::open_with(&a.dataset, &cfg.loader.io.store.get_policy())?);
    // The cache reads storage as a loader alone does: the read gap and
    // run_length auto decided for it.
    let loader = brand_reader::decide(&ds, &cfg.loader, brand_reader::Opening::Reads)?;
    let plan = &loader.plan;
    let policy = CachePolicy {
        policy: plan.policy,
        seed: plan.seed,
        run_length: plan.run_length,
        on_corrupt: loader.on_corrupt,
    };
    let cache_cfg = CacheConfig {
        memory: plan.memory,
        io: loader.io.clone(),
        readahead: loader.readahead_bytes,
    };
    let cache = CacheHandle::start_with(ds, &cache_cfg, &policy, &a.socket)?;
    eprintln!(
        "brand cache: {} at {} ({} bytes of memory); SIGINT or SIGTERM stops it",
        a.dataset.display(),
        a.socket.display(),
        cache.report().memory_bytes
    );
    let mut signal = 0;
    // SAFETY: `set` is initialised and `signal` is a valid out-pointer.
    let rc = unsafe { libc::sigwait(&set, &mut signal) };
    let why = match (rc, signal) {
        (0, libc::SIGINT) => "SIGINT",
        (0, libc::SIGTERM) => "SIGTERM",
        _ => "a signal",
    };
    let r = cache.stop(why);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| Error::config(e.to_string()))?
        );
    } else {
        println!(
            "stopped by {why}: {} jobs attached, {} samples served, {} read ({} bytes), {} dropped while needed, {} corrupt, peak {} of {} bytes",
            r.jobs_attached,
            r.samples_served,
            r.samples_read,
            r.bytes_read,
            r.dropped_needed,
            r.corrupt_records,
            r.peak_used_bytes,
            r.memory_bytes
        );
    }
    Ok(())
}
