//! `brand pack --from tar` through the real binary: the flags reach the
//! importer, samples come back by key, and damaged input is one named error
//! with nothing left beside OUT.

use std::io::Write;
use std::path::Path;
use std::process::Output;

mod common;
use common::{brand, fails, hidden_entries, ok, s};

/// A sample's key, label and payload.
type Sample = (String, i64, Vec<u8>);

/// A WebDataset shard of samples `first..first + n` (`.txt`, `.JPG`,
/// `.cls` each), and its samples.
fn shard(first: usize, n: usize) -> (Vec<u8>, Vec<Sample>) {
    let samples: Vec<Sample> = (first..first + n)
        .map(|i| (format!("s{i:05}"), (i % 7) as i64, vec![i as u8; 100 + i]))
        .collect();
    let cls: Vec<String> = samples.iter().map(|(_, label, _)| label.to_string()).collect();
    let names: Vec<(String, String, String)> = samples
        .iter()
        .map(|(key, _, _)| (format!("{key}.txt"), format!("{key}.JPG"), format!("{key}.cls")))
        .collect();
    let mut members: Vec<(&str, &[u8])> = Vec::new();
    for ((txt, jpg, cls_name), ((_, _, bytes), cls)) in names.iter().zip(samples.iter().zip(&cls)) {
        members.push((txt, b"caption"));
        members.push((jpg, bytes));
        members.push((cls_name, cls.as_bytes()));
    }
    (common::ustar(&members), samples)
}

fn check_by_key(ds: &Path, want: &[Sample]) {
    let json = ok(&["inspect", "--json", s(ds)]).stdout;
    let v: serde_json::Value = serde_json::from_slice(&json).expect("inspect --json");
    assert_eq!(v["samples"], want.len());
    for (key, _, bytes) in want {
        assert_eq!(&ok(&["cat", s(ds), "--key", key]).stdout, bytes, "{key}");
    }
    let d = brand_format::Dataset::open(ds).expect("open");
    for id in 0..d.index.samples() {
        let key = String::from_utf8(d.index.key(id).to_vec()).expect("utf-8 key");
        let (_, label, _) = want.iter().find(|(k, _, _)| *k == key).expect("a known key");
        assert_eq!(d.index.label(id), *label, "{key}");
    }
}

#[test]
fn pack_from_tar_shards_and_a_gzipped_tar() {
    let t = tempfile::tempdir().expect("tempdir");
    let shards = t.path().join("shards");
    std::fs::create_dir(&shards).expect("mkdir");
    let (a, mut want) = shard(0, 40);
    let (b, want_b) = shard(40, 30);
    want.extend(want_b);
    std::fs::write(shards.join("shard-0.tar"), &a).expect("write");
    std::fs::write(shards.join("shard-1.tar"), &b).expect("write");
    let ds = t.path().join("ds");
    ok(&[
        "pack",
        "--from",
        "tar",
        s(&shards),
        "--field",
        "png;jpg",
        "--label",
        "cls",
        "-o",
        s(&ds),
    ]);
    check_by_key(&ds, &want);

    // The same shards gzipped (the second as .tgz): the same dataset, and
    // the spool beside OUT is gone.
    let gz = |bytes: &[u8]| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).expect("gzip");
        enc.finish().expect("gzip")
    };
    let (ga, gb) = (t.path().join("shard-0.tar.gz"), t.path().join("shard-1.tgz"));
    std::fs::write(&ga, gz(&a)).expect("write");
    std::fs::write(&gb, gz(&b)).expect("write");
    let out = t.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let ds_gz = out.join("ds");
    ok(&[
        "pack",
        "--from",
        "tar",
        s(&ga),
        s(&gb),
        "--field",
        "jpg",
        "--label",
        "cls",
        "-o",
        s(&ds_gz),
    ]);
    check_by_key(&ds_gz, &want);
    // Byte-identical data and index (the manifests differ in their inputs).
    for name in ["data-00000.brd", "index.bin"] {
        let read = |dir: &Path| std::fs::read(dir.join(name)).expect("dataset file");
        assert!(read(&ds) == read(&ds_gz), "{name} differs");
    }
    let beside: Vec<_> = std::fs::read_dir(&out)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(beside, ["ds"]);
}

#[test]
fn damaged_tars_and_wrong_flags_are_one_named_error_and_leave_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let (good, _) = shard(0, 3);
    let out = t.path().join("ds");
    let path = t.path().join("in.tar");
    let cases: Vec<(Vec<u8>, &[&str], &[&str])> = vec![
        // A changed byte in the second header.
        (
            {
                let mut bad = good.clone();
                bad[1024 + 1] ^= 0x20;
                bad
            },
            &["--field", "jpg"],
            &["in.tar: byte 1024", "bad header checksum"],
        ),
        // Cut inside the first payload.
        (
            good[..1600].to_vec(),
            &["--field", "jpg"],
            &["\"s00000.JPG\" at byte 1024", "runs past the end"],
        ),
        // No member with the field.
        (
            good.clone(),
            &["--field", "png"],
            &["sample \"s00000\" (member at byte 0)", "none of the fields png"],
        ),
        // Several members and no --field.
        (good.clone(), &[], &["3 members (txt, jpg, cls)", "--field"]),
        // A label that is no integer.
        (
            common::ustar(&[("x.jpg", &b"1"[..]), ("x.cls", b"one")]),
            &["--field", "jpg", "--label", "cls"],
            &["sample \"x\"", "\"one\" is not an integer"],
        ),
        (good.clone(), &["--label", "colour"], &["--label \"colour\""]),
    ];
    for (bytes, flags, parts) in cases {
        std::fs::write(&path, &bytes).expect("write");
        let mut args = vec!["pack", "--from", "tar", s(&path), "-o", s(&out)];
        args.extend_from_slice(flags);
        let err = fails(&args);
        for part in parts {
            assert!(err.contains(part), "{part:?} not in: {err}");
        }
        assert!(!out.exists(), "{flags:?} left {}", out.display());
        assert!(hidden_entries(t.path()).is_empty(), "{:?}", hidden_entries(t.path()));
    }
    // Tar flags on another source.
    let err = fails(&["pack", "--from", "dir", s(t.path()), "--field", "jpg", "-o", s(&out)]);
    assert!(err.contains("--field and --label apply to --from tar"), "{err}");
}

