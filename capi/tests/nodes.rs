//! The C ABI as a node of a multi-node job (`nodes` in the config), and
//! elastic resume (`brand_open_at_elastic`): every rank's state of one
//! world continues on another number of ranks, or is refused naming what
//! differs. Loopback only; every wait is bounded by `peer_timeout`.

use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::Arc;

use brand::brand_status::*;
use brand::*;
use brand_format::Dataset;

mod common;
use common::{addresses, last_error};

const SAMPLES: u64 = 200;

fn dataset(root: &Path) -> (CString, Arc<Dataset>) {
    let dir = brand_import::synthetic::small_dataset(root, SAMPLES).expect("gen and pack");
    let ds = Arc::new(Dataset::open(&dir).expect("open"));
    (CString::new(dir.to_str().expect("utf-8")).expect("no NUL"), ds)
}

fn open(path: &CStr, cfg: &str) -> *mut brand_loader {
    let cfg = CString::new(cfg).expect("no NUL");
    let mut l = null_mut();
    assert_eq!(
        brand_open(path.as_ptr(), cfg.as_ptr(), &mut l),
        BRAND_OK,
        "{}",
        last_error()
    );
    l
}

fn open_elastic(path: &CStr, cfg: &str, blobs: &[Vec<u8>]) -> (brand_status, *mut brand_loader) {
    let cfg = CString::new(cfg).expect("no NUL");
    let ptrs: Vec<*const u8> = blobs.iter().map(|b| b.as_ptr()).collect();
    let lens: Vec<usize> = blobs.iter().map(Vec::len).collect();
    let mut l = std::ptr::without_provenance_mut(usize::MAX); // must be overwritten
    let st = brand_open_at_elastic(
        path.as_ptr(),
        cfg.as_ptr(),
        ptrs.as_ptr(),
        lens.as_ptr(),
        blobs.len(),
        &mut l,
    );
    (st, l)
}

fn close(mut l: *mut brand_loader) {
    assert_eq!(brand_close(&mut l), BRAND_OK, "{}", last_error());
}

/// `(epoch, id, bytes)` of up to `limit` batches, and whether the epoch ended.
fn take(l: *mut brand_loader, limit: usize) -> (Vec<(u64, u64, Vec<u8>)>, bool) {
    let mut got = Vec::new();
    for _ in 0..limit {
        let mut b = null_mut();
        match brand_next(l, &mut b) {
            BRAND_OK => {}
            BRAND_END_OF_EPOCH => return (got, true),
            other => panic!("brand_next: {other:?}: {}", last_error()),
        }
        for i in 0..brand_batch_len(b) {
            let mut s = brand_sample {
                data: std::ptr::null(),
                len: 0,
                key: std::ptr::null(),
                key_len: 0,
                id: 0,
                label: 0,
            };
            assert_eq!(brand_batch_sample(b, i, &mut s), BRAND_OK);
            // SAFETY: valid while the batch lives.
            let data = unsafe { std::slice::from_raw_parts(s.data, s.len) }.to_vec();
            got.push((brand_batch_epoch(b), s.id, data));
        }
        brand_batch_free(&mut b);
    }
    (got, false)
}

fn save(l: *const brand_loader) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let mut written = 0;
    assert_eq!(
        brand_state_save(l, buf.as_mut_ptr(), buf.len(), &mut written),
        BRAND_OK,
        "{}",
        last_error()
    );
    buf.truncate(written);
    buf
}

fn tell(l: *const brand_loader) -> (u64, u64) {
    let (mut e, mut s) = (0, 0);
    assert_eq!(brand_tell(l, &mut e, &mut s), BRAND_OK);
    (e, s)
}

fn metrics(l: *const brand_loader) -> brand_metrics {
    let mut m = brand_metrics {
        struct_size: size_of::<brand_metrics>() as u32,
        ..Default::default()
    };
    assert_eq!(brand_get_metrics(l, &mut m), BRAND_OK, "{}", last_error());
    m
}

