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
    let cfg = EngineConfig {
        queue_depth,
        fixed_buffers,
        ..Default::default()
    };
    let (checked, bytes, fallback, _) = read_all_with(ds, gap, cfg);
    (checked, bytes, fallback)
}

/// [`read_all`] with any engine settings; also gives the backend used.
fn read_all_with(ds: Arc<Dataset>, gap: ReadGap, cfg: EngineConfig) -> (u64, u64, bool, brand_io::IoBackend) {
    let fixed_buffers = cfg.fixed_buffers;
    let engine = Engine::start(ds.clone(), cfg).expect("engine");
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
            engine.submit(Job::new(c, e)).expect("submit");
            jobs += 1;
        }
    }
    let (mut checked, mut bytes) = (0, 0);
    for _ in 0..jobs {
        let done = engine.recv().expect("completion");
        bytes += done.extent.len;
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
    (checked, bytes, engine.buffered_fallback(), engine.backend())
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

/// With SQPOLL the kernel's thread submits for the loop, which then only
/// wakes it when it idled: the records are the same.
#[test]
fn sqpoll_rings_read_the_same_records() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(make_dataset(t.path(), 300));
    let plain = read_all(ds.clone(), ReadGap::Bytes(0), 8, true);
    for fixed_buffers in [true, false] {
        let cfg = EngineConfig {
            queue_depth: 8,
            fixed_buffers,
            sqpoll: true,
            ..Default::default()
        };
        let (checked, bytes, _, backend) = read_all_with(ds.clone(), ReadGap::Bytes(0), cfg);
        assert_eq!(backend, brand_io::IoBackend::Uring);
        assert_eq!((checked, bytes), (plain.0, plain.1), "fixed buffers {fixed_buffers}");
    }
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

/// A job submitted while the ring loop sleeps (its reads all done) must
/// wake it, with or without SQPOLL (whose kernel thread also sleeps after
/// 50 ms idle): a lost wake fails here in seconds instead of hanging a reader.
#[test]
fn a_job_submitted_to_an_idle_ring_is_read() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(make_dataset(t.path(), 100));
    for sqpoll in [false, true] {
        let cfg = EngineConfig {
            sqpoll,
            ..Default::default()
        };
        let engine = Engine::start(ds.clone(), cfg).expect("engine");
        assert_eq!(
            engine.backend(),
            brand_io::IoBackend::Uring,
            "io_uring is available here"
        );
        for round in 0..30u64 {
            let chunk = round % ds.index.chunk_count();
            let jobs = extents(&ds.index, chunk, u64::MAX, ReadGap::Whole);
            for e in &jobs {
                let job = Job::new(chunk, e.clone());
                engine.submit(job).expect("submit");
            }
            for _ in &jobs {
                let done = engine
                    .recv_timeout(std::time::Duration::from_secs(20))
                    .expect("completion")
                    .unwrap_or_else(|| {
                        panic!("sqpoll {sqpoll}, round {round}: a job for an idle ring not read in 20 s")
                    });
                assert_eq!(done.tag, chunk);
                done.result.expect("read ok");
            }
            // Long enough for the loop to find nothing to do and sleep
            // (every tenth round, for SQPOLL's thread to sleep too).
            let idle_ms = if round % 10 == 9 { 60 } else { 1 + round % 5 };
            std::thread::sleep(std::time::Duration::from_millis(idle_ms));
        }
    }
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
        engine.submit(Job::new(1, e)).expect("submit");
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

/// A dataset of samples above 64 KiB, which sparse reads at gap 0 carry one
/// to an extent: the engine serves them in their read buffers.
fn large_dataset(root: &Path) -> Dataset {
    let g = brand_import::synthetic::GenOptions {
        samples: 40,
        mean_bytes: 110_000,
        min_bytes: 70_000,
        max_bytes: 200_000,
        classes: 2,
        ..Default::default()
    };
    let p = brand_pack::PackOptions {
        chunk_size: 8,
        ..Default::default()
    };
    Dataset::open(brand_import::synthetic::generate_and_pack(root, &g, &p).expect("pack")).expect("open")
}

/// Both backends, records read one to an extent into buffers that become
/// the samples: each equals the buffered read, 64-byte aligned; a damaged
/// one is its named crc error and its neighbours still decode.
#[test]
fn large_records_are_served_in_their_read_buffers_by_both_backends() {
    use brand_format::buffer::SAMPLE_ALIGN;
    use brand_io::engine::IoBackend;
    let t = tempfile::tempdir().expect("tempdir");
    let ds = large_dataset(t.path());
    let bad = 13;
    let (_, offset, len) = ds.index.record_location(bad);
    let seg = ds.segment_path(0);
    let mut bytes = std::fs::read(&seg).expect("read");
    let want_bad = ds.read_sample(bad).expect("before damage");
    bytes[(offset + len as u64 / 2) as usize] ^= 0x04;
    std::fs::write(&seg, bytes).expect("write");
    let ds = Arc::new(ds);
    for backend in [IoBackend::Uring, IoBackend::Threads] {
        for decode_threads in [0, 2] {
            let cfg = EngineConfig {
                backend,
                decode_threads,
                queue_depth: 4,
                ..Default::default()
            };
            let engine = Engine::start(ds.clone(), cfg).expect("engine");
            let mut jobs = 0;
            // Every other record (neighbours share a block and merge).
            for (c, mask) in (0..ds.index.chunk_count()).flat_map(|c| [(c, 0x5555), (c, 0xaaaa)]) {
                for e in extents(&ds.index, c, mask, ReadGap::Bytes(0)) {
                    assert_eq!(e.records.len(), 1, "records of 64 KiB or more are read one at a time");
                    engine.submit(Job::new(c, e)).expect("submit");
                    jobs += 1;
                }
            }
            let mut served = 0;
            for _ in 0..jobs {
                for (id, r) in engine.recv().expect("completion").result.expect("read ok") {
                    if id == bad {
                        let msg = r.expect_err("a damaged record is no sample").to_string();
                        assert!(
                            msg.contains("crc32c mismatch") && msg.contains(&format!("sample {bad}")),
                            "{backend}: {msg}"
                        );
                        assert_ne!(want_bad.len(), 0);
                        continue;
                    }
                    let data = r.expect("record ok");
                    assert_eq!(
                        &data[..],
                        &ds.read_sample(id).expect("buffered")[..],
                        "{backend}: sample {id}"
                    );
                    assert_eq!(data.as_ptr() as usize % SAMPLE_ALIGN, 0, "{backend}: sample {id}");
                    served += 1;
                }
            }
            assert_eq!(served, ds.index.samples() - 1, "{backend}");
        }
    }
}

/// Samples of exactly one 4 KiB block, read one to an extent (each into the
/// buffer that becomes its sample) by both backends, O_DIRECT on disk and
/// on tmpfs: each equals the buffered read; a damaged one is its named crc
/// error, never a sample, and the others are all served.
#[test]
fn block_sized_records_read_into_their_samples_keep_their_checks() {
    use brand_io::engine::IoBackend;
    for dir in [std::env::temp_dir(), std::path::PathBuf::from("/dev/shm")] {
        if !dir.is_dir() {
            continue;
        }
        let t = tempfile::tempdir_in(&dir).expect("tempdir");
        let g = brand_import::synthetic::GenOptions {
            samples: 96,
            mean_bytes: 4096,
            min_bytes: 4096,
            max_bytes: 4096,
            classes: 2,
            ..Default::default()
        };
        let p = brand_pack::PackOptions {
            chunk_size: 16,
            ..Default::default()
        };
        let ds =
            Dataset::open(brand_import::synthetic::generate_and_pack(t.path(), &g, &p).expect("pack")).expect("open");
        let bad = 37;
        let (_, offset, _) = ds.index.record_location(bad);
        let seg = ds.segment_path(0);
        let mut bytes = std::fs::read(&seg).expect("read");
        bytes[offset as usize + 100] ^= 0x08;
        std::fs::write(&seg, bytes).expect("write");
        let ds = Arc::new(ds);
        for backend in [IoBackend::Uring, IoBackend::Threads] {
            let cfg = EngineConfig {
                backend,
                queue_depth: 8,
                ..Default::default()
            };
            let engine = Engine::start(ds.clone(), cfg).expect("engine");
            let mut jobs = 0;
            for (c, mask) in (0..ds.index.chunk_count()).flat_map(|c| [(c, 0x5555u64), (c, 0xaaaa)]) {
                for e in extents(&ds.index, c, mask, ReadGap::Bytes(0)) {
                    assert_eq!((e.records.len(), e.len), (1, 4096));
                    engine.submit(Job::new(c, e)).expect("submit");
                    jobs += 1;
                }
            }
            let mut served = 0;
            for _ in 0..jobs {
                for (id, r) in engine.recv().expect("completion").result.expect("read ok") {
                    if id == bad {
                        let msg = r.expect_err("a damaged record is no sample").to_string();
                        assert!(
                            msg.contains("crc32c mismatch") && msg.contains(&format!("sample {bad}")),
                            "{backend}: {msg}"
                        );
                        continue;
                    }
                    let data = r.expect("record ok");
                    assert_eq!(
                        &data[..],
                        &ds.read_sample(id).expect("buffered")[..],
                        "{backend}: sample {id}"
                    );
                    served += 1;
                }
            }
            assert_eq!(served, ds.index.samples() - 1, "{backend} in {}", dir.display());
        }
    }
}

/// Every sample through the engine (both backends, whole chunks and one
/// record at a time), by id.
fn served(ds: &Arc<Dataset>) -> Vec<Vec<u8>> {
    use brand_io::engine::IoBackend;
    let mut out = vec![Vec::new(); ds.index.samples() as usize];
    for (backend, gap) in [
        (IoBackend::Uring, ReadGap::Bytes(0)),
        (IoBackend::Threads, ReadGap::Whole),
    ] {
        let cfg = EngineConfig {
            backend,
            ..Default::default()
        };
        let engine = Engine::start(ds.clone(), cfg).expect("engine");
        let mut jobs = 0;
        for (c, mask) in (0..ds.index.chunk_count()).flat_map(|c| [(c, 0x5555u64), (c, 0xaaaa)]) {
            for e in extents(&ds.index, c, mask, gap) {
                engine.submit(Job::new(c, e)).expect("submit");
                jobs += 1;
            }
        }
        for _ in 0..jobs {
            for (id, r) in engine.recv().expect("completion").result.expect("read ok") {
                let data = r.expect("record ok").to_vec();
                let slot = &mut out[id as usize];
                assert!(slot.is_empty() || *slot == data, "{backend}: sample {id} differs");
                *slot = data;
            }
        }
    }
    out
}

/// Datasets of format 1 read exactly as the same samples packed now, and
/// pass verify: records back to back (unflagged chunks, before aligned64)
/// and on 64-byte boundaries without the blocks flag (aligned64 alone).
/// Made here by re-encoding each chunk of a fresh pack with those flags and
/// marking the manifest format 1.
#[test]
fn format_1_datasets_read_identically() {
    use brand_format::chunk::{self, FLAG_ALIGNED64, FLAG_BLOCKS, RecordIn};
    for (layout, dropped) in [
        ("back to back", FLAG_ALIGNED64 | FLAG_BLOCKS),
        ("aligned64", FLAG_BLOCKS),
    ] {
        let t = tempfile::tempdir().expect("tempdir");
        let ds = large_dataset(t.path());
        assert_eq!(ds.manifest.format_version, brand_format::FORMAT_VERSION);
        let packed_now = Arc::new(ds.clone());
        let want = served(&packed_now);
        let index = ds.index.clone();
        let mut rel_offsets: Vec<u32> = (0..index.samples()).map(|i| index.rel_offset(i)).collect();
        let seg_path = ds.segment_path(0);
        let mut seg = std::fs::read(&seg_path).expect("segment");
        let (mut unaligned, mut straddling) = (0, 0);
        for c in 0..index.chunk_count() {
            let loc = index.chunk(c);
            let (at, len) = (loc.offset as usize, index.chunk_padded_len(c) as usize);
            let h = chunk::parse_header(&seg[at..at + len]).expect("header");
            assert!(
                h.aligned64() && h.blocks(),
                "brand pack writes aligned64 + blocks chunks"
            );
            let recs: Vec<RecordIn> = h
                .records
                .iter()
                .map(|r| RecordIn {
                    stored: &seg[at + r.offset as usize..at + (r.offset + r.stored_len) as usize],
                    raw_len: r.raw_len,
                    label: r.label,
                    key: &r.key,
                })
                .collect();
            let (bytes, table) = chunk::encode(c, h.flags & !dropped, &recs).expect("encode v1");
            assert!(bytes.len() <= len);
            let first = (c * index.chunk_size() as u64) as usize;
            for (i, e) in table.iter().enumerate() {
                rel_offsets[first + i] = e.offset;
                unaligned += usize::from(e.offset % 64 != 0);
                straddling += usize::from(chunk::extra_block(e.offset as u64, e.stored_len as u64));
            }
            seg[at..at + len].fill(0);
            seg[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        if dropped & FLAG_ALIGNED64 != 0 {
            assert!(
                unaligned > 10,
                "the rewritten records are mostly off 64-byte boundaries"
            );
        }
        assert!(straddling > 10, "{layout}: many rewritten records span an extra block");
        std::fs::write(&seg_path, &seg).expect("write segment");
        let metas = (0..index.samples())
            .map(|i| brand_format::index::SampleMeta {
                rel_offset: rel_offsets[i as usize],
                stored_len: index.stored_len(i),
                raw_len: index.raw_len(i),
                crc: index.crc(i),
                label: index.label(i),
                key: index.key(i).to_vec(),
            })
            .collect();
        let index = brand_format::index::Index::new(
            index.chunk_size(),
            index.segment_count(),
            index.chunk_locs().collect(),
            metas,
        )
        .expect("index");
        std::fs::write(ds.dir().join(brand_format::INDEX_FILE), index.as_bytes()).expect("write index");
        let manifest = ds.dir().join(brand_format::MANIFEST_FILE);
        let text = std::fs::read_to_string(&manifest).expect("manifest");
        let text = text.replacen(
            &format!("format_version = {}", brand_format::FORMAT_VERSION),
            "format_version = 1",
            1,
        );
        std::fs::write(&manifest, text).expect("write manifest");
        let v1 = Arc::new(Dataset::open(ds.dir()).expect("open v1"));
        assert_eq!(v1.manifest.format_version, 1);
        assert_eq!(v1.index, index);
        assert_eq!(v1.index.block_padding(), 0, "{layout}");
        assert_eq!(served(&v1), want, "{layout}");
        let report = brand_store::verify::verify(&v1, &|_, _| {}).expect("verify");
        assert!(report.problems.is_empty(), "{layout}: {:?}", report.problems);
    }
}
