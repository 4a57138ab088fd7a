//! Misuse and faults through the real binary: absurd arguments, a pack
//! interrupted by SIGINT/SIGTERM or killed, `--force` over something that is
//! not a dataset. Each ends in a one-line error (or a clean exit by the
//! signal), never a panic, an abort or a leftover.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{fails, gen_samples_with, hidden_entries, ok, s};

fn gen_samples(dir: &Path, samples: u64, mean_kib: &str) {
    gen_samples_with(dir, samples, mean_kib, "64", "5", 3);
}

#[test]
fn absurd_gen_and_simulate_arguments_are_errors_not_aborts() {
    let t = tempfile::tempdir().expect("tempdir");
    let g = t.path().join("g");
    let big = "9223372036854775808";
    assert!(fails(&["gen", s(&g), "--samples", big]).contains("--samples"));
    assert!(fails(&["gen", s(&g), "--samples", "10", "--mean-kib", big, "--max-kib", big]).contains("--mean-kib"));
    assert!(fails(&["gen", s(&g), "--samples", "10", "--max-kib", "1e30"]).contains("--max-kib"));
    assert!(fails(&["gen", s(&g), "--samples", "10", "--min-kib=-5"]).contains("--min-kib"));
    assert!(fails(&["gen", s(&g), "--samples", "10", "--mean-kib", "NaN"]).contains("--mean-kib"));
    assert!(fails(&["gen", s(&g), "--samples", "10", "--classes", "4294967295"]).contains("--classes"));
    assert!(
        fails(&[
            "gen",
            s(&g),
            "--samples",
            "10",
            "--images",
            "--image-size",
            "4294967295"
        ])
        .contains("image size")
    );
    assert!(!g.exists(), "a refused gen writes nothing");

    let src = t.path().join("src");
    gen_samples(&src, 300, "2");
    let ds = t.path().join("ds");
    ok(&["pack", s(&src), "-o", s(&ds), "--chunk-size", "16"]);
    for world in ["4294967295", "301"] {
        let err = fails(&["simulate", s(&ds), "--memory", "10%", "--world", world]);
        assert!(err.contains(&format!("world {world}")), "{err}");
    }
    let err = fails(&["bench", "files", s(&src), "--threads", "18446744073709551615"]);
    assert!(err.contains("--threads"), "{err}");
    let err = fails(&["simulate", s(&ds), "--memory", "10%", "--world", "1000", "--drop-last"]);
    assert!(err.contains("drop_last"), "{err}");
    ok(&["simulate", s(&ds), "--memory", "10%", "--world", "300"]);
    for ms in ["-1", "NaN", "1e300"] {
        let err = fails(&["read", s(&ds), &format!("--compute-ms={ms}")]);
        assert!(err.contains("--compute-ms"), "{err}");
    }
    let out = ok(&["read", s(&ds), "--compute-ms", "1", "--batch", "100", "--json"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"exactly_once\": true"));
    // Each epoch reports the process's CPU time: some, and no more than
    // every core for the epoch's wall time.
    let epochs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    for e in epochs.as_array().expect("epochs") {
        let (cpu, secs) = (
            e["cpu_seconds"].as_f64().expect("cpu_seconds"),
            e["seconds"].as_f64().expect("seconds"),
        );
        assert!(cpu > 0.0 && cpu <= secs * cores + 0.02, "cpu {cpu} s in {secs} s");
    }
}

#[test]
fn the_default_budget_works_on_a_dataset_of_less_than_ten_chunks() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 300, "2");
    let ds = t.path().join("ds");
    ok(&["pack", s(&src), "-o", s(&ds)]); // chunk size 64: 10 % is 30 samples
    let out = ok(&["simulate", s(&ds), "--memory", "10%", "--epochs", "2", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"rank_slots\": 64"), "{text}");
    // Runs: named in the report, counted in its `runs` column; out of range is an error naming the key.
    let runs = |l: &str| -> serde_json::Value {
        let out = ok(&["simulate", s(&ds), "--memory", "10%", "--run-length", l, "--json"]);
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let (one, four) = (runs("1"), runs("4"));
    assert_eq!(four["run_length"], 4);
    let requests = |r: &serde_json::Value| r["epochs"][0]["run_requests"].as_u64().expect("run_requests");
    assert!(
        requests(&four) < requests(&one),
        "{} vs {}",
        requests(&four),
        requests(&one)
    );
    assert_eq!(four["epochs"][0]["exactly_once"], true);
    let err = fails(&["simulate", s(&ds), "--memory", "10%", "--run-length", "65"]);
    assert!(err.contains("run_length 65"), "{err}");
    let err = fails(&["read", s(&ds), "--run-length", "many"]);
    assert!(err.contains("run_length"), "{err}");
}

