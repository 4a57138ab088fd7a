//! The `brand` command line: gen, pack, inspect, verify, cat, simulate, read,
//! serve and bench. Wiring only: each command is a call into the crates.
//! A library so that the `brand` binary and the Python wheel's `brand`
//! command (`brand._brand.main`) are one program.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod bench_device;
mod cache;
mod configure;
mod process_stats;
mod read;
mod serve;
mod signals;
mod simulate;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use brand_import::listing::{InputListed, ListingOptions, OnInput};
use brand_import::{Format, ImportOptions};
use brand_pack::{PackOptions, Partitioning, source::Source};
use brand_plan::Memory;
use configure::StoreFlags;

#[derive(Parser, Debug)]
#[command(
    name = "brand",
    version,
    about = "Training-data loader for datasets far larger than memory"
)]
struct Cli {
    /// More log output (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write synthetic samples: an ImageNet-like directory (ImageFolder layout), or TFRecord shards (--format tfrecord).
    Gen(GenArgs),
    /// Pack samples into a dataset of shuffled, 4 KiB-aligned chunks.
    Pack(PackArgs),
    /// Summarise a dataset.
    Inspect(InspectArgs),
    /// Re-read every chunk and check headers, records and crc32c against the index.
    Verify(VerifyArgs),
    /// Write one sample's original bytes to stdout.
    Cat(CatArgs),
    /// Stream epochs through the io engine and report throughput, amplification, stalls and memory.
    Read(Box<read::ReadArgs>),
    /// Baselines for benchmarks (bench/compare.py runs them side by side with brand).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run the plan only: reads, read amplification, exactly-once and order quality for a budget.
    Simulate(simulate::SimulateArgs),
    /// Run one node of a multi-node job: read the chunks it owns, push samples to their ranks, serve its own.
    Serve(serve::ServeArgs),
    /// Hold one dataset's memory for every job on this machine; jobs attach with `cache = "SOCKET"`.
    Cache(cache::CacheArgs),
}

