//! The ABI called the way C calls it: through the extern functions, with raw
//! pointers.

use std::ffi::{CStr, CString, c_char};
use std::path::Path;
use std::ptr::{null, null_mut};

use brand::brand_status::*;
use brand::*;
use brand_format::Dataset;
use brand_import::files::FileSource;
use brand_pack::{PackOptions, pack};

mod common;
use common::last_error;

/// A handle value that was never returned by brand_open.
fn handle_of(id: usize) -> *mut brand_loader {
    std::ptr::without_provenance_mut(id)
}

const CFG: &str = "batch_size = 16\nmemory = \"32 slots\"\nread_gap = \"0\"\nqueue_depth = 8\nseed = 5\n";

/// A packed synthetic dataset of `samples` samples (pack seed `seed`) in `root/name`.
fn make_dataset(root: &Path, name: &str, samples: u64, seed: u64) -> CString {
    let src = root.join(format!("{name}-src"));
    let opts = brand_import::synthetic::GenOptions {
        samples,
        mean_bytes: 3000,
        min_bytes: 0,
        max_bytes: 12_000,
        classes: 4,
        seed,
        ..Default::default()
    };
    brand_import::synthetic::generate(&src, &opts, &|_, _| {}).expect("gen");
    let source = FileSource::image_folder(&src).expect("source");
    let out = root.join(name);
    let popts = PackOptions {
        chunk_size: 16,
        seed,
        ..Default::default()
    };
    pack(&source, &out, &popts, &|_, _, _| {}).expect("pack");
    CString::new(out.to_str().expect("utf-8 temp path")).expect("no NUL")
}

fn open(path: &CStr, cfg: &str) -> *mut brand_loader {
    let cfg = CString::new(cfg).expect("no NUL");
    let mut l = null_mut();
    let st = brand_open(path.as_ptr(), cfg.as_ptr(), &mut l);
    assert_eq!(st, BRAND_OK, "{}", last_error());
    assert!(!l.is_null());
    l
}

fn open_at(path: &CStr, cfg: &str, blob: &[u8]) -> (brand_status, *mut brand_loader) {
    let cfg = CString::new(cfg).expect("no NUL");
    let mut l = handle_of(usize::MAX); // must be overwritten
    let st = brand_open_at(path.as_ptr(), cfg.as_ptr(), blob.as_ptr(), blob.len(), &mut l);
    (st, l)
}

fn close(mut l: *mut brand_loader) {
    assert_eq!(brand_close(&mut l), BRAND_OK, "{}", last_error());
    assert!(l.is_null());
}

fn sample(b: *const brand_batch, i: usize) -> brand_sample {
    let mut s = brand_sample {
        data: null(),
        len: 0,
        key: null(),
        key_len: 0,
        id: u64::MAX,
        label: 0,
    };
    assert_eq!(brand_batch_sample(b, i, &mut s), BRAND_OK, "{}", last_error());
    s
}

/// One served sample, copied out of its batch.
#[derive(Debug, PartialEq)]
struct Got {
    id: u64,
    epoch: u64,
    label: i64,
    key: Vec<u8>,
    data: Vec<u8>,
}

/// Batches until END_OF_EPOCH (or `limit` batches), freeing each.
fn take(l: *mut brand_loader, limit: usize) -> (Vec<Got>, bool) {
    let mut got = Vec::new();
    for _ in 0..limit {
        let mut b = null_mut();
        match brand_next(l, &mut b) {
            BRAND_OK => {}
            BRAND_END_OF_EPOCH => {
                assert!(b.is_null());
                return (got, true);
            }
            other => panic!("brand_next: {other:?}: {}", last_error()),
        }
        let n = brand_batch_len(b);
        assert!((1..=16).contains(&n), "batch of {n}");
        for i in 0..n {
            let s = sample(b, i);
            assert_eq!(s.data as usize % BRAND_SAMPLE_ALIGN, 0, "64-byte aligned");
            assert!(!s.data.is_null() && !s.key.is_null());
            // SAFETY: the sample's pointers are valid while b lives.
            let (data, key) = unsafe {
                (
                    std::slice::from_raw_parts(s.data, s.len).to_vec(),
                    std::slice::from_raw_parts(s.key.cast::<u8>(), s.key_len).to_vec(),
                )
            };
            got.push(Got {
                id: s.id,
                epoch: brand_batch_epoch(b),
                label: s.label,
                key,
                data,
            });
        }
        brand_batch_free(&mut b);
        assert!(b.is_null());
    }
    (got, false)
}

fn epoch(l: *mut brand_loader) -> Vec<Got> {
    let (got, ended) = take(l, usize::MAX);
    assert!(ended);
    got
}

fn ids(g: &[Got]) -> Vec<u64> {
    g.iter().map(|s| s.id).collect()
}

fn save(l: *const brand_loader) -> Vec<u8> {
    let mut size = 0usize;
    assert_eq!(brand_state_size(l, &mut size), BRAND_OK);
    let mut buf = vec![0u8; size];
    let mut written = 0usize;
    assert_eq!(
        brand_state_save(l, buf.as_mut_ptr(), buf.len(), &mut written),
        BRAND_OK,
        "{}",
        last_error()
    );
    assert_eq!(written, size);
    buf
}

