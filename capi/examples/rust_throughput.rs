//! The Rust side of `cpp-examples/bench/capi_vs_rust.sh`: brand_throughput's
//! loop through the Rust loader API, so the two differ only in the
//! interface. Same arguments and JSON as brand_throughput:
//!
//!   cargo run --release -p brand-capi --example rust_throughput -- DATASET
//!       [--config TOML] [--epochs N] [--touch none|first|all] [--json]

use std::sync::Arc;
use std::time::Instant;

use ::brand_loader::{Loader, LoaderConfig, LoaderState};
use brand_format::Dataset;

/// CPU seconds used by this thread (not counting time preempted by other work).
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid, writable timespec; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut dataset, mut config, mut epochs, mut touch, mut json) =
        (None, String::new(), 1u64, "first".to_string(), false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--config" => config = args.next().ok_or("--config needs a value")?,
            "--epochs" => epochs = args.next().ok_or("--epochs needs a value")?.parse()?,
            "--touch" => touch = args.next().ok_or("--touch needs a value")?,
            "--json" => json = true,
            _ if a.starts_with('-') => return Err(format!("unknown option {a}").into()),
            _ => dataset = Some(a),
        }
    }
    let dataset = dataset
        .ok_or("usage: rust_throughput DATASET [--config TOML] [--epochs N] [--touch none|first|all] [--json]")?;
    if !["none", "first", "all"].contains(&touch.as_str()) {
        return Err("--touch is none, first or all".into());
    }
    let ds = Arc::new(Dataset::open(&dataset)?);
    let cfg = brand_reader::decide(&ds, &LoaderConfig::from_toml(&config)?, brand_reader::Opening::Reads)?;
    let mut loader = Loader::open(ds, &cfg, LoaderState::default())?;
    let mut rows = Vec::new();
    let mut sink = 0u64;
    for e in 0..epochs {
        let (mut samples, mut bytes, mut acc) = (0u64, 0u64, 0u64);
        let (start, cpu) = (Instant::now(), thread_cpu_secs());
        while let Some(batch) = loader.next_batch()? {
            for s in batch.iter() {
                bytes += s.data.len() as u64;
                match touch.as_str() {
                    "all" => acc += s.data.iter().map(|&b| b as u64).sum::<u64>(),
                    "first" => acc += s.data.first().copied().unwrap_or(0) as u64,
                    _ => acc ^= s.data.as_ptr() as u64,
                }
            }
            samples += batch.len() as u64;
        }
        let (secs, cpu_secs) = (start.elapsed().as_secs_f64(), thread_cpu_secs() - cpu);
        sink = sink.wrapping_add(std::hint::black_box(acc));
        rows.push(format!(
            "{{\"epoch\": {e}, \"samples\": {samples}, \"seconds\": {secs:.6}, \"cpu_seconds\": {cpu_secs:.6}, \
             \"samples_per_sec\": {:.1}, \"mb_per_sec\": {:.2}}}",
            samples as f64 / secs,
            bytes as f64 / secs / 1e6
        ));
        if !json {
            println!(
                "epoch {e}: {samples} samples in {secs:.3} s ({:.0} samples/s)",
                samples as f64 / secs
            );
        }
    }
    let m = loader.metrics();
    if json {
        println!(
            "{{\"epochs\": [{}], \"metrics\": {{\"bytes_read\": {}, \"bytes_served\": {}, \"read_amplification\": {:.4}}}}}",
            rows.join(", "),
            m.bytes_read,
            m.bytes_served,
            m.read_amplification()
        );
    }
    std::hint::black_box(sink);
    Ok(())
}
