//! End-to-end tests of `brand gen / pack / inspect / verify / cat` through the
//! real binary, and of the packer's guarantees: byte-identical output,
//! atomicity, named errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use brand_format::Dataset;

mod common;
use common::{brand, fails, gen_samples_with, hidden_entries, ok, s};

/// Small samples keep the suite fast; the layout is the same at any size.
fn gen_samples(dir: &Path, samples: u64, seed: u64) {
    gen_samples_with(dir, samples, "6", "24", "7", seed);
}

fn files_of(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read dataset dir")
        .map(|e| {
            let p = e.expect("dir entry").path();
            let b = std::fs::read(&p).expect("read file");
            (PathBuf::from(p.file_name().expect("name")), b)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn pack_round_trips_every_sample_and_inspect_counts_them() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    let ds = t.path().join("ds");
    gen_samples(&src, 2000, 1);
    ok(&["pack", s(&src), "-o", s(&ds)]);

    let json = ok(&["inspect", "--json", s(&ds)]).stdout;
    let v: serde_json::Value = serde_json::from_slice(&json).expect("inspect --json is JSON");
    assert_eq!(v["samples"], 2000);
    assert_eq!(v["chunk_size"], 64);
    assert_eq!(v["chunks"], 32);
    assert_eq!(v["labels"], 7);

    // Every sample's bytes equal its source file, found by key.
    let d = Dataset::open(&ds).expect("open");
    let mut seen = std::collections::HashSet::new();
    for id in 0..d.index.samples() {
        let key = String::from_utf8(d.index.key(id).to_vec()).expect("utf-8 key");
        let want = std::fs::read(src.join(&key)).expect("source file");
        assert_eq!(d.read_sample(id).expect("read"), want, "sample {id} ({key})");
        let class: i64 = key[6..10].parse().expect("class-NNNN");
        assert_eq!(d.index.label(id), class, "label of {key}");
        assert!(seen.insert(key));
    }
    assert_eq!(seen.len(), 2000);

    // And `brand cat`, by id and by key, writes exactly those bytes.
    for id in [0u64, 1, 63, 64, 1999] {
        let key = String::from_utf8(d.index.key(id).to_vec()).expect("utf-8 key");
        let want = std::fs::read(src.join(&key)).expect("source");
        assert_eq!(ok(&["cat", s(&ds), &id.to_string()]).stdout, want);
        assert_eq!(ok(&["cat", s(&ds), "--key", &key]).stdout, want);
    }
    assert!(fails(&["cat", s(&ds), "2000"]).contains("out of range"));
    assert!(fails(&["cat", s(&ds), "--key", "nope"]).contains("nope"));
    assert!(hidden_entries(t.path()).is_empty());
}

#[test]
fn packing_is_deterministic_and_seeded() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 300, 2);
    let (a, b, c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    ok(&["pack", s(&src), "-o", s(&a), "--seed", "5", "--chunk-size", "16"]);
    ok(&["pack", s(&src), "-o", s(&b), "--seed", "5", "--chunk-size", "16"]);
    ok(&["pack", s(&src), "-o", s(&c), "--seed", "6", "--chunk-size", "16"]);
    let (fa, fb, fc) = (files_of(&a), files_of(&b), files_of(&c));
    assert_eq!(fa.len(), 3);
    assert!(fa == fb, "same input and seed must give byte-identical datasets");
    let data = |f: &[(PathBuf, Vec<u8>)]| {
        f.iter()
            .find(|(n, _)| n == Path::new("data-00000.brd"))
            .expect("segment")
            .1
            .clone()
    };
    assert_ne!(data(&fa), data(&fc), "a different seed must give a different order");
    // Same samples either way.
    let (da, dc) = (Dataset::open(&a).expect("a"), Dataset::open(&c).expect("c"));
    let keys = |d: &Dataset| {
        let mut k: Vec<Vec<u8>> = (0..d.index.samples()).map(|i| d.index.key(i).to_vec()).collect();
        k.sort();
        k
    };
    assert_eq!(keys(&da), keys(&dc));
}

#[test]
fn zstd_records_round_trip() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("a")).expect("mkdir");
    std::fs::create_dir_all(src.join("b")).expect("mkdir");
    let mut want = Vec::new();
    for i in 0..150u32 {
        // Compressible text, so zstd actually shrinks it.
        let body = format!("sample {i} ").repeat(50 + i as usize);
        let key = format!("{}/{i}.txt", if i % 3 == 0 { "a" } else { "b" });
        std::fs::write(src.join(&key), &body).expect("write");
        want.push((key, body.into_bytes()));
    }
    let ds = t.path().join("ds");
    ok(&["pack", s(&src), "-o", s(&ds), "--zstd", "3", "--chunk-size", "10"]);
    ok(&["verify", s(&ds)]);
    let d = Dataset::open(&ds).expect("open");
    assert!(
        d.manifest.stored_bytes * 3 < d.manifest.raw_bytes,
        "zstd should compress repeated text"
    );
    for (key, body) in want {
        let id = d.index.find_key(key.as_bytes()).expect("key present");
        assert_eq!(d.read_sample(id).expect("read"), body);
        assert_eq!(ok(&["cat", s(&ds), "--key", &key]).stdout, body);
    }
}

