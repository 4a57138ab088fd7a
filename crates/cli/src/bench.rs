//! `brand bench files`: the per-file baseline brand is compared against —
//! every file of an ImageFolder directory read once in a random order with
//! open/read/close, by T threads (what a PyTorch-style loader does).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use brand_format::rng::Prng;
use brand_import::files::FileSource;
use brand_pack::source::Source;

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Read every file of an ImageFolder directory once, in random order, with open/read/close.
    Files(FilesArgs),
    /// Sweep queue depth × block size of random O_DIRECT reads through brand's engine; writes a table, JSON and an SVG plot.
    Device(crate::bench_device::DeviceArgs),
}

#[derive(clap::Args, Debug)]
pub struct FilesArgs {
    dir: PathBuf,
    #[arg(long, default_value_t = 8)]
    threads: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Drop the page cache first (needs root), so reads come from the device.
    #[arg(long)]
    drop_caches: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct FilesReport {
    files: u64,
    bytes: u64,
    threads: usize,
    seconds: f64,
    samples_per_sec: f64,
    useful_mb_per_sec: f64,
    cache_dropped: bool,
}

pub fn run(cmd: &BenchCommand) -> brand_format::Result<()> {
    match cmd {
        BenchCommand::Files(a) => files(a),
        BenchCommand::Device(a) => crate::bench_device::device(a),
    }
}

fn drop_caches() -> bool {
    // SAFETY: sync() has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

const MAX_THREADS: usize = 4096;

fn files(a: &FilesArgs) -> brand_format::Result<()> {
    // Each thread is spawned up front: an absurd count would end in a
    // failed spawn (a panic), not in more parallelism.
    if !(1..=MAX_THREADS).contains(&a.threads) {
        return Err(brand_format::Error::config(format!(
            "--threads {}: must be 1..={MAX_THREADS}",
            a.threads
        )));
    }
    let source = FileSource::image_folder(&a.dir)?;
    let mut order: Vec<u32> = (0..source.len() as u32).collect();
    Prng::stream(a.seed, &[0xbe4c]).shuffle(&mut order);
    let cache_dropped = a.drop_caches && drop_caches();
    if a.drop_caches && !cache_dropped {
        tracing::warn!("could not drop the page cache (not root?): reads may come from memory");
    }
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| -> brand_format::Result<()> {
        let workers: Vec<_> = (0..a.threads)
            .map(|_| {
                s.spawn(|| -> brand_format::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&f) = order.get(i) else { return Ok(()) };
                        let data = source.read(f as usize)?;
                        bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| brand_format::Error::config("a reader thread panicked"))??;
        }
        Ok(())
    })?;
    let secs = start.elapsed().as_secs_f64();
    let (n, b) = (order.len() as u64, bytes.load(Ordering::Relaxed));
    let r = FilesReport {
        files: n,
        bytes: b,
        threads: a.threads,
        seconds: secs,
        samples_per_sec: n as f64 / secs,
        useful_mb_per_sec: b as f64 / secs / 1e6,
        cache_dropped,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| brand_format::Error::config(e.to_string()))?
        );
    } else {
        println!(
            "{} files, {:.1} MiB, {} threads: {:.2} s, {:.0} samples/s, {:.0} MB/s{}",
            n,
            b as f64 / (1 << 20) as f64,
            a.threads,
            secs,
            r.samples_per_sec,
            r.useful_mb_per_sec,
            if cache_dropped { " (cold cache)" } else { "" }
        );
    }
    Ok(())
}