#[test]
fn versions_and_status_names() {
    // SAFETY: static NUL-terminated strings.
    let v = unsafe { CStr::from_ptr(brand_version()) }.to_str().expect("utf-8");
    assert_eq!(v, format!("brand {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(brand_abi_version(), BRAND_ABI_VERSION);
    let mut names = std::collections::HashSet::new();
    for s in ALL_STATUSES {
        // SAFETY: as above.
        let n = unsafe { CStr::from_ptr(brand_status_name(s as i32)) }
            .to_str()
            .expect("utf-8");
        assert!(n.starts_with("BRAND_") && names.insert(n.to_string()), "{n}");
    }
    assert_eq!(names.len(), 13);
    // SAFETY: as above.
    let unknown = unsafe { CStr::from_ptr(brand_status_name(12345)) };
    assert_eq!(unknown, c"BRAND_UNKNOWN_STATUS");
    assert_eq!(BRAND_ERR_CORRUPT as i32, -6, "status values are ABI");
}

#[test]
fn null_arguments_are_errors_not_crashes() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 40, 1);
    let mut l = handle_of(12345);
    assert_eq!(brand_open(null(), null(), &mut l), BRAND_ERR_INVALID_ARGUMENT);
    assert!(l.is_null(), "*out is NULL on failure");
    assert!(last_error().contains("dataset_path is NULL"), "{}", last_error());
    assert_eq!(
        brand_open(path.as_ptr(), null(), null_mut()),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        brand_open_at(path.as_ptr(), null(), null(), 0, &mut l),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("state is NULL"));

    let l = open(&path, CFG);
    let mut b = handle_of(1).cast::<brand_batch>();
    assert_eq!(brand_next(null_mut(), &mut b), BRAND_ERR_INVALID_ARGUMENT);
    assert!(b.is_null());
    assert!(last_error().contains("loader is NULL"));
    assert_eq!(brand_next(l, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_start_epoch(null_mut(), 0), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_set_last_epoch(null_mut(), 0), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_tell(null(), null_mut(), null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_tell(l, null_mut(), null_mut()), BRAND_OK, "both outs optional");
    assert_eq!(brand_epoch_len(l, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_dataset_samples(l, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_state_size(l, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    let mut written = 0usize;
    assert_eq!(
        brand_state_save(l, null_mut(), 4096, &mut written),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        brand_state_save(l, null_mut(), 0, null_mut()),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert_eq!(brand_get_metrics(l, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(brand_batch_len(null()), 0);
    assert_eq!(brand_batch_epoch(null()), 0);
    let mut s = sample_zeroed();
    assert_eq!(brand_batch_sample(null(), 0, &mut s), BRAND_ERR_INVALID_ARGUMENT);
    brand_batch_free(null_mut());
    let mut nb: *mut brand_batch = null_mut();
    brand_batch_free(&mut nb);
    assert_eq!(brand_close(null_mut()), BRAND_OK);
    let mut nl: *mut brand_loader = null_mut();
    assert_eq!(brand_close(&mut nl), BRAND_OK);

    // A real batch with a NULL out or an index out of range.
    let mut b = null_mut();
    assert_eq!(brand_next(l, &mut b), BRAND_OK);
    assert_eq!(brand_batch_sample(b, 0, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    let n = brand_batch_len(b);
    assert_eq!(brand_batch_sample(b, n, &mut s), BRAND_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains(&format!("sample {n} of a batch of {n}")),
        "{}",
        last_error()
    );
    assert_eq!(brand_batch_sample(b, 0, &mut s), BRAND_OK);
    assert_eq!(last_error(), "", "success clears the message");
    brand_batch_free(&mut b);
    close(l);
}

#[test]
fn samples_in_bulk_equal_samples_one_by_one() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 40, 1);
    let l = open(&path, CFG);
    let mut b = null_mut();
    assert_eq!(brand_next(l, &mut b), BRAND_OK);
    let n = brand_batch_len(b);
    let mut bulk = vec![sample_zeroed(); n];
    assert_eq!(
        brand_batch_samples(b, 0, n, bulk.as_mut_ptr()),
        BRAND_OK,
        "{}",
        last_error()
    );
    for (i, got) in bulk.iter().enumerate() {
        let one = sample(b, i);
        assert_eq!(
            (got.data, got.len, got.key, got.key_len, got.id, got.label),
            (one.data, one.len, one.key, one.key_len, one.id, one.label)
        );
    }
    let mut tail = vec![sample_zeroed(); 3];
    assert_eq!(brand_batch_samples(b, n - 3, 3, tail.as_mut_ptr()), BRAND_OK);
    assert_eq!(tail[2].id, bulk[n - 1].id);
    // Out of range (also through overflow): an error, nothing written.
    let mut untouched = vec![sample_zeroed(); 2];
    assert_eq!(
        brand_batch_samples(b, n - 1, 2, untouched.as_mut_ptr()),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains(&format!("of a batch of {n}")), "{}", last_error());
    assert!(untouched[0].data.is_null(), "nothing written on error");
    assert_eq!(
        brand_batch_samples(b, usize::MAX, 2, untouched.as_mut_ptr()),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        brand_batch_samples(b, 0, 0, null_mut()),
        BRAND_OK,
        "count 0 needs no out"
    );
    assert_eq!(brand_batch_samples(b, 0, 1, null_mut()), BRAND_ERR_INVALID_ARGUMENT);
    assert_eq!(
        brand_batch_samples(null(), 0, 0, null_mut()),
        BRAND_ERR_INVALID_ARGUMENT
    );
    brand_batch_free(&mut b);
    close(l);
}

fn sample_zeroed() -> brand_sample {
    brand_sample {
        data: null(),
        len: 0,
        key: null(),
        key_len: 0,
        id: 0,
        label: 0,
    }
}

#[test]
fn bad_paths_and_configs_say_what_is_wrong() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 40, 1);
    let mut l = handle_of(7);
    let missing = CString::new(t.path().join("nope").to_str().expect("utf-8")).expect("no NUL");
    assert_eq!(brand_open(missing.as_ptr(), null(), &mut l), BRAND_ERR_NOT_FOUND);
    assert!(l.is_null());
    assert!(last_error().contains("nope"), "{}", last_error());
    for (cfg, word) in [
        ("batch_size = 0", "batch_size"),
        ("policy = \"lru\"", "lru"),
        ("bogus = 1", "bogus"),
        ("rank = 3\nworld = 2", "rank 3"),
    ] {
        let c = CString::new(cfg).expect("no NUL");
        assert_eq!(brand_open(path.as_ptr(), c.as_ptr(), &mut l), BRAND_ERR_CONFIG, "{cfg}");
        assert!(l.is_null());
        assert!(last_error().contains(word), "{cfg}: {}", last_error());
    }
    // Absurd batch sizes are range-checked, never an allocation abort.
    for cfg in ["batch_size = 4611686018427387904", "batch_size = 18446744073709551615"] {
        let c = CString::new(cfg).expect("no NUL");
        assert_eq!(brand_open(path.as_ptr(), c.as_ptr(), &mut l), BRAND_ERR_CONFIG, "{cfg}");
        assert!(l.is_null());
        assert!(last_error().contains("batch_size"), "{cfg}: {}", last_error());
    }
    // brand.h: a config that is not UTF-8 is BRAND_ERR_INVALID_ARGUMENT.
    let not_utf8 = [b'a' as c_char, 0xff_u8 as c_char, 0];
    assert_eq!(
        brand_open(path.as_ptr(), not_utf8.as_ptr(), &mut l),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("UTF-8"));
    let mut len = 0;
    assert_eq!(
        brand_epoch_len_for(path.as_ptr(), not_utf8.as_ptr(), &mut len),
        BRAND_ERR_INVALID_ARGUMENT
    );
    // A directory that is not a dataset (no manifest.toml).
    let src = CString::new(t.path().join("ds-src").to_str().expect("utf-8")).expect("no NUL");
    assert_eq!(brand_open(src.as_ptr(), null(), &mut l), BRAND_ERR_NOT_FOUND);
    assert!(last_error().contains("manifest"), "{}", last_error());
    // brand.h: a malformed manifest is BRAND_ERR_FORMAT, not UTF-8 included.
    let manifest = Path::new(path.to_str().expect("utf-8")).join("manifest.toml");
    let mut text = std::fs::read(&manifest).expect("manifest");
    text.extend_from_slice(b"# \xff\xfe\n");
    std::fs::write(&manifest, &text).expect("write manifest");
    assert_eq!(brand_open(path.as_ptr(), null(), &mut l), BRAND_ERR_FORMAT);
    assert!(
        last_error().contains("manifest.toml") && last_error().contains("UTF-8"),
        "{}",
        last_error()
    );
    assert!(l.is_null());
}

#[test]
fn epoch_len_for_matches_an_open_loader_from_metadata_only() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 150, 1);
    let configs = [
        CFG.to_string(),
        format!("{CFG}world = 4\nrank = 3\n"),
        format!("{CFG}world = 4\nrank = 1\ndrop_last = true\n"),
        format!("{CFG}world = 7\nrank = 0\n"),
    ];
    let mut lens = Vec::new();
    for cfg in &configs {
        let c = CString::new(cfg.as_str()).expect("no NUL");
        let l = open(&path, cfg);
        let (mut opened, mut metadata) = (0u64, 0u64);
        assert_eq!(brand_epoch_len(l, &mut opened), BRAND_OK);
        assert_eq!(brand_epoch_len_for(path.as_ptr(), c.as_ptr(), &mut metadata), BRAND_OK);
        assert_eq!(metadata, opened, "{cfg}");
        lens.push(metadata);
        close(l);
    }
    assert_eq!(lens, vec![150, 38, 37, 22]);
    let mut len = 0;
    assert_eq!(brand_epoch_len_for(path.as_ptr(), null(), &mut len), BRAND_OK);
    assert_eq!(len, 150, "NULL config: the defaults");
    // Metadata only: without its segment files the dataset still answers
    // (a loader could not read it).
    let dir = Path::new(path.to_str().expect("utf-8"));
    std::fs::remove_file(dir.join("data-00000.brd")).expect("remove segment");
    let mut again = 0;
    assert_eq!(brand_epoch_len_for(path.as_ptr(), null(), &mut again), BRAND_OK);
    assert_eq!(again, 150);
    // Errors as brand_open; *out untouched.
    let mut untouched = 99;
    assert_eq!(
        brand_epoch_len_for(path.as_ptr(), c"rank = 2\nworld = 2".as_ptr(), &mut untouched),
        BRAND_ERR_CONFIG
    );
    assert_eq!(untouched, 99);
    let missing = CString::new(t.path().join("nope").to_str().expect("utf-8")).expect("no NUL");
    assert_eq!(
        brand_epoch_len_for(missing.as_ptr(), null(), &mut untouched),
        BRAND_ERR_NOT_FOUND
    );
    assert_eq!(
        brand_epoch_len_for(null(), null(), &mut untouched),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        brand_epoch_len_for(path.as_ptr(), null(), null_mut()),
        BRAND_ERR_INVALID_ARGUMENT
    );
    assert_eq!(untouched, 99);
}

#[test]
fn batches_are_the_datasets_bytes_each_sample_once_per_epoch() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 150, 1);
    let ds = Dataset::open(path.to_str().expect("utf-8")).expect("open");
    let l = open(&path, CFG);
    let (mut n, mut len) = (0u64, 0u64);
    assert_eq!(brand_dataset_samples(l, &mut n), BRAND_OK);
    assert_eq!(brand_epoch_len(l, &mut len), BRAND_OK);
    assert_eq!((n, len), (150, 150));
    let e0 = epoch(l);
    for g in &e0 {
        assert_eq!(g.data, ds.read_sample(g.id).expect("buffered read"), "sample {}", g.id);
        assert_eq!(g.label, ds.index.label(g.id));
        assert_eq!(g.key, ds.index.key(g.id));
        assert_eq!(g.epoch, 0);
    }
    let mut sorted = ids(&e0);
    sorted.sort_unstable();
    assert_eq!(sorted, (0..150).collect::<Vec<u64>>(), "exactly once");
    // After END_OF_EPOCH the position is the next epoch's start ...
    let (mut ep, mut served) = (9, 9);
    assert_eq!(brand_tell(l, &mut ep, &mut served), BRAND_OK);
    assert_eq!((ep, served), (1, 0));
    // ... and the next call starts it: a different order, again exactly once.
    let e1 = epoch(l);
    assert!(e1.iter().all(|g| g.epoch == 1));
    let mut sorted1 = ids(&e1);
    sorted1.sort_unstable();
    assert_eq!(sorted1, sorted);
    assert_ne!(ids(&e1), ids(&e0), "each epoch has its own order");
    // start_epoch(0) replays epoch 0 exactly.
    assert_eq!(brand_start_epoch(l, 0), BRAND_OK);
    assert_eq!(ids(&epoch(l)), ids(&e0));
    close(l);
}

#[test]
fn freeing_nulls_the_variable_and_batches_outlive_their_loader() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 40, 1);
    let mut l = open(&path, CFG);
    let mut b = null_mut();
    assert_eq!(brand_next(l, &mut b), BRAND_OK);
    let first = sample(b, 0);
    // SAFETY: valid while b lives.
    let before = unsafe { std::slice::from_raw_parts(first.data, first.len) }.to_vec();
    assert_eq!(brand_close(&mut l), BRAND_OK);
    assert!(l.is_null());
    // The batch owns its samples: still readable after the loader is gone.
    let again = sample(b, 0);
    assert_eq!(again.data, first.data);
    // SAFETY: as above.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(again.data, again.len) },
        &before[..]
    );
    brand_batch_free(&mut b);
    assert!(b.is_null());
    brand_batch_free(&mut b); // a second free through the same variable: no-op
    assert!(b.is_null());
    assert_eq!(brand_batch_len(b), 0);
}