/// Sample sizes follow a log-normal clipped to [min, max] whose mean is the
/// given mean. For millions of small samples, e.g. 10,000,000 of about 512
/// bytes: `brand gen DIR --samples 10000000 --format tfrecord --mean-bytes 512
/// --min-bytes 256 --max-bytes 1024`, then `brand pack --from tfrecord DIR -o OUT`.
#[derive(clap::Args, Debug)]
struct GenArgs {
    /// Output directory.
    dir: PathBuf,
    #[arg(long)]
    samples: u64,
    /// Mean sample size in KiB.
    #[arg(long, default_value_t = 110.0)]
    mean_kib: f64,
    /// Smallest sample in KiB.
    #[arg(long, default_value_t = 10.0)]
    min_kib: f64,
    /// Largest sample in KiB.
    #[arg(long, default_value_t = 300.0)]
    max_kib: f64,
    /// Mean sample size in bytes (instead of --mean-kib).
    #[arg(long, value_name = "BYTES", conflicts_with = "mean_kib")]
    mean_bytes: Option<u64>,
    /// Smallest sample in bytes (instead of --min-kib).
    #[arg(long, value_name = "BYTES", conflicts_with = "min_kib")]
    min_bytes: Option<u64>,
    /// Largest sample in bytes (instead of --max-kib).
    #[arg(long, value_name = "BYTES", conflicts_with = "max_kib")]
    max_bytes: Option<u64>,
    /// files: DIR/class-CCCC/sample-NNNNNNNN.bin, one file per sample.
    /// tfrecord: DIR/shard-SSSSS-of-NNNNN.tfrecord, sample i (in shard order)
    /// a tf.train.Example with bytes feature "image" and int64 feature
    /// "label" (its class), for `brand pack --from tfrecord DIR`.
    #[arg(long, value_enum, default_value = "files")]
    format: GenFormat,
    /// --format tfrecord: how many shards (default: one per 512 MiB of samples).
    #[arg(long, value_name = "N")]
    shards: Option<u32>,
    #[arg(long, default_value_t = 100)]
    classes: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write into a non-empty directory.
    #[arg(long)]
    force: bool,
    /// Write small class-dependent PNG images (32x32 RGB; a CNN can learn them) instead of random bytes.
    #[arg(long)]
    images: bool,
    /// Side length of --images.
    #[arg(long, default_value_t = 32)]
    image_size: u32,
    /// Make random samples compressible about RATIO times (for `pack --zstd`).
    #[arg(long, value_name = "RATIO", value_parser = clap::value_parser!(u32).range(1..=1024))]
    compressible: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum GenFormat {
    /// One file per sample (ImageFolder layout).
    Files,
    /// TFRecord shards of tf.train.Examples.
    Tfrecord,
}

/// `--from`'s values: every import format, each with its one-line help
/// (the list is `Format`'s, shared with Python's `brand.pack`).
fn format_parser() -> impl clap::builder::TypedValueParser<Value = Format> {
    use clap::builder::TypedValueParser as _;
    let values = Format::ALL.map(|f| clap::builder::PossibleValue::new(f.name()).help(f.help()));
    clap::builder::PossibleValuesParser::new(values).try_map(|name| name.parse::<Format>())
}

#[derive(clap::Args, Debug)]
struct PackArgs {
    /// The input (several files for --from tfrecord, tar, parquet and arrow).
    #[arg(required = true, num_args = 1..)]
    inputs: Vec<PathBuf>,
    /// The dataset directory to create, or a URL (s3://bucket/prefix, gs://…,
    /// az://…): each segment uploaded as soon as it is written (in
    /// --staging, removed once sent), manifest.toml last.
    #[arg(short, long)]
    out: PathBuf,
    /// A pack to a URL: the local directory segments are written in until
    /// they are uploaded, at most three at a time (default: the system's
    /// temporary directory); removed after.
    #[arg(long, value_name = "DIR")]
    staging: Option<PathBuf>,
    #[arg(long, default_value = "dir", value_parser = format_parser())]
    from: Format,
    /// Samples per chunk (1..=64).
    #[arg(long, default_value_t = brand_format::DEFAULT_CHUNK_SIZE)]
    chunk_size: u32,
    /// Seed of the one pack-time shuffle.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compress every record with zstd at this level.
    #[arg(long, value_name = "LEVEL")]
    zstd: Option<i32>,
    /// Largest segment file, in MiB.
    #[arg(long, default_value_t = brand_format::DEFAULT_SEGMENT_BYTES >> 20, value_name = "MIB")]
    segment_mib: u64,
    /// TFRecord: the int64 feature of each tf.train.Example that holds its label.
    #[arg(long, default_value = "label")]
    label_feature: String,
    /// Tar: the payload member's extensions in order of preference
    /// ("png;jpg;webp"); without it every sample must have one member.
    /// MDS: the payload column (bytes, str, jpeg or png). Parquet, Arrow: a
    /// binary column or a Hugging Face Image struct (its bytes); Arrow also a
    /// string column. Needed when there are several candidates.
    #[arg(long, value_name = "NAME")]
    field: Option<String>,
    /// Tar: the label: cls (the .cls member), json:FIELD (an integer field of
    /// the .json member), dir (inner tar or parent directory, numbered in
    /// sorted order), or none. MDS: an integer column (int, int8…uint64,
    /// str_int), or none. Parquet, Arrow: an integer column (a ClassLabel; its
    /// names, from the huggingface metadata or Arrow's dataset_info.json, go
    /// into the manifest), or none.
    #[arg(long, value_name = "HOW")]
    label: Option<String>,
    /// Replace OUT if it already exists.
    #[arg(long)]
    force: bool,
    /// Write W partitions, OUT/part-0 … OUT/part-{W-1}, one per node's local
    /// disk: part-w holds the chunks node w owns in a job of W nodes.
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u32).range(1..=brand_pack::MAX_PARTITIONS as i64))]
    partitions: Option<u32>,
    /// With --partitions: the memory budget per rank the job will use ("10%"
    /// or "N slots"), which sizes the groups that are assigned to nodes.
    #[arg(long, requires = "partitions")]
    memory: Option<String>,
    #[command(flatten)]
    store: StoreFlags,
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    dataset: PathBuf,
    #[arg(long)]
    json: bool,
    /// List every sample instead, one line each in packed order:
    /// `id<TAB>label<TAB>key` (label -1: none).
    #[arg(long, conflicts_with = "json")]
    samples: bool,
    #[command(flatten)]
    store: StoreFlags,
}