#[test]
fn brand_open_with_nodes_runs_a_node_and_two_serve_the_epoch_once() {
    let t = tempfile::tempdir().expect("tempdir");
    let (path, ds) = dataset(t.path());
    let nodes: Vec<String> = addresses(2).iter().map(|a| format!("\"{a}\"")).collect();
    let nodes = nodes.join(", ");
    let threads: Vec<_> = (0..2u32)
        .map(|rank| {
            let path = path.clone();
            let cfg = format!(
                "nodes = [{nodes}]\nrank = {rank}\nmemory = \"32 slots\"\nbatch_size = 16\nread_gap = \"whole\"\nremote_memory = \"1MiB\"\npeer_timeout = \"20s\"\nseed = 3\n"
            );
            std::thread::spawn(move || {
                let l = open(&path, &cfg);
                // Not connected yet: a node says where it will start.
                assert_eq!(metrics(l).nodes, 2);
                assert_eq!(brand_start_epoch(l, 1), BRAND_OK, "{}", last_error());
                assert_eq!(tell(l), (1, 0));
                let (got, ended) = take(l, usize::MAX);
                assert!(ended);
                assert_eq!(tell(l), (2, 0), "after the end: the next epoch, as a Loader says");
                let m = metrics(l);
                let mut len = 0;
                assert_eq!(brand_epoch_len(l, &mut len), BRAND_OK);
                assert_eq!(brand_start_epoch(l, 0), BRAND_ERR_CONFIG, "a running node cannot jump");
                assert!(last_error().contains("cannot jump to epoch 0"), "{}", last_error());
                let blob = save(l);
                close(l);
                (got, m, len, blob)
            })
        })
        .collect();
    let mut all = Vec::new();
    for (rank, h) in threads.into_iter().enumerate() {
        let (got, m, len, blob) = h.join().expect("node thread");
        assert_eq!((m.nodes, m.node_rank), (2, rank as u32));
        assert_eq!(m.samples_served, len);
        assert_eq!(got.len() as u64, len);
        // Every sample served was this node's own or pushed to it. (What it
        // pushed itself is counted as the owner gets to it: it may still be 0.)
        assert_eq!(m.samples_local + m.samples_received, m.samples_served, "{m:?}");
        assert!(m.samples_local > 0 && m.samples_received > 0, "{m:?}");
        assert_eq!(m.remote_memory_limit, 1 << 20);
        assert!(m.remote_memory_peak > 0 && m.remote_memory_peak <= m.remote_memory_limit);
        assert!(m.bytes_read > 0);
        assert_eq!(blob.len(), 88, "the same v1 state blob");
        for (epoch, id, data) in got {
            assert_eq!(epoch, 1);
            assert_eq!(data, ds.read_sample(id).expect("source"), "sample {id}");
            all.push(id);
        }
    }
    all.sort_unstable();
    assert_eq!(
        all,
        (0..SAMPLES).collect::<Vec<_>>(),
        "epoch 1 exactly once across the nodes"
    );
}

/// A node reports what it really chose and measured: the read gap its
/// storage took (`auto` probes the device and chooses a byte gap, where a
/// node used to report "whole chunks") and the percentiles of its waits.
#[test]
fn a_node_reports_its_chosen_read_gap_and_stall_percentiles() {
    let t = tempfile::tempdir().expect("tempdir");
    let (path, _) = dataset(t.path());
    let nodes: Vec<String> = addresses(2).iter().map(|a| format!("\"{a}\"")).collect();
    let nodes = nodes.join(", ");
    let threads: Vec<_> = (0..2u32)
        .map(|rank| {
            let path = path.clone();
            let cfg = format!(
                "nodes = [{nodes}]\nrank = {rank}\nmemory = \"32 slots\"\nbatch_size = 16\nread_gap = \"auto\"\nremote_memory = \"1MiB\"\npeer_timeout = \"20s\"\nseed = 3\n"
            );
            std::thread::spawn(move || {
                let l = open(&path, &cfg);
                let (_, ended) = take(l, usize::MAX);
                assert!(ended);
                let m = metrics(l);
                close(l);
                m
            })
        })
        .collect();
    for h in threads {
        let m = h.join().expect("node thread");
        assert_ne!(m.read_gap, BRAND_READ_GAP_WHOLE, "auto chose a byte gap: {m:?}");
        // Waits depend on timing; where there were any, their percentiles
        // are filled (a node's metrics are the loader's struct, filled by
        // the same stall log).
        if m.stalls > 0 {
            assert!(
                m.stall_p50_secs > 0.0 && m.stall_p50_secs <= m.stall_p99_secs && m.stall_p99_secs <= m.stall_max_secs,
                "{m:?}"
            );
        }
    }
}

#[test]
fn single_node_stays_the_default_and_listens_nowhere() {
    let t = tempfile::tempdir().expect("tempdir");
    let (path, _) = dataset(t.path());
    // One node listed is a single process too.
    for cfg in [
        "memory = \"32 slots\"\n",
        "nodes = [\"127.0.0.1:1\"]\nmemory = \"32 slots\"\n",
    ] {
        let l = open(&path, cfg);
        let (got, ended) = take(l, usize::MAX);
        assert!(ended && got.len() as u64 == SAMPLES);
        assert_eq!(metrics(l).nodes, 0);
        close(l);
    }
}

