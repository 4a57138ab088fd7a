//! The read session: every extent comes back once with its payload and the
//! bytes the generator wrote; what is in flight is counted; a read that
//! does not complete in time is an error naming its file and offset; a
//! partition holding no segments opens without probing; the read gap is
//! the setting's.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use brand_format::Dataset;
use brand_format::extents::ReadGap;
use brand_io::config::EngineConfig;
use brand_io::{IoBackend, IoConfig, ReadGapSetting, ReadSession};

fn source_bytes(root: &Path, ds: &Dataset, id: u64) -> Vec<u8> {
    let key = std::str::from_utf8(ds.index.key(id)).expect("utf-8 key");
    std::fs::read(root.join("src").join(key)).expect("source file")
}

#[test]
fn every_extent_comes_back_once_with_its_payload_and_the_source_bytes() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(t.path(), 200));
    for backend in [IoBackend::Uring, IoBackend::Threads] {
        let cfg = EngineConfig {
            backend,
            queue_depth: 4,
            ..Default::default()
        };
        let mut s = ReadSession::<(u64, usize)>::open(ds.clone(), cfg, ReadGapSetting::Bytes(0)).expect("session");
        assert_eq!(
            (s.gap(), s.backend(), s.uring_refused()),
            (ReadGap::Bytes(0), backend, false)
        );
        let (mut submitted, mut bytes) = (0, 0);
        for chunk in 0..ds.index.chunk_count() {
            for (i, e) in s.extents(chunk, 0x5a5a_5a5a_5a5a_5a5a).into_iter().enumerate() {
                bytes += e.len;
                s.submit(e, (chunk, i)).expect("submit");
                submitted += 1;
            }
        }
        assert_eq!((s.in_flight(), s.in_flight_read_bytes()), (submitted, bytes));
        let mut seen = std::collections::HashSet::new();
        let mut records = 0;
        while s.in_flight() > 0 {
            // Alternately what has arrived and what must be waited for.
            let (payload, c) = match s.try_recv().expect("try_recv") {
                Some(done) => done,
                None => s.recv().expect("recv"),
            };
            assert!(seen.insert(payload), "{backend}: {payload:?} came back twice");
            bytes -= c.extent.len;
            assert_eq!(s.in_flight_read_bytes(), bytes, "{backend}");
            for (id, r) in c.result.expect("read") {
                assert_eq!(ds.index.chunk_of(id), payload.0, "{backend}: sample {id}");
                let data = r.expect("record");
                assert_eq!(
                    &data[..],
                    &source_bytes(t.path(), &ds, id)[..],
                    "{backend}: sample {id}"
                );
                records += 1;
            }
        }
        assert_eq!((seen.len(), bytes), (submitted, 0), "{backend}");
        assert!(records > 50, "{backend}: {records} records");
        assert!(s.try_recv().expect("nothing left").is_none());
        let err = s.recv().err().expect("nothing to wait for").to_string();
        assert!(err.contains("none in flight"), "{err}");
    }
}

/// With no time allowed, a read is (almost always) still pending when the
/// session looks: the error names the segment and the offset of the oldest
/// read, and says io_timeout.
#[test]
fn a_read_not_completed_within_io_timeout_names_the_oldest_read() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(t.path(), 200));
    let cfg = EngineConfig {
        backend: IoBackend::Threads,
        io_timeout: Duration::ZERO,
        ..Default::default()
    };
    let mut timed_out = None;
    for _ in 0..100 {
        let mut s = ReadSession::<()>::open(ds.clone(), cfg.clone(), ReadGapSetting::Whole).expect("session");
        let extents: Vec<_> = (0..ds.index.chunk_count())
            .flat_map(|c| s.extents(c, u64::MAX))
            .collect();
        let (segment, offset) = (extents[0].segment, extents[0].offset);
        for e in extents {
            s.submit(e, ()).expect("submit");
        }
        if let Err(e) = s.recv() {
            timed_out = Some((e.to_string(), ds.segment_path(segment), offset));
            break;
        }
    }
    let (err, path, offset) = timed_out.expect("some read was still pending with no time allowed");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains(&format!("at byte {offset} is still pending")), "{err}");
    assert!(err.contains("io_timeout"), "{err}");
}