#[derive(clap::Args, Debug)]
struct VerifyArgs {
    dataset: PathBuf,
    /// Rebuild index.bin from the chunks' own headers, then verify.
    #[arg(long)]
    rebuild_index: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreFlags,
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "key"])))]
struct CatArgs {
    dataset: PathBuf,
    /// Sample id (position in the packed order).
    id: Option<u64>,
    /// The sample's original name instead of its id.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    store: StoreFlags,
}

/// Runs `brand` with `args` (the program's name first, as `std::env::args_os`
/// gives them) and returns its exit status.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    if !matches!(cli.command, Command::Serve(_)) {
        // Like other Unix tools, end quietly when the reader of stdout goes
        // away (`brand inspect … | head`) instead of panicking in println!.
        // Not `serve`: a write to a peer that has closed its connection
        // must be an error (EPIPE) there, not a kill by SIGPIPE, which ended
        // nodes whose peer finished first.
        // SAFETY: no thread exists yet; SIG_DFL is a valid handler.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let level = match cli.verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        _ => tracing::Level::DEBUG,
    };
    // try_init: in the Python wheel, a second `brand._brand.main` call in
    // one process finds the first one's subscriber.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .without_time()
        .try_init();
    let result = match &cli.command {
        Command::Gen(a) => gen_cmd(a),
        Command::Pack(a) => pack_cmd(a),
        Command::Inspect(a) => inspect_cmd(a),
        Command::Verify(a) => verify_cmd(a),
        Command::Cat(a) => cat_cmd(a),
        Command::Read(a) => read::run(a).map(|ok| if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }),
        Command::Bench(c) => bench::run(c).map(|()| ExitCode::SUCCESS),
        Command::Simulate(a) => simulate::run(a).map(|()| ExitCode::SUCCESS),
        Command::Serve(a) => serve::run(a).map(|()| ExitCode::SUCCESS),
        Command::Cache(a) => cache::run(a).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("brand: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A progress bar on a terminal, nothing otherwise.
fn progress_bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} [{elapsed_precise}<{eta_precise}]")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// A size flag in KiB as bytes: finite, not negative, at most a record's 4 GiB.
fn kib(flag: &str, x: f64) -> brand_format::Result<u64> {
    let max = brand_import::synthetic::MAX_SAMPLE_BYTES;
    let bytes = x * 1024.0;
    if !(bytes.is_finite() && bytes >= 0.0 && bytes <= max as f64) {
        return Err(brand_format::Error::config(format!(
            "{flag} {x}: must be 0..={} KiB",
            max / 1024
        )));
    }
    Ok(bytes.round() as u64)
}