#[test]
fn use_after_close_and_double_close_are_errors() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 40, 1);
    let mut l = open(&path, CFG);
    let stale = l;
    close_via(&mut l);
    let mut b = null_mut();
    assert_eq!(brand_next(l, &mut b), BRAND_ERR_INVALID_ARGUMENT, "the NULLed variable");
    assert_eq!(brand_next(stale, &mut b), BRAND_ERR_CLOSED, "a stale copy");
    assert!(b.is_null());
    assert!(last_error().contains("not open"), "{}", last_error());
    let mut e = 0u64;
    assert_eq!(brand_tell(stale, &mut e, null_mut()), BRAND_ERR_CLOSED);
    assert_eq!(brand_start_epoch(stale, 1), BRAND_ERR_CLOSED);
    assert_eq!(brand_set_last_epoch(stale, 1), BRAND_ERR_CLOSED);
    let mut copy = stale;
    assert_eq!(brand_close(&mut copy), BRAND_ERR_CLOSED, "double close through a copy");
    assert!(copy.is_null());
    // A loader opened later never gets the old handle.
    let l2 = open(&path, CFG);
    assert_ne!(l2, stale);
    assert_eq!(brand_next(stale, &mut b), BRAND_ERR_CLOSED);
    // Garbage handles are looked up, never dereferenced.
    assert_eq!(brand_next(handle_of(0xdead_beef), &mut b), BRAND_ERR_CLOSED);
    close(l2);
}

