//! The io engine through real io_uring reads: every record it returns equals
//! the buffered read, whole or sparse, direct or on tmpfs; a corrupt record
//! comes back as a named error.

mod common;

use std::path::Path;
use std::sync::Arc;

use brand_format::Dataset;
use brand_format::extents::{ReadGap, extents};
use brand_io::engine::{Engine, EngineConfig, Job};

fn make_dataset(root: &Path, samples: u64) -> Dataset {
    common::small_dataset(root, samples)
}

/// Reads every chunk through the engine with `gap` and a mask that selects
/// some records; returns (samples checked, bytes read).
fn read_all(ds: Arc<Dataset>, gap: ReadGap, queue_depth: usize, fixed_buffers: bool) -> (u64, u64, bool) {
    let engine = Engine::start(
        ds.clone(),
        EngineConfig {
            queue_depth,
            fixed_buffers,
            ..Default::default()
        },
    )
    .expect("engine");
    // Root may lock the registered memory; elsewhere registration may be refused (and falls back).
    // SAFETY: geteuid has no preconditions.
    if fixed_buffers && unsafe { libc::geteuid() } == 0 {
        assert!(
            engine.fixed_buffers_in_use(),
            "fixed buffers were requested and should register as root"
        );
    }
    assert!(fixed_buffers || !engine.fixed_buffers_in_use());
    let mut jobs = 0u64;
    for c in 0..ds.index.chunk_count() {
        let mask = 0x5a5a_5a5a_5a5a_5a5au64.rotate_left(c as u32);
        for e in extents(&ds.index, c, mask, gap) {
            engine.submit(Job { tag: c, extent: e }).expect("submit");
            jobs += 1;
        }
    }
    let (mut checked, mut bytes) = (0, 0);
    for _ in 0..jobs {
        let done = engine.recv().expect("completion");
        bytes += done.bytes_read;
        for (id, data) in done.result.expect("read ok") {
            let data = data.expect("record ok");
            assert_eq!(ds.index.chunk_of(id), done.tag);
            assert_eq!(
                &data[..],
                &ds.read_sample(id).expect("buffered read")[..],
                "sample {id}"
            );
            checked += 1;
        }
    }
    (checked, bytes, engine.buffered_fallback())
}

#[test]
fn engine_reads_match_buffered_reads_whole_and_sparse() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(make_dataset(t.path(), 300));
    let (n_whole, b_whole, _) = read_all(ds.clone(), ReadGap::Whole, 8, true);
    let (n_sparse, b_sparse, _) = read_all(ds.clone(), ReadGap::Bytes(0), 1, true);
    let (n_merged, b_merged, _) = read_all(ds.clone(), ReadGap::Bytes(64 << 10), 64, true);
    // Ordinary (unregistered) buffers give the same records.
    let (n_plain, b_plain, _) = read_all(ds.clone(), ReadGap::Bytes(0), 8, false);
    assert_eq!((n_plain, b_plain), (n_sparse, b_sparse));
    assert_eq!(n_whole, n_sparse);
    assert_eq!(n_whole, n_merged);
    assert!(n_whole > 100);
    assert!(
        b_sparse < b_whole,
        "sparse reads must read fewer bytes ({b_sparse} vs {b_whole})"
    );
    assert!(b_sparse <= b_merged && b_merged <= b_whole);
}

#[test]
fn engine_works_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipping: no /dev/shm");
        return;
    }
    let t = tempfile::tempdir_in(shm).expect("tempdir in /dev/shm");
    let ds = Arc::new(make_dataset(t.path(), 100));
    let (n, _, fallback) = read_all(ds, ReadGap::Bytes(0), 4, true);
    assert!(n > 40);
    eprintln!("tmpfs: O_DIRECT fallback used: {fallback}");
}

#[test]
fn a_corrupt_record_is_a_named_error() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 64);
    let (_, offset, len) = ds.index.record_location(21);
    let seg = ds.segment_path(0);
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[(offset + len as u64 - 1) as usize] ^= 0x10;
    std::fs::write(&seg, bytes).expect("write");
    let ds = Arc::new(ds);
    let engine = Engine::start(ds.clone(), EngineConfig::default()).expect("engine");
    for e in extents(&ds.index, 1, u64::MAX, ReadGap::Whole) {
        engine.submit(Job { tag: 1, extent: e }).expect("submit");
    }
    let records = engine
        .recv()
        .expect("completion")
        .result
        .expect("the read itself succeeds");
    // Only the corrupt record fails; its neighbours decode.
    let mut bad = records.iter().filter(|(_, r)| r.is_err());
    let (id, err) = bad.next().expect("crc must fail");
    assert!(bad.next().is_none(), "one record is corrupt");
    assert_eq!(*id, 21);
    assert_eq!(records.iter().filter(|(_, r)| r.is_ok()).count(), records.len() - 1);
    let msg = err.as_ref().expect_err("error").to_string();
    assert!(
        msg.contains("data-00000.brd") && msg.contains("chunk 1") && msg.contains("sample 21"),
        "{msg}"
    );
    assert!(msg.contains(&format!("at byte {offset}")), "{msg}");
}

#[test]
fn the_probe_measures_a_finite_gap() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(make_dataset(t.path(), 600));
    let r = brand_io::probe::measure(
        ds,
        &EngineConfig {
            queue_depth: 16,
            ..Default::default()
        },
    )
    .expect("probe");
    eprintln!("probe: {r:?}");
    assert!(r.small_request_secs > 0.0 && r.small_request_secs < 0.1, "{r:?}");
    assert!(r.large_bytes_per_sec > 1e6, "{r:?}");
    assert_eq!(r.gap % 4096, 0);
}