/// A pack whose listing stops at a damaged input keeps what it listed
/// before it in `.OUT.listing`; the rerun reuses those inputs instead of
/// reading them again (shown by replacing them with junk of the same size
/// and time: a read would fail) and writes the dataset an uninterrupted
/// pack writes. Other options, or an input with another time, are read again.
#[test]
fn a_rerun_reuses_the_inputs_an_earlier_pack_listed() {
    let t = tempfile::tempdir().expect("tempdir");
    let gz = |bytes: &[u8]| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).expect("gzip");
        enc.finish().expect("gzip")
    };
    let shards = t.path().join("shards");
    std::fs::create_dir(&shards).expect("mkdir");
    let paths: Vec<std::path::PathBuf> = (0..4).map(|k| shards.join(format!("shard-{k}.tar.gz"))).collect();
    let good: Vec<Vec<u8>> = (0..4).map(|k| gz(&shard(k * 30, 30).0)).collect();
    let write_all = || {
        for (p, bytes) in paths.iter().zip(&good) {
            std::fs::write(p, bytes).expect("write");
        }
    };
    write_all();
    let pack = |out: &Path, field: &str| -> Output { brand(&pack_args(&paths, field, out)) };
    let reference = t.path().join("reference");
    let done = pack(&reference, "jpg");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));

    let parent = t.path().join("out");
    std::fs::create_dir(&parent).expect("mkdir");
    let out = parent.join("ds");
    // Shard 2 cut short: the pack fails there and keeps shards 0 and 1.
    let fail_at_shard_2 = |field: &str| {
        std::fs::write(&paths[2], &good[2][..good[2].len() / 2]).expect("cut");
        let failed = pack(&out, field);
        let err = String::from_utf8_lossy(&failed.stderr).into_owned();
        assert_eq!(failed.status.code(), Some(1), "{err}");
        assert!(err.contains("shard-2.tar.gz"), "{err}");
        assert!(err.contains("the listing of 2 input(s) is kept"), "{err}");
        assert_eq!(hidden_entries(&parent), [".ds.listing"]);
        assert!(!out.exists());
    };
    // Not a gzip stream (its magic, then a method it cannot be) of the
    // same size, modification time kept or not.
    let spoil = |k: usize, keep_time: bool| {
        let mtime = std::fs::metadata(&paths[k]).and_then(|m| m.modified()).expect("mtime");
        let mut junk = vec![0u8; good[k].len()];
        junk[..2].copy_from_slice(&[0x1f, 0x8b]);
        std::fs::write(&paths[k], junk).expect("spoil");
        if keep_time {
            let f = std::fs::File::options().write(true).open(&paths[k]).expect("open");
            f.set_modified(mtime).expect("set mtime");
        }
    };

    fail_at_shard_2("jpg");
    spoil(0, true);
    spoil(1, true);
    std::fs::write(&paths[2], &good[2]).expect("mend");
    let verbose: Vec<&str> = ["-v"].into_iter().chain(pack_args(&paths, "jpg", &out)).collect();
    let done = brand(&verbose);
    let said = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{said}");
    // Progress per input (-v), and the reuse said once.
    assert_eq!(
        said.matches("reusing the inputs an earlier pack listed").count(),
        1,
        "{said}"
    );
    for (verb, k) in [("reused", 1), ("reused", 2), ("listed", 3), ("listed", 4)] {
        let line = format!("{verb} input {k} of 4: {}", s(&paths[k - 1]));
        assert!(said.contains(&line), "no {line:?} in {said}");
    }
    for name in ["data-00000.brd", "index.bin"] {
        let read = |dir: &Path| std::fs::read(dir.join(name)).expect("dataset file");
        assert!(
            read(&reference) == read(&out),
            "{name} differs from the uninterrupted pack's"
        );
    }
    assert!(hidden_entries(&parent).is_empty(), "{:?}", hidden_entries(&parent));
    std::fs::remove_dir_all(&out).expect("rm");

    // Another --field: the kept listing is not this pack's; shard 0 is read.
    write_all();
    fail_at_shard_2("jpg");
    spoil(0, true);
    let err = fails(&pack_args(&paths, "jpg;txt", &out));
    assert!(err.contains("shard-0.tar.gz"), "{err}");

    // Shard 1 with another time: read again (shard 0 is reused).
    write_all();
    fail_at_shard_2("jpg");
    spoil(1, false);
    let err = fails(&pack_args(&paths, "jpg", &out));
    assert!(err.contains("shard-1.tar.gz"), "{err}");
    assert!(!err.contains("shard-0.tar.gz"), "{err}");
}

fn pack_args<'a>(paths: &'a [std::path::PathBuf], field: &'a str, out: &'a Path) -> Vec<&'a str> {
    let mut args: Vec<&str> = vec!["pack", "--from", "tar"];
    args.extend(paths.iter().map(|p| s(p)));
    args.extend(["--field", field, "--label", "cls", "-o", s(out)]);
    args
}