#[test]
fn gen_writes_tfrecord_shards_of_byte_sized_samples_that_pack_imports() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("tf");
    let gen_args = |shards: &str| {
        [
            "gen",
            s(&src),
            "--samples",
            "500",
            "--format",
            "tfrecord",
            "--shards",
            shards,
            "--mean-bytes",
            "512",
            "--min-bytes",
            "256",
            "--max-bytes",
            "1024",
            "--classes",
            "10",
            "--seed",
            "3",
        ]
        .map(str::to_string)
    };
    let args = gen_args("3");
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut shards: Vec<String> = std::fs::read_dir(&src)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    shards.sort();
    assert_eq!(
        shards,
        [
            "shard-00000-of-00003.tfrecord",
            "shard-00001-of-00003.tfrecord",
            "shard-00002-of-00003.tfrecord"
        ]
    );
    let ds = t.path().join("ds");
    ok(&["pack", "--from", "tfrecord", s(&src), "-o", s(&ds)]);
    let d = Dataset::open(&ds).expect("open");
    assert_eq!(d.manifest.samples, 500);
    assert!((256..=1024).contains(&d.manifest.min_sample_bytes));
    assert!(
        d.manifest.max_sample_bytes <= 1024 + 48,
        "an Example adds a few dozen bytes"
    );
    let labels: std::collections::BTreeSet<i64> = (0..500).map(|id| d.index.label(id)).collect();
    assert_eq!(labels, (0..10).collect(), "every class's label, from the int64 feature");

    // Byte sizes and KiB sizes are one or the other; --shards is for tfrecord.
    let both = brand(&[
        "gen",
        s(&t.path().join("x")),
        "--samples",
        "5",
        "--mean-bytes",
        "9",
        "--mean-kib",
        "1",
    ]);
    assert!(!both.status.success());
    let err = fails(&["gen", s(&t.path().join("y")), "--samples", "5", "--shards", "2"]);
    assert!(err.contains("--shards applies to --format tfrecord"), "{err}");
}

#[test]
fn list_input_packs_with_labels() {
    let t = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(t.path().join("files")).expect("mkdir");
    let mut list = String::from("# path<TAB>label\n");
    for i in 0..20 {
        std::fs::write(t.path().join(format!("files/{i}.bin")), vec![i as u8; 100 + i]).expect("write");
        list.push_str(&format!("files/{i}.bin\t{}\n", i * 10));
    }
    std::fs::write(t.path().join("list.txt"), list).expect("write list");
    let ds = t.path().join("ds");
    ok(&[
        "pack",
        "--from",
        "list",
        s(&t.path().join("list.txt")),
        "-o",
        s(&ds),
        "--chunk-size",
        "8",
    ]);
    let d = Dataset::open(&ds).expect("open");
    for i in 0..20usize {
        let id = d.index.find_key(format!("files/{i}.bin").as_bytes()).expect("key");
        assert_eq!(d.index.label(id), i as i64 * 10);
        assert_eq!(d.read_sample(id).expect("read"), vec![i as u8; 100 + i]);
    }
}