/// `simulate --read-gap`: GETs and bytes as the objects backend would
/// issue them. Whole chunks are one GET each (smaller than a GET) or split
/// into `--get-size` parts; sparse reads fetch exactly the gap-0 bytes, in
/// no more GETs than runs of records; a larger gap means fewer GETs and
/// more bytes.
#[test]
fn simulate_counts_the_gets_and_bytes_a_store_would_serve() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 640, "16"); // ten chunks of ~1 MiB
    let ds = t.path().join("ds");
    ok(&["pack", s(&src), "-o", s(&ds)]);
    let sim = |extra: &[&str]| -> serde_json::Value {
        let mut argv = vec!["simulate", s(&ds), "--memory", "10%", "--json"];
        argv.extend_from_slice(extra);
        let out = ok(&argv);
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        r["epochs"][0].clone()
    };
    let n = |e: &serde_json::Value, k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{k} in {e}"));
    let plain = sim(&[]);
    assert!(plain["gets"].is_null(), "GETs counted only with a read gap: {plain}");

    let whole = sim(&["--read-gap", "whole"]);
    let reads = n(&whole, "reads");
    assert!(reads > 10, "a 10 % budget re-reads chunks: {whole}");
    assert_eq!((n(&whole, "extents"), n(&whole, "gets")), (reads, reads), "{whole}");
    assert_eq!(n(&whole, "bytes_fetched"), n(&whole, "bytes_whole"), "{whole}");

    // 64 KiB GETs: each ~1 MiB chunk in ⌈len / 64 KiB⌉ parts.
    let part = 64 << 10;
    let split = sim(&["--read-gap", "whole", "--get-size", "64KiB"]);
    let (gets, bytes) = (n(&split, "gets"), n(&split, "bytes_fetched"));
    assert!(gets >= bytes.div_ceil(part) && gets < bytes / part + reads, "{split}");

    let sparse = sim(&["--read-gap", "0"]);
    assert_eq!(n(&sparse, "bytes_fetched"), n(&sparse, "bytes_sparse"), "{sparse}");
    let (gets0, extents0) = (n(&sparse, "gets"), n(&sparse, "extents"));
    assert!(reads <= gets0 && gets0 <= extents0, "{sparse}");

    let wide = sim(&["--read-gap", "256KiB"]);
    assert!(n(&wide, "gets") < gets0, "{wide} vs {sparse}");
    assert!(
        n(&wide, "bytes_fetched") > n(&sparse, "bytes_fetched"),
        "{wide} vs {sparse}"
    );
    let per_read = wide["gets_per_read"].as_f64().expect("gets_per_read");
    assert!(
        (per_read - n(&wide, "gets") as f64 / n(&wide, "reads") as f64).abs() < 1e-9,
        "{wide}"
    );

    let err = fails(&["simulate", s(&ds), "--memory", "10%", "--read-gap", "auto"]);
    assert!(err.contains("auto"), "{err}");
    let err = fails(&[
        "simulate",
        s(&ds),
        "--memory",
        "10%",
        "--read-gap",
        "0",
        "--get-size",
        "0",
    ]);
    assert!(err.contains("get size 0"), "{err}");
}

#[test]
fn force_replaces_only_a_dataset() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 50, "2");
    // A regular file.
    let file = t.path().join("notes.txt");
    std::fs::write(&file, b"precious").expect("write");
    let err = fails(&["pack", s(&src), "-o", s(&file), "--force"]);
    assert!(err.contains("not a directory"), "{err}");
    assert_eq!(std::fs::read(&file).expect("still there"), b"precious");
    // A directory of other things.
    let dir = t.path().join("photos");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("a.jpg"), b"jpeg").expect("write");
    let err = fails(&["pack", s(&src), "-o", s(&dir), "--force"]);
    assert!(
        err.contains("not a brand dataset") && err.contains("manifest.toml"),
        "{err}"
    );
    assert_eq!(std::fs::read(dir.join("a.jpg")).expect("still there"), b"jpeg");
    // An empty directory and a dataset are replaced.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    ok(&["pack", s(&src), "-o", s(&empty), "--force"]);
    ok(&["pack", s(&src), "-o", s(&empty), "--force", "--seed", "4"]);
    assert!(hidden_entries(t.path()).is_empty(), "{:?}", hidden_entries(t.path()));
}