/// The global sequence of epoch 0 with 48 slots in total.
fn global_order(path: &CStr) -> Vec<u64> {
    let l = open(
        path,
        "memory = \"48 slots\"\nbatch_size = 16\nread_gap = \"0\"\nseed = 4\n",
    );
    let (got, _) = take(l, usize::MAX);
    close(l);
    got.iter().map(|g| g.1).collect()
}

/// Every rank's state of a world of 3 (16 slots each) after 2 batches of 8.
fn three_rank_states(path: &CStr) -> (Vec<u64>, Vec<Vec<u8>>) {
    let mut served = Vec::new();
    let mut blobs = Vec::new();
    for rank in 0..3 {
        let l = open(
            path,
            &format!("memory = \"16 slots\"\nworld = 3\nrank = {rank}\nbatch_size = 8\nread_gap = \"0\"\nseed = 4\n"),
        );
        let (got, _) = take(l, 2);
        served.extend(got.iter().map(|g| g.1));
        blobs.push(save(l));
        close(l);
    }
    (served, blobs)
}

fn two_rank_cfg(rank: u32, slots: u64) -> String {
    format!("memory = \"{slots} slots\"\nworld = 2\nrank = {rank}\nbatch_size = 16\nread_gap = \"0\"\nseed = 4\n")
}

#[test]
fn every_ranks_state_of_three_continues_on_two_in_the_global_order() {
    let t = tempfile::tempdir().expect("tempdir");
    let (path, _) = dataset(t.path());
    let global = global_order(&path);
    let (mut served, mut blobs) = three_rank_states(&path);
    blobs.reverse(); // any order
    let position = 48u64; // 3 ranks × 16 samples
    for rank in 0..2u32 {
        let (st, l) = open_elastic(&path, &two_rank_cfg(rank, 24), &blobs);
        assert_eq!(st, BRAND_OK, "{}", last_error());
        assert_eq!(tell(l), (0, position / 2));
        let (got, ended) = take(l, usize::MAX);
        assert!(ended);
        for (i, g) in got.iter().enumerate() {
            let p = rank as u64 + 2 * (24 + i as u64);
            if p < SAMPLES {
                assert_eq!(g.1, global[p as usize], "rank {rank}: global position {p}");
                served.push(g.1);
            }
        }
        close(l);
    }
    served.sort_unstable();
    assert_eq!(
        served,
        (0..SAMPLES).collect::<Vec<_>>(),
        "exactly once across both worlds"
    );
}

#[test]
fn a_mismatched_elastic_restore_is_refused_naming_what_differs() {
    let t = tempfile::tempdir().expect("tempdir");
    let (path, _) = dataset(t.path());
    let (_, blobs) = three_rank_states(&path);
    let refused = |cfg: &str, blobs: &[Vec<u8>], status: brand_status, words: &[&str]| {
        let (st, l) = open_elastic(&path, cfg, blobs);
        let e = last_error();
        assert_eq!(st, status, "{e}");
        assert!(l.is_null(), "out is NULL on failure");
        for w in words {
            assert!(e.contains(w), "{w:?} not in: {e}");
        }
    };
    let mismatch = BRAND_ERR_STATE_MISMATCH;
    refused(
        &two_rank_cfg(0, 16),
        &blobs,
        mismatch,
        &[
            "total memory 3 × 16 = 48 slots saved, 2 × 16 = 32 slots now",
            "\"24 slots\"",
        ],
    );
    refused(
        &two_rank_cfg(0, 24).replace("seed = 4", "seed = 5"),
        &blobs,
        mismatch,
        &["seed 4 in the state, 5 now"],
    );
    refused(
        &two_rank_cfg(0, 24),
        &blobs[..2],
        mismatch,
        &["2 states given, of a world of 3"],
    );
    let twice = vec![blobs[0].clone(), blobs[1].clone(), blobs[1].clone()];
    refused(&two_rank_cfg(0, 24), &twice, mismatch, &["rank 1 appears twice"]);
    let mut garbage = blobs.clone();
    garbage[1][20] ^= 1;
    refused(
        &two_rank_cfg(0, 24),
        &garbage,
        BRAND_ERR_INVALID_STATE,
        &["state 1", "damaged"],
    );
    refused(&two_rank_cfg(0, 24), &[], BRAND_ERR_INVALID_ARGUMENT, &["count is 0"]);
    // One rank's state alone on another world: refused, pointing here.
    let cfg = CString::new(two_rank_cfg(0, 24)).expect("no NUL");
    let mut l = null_mut();
    let st = brand_open_at(path.as_ptr(), cfg.as_ptr(), blobs[0].as_ptr(), blobs[0].len(), &mut l);
    assert_eq!(st, mismatch);
    let e = last_error();
    assert!(
        e.contains("world 3 in the state, 2 now") && e.contains("brand_open_at_elastic"),
        "{e}"
    );
}
