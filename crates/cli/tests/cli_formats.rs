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

/// An MDS shard of columns `image` (bytes), `label` (int), `text` (str) as
/// Streaming lays it out.
fn shard(samples: &[Sample]) -> Vec<u8> {
    let bodies: Vec<Vec<u8>> = samples
        .iter()
        .map(|(_, label, image)| {
            let text = format!("caption of {label}").into_bytes();
            let mut b = Vec::new();
            b.extend((image.len() as u32).to_le_bytes());
            b.extend((text.len() as u32).to_le_bytes());
            b.extend_from_slice(image);
            b.extend(label.to_le_bytes());
            b.extend(text);
            b
        })
        .collect();
    let config = br#"{"column_names": ["image", "label", "text"], "format": "mds"}"#;
    let n = samples.len() as u32;
    let mut offset = 4 + 4 * (n + 1) + config.len() as u32;
    let mut out = n.to_le_bytes().to_vec();
    out.extend(offset.to_le_bytes());
    for b in &bodies {
        offset += b.len() as u32;
        out.extend(offset.to_le_bytes());
    }
    out.extend_from_slice(config);
    bodies.iter().for_each(|b| out.extend_from_slice(b));
    out
}

/// Writes an MDS dataset of two shards into `dir` (zstd or plain); returns
/// its samples.
fn write_mds(dir: &Path, zstd: bool) -> Vec<Sample> {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut all = Vec::new();
    let mut entries = Vec::new();
    for (k, n) in [(0usize, 30usize), (1, 12)] {
        let basename = format!("shard.{k:05}.mds");
        let samples: Vec<Sample> = (0..n)
            .map(|i| {
                (
                    format!("{basename}:{i}"),
                    ((k * 7 + i) % 5) as i64,
                    vec![(i + k) as u8; 50 + 9 * i],
                )
            })
            .collect();
        let raw = shard(&samples);
        let zip = if zstd {
            let z = zstd::encode_all(&raw[..], 5).expect("zstd");
            std::fs::write(dir.join(format!("{basename}.zstd")), &z).expect("write");
            format!(
                r#"{{"basename": "{basename}.zstd", "bytes": {}, "hashes": {{}}}}"#,
                z.len()
            )
        } else {
            std::fs::write(dir.join(&basename), &raw).expect("write");
            "null".to_string()
        };
        entries.push(format!(
            r#"{{"column_encodings": ["bytes", "int", "str"], "column_names": ["image", "label", "text"],
                "column_sizes": [null, 8, null], "compression": {}, "format": "mds", "hashes": [],
                "raw_data": {{"basename": "{basename}", "bytes": {}, "hashes": {{}}}}, "samples": {n},
                "size_limit": 67108864, "version": 2, "zip_data": {zip}}}"#,
            if zstd { "\"zstd:5\"" } else { "null" },
            raw.len()
        ));
        all.extend(samples);
    }
    let index = format!(r#"{{"version": 2, "shards": [{}]}}"#, entries.join(","));
    std::fs::write(dir.join("index.json"), index).expect("write");
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
