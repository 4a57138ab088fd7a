//! `pack` with partitions: every chunk in exactly one partition (the one
//! its group's owner node gets), each partition the whole index and only
//! its own segment files; a partition is refused as a whole dataset, names
//! the partition that holds a sample it lacks, verifies and inspects as a
//! partition; a failed partitioned pack leaves nothing.

use std::collections::HashSet;

use brand_format::Dataset;
use brand_pack::source::Source;
use brand_pack::{PackOptions, Partitioning, pack, partition_dir};
use brand_testkit::Generated;

/// `n` samples of varied sizes; `fail_at` makes that read fail.
fn samples(n: usize, fail_at: Option<usize>) -> impl Source {
    Generated::keyed(
        n,
        |i| format!("k{i}"),
        |i| (i % 5) as i64,
        move |i| {
            if Some(i) == fail_at {
                return Err(brand_format::Error::input(
                    "virtual/source",
                    format!("sample {i}"),
                    "disk went away",
                ));
            }
            Ok(vec![(i % 251) as u8; 100 + (i * 37) % 3000])
        },
    )
}

fn options(count: u32, group_chunks: u64) -> PackOptions {
    PackOptions {
        chunk_size: 8,
        seed: 3,
        // Small segments: several per partition.
        segment_bytes: 64 << 10,
        partitions: Some(Partitioning { count, group_chunks }),
        ..Default::default()
    }
}

#[test]
fn partitions_split_the_chunks_by_owner_and_share_the_index() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = samples(1000, None);
    let whole_dir = t.path().join("whole");
    let whole_opts = PackOptions {
        partitions: None,
        ..options(1, 1)
    };
    pack(&src, &whole_dir, &whole_opts, &|_, _, _| {}).expect("pack whole");
    let whole = Dataset::open(&whole_dir).expect("whole");
    let out = t.path().join("parts");
    let (count, group_chunks) = (3u32, 4u64);
    pack(&src, &out, &options(count, group_chunks), &|_, _, _| {}).expect("pack partitions");

    let parts: Vec<Dataset> = (0..count)
        .map(|w| Dataset::open_any(partition_dir(&out, w)).expect("partition"))
        .collect();
    let index0 = std::fs::read(partition_dir(&out, 0).join("index.bin")).expect("index");
    let mut seen = HashSet::new();
    let mut verified = 0;
    for (w, ds) in parts.iter().enumerate() {
        let p = ds.manifest.partition.expect("a partition");
        assert_eq!((p.index, p.count, p.group_chunks), (w as u32, count, group_chunks));
        assert_eq!(
            std::fs::read(ds.dir().join("index.bin")).expect("index"),
            index0,
            "every partition holds the same index"
        );
        // The same samples, in the same packed order, as the whole pack.
        assert_eq!(ds.index.samples(), whole.index.samples());
        assert_eq!(ds.index.content_digest(), whole.index.content_digest());
        for c in 0..ds.index.chunk_count() {
            let mine = (c / group_chunks) % count as u64 == w as u64;
            assert_eq!(ds.holds_chunk(c), mine, "partition {w} chunk {c}");
            if mine {
                assert!(seen.insert(c), "chunk {c} in two partitions");
                for id in c * 8..(c * 8 + ds.index.chunk_records(c) as u64) {
                    assert_eq!(ds.read_sample(id).expect("held"), whole.read_sample(id).expect("whole"));
                }
            }
        }
        // Only its own segment files are here.
        for s in 0..ds.manifest.segments.len() as u32 {
            assert_eq!(
                ds.segment_path(s).exists(),
                ds.holds_segment(s),
                "partition {w} segment {s}"
            );
        }
        // A sample it does not hold: an error naming the partition that does.
        let foreign = (0..ds.index.chunk_count())
            .find(|&c| !ds.holds_chunk(c))
            .expect("foreign chunk");
        let e = ds.read_sample(foreign * 8).expect_err("not held").to_string();
        let holder = (foreign / group_chunks) % count as u64;
        assert!(e.contains(&format!("held by partition {holder} of {count}")), "{e}");
        // A partition is not a whole dataset.
        let e = Dataset::open(ds.dir())
            .expect_err("a partition is not whole")
            .to_string();
        assert!(
            e.contains("manifest.toml") && e.contains(&format!("partition {w} of {count}")),
            "{e}"
        );
        // verify checks its own chunks; inspect says which share it is.
        let report = brand_store::verify::verify(ds, &|_, _| {}).expect("verify");
        assert!(report.ok(), "{:?}", report.problems);
        verified += report.samples;
        let s = brand_store::inspect::summary(ds);
        let ps = s.partition.as_ref().expect("partition summary");
        assert_eq!((ps.index, ps.chunks), (w as u32, report.chunks));
        assert!(s.to_string().contains(&format!("partition    {w} of {count}")), "{s}");
        assert!(
            brand_store::verify::rebuild_index(ds.dir()).is_err(),
            "a partition cannot rebuild the index"
        );
    }
    assert_eq!(
        seen.len() as u64,
        whole.index.chunk_count(),
        "every chunk in one partition"
    );
    assert_eq!(verified, 1000);
    // A whole dataset is unchanged by the feature: no partition key.
    let text = std::fs::read_to_string(whole_dir.join("manifest.toml")).expect("manifest");
    assert!(!text.contains("partition"), "{text}");
}

#[test]
fn a_damaged_partition_is_reported_by_verify() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("parts");
    pack(&samples(300, None), &out, &options(2, 2), &|_, _, _| {}).expect("pack");
    let ds = Dataset::open_any(partition_dir(&out, 1)).expect("partition");
    let seg = (0..ds.manifest.segments.len() as u32)
        .find(|&s| ds.holds_segment(s))
        .expect("own segment");
    let path = ds.segment_path(seg);
    let mut bytes = std::fs::read(&path).expect("read");
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&path, bytes).expect("write");
    let report = brand_store::verify::verify(&ds, &|_, _| {}).expect("verify");
    assert!(!report.ok());
    assert!(
        report.problems[0].to_string().contains(&path.display().to_string()),
        "{:?}",
        report.problems
    );
}

#[test]
fn a_failed_partitioned_pack_leaves_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = t.path().join("parts");
    let order = brand_format::rng::Prng::stream(3, &[brand_format::rng::domain::PACK]).permutation(2000);
    // An entry packed late, so every partition has segments when it fails.
    let fail_at = order[1900] as usize;
    let e = pack(&samples(2000, Some(fail_at)), &out, &options(3, 1), &|_, _, _| {})
        .expect_err("the read error fails the pack");
    assert!(e.to_string().contains("disk went away"), "{e}");
    let left: Vec<_> = std::fs::read_dir(t.path()).expect("list").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn bad_partitionings_are_refused_before_writing() {
    let t = tempfile::tempdir().expect("tempdir");
    for (count, group_chunks) in [(0, 1), (3, 0), (brand_pack::MAX_PARTITIONS + 1, 1)] {
        let out = t.path().join("parts");
        let e = pack(&samples(10, None), &out, &options(count, group_chunks), &|_, _, _| {}).expect_err("refused");
        assert!(e.to_string().contains("partitions"), "{e}");
        assert!(!out.exists());
    }
}
