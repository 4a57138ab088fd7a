//! The Loader through the real engine, driven by a simple event source
//! (each chunk read, then its samples served in a fixed shuffled order):
//! bytes equal the source, every sample exactly once per epoch, identical
//! whatever the read gap, queue depth or readahead; resume mid-epoch loses
//! and repeats nothing; a corrupt record stops the loader with a named error.

mod common;

use std::path::Path;
use std::sync::Arc;

use brand_format::Dataset;
use brand_loader::{EventSource, IoConfig, Loader, LoaderConfig, LoaderState, ReadGapSetting};
use brand_plan::{Event, Memory, PlanConfig, Planner, Policy};

fn make_dataset(root: &Path, samples: u64) -> Arc<Dataset> {
    Arc::new(common::small_dataset(root, samples))
}

/// Chunks in an epoch-dependent order; each chunk is read with a full mask
/// and its samples served in reverse slot order.
fn chunkwise(ds: &Arc<Dataset>) -> EventSource {
    let chunks = ds.index.chunk_count();
    let k = ds.index.chunk_size() as u64;
    let n = ds.index.samples();
    // A stride coprime with the chunk count visits every chunk once.
    let stride = (2..)
        .find(|s| gcd(*s, chunks) == 1 && *s > 3)
        .expect("a coprime stride");
    Box::new(move |epoch, skip, _warm| {
        let mut events = Vec::new();
        let mut position = 0;
        for i in 0..chunks {
            let c = (i * stride + epoch * 3) % chunks;
            events.push(Event::Read {
                chunk: c,
                mask: u64::MAX,
            });
            let lo = c * k;
            let hi = ((c + 1) * k).min(n);
            for sample in (lo..hi).rev() {
                events.push(Event::Serve {
                    position,
                    sample,
                    slot: (sample % k) as u32,
                    padding: false,
                    frees: true,
                });
                position += 1;
            }
        }
        // Skip already-served samples; their reads stay (the loader skips
        // what it no longer needs only through its own accounting).
        let mut served = 0;
        let events: Vec<Event> = events
            .into_iter()
            .filter(|e| match e {
                Event::Serve { .. } => {
                    served += 1;
                    served > skip
                }
                Event::Read { .. } => true,
            })
            .collect();
        Ok(Box::new(events.into_iter()))
    })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn collect_epoch(loader: &mut Loader, ds: &Dataset) -> Vec<u64> {
    let mut ids = Vec::new();
    while let Some(batch) = loader.next_batch().expect("batch") {
        for s in batch.iter() {
            assert_eq!(s.data, &ds.read_sample(s.id).expect("buffered")[..], "sample {}", s.id);
            assert_eq!(s.data.as_ptr() as usize % 64, 0, "64-byte aligned");
            assert_eq!(s.label, ds.index.label(s.id));
            assert_eq!(s.key, ds.index.key(s.id));
            ids.push(s.id);
        }
    }
    ids
}

fn cfg(gap: ReadGapSetting, qd: usize, readahead: u64) -> LoaderConfig {
    LoaderConfig {
        batch_size: 10,
        readahead_bytes: readahead,
        io: IoConfig {
            queue_depth: qd,
            read_gap: gap,
            verify: true,
            direct: true,
            ..IoConfig::default()
        },
        ..LoaderConfig::default()
    }
}

#[test]
fn every_sample_once_and_the_same_order_whatever_the_io_settings() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 250);
    let mut orders = Vec::new();
    for (gap, qd, ra) in [
        (ReadGapSetting::Whole, 1, 0),
        (ReadGapSetting::Bytes(0), 64, 1 << 20),
        (ReadGapSetting::Auto, 8, 64 << 20),
    ] {
        let mut l = Loader::new(ds.clone(), cfg(gap, qd, ra), chunkwise(&ds), LoaderState::default()).expect("loader");
        let e0 = collect_epoch(&mut l, &ds);
        let e1 = collect_epoch(&mut l, &ds);
        let mut sorted = e0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..250).collect::<Vec<u64>>(), "exactly once");
        assert_ne!(e0, e1, "epochs differ");
        let m = l.metrics();
        assert_eq!(m.samples_served, 500);
        assert_eq!(m.recovery_reads, 0);
        assert!(m.bytes_read >= m.bytes_served);
        orders.push((e0, e1));
    }
    assert!(
        orders.windows(2).all(|w| w[0] == w[1]),
        "served order must not depend on I/O settings"
    );
}

