//! A job attached to a cache (`cache = "PATH"`) through the C ABI: its state
//! saved mid-epoch holds the samples it served, and `brand_open_at` resumes
//! from it attached again or alone, every sample once in the epoch with the
//! bytes of the dataset.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::Arc;

use ::brand_loader::{IoConfig, ReadGapSetting};
use brand::brand_status::*;
use brand::*;
use brand_cache::{CacheConfig, CacheHandle};
use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_plan::Memory;

mod common;
use common::last_error;

const SAMPLES: u64 = 300;

fn open_at(path: &CStr, cfg: &CStr, blob: &[u8]) -> (brand_status, *mut brand_loader) {
    let mut l = null_mut();
    let st = brand_open_at(path.as_ptr(), cfg.as_ptr(), blob.as_ptr(), blob.len(), &mut l);
    (st, l)
}

/// Up to `limit` batches (all of the epoch with usize::MAX) as (id, bytes).
fn take(l: *mut brand_loader, limit: usize) -> Vec<(u64, Vec<u8>)> {
    let mut got = Vec::new();
    for _ in 0..limit {
        let mut b = null_mut();
        match brand_next(l, &mut b) {
            BRAND_OK => {}
            BRAND_END_OF_EPOCH => return got,
            other => panic!("brand_next: {other:?}: {}", last_error()),
        }
        for i in 0..brand_batch_len(b) {
            let mut s = brand_sample {
                data: std::ptr::null(),
                len: 0,
                key: std::ptr::null(),
                key_len: 0,
                id: u64::MAX,
                label: 0,
            };
            assert_eq!(brand_batch_sample(b, i, &mut s), BRAND_OK, "{}", last_error());
            // SAFETY: the sample's bytes are valid while its batch lives.
            let data = unsafe { std::slice::from_raw_parts(s.data, s.len) }.to_vec();
            got.push((s.id, data));
        }
        brand_batch_free(&mut b);
    }
    got
}

fn save(l: *const brand_loader) -> Vec<u8> {
    let mut size = 0usize;
    assert_eq!(brand_state_size(l, &mut size), BRAND_OK, "{}", last_error());
    let mut buf = vec![0u8; size];
    let mut written = 0usize;
    let st = brand_state_save(l, buf.as_mut_ptr(), buf.len(), &mut written);
    assert_eq!(st, BRAND_OK, "{}", last_error());
    buf.truncate(written);
    buf
}

fn close(mut l: *mut brand_loader) {
    assert_eq!(brand_close(&mut l), BRAND_OK, "{}", last_error());
}

fn start_cache(path: &Path, socket: &Path) -> CacheHandle {
    let ds = Arc::new(Dataset::open(path).expect("open"));
    let cfg = CacheConfig {
        memory: Memory::Percent(30.0),
        io: IoConfig {
            read_gap: ReadGapSetting::Whole,
            ..IoConfig::default()
        },
        readahead: 1 << 20,
    };
    CacheHandle::start(ds, &cfg, socket).expect("cache")
}

