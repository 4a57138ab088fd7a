//! Datasets in object storage, end to end: `brand pack -o s3://…` uploads to
//! a real S3 server (tools/s3-server: s3s-fs on 127.0.0.1, SigV4 on) and the
//! other commands read it back, through faults injected at the server. Every
//! test has its own server, so faults and counters are its own; the `brand`
//! processes get the endpoint and keys the way users give them
//! (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, …), and no `~/.aws`.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use brand_s3_server::{Listing, Options, Server};
use common::{gen_samples_with, s};

const SAMPLES: u64 = 300;

/// A server with a bucket, a dataset packed from generated files (kept
/// locally in `local` to compare with) and uploaded by `brand pack -o`.
struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    server: Server,
    local: PathBuf,
    url: String,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with_samples(SAMPLES, "24", "64")
    }

    /// `samples` samples of `mean_kib` on average, at most `max_kib`.
    fn with_samples(samples: u64, mean_kib: &str, max_kib: &str) -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let server = Server::start(&root.join("s3"), Options::default()).expect("start the S3 server");
        std::fs::create_dir_all(root.join("s3/bkt")).expect("bucket");
        let files = root.join("files");
        gen_samples_with(&files, samples, mean_kib, max_kib, "5", 11);
        let local = root.join("ds");
        common::ok(&["pack", s(&files), "-o", s(&local), "--chunk-size", "8", "--seed", "4"]);
        let f = Fixture {
            _tmp: tmp,
            root,
            server,
            local,
            url: "s3://bkt/sets/ds".into(),
        };
        let out = f.run(&[
            "pack",
            s(&files),
            "-o",
            &f.url,
            "--chunk-size",
            "8",
            "--seed",
            "4",
            "--staging",
            s(&f.root),
        ]);
        assert!(out.status.success(), "pack to s3: {}", stderr(&out));
        f
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_brand"));
        c.args(args)
            .env("RUST_BACKTRACE", "0")
            .env("AWS_ENDPOINT_URL", self.server.endpoint())
            .env("AWS_ACCESS_KEY_ID", "brand-test-ak")
            .env("AWS_SECRET_ACCESS_KEY", "brand-test-sk")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_CONFIG_FILE", self.root.join("no-aws-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", self.root.join("no-aws-credentials"))
            .env("XDG_CACHE_HOME", self.root.join("cache"))
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN");
        c
    }

    /// The bytes of the dataset's segment files.
    fn segment_bytes(&self) -> u64 {
        walk(&self.local)
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "brd"))
            .map(|p| std::fs::metadata(p).expect("segment").len())
            .sum()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run brand")
    }

    /// `brand read URL --json …`: each epoch's report (the command must succeed).
    fn read(&self, extra: &[&str]) -> Vec<serde_json::Value> {
        self.read_and_stderr(extra).0
    }

    /// `read`, and what it wrote to stderr.
    fn read_and_stderr(&self, extra: &[&str]) -> (Vec<serde_json::Value>, String) {
        let mut args = vec!["read", self.url.as_str(), "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        assert!(out.status.success(), "brand {args:?}: {}", stderr(&out));
        let epochs = serde_json::from_slice(&out.stdout).expect("read --json");
        (epochs, stderr(&out))
    }

    /// A command that must fail cleanly within `limit`: one error line,
    /// never a panic. Returns stderr.
    fn fails_within(&self, args: &[&str], limit: Duration) -> String {
        let start = Instant::now();
        let out = self.run(args);
        let took = start.elapsed();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "brand {args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(took < limit, "brand {args:?} took {took:?}: {err}");
        err
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn metric(epoch: &serde_json::Value, key: &str) -> u64 {
    epoch["metrics"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no metric {key}: {epoch}"))
}

fn retries_of(epochs: &[serde_json::Value], cause: &str) -> u64 {
    epochs
        .iter()
        .map(|e| e["metrics"]["store_retries_by_cause"][cause].as_u64().unwrap_or(0))
        .sum()
}

fn assert_exactly_once(epochs: &[serde_json::Value], n: usize) {
    assert_eq!(epochs.len(), n);
    for e in epochs {
        assert_eq!(e["samples"].as_u64(), Some(SAMPLES), "{e}");
        assert_eq!(e["exactly_once"].as_bool(), Some(true), "{e}");
    }
}

#[test]
fn a_dataset_packed_to_s3_reads_back_exactly_once_with_every_byte_equal() {
    let f = Fixture::new();
    // What the server holds is what was packed locally, byte for byte.
    for name in ["manifest.toml", "index.bin", "data-00000.brd"] {
        let stored = std::fs::read(f.root.join("s3/bkt/sets/ds").join(name)).expect("object");
        let local = std::fs::read(f.local.join(name)).expect("local");
        assert!(stored == local, "{name} differs");
    }
    let inspect = f.run(&["inspect", &f.url]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    assert!(String::from_utf8_lossy(&inspect.stdout).contains(&format!("{SAMPLES}")));
    let verify = f.run(&["verify", &f.url]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    for id in [0u64, 7, 150, SAMPLES - 1] {
        let remote = f.run(&["cat", &f.url, &id.to_string()]);
        assert!(remote.status.success(), "{}", stderr(&remote));
        let local = common::ok(&["cat", s(&f.local), &id.to_string()]);
        assert!(remote.stdout == local.stdout, "sample {id} differs");
    }
    f.server.reset_stats();
    let epochs = f.read(&["--epochs", "2", "--memory", "10%", "--read-gap", "whole"]);
    assert_exactly_once(&epochs, 2);
    // Whole chunks: about one GET per chunk read (neighbours merged), counted at the server.
    let reads: u64 = epochs.iter().map(|e| metric(e, "reads_issued")).sum();
    let stats = f.server.stats();
    assert!(
        stats.get_requests <= reads,
        "{} GETs for {reads} chunk reads",
        stats.get_requests
    );
    let fetched: u64 = epochs.iter().map(|e| metric(e, "store_bytes_fetched")).sum();
    assert!(stats.get_bytes >= fetched && fetched > 0, "{stats:?} against {fetched}");
    // The same order as from the local copy: the plan does not depend on where bytes are.
    let local = common::ok(&["read", s(&f.local), "--json", "--epochs", "2", "--memory", "10%"]);
    let local: Vec<serde_json::Value> = serde_json::from_slice(&local.stdout).expect("json");
    for (a, b) in epochs.iter().zip(&local) {
        assert_eq!(a["order"], b["order"]);
    }
    // The index is kept in the user's cache, mapped, and fetched once per
    // version: a later open GETs the manifest alone.
    let cache = f.root.join("cache/brand/index");
    // (Beside it, the hidden lock file of the processes fetching it.)
    let kept: Vec<PathBuf> = std::fs::read_dir(&cache)
        .expect("index cache")
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let index = std::fs::read(f.local.join("index.bin")).expect("index");
    assert!(std::fs::read(&kept[0]).expect("kept") == index);
    let opens = |want_gets: u64| {
        f.server.reset_stats();
        let out = f.run(&["inspect", &f.url]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(f.server.stats().get_requests, want_gets, "{:?}", f.server.stats());
    };
    opens(1);
    // A damaged cached copy is fetched again, never used.
    std::fs::write(&kept[0], &index[..100]).expect("damage");
    opens(2);
    assert!(std::fs::read(&kept[0]).expect("kept") == index);
    opens(1);
}

/// A run's first fill is fetched from the store record by record, each
/// record when its serve comes due (not a whole chunk for a request's one
/// record), and served in the order whole-chunk reads serve; the next
/// epoch's fill is read ahead whole.
#[test]
fn a_runs_first_fill_is_fetched_record_by_record_in_the_same_order() {
    // Chunks of 8 samples of 160 KiB: 1.25 MiB, above the 1 MiB a read
    // must reach to be split.
    let f = Fixture::with_samples(SAMPLES, "160", "200");
    let whole = f.read(&["--epochs", "2", "--memory", "10%", "--read-gap", "whole"]);
    assert_eq!(metric(&whole[0], "reads_deferred"), 0, "whole chunks asked for");
    f.server.reset_stats();
    let split = f.read(&["--epochs", "2", "--memory", "10%", "--read-gap", "0"]);
    assert_exactly_once(&split, 2);
    assert!(metric(&split[0], "reads_deferred") > 0, "{}", split[0]);
    assert_eq!(metric(&split[1], "reads_deferred"), 0, "{}", split[1]);
    for (a, b) in split.iter().zip(&whole) {
        assert_eq!(a["order"], b["order"]);
    }
}

/// `read_gap = auto` measures a store by fetching from it: for a dataset too
/// small for a full probe, about the dataset's size at most (it fetched
/// 616 MB for a 7.6 MB dataset), and nothing once the gap is kept.
#[test]
fn the_read_gap_probe_of_a_small_dataset_fetches_at_most_about_its_size() {
    let f = Fixture::new();
    let data = f.segment_bytes();
    let index = std::fs::metadata(f.local.join("index.bin")).expect("index").len();
    // (bytes, GETs) at the server beyond the read's own: the probe's, the
    // manifest and index, and read-ahead into an epoch not read.
    let beyond_the_read = || {
        f.server.reset_stats();
        let epochs = f.read(&["--memory", "10%"]);
        assert_exactly_once(&epochs, 1);
        let stats = f.server.stats();
        let (bytes, gets) = (
            metric(&epochs[0], "store_bytes_fetched"),
            metric(&epochs[0], "store_requests"),
        );
        (
            stats.get_bytes.saturating_sub(bytes),
            stats.get_requests.saturating_sub(gets),
        )
    };
    let (probed, _) = beyond_the_read();
    assert!(
        probed <= index + data + data / 4,
        "the probe and the open fetched {probed} bytes for a dataset of {data}"
    );
    // Once the gap is kept, the manifest alone: no probe, and no read-ahead
    // into an epoch `--epochs 1` does not read (it was 3 GETs, 865 kB).
    let (bytes, gets) = beyond_the_read();
    assert!(gets <= 1 && bytes < 4096, "{gets} GETs, {bytes} bytes beyond the read");
}

#[test]
fn the_read_gap_probe_of_a_store_is_one_wave_of_gets_not_seconds_of_them() {
    // A dataset larger than a full probe of a store reads at 8 in flight
    // (4 × 1 MiB, then 24 × 4 KiB): the probe is not bounded by its size.
    let f = Fixture::with_samples(300, "64", "128");
    let data = f.segment_bytes();
    assert!(
        data > 8 << 20,
        "the dataset is {data} bytes: too small to probe in full"
    );
    // The index in the cache first: the read's own open then GETs only the manifest.
    let out = f.run(&["inspect", &f.url]);
    assert!(out.status.success(), "{}", stderr(&out));
    f.server.reset_stats();
    let epochs = f.read(&["--memory", "10%", "--queue-depth", "8"]);
    assert_exactly_once(&epochs, 1);
    let stats = f.server.stats();
    let (probe_bytes, probe_gets) = (
        stats.get_bytes - metric(&epochs[0], "store_bytes_fetched"),
        stats.get_requests - metric(&epochs[0], "store_requests"),
    );
    // It was three rounds of up to 2,048 small GETs and 48 large ones
    // (0.25 s each, whichever first): hundreds of GETs on loopback, and
    // (bounded by the dataset's size) about the dataset in bytes.
    assert!(
        // (+ the read's own open: its manifest)
        probe_gets <= 4 + 24 + 1 && probe_bytes <= (4 << 20) + 24 * 4096 + (64 << 10),
        "the probe fetched {probe_gets} GETs, {probe_bytes} bytes (dataset {data})"
    );
    assert!(probe_gets >= 4 + 8, "no probe ran: {probe_gets} GETs beyond the read");
}

#[test]
fn processes_opening_together_on_a_new_machine_probe_once() {
    // Four readers at once with nothing cached (a DataLoader's workers, a
    // node's ranks): one measures, the others wait for its result.
    let f = Fixture::with_samples(300, "64", "128");
    f.server.reset_stats();
    let children: Vec<_> = (0..4)
        .map(|_| {
            f.command(&["read", &f.url, "--json", "--memory", "10%", "--queue-depth", "8"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut own_gets = 0;
    let mut gaps = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{}", stderr(&out));
        let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("read --json");
        assert_exactly_once(&epochs, 1);
        own_gets += metric(&epochs[0], "store_requests");
        gaps.push(epochs[0]["metrics"]["read_gap"].clone());
    }
    let beyond = f.server.stats().get_requests - own_gets;
    // One probe (4 + 24 GETs), each process's manifest and at most each its
    // index; four probes were 112 GETs more.
    assert!(beyond <= 28 + 4 + 4, "{beyond} GETs beyond the reads' own");
    assert!(gaps.iter().all(|g| *g == gaps[0]), "one gap for all: {gaps:?}");
}

#[test]
fn bursts_of_503_and_cut_bodies_are_retried_and_counted_without_a_wrong_byte() {
    let f = Fixture::new();
    f.server.faults().set_key_filter(Some("data-"));
    f.server.faults().fail_gets(6, 503);
    let (epochs, told) = f.read_and_stderr(&["--memory", "10%", "--read-gap", "whole"]);
    assert_exactly_once(&epochs, 1);
    assert_eq!(retries_of(&epochs, "503"), 6, "{}", epochs[0]["metrics"]);
    // Said at once, and once for the burst (at most every 10 s), naming
    // the object and the status.
    let warnings: Vec<&str> = told.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(warnings.len(), 1, "{told}");
    assert!(warnings[0].contains("data-") && warnings[0].contains("503"), "{told}");
    f.server.faults().cut_bodies(4, 5000);
    let (epochs, told) = f.read_and_stderr(&["--memory", "10%", "--read-gap", "whole"]);
    assert_exactly_once(&epochs, 1);
    assert_eq!(retries_of(&epochs, "cut"), 4, "{}", epochs[0]["metrics"]);
    // Resumed bodies made progress: counted, not told.
    assert!(!told.contains("retrying"), "{told}");
    // Chunks of more GET parts than GETs allowed in flight (192 KiB in
    // 64 KiB parts, 2 at a time): they take turns, never wait for each
    // other (this deadlocked: the bench's 2 × 1 MiB sweep point).
    f.server.faults().clear();
    let epochs = f.read(&[
        "--memory",
        "10%",
        "--read-gap",
        "whole",
        "--gets-in-flight",
        "2",
        "--get-size",
        "64KiB",
    ]);
    assert_exactly_once(&epochs, 1);
    // (That a cut body is resumed, not fetched again, is brand-store's
    // tests/get.rs: here reads run ahead into the next epoch, which blurs
    // the count of bytes.)
}

#[test]
fn a_record_damaged_on_the_way_is_fetched_again_and_one_damaged_every_time_is_an_error() {
    let f = Fixture::new();
    f.server.faults().set_key_filter(Some("data-"));
    // `brand verify` and `brand cat` too. Verify's GETs are whole chunks,
    // 16 at a time in no set order: its first byte, the chunk header's
    // magic, is a byte verify always checks (a byte further in may fall in
    // the padding between records, which nothing reads). One flipped GET:
    // the dataset is whole.
    f.server.faults().flip_bytes(1, 0);
    let verify = f.run(&["verify", &f.url, "--json"]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    let report: serde_json::Value = serde_json::from_slice(&verify.stdout).expect("verify --json");
    assert_eq!(report["fetched_again"], 1, "{report}");
    f.server.faults().flip_bytes(1, 100);
    let remote = f.run(&["cat", &f.url, "7"]);
    assert!(remote.status.success(), "{}", stderr(&remote));
    assert!(remote.stdout == common::ok(&["cat", s(&f.local), "7"]).stdout);
    // One byte inverted 20 kB into the first GET of whole chunks, every
    // record of which is read (all memory): a record fails its crc32c, and
    // the GET is made again. One GET at a time, so the first is the plan's
    // first (with GETs at once, any could be, and 20 kB into some chunks is
    // padding after a record, never read: 1 run in 30 or so).
    const IN_A_RECORD: u64 = 20_000;
    let args = ["--memory", "100%", "--read-gap", "whole", "--gets-in-flight", "1"];
    let clean = f.read(&args);
    f.server.faults().flip_bytes(1, IN_A_RECORD);
    let epochs = f.read(&args);
    assert_exactly_once(&epochs, 1);
    assert_eq!(retries_of(&epochs, "crc"), 1, "{}", epochs[0]["metrics"]);
    // Only the damaged read is fetched again (here a GET of one chunk: the
    // first GET of a run alone in flight; objects.rs tests a group's split).
    let fetched = |e: &[serde_json::Value]| metric(&e[0], "store_bytes_fetched");
    let again = fetched(&epochs) - fetched(&clean);
    assert!(
        again > 0 && again <= 8 * (64 << 10) + 4096,
        "{again} bytes fetched again"
    );
    // Damaged again, the damage is the object's: an error naming where.
    f.server.faults().flip_bytes(u64::MAX, IN_A_RECORD);
    let err = f.fails_within(
        &["read", &f.url, "--memory", "100%", "--read-gap", "whole"],
        Duration::from_secs(30),
    );
    assert!(
        err.contains("data-00000.brd: chunk") && err.contains("sample") && err.contains("crc32c mismatch"),
        "{err}"
    );
    let verify = f.run(&["verify", &f.url]);
    let out = String::from_utf8_lossy(&verify.stdout);
    assert!(!verify.status.success() && out.contains("crc32c mismatch"), "{out}");
}

#[test]
fn a_dataset_of_many_segments_is_opened_from_a_listing_not_a_head_each() {
    let f = Fixture::new();
    let files = f.root.join("large-files");
    gen_samples_with(&files, 40, "500", "600", "2", 5);
    let url = "s3://bkt/sets/many";
    let pack = [
        "pack",
        s(&files),
        "-o",
        url,
        "--chunk-size",
        "1",
        "--segment-mib",
        "1",
        "--staging",
        s(&f.root),
    ];
    let out = f.run(&pack);
    assert!(out.status.success(), "{}", stderr(&out));
    let segments = std::fs::read_dir(f.root.join("s3/bkt/sets/many"))
        .expect("objects")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("data-"))
        .count() as u64;
    assert!(segments > 16, "{segments} segments");
    let read = || {
        f.server.reset_stats();
        let out = f.run(&["read", url, "--json", "--memory", "25%", "--read-gap", "whole"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("read --json");
        assert_eq!(epochs[0]["samples"], 40, "{}", epochs[0]);
        assert_eq!(epochs[0]["exactly_once"], true, "{}", epochs[0]);
        f.server.stats()
    };
    // A listing (and a HEAD that checks its entity tags are a HEAD's), not
    // a HEAD per segment; every GET is pinned (If-Match) to the listed tags.
    let listed = read();
    assert!(
        listed.list_requests >= 1 && listed.head_requests < 5,
        "{segments} segments: {listed:?}"
    );
    // A credential that may read but not list, or a listing without entity
    // tags (nothing to pin GETs to): a HEAD per segment.
    for listing in [Listing::Denied, Listing::Untagged] {
        f.server.faults().set_listing(listing);
        let headed = read();
        assert!(
            headed.head_requests >= segments,
            "{listing:?}, {segments} segments: {headed:?}"
        );
    }
}

#[test]
fn processes_opening_a_url_at_once_fetch_its_index_once_between_them() {
    let f = Fixture::new();
    // The index's GETs slowed, so that every open overlaps the first fetch.
    f.server.faults().set_key_filter(Some("index.bin"));
    f.server.faults().delay_gets(Duration::from_millis(500));
    let _ = std::fs::remove_dir_all(f.root.join("cache"));
    f.server.reset_stats();
    let opens: Vec<std::process::Child> = (0..6)
        .map(|_| {
            f.command(&["inspect", &f.url])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for open in opens {
        let out = open.wait_with_output().expect("wait");
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // A GET of the manifest each, and of the index once.
    let stats = f.server.stats();
    assert_eq!(stats.get_requests, 7, "{stats:?}");
}

/// The first open of a dataset on a machine fetches its index into the
/// cache file through a mapping (page cache), not onto the heap: with the
/// process's private writable memory (RLIMIT_DATA, which shared file
/// mappings do not count) below the index's size, it opens (a process
/// needs ~30 MiB of its own); fetched into a Vec, it aborts with "memory
/// allocation of … bytes failed".
#[test]
fn the_first_open_of_a_large_index_holds_none_of_it_on_the_heap() {
    let f = Fixture::new();
    let records = f.root.join("records");
    common::ok(&[
        "gen",
        s(&records),
        "--samples",
        "1000000",
        "--mean-bytes",
        "64",
        "--min-bytes",
        "32",
        "--max-bytes",
        "96",
        "--format",
        "tfrecord",
    ]);
    let sources: Vec<String> = walk(&records).iter().map(|p| s(p).to_string()).collect();
    let url = "s3://bkt/sets/large-index";
    let mut pack = vec!["pack", "--from", "tfrecord"];
    pack.extend(sources.iter().map(String::as_str));
    pack.extend(["-o", url, "--staging", s(&f.root)]);
    let out = f.run(&pack);
    assert!(out.status.success(), "{}", stderr(&out));
    let index = std::fs::metadata(f.root.join("s3/bkt/sets/large-index/index.bin"))
        .expect("index")
        .len();
    const DATA_LIMIT: u64 = 48 << 20;
    assert!(index > DATA_LIMIT, "an index of {index} bytes");
    let _ = std::fs::remove_dir_all(f.root.join("cache"));
    let mut inspect = f.command(&["inspect", url]);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the
    // parent; the closure only calls it between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        inspect.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: DATA_LIMIT,
                rlim_max: DATA_LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = inspect.output().expect("run brand");
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1000000"));
}

#[test]
fn a_server_that_stops_answering_is_an_error_in_bounded_time() {
    let f = Fixture::new();
    f.server.faults().set_key_filter(Some("data-"));
    // One stalled GET is retried after the stall timeout and the read
    // completes (a small read-ahead, so the GET stalled is one this epoch
    // needs, not one read ahead for the next).
    f.server.faults().stall_gets(1, 100);
    let epochs = f.read(&[
        "--memory",
        "10%",
        "--read-gap",
        "whole",
        "--readahead",
        "1MiB",
        "--config",
        &stall_config(&f),
    ]);
    assert_exactly_once(&epochs, 1);
    assert_eq!(retries_of(&epochs, "stall"), 1, "{}", epochs[0]["metrics"]);
    // Then it answers nothing at all: an error naming the read, in bounded time.
    f.server.faults().stall_all(true);
    let err = f.fails_within(
        &["read", &f.url, "--memory", "10%", "--config", &stall_config(&f)],
        Duration::from_secs(30),
    );
    assert!(err.contains("data-00000.brd"), "{err}");
    f.server.faults().clear();
}

/// A TCP relay on 127.0.0.1 to `upstream` that resets every other
/// connection it accepts (the first one first) 50 ms after accepting it,
/// reading nothing (SO_LINGER 0: an RST, as a load balancer dropping a
/// connection sends), so an upload is mid-body, waiting for room to
/// write; the others are relayed both ways.
struct ResettingRelay {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    resets: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl ResettingRelay {
    fn start(upstream: std::net::SocketAddr) -> ResettingRelay {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let resets = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stopped, reset) = (stop.clone(), resets.clone());
        std::thread::spawn(move || {
            for (i, client) in listener.incoming().enumerate() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if i % 2 == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                    let linger = libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    };
                    // SAFETY: a valid socket of this thread's; the option's value is a
                    // `linger` of the size passed.
                    unsafe {
                        libc::setsockopt(
                            std::os::fd::AsRawFd::as_raw_fd(&client),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            (&linger as *const libc::linger).cast(),
                            std::mem::size_of::<libc::linger>() as libc::socklen_t,
                        );
                    }
                    reset.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().expect("clone"), server.try_clone().expect("clone")),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        ResettingRelay { port, stop, resets }
    }
}

impl Drop for ResettingRelay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

#[test]
fn connections_reset_by_the_peer_are_retried_by_pack_and_read() {
    // Uploads and GETs cut by an RST are retried; the process is never
    // killed by SIGPIPE. (Whether a write meets EPIPE, which raises it, or
    // ECONNRESET depends on which of hyper's read and write sees the reset
    // first: behind a proxy resetting one new connection in two, a 120 MB
    // multipart pack died with status 141 every time before the store's
    // threads blocked SIGPIPE; runtime.rs tests that they do.)
    let f = Fixture::new();
    let upstream: std::net::SocketAddr = f.server.endpoint().trim_start_matches("http://").parse().expect("addr");
    let relay = ResettingRelay::start(upstream);
    let endpoint = format!("http://127.0.0.1:{}", relay.port);
    let staging = f.root.join("relay-staging");
    std::fs::create_dir_all(&staging).expect("staging");
    // Segments of 8 MiB, each one PUT (under the multipart part size), in
    // turn over one kept-alive connection: the first connection is reset
    // mid-body (bodies larger than a socket's buffers), the retry's is not.
    let files = f.root.join("large-files");
    gen_samples_with(&files, 64, "512", "600", "3", 5);
    let url = "s3://bkt/sets/through-relay";
    let out = f
        .command(&[
            "pack",
            s(&files),
            "-o",
            url,
            "--segment-mib",
            "8",
            "--chunk-size",
            "8",
            "--staging",
            s(&staging),
        ])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .output()
        .expect("run brand");
    assert!(
        out.status.success(),
        "pack through the relay: {:?} {}",
        out.status,
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_dir(&staging).expect("staging").count(),
        0,
        "staging left behind"
    );
    let out = f
        .command(&["read", url, "--json", "--epochs", "2", "--memory", "10%"])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .output()
        .expect("run brand");
    assert!(
        out.status.success(),
        "read through the relay: {:?} {}",
        out.status,
        stderr(&out)
    );
    let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("read --json");
    assert_eq!(epochs.len(), 2);
    for e in &epochs {
        assert_eq!(e["samples"].as_u64(), Some(64), "{e}");
        assert_eq!(e["exactly_once"].as_bool(), Some(true), "{e}");
    }
    assert!(relay.resets.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    // Every record whole (headers, crc32c).
    let out = f.command(&["verify", url]).output().expect("run brand");
    assert!(out.status.success(), "verify: {}", stderr(&out));
}

fn stall_config(f: &Fixture) -> String {
    let p = f.root.join("stall.toml");
    std::fs::write(&p, "stall_timeout = 0.5\nio_timeout = 4\n").expect("config");
    s(&p).to_string()
}

#[test]
fn missing_buckets_prefixes_and_refused_credentials_are_named_without_the_secret() {
    let f = Fixture::new();
    let limit = Duration::from_secs(20);
    let err = f.fails_within(&["read", "s3://nobkt/sets/ds"], limit);
    assert!(
        err.contains("s3://nobkt/sets/ds") && err.contains("bucket nobkt does not exist"),
        "{err}"
    );
    let err = f.fails_within(&["read", "s3://bkt/sets/other"], limit);
    assert!(
        err.contains("s3://bkt/sets/other") && err.contains("nothing under this prefix"),
        "{err}"
    );
    let err = f.fails_within(&["read", "s3://bkt/sets"], limit);
    assert!(err.contains("not a dataset"), "{err}");
    let out = f
        .command(&["read", &f.url])
        .env("AWS_SECRET_ACCESS_KEY", "wrong-secret-XYZZY")
        .stderr(Stdio::piped())
        .output()
        .expect("run");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("access refused") && err.contains(&f.url), "{err}");
    assert!(!err.contains("XYZZY"), "the secret leaked: {err}");
    // S3's answer for a missing key to credentials that may not list the
    // bucket is 403 too (a HEAD's, without a body to tell them apart): the
    // error says it may be the URL.
    assert!(err.contains("check the URL"), "{err}");
    f.server.faults().set_key_filter(Some("manifest"));
    f.server.faults().fail_gets(100, 403);
    let err = f.fails_within(&["inspect", &f.url], limit);
    assert!(err.contains("access refused") && err.contains("check the URL"), "{err}");
    f.server.faults().clear();
    // Signed for another region than the bucket's: S3's 400 comes to a
    // HEAD without a body, so the error says what usually causes it.
    let out = f
        .command(&["inspect", &f.url])
        .env("AWS_REGION", "eu-west-1")
        .output()
        .expect("run");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&f.url) && err.contains("400") && err.contains("AWS_REGION is not the bucket's region"),
        "{err}"
    );
    let err = f.fails_within(&["read", "s3://user:SECRETPW@bkt/ds"], limit);
    assert!(!err.contains("SECRETPW"), "{err}");
}

#[test]
fn a_truncated_segment_object_is_refused_at_open_naming_it() {
    let f = Fixture::new();
    let seg = f.root.join("s3/bkt/sets/ds/data-00000.brd");
    let bytes = std::fs::read(&seg).expect("segment");
    put_object(&f, "sets/ds/data-00000.brd", bytes[..bytes.len() / 2].to_vec());
    let err = f.fails_within(&["read", &f.url], Duration::from_secs(20));
    assert!(
        err.contains("s3://bkt/sets/ds/data-00000.brd") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn an_object_replaced_during_a_run_is_an_error_never_a_mix() {
    let f = Fixture::new();
    let seg = f.root.join("s3/bkt/sets/ds/data-00000.brd");
    let mut bytes = std::fs::read(&seg).expect("segment");
    // Slow consumption and little memory: reads go on while it is replaced.
    f.server.reset_stats();
    let mut child = f
        .command(&[
            "read",
            &f.url,
            "--memory",
            "10%",
            "--readahead",
            "64KiB",
            "--read-gap",
            "whole",
            "--compute-ms",
            "100",
            "--epochs",
            "3",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Replaced once the read is under way (the manifest, the index and data
    // GETs: a replacement before the open is simply the dataset it opens),
    // not after a fixed sleep, which a slow start outlasted.
    let deadline = Instant::now() + Duration::from_secs(60);
    while f.server.stats().get_requests < 4 {
        assert!(Instant::now() < deadline, "brand read fetched nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Same size, other bytes: only the entity tag tells.
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    put_object(&f, "sets/ds/data-00000.brd", bytes);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "brand read did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err).expect("read stderr");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("changed since the dataset was opened") && err.contains("data-00000.brd"),
        "{err}"
    );
}

#[test]
fn pack_to_a_url_refuses_to_replace_a_dataset_without_force_and_replaces_it_whole_with_it() {
    let f = Fixture::new();
    let files = f.root.join("files");
    let pack = |force: bool| {
        let mut args = vec![
            "pack",
            s(&files),
            "-o",
            &f.url,
            "--chunk-size",
            "16",
            "--seed",
            "9",
            "--staging",
            s(&f.root),
        ];
        if force {
            args.push("--force");
        }
        f.run(&args)
    };
    let out = pack(false);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already holds a dataset"), "{}", stderr(&out));
    // The first version's index is kept in the user's cache…
    let cache = f.root.join("cache/brand/index");
    let cached = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&cache)
            .expect("index cache")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert!(f.run(&["inspect", &f.url]).status.success());
    let first = cached();
    assert_eq!(first.len(), 2, "the index and its lock file: {first:?}");
    let out = pack(true);
    assert!(out.status.success(), "{}", stderr(&out));
    let inspect = f.run(&["inspect", &f.url, "--json"]);
    let summary: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("json");
    assert_eq!(summary["chunk_size"].as_u64(), Some(16), "{summary}");
    assert_exactly_once(&f.read(&["--memory", "10%"]), 1);
    // …and replaced by the second's, lock file and all.
    let second = cached();
    assert_eq!(second.len(), 2, "{second:?}");
    assert!(second.iter().all(|n| !first.contains(n)), "{first:?} then {second:?}");
    let kept = second.iter().find(|n| !n.starts_with('.')).expect("the index");
    let index = std::fs::read(f.root.join("s3/bkt/sets/ds/index.bin")).expect("index");
    assert!(std::fs::read(cache.join(kept)).expect("kept") == index);
    // Nothing of the staging is left behind.
    let left: Vec<_> = std::fs::read_dir(&f.root)
        .expect("root")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("brand-pack-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(common::hidden_entries(&f.root).is_empty());
    // Partitions are for nodes' local disks, not a store.
    let err = common::fails(&[
        "pack",
        s(&files),
        "-o",
        "s3://bkt/parts",
        "--partitions",
        "2",
        "--memory",
        "10%",
    ]);
    assert!(err.contains("--partitions") && err.contains("s3://bkt/parts"), "{err}");
}

#[test]
fn pack_to_a_url_uploads_segments_as_written_and_a_failed_pack_leaves_no_object() {
    let f = Fixture::new();
    let files = f.root.join("files");
    // A list of the generated files, then one sample larger than a 1 MiB
    // segment, packed late: the pack fails at its chunk, after segments
    // were uploaded.
    let mut names: Vec<String> = Vec::new();
    for class in std::fs::read_dir(&files)
        .expect("files")
        .map(|e| e.expect("entry").path())
    {
        for file in std::fs::read_dir(&class)
            .expect("class")
            .map(|e| e.expect("entry").path())
        {
            names.push(file.strip_prefix(&files).expect("under files").display().to_string());
        }
    }
    names.sort();
    std::fs::write(files.join("big.bin"), vec![7u8; 3 << 20]).expect("big sample");
    names.push("big.bin".into());
    let n = names.len();
    let list = files.join("list.txt");
    std::fs::write(&list, names.iter().map(|p| format!("{p}\t1\n")).collect::<String>()).expect("list");
    // A seed that packs the big sample (the last entry) past 60 % of the samples.
    let seed = (0u64..)
        .find(|&seed| {
            let order = brand_format::rng::Prng::stream(seed, &[brand_format::rng::domain::PACK]).permutation(n);
            order
                .iter()
                .position(|&src| src as usize == n - 1)
                .is_some_and(|p| p * 10 > n * 6)
        })
        .expect("a seed");
    let stage = f.root.join("stage");
    std::fs::create_dir(&stage).expect("stage");
    f.server.reset_stats();
    let seed_text = seed.to_string();
    let args = [
        "pack",
        "--from",
        "list",
        s(&list),
        "-o",
        "s3://bkt/fails",
        "--chunk-size",
        "8",
        "--segment-mib",
        "1",
        "--seed",
        &seed_text,
        "--staging",
        s(&stage),
    ];
    let err = f.fails_within(&args, Duration::from_secs(60));
    assert!(
        err.contains("more than the segment size") && err.contains("big.bin"),
        "{err}"
    );
    assert!(
        f.server.stats().put_requests >= 3,
        "segments should have been uploaded before the failure: {:?}",
        f.server.stats()
    );
    // What was uploaded is deleted again: no object under the prefix.
    let left: Vec<_> = walk(&f.root.join("s3/bkt/fails"));
    assert!(left.is_empty(), "objects left under s3://bkt/fails: {left:?}");
    assert_eq!(
        std::fs::read_dir(&stage).expect("stage").count(),
        0,
        "staging not cleaned"
    );

    // Without the big sample the same pack succeeds, segment by segment, and
    // reads back; nothing stays in the staging directory.
    names.pop();
    std::fs::write(&list, names.iter().map(|p| format!("{p}\t1\n")).collect::<String>()).expect("list");
    let mut ok = args.to_vec();
    ok[5] = "s3://bkt/streamed";
    let out = f.run(&ok);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_dir(&stage).expect("stage").count(),
        0,
        "staging not cleaned"
    );
    let inspect = f.run(&["inspect", "s3://bkt/streamed", "--json"]);
    let summary: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("json");
    assert!(summary["segments"].as_u64().is_some_and(|n| n >= 5), "{summary}");
    let verify = f.run(&["verify", "s3://bkt/streamed"]);
    assert!(verify.status.success(), "{}", stderr(&verify));
}

/// Every file under `dir` (none if it is missing).
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Replaces object `key` of bucket `bkt` through the S3 API (a new ETag).
fn put_object(f: &Fixture, key: &str, bytes: Vec<u8>) {
    use object_store::ObjectStoreExt;
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(f.server.endpoint())
        .with_allow_http(true)
        .with_bucket_name("bkt")
        .with_region("us-east-1")
        .with_access_key_id("brand-test-ak")
        .with_secret_access_key("brand-test-sk")
        .build()
        .expect("client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(store.put(&object_store::path::Path::from(key), bytes.into()))
        .expect("put");
}

/// Two epochs of `brand serve` in 32 slots, whole chunks, batches of 8.
const SERVE_TWO_EPOCHS: [&str; 8] = [
    "--memory",
    "32 slots",
    "--read-gap",
    "whole",
    "--batch",
    "8",
    "--epochs",
    "2",
];

/// `brand serve --json` reports of one job of `world` processes over the
/// fixture's URL, each run with `args` after its rank's.
fn serve_all(f: &Fixture, world: usize, args: &[&str]) -> Vec<serde_json::Value> {
    serve_each(f, world, |_| args.iter().map(|a| a.to_string()).collect())
}

/// [`serve_all`] with each rank's own `args`.
fn serve_each(f: &Fixture, world: usize, args: impl Fn(usize) -> Vec<String>) -> Vec<serde_json::Value> {
    let nodes = common::addresses(world);
    let children: Vec<std::process::Child> = (0..world)
        .map(|rank| {
            let rank_text = rank.to_string();
            let joined = nodes.join(",");
            let mut argv = vec!["serve", &f.url, "--nodes"];
            argv.extend([joined.as_str(), "--rank", &rank_text, "--json"]);
            let own = args(rank);
            argv.extend(own.iter().map(String::as_str));
            f.command(&argv)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn brand serve")
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(rank, c)| {
            let out = c.wait_with_output().expect("serve");
            assert!(out.status.success(), "rank {rank}: {}", stderr(&out));
            serde_json::from_slice(&out.stdout).expect("json")
        })
        .collect()
}

/// Nodes of a job, each with a tier of its own (a machine's disk), keep
/// only the chunks they own: no chunk in two tiers, every chunk in one, so
/// the job holds the nodes' tiers' worth; a restarted job fetches nothing.
#[test]
fn serve_nodes_keep_their_own_chunks_in_their_own_tiers() {
    let f = Fixture::new();
    let args = |rank: usize| {
        let config = f.root.join(format!("node-{rank}.toml"));
        let tier = f.root.join(format!("tier-{rank}"));
        std::fs::write(&config, format!("disk_cache = {:?}\n", tier.to_string_lossy())).expect("config");
        ["--config", s(&config)]
            .iter()
            .chain(&SERVE_TWO_EPOCHS)
            .map(|a| a.to_string())
            .collect()
    };
    f.server.reset_stats();
    for (rank, report) in serve_each(&f, 3, args).iter().enumerate() {
        for e in report["epochs"].as_array().expect("epochs") {
            assert_eq!(e["samples"].as_u64(), Some(SAMPLES / 3), "rank {rank}");
        }
    }
    let dataset = f.segment_bytes();
    let fetched = f.server.stats().get_bytes;
    assert!(
        fetched >= dataset && fetched <= dataset + dataset / 10,
        "{fetched} for {dataset}"
    );
    // Each tier's kept chunks (entries of its one version's table).
    let kept: Vec<Vec<bool>> = (0..3)
        .map(|rank| {
            let [dir] = &version_dirs(&f.root.join(format!("tier-{rank}")))[..] else {
                panic!("rank {rank}: one version")
            };
            std::fs::read(dir.join("chunks"))
                .expect("chunks")
                .chunks_exact(8)
                .map(|e| u64::from_le_bytes(e.try_into().expect("entry")) != 0)
                .collect()
        })
        .collect();
    for c in 0..kept[0].len() {
        let holders = kept.iter().filter(|k| k[c]).count();
        assert_eq!(holders, 1, "chunk {c} is kept by {holders} nodes");
    }
    f.server.reset_stats();
    for report in serve_each(&f, 3, args) {
        assert_eq!(report["closed"]["store_requests"].as_u64(), Some(0), "{report}");
    }
    // (Each open GETs the manifest; the index is in each process's cache.)
    assert_eq!(f.server.stats().get_requests, 3, "{:?}", f.server.stats());
}

#[test]
fn three_serve_processes_read_each_chunk_of_a_url_once_between_them() {
    let f = Fixture::new();
    f.server.reset_stats();
    let reports = serve_all(&f, 3, &SERVE_TWO_EPOCHS);
    let (mut read, mut reads) = (0u64, 0u64);
    for (rank, report) in reports.iter().enumerate() {
        for e in report["epochs"].as_array().expect("epochs") {
            assert_eq!(e["samples"].as_u64(), Some(SAMPLES / 3), "rank {rank}");
        }
        read += report["closed"]["bytes_read"].as_u64().expect("bytes_read");
        reads += report["closed"]["reads_issued"].as_u64().expect("reads_issued");
    }
    // Each chunk the world's plan reads is fetched by its owner only.
    let ds = brand_format::Dataset::open(&f.local).expect("open");
    let mut plan = brand_plan::PlanConfig::new(brand_plan::Memory::Slots(32));
    plan.world = 3;
    let planner = brand_plan::Planner::new(&ds.index, &plan).expect("planner");
    let world: u64 = (0..2)
        .flat_map(|e| planner.global_epoch(e).reads().to_vec())
        .map(|r| ds.index.chunk_padded_len(r.chunk as u64))
        .sum();
    assert_eq!(read, world, "bytes read across the nodes");
    let gets = f.server.stats().get_requests;
    assert!(gets <= reads, "{gets} GETs for {reads} chunk reads");
}

#[test]
fn serve_processes_fetch_their_first_fill_record_by_record_and_later_epochs_whole() {
    // Chunks of 8 samples of 160 KiB: 1.25 MiB, above the 1 MiB a read
    // must reach to be split.
    let f = Fixture::with_samples(SAMPLES, "160", "200");
    let reports = serve_all(
        &f,
        2,
        &["--memory", "10%", "--read-gap", "0", "--batch", "8", "--epochs", "2"],
    );
    let mut split = 0;
    for (rank, report) in reports.iter().enumerate() {
        let epochs = report["epochs"].as_array().expect("epochs");
        for e in epochs {
            assert_eq!(e["samples"].as_u64(), Some(SAMPLES / 2), "rank {rank}");
        }
        let deferred = |e: &serde_json::Value| e["metrics"]["reads_deferred"].as_u64().expect("reads_deferred");
        assert_eq!(
            deferred(&epochs[1]),
            deferred(&epochs[0]),
            "rank {rank}: none split after the start"
        );
        split += deferred(&epochs[0]);
    }
    assert!(split > 0, "no read split: {reports:?}");
}

#[test]
fn a_cache_reads_a_url_once_for_the_jobs_attached_to_it() {
    let f = Fixture::new();
    let socket = f.root.join("cache.sock");
    let mut cache = f
        .command(&[
            "cache",
            &f.url,
            "--memory",
            "25%",
            "--read-gap",
            "whole",
            "--json",
            "--socket",
        ])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn brand cache");
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "the cache did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let jobs: Vec<std::process::Child> = (1..=2)
        .map(|seed| {
            f.command(&[
                "read",
                &f.url,
                "--json",
                "--batch",
                "10",
                "--seed",
                &seed.to_string(),
                "--cache",
            ])
            .arg(&socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn job")
        })
        .collect();
    for j in jobs {
        let out = j.wait_with_output().expect("job");
        assert!(out.status.success(), "{}", stderr(&out));
        let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
        assert_exactly_once(&epochs, 1);
        // An attached job reads no storage: the cache's GETs fed it.
        assert_eq!(metric(&epochs[0], "store_requests"), 0, "{}", epochs[0]);
    }
    assert!(f.server.stats().get_requests > 0);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(cache.id() as i32, libc::SIGINT) };
    let status = cache.wait().expect("cache");
    assert!(status.success(), "{status}");
}

/// A dataset at an `http(s)://` URL (a public bucket: a second server on the
/// same directory that takes unsigned requests, and no credentials in the
/// environment) reads as from `s3://`: exactly once over 2 epochs in the
/// same order, the same bytes; a tar object there packs as the local file.
/// A missing dataset is an error naming the URL.
#[test]
fn a_dataset_at_an_http_url_reads_and_packs_without_credentials() {
    let f = Fixture::new();
    let public = Server::start(
        &f.root.join("s3"),
        Options {
            anonymous: true,
            ..Options::default()
        },
    )
    .expect("start the public server");
    let url = format!("{}/bkt/sets/ds", public.endpoint());
    let bare = |args: &[&str]| -> Output {
        Command::new(env!("CARGO_BIN_EXE_brand"))
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .env("AWS_CONFIG_FILE", f.root.join("no-aws-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", f.root.join("no-aws-credentials"))
            .env("XDG_CACHE_HOME", f.root.join("http-cache"))
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .output()
            .expect("run brand")
    };
    let out = bare(&["read", &url, "--json", "--epochs", "2", "--memory", "10%"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert_exactly_once(&epochs, 2);
    let local = common::ok(&["read", s(&f.local), "--json", "--epochs", "2", "--memory", "10%"]);
    let local: Vec<serde_json::Value> = serde_json::from_slice(&local.stdout).expect("json");
    for (a, b) in epochs.iter().zip(&local) {
        assert_eq!(a["order"], b["order"]);
    }
    for id in [0u64, 150, SAMPLES - 1] {
        let remote = bare(&["cat", &url, &id.to_string()]);
        assert!(remote.status.success(), "{}", stderr(&remote));
        let local = common::ok(&["cat", s(&f.local), &id.to_string()]);
        assert!(remote.stdout == local.stdout, "sample {id} differs");
    }
    // A tar object as a pack's input.
    let tar = common::ustar(&[("a.txt", &b"first"[..]), ("b.txt", b"second")]);
    put_object(&f, "shards/one.tar", tar.clone());
    std::fs::write(f.root.join("one.tar"), &tar).expect("write");
    let from_url = f.root.join("from-url");
    let out = bare(&[
        "pack",
        "--from",
        "tar",
        &format!("{}/bkt/shards/one.tar", public.endpoint()),
        "-o",
        s(&from_url),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let from_file = f.root.join("from-file");
    common::ok(&["pack", "--from", "tar", s(&f.root.join("one.tar")), "-o", s(&from_file)]);
    for name in ["data-00000.brd", "index.bin"] {
        let read = |d: &PathBuf| std::fs::read(d.join(name)).expect("dataset file");
        assert!(read(&from_url) == read(&from_file), "{name} differs");
    }
    // HTTP lists nothing: a prefix is refused by name, at once (no retries).
    let prefix = format!("{}/bkt/shards/", public.endpoint());
    let out = bare(&["pack", "--from", "tar", &prefix, "-o", s(&f.root.join("none"))]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("names one object"), "{err}");
    let missing = format!("{}/bkt/sets/none", public.endpoint());
    let out = bare(&["inspect", &missing]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&missing) && !err.contains("panicked"), "{err}");
}

/// An HTTP file server that ignores Range (as `python -m http.server`
/// does): every GET answers 200 with the whole file under `dir`, HEAD its
/// headers. Serves until the test process ends; returns its base URL.
fn serve_without_ranges(dir: PathBuf) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let Ok(read) = conn.try_clone() else { continue };
            let mut lines = BufReader::new(read);
            let mut request = String::new();
            if lines.read_line(&mut request).is_err() {
                continue;
            }
            let mut line = String::new();
            while lines.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let mut parts = request.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
            let body = std::fs::read(dir.join(path.trim_start_matches('/'))).ok();
            let head = match &body {
                Some(b) => format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nLast-Modified: Thu, 26 Nov 2026 00:00:00 GMT\r\nConnection: close\r\n\r\n",
                    b.len()
                ),
                None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
            };
            let _ = conn.write_all(head.as_bytes());
            if method == "GET"
                && let Some(b) = body
            {
                let _ = conn.write_all(&b);
            }
        }
    });
    base
}

/// A dataset on a server that ignores Range is refused at once, naming the
/// object and why, rather than retried as a broken connection.
#[test]
fn a_dataset_on_a_server_that_ignores_byte_ranges_is_refused_at_once_by_name() {
    let f = Fixture::new();
    let base = serve_without_ranges(f.root.clone());
    let url = format!("{base}/ds");
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_brand"))
        .args(["read", &url, "--memory", "10%"])
        .env("RUST_BACKTRACE", "0")
        .env("XDG_CACHE_HOME", f.root.join("http-cache"))
        .output()
        .expect("run brand");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{url}/manifest.toml")) && err.contains("does not answer byte ranges"),
        "{err}"
    );
    assert!(!err.contains("retries"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
}

#[test]
fn a_variable_of_the_environment_that_is_not_utf8_is_passed_over() {
    // The client's settings are read from every AWS_* variable; a value
    // that is not UTF-8 (env::vars panics on one) is not one of them.
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new();
    let out = f
        .command(&["inspect", &f.url])
        .env("AWS_NOT_UTF8", std::ffi::OsStr::from_bytes(b"\xff\xfe"))
        .output()
        .expect("run brand");
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `command` followed by the flags of a store policy that gives up fast.
fn with_fast_policy<'a>(command: &[&'a str]) -> Vec<&'a str> {
    [command, &["--stall-timeout", "500ms", "--retries", "1"]].concat()
}

#[test]
fn a_users_stall_timeout_and_retries_end_a_stalled_open_cat_verify_and_pack_input() {
    let f = Fixture::new();
    // The default policy waits 10 s an attempt, 11 attempts: over 110 s.
    let limit = Duration::from_secs(20);
    // An open whose manifest never comes.
    f.server.faults().set_key_filter(Some("manifest"));
    f.server.faults().stall_all(true);
    let err = f.fails_within(&with_fast_policy(&["inspect", &f.url]), limit);
    assert!(err.contains("manifest.toml") && err.contains("no answer in"), "{err}");
    assert!(err.contains("after 1 retries"), "{err}");
    // A sample's record and a dataset's chunks that never come.
    f.server.faults().clear();
    f.server.faults().set_key_filter(Some("data-"));
    f.server.faults().stall_all(true);
    let err = f.fails_within(&with_fast_policy(&["cat", &f.url, "3"]), limit);
    assert!(
        err.contains("data-0") && err.contains("after 1 retries; last cause: stall"),
        "{err}"
    );
    let start = Instant::now();
    let out = f.run(&with_fast_policy(&["verify", &f.url]));
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}{}", stderr(&out));
    assert!(start.elapsed() < limit, "verify took {:?}", start.elapsed());
    assert!(
        report.contains("cannot fetch the chunk") && report.contains("after 1 retries"),
        "{report}"
    );
    // A pack's input that never comes: an error, and no dataset.
    f.server.faults().clear();
    let inputs = f.root.join("s3/bkt/inputs");
    std::fs::create_dir_all(&inputs).expect("inputs");
    let members: Vec<(String, Vec<u8>)> = (0..4).map(|i| (format!("{i:03}.png"), vec![i as u8; 300])).collect();
    std::fs::write(inputs.join("a.tar"), common::ustar(&members)).expect("tar");
    f.server.faults().set_key_filter(Some("inputs/a.tar"));
    f.server.faults().stall_all(true);
    let out = f.root.join("from-tar");
    let err = f.fails_within(
        &with_fast_policy(&["pack", "--from", "tar", "s3://bkt/inputs/a.tar", "-o", s(&out)]),
        limit,
    );
    assert!(err.contains("a.tar") && err.contains("after 1 retries"), "{err}");
    assert!(!out.exists(), "a failed pack left {}", out.display());
    f.server.faults().clear();
}

/// `brand read URL --disk-cache DIR …`'s epochs.
fn read_tiered(f: &Fixture, tier: &std::path::Path, extra: &[&str]) -> Vec<serde_json::Value> {
    read_tiered_and_stderr(f, tier, extra).0
}

/// [`read_tiered`], and what it wrote to stderr.
fn read_tiered_and_stderr(f: &Fixture, tier: &std::path::Path, extra: &[&str]) -> (Vec<serde_json::Value>, String) {
    let mut args = vec!["--disk-cache", s(tier), "--read-gap", "whole", "--memory", "10%"];
    args.extend_from_slice(extra);
    f.read_and_stderr(&args)
}

/// `brand simulate` of the fixture's local copy at 10 % memory, as JSON.
fn simulate_local(f: &Fixture, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["simulate", s(&f.local), "--memory", "10%", "--json"];
    args.extend_from_slice(extra);
    serde_json::from_slice(&common::ok(&args).stdout).expect("json")
}

fn sum_of(epochs: &[serde_json::Value], key: &str) -> u64 {
    epochs.iter().map(|e| metric(e, key)).sum()
}

/// A tier larger than the dataset: the first epoch fetches each chunk
/// once, whole; later epochs, and a later process, fetch nothing; the
/// order served is the one without a tier (issue 56).
#[test]
fn a_local_tier_fetches_each_chunk_once_and_later_epochs_and_runs_read_it() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    f.server.reset_stats();
    let epochs = read_tiered(&f, &tier, &["--epochs", "3"]);
    assert_exactly_once(&epochs, 3);
    let stats = f.server.stats();
    // The whole dataset fetched once: every GET was epoch 1's.
    let dataset = f.segment_bytes();
    assert_eq!(metric(&epochs[0], "tier_bytes_fetched"), dataset, "{}", epochs[0]);
    assert!(
        stats.get_bytes >= dataset && stats.get_bytes <= dataset + dataset / 10,
        "{stats:?}"
    );
    // (Beside the open's two: the manifest and the index.)
    assert_eq!(
        stats.get_requests,
        metric(&epochs[0], "store_requests") + 2,
        "{stats:?}"
    );
    for e in &epochs[1..] {
        assert_eq!(metric(e, "store_requests"), 0, "{e}");
    }
    // The same order as without a tier.
    let plain = f.read(&["--epochs", "3", "--read-gap", "whole", "--memory", "10%"]);
    for (a, b) in epochs.iter().zip(&plain) {
        assert_eq!(a["order"], b["order"]);
    }
    // A later process starts warm: no GET but the open's manifest.
    f.server.reset_stats();
    let again = read_tiered(&f, &tier, &[]);
    assert_exactly_once(&again, 1);
    assert_eq!(metric(&again[0], "store_requests"), 0, "{}", again[0]);
    assert!(f.server.stats().get_requests <= 1, "{:?}", f.server.stats());
    // Every read of it from the tier's disk. (Not asserted of the first run:
    // all three epochs' reads fit its read-ahead, and reads of a chunk
    // routed while its fetch is in flight are served from the fetched
    // bytes, not the disk.)
    assert_eq!(
        metric(&again[0], "tier_hits"),
        metric(&again[0], "reads_issued"),
        "{}",
        again[0]
    );
}

/// A tier of 30 % keeps that share of the chunks, never more, and the
/// store serves the rest, in the order without a tier. (Metrics count a
/// read in the epoch that issued it, and read-ahead crosses epochs: the
/// figures are compared over whole runs.)
#[test]
fn a_tier_smaller_than_the_dataset_keeps_its_share_and_the_store_serves_the_rest() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    let plain = f.read(&["--epochs", "3", "--read-gap", "whole", "--memory", "10%"]);
    f.server.reset_stats();
    let epochs = read_tiered(&f, &tier, &["--epochs", "3", "--disk-cache-limit", "30%"]);
    assert_exactly_once(&epochs, 3);
    // As `brand simulate` predicts: the bytes exactly (the same chunks kept,
    // the same reads passed), the GETs at most (neighbours waiting together merge).
    let stats = f.server.stats();
    let sim = simulate_local(&f, &["--epochs", "3", "--disk-cache-limit", "30%"]);
    let predicted = |key: &str| -> u64 {
        sim["epochs"]
            .as_array()
            .expect("epochs")
            .iter()
            .map(|e| e["tier"][key].as_u64().expect(key))
            .sum()
    };
    // (Beside the open's manifest: the index is in the cache since the run without a tier.)
    let manifest = std::fs::metadata(f.local.join("manifest.toml"))
        .expect("manifest")
        .len();
    assert_eq!(stats.get_bytes - manifest, predicted("bytes_fetched"), "{stats:?}");
    let gets = predicted("gets");
    assert!(stats.get_requests - 1 <= gets, "{stats:?} against {gets}");
    let dataset = f.segment_bytes();
    let last = &epochs[2];
    let held = metric(last, "tier_held_bytes");
    assert!(held <= dataset * 3 / 10 && held > 0, "{held} of {dataset}");
    assert_eq!(metric(last, "tier_limit_bytes"), (dataset as f64 * 0.3) as u64);
    assert_eq!(sum_of(&epochs, "tier_bytes_fetched"), held, "{last}");
    assert!(sum_of(&epochs, "tier_refused") > 0, "{last}");
    let (tiered, without) = (
        sum_of(&epochs, "store_bytes_fetched"),
        sum_of(&plain, "store_bytes_fetched"),
    );
    assert!(tiered < without, "{tiered} against {without} without a tier");
    for (a, b) in epochs.iter().zip(&plain) {
        assert_eq!(a["order"], b["order"]);
    }
    // The directory's ledger is what it holds.
    let usage = std::fs::read(tier.join("usage")).expect("usage");
    assert_eq!(u64::from_le_bytes(usage[..8].try_into().expect("8 bytes")), held);
    // A later process reads the kept share from the disk, the rest from the
    // store, and takes nothing more in. (Asserted here, not of the first
    // run: its reads all fit its read-ahead, so reads of a chunk routed
    // while its fetch was in flight came from the fetched bytes, not the
    // disk, however the timing fell.)
    let again = read_tiered(&f, &tier, &["--disk-cache-limit", "30%"]);
    assert_exactly_once(&again, 1);
    let (hits, reads) = (metric(&again[0], "tier_hits"), metric(&again[0], "reads_issued"));
    assert!(hits > 0 && hits < reads, "{hits} of {reads}");
    assert_eq!(metric(&again[0], "tier_chunks_fetched"), 0, "{}", again[0]);
}

/// The tiered policy with a tier of 30 %: the tier takes in the pinned
/// chunks and nothing else; every later epoch, and a later process, reads
/// them from the disk and the other chunks whole from the store, each once
/// (as `brand simulate --policy tiered` predicts), in the same order.
#[test]
fn the_tiered_policy_pins_its_share_on_the_tier_and_reads_the_rest_whole_once_an_epoch() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    let tiered = ["--policy", "tiered", "--disk-cache-limit", "30%"];
    let mut args = vec!["--epochs", "3"];
    args.extend_from_slice(&tiered);
    let epochs = read_tiered(&f, &tier, &args);
    assert_exactly_once(&epochs, 3);
    let sim = simulate_local(
        &f,
        &["--epochs", "2", "--policy", "tiered", "--disk-cache-limit", "30%"],
    );
    let warm = &sim["epochs"][1]["tier"];
    let field = |key: &str| warm[key].as_u64().expect(key);
    // Only the pinned chunks are taken in: all of them, nothing else.
    let held = metric(&epochs[2], "tier_held_bytes");
    assert_eq!(held, field("held_bytes"), "{}", epochs[2]);
    assert_eq!(sum_of(&epochs, "tier_bytes_fetched"), held, "{}", epochs[2]);
    let dataset = f.segment_bytes();
    assert!(held > dataset / 5 && held <= dataset * 3 / 10, "{held} of {dataset}");
    // A later process: the pinned chunks from the disk, the rest whole from
    // the store, at most one GET a chunk (neighbours read together share
    // one), nothing taken in, the same order as the first run's first epoch.
    f.server.reset_stats();
    let again = read_tiered(&f, &tier, &tiered);
    assert_exactly_once(&again, 1);
    assert_eq!(again[0]["order"], epochs[0]["order"]);
    let e = &again[0];
    assert_eq!(metric(e, "tier_chunks_fetched"), 0, "{e}");
    assert!(metric(e, "tier_hits") > 0, "{e}");
    let passed = field("passed");
    assert!(passed > 0 && field("misses") == 0, "{warm}");
    let requests = metric(e, "store_requests");
    assert!(
        requests > 0 && requests <= passed,
        "{requests} requests for {passed} chunks: {e}"
    );
    let fetched = metric(e, "store_bytes_fetched");
    assert!(fetched <= dataset - held, "{fetched} of {dataset}, {held} on the tier");
}

/// The version directories in `tier` (its readers' claims are beside them, in `jobs`).
fn version_dirs(tier: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(tier)
        .expect("tier")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("chunks").is_file())
        .collect()
}

/// Two datasets, a tier that fits one. The job that waits for the store
/// (its GETs delayed at the server, no compute) is owed the tier; the
/// version a finished job left there, which nobody reads now, is removed
/// for it; a later run of it fetches nothing. (Placement between live
/// jobs, which sheds chunks, is `brand-io`'s tests/tier.rs; which job
/// benefits more is timing, measured in bench/tier.py's placement part.)
#[test]
fn a_full_tier_goes_to_the_job_that_waits_for_the_store_and_an_idle_dataset_is_removed_for_it() {
    let f = Fixture::new();
    let other = "s3://bkt/sets/other";
    let out = f.run(&[
        "pack",
        s(&f.root.join("files")),
        "-o",
        other,
        "--chunk-size",
        "8",
        "--seed",
        "5",
        "--staging",
        s(&f.root),
    ]);
    assert!(out.status.success(), "pack to s3: {}", stderr(&out));
    let tier = f.root.join("tier");
    let limit = f.segment_bytes().to_string();
    let tiered = |url: &str, extra: &[&str]| {
        let mut args = vec![
            "read",
            url,
            "--json",
            "-v",
            "--disk-cache",
            s(&tier),
            "--disk-cache-limit",
            &limit,
        ];
        args.extend_from_slice(&["--memory", "10%"]);
        args.extend_from_slice(extra);
        let out = f.run(&args);
        assert!(out.status.success(), "brand {args:?}: {}", stderr(&out));
        let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("read --json");
        (epochs, stderr(&out))
    };
    // The other dataset's job fills the tier (free space is anyone's).
    let (epochs, _) = tiered(other, &["--epochs", "2", "--read-gap", "whole"]);
    assert_exactly_once(&epochs, 2);
    let [held] = &version_dirs(&tier)[..] else {
        panic!("one version")
    };
    assert!(sum_of(&epochs, "tier_chunks_fetched") > 0);
    // A job that waits for every read (records, each GET delayed): it
    // measures that (a reader rebalances about every second: a run too
    // short for it is run again, a few times at most), is owed the tier,
    // removes the idle version and fills the tier with its own.
    f.server.faults().delay_gets(Duration::from_millis(300));
    let mut runs = Vec::new();
    while held.exists() && runs.len() < 4 {
        runs.push(tiered(&f.url, &["--epochs", "12", "--read-gap", "0"]));
    }
    f.server.faults().clear();
    let (epochs, err) = runs.last().expect("a run");
    assert_exactly_once(epochs, 12);
    assert!(
        !held.exists(),
        "the idle version is still there after {} runs: {err}",
        runs.len()
    );
    let last = &epochs[11];
    let benefit = last["metrics"]["tier_benefit"].as_f64().unwrap_or(-1.0);
    assert!(benefit >= brand_store::placement::MIN_BENEFIT, "{last}\n{err}");
    assert!(metric(last, "tier_owed_bytes") > 0, "{last}");
    assert!(sum_of(epochs, "tier_evicted_bytes") > 0, "{err}");
    assert!(err.contains("removed a version nobody reads"), "{err}");
    // All of it kept: a later run fetches nothing.
    f.server.reset_stats();
    let (again, _) = tiered(&f.url, &["--read-gap", "0"]);
    assert_exactly_once(&again, 1);
    assert_eq!(metric(&again[0], "store_requests"), 0, "{}", again[0]);
    assert_eq!(metric(&again[0], "tier_evicted_bytes"), 0, "{}", again[0]);
}

/// A tier the fixture's dataset was read through once, and its one version's directory.
fn filled_tier(f: &Fixture) -> (PathBuf, PathBuf) {
    let tier = f.root.join("tier");
    assert_exactly_once(&read_tiered(f, &tier, &[]), 1);
    let [dir] = &version_dirs(&tier)[..] else {
        panic!("one version")
    };
    (tier, dir.clone())
}

/// A process killed while it fetched a chunk leaves an entry marked
/// fetching, unlocked, and the chunk's bytes torn: the next run clears it
/// from the ledger, fetches the chunk again and serves no torn byte.
#[test]
fn a_chunk_a_killed_process_was_writing_is_fetched_again_never_served_torn() {
    let f = Fixture::new();
    let (tier, dir) = filled_tier(&f);
    let dataset = f.segment_bytes();
    // Chunk 0 (offset 0 of the first segment) as a killed writer leaves it.
    let table = dir.join("chunks");
    let mut entries = std::fs::read(&table).expect("chunks");
    let len = u64::from_le_bytes(entries[..8].try_into().expect("entry"));
    assert!(len > 0 && len < 1 << 63, "{len}");
    entries[..8].copy_from_slice(&(len | 1 << 63).to_le_bytes());
    std::fs::write(&table, &entries).expect("mark fetching");
    let segment = dir.join("data-00000.brd");
    let mut bytes = std::fs::read(&segment).expect("segment");
    bytes[..len as usize].fill(0);
    std::fs::write(&segment, &bytes).expect("tear");
    f.server.reset_stats();
    let again = read_tiered(&f, &tier, &[]);
    assert_exactly_once(&again, 1);
    assert_eq!(metric(&again[0], "tier_chunks_fetched"), 1, "{}", again[0]);
    assert_eq!(metric(&again[0], "tier_bytes_fetched"), len, "{}", again[0]);
    assert_eq!(metric(&again[0], "tier_held_bytes"), dataset, "{}", again[0]);
    assert_eq!(metric(&again[0], "tier_failed_reads"), 0, "{}", again[0]);
}

/// A tier chunk damaged on the disk fails its crc32c: the read goes to the
/// store (one warning), the chunk is forgotten and fetched again.
#[test]
fn a_chunk_damaged_on_the_tiers_disk_is_read_from_the_store_and_fetched_again() {
    let f = Fixture::new();
    let (tier, dir) = filled_tier(&f);
    let segment = dir.join("data-00000.brd");
    let mut bytes = std::fs::read(&segment).expect("segment");
    // Every payload byte of the first 64 KiB past the first chunk's header.
    for b in &mut bytes[4096..64 << 10] {
        *b ^= 0x5a;
    }
    std::fs::write(&segment, &bytes).expect("damage");
    let (epochs, err) = read_tiered_and_stderr(&f, &tier, &["--epochs", "2"]);
    assert_exactly_once(&epochs, 2);
    assert!(sum_of(&epochs, "tier_failed_reads") > 0, "{}", epochs[0]);
    assert_eq!(err.matches("a read from the local tier failed").count(), 1, "{err}");
    // Forgotten: the next run fetches it again, and reads it whole.
    let again = read_tiered(&f, &tier, &[]);
    assert_exactly_once(&again, 1);
    assert_eq!(metric(&again[0], "tier_chunks_fetched"), 1, "{}", again[0]);
    assert_eq!(metric(&again[0], "tier_failed_reads"), 0, "{}", again[0]);
}

/// An object replaced in the store between runs is a new version: its
/// chunks are fetched again, never the old bytes served, and the old
/// version, read by nobody, is removed.
#[test]
fn a_dataset_replaced_in_the_store_is_fetched_again_and_its_old_version_removed() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    assert_exactly_once(&read_tiered(&f, &tier, &[]), 1);
    let before = version_dirs(&tier);
    assert_eq!(before.len(), 1);
    let files = f.root.join("files");
    let args = ["pack", s(&files), "-o", &f.url, "--chunk-size", "8", "--seed", "5"];
    let out = f.run(&[&args[..], &["--staging", s(&f.root), "--force"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let local5 = f.root.join("ds5");
    common::ok(&["pack", s(&files), "-o", s(&local5), "--chunk-size", "8", "--seed", "5"]);
    f.server.reset_stats();
    let epochs = read_tiered(&f, &tier, &[]);
    assert_exactly_once(&epochs, 1);
    assert!(metric(&epochs[0], "tier_chunks_fetched") > 0, "{}", epochs[0]);
    assert!(
        f.server.stats().get_bytes >= f.segment_bytes(),
        "{:?}",
        f.server.stats()
    );
    let after = version_dirs(&tier);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after, before);
    // Its chunks are the new dataset's, byte for byte.
    let kept = std::fs::read(after[0].join("data-00000.brd")).expect("kept");
    let new = std::fs::read(local5.join("data-00000.brd")).expect("new");
    assert!(kept == new, "the tier's copy differs from the dataset now in the store");
}

/// A tier directory that cannot be made (a file is in the way) is one
/// warning: the store serves every sample.
#[test]
fn a_tier_that_cannot_be_made_is_a_warning_and_the_store_serves_everything() {
    let f = Fixture::new();
    let blocker = f.root.join("a-file");
    std::fs::write(&blocker, b"not a directory").expect("file");
    let tier = blocker.join("tier");
    let (epochs, err) = read_tiered_and_stderr(&f, &tier, &["--epochs", "2"]);
    assert_exactly_once(&epochs, 2);
    assert!(err.contains("the local tier cannot be used"), "{err}");
    assert_eq!(sum_of(&epochs, "tier_hits"), 0);
    assert!(sum_of(&epochs, "store_requests") > 0, "{}", epochs[1]);
}

/// Three processes started together on one new tier fetch each chunk once
/// between them; each serves every sample once.
#[test]
fn three_processes_on_one_tier_fetch_each_chunk_once_between_them() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    // The read-gap probe is the store's, not the tier's: fixed here.
    let _ = f.read(&["--read-gap", "whole"]);
    f.server.reset_stats();
    let children: Vec<std::process::Child> = (0..3)
        .map(|seed| {
            let seed = seed.to_string();
            let args = [
                "read",
                &f.url,
                "--json",
                "--disk-cache",
                s(&tier),
                "--read-gap",
                "whole",
            ];
            f.command(&[&args[..], &["--seed", &seed, "--stall-timeout", "60s"]].concat())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn brand read")
        })
        .collect();
    let mut fetched = 0;
    for c in children {
        let out = c.wait_with_output().expect("read");
        assert!(out.status.success(), "{}", stderr(&out));
        let epochs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
        assert_exactly_once(&epochs, 1);
        fetched += metric(&epochs[0], "tier_bytes_fetched");
    }
    let dataset = f.segment_bytes();
    assert_eq!(fetched, dataset, "chunks fetched into the tier, all processes");
    let stats = f.server.stats();
    assert!(
        stats.get_bytes <= dataset + dataset / 10,
        "{stats:?} for {dataset} bytes"
    );
}

/// A limit smaller than one chunk keeps nothing and says so once; the
/// store serves every sample.
#[test]
fn a_tier_limit_below_one_chunk_keeps_nothing_and_the_store_serves_all() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    let (epochs, err) = read_tiered_and_stderr(&f, &tier, &["--disk-cache-limit", "4KiB", "--epochs", "2", "-v"]);
    assert_exactly_once(&epochs, 2);
    assert_eq!(sum_of(&epochs, "tier_bytes_fetched"), 0);
    assert_eq!(metric(&epochs[1], "tier_held_bytes"), 0);
    assert!(sum_of(&epochs, "tier_refused") > 0, "{}", epochs[0]);
    assert_eq!(
        err.matches("the tier keeps no more chunks (its limit, 4096 bytes")
            .count(),
        1,
        "{err}"
    );
}

/// A start's first fill is read record by record from the store even with
/// a tier (the first batch waits for its own records, not for every chunk
/// the first fill touches); the chunks are taken in at their later reads.
#[test]
fn a_tiers_first_fill_is_read_record_by_record_and_its_chunks_taken_in_later() {
    // Chunks of 8 samples of 160 KiB: 1.25 MiB, above the 1 MiB a read
    // must reach to be split.
    let f = Fixture::with_samples(SAMPLES, "160", "200");
    let tier = f.root.join("tier");
    f.server.reset_stats();
    let epochs = f.read(&[
        "--disk-cache",
        s(&tier),
        "--read-gap",
        "0",
        "--memory",
        "10%",
        "--epochs",
        "2",
    ]);
    assert_exactly_once(&epochs, 2);
    let deferred = metric(&epochs[0], "reads_deferred");
    assert!(deferred > 0, "{}", epochs[0]);
    let dataset = f.segment_bytes();
    // Every chunk kept once: the table after the run, and the ledger, say
    // so. (The run's own counters may miss a fetch ahead still finishing
    // when the last epoch's metrics were taken.)
    assert!(sum_of(&epochs, "tier_bytes_fetched") <= dataset, "{}", epochs[1]);
    let [dir] = &version_dirs(&tier)[..] else {
        panic!("one version")
    };
    let entries = std::fs::read(dir.join("chunks")).expect("chunks");
    let kept: u64 = entries
        .chunks_exact(8)
        .map(|e| u64::from_le_bytes(e.try_into().expect("entry")))
        .sum();
    assert_eq!(kept, dataset, "every chunk kept, none left reserved");
    let usage = std::fs::read(tier.join("usage")).expect("usage");
    assert_eq!(u64::from_le_bytes(usage[..8].try_into().expect("8 bytes")), dataset);
    // The dataset once, whole, and the first fill's records (memory's 10 %).
    let fetched = f.server.stats().get_bytes;
    assert!(fetched <= dataset + dataset / 5, "{fetched} for {dataset}");
    f.server.reset_stats();
    let warm = read_tiered(&f, &tier, &[]);
    assert_eq!(metric(&warm[0], "store_requests"), 0, "{}", warm[0]);
}

/// A tier whose writes fail (here its segment file cannot be opened: a
/// directory is in the way, as a failing or full disk fails a write) is
/// given up with one warning; the store serves every sample and the
/// reservations are given back.
#[test]
fn a_tier_whose_writes_fail_is_given_up_with_one_warning() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    // A first run keeps nothing (its limit is below a chunk) but makes the version's directory.
    let _ = f.read(&[
        "--disk-cache",
        s(&tier),
        "--disk-cache-limit",
        "4KiB",
        "--read-gap",
        "whole",
    ]);
    let [dir] = &version_dirs(&tier)[..] else {
        panic!("one version")
    };
    std::fs::create_dir(dir.join("data-00000.brd")).expect("in the way");
    let (epochs, err) = read_tiered_and_stderr(&f, &tier, &["--epochs", "2"]);
    assert_exactly_once(&epochs, 2);
    assert_eq!(err.matches("the local tier cannot be written").count(), 1, "{err}");
    assert_eq!(sum_of(&epochs, "tier_bytes_fetched"), 0);
    assert_eq!(metric(&epochs[1], "tier_held_bytes"), 0, "{}", epochs[1]);
}

/// A process killed with SIGKILL while it fetches chunks for the tier (its
/// GETs held at the server, so the kill lands mid-fetch) leaves
/// reservations no process holds: the next run's open clears them, fetches
/// those chunks, serves every sample once and keeps within the limit.
#[test]
fn a_reader_killed_mid_fetch_leaves_a_tier_the_next_run_repairs() {
    let f = Fixture::new();
    let tier = f.root.join("tier");
    f.server.faults().set_key_filter(Some("data-"));
    f.server.faults().stall_all(true);
    let args = ["read", &f.url, "--disk-cache", s(&tier), "--disk-cache-limit", "50%"];
    let mut child = f
        .command(&[&args[..], &["--read-gap", "whole", "--stall-timeout", "60s"]].concat())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn brand read");
    // Wait (bounded) until it holds a chunk as being fetched.
    let fetching = |table: &std::path::Path| {
        std::fs::read(table)
            .unwrap_or_default()
            .chunks_exact(8)
            .any(|e| e[7] & 0x80 != 0)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let table = loop {
        let found = version_dirs_if_any(&tier)
            .into_iter()
            .map(|d| d.join("chunks"))
            .find(|t| fetching(t));
        if let Some(t) = found {
            break t;
        }
        assert!(Instant::now() < deadline, "the reader never began a fetch");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let dataset = f.segment_bytes();
    let usage = |tier: &std::path::Path| {
        let b = std::fs::read(tier.join("usage")).expect("usage");
        u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
    };
    let reserved = usage(&tier);
    assert!(reserved > 0 && reserved <= dataset / 2, "{reserved} of {dataset}");
    f.server.faults().clear();
    let epochs = read_tiered(&f, &tier, &["--disk-cache-limit", "50%"]);
    assert_exactly_once(&epochs, 1);
    let held = metric(&epochs[0], "tier_held_bytes");
    assert!(held > 0 && held <= dataset / 2, "{held} of {dataset}");
    assert_eq!(usage(&tier), held);
    assert!(!fetching(&table), "an entry is still marked fetching");
    assert_eq!(metric(&epochs[0], "tier_failed_reads"), 0);
}

/// The version directories in `tier`, none if it is not made yet.
fn version_dirs_if_any(tier: &std::path::Path) -> Vec<PathBuf> {
    if tier.is_dir() { version_dirs(tier) } else { Vec::new() }
}