fn close_via(l: &mut *mut brand_loader) {
    assert_eq!(brand_close(l), BRAND_OK);
    assert!(l.is_null());
}

#[test]
fn last_error_is_per_thread() {
    let mut l = handle_of(3);
    assert_eq!(brand_open(null(), null(), &mut l), BRAND_ERR_INVALID_ARGUMENT);
    let here = last_error();
    assert!(!here.is_empty());
    let there = std::thread::spawn(last_error).join().expect("thread");
    assert_eq!(there, "", "another thread has no message");
    assert_eq!(last_error(), here, "reading it does not clear it");
}

#[test]
fn state_restores_mid_epoch_exactly_and_with_another_batch_size() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 200, 1);
    let full = open(&path, CFG);
    let e0 = ids(&epoch(full));
    let e1 = ids(&epoch(full));
    close(full);

    for (stop, resume_cfg) in [
        (3usize, CFG.to_string()),
        (7, CFG.replace("batch_size = 16", "batch_size = 5")),
    ] {
        let first = open(&path, CFG);
        let (head, ended) = take(first, stop);
        assert!(!ended);
        let blob = save(first);
        let (mut ep, mut served) = (0, 0);
        assert_eq!(brand_tell(first, &mut ep, &mut served), BRAND_OK);
        assert_eq!((ep, served), (0, 16 * stop as u64));
        close(first);
        let (st, second) = open_at(&path, &resume_cfg, &blob);
        assert_eq!(st, BRAND_OK, "{}", last_error());
        let mut got = ids(&head);
        got.extend(ids(&epoch(second)));
        assert_eq!(got, e0, "stop after {stop} batches");
        assert_eq!(ids(&epoch(second)), e1, "and the next epoch as an uninterrupted run");
        close(second);
    }

    // A state saved at an epoch's end resumes at the next epoch's start.
    let l = open(&path, CFG);
    epoch(l);
    let blob = save(l);
    close(l);
    let (st, r) = open_at(&path, CFG, &blob);
    assert_eq!(st, BRAND_OK);
    assert_eq!(ids(&epoch(r)), e1);
    close(r);
}

