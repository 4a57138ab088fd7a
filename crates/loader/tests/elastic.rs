//! Elastic resume: the states of 3 ranks at one global step restore on 2
//! ranks, which serve exactly the rest of the uninterrupted global sequence.

mod common;

use std::sync::Arc;

use brand_loader::elastic::SavedWorld;
use brand_loader::{IoConfig, Loader, LoaderConfig, LoaderState, ReadGapSetting};
use brand_plan::{Memory, PlanConfig, Policy};

const SAMPLES: u64 = 203;
/// Total memory: 3 ranks × 16 slots = 2 × 24 = 1 × 48.
const TOTAL_SLOTS: u64 = 48;

fn config(rank: u32, world: u32, slots: u64) -> LoaderConfig {
    LoaderConfig {
        plan: PlanConfig {
            memory: Memory::Slots(slots),
            policy: Policy::Brand,
            seed: 11,
            rank,
            world,
            drop_last: false,
            run_length: 1,
            pinned_share: 0,
        },
        batch_size: 4,
        readahead_bytes: 64 << 10,
        io: IoConfig {
            queue_depth: 8,
            read_gap: ReadGapSetting::Bytes(0),
            ..IoConfig::default()
        },
        ..LoaderConfig::default()
    }
}

#[test]
fn three_ranks_resume_on_two_continuing_the_global_order() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(t.path(), SAMPLES));
    // The uninterrupted global sequence: one rank with all the memory.
    let mut whole = Loader::open(ds.clone(), &config(0, 1, TOTAL_SLOTS), LoaderState::default()).expect("open");
    let global = common::epoch(&mut whole, &ds);
    assert_eq!(global.len() as u64, SAMPLES);

    // 3 ranks, 3 batches of 4 each: global positions 0..36 served.
    let mut served_before = Vec::new();
    let mut states = Vec::new();
    for r in 0..3 {
        let mut l = Loader::open(ds.clone(), &config(r, 3, TOTAL_SLOTS / 3), LoaderState::default()).expect("open");
        for _ in 0..3 {
            let b = l.next_batch().expect("batch").expect("not the end");
            served_before.extend(b.iter().map(|s| s.id));
        }
        states.push(l.state());
    }
    assert!(states.iter().all(|s| *s == LoaderState { epoch: 0, served: 12 }));
    let position = 36;
    let saved = SavedWorld {
        plan: config(0, 3, TOTAL_SLOTS / 3).plan,
        states,
    };

    // The same total memory on 2 ranks: 24 slots each.
    let mut rest = Vec::new();
    let mut next_epoch = Vec::new();
    for r in 0..2 {
        let mut l = Loader::open(ds.clone(), &config(r, 2, TOTAL_SLOTS / 2), saved.clone()).expect("elastic");
        assert_eq!(l.state(), LoaderState { epoch: 0, served: 18 });
        rest.push(common::epoch(&mut l, &ds));
        next_epoch.push(common::epoch(&mut l, &ds));
    }
    // Interleave by global position: rank r's step i is position r + 2i.
    for p in position..SAMPLES {
        let (r, i) = ((p % 2) as usize, (p / 2 - position / 2) as usize);
        assert_eq!(rest[r][i], global[p as usize] as u64, "global position {p}");
    }
    // Padding: 203 positions on 2 ranks of 102 steps; position 203 repeats position 0.
    assert_eq!(rest[0].len() + rest[1].len(), (204 - position) as usize);
    let mut all: Vec<u64> = served_before;
    all.extend(rest[0].iter().chain(&rest[1]));
    all.pop(); // the padding
    all.sort_unstable();
    assert_eq!(
        all,
        (0..SAMPLES).collect::<Vec<_>>(),
        "the epoch exactly once across both worlds"
    );

    // The next epoch is the new world's own, as if it had run from the start.
    for (r, got) in next_epoch.iter().enumerate() {
        let mut fresh = Loader::open(
            ds.clone(),
            &config(r as u32, 2, TOTAL_SLOTS / 2),
            LoaderState { epoch: 1, served: 0 },
        )
        .expect("open");
        assert_eq!(got, &common::epoch(&mut fresh, &ds), "rank {r} epoch 1");
    }
}

#[test]
fn a_resume_with_other_total_memory_or_other_ranks_is_refused_saying_what_differs() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(common::small_dataset(t.path(), SAMPLES));
    let step = |served| LoaderState { epoch: 0, served };
    let saved = SavedWorld {
        plan: config(0, 3, 16).plan,
        states: vec![step(4), step(4), step(4)],
    };
    let err = |cfg: LoaderConfig, saved: &SavedWorld| match Loader::open(ds.clone(), &cfg, saved.clone()) {
        Ok(_) => panic!("opened"),
        Err(e) => e.to_string(),
    };
    let e = err(config(0, 2, 16), &saved);
    assert!(
        e.contains("total memory 3 × 16 = 48 slots saved, 2 × 16 = 32 slots now")
            && e.contains("memory = \"24 slots\""),
        "{e}"
    );
    let mut other_seed = config(0, 2, 24);
    other_seed.plan.seed = 12;
    let e = err(other_seed, &saved);
    assert!(e.contains("seed 11 saved, 12 now"), "{e}");
    let missing = SavedWorld {
        states: vec![step(4), step(4)],
        ..saved.clone()
    };
    assert!(err(config(0, 2, 24), &missing).contains("2 rank states for a saved world of 3"));
    let skewed = SavedWorld {
        states: vec![step(4), step(6), step(4)],
        ..saved
    };
    assert!(err(config(0, 2, 24), &skewed).contains("not of one global step"));
}
