//! `brand bench device PATH`: what the storage under PATH delivers to brand's
//! own engine, swept over queue depth × block size (random aligned O_DIRECT
//! reads). The characterisation a user runs first: it shows where requests
//! are costly (throughput grows with block size: read whole chunks) and where
//! bytes are (small blocks at depth already saturate: read only records).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use brand_format::extents::{Extent, Records};
use brand_format::rng::Prng;
use brand_format::{ALIGN, Dataset, Error, Result};
use brand_io::engine::{Engine, EngineConfig, IoBackend, Job};

#[derive(clap::Args, Debug)]
pub struct DeviceArgs {
    /// A brand dataset, or a directory on the device: brand then writes a
    /// probe dataset of --size bytes there once (`brand-device-probe/`) and reuses it.
    path: PathBuf,
    /// Queue depths to sweep (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32,64")]
    qd: Vec<usize>,
    /// Block sizes to sweep (comma-separated; multiples of 4 KiB).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,16KiB,128KiB,1MiB,4MiB")]
    bs: Vec<String>,
    /// Seconds per point.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// I/O backend: auto, uring or threads.
    #[arg(long, default_value = "auto")]
    io_backend: String,
    /// io_uring rings to sweep (comma-separated; each a thread, at most one per core).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    rings: Vec<usize>,
    /// io_uring submission polling (SQPOLL) to sweep: off, on, or off,on.
    #[arg(long, value_delimiter = ',', default_value = "off")]
    sqpoll: Vec<String>,
    /// Size of the probe dataset written when PATH is not a dataset.
    #[arg(long, default_value = "2GiB")]
    size: String,
    /// Where the JSON and the SVG plot go.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the JSON report instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    rings: usize,
    sqpoll: bool,
    queue_depth: usize,
    block_bytes: u64,
    reads: u64,
    bytes: u64,
    seconds: f64,
    mb_per_sec: f64,
    iops: f64,
    cpu_seconds_per_gb: f64,
    cpu_micros_per_read: f64,
    /// A store's (objects backend): time to first byte, median, and GET
    /// latency P99, in ms (0 for a device).
    first_byte_p50_ms: f64,
    get_p99_ms: f64,
}

#[derive(Debug, Serialize)]
struct DeviceReport {
    path: PathBuf,
    backend: String,
    file_bytes: u64,
    seconds_per_point: f64,
    points: Vec<Point>,
}