#[test]
fn drain_waits_for_every_read() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(t.path(), 200));
    let mut s = ReadSession::<u64>::open(ds.clone(), EngineConfig::default(), ReadGapSetting::Whole).expect("session");
    for c in 0..ds.index.chunk_count() {
        for e in s.extents(c, u64::MAX) {
            s.submit(e, c).expect("submit");
        }
    }
    assert!(s.in_flight() > 5);
    s.drain().expect("drain");
    assert_eq!((s.in_flight(), s.in_flight_read_bytes()), (0, 0));
    assert!(s.try_recv().expect("try_recv").is_none(), "drained reads are discarded");
}

#[test]
fn the_read_gap_is_the_settings() {
    assert_eq!("whole".parse::<ReadGapSetting>().ok(), Some(ReadGapSetting::Whole));
    assert_eq!("auto".parse::<ReadGapSetting>().ok(), Some(ReadGapSetting::Auto));
    assert_eq!(
        "16KiB".parse::<ReadGapSetting>().ok(),
        Some(ReadGapSetting::Bytes(16 << 10))
    );
    let err = "sometimes".parse::<ReadGapSetting>().expect_err("refused").to_string();
    assert!(err.contains("expected whole, auto or a byte count"), "{err}");
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(t.path(), 100));
    let open = |gap| ReadSession::<()>::open(ds.clone(), EngineConfig::default(), gap).expect("session");
    assert_eq!(open(ReadGapSetting::Whole).gap(), ReadGap::Whole);
    assert_eq!(open(ReadGapSetting::Bytes(8192)).gap(), ReadGap::Bytes(8192));
    let ReadGap::Bytes(auto) = open(ReadGapSetting::Auto).gap() else {
        panic!("auto measures a gap in bytes")
    };
    assert_eq!(auto % 4096, 0);
    // A chunk read whole is one extent; with a gap, only the masked records.
    let whole = open(ReadGapSetting::Whole).extents(0, 0b1);
    let sparse = open(ReadGapSetting::Bytes(0)).extents(0, 0b1);
    assert_eq!((whole.len(), sparse.len()), (1, 1));
    assert!(sparse[0].len < whole[0].len);
}

/// A dataset packed as two partitions whose groups all go to node 0: node
/// 1's partition holds no segment. Its session opens with `auto` without
/// probing (there is no file to probe) and registers no memory; node 0's
/// probes its own files.
#[test]
fn a_partition_without_segments_reads_nothing_and_is_not_probed() {
    use brand_pack::{PackOptions, Partitioning, partition_dir};
    let t = tempfile::tempdir().expect("tempdir");
    let whole =
        Dataset::open(brand_import::synthetic::small_dataset(t.path(), 100).expect("gen and pack")).expect("open");
    let source = brand_import::files::FileSource::image_folder(&t.path().join("src")).expect("source");
    let opts = PackOptions {
        chunk_size: 16,
        partitions: Some(Partitioning {
            count: 2,
            group_chunks: whole.index.chunk_count() + 1,
        }),
        ..Default::default()
    };
    let out = t.path().join("parts");
    brand_pack::pack(&source, &out, &opts, &|_, _, _| {}).expect("pack partitions");
    let part = |w| Arc::new(Dataset::open_any(partition_dir(&out, w)).expect("partition"));
    let (full, empty) = (part(0), part(1));
    assert!((0..empty.manifest.segments.len() as u32).all(|s| !empty.holds_segment(s)));
    let io = IoConfig {
        read_gap: ReadGapSetting::Auto,
        ..Default::default()
    };
    let cfg = io.engine_config(&empty, 64 << 20);
    assert_eq!(cfg.fixed_buffer_bytes, 0, "nothing to read, nothing registered");
    let s = ReadSession::<()>::open(empty.clone(), cfg, io.read_gap).expect("no probe of missing files");
    assert_eq!(s.gap(), ReadGap::Whole);
    let held: u64 = full.manifest.segments.iter().map(|s| s.bytes).sum();
    let cfg = io.engine_config(&full, 1 << 40);
    assert_eq!(cfg.fixed_buffer_bytes, held);
    let s = ReadSession::<()>::open(full, cfg, io.read_gap).expect("probe");
    assert!(matches!(s.gap(), ReadGap::Bytes(_)));
}