/// The arguments of a pack slow enough to interrupt (zstd at its highest level).
fn slow_pack_args<'a>(src: &'a Path, out: &'a Path) -> [&'a str; 8] {
    ["pack", s(src), "-o", s(out), "--zstd", "22", "--chunk-size", "8"]
}

/// Starts a slow pack and waits until its work directory holds `file`.
fn start_slow_pack_until(src: &Path, out: &Path, file: &str) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_brand"))
        .args(slow_pack_args(src, out))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn brand pack");
    let tmp = out.parent().expect("parent").join(format!(
        ".{}.packing-{}",
        out.file_name().expect("name").to_string_lossy(),
        child.id()
    ));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut child = child;
    while !tmp.join(file).exists() {
        assert!(Instant::now() < deadline, "the pack never wrote {file}");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the pack ended ({status}) before it wrote {file}: too fast for this test?");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// Starts a slow pack and waits until it has written into its work directory.
fn start_slow_pack(src: &Path, out: &Path) -> Child {
    start_slow_pack_until(src, out, "data-00000.brd")
}

/// Every file of a dataset directory, by name.
fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read dataset")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read file"),
            )
        })
        .collect();
    files.sort();
    files
}

/// `samples` of 24 KiB on average, incompressible (1,500 are about 36 MiB).
fn slow_source(root: &Path, samples: u64) -> PathBuf {
    let src = root.join("src");
    gen_samples(&src, samples, "24");
    src
}

#[test]
fn sigterm_and_sigint_mid_pack_leave_nothing_and_a_killed_packs_leftover_is_cleaned() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = slow_source(t.path(), 1500);
    let out = t.path().join("ds");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let child = start_slow_pack(&src, &out);
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let done = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&done.stderr);
        assert_eq!(
            done.status.signal(),
            Some(signal),
            "ends by the signal: {:?} {err}",
            done.status
        );
        assert!(err.contains("interrupted"), "{err}");
        assert!(!out.exists(), "no output after signal {signal}");
        // On a loaded machine the pack may have made a checkpoint before the
        // signal: then it is kept, and said so (tested on purpose below).
        let left = hidden_entries(t.path());
        if err.contains("chunks are kept in") {
            assert_eq!(left.len(), 1, "{left:?}");
            std::fs::remove_dir_all(t.path().join(&left[0])).expect("remove kept pack");
        } else {
            assert!(err.contains("the unfinished dataset was removed"), "{err}");
            assert!(left.is_empty(), "signal {signal} left {left:?}");
        }
    }

    // SIGKILL cannot be caught: the leftover stays until the next pack into
    // the same OUT, which removes it (its process is gone).
    let mut child = start_slow_pack(&src, &out);
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    assert_eq!(hidden_entries(t.path()).len(), 1, "{:?}", hidden_entries(t.path()));
    ok(&["pack", s(&src), "-o", s(&out), "--chunk-size", "64"]);
    assert!(
        hidden_entries(t.path()).is_empty(),
        "stale dir not removed: {:?}",
        hidden_entries(t.path())
    );
}