#[test]
fn restoring_elsewhere_fails_clearly() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 100, 1);
    let l = open(&path, CFG);
    take(l, 2);
    let blob = save(l);

    // The buffer must be big enough; *written says how big.
    let mut small = [0u8; 10];
    let mut written = 0usize;
    assert_eq!(
        brand_state_save(l, small.as_mut_ptr(), small.len(), &mut written),
        BRAND_ERR_BUFFER_TOO_SMALL
    );
    assert_eq!(written, blob.len());
    assert_eq!(small, [0u8; 10], "nothing written");
    close(l);

    let expect = |path: &CStr, cfg: &str, blob: &[u8], status: brand_status, words: &[&str]| {
        let (st, r) = open_at(path, cfg, blob);
        let msg = last_error();
        assert_eq!(st, status, "{msg}");
        assert!(r.is_null(), "*out is NULL on failure");
        for w in words {
            assert!(msg.contains(w), "{w:?} not in {msg:?}");
        }
    };
    // Plan config.
    expect(
        &path,
        &CFG.replace("seed = 5", "seed = 6"),
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["different plan config", "seed 5 in the state, 6 now"],
    );
    expect(
        &path,
        &format!("{CFG}policy = \"direct\""),
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["policy brand in the state, direct now"],
    );
    expect(
        &path,
        &CFG.replace("32 slots", "48 slots"),
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["memory"],
    );
    expect(
        &path,
        &format!("{CFG}drop_last = true"),
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["drop_last"],
    );
    expect(
        &path,
        &format!("{CFG}world = 2\nrank = 1"),
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["rank 0 in the state, 1 now", "world 1 in the state, 2 now"],
    );
    // Same sample count and chunk size, other data and pack seed.
    let other = make_dataset(t.path(), "other", 100, 2);
    expect(
        &other,
        CFG,
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["different dataset", "pack seed 1 in the state, 2 now"],
    );
    let bigger = make_dataset(t.path(), "bigger", 120, 1);
    expect(
        &bigger,
        CFG,
        &blob,
        BRAND_ERR_STATE_MISMATCH,
        &["samples 100 in the state, 120 now"],
    );
    // Not a state at all.
    expect(&path, CFG, &blob[..20], BRAND_ERR_INVALID_STATE, &["88"]);
    expect(
        &path,
        CFG,
        b"definitely not a state",
        BRAND_ERR_INVALID_STATE,
        &["not a brand loader state"],
    );
    let mut damaged = blob.clone();
    damaged[30] ^= 4;
    expect(&path, CFG, &damaged, BRAND_ERR_INVALID_STATE, &["damaged"]);
    // I/O settings may change.
    let io = CFG
        .replace("read_gap = \"0\"", "read_gap = \"whole\"")
        .replace("queue_depth = 8", "queue_depth = 2");
    let (st, r) = open_at(&path, &io, &blob);
    assert_eq!(st, BRAND_OK, "{}", last_error());
    let (mut e, mut s) = (9, 9);
    assert_eq!(brand_tell(r, &mut e, &mut s), BRAND_OK);
    assert_eq!((e, s), (0, 32));
    close(r);
}