fn gen_cmd(a: &GenArgs) -> brand_format::Result<ExitCode> {
    let format = match (a.format, a.shards) {
        (GenFormat::Files, None) => brand_import::synthetic::GenFormat::Files,
        (GenFormat::Files, Some(_)) => {
            return Err(brand_format::Error::config("--shards applies to --format tfrecord"));
        }
        (GenFormat::Tfrecord, shards) => brand_import::synthetic::GenFormat::TfRecord { shards },
    };
    let opts = brand_import::synthetic::GenOptions {
        samples: a.samples,
        mean_bytes: a.mean_bytes.map_or_else(|| kib("--mean-kib", a.mean_kib), Ok)?,
        min_bytes: a.min_bytes.map_or_else(|| kib("--min-kib", a.min_kib), Ok)?,
        max_bytes: a.max_bytes.map_or_else(|| kib("--max-kib", a.max_kib), Ok)?,
        classes: a.classes,
        seed: a.seed,
        force: a.force,
        images: a.images.then_some(a.image_size),
        compressible: a.compressible,
        format,
    };
    let bar = progress_bar(a.samples, "gen");
    let bytes = brand_import::synthetic::generate(&a.dir, &opts, &|done, _| bar.set_position(done))?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} samples, {:.1} MiB, into {}",
        a.samples,
        bytes as f64 / (1 << 20) as f64,
        a.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn open_source(
    a: &PackArgs,
    listing_dir: Option<PathBuf>,
    policy: &brand_store::GetPolicy,
) -> brand_format::Result<Box<dyn Source>> {
    // A gzipped tar's payloads are spooled where the pack is written.
    let spool_dir = brand_pack::scratch_dir(&a.out, a.staging.as_deref())?;
    let opts = ImportOptions {
        label_feature: a.label_feature.clone(),
        field: a.field.clone(),
        label: a.label.clone(),
        spool_dir,
        store: policy.clone(),
        listing: listing_options(listing_dir),
    };
    brand_import::open(a.from, &a.inputs, &opts)
}

/// The listing kept in `dir`, and its progress: a bar of inputs on a
/// terminal, a line per input with `-v`, and one line when an earlier
/// pack's listing is reused.
fn listing_options(dir: Option<PathBuf>) -> ListingOptions {
    let bar: std::sync::Mutex<Option<ProgressBar>> = std::sync::Mutex::new(None);
    let said_reused = std::sync::atomic::AtomicBool::new(false);
    let place = dir.as_ref().map(|d| d.display().to_string()).unwrap_or_default();
    let on_input = move |l: &InputListed<'_>| {
        if l.reused && !said_reused.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!("brand: reusing the inputs an earlier pack listed (kept in {place})");
        }
        tracing::info!(
            "{} input {} of {}: {} ({} samples so far)",
            if l.reused { "reused" } else { "listed" },
            l.done,
            l.of,
            l.path.display(),
            l.samples
        );
        if let Ok(mut bar) = bar.lock() {
            let bar = bar.get_or_insert_with(|| progress_bar(l.of as u64, "list"));
            bar.set_position(l.done as u64);
            if l.done >= l.of {
                bar.finish_and_clear();
            }
        }
    };
    ListingOptions {
        dir,
        on_input: Some(OnInput(std::sync::Arc::new(on_input))),
    }
}

/// SIGINT and SIGTERM during a pack remove its unfinished output (or keep it
/// for a resume once it has a checkpoint) before the process ends by the
/// same signal. The signals are blocked here, before any
/// other thread exists (threads inherit the mask), and taken by one watcher
/// thread with `sigwait`, so the cleanup runs as ordinary code, not in a
/// signal handler, and even while the packer's threads are blocked in reads.
fn remove_unfinished_pack_on_interrupt(listing_dir: Option<PathBuf>) -> brand_format::Result<()> {
    let set = signals::block_stop_signals()?;
    std::thread::spawn(move || {
        let mut signal = 0;
        // SAFETY: `set` is initialised and `signal` is a valid out-pointer.
        if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
            return;
        }
        let kept = brand_pack::remove_unfinished();
        if let Some(dir) = &listing_dir {
            keep_or_remove_listing(dir);
        }
        if kept.is_empty() {
            eprintln!("brand: interrupted; the unfinished dataset was removed");
        }
        for dir in kept {
            let (done, total) = brand_pack::resume::progress_of(&dir).unwrap_or_default();
            eprintln!(
                "brand: interrupted; {done} of {total} chunks are kept in {}: the same command goes on from there (delete it to start over)",
                dir.display()
            );
        }
        // SAFETY: restoring the default action and unblocking it in this
        // thread, then raising it here, ends the process by that signal.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
        }
        std::process::exit(128 + signal);
    });
    Ok(())
}