#[test]
fn a_flipped_record_byte_fails_verify_naming_the_chunk() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    let ds = t.path().join("ds");
    gen_samples(&src, 200, 3);
    ok(&["pack", s(&src), "-o", s(&ds), "--chunk-size", "16"]);
    let d = Dataset::open(&ds).expect("open");
    let victim = 77u64; // chunk 4, slot 13
    let (_, offset, len) = d.index.record_location(victim);
    let seg = ds.join("data-00000.brd");
    let mut bytes = std::fs::read(&seg).expect("read segment");
    bytes[(offset + len as u64 / 2) as usize] ^= 0xff;
    std::fs::write(&seg, &bytes).expect("write segment");

    let out = brand(&["verify", s(&ds)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("chunk 4 ") && text.contains("sample 77") && text.contains("crc32c"),
        "{text}"
    );
    assert!(text.contains(&format!("at byte {offset}")), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains("data-00000.brd")).count(),
        1,
        "only the flipped record: {text}"
    );
    // `cat` refuses to serve the corrupt record.
    let err = fails(&["cat", s(&ds), "77"]);
    assert!(err.contains("crc32c") && err.contains("chunk 4"), "{err}");
    // The others still read.
    ok(&["cat", s(&ds), "76"]);
}

#[test]
fn a_flipped_header_byte_and_a_truncated_segment_are_named() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    let ds = t.path().join("ds");
    gen_samples(&src, 200, 4);
    ok(&["pack", s(&src), "-o", s(&ds), "--chunk-size", "16"]);
    let seg = ds.join("data-00000.brd");
    let d = Dataset::open(&ds).expect("open");
    let chunk2 = d.index.chunk(2).offset as usize;
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[chunk2 + 60] ^= 1; // inside chunk 2's record table
    std::fs::write(&seg, &bytes).expect("write");
    let text = String::from_utf8_lossy(&brand(&["verify", s(&ds)]).stdout).into_owned();
    assert!(text.contains("chunk 2 ") && text.contains("header"), "{text}");
    bytes[chunk2 + 60] ^= 1;

    // Truncate in the middle of the last chunk.
    let last = d.index.chunk(d.index.chunk_count() - 1).offset as usize;
    std::fs::write(&seg, &bytes[..last + 100]).expect("truncate");
    let out = brand(&["verify", s(&ds)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    assert!(
        text.contains("truncated") && text.contains(&format!("chunk {} ", d.index.chunk_count() - 1)),
        "{text}"
    );
    let last_id = d.index.samples() - 1;
    let err = fails(&["cat", s(&ds), &last_id.to_string()]);
    assert!(err.contains("data-00000.brd"), "{err}");
}

#[test]
fn index_is_rebuilt_from_chunks_and_corrupt_index_is_named() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    let ds = t.path().join("ds");
    gen_samples(&src, 400, 5);
    ok(&[
        "pack",
        s(&src),
        "-o",
        s(&ds),
        "--chunk-size",
        "16",
        "--segment-mib",
        "1",
    ]);
    let index = ds.join("index.bin");
    let original = std::fs::read(&index).expect("read index");
    let d = Dataset::open(&ds).expect("open");
    assert!(d.index.segment_count() > 1, "small segments force several files");

    let mut bad = original.clone();
    bad[100] ^= 4;
    std::fs::write(&index, &bad).expect("corrupt index");
    let err = fails(&["inspect", s(&ds)]);
    assert!(err.contains("index.bin") && err.contains("checksum"), "{err}");
    std::fs::write(&index, &original[..original.len() / 2]).expect("truncate index");
    assert!(fails(&["verify", s(&ds)]).contains("index.bin"));

    std::fs::remove_file(&index).expect("remove index");
    ok(&["verify", "--rebuild-index", s(&ds)]);
    assert_eq!(
        std::fs::read(&index).expect("rebuilt"),
        original,
        "rebuilt index must equal the packed one"
    );
}