#[test]
fn resume_mid_epoch_loses_and_repeats_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 200);
    let c = cfg(ReadGapSetting::Bytes(0), 8, 1 << 20);
    let mut full = Loader::new(ds.clone(), c.clone(), chunkwise(&ds), LoaderState::default()).expect("loader");
    let whole = collect_epoch(&mut full, &ds);

    let mut first = Loader::new(ds.clone(), c.clone(), chunkwise(&ds), LoaderState::default()).expect("loader");
    let mut got = Vec::new();
    for _ in 0..7 {
        let b = first.next_batch().expect("batch").expect("not the end");
        got.extend(b.iter().map(|s| s.id));
    }
    let state = first.state();
    assert_eq!(state, LoaderState { epoch: 0, served: 70 });
    let json = serde_json::to_string(&state).expect("serialise");
    drop(first);
    let state: LoaderState = serde_json::from_str(&json).expect("deserialise");
    let mut second = Loader::new(ds.clone(), c, chunkwise(&ds), state).expect("resume");
    got.extend(collect_epoch(&mut second, &ds));
    assert_eq!(got, whole);
    // The resumed loader had to re-read the chunk it was in the middle of.
    assert!(second.metrics().recovery_reads > 0 || second.metrics().refills > 0);
}

#[test]
fn a_corrupt_record_stops_the_loader_with_a_named_error() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 100);
    let (_, offset, _) = ds.index.record_location(40);
    let seg = ds.segment_path(0);
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[offset as usize] ^= 1;
    std::fs::write(&seg, bytes).expect("write");
    let mut l = Loader::new(
        ds.clone(),
        cfg(ReadGapSetting::Whole, 4, 1 << 20),
        chunkwise(&ds),
        LoaderState::default(),
    )
    .expect("loader");
    let mut served = Vec::new();
    let err = loop {
        match l.next_batch() {
            Ok(Some(b)) => served.extend(b.iter().map(|s| s.id)),
            Ok(None) => panic!("the corrupt sample was served or skipped"),
            Err(e) => break e,
        }
    };
    let msg = err.to_string();
    assert!(
        msg.contains("sample 40") && msg.contains("crc32c") && msg.contains("chunk 2"),
        "{msg}"
    );
    assert!(!served.contains(&40));
    let state = l.state();
    // Again, the same error, and the state does not move.
    assert!(l.next_batch().is_err());
    assert_eq!(l.state(), state);
    assert_eq!(
        state.served as usize,
        served.len() - served.len() % 10 + served.len() % 10
    );
}

fn with_direct(mut c: LoaderConfig, direct: bool) -> LoaderConfig {
    c.io.direct = direct;
    c
}

fn plan_cfg(policy: Policy, memory: Memory, rank: u32, world: u32) -> PlanConfig {
    PlanConfig {
        memory,
        policy,
        seed: 11,
        rank,
        world,
        drop_last: false,
        run_length: 1,
        pinned_share: 0,
    }
}

#[test]
fn every_policy_serves_every_sample_once_through_the_engine() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 300);
    for policy in Policy::ALL {
        let cfg = LoaderConfig {
            plan: plan_cfg(policy, Memory::Percent(20.0), 0, 1),
            ..cfg(ReadGapSetting::Bytes(0), 16, 1 << 20)
        };
        let mut l = Loader::open(ds.clone(), &cfg, LoaderState::default()).expect("loader");
        let mut ids = collect_epoch(&mut l, &ds);
        ids.sort_unstable();
        assert_eq!(ids, (0..300).collect::<Vec<u64>>(), "{policy}");
        let m = l.metrics();
        assert_eq!(m.recovery_reads, 0, "{policy}: the plan read everything it served");
        assert!(
            m.read_amplification() < 1.6,
            "{policy}: sparse reads, amplification {}",
            m.read_amplification()
        );
    }
}