/// The groups `brand serve` will assign to `count` nodes for a dataset of
/// `samples` samples in chunks of `chunk_size`, under the budget `memory`
/// (the multi-node mode's own rule), resolved as every configuration is.
fn partitioning(
    count: u32,
    memory: &Option<String>,
    samples: u64,
    chunk_size: u32,
) -> brand_format::Result<Partitioning> {
    let cfg = configure::resolve(
        None,
        &[
            ("memory", configure::Flag::Text(memory)),
            ("world", configure::Flag::Int(Some(count.into()))),
        ],
        false,
    )?;
    let plan = cfg.loader.plan;
    if let Memory::Bytes(_) = plan.memory {
        return Err(brand_format::Error::config(format!(
            "--memory {}: give the budget as a percentage or \"N slots\" with --partitions (a byte budget depends on sample sizes, known only once packed)",
            plan.memory
        )));
    }
    let layout = brand_plan::Layout {
        samples,
        chunk_size,
        sample_bytes: 0,
    };
    let own = brand_nodes::routes::Ownership::of_layout(layout, &plan)?;
    Ok(Partitioning {
        count,
        group_chunks: own.group_chunks,
    })
}

/// An unfinished pack's listing directory: kept, and said so, if it holds
/// a finished input (the same command reuses it); else removed.
fn keep_or_remove_listing(dir: &std::path::Path) {
    match brand_import::listing::settle(dir, false) {
        Ok(0) => {}
        Ok(n) => eprintln!(
            "brand: the listing of {n} input(s) is kept in {}: the same command reuses it (delete it to start over)",
            dir.display()
        ),
        Err(e) => eprintln!("brand: {e}"),
    }
}

fn pack_cmd(a: &PackArgs) -> brand_format::Result<ExitCode> {
    // Inputs that can only be read in order (gzip, zstd, Parquet, objects)
    // are listed once: a pack into a local OUT keeps its listing and spool
    // in `.OUT.listing` until it is installed, for a rerun after a crash.
    let listing_dir = match brand_store::Location::of_path(&a.out)? {
        brand_store::Location::Dir(_) => Some(brand_import::listing::dir_for(&a.out)?),
        brand_store::Location::Url(_) => None,
    };
    remove_unfinished_pack_on_interrupt(listing_dir.clone())?;
    let result = pack_listed(a, listing_dir.clone());
    if let Some(dir) = &listing_dir {
        match &result {
            Ok(_) => {
                brand_import::listing::settle(dir, true)?;
            }
            Err(_) => keep_or_remove_listing(dir),
        }
    }
    result
}