#[test]
fn a_corrupt_record_is_data_loss_named_by_chunk_and_offset() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 80, 1);
    let ds = Dataset::open(path.to_str().expect("utf-8")).expect("open");
    let victim = (0..80)
        .find(|&i| ds.index.stored_len(i) > 0)
        .expect("a non-empty sample");
    let (_, offset, _) = ds.index.record_location(victim);
    let seg = ds.segment_path(0);
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[offset as usize] ^= 1;
    std::fs::write(&seg, bytes).expect("write");

    let l = open(&path, CFG);
    let mut served = Vec::new();
    let mut b = null_mut();
    let status = loop {
        match brand_next(l, &mut b) {
            BRAND_OK => {
                served.extend((0..brand_batch_len(b)).map(|i| sample(b, i).id));
                brand_batch_free(&mut b);
            }
            other => break other,
        }
    };
    assert_eq!(status, BRAND_ERR_CORRUPT);
    assert!(b.is_null());
    let msg = last_error();
    let chunk = ds.index.chunk_of(victim);
    for w in [
        format!("chunk {chunk}"),
        format!("at byte {offset}"),
        format!("sample {victim}"),
        "crc32c".to_string(),
    ] {
        assert!(msg.contains(&w), "{w:?} not in {msg:?}");
    }
    assert!(!served.contains(&victim));
    // Reported again, and the position does not move.
    let (mut e, mut s) = (9, 9);
    assert_eq!(brand_tell(l, &mut e, &mut s), BRAND_OK);
    assert_eq!(brand_next(l, &mut b), BRAND_ERR_CORRUPT);
    let (mut e2, mut s2) = (9, 9);
    assert_eq!(brand_tell(l, &mut e2, &mut s2), BRAND_OK);
    assert_eq!((e, s), (e2, s2));
    assert_eq!(s, served.len() as u64);
    close(l);
}

#[test]
fn no_read_ahead_past_a_last_epoch_and_the_next_still_served() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 400, 1);
    // Reads issued by the end of epoch 0, and the two epochs' ids.
    let run = |readahead: &str, last: Option<i64>| {
        let l = open(&path, &format!("{CFG}readahead = \"{readahead}\"\n"));
        if let Some(e) = last {
            assert_eq!(brand_set_last_epoch(l, e), BRAND_OK, "{}", last_error());
        }
        let e0 = ids(&epoch(l));
        let mut m = brand_metrics {
            struct_size: size_of::<brand_metrics>() as u32,
            ..Default::default()
        };
        assert_eq!(brand_get_metrics(l, &mut m), BRAND_OK, "{}", last_error());
        let e1 = ids(&epoch(l));
        close(l);
        (m.reads_issued, e0, e1)
    };
    let (own, e0, e1) = run("0", None);
    let (ahead, a0, a1) = run("64MiB", None);
    let (bounded, b0, b1) = run("64MiB", Some(0));
    let (unset, u0, u1) = run("64MiB", Some(-1));
    assert!(
        ahead > own,
        "read-ahead crosses into epoch 1: {ahead} reads, {own} of epoch 0"
    );
    assert_eq!(bounded, own, "no read of epoch 1 before it is asked for");
    assert!(unset > own, "a negative epoch names none: {unset}");
    assert_ne!(e0, e1);
    assert_eq!((a0, a1), (e0.clone(), e1.clone()));
    assert_eq!((b0, b1), (e0.clone(), e1.clone()));
    assert_eq!((u0, u1), (e0, e1));
}

/// A start's first fill read record by record is counted: samples of
/// 96 KiB in chunks of 16 (1.5 MiB reads), over two epochs.
#[test]
fn metrics_count_the_reads_of_a_starts_first_fill_made_record_by_record() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = brand_import::synthetic::large_dataset(t.path(), 320, 16).expect("pack");
    let path = CString::new(ds.to_str().expect("utf-8")).expect("no NUL");
    let l = open(&path, "memory = \"20%\"\nread_gap = \"0\"\nbatch_size = 8\n");
    let metrics = |l| {
        let mut m = brand_metrics {
            struct_size: size_of::<brand_metrics>() as u32,
            ..Default::default()
        };
        assert_eq!(brand_get_metrics(l, &mut m), BRAND_OK, "{}", last_error());
        m
    };
    assert_eq!(epoch(l).len(), 320);
    let first = metrics(l).reads_deferred;
    assert!(first > 0, "{:?}", metrics(l));
    assert_eq!(epoch(l).len(), 320);
    assert_eq!(metrics(l).reads_deferred, first, "the next epoch's reads are whole");
    close(l);
}