pub fn device(a: &DeviceArgs) -> Result<()> {
    let blocks = a
        .bs
        .iter()
        .map(|b| {
            let n = brand_format::units::parse_bytes(b).map_err(|why| Error::config(format!("--bs {b:?}: {why}")))?;
            if n == 0 || n % ALIGN != 0 || n > 64 << 20 {
                return Err(Error::config(format!("--bs {b:?}: a multiple of 4 KiB up to 64 MiB")));
            }
            Ok(n)
        })
        .collect::<Result<Vec<u64>>>()?;
    if a.qd.is_empty() || a.qd.iter().any(|&q| q == 0 || q > 4096) {
        return Err(Error::config("--qd: depths between 1 and 4096"));
    }
    if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
        return Err(Error::config("--seconds: between 0 and 3600"));
    }
    let backend: IoBackend = a.io_backend.parse()?;
    if a.rings.is_empty() || a.rings.iter().any(|&r| r == 0 || r > 64) {
        return Err(Error::config("--rings: between 1 and 64"));
    }
    let sqpoll = a
        .sqpoll
        .iter()
        .map(|v| match v.as_str() {
            "off" => Ok(false),
            "on" => Ok(true),
            _ => Err(Error::config(format!("--sqpoll {v:?}: off or on"))),
        })
        .collect::<Result<Vec<bool>>>()?;
    // (rings, sqpoll) settings, each a table.
    let settings: Vec<(usize, bool)> = a
        .rings
        .iter()
        .flat_map(|&r| sqpoll.iter().map(move |&p| (r, p)))
        .collect();
    let ds = Arc::new(probe_dataset(&a.path, &a.size, a.seed)?);
    let segments: Vec<u64> = ds.manifest.segments.iter().map(|s| s.bytes / ALIGN * ALIGN).collect();
    let file_bytes: u64 = segments.iter().sum();
    let mut points = Vec::new();
    let mut used_backend = String::new();
    for &bs in &blocks {
        if bs > segments.iter().copied().max().unwrap_or(0) {
            return Err(Error::config(format!(
                "--bs {bs}: larger than the largest segment of {}",
                a.path.display()
            )));
        }
        for (&qd, &(rings, sqpoll)) in a.qd.iter().flat_map(|q| settings.iter().map(move |s| (q, s))) {
            let cfg = EngineConfig {
                queue_depth: qd,
                direct: true,
                verify: false,
                fixed_buffers: true,
                // One registered buffer per read in flight, as the loader has
                // with the default readahead.
                fixed_buffer_bytes: qd as u64 * brand_io::engine::FIXED_BUF_BYTES as u64,
                backend,
                decode_threads: 0,
                io_timeout: Duration::from_secs(60),
                // A dataset in object storage: qd GETs in flight of bs bytes each.
                store: brand_io::StoreSettings {
                    gets_in_flight: brand_io::GetsInFlight::Fixed(qd),
                    get_bytes: bs,
                    ..Default::default()
                },
                tier: None,
                rings,
                sqpoll,
            };
            let engine = Engine::start(ds.clone(), cfg)?;
            used_backend = engine.backend().to_string();
            let mut rng = Prng::stream(a.seed, &[0xde71ce, qd as u64, bs]);
            let mut point = sweep_point(&engine, &segments, qd, bs, a.seconds, &mut rng)?;
            (point.rings, point.sqpoll) = (rings, sqpoll);
            if let Some(r) = engine.store_report() {
                (point.first_byte_p50_ms, point.get_p99_ms) = (r.first_byte_p50_ms, r.latency_p99_ms);
            }
            points.push(point);
            if !a.json {
                eprint!(".");
            }
        }
    }
    if !a.json {
        eprintln!();
    }
    let report = DeviceReport {
        path: a.path.clone(),
        backend: used_backend,
        file_bytes,
        seconds_per_point: a.seconds,
        points,
    };
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(&a.out, e))?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| Error::config(e.to_string()))?;
    let json_path = a.out.join("brand-device.json");
    std::fs::write(&json_path, &json).map_err(|e| Error::io(&json_path, e))?;
    let svg_path = a.out.join("brand-device.svg");
    let (rings, sqpoll) = settings[0];
    let first: Vec<&Point> = report
        .points
        .iter()
        .filter(|p| (p.rings, p.sqpoll) == (rings, sqpoll))
        .collect();
    std::fs::write(&svg_path, plot(&report, &first, &a.qd, &blocks)).map_err(|e| Error::io(&svg_path, e))?;
    if a.json {
        println!("{json}");
    } else {
        for &(rings, sqpoll) in &settings {
            let mine: Vec<&Point> = report
                .points
                .iter()
                .filter(|p| (p.rings, p.sqpoll) == (rings, sqpoll))
                .collect();
            let sq = if sqpoll { "on" } else { "off" };
            let setting = if report.backend == "objects" {
                "QD = GETs in flight, block = GET size".to_string()
            } else {
                format!("{rings} ring(s), SQPOLL {sq}")
            };
            print_table(&report, &mine, &setting, &a.qd, &blocks);
        }
        println!("wrote {} and {}", json_path.display(), svg_path.display());
    }
    Ok(())
}

/// The dataset at `path`, or the probe dataset in it (written once).
fn probe_dataset(path: &Path, size: &str, seed: u64) -> Result<Dataset> {
    if let brand_store::Location::Url(_) = brand_store::Location::of_path(path)? {
        return brand_store::open(path);
    }
    if path.join(brand_format::MANIFEST_FILE).exists() {
        return Dataset::open(path);
    }
    if !path.is_dir() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "not a dataset or a directory"),
        ));
    }
    let bytes =
        brand_format::units::parse_bytes(size).map_err(|why| Error::config(format!("--size {size:?}: {why}")))?;
    if !(16 << 20..=1 << 40).contains(&bytes) {
        return Err(Error::config(format!("--size {size:?}: between 16 MiB and 1 TiB")));
    }
    let probe = path.join("brand-device-probe");
    let ds = probe.join("ds");
    let stamp = probe.join(format!(".bytes-{bytes}"));
    if !stamp.exists() {
        let _ = std::fs::remove_dir_all(&probe);
        // 1 MiB samples: whole segments of incompressible bytes, chunked as usual.
        let samples = bytes.div_ceil(1 << 20);
        eprintln!("writing a {samples} MiB probe dataset in {} (once)", probe.display());
        let gen_opts = brand_import::synthetic::GenOptions {
            samples,
            mean_bytes: 1 << 20,
            min_bytes: 1 << 20,
            max_bytes: 1 << 20,
            classes: 1,
            seed,
            ..Default::default()
        };
        brand_import::synthetic::generate_and_pack(&probe, &gen_opts, &brand_pack::PackOptions::default())?;
        let src = probe.join("src");
        std::fs::remove_dir_all(&src).map_err(|e| Error::io(&src, e))?;
        std::fs::write(&stamp, b"").map_err(|e| Error::io(&stamp, e))?;
    }
    Dataset::open(&ds)
}