#[test]
fn bad_input_gives_a_named_error_and_no_dataset() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("out");
    let o = s(&out);

    let missing = t.path().join("missing");
    assert!(fails(&["pack", s(&missing), "-o", o]).contains("missing"));
    std::fs::create_dir(t.path().join("empty")).expect("mkdir");
    assert!(fails(&["pack", s(&t.path().join("empty")), "-o", o]).contains("no sample files"));

    // A list naming a file that vanished: the error names the list line.
    std::fs::write(t.path().join("x.bin"), b"x").expect("write");
    std::fs::write(t.path().join("list.txt"), "x.bin\t1\ngone.bin\t2\n").expect("write");
    let err = fails(&["pack", "--from", "list", s(&t.path().join("list.txt")), "-o", o]);
    assert!(err.contains("list.txt: line 2") && err.contains("gone.bin"), "{err}");
    std::fs::write(t.path().join("list.txt"), "x.bin\tcat\n").expect("write");
    assert!(fails(&["pack", "--from", "list", s(&t.path().join("list.txt")), "-o", o]).contains("line 1"));

    // A sample that cannot be read (a dangling symlink) is named, and
    // neither OUT nor a temp dir is left behind. (A read failing after
    // chunks were written is in tests/pack_atomic.rs.)
    let src = t.path().join("src");
    gen_samples(&src, 300, 6);
    let victim = src.join("class-0003");
    let f = std::fs::read_dir(&victim)
        .expect("class dir")
        .next()
        .expect("a file")
        .expect("entry")
        .path();
    std::fs::remove_file(&f).expect("remove");
    std::os::unix::fs::symlink(t.path().join("dangling"), &f).expect("dangling symlink");
    let err = fails(&["pack", s(&src), "-o", o]);
    assert!(
        err.contains(f.file_name().and_then(|n| n.to_str()).expect("name")),
        "{err}"
    );
    assert!(!out.exists());
    assert!(
        hidden_entries(t.path()).is_empty(),
        "temp dirs left: {:?}",
        hidden_entries(t.path())
    );
    std::fs::remove_file(&f).expect("rm symlink");

    // A sample larger than the segment size.
    std::fs::create_dir_all(t.path().join("big/c")).expect("mkdir");
    std::fs::write(t.path().join("big/c/huge.bin"), vec![1u8; 2 << 20]).expect("write");
    let err = fails(&["pack", s(&t.path().join("big")), "-o", o, "--segment-mib", "1"]);
    assert!(err.contains("c/huge.bin") && err.contains("segment size"), "{err}");
    assert!(!out.exists());

    // OUT exists: refused without --force, replaced with it.
    ok(&["pack", s(&src), "-o", o]);
    assert!(fails(&["pack", s(&src), "-o", o]).contains("--force"));
    ok(&["pack", s(&src), "-o", o, "--force", "--seed", "9"]);
    assert_eq!(Dataset::open(&out).expect("open").manifest.pack_seed, 9);
    assert!(hidden_entries(t.path()).is_empty());

    // Bad options.
    assert!(fails(&["pack", s(&src), "-o", s(&t.path().join("o2")), "--chunk-size", "65"]).contains("chunk size"));
    assert!(fails(&["pack", s(&src), "-o", s(&t.path().join("o2")), "--zstd", "99"]).contains("zstd level"));
    // Not a dataset.
    assert!(fails(&["inspect", s(&src)]).contains("manifest.toml"));
}

/// A full disk mid-pack: needs a small tmpfs, so root. Skipped (with a note)
/// where mounting is not allowed.
#[test]
fn a_full_disk_mid_pack_leaves_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    gen_samples(&src, 400, 7); // about 2.4 MiB
    let mnt = t.path().join("small");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs", s(&mnt)])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (not root?)");
        return;
    }
    let out = mnt.join("ds");
    let err = fails(&["pack", s(&src), "-o", s(&out)]);
    let listing: Vec<_> = std::fs::read_dir(&mnt)
        .expect("list")
        .map(|e| e.expect("e").file_name())
        .collect();
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(err.contains("No space left") && err.contains("data-00000.brd"), "{err}");
    assert!(listing.is_empty(), "left behind on the full disk: {listing:?}");
}