fn pack_listed(a: &PackArgs, listing_dir: Option<PathBuf>) -> brand_format::Result<ExitCode> {
    if let (Some(_), brand_store::Location::Url(u)) = (a.partitions, brand_store::Location::of_path(&a.out)?) {
        return Err(brand_format::Error::config(format!(
            "{u}: --partitions writes one directory per node's local disk, not to object storage (every node can read the whole dataset from the store)"
        )));
    }
    // OUT is checked first: a dataset there without --force fails before
    // any input is read.
    let policy = a.store.policy()?;
    let dest = brand_pack::Destination::prepare(&a.out, a.force, a.staging.as_deref(), &policy)?;
    let source = open_source(a, listing_dir, &policy)?;
    let partitions = match a.partitions {
        Some(w) => Some(partitioning(w, &a.memory, source.len() as u64, a.chunk_size)?),
        None => None,
    };
    let opts = PackOptions {
        partitions,
        chunk_size: a.chunk_size,
        seed: a.seed,
        zstd: a.zstd,
        segment_bytes: a.segment_mib.saturating_mul(1 << 20),
        force: a.force,
        inputs: a.inputs.iter().map(|p| p.display().to_string()).collect(),
    };
    let bar = progress_bar(source.len() as u64, "pack");
    let hooks = brand_pack::Hooks {
        progress: &|done, _, _| bar.set_position(done),
        cancel: &std::sync::atomic::AtomicBool::new(false),
    };
    let m = brand_pack::pack_to(source.as_ref(), dest, &opts, &hooks)?;
    bar.finish_and_clear();
    eprintln!(
        "packed {} samples into {} chunks, {} segment(s), {:.1} MiB, in {}",
        m.samples,
        m.chunks,
        m.segments.len(),
        m.data_bytes as f64 / (1 << 20) as f64,
        a.out.display()
    );
    eprintln!(
        "block padding {:.1} MiB ({:.2} % of the stored samples): no sample spans a 4 KiB block more than its size needs",
        m.block_padding_bytes as f64 / (1 << 20) as f64,
        100.0 * m.block_padding_bytes as f64 / m.stored_bytes.max(1) as f64
    );
    if let Some(p) = partitions {
        eprintln!(
            "as {} partitions ({}/part-0 … part-{}), groups of {} chunks; give part-w to node w",
            p.count,
            a.out.display(),
            p.count - 1,
            p.group_chunks
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect_cmd(a: &InspectArgs) -> brand_format::Result<ExitCode> {
    let ds = brand_store::open_any_with(&a.dataset, &a.store.policy()?)?;
    if a.samples {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for id in 0..ds.index.samples() {
            let key = String::from_utf8_lossy(ds.index.key(id));
            let line = writeln!(out, "{id}\t{}\t{key}", ds.index.label(id));
            match line {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
                Err(e) => return Err(brand_format::Error::io("<stdout>", e)),
            }
        }
        return match out.flush() {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(brand_format::Error::io("<stdout>", e)),
            _ => Ok(ExitCode::SUCCESS),
        };
    }
    let s = brand_store::inspect::summary(&ds);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(|e| brand_format::Error::config(e.to_string()))?
        );
    } else {
        print!("{s}");
    }
    Ok(ExitCode::SUCCESS)
}

fn verify_cmd(a: &VerifyArgs) -> brand_format::Result<ExitCode> {
    if a.rebuild_index {
        if let brand_store::Location::Url(u) = brand_store::Location::of_path(&a.dataset)? {
            return Err(brand_format::Error::config(format!(
                "{u}: --rebuild-index writes index.bin beside the segments: run it on a local copy, then upload index.bin"
            )));
        }
        let idx = brand_store::verify::rebuild_index(&a.dataset)?;
        eprintln!(
            "rebuilt index.bin: {} samples in {} chunks",
            idx.samples(),
            idx.chunk_count()
        );
    }
    let policy = a.store.policy()?;
    let ds = brand_store::open_any_with(&a.dataset, &policy)?;
    let bar = progress_bar(ds.index.chunk_count(), "verify");
    let report = brand_store::verify::verify_with(&ds, &policy, &|done, _| bar.set_position(done))?;
    bar.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| brand_format::Error::config(e.to_string()))?
        );
    } else {
        for p in &report.problems {
            println!("{p}");
        }
        let verdict = if report.ok() { "OK" } else { "FAILED" };
        let again = match report.fetched_again {
            0 => String::new(),
            n => format!("; {n} chunk(s) fetched again, damaged when first fetched"),
        };
        println!(
            "{verdict}: {} chunks, {} samples, {} problem(s){again}",
            report.chunks,
            report.samples,
            report.problems.len()
        );
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn cat_cmd(a: &CatArgs) -> brand_format::Result<ExitCode> {
    let policy = a.store.policy()?;
    let ds = brand_store::open_any_with(&a.dataset, &policy)?;
    let id = match (&a.key, a.id) {
        (Some(k), _) => ds
            .index
            .find_key(k.as_bytes())
            .ok_or_else(|| brand_format::Error::config(format!("no sample has key {k:?}")))?,
        (None, Some(id)) => id,
        (None, None) => return Err(brand_format::Error::config("give a sample id or --key")),
    };
    let bytes = brand_store::read_sample(&ds, id, &policy)?;
    let mut out = std::io::stdout().lock();
    match out.write_all(&bytes).and_then(|_| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // A closed pipe (`brand cat … | head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(brand_format::Error::io("<stdout>", e)),
    }
}