#[test]
fn a_pack_stopped_after_a_checkpoint_goes_on_from_there_and_writes_the_same_dataset() {
    let t = tempfile::tempdir().expect("tempdir");
    // Long enough to stop after its first checkpoint (at 2 s): ~6 s alone
    // on this machine (3,000 took 2.3 s, and a CI run finished one first).
    let src = slow_source(t.path(), 8000);
    let reference = t.path().join("reference");
    ok(&slow_pack_args(&src, &reference));
    let out = t.path().join("ds");
    for signal in [libc::SIGKILL, libc::SIGTERM] {
        let child = start_slow_pack_until(&src, &out, "resume.json");
        // Stopped once it has written past its checkpoint, which the resume
        // must cut back.
        let work = t.path().join(format!(".ds.packing-{}", child.id()));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let cp: serde_json::Value =
                serde_json::from_slice(&std::fs::read(work.join("resume.json")).expect("checkpoint")).expect("json");
            let at = cp["open_segments"][0]["offset"].as_u64().expect("an open segment");
            let len = std::fs::metadata(work.join("data-00000.brd")).expect("segment").len();
            if len > at {
                break;
            }
            assert!(Instant::now() < deadline, "the pack wrote nothing past its checkpoint");
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let stopped = child.wait_with_output().expect("wait");
        assert_eq!(stopped.status.signal(), Some(signal));
        let err = String::from_utf8_lossy(&stopped.stderr);
        if signal == libc::SIGTERM {
            assert!(
                err.contains("chunks are kept in") && err.contains("goes on from there"),
                "{err}"
            );
        }
        assert!(!out.exists(), "a stopped pack installs nothing");
        assert_eq!(hidden_entries(t.path()).len(), 1, "{:?}", hidden_entries(t.path()));

        let resumed = ok(&slow_pack_args(&src, &out));
        let err = String::from_utf8_lossy(&resumed.stderr);
        assert!(err.contains("resuming the pack stopped there at chunk"), "{err}");
        assert!(hidden_entries(t.path()).is_empty(), "{:?}", hidden_entries(t.path()));
        assert!(
            files_of(&out) == files_of(&reference),
            "after {signal}: the resumed dataset differs from an uninterrupted pack"
        );
        std::fs::remove_dir_all(&out).expect("remove");
    }

    // Other options: the stopped pack is not taken over but removed.
    let mut child = start_slow_pack_until(&src, &out, "resume.json");
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    let other = ok(&["pack", s(&src), "-o", s(&out), "--chunk-size", "64"]);
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("not resuming") && err.contains("differ"), "{err}");
    assert!(hidden_entries(t.path()).is_empty(), "{:?}", hidden_entries(t.path()));
    assert_eq!(brand_format::Dataset::open(&out).expect("open").manifest.chunk_size, 64);
}

#[test]
fn a_dataset_a_killed_pack_moved_aside_is_restored() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 40, "2");
    let out = t.path().join("ds");
    ok(&["pack", s(&src), "-o", s(&out), "--seed", "7"]);
    // A dead process id: a child that has exited.
    let mut dead = Command::new("true").spawn().expect("spawn true");
    dead.wait().expect("wait");
    let aside = t.path().join(format!(".ds.packing-{}.old", dead.id()));
    std::fs::rename(&out, &aside).expect("move aside as install does");
    let err = fails(&["pack", s(&src), "-o", s(&out)]);
    assert!(err.contains("already exists"), "{err}");
    let restored = brand_format::Dataset::open(&out).expect("the old dataset is back");
    assert_eq!(restored.manifest.pack_seed, 7);
    assert!(hidden_entries(t.path()).is_empty());
}

/// `simulate --disk-cache-limit`: a tier as large as the dataset fetches
/// every chunk in the first epoch and nothing after, as built and with
/// eviction by the plan; a limit of 0 keeps nothing (as built every read
/// passes to the store; by the plan each fetches a whole chunk); a limit
/// that is not a size or a percentage is an error naming it.
#[test]
fn simulate_counts_what_a_local_tier_would_fetch() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 600, "2");
    let ds = t.path().join("ds");
    ok(&["pack", s(&src), "-o", s(&ds), "--chunk-size", "16"]);
    let tier = |limit: &str| -> serde_json::Value {
        let out = ok(&[
            "simulate",
            s(&ds),
            "--memory",
            "10%",
            "--epochs",
            "2",
            "--disk-cache-limit",
            limit,
            "--json",
        ]);
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let all = tier("100%");
    let chunks = all["geometry"]["chunks"].as_u64().expect("chunks");
    for rule in ["tier", "tier_by_plan"] {
        assert_eq!(all["epochs"][0][rule]["misses"], chunks);
        assert_eq!(all["epochs"][1][rule]["misses"], 0);
    }
    let none = tier("1");
    for e in none["epochs"].as_array().expect("epochs") {
        assert_eq!(e["tier"]["passed"], e["reads"]);
        assert_eq!(e["tier_by_plan"]["misses"], e["reads"]);
        assert_eq!((&e["tier"]["hits"], &e["tier_by_plan"]["hits"]), (&0.into(), &0.into()));
    }
    let text =
        String::from_utf8_lossy(&ok(&["simulate", s(&ds), "--memory", "10%", "--disk-cache-limit", "30%"]).stdout)
            .into_owned();
    assert!(
        text.contains("with a local tier of") && text.contains("(as built"),
        "{text}"
    );
    for bad in ["lots", "150%", "-5%", "0"] {
        let flag = format!("--disk-cache-limit={bad}");
        let err = fails(&["simulate", s(&ds), "--memory", "10%", &flag]);
        assert!(err.contains("disk_cache_limit"), "{bad}: {err}");
    }
}