#[test]
fn runs_serve_every_sample_once_in_fewer_requests() {
    // Samples small enough to merge at gap 0 (the engine reads a record of
    // 64 KiB or more alone below a one-page gap).
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 300);
    let mut requests = Vec::new();
    for run_length in [1, 4] {
        let mut c = LoaderConfig {
            plan: plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1),
            ..cfg(ReadGapSetting::Bytes(0), 16, 1 << 20)
        };
        c.set("run_length", &toml::Value::Integer(run_length))
            .expect("run_length");
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        let mut ids = collect_epoch(&mut l, &ds);
        ids.sort_unstable();
        assert_eq!(ids, (0..300).collect::<Vec<u64>>(), "run length {run_length}");
        requests.push(l.metrics().reads_issued);
    }
    assert!(requests[1] * 2 < requests[0], "requests {requests:?}");
}

#[test]
fn brand_order_is_the_plans_whatever_the_read_gap_and_queue_depth() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 400);
    let plan = plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1);
    let mut expected = Vec::new();
    let mut planner = Planner::new(&ds.index, &plan).expect("planner");
    for e in planner.epoch(0) {
        if let Event::Serve { sample, .. } = e {
            expected.push(sample);
        }
    }
    let mut amps = Vec::new();
    // The last run reads through the page cache (direct = false).
    for (gap, qd, direct) in [
        (ReadGapSetting::Whole, 1, true),
        (ReadGapSetting::Bytes(0), 64, true),
        (ReadGapSetting::Auto, 8, true),
        (ReadGapSetting::Bytes(0), 8, false),
    ] {
        let c = LoaderConfig {
            plan: plan.clone(),
            ..with_direct(cfg(gap, qd, 4 << 20), direct)
        };
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        assert_eq!(collect_epoch(&mut l, &ds), expected, "{gap:?} qd {qd} direct {direct}");
        amps.push(l.metrics().read_amplification());
    }
    assert!(
        amps[0] > 3.0 * amps[1],
        "whole chunks read far more than sparse reads: {amps:?}"
    );
}

/// A last epoch set: no read of the next epoch is issued before it is asked
/// for, and asked for, it is served as ever (the same order, every sample).
#[test]
fn no_read_ahead_past_the_last_epoch_and_the_next_still_served_when_asked() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 400);
    let c = LoaderConfig {
        plan: plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1),
        ..cfg(ReadGapSetting::Whole, 8, 64 << 20)
    };
    let run = |readahead: u64, last: Option<u64>| {
        let c = LoaderConfig {
            readahead_bytes: readahead,
            ..c.clone()
        };
        let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
        l.set_last_epoch(last);
        let e0 = collect_epoch(&mut l, &ds);
        let issued_in_e0 = l.metrics().reads_issued;
        let e1 = collect_epoch(&mut l, &ds);
        (issued_in_e0, e0, e1)
    };
    // Epoch 0's own reads: with no read-ahead, each is issued when reached.
    let (own, e0, e1) = run(0, None);
    let (ahead, a0, a1) = run(64 << 20, None);
    let (bounded, b0, b1) = run(64 << 20, Some(0));
    assert!(
        ahead > own,
        "read-ahead crosses into epoch 1: {ahead} reads, {own} of epoch 0"
    );
    assert_eq!(bounded, own, "no read of epoch 1 before it is asked for");
    assert_eq!((&a0, &a1), (&e0, &e1));
    assert_eq!((b0, b1), (e0, e1));
}

#[test]
fn resume_through_the_real_plan_at_any_batch() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 230);
    for world in [1u32, 3] {
        for rank in 0..world {
            let c = LoaderConfig {
                plan: plan_cfg(Policy::Brand, Memory::Percent(15.0), rank, world),
                ..cfg(ReadGapSetting::Whole, 8, 1 << 20)
            };
            let mut full = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
            let whole = collect_epoch(&mut full, &ds);
            for stop in [1usize, 3, 6] {
                let mut first = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
                let mut got = Vec::new();
                for _ in 0..stop {
                    if let Some(b) = first.next_batch().expect("batch") {
                        got.extend(b.iter().map(|s| s.id));
                    }
                }
                let state = first.state();
                drop(first);
                let mut second = Loader::open(ds.clone(), &c, state).expect("resume");
                got.extend(collect_epoch(&mut second, &ds));
                assert_eq!(got, whole, "world {world} rank {rank} stop {stop}");
            }
        }
    }
}

