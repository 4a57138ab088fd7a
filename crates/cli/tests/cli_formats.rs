//! `brand pack --from mds` through the real binary: `--field` and `--label`
//! reach the importer, plain and zstd shards pack to the same dataset,
//! samples come back by key, and damaged input is one named error with
//! nothing left beside OUT. (Parquet through the binary, with files
//! written by Hugging Face `datasets`: python/tests/test_import_formats.py.)

use std::path::Path;

mod common;
use common::{fails, hidden_entries, ok, s};

/// A sample's key, label and payload.
type Sample = (String, i64, Vec<u8>);

/// Writes an MDS dataset of two shards into `dir` (zstd or plain); returns
/// its samples.
fn write_mds(dir: &Path, zstd: bool) -> Vec<Sample> {
    let mut all = Vec::new();
    let mut shards = Vec::new();
    for (k, n) in [(0usize, 30usize), (1, 12)] {
        let basename = format!("shard.{k:05}.mds");
        let samples: Vec<(i64, Vec<u8>)> = (0..n)
            .map(|i| (((k * 7 + i) % 5) as i64, vec![(i + k) as u8; 50 + 9 * i]))
            .collect();
        all.extend(
            samples
                .iter()
                .enumerate()
                .map(|(i, (label, image))| (format!("{basename}:{i}"), *label, image.clone())),
        );
        shards.push((basename, samples));
    }
    brand_testkit::write_mds(dir, &shards, zstd.then_some(5));
    all
}

fn check_by_key(ds: &Path, want: &[Sample]) {
    let json = ok(&["inspect", "--json", s(ds)]).stdout;
    let v: serde_json::Value = serde_json::from_slice(&json).expect("inspect --json");
    assert_eq!(v["samples"], want.len());
    for (key, _, bytes) in want {
        assert_eq!(&ok(&["cat", s(ds), "--key", key]).stdout, bytes, "{key}");
    }
    // `inspect --samples`: id, label and key of each sample in packed order.
    let listing = String::from_utf8(ok(&["inspect", s(ds), "--samples"]).stdout).expect("utf-8");
    let mut listed: Vec<(String, i64)> = listing
        .lines()
        .enumerate()
        .map(|(n, line)| {
            let mut parts = line.splitn(3, '\t');
            assert_eq!(parts.next(), Some(n.to_string().as_str()), "{line}");
            let label = parts.next().and_then(|l| l.parse().ok()).expect("a label");
            (parts.next().expect("a key").to_string(), label)
        })
        .collect();
    listed.sort();
    let mut expected: Vec<(String, i64)> = want.iter().map(|(k, l, _)| (k.clone(), *l)).collect();
    expected.sort();
    assert_eq!(listed, expected);
    let d = brand_format::Dataset::open(ds).expect("open");
    for id in 0..d.index.samples() {
        let key = String::from_utf8(d.index.key(id).to_vec()).expect("utf-8 key");
        let (_, label, _) = want.iter().find(|(k, _, _)| *k == key).expect("a known key");
        assert_eq!(d.index.label(id), *label, "{key}");
    }
}

#[test]
fn pack_from_mds_plain_and_zstd() {
    let t = tempfile::tempdir().expect("tempdir");
    let want = write_mds(&t.path().join("plain"), false);
    write_mds(&t.path().join("zstd"), true);
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let index = t.path().join("plain/index.json");
    ok(&[
        "pack",
        "--from",
        "mds",
        s(&index),
        "--field",
        "image",
        "--label",
        "label",
        "-o",
        s(&a),
    ]);
    check_by_key(&a, &want);
    let out = t.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let b_in_out = out.join("b");
    ok(&[
        "pack",
        "--from",
        "mds",
        s(&t.path().join("zstd")),
        "--field",
        "image",
        "--label",
        "label",
        "-o",
        s(&b_in_out),
    ]);
    check_by_key(&b_in_out, &want);
    for name in ["data-00000.brd", "index.bin"] {
        let read = |dir: &Path| std::fs::read(dir.join(name)).expect("dataset file");
        assert!(read(&a) == read(&b_in_out), "{name} differs");
    }
    // The spool beside OUT is gone.
    let beside: Vec<_> = std::fs::read_dir(&out)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(beside, ["b"]);
    assert!(!b.exists());
}

#[test]
fn damaged_mds_and_wrong_flags_are_one_named_error_and_leave_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("mds");
    write_mds(&dir, false);
    let shard0 = dir.join("shard.00000.mds");
    let good = std::fs::read(&shard0).expect("read");
    let out = t.path().join("ds");
    let mut past_end = good.clone();
    past_end.truncate(good.len() - 3);
    let cases: Vec<(Vec<u8>, &[&str], &[&str])> = vec![
        (
            past_end,
            &["--field", "image"],
            &["shard.00000.mds: offset table entry 30", "past the end of the shard"],
        ),
        (good.clone(), &[], &["several columns could be the payload", "--field"]),
        (
            good.clone(),
            &["--field", "label"],
            &["column \"label\" has encoding int"],
        ),
        (
            good.clone(),
            &["--field", "image", "--label", "text"],
            &["label column \"text\" has encoding str"],
        ),
    ];
    for (bytes, flags, parts) in cases {
        std::fs::write(&shard0, &bytes).expect("write");
        let mut args = vec!["pack", "--from", "mds", s(&dir), "-o", s(&out)];
        args.extend_from_slice(flags);
        let err = fails(&args);
        for part in parts {
            assert!(err.contains(part), "{part:?} not in: {err}");
        }
        assert!(!out.exists(), "{flags:?} left {}", out.display());
        assert!(hidden_entries(t.path()).is_empty(), "{:?}", hidden_entries(t.path()));
    }
    // One input only; --field on a format without columns.
    let err = fails(&["pack", "--from", "mds", s(&dir), s(&dir), "-o", s(&out)]);
    assert!(err.contains("--from mds takes exactly one input"), "{err}");
    let err = fails(&["pack", "--from", "lmdb", s(&dir), "--label", "x", "-o", s(&out)]);
    assert!(
        err.contains("--field and --label apply to --from tar, --from mds"),
        "{err}"
    );
}
