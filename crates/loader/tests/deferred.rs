//! A start's large plan reads fetched record by record as each record comes
//! due: every policy still serves every sample once per epoch with every
//! byte equal, on one rank and on two, in the order a loader reading whole
//! chunks serves; a resume mid-epoch goes on as an uninterrupted run; small
//! reads, runs and whole chunks are not split.

mod common;

use std::path::Path;
use std::sync::Arc;

use brand_format::Dataset;
use brand_format::extents::{ReadGap, extents};
use brand_import::synthetic::large_dataset;
use brand_loader::{IoConfig, Loader, LoaderConfig, LoaderState, ReadGapSetting};
use brand_plan::{Event, Memory, PlanConfig, Planner, Policy};

const SAMPLES: u64 = 480;

/// Chunks of 32 samples of 96 KiB (3 MiB): a whole chunk, and the half of
/// it a rank of two reads, are above the 1 MiB a read must reach to be split.
fn large_chunks(root: &Path) -> Arc<Dataset> {
    Arc::new(Dataset::open(large_dataset(root, SAMPLES, 32).expect("pack")).expect("open"))
}

fn config(policy: Policy, gap: ReadGapSetting, rank: u32, world: u32) -> LoaderConfig {
    LoaderConfig {
        plan: PlanConfig {
            memory: Memory::Percent(20.0),
            policy,
            seed: 3,
            rank,
            world,
            drop_last: false,
            run_length: 1,
            pinned_share: 0,
        },
        batch_size: 8,
        readahead_bytes: 8 << 20,
        io: IoConfig {
            queue_depth: 8,
            read_gap: gap,
            ..IoConfig::default()
        },
        ..LoaderConfig::default()
    }
}

fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids
}

#[test]
fn every_policy_serves_every_sample_once_in_the_same_order_with_large_reads_split() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = large_chunks(t.path());
    for policy in Policy::ALL {
        for world in [1, 2] {
            // Per rank, two epochs: split (gap 0) and read whole.
            let mut split = Vec::new();
            let mut whole = Vec::new();
            let mut deferred = 0;
            for rank in 0..world {
                for (gap, out) in [
                    (ReadGapSetting::Bytes(0), &mut split),
                    (ReadGapSetting::Whole, &mut whole),
                ] {
                    let c = config(policy, gap, rank, world);
                    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
                    let epochs = [common::epoch(&mut l, &ds), common::epoch(&mut l, &ds)];
                    let m = l.metrics();
                    assert_eq!(m.recovery_reads, 0, "{policy}, rank {rank} of {world}, {gap:?}");
                    if gap == ReadGapSetting::Whole {
                        assert_eq!(m.reads_deferred, 0, "{policy}: whole chunks are asked for whole");
                    } else {
                        deferred += m.reads_deferred;
                    }
                    out.push(epochs);
                }
            }
            assert_eq!(split, whole, "{policy}, world {world}: the served order");
            for e in 0..2 {
                let all: Vec<u64> = split.iter().flat_map(|r| r[e].iter().copied()).collect();
                assert_eq!(
                    sorted(all),
                    (0..SAMPLES).collect::<Vec<_>>(),
                    "{policy}, world {world}, epoch {e}"
                );
            }
            // A Brand refill from an empty group reads a whole chunk; so do
            // the chunk-wise policies. Direct reads one record at a time;
            // tiered reads whole chunks whole by design (few requests).
            if matches!(policy, Policy::Direct | Policy::Tiered) {
                assert_eq!(deferred, 0, "{policy}");
            } else {
                assert!(deferred > 0, "{policy}, world {world}: no read was split");
            }
        }
    }
}

#[test]
fn a_resume_in_the_middle_of_split_reads_goes_on_as_an_uninterrupted_run() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = large_chunks(t.path());
    let c = config(Policy::Brand, ReadGapSetting::Bytes(0), 0, 1);
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let uninterrupted = [common::epoch(&mut l, &ds), common::epoch(&mut l, &ds)].concat();

    let mut first = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    let mut got = Vec::new();
    for _ in 0..9 {
        let b = first.next_batch().expect("batch").expect("not the end");
        got.extend(b.iter().map(|s| s.id));
    }
    assert!(first.metrics().reads_deferred > 0, "reads were split before the stop");
    let checkpoint = first.checkpoint().expect("checkpoint");
    drop(first);
    let mut second = Loader::open(ds.clone(), &c, checkpoint).expect("resume");
    got.extend(common::epoch(&mut second, &ds));
    got.extend(common::epoch(&mut second, &ds));
    assert_eq!(got, uninterrupted);
}

#[test]
fn only_the_epoch_a_loader_starts_at_is_split() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = large_chunks(t.path());
    let c = config(Policy::Brand, ReadGapSetting::Bytes(0), 0, 1);
    let mut l = Loader::open(ds.clone(), &c, LoaderState::default()).expect("loader");
    common::epoch(&mut l, &ds);
    // Of its reads of 1 MiB and more, the first memory's worth.
    let memory = l.memory_bound().expect("a plan's bound");
    let (mut large, mut first_fill, mut bytes) = (0, 0, 0);
    for ev in Planner::new(&ds.index, &c.plan).expect("plan").epoch(0) {
        if let Event::Read { chunk, mask } = ev {
            let b: u64 = extents(&ds.index, chunk, mask, ReadGap::Bytes(0))
                .iter()
                .map(|e| e.len)
                .sum();
            if mask.count_ones() > 1 && b >= 1 << 20 {
                large += 1;
                if bytes < memory {
                    first_fill += 1;
                    bytes += b;
                }
            }
        }
    }
    assert!(
        first_fill < large,
        "{first_fill} of {large}: the test needs large reads past the first fill"
    );
    assert_eq!(l.metrics().reads_deferred, first_fill);
    l.reset_metrics();
    common::epoch(&mut l, &ds);
    let m = l.metrics();
    assert!(m.refills > 0);
    assert_eq!(m.reads_deferred, 0, "the next epoch's reads were made ahead, whole");
    // A jump is a start.
    l.start_epoch(5).expect("start epoch");
    common::epoch(&mut l, &ds);
    assert!(l.metrics().reads_deferred > 0);
}

#[test]
fn small_reads_and_runs_are_not_split() {
    let t = tempfile::tempdir().expect("tempdir");
    // 8 KiB samples in chunks of 16: 128 KiB reads.
    let small = Arc::new(common::small_dataset(&t.path().join("small"), 320));
    let c = config(Policy::Brand, ReadGapSetting::Bytes(0), 0, 1);
    let mut l = Loader::open(small.clone(), &c, LoaderState::default()).expect("loader");
    assert_eq!(sorted(common::epoch(&mut l, &small)), (0..320).collect::<Vec<_>>());
    let m = l.metrics();
    assert!(m.refills > 0);
    assert_eq!(m.reads_deferred, 0, "128 KiB reads");
    // Runs of 16 records of 96 KiB: 1.5 MiB each, read in one request.
    let large = large_chunks(&t.path().join("large"));
    let mut c = config(Policy::Brand, ReadGapSetting::Bytes(0), 0, 1);
    c.set("run_length", &toml::Value::Integer(16)).expect("run_length");
    let mut l = Loader::open(large.clone(), &c, LoaderState::default()).expect("loader");
    assert_eq!(sorted(common::epoch(&mut l, &large)), (0..SAMPLES).collect::<Vec<_>>());
    assert_eq!(l.metrics().reads_deferred, 0, "runs");
}