#[test]
fn metrics_fill_only_what_the_caller_has_room_for() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 100, 1);
    let l = open(&path, CFG);
    let got = epoch(l);
    let full = size_of::<brand_metrics>();

    let mut m = brand_metrics {
        struct_size: full as u32,
        ..Default::default()
    };
    assert_eq!(brand_get_metrics(l, &mut m), BRAND_OK, "{}", last_error());
    assert_eq!(m.struct_size as usize, full);
    assert_eq!(m.samples_served, got.len() as u64);
    assert_eq!(m.bytes_served, got.iter().map(|g| g.data.len() as u64).sum::<u64>());
    assert!(m.bytes_read >= m.bytes_served && m.reads_issued > 0);
    assert_eq!(m.read_gap, 0);
    assert!((m.read_amplification - m.bytes_read as f64 / m.bytes_served as f64).abs() < 1e-9);
    // Metadata: the index mapped (8 bytes a chunk on the heap), the plan's
    // order of 100 samples (4 bytes each) at least.
    let index_len = std::fs::metadata(t.path().join("ds/index.bin")).expect("index").len();
    assert_eq!(m.index_file_bytes, index_len);
    assert_eq!(m.index_heap_bytes, 8 * 100u64.div_ceil(16));
    assert!(m.plan_peak_bytes >= 400 && m.plan_peak_bytes >= m.plan_bytes, "{m:?}");

    // An older, shorter struct: bytes past its end are not touched.
    let old = std::mem::offset_of!(brand_metrics, samples_served);
    let mut buf = [0xABu8; size_of::<brand_metrics>() + 16];
    buf[..4].copy_from_slice(&(old as u32).to_ne_bytes());
    assert_eq!(brand_get_metrics(l, buf.as_mut_ptr().cast()), BRAND_OK);
    assert_eq!(u32::from_ne_bytes(buf[..4].try_into().expect("4")), old as u32);
    assert_eq!(u64::from_ne_bytes(buf[8..16].try_into().expect("8")), m.bytes_read);
    assert!(
        buf[old..].iter().all(|&x| x == 0xAB),
        "wrote past the caller's struct_size"
    );

    // A newer, longer struct: filled up to ours, told how much.
    let mut buf = [0xCDu8; size_of::<brand_metrics>() + 16];
    buf[..4].copy_from_slice(&((full + 16) as u32).to_ne_bytes());
    assert_eq!(brand_get_metrics(l, buf.as_mut_ptr().cast()), BRAND_OK);
    assert_eq!(u32::from_ne_bytes(buf[..4].try_into().expect("4")), full as u32);
    assert!(buf[full..].iter().all(|&x| x == 0xCD));

    // Just the size field, and too small to hold even that.
    let mut four = brand_metrics {
        struct_size: 4,
        bytes_read: 77,
        ..Default::default()
    };
    assert_eq!(brand_get_metrics(l, &mut four), BRAND_OK);
    assert_eq!((four.struct_size, four.bytes_read), (4, 77));
    let mut zero = brand_metrics::default();
    assert_eq!(brand_get_metrics(l, &mut zero), BRAND_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("struct_size"));
    close(l);
}

#[test]
fn metrics_report_the_backend_and_the_engine_memory() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 100, 1);
    let full = size_of::<brand_metrics>() as u32;
    // Read-ahead stops once it reaches the limit: it overshoots by at most one read.
    let index = &Dataset::open(path.to_str().expect("utf-8")).expect("open").index;
    let largest_read = (0..index.chunk_count())
        .map(|c| index.chunk_padded_len(c))
        .max()
        .expect("chunks");
    for (backend, threads) in [("threads", 1), ("uring", 0)] {
        let l = open(
            &path,
            &format!("{CFG}io_backend = \"{backend}\"\nreadahead = \"1MiB\"\n"),
        );
        let got = epoch(l);
        let mut m = brand_metrics {
            struct_size: full,
            ..Default::default()
        };
        assert_eq!(brand_get_metrics(l, &mut m), BRAND_OK, "{}", last_error());
        assert_eq!((m.threads_backend, m.uring_refused), (threads, 0), "{backend}");
        assert_eq!(m.samples_served, got.len() as u64);
        assert!(m.peak_readahead_bytes > 0, "{backend}");
        assert!(
            m.peak_readahead_bytes <= (1 << 20) + largest_read,
            "{backend}: {}",
            m.peak_readahead_bytes
        );
        assert!(
            m.registered_buffer_bytes <= 1 << 20,
            "{backend}: {}",
            m.registered_buffer_bytes
        );
        assert_eq!(m.skipped_corrupt, 0);
        // Appended after reads_deferred: CFG's memory, and the decided run length.
        assert_eq!(m.memory_slots, 32, "{backend}");
        assert!(m.run_length >= 1, "{backend}: {}", m.run_length);
        close(l);
    }
}