#[test]
fn an_attached_jobs_state_mid_epoch_resumes_attached_or_alone_exactly_once() {
    let t = tempfile::tempdir().expect("tmp");
    let dir = small_dataset(t.path(), SAMPLES).expect("pack");
    let path = CString::new(dir.to_str().expect("utf-8")).expect("no NUL");
    let socket = t.path().join("c.sock");
    let cache = start_cache(&dir, &socket);
    let attached = CString::new(format!(
        "cache = {:?}\nbatch_size = 16\nseed = 3",
        socket.display().to_string()
    ))
    .expect("no NUL");
    let alone = CString::new("batch_size = 16\nseed = 3\nread_gap = \"whole\"").expect("no NUL");

    // What every sample's bytes are: one epoch of a loader alone.
    let mut l = null_mut();
    assert_eq!(
        brand_open(path.as_ptr(), alone.as_ptr(), &mut l),
        BRAND_OK,
        "{}",
        last_error()
    );
    let truth: HashMap<u64, Vec<u8>> = take(l, usize::MAX).into_iter().collect();
    assert_eq!(truth.len() as u64, SAMPLES);
    close(l);

    let mut l = null_mut();
    assert_eq!(
        brand_open(path.as_ptr(), attached.as_ptr(), &mut l),
        BRAND_OK,
        "{}",
        last_error()
    );
    let mut size = 0usize;
    assert_eq!(brand_state_size(l, &mut size), BRAND_OK);
    assert_eq!(size, 88 + 8 * SAMPLES.div_ceil(64) as usize, "room for the bitmap");
    assert_eq!(save(l).len(), 88, "at the epoch's start a count is the state");
    let before = take(l, 5);
    assert_eq!(before.len(), 80);
    // A buffer for a count only is too small now: the size needed is said.
    let (mut small, mut written) = ([0u8; 88], 0usize);
    assert_eq!(
        brand_state_save(l, small.as_mut_ptr(), small.len(), &mut written),
        BRAND_ERR_BUFFER_TOO_SMALL
    );
    assert_eq!(written, size);
    let blob = save(l);
    assert_eq!(blob.len(), size);
    // A caller handing a batch out sample by sample saves inside it: the
    // sixth batch's first 5 samples served, the rest not.
    let sixth = take(l, 1);
    assert_eq!(sixth.len(), 16);
    let mut inside = vec![0u8; size];
    let mut written = 0usize;
    let st = brand_state_save_at(l, 0, 85, inside.as_mut_ptr(), inside.len(), &mut written);
    assert_eq!(st, BRAND_OK, "{}", last_error());
    inside.truncate(written);
    let st = brand_state_save_at(l, 0, 40, inside.as_mut_ptr(), size, &mut written);
    assert_eq!(st, BRAND_ERR_INVALID_STATE, "not inside the last batch");
    assert!(last_error().contains("40 samples of epoch 0"), "{}", last_error());
    close(l);

    for (how, cfg) in [("attached", &attached), ("alone", &alone)] {
        let (st, l) = open_at(&path, cfg, &blob);
        assert_eq!(st, BRAND_OK, "{how}: {}", last_error());
        let (mut epoch, mut served) = (u64::MAX, u64::MAX);
        assert_eq!(brand_tell(l, &mut epoch, &mut served), BRAND_OK);
        assert_eq!((epoch, served), (0, 80), "{how}");
        let rest = take(l, usize::MAX);
        close(l);
        let mut ids: Vec<u64> = before.iter().chain(&rest).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..SAMPLES).collect::<Vec<_>>(), "{how}: the epoch exactly once");
        for (id, data) in before.iter().chain(&rest) {
            assert!(truth[id] == *data, "{how}: sample {id}'s bytes");
        }
    }

    let handed: Vec<(u64, Vec<u8>)> = before.iter().chain(&sixth[..5]).cloned().collect();
    for (how, cfg) in [("attached", &attached), ("alone", &alone)] {
        let (st, l) = open_at(&path, cfg, &inside);
        assert_eq!(st, BRAND_OK, "{how}: {}", last_error());
        let rest = take(l, usize::MAX);
        close(l);
        let mut ids: Vec<u64> = handed.iter().chain(&rest).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..SAMPLES).collect::<Vec<_>>(),
            "{how}: inside a batch, exactly once"
        );
    }

    // Elastic resume continues a world's plan, not an attached job's bitmap.
    let (states, lens) = ([blob.as_ptr()], [blob.len()]);
    let mut l = null_mut();
    let st = brand_open_at_elastic(path.as_ptr(), alone.as_ptr(), states.as_ptr(), lens.as_ptr(), 1, &mut l);
    assert_eq!(st, BRAND_ERR_INVALID_STATE);
    assert!(l.is_null());
    assert!(last_error().contains("attached to a cache"), "{}", last_error());

    // A damaged bitmap is named, not resumed from.
    let mut damaged = blob.clone();
    damaged[100] ^= 1;
    let (st, l) = open_at(&path, &attached, &damaged);
    assert_eq!(st, BRAND_ERR_INVALID_STATE);
    assert!(l.is_null());
    assert!(last_error().contains("damaged"), "{}", last_error());
    cache.stop("done");
}