/// Random `bs`-byte aligned reads, `qd` in flight, for `seconds`.
fn sweep_point(engine: &Engine, segments: &[u64], qd: usize, bs: u64, seconds: f64, rng: &mut Prng) -> Result<Point> {
    let usable: Vec<u32> = (0..segments.len() as u32)
        .filter(|&s| segments[s as usize] >= bs)
        .collect();
    let mut next_job = |tag: u64| {
        let segment = usable[rng.below(usable.len() as u64) as usize];
        let slots = segments[segment as usize] / bs;
        Job {
            tag,
            extent: Extent {
                segment,
                offset: rng.below(slots) * bs,
                len: bs,
                records: Records::new(),
            },
            first_fill: false,
        }
    };
    let cpu_before = crate::process_stats::cpu_seconds();
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let (mut tag, mut in_flight, mut reads, mut bytes) = (0u64, 0usize, 0u64, 0u64);
    while in_flight < qd {
        engine.submit(next_job(tag))?;
        (tag, in_flight) = (tag + 1, in_flight + 1);
    }
    while in_flight > 0 {
        let done = engine.recv()?;
        in_flight -= 1;
        done.result?;
        reads += 1;
        bytes += done.extent.len;
        if start.elapsed() < deadline {
            engine.submit(next_job(tag))?;
            (tag, in_flight) = (tag + 1, in_flight + 1);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = crate::process_stats::cpu_seconds() - cpu_before;
    Ok(Point {
        rings: 0,
        sqpoll: false,
        queue_depth: qd,
        block_bytes: bs,
        reads,
        bytes,
        seconds: secs,
        mb_per_sec: bytes as f64 / secs / 1e6,
        iops: reads as f64 / secs,
        cpu_seconds_per_gb: if bytes > 0 { cpu / (bytes as f64 / 1e9) } else { 0.0 },
        cpu_micros_per_read: if reads > 0 { cpu * 1e6 / reads as f64 } else { 0.0 },
        first_byte_p50_ms: 0.0,
        get_p99_ms: 0.0,
    })
}

fn size_label(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b => format!("{}K", b >> 10),
    }
}

fn print_table(r: &DeviceReport, points: &[&Point], setting: &str, qds: &[usize], blocks: &[u64]) {
    println!(
        "{} ({} backend, {setting}, {:.1} GiB read range): random aligned reads",
        r.path.display(),
        r.backend,
        r.file_bytes as f64 / (1u64 << 30) as f64
    );
    type Figure = fn(&Point) -> f64;
    let mut figures: Vec<(&str, Figure)> = vec![
        ("MB/s", |p| p.mb_per_sec),
        ("k IOPS", |p| p.iops / 1e3),
        ("CPU µs/read", |p| p.cpu_micros_per_read),
    ];
    if r.backend == "objects" {
        figures.push(("1st byte ms", |p| p.first_byte_p50_ms));
        figures.push(("GET P99 ms", |p| p.get_p99_ms));
    }
    for (name, figure) in figures {
        print!("{name:>12}");
        for q in qds {
            print!("{:>10}", format!("QD {q}"));
        }
        println!();
        for &bs in blocks {
            print!("{:>12}", size_label(bs));
            for &q in qds {
                let p = points.iter().find(|p| p.queue_depth == q && p.block_bytes == bs);
                print!("{:>10.1}", p.map_or(0.0, |p| figure(p)));
            }
            println!();
        }
    }
}

/// An SVG line chart: MB/s against block size (log scale), one line per
/// queue depth. Written by hand: one small picture does not need a crate.
fn plot(r: &DeviceReport, points: &[&Point], qds: &[usize], blocks: &[u64]) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 440.0, 70.0, 50.0, 40.0, 120.0);
    let max_mb = points.iter().map(|p| p.mb_per_sec).fold(1.0, f64::max) * 1.1;
    let x_of = |i: usize| left + (w - left - right) * i as f64 / (blocks.len().max(2) - 1) as f64;
    let y_of = |mb: f64| h - bottom - (h - bottom - top) * mb / max_mb;
    let colours = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    ];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"14\">{} — random O_DIRECT reads ({} backend)</text>\n",
        xml_escape(&r.path.display().to_string()),
        r.backend
    );
    for k in 0..=4 {
        let mb = max_mb * k as f64 / 4.0;
        let y = y_of(mb);
        s += &format!(
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{mb:.0}</text>\n",
            w - right,
            left - 6.0,
            y + 4.0
        );
    }
    for (i, &bs) in blocks.iter().enumerate() {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            x_of(i),
            h - bottom + 18.0,
            size_label(bs)
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">block size</text>\n\
         <text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">MB/s</text>\n",
        (left + w - right) / 2.0,
        h - 10.0,
        h / 2.0,
        h / 2.0
    );
    for (k, &q) in qds.iter().enumerate() {
        let colour = colours[k % colours.len()];
        let pts: Vec<String> = blocks
            .iter()
            .enumerate()
            .filter_map(|(i, &bs)| {
                points
                    .iter()
                    .find(|p| p.queue_depth == q && p.block_bytes == bs)
                    .map(|p| format!("{:.1},{:.1}", x_of(i), y_of(p.mb_per_sec)))
            })
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">QD {q}</text>\n",
            pts.join(" "),
            w - right + 12.0,
            top + 18.0 * (k + 1) as f64
        );
    }
    s + "</svg>\n"
}

fn xml_escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