/// The conversions the table names, and that each value lands in its own
/// field.
#[test]
fn brand_metrics_converts_as_the_table_says() {
    // Each value lands in its own field: a table row's value is the field
    // it names (the derived read_amplification aside).
    let m = ::brand_loader::Metrics {
        bytes_read: 1,
        reads_deferred: 2,
        memory_slots: 3,
        run_length: 4,
        read_gap: None,
        buffered_fallback: true,
        store_hedges: 5,
        bytes_served: 2,
        ..::brand_loader::Metrics::default()
    };
    let c = brand_metrics::from(&m);
    assert_eq!(c.struct_size as usize, size_of::<brand_metrics>());
    assert_eq!(
        (c.bytes_read, c.reads_deferred, c.memory_slots, c.run_length),
        (1, 2, 3, 4)
    );
    assert_eq!(c.read_gap, BRAND_READ_GAP_WHOLE);
    assert_eq!((c.buffered_fallback, c.threads_backend), (1, 0));
    assert_eq!(c.store_hedges, 5);
    assert_eq!(c.read_amplification, 0.5);
}

/// `brand_metrics` as released: a field's offset never changes (fields are
/// only appended: an older caller's shorter struct stays valid). A field
/// appended later may be added here once released.
#[test]
fn brand_metrics_fields_keep_their_offsets() {
    macro_rules! at {
        ($($field:ident $offset:literal)*) => {
            [$((stringify!($field), std::mem::offset_of!(brand_metrics, $field), $offset)),*]
        };
    }
    let released = at!(
        struct_size 0 buffered_fallback 4 bytes_read 8 bytes_served 16 samples_served 24
        reads_issued 32 refills 40 recovery_reads 48 stalls 56 stall_secs_total 64
        stall_p50_secs 72 stall_p95_secs 80 stall_p99_secs 88 stall_max_secs 96
        peak_resident_bytes 104 peak_resident_samples 112 read_gap 120 read_amplification 128
        threads_backend 136 uring_refused 140 peak_readahead_bytes 144 registered_buffer_bytes 152
        peak_read_buffer_bytes 160 skipped_corrupt 168 nodes 176 node_rank 180 samples_local 184
        samples_received 192 bytes_received 200 samples_pushed 208 bytes_pushed 216
        remote_memory_peak 224 remote_memory_limit 232 owner_peak_bytes 240 store_requests 248
        store_bytes_fetched 256 store_retries 264 store_hedges 272 store_get_p50_ms 280
        store_get_p99_ms 288 store_first_byte_p50_ms 296 store_gets_in_flight_limit 304
        index_file_bytes 312 index_heap_bytes 320 plan_bytes 328 plan_peak_bytes 336
        reads_deferred 344 memory_slots 352 run_length 360 tier_hits 368 tier_hit_bytes 376
        tier_chunks_fetched 384 tier_bytes_fetched 392 tier_refused 400 tier_waited 408
        tier_failed_reads 416 tier_kept_chunks 424 tier_held_bytes 432 tier_limit_bytes 440
        tier_benefit 448 tier_owed_bytes 456 tier_evicted_bytes 464
    );
    for (field, got, want) in released {
        assert_eq!(got, want, "brand_metrics.{field} moved: fields are only appended");
    }
    assert!(size_of::<brand_metrics>() >= 472);
}

#[test]
fn one_loader_from_two_threads_is_serialised_not_torn() {
    let t = tempfile::tempdir().expect("tempdir");
    let path = make_dataset(t.path(), "ds", 300, 1);
    let l = open(&path, CFG);
    let handle = l.addr();
    // Two threads race on one loader until the epoch ends: together they
    // must see every sample exactly once.
    let workers: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let l = handle_of(handle);
                let mut seen = Vec::new();
                loop {
                    let mut b = null_mut();
                    match brand_next(l, &mut b) {
                        BRAND_OK => {
                            let e = brand_batch_epoch(b);
                            seen.extend((0..brand_batch_len(b)).map(|i| (e, sample(b, i).id)));
                            brand_batch_free(&mut b);
                        }
                        BRAND_END_OF_EPOCH => return seen,
                        other => panic!("{other:?}: {}", last_error()),
                    }
                }
            })
        })
        .collect();
    let all: Vec<(u64, u64)> = workers.into_iter().flat_map(|w| w.join().expect("worker")).collect();
    // The thread that did not see the end may have gone on into epoch 1:
    // epoch 0 is checked exactly, epoch 1 for no repeats.
    for (e, want_all) in [(0, true), (1, false)] {
        let mut got: Vec<u64> = all.iter().filter(|s| s.0 == e).map(|s| s.1).collect();
        got.sort_unstable();
        let n = got.len();
        got.dedup();
        assert_eq!(got.len(), n, "epoch {e}: a sample served twice");
        if want_all {
            assert_eq!(got, (0..300).collect::<Vec<u64>>());
        }
    }
    close(l);
}