#[test]
fn a_dataset_that_fits_is_read_once_then_served_from_memory() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 150);
    let c = LoaderConfig {
        plan: plan_cfg(Policy::Brand, Memory::Percent(100.0), 0, 1),
        ..cfg(ReadGapSetting::Whole, 8, 1 << 20)
    };
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let mut e0 = collect_epoch(&mut l, &ds);
    let read0 = l.metrics().bytes_read;
    let mut e1 = collect_epoch(&mut l, &ds);
    assert!(read0 > 0);
    assert_eq!(l.metrics().bytes_read, read0, "epoch 1 must read nothing");
    e0.sort_unstable();
    e1.sort_unstable();
    assert_eq!(e0, e1);
}

#[test]
fn resident_samples_never_exceed_the_budget_without_readahead() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 500);
    let plan = plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1);
    let slots = Planner::new(&ds.index, &plan).expect("planner").geometry().rank_slots;
    let c = LoaderConfig {
        plan,
        ..cfg(ReadGapSetting::Bytes(0), 8, 0)
    };
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    collect_epoch(&mut l, &ds);
    let peak = l.metrics().peak_resident_samples;
    assert!(peak > 0 && peak <= slots, "peak resident {peak} > M = {slots}");
}

/// Without read-ahead a read is issued when the consumer reaches it in the
/// plan, not earlier: issued before the serves that make room for it, it
/// could complete first and memory would exceed the plan's bound.
#[test]
fn without_readahead_each_read_is_issued_when_the_plan_reaches_it() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 500);
    let plan = plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1);
    let events: Vec<Event> = Planner::new(&ds.index, &plan).expect("planner").epoch(0).collect();
    // reads_before[k]: the plan's reads before its k-th serve.
    let mut reads_before = Vec::new();
    let mut reads = 0u64;
    for ev in &events {
        match ev {
            Event::Read { .. } => reads += 1,
            Event::Serve { .. } => reads_before.push(reads),
        }
    }
    let c = LoaderConfig {
        plan,
        batch_size: 1,
        ..cfg(ReadGapSetting::Bytes(0), 8, 0)
    };
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    // The last serve is left out: past it, the next epoch's reads may start.
    for (k, &expected) in reads_before.iter().enumerate().take(reads_before.len() - 1) {
        let batch = l.next_batch().expect("batch").expect("not the end");
        assert_eq!(batch.len(), 1);
        assert_eq!(l.metrics().refills, expected, "reads issued by serve {k}");
    }
}

#[test]
fn a_segment_truncated_under_a_running_loader_is_a_named_error() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 200);
    let c = LoaderConfig {
        plan: plan_cfg(Policy::Sequential, Memory::Percent(20.0), 0, 1),
        ..cfg(ReadGapSetting::Whole, 4, 0)
    };
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let first = l.next_batch().expect("first batch").expect("not the end");
    assert_eq!(first.len(), 10);
    let seg = ds.segment_path(0);
    let len = std::fs::metadata(&seg).expect("stat").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open")
        .set_len(len / 2)
        .expect("truncate");
    let err = loop {
        match l.next_batch() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a truncated segment went unnoticed"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(err.contains("data-00000.brd") && err.contains("truncated"), "{err}");
    assert!(l.state().served < 200);
}

#[test]
fn invalid_configurations_fail_when_the_loader_is_built() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = make_dataset(t.path(), 100);
    let bad = [
        LoaderConfig {
            plan: plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1),
            batch_size: 0,
            ..cfg(ReadGapSetting::Whole, 4, 0)
        },
        LoaderConfig {
            plan: plan_cfg(Policy::Brand, Memory::Bytes(10), 0, 1),
            ..cfg(ReadGapSetting::Whole, 4, 0)
        },
        LoaderConfig {
            plan: plan_cfg(Policy::Brand, Memory::Percent(10.0), 2, 2),
            ..cfg(ReadGapSetting::Whole, 4, 0)
        },
        LoaderConfig {
            plan: plan_cfg(Policy::Brand, Memory::Percent(10.0), 0, 1),
            ..cfg(ReadGapSetting::Whole, 0, 0)
        },
    ];
    for (i, c) in bad.iter().enumerate() {
        let e = Loader::open(ds.clone(), c, LoaderState::default())
            .err()
            .unwrap_or_else(|| panic!("config {i} accepted"));
        assert!(e.to_string().starts_with("invalid configuration"), "{i}: {e}");
    }
}
