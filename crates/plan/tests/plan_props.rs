//! Properties of the plan over random layouts and configs: exactly-once
//! serving, reads before serves, bounded memory, determinism, resume,
//! world-size independence, resident mode, and the simulate metrics.

use std::collections::HashSet;
use std::sync::Arc;

use brand_format::index::{ChunkLoc, Index, SampleMeta};
use brand_format::rng::Prng;
use brand_format::{ALIGN, align_up};
use brand_plan::simulate::{SimOptions, simulate, simulate_with};
use brand_plan::{Event, GlobalEpoch, Layout, Memory, PlanConfig, Planner, Policy, Residency, Start};
use proptest::prelude::*;

fn layout(samples: u64, chunk_size: u32) -> Layout {
    Layout {
        samples,
        chunk_size,
        sample_bytes: samples * 1000,
    }
}

fn config(policy: Policy, rank_slots: u64, world: u32, seed: u64, drop_last: bool) -> PlanConfig {
    PlanConfig {
        memory: Memory::Slots(rank_slots),
        policy,
        seed,
        rank: 0,
        world,
        drop_last,
        run_length: 1,
        pinned_share: 0,
    }
}

fn planner(l: Layout, cfg: &PlanConfig) -> Planner {
    Planner::from_layout(l, cfg).expect("valid config")
}

fn events(global: &Arc<GlobalEpoch>, rank: u32, start: Start) -> Vec<Event> {
    global.rank_plan(rank, start).expect("valid rank").collect()
}

/// What a rank's memory holds, as its events are executed in order.
struct RankMemory {
    held: HashSet<u64>,
    residency: Residency,
}

impl RankMemory {
    fn new() -> Self {
        RankMemory {
            held: HashSet::new(),
            residency: Residency::default(),
        }
    }

    /// Executes `events` against this memory, asserting that every read
    /// brings in samples not already held and every serve finds its sample.
    /// Returns the serves `(position, sample, padding)`.
    fn run(&mut self, events: &[Event], k: u32) -> Vec<(u64, u64, bool)> {
        let mut serves = Vec::new();
        for e in events {
            self.residency.observe(e);
            match *e {
                Event::Read { chunk, mask } => {
                    assert_ne!(mask, 0, "empty read of chunk {chunk}");
                    for j in 0..64 {
                        if mask & (1 << j) != 0 {
                            let id = chunk * k as u64 + j;
                            assert!(self.held.insert(id), "sample {id} read while held");
                        }
                    }
                }
                Event::Serve {
                    position,
                    sample,
                    slot,
                    padding,
                    frees,
                } => {
                    assert_eq!(slot as u64, sample % k as u64);
                    let present = if frees {
                        self.held.remove(&sample)
                    } else {
                        self.held.contains(&sample)
                    };
                    assert!(present, "sample {sample} served at {position} without being read");
                    serves.push((position, sample, padding));
                }
            }
            assert_eq!(self.residency.held, self.held.len() as u64);
        }
        serves
    }
}

/// Runs one epoch on every rank from `start` and checks the invariants
/// every policy must keep. Returns each rank's serves.
fn check_epoch(p: &Planner, epoch: u64, memory: &mut [RankMemory], start: Start) -> Vec<Vec<(u64, u64, bool)>> {
    let g = *p.geometry();
    let global = p.global_epoch(epoch);
    let (n, w) = (g.samples, g.world as u64);
    let mut all = Vec::new();
    let mut seen = HashSet::new();
    let mut real = 0u64;
    for rank in 0..g.world {
        let mem = &mut memory[rank as usize];
        let serves = mem.run(&events(&global, rank, start), g.chunk_size);
        assert_eq!(
            serves.len() as u64,
            g.steps,
            "rank {rank}: every rank takes the same steps"
        );
        for (i, &(pos, sample, padding)) in serves.iter().enumerate() {
            assert_eq!(pos, rank as u64 + i as u64 * w, "rank {rank} step {i}");
            assert_eq!(padding, pos >= n);
            if padding {
                assert_eq!(
                    sample,
                    global.served()[(pos % n) as usize] as u64,
                    "padding repeats the epoch's start"
                );
            } else {
                assert_eq!(sample, global.served()[pos as usize] as u64);
                assert!(seen.insert(sample), "sample {sample} served twice");
                real += 1;
            }
        }
        // Memory is bounded by the world's slots, and outside resident mode
        // every read sample is served within the epoch.
        assert!(
            mem.residency.peak <= g.world_slots,
            "rank {rank} peak {} > {}",
            mem.residency.peak,
            g.world_slots
        );
        if !g.holds_all {
            assert_eq!(mem.residency.held, 0, "rank {rank} ends the epoch holding samples");
        }
        all.push(serves);
    }
    if p.config().drop_last {
        assert_eq!(real, w * (n / w));
    } else {
        assert_eq!(real, n, "every sample exactly once");
    }
    if !g.holds_all {
        assert!(
            global.peak_resident() <= g.world_slots,
            "global peak {} > {}",
            global.peak_resident(),
            g.world_slots
        );
    }
    all
}

#[derive(Debug, Clone)]
struct Case {
    samples: u64,
    chunk_size: u32,
    rank_slots: u64,
    world: u32,
    seed: u64,
    drop_last: bool,
    policy: Policy,
    epoch: u64,
    run_length: u32,
    pinned_share: u8,
}

impl Case {
    fn config(&self) -> PlanConfig {
        PlanConfig {
            run_length: self.run_length,
            pinned_share: self.pinned_share,
            ..config(self.policy, self.rank_slots, self.world, self.seed, self.drop_last)
        }
    }
    fn planner(&self) -> Planner {
        planner(layout(self.samples, self.chunk_size), &self.config())
    }
}

/// Layouts from less than a chunk up to a few dozen chunks, budgets from one
/// chunk to a bit more than the dataset (resident mode).
fn case() -> impl Strategy<Value = Case> {
    (
        1u64..1500,
        1u32..=64,
        prop_oneof![Just(0.0), 0.0f64..1.2],
        1u32..=8,
        any::<u64>(),
        any::<bool>(),
        prop::sample::select(Policy::ALL.to_vec()),
        0u64..4,
        // Record by record (the paper), or in runs of neighbours.
        prop_oneof![Just(1u32), 2u32..=64],
        // The tiered policy's pinned share: none, all, or some.
        prop_oneof![Just(0u8), Just(255u8), any::<u8>()],
    )
        .prop_map(
            |(samples, chunk_size, fraction, world, seed, drop_last, policy, epoch, run_length, pinned_share)| {
                let one_chunk = samples.min(chunk_size as u64);
                Case {
                    samples,
                    chunk_size,
                    rank_slots: one_chunk.max((fraction * samples as f64) as u64),
                    // drop_last with more ranks than samples is a config error.
                    world: if drop_last { world.min(samples as u32) } else { world },
                    seed,
                    drop_last,
                    policy,
                    epoch,
                    run_length,
                    pinned_share,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_sample_exactly_once_with_reads_before_serves(c in case()) {
        let p = c.planner();
        let mut memory: Vec<RankMemory> = (0..c.world).map(|_| RankMemory::new()).collect();
        check_epoch(&p, c.epoch, &mut memory, Start::Cold { position: 0 });
        // The same processes go on to the next epoch.
        check_epoch(&p, c.epoch + 1, &mut memory, Start::Continue);
    }

    #[test]
    fn same_config_same_events_and_resume_continues_identically(c in case(), cut in 0.0f64..1.0, rank in 0u32..8) {
        let p = c.planner();
        let rank = rank % c.world;
        let global = p.global_epoch(c.epoch);
        let whole = events(&global, rank, Start::Cold { position: 0 });
        prop_assert_eq!(&whole, &events(&c.planner().global_epoch(c.epoch), rank, Start::Cold { position: 0 }));

        let g = *p.geometry();
        let position = (cut * g.positions.max(g.samples) as f64) as u64;
        let resumed_plan = global.rank_plan(rank, Start::Cold { position }).expect("in range");
        let restore = resumed_plan.restore_reads();
        let resumed: Vec<Event> = resumed_plan.collect();
        let restore_is_reads = resumed[..restore].iter().all(|e| matches!(e, Event::Read { .. }));
        prop_assert!(restore_is_reads, "the restore is reads only");

        // The same serves from `position` on.
        let serves = |ev: &[Event]| -> Vec<Event> {
            ev.iter().filter(|e| matches!(e, Event::Serve { position: q, .. } if *q >= position)).copied().collect()
        };
        prop_assert_eq!(serves(&whole), serves(&resumed));
        // After the restore, the same events as the uninterrupted run, except
        // reads made before `position` (which the restore replaces).
        let last_before = whole.iter().rposition(|e| matches!(e, Event::Serve { position: q, .. } if *q < position));
        let tail = &whole[last_before.map_or(0, |i| i + 1)..];
        let rest = &resumed[restore..];
        // A cold process can execute it: reads before serves.
        let mut mem = RankMemory::new();
        mem.run(&resumed, c.chunk_size);
        if g.holds_all {
            // Resident mode re-reads everything once instead.
            prop_assert_eq!(mem.held.len() as u64, c.samples);
        } else {
            prop_assert!(tail.ends_with(rest), "resumed events are not a suffix of the uninterrupted ones");
            let replaced = &tail[..tail.len() - rest.len()];
            let only_reads = replaced.iter().all(|e| matches!(e, Event::Read { .. }));
            prop_assert!(only_reads, "only reads made before the resume point are replaced");
            prop_assert_eq!(mem.residency.held, 0);
        }
    }

    #[test]
    fn a_world_of_one_streams_the_events_of_its_whole_epoch(c in case(), seeking in any::<bool>()) {
        // Brand plans of one rank are run as they are taken; they must be
        // the events cut from the whole epoch, for every policy and budget.
        let c = Case { world: 1, ..c };
        let p = c.planner();
        let whole = events(&p.global_epoch(c.epoch), 0, Start::Cold { position: 0 });
        let mut q = p.clone();
        let plan = if seeking { q.seek(c.epoch, 0).expect("position 0") } else { q.epoch(c.epoch) };
        let held = p.memory().bytes();
        let streamed: Vec<Event> = plan.collect();
        prop_assert_eq!(&streamed, &whole);
        // Later epochs of the same process too (resident mode differs there).
        let next = events(&p.global_epoch(c.epoch + 1), 0, Start::Continue);
        prop_assert_eq!(q.epoch(c.epoch + 1).collect::<Vec<_>>(), next);
        // Its state is counted while it is held and given back at its end.
        prop_assert!(held > 0);
        prop_assert_eq!(p.memory().bytes(), 0);
    }

    #[test]
    fn brand_reads_fill_whole_runs(c in case()) {
        // Every maximal stretch of neighbouring records a read fills is made
        // of whole runs: inside a chunk (not touching its first or last
        // record, where runs may be shorter) its length is a multiple of L.
        prop_assume!(c.policy.is_brand());
        let p = c.planner();
        let g = *p.geometry();
        prop_assume!(!g.holds_all);
        let global = p.global_epoch(c.epoch);
        for r in global.reads() {
            let records = (c.samples - r.chunk as u64 * c.chunk_size as u64).min(c.chunk_size as u64) as u32;
            let mut m = r.mask;
            while m != 0 {
                let start = m.trailing_zeros();
                let len = (m >> start).trailing_ones();
                if start > 0 && start + len < records {
                    prop_assert_eq!(len % c.run_length, 0, "read {:?}: stretch {}+{}", r, start, len);
                }
                m &= !(((1u128 << len) - 1) as u64) << start;
            }
        }
    }

    /// Any partition of an epoch into ranges (a world of one's splits):
    /// the ranges together serve the epoch's order, each sample read once
    /// between them, each range's reads before its serves and within the
    /// world's slots, nothing held at a range's end.
    #[test]
    fn ranges_of_an_epoch_serve_its_order_and_read_each_sample_once(
        c in case(), cuts in prop::collection::vec(0.0f64..1.0, 0..6),
    ) {
        let c = Case { world: 1, drop_last: false, ..c };
        let p = c.planner();
        let global = p.global_epoch(c.epoch);
        let n = c.samples;
        let mut points: Vec<u64> = cuts.iter().map(|x| (x * n as f64) as u64).collect();
        points.extend([0, n]);
        points.sort_unstable();
        points.dedup();
        let (mut served, mut records) = (Vec::new(), 0u64);
        for w in points.windows(2) {
            let events: Vec<Event> = global.range_plan(w[0], w[1]).expect("a range").collect();
            records += events
                .iter()
                .map(|e| match *e {
                    Event::Read { mask, .. } => u64::from(mask.count_ones()),
                    Event::Serve { .. } => 0,
                })
                .sum::<u64>();
            let mut memory = RankMemory::new();
            let serves = memory.run(&events, c.chunk_size);
            prop_assert_eq!(memory.residency.held, 0, "range {:?} ends holding samples", w);
            prop_assert!(memory.residency.peak <= p.geometry().world_slots);
            served.extend(serves.into_iter().map(|(position, sample, _)| (position, sample)));
        }
        let epoch: Vec<(u64, u64)> = global.served().iter().enumerate().map(|(q, &y)| (q as u64, y as u64)).collect();
        prop_assert_eq!(served, epoch);
        prop_assert_eq!(records, n, "each sample read once between the ranges");
    }

    #[test]
    fn global_order_does_not_depend_on_world_size(
        samples in 1u64..1500, chunk_size in 1u32..=64, fraction in 0.0f64..1.0,
        world in 2u32..=8, seed in any::<u64>(), drop_last in any::<bool>(),
        policy in prop::sample::select(Policy::ALL.to_vec()), run_length in 1u32..=64,
    ) {
        // drop_last with more ranks than samples is a config error.
        prop_assume!(!drop_last || samples >= world as u64);
        // Same total slots: world × per-rank slots.
        let share = fraction * samples as f64 / world as f64;
        let per_rank = samples.min(chunk_size as u64).max(share as u64);
        let runs = |c: PlanConfig| PlanConfig { run_length, ..c };
        let one = planner(layout(samples, chunk_size), &runs(config(policy, per_rank * world as u64, 1, seed, false)));
        let many = planner(layout(samples, chunk_size), &runs(config(policy, per_rank, world, seed, drop_last)));
        prop_assume!(one.geometry().holds_all == many.geometry().holds_all);
        let single: Vec<u64> = events(&one.global_epoch(3), 0, Start::Continue)
            .iter()
            .filter_map(|e| match e { Event::Serve { sample, .. } => Some(*sample), _ => None })
            .collect();
        let global = many.global_epoch(3);
        let mut interleaved = vec![None; samples as usize];
        for rank in 0..world {
            for e in events(&global, rank, Start::Continue) {
                if let Event::Serve { position, sample, padding: false, .. } = e {
                    interleaved[position as usize] = Some(sample);
                }
            }
        }
        for (p, s) in interleaved.iter().enumerate() {
            if let Some(s) = s {
                prop_assert_eq!(*s, single[p], "position {}", p);
            } else {
                prop_assert!(drop_last, "position {} unserved without drop_last", p);
            }
        }
    }
}

/// Budget holding the whole dataset: the first epoch reads each record once
/// per rank, later epochs of the same process read nothing, a restart reads
/// everything again.
#[test]
fn resident_budget_reads_once_then_never() {
    for policy in Policy::ALL {
        for world in [1, 3] {
            let cfg = config(policy, 1000, world, 5, false);
            let p = planner(layout(1000, 16), &cfg);
            assert!(p.geometry().holds_all);
            let mut memory: Vec<RankMemory> = (0..world).map(|_| RankMemory::new()).collect();
            check_epoch(&p, 0, &mut memory, Start::Cold { position: 0 });
            for m in &memory {
                assert_eq!(
                    m.held.len(),
                    1000,
                    "{policy}: a resident rank holds everything after one epoch"
                );
            }
            for epoch in 1..3 {
                let global = p.global_epoch(epoch);
                for rank in 0..world {
                    let ev = events(&global, rank, Start::Continue);
                    assert!(
                        ev.iter().all(|e| matches!(e, Event::Serve { .. })),
                        "{policy}: epoch {epoch} reads"
                    );
                }
                check_epoch(&p, epoch, &mut memory, Start::Continue);
            }
            // Restart in the middle of epoch 3: everything is read again.
            let global = p.global_epoch(3);
            let mut fresh = RankMemory::new();
            fresh.run(&events(&global, 0, Start::Cold { position: 500 }), 16);
            assert_eq!(fresh.held.len(), 1000, "{policy}: resume must re-read everything once");
        }
    }
    // Through the planner's own bookkeeping.
    let mut p = planner(layout(300, 8), &PlanConfig::new(Memory::Percent(100.0)));
    let reads = |plan: brand_plan::EpochPlan| plan.filter(|e| matches!(e, Event::Read { .. })).count();
    assert_eq!(reads(p.epoch(0)), 38, "one read per chunk");
    assert_eq!(reads(p.epoch(1)), 0);
    assert_eq!(reads(p.epoch(2)), 0);
    assert_eq!(reads(p.seek(3, 0).expect("in range")), 38);
    assert_eq!(reads(p.epoch(4)), 0);
}

/// Brand never holds more than its abstract memory, and does fill it.
#[test]
fn brand_memory_stays_within_its_slots() {
    for policy in [Policy::Brand, Policy::BrandRandom] {
        let p = planner(layout(20_000, 64), &config(policy, 2_000, 1, 1, false));
        let g = *p.geometry();
        let global = p.global_epoch(0);
        let peak = global.peak_resident();
        assert!(peak <= g.abstract_chunks * 64, "{policy}: {peak}");
        assert!(peak > g.abstract_chunks * 32, "{policy}: memory barely used ({peak})");
        let mut mem = RankMemory::new();
        mem.run(&events(&global, 0, Start::Continue), 64);
        assert_eq!(mem.residency.peak, peak);
    }
}

#[test]
fn a_group_plans_alone() {
    for policy in [Policy::Brand, Policy::BrandRandom] {
        let p = planner(layout(5_000, 32), &config(policy, 700, 2, 9, false));
        let g = *p.geometry();
        assert!(g.groups > 3);
        let global = p.global_epoch(2);
        for group in [0, 1, g.groups - 1] {
            let alone = p.group_plan(2, group).expect("a brand group");
            let serves: Vec<(u64, u32)> = global
                .served()
                .iter()
                .enumerate()
                .filter(|&(_, &y)| g.group_of_chunk(y as u64 / 32) == group)
                .map(|(q, &y)| (q as u64, y))
                .collect();
            assert_eq!(alone.serves, serves, "{policy} group {group}");
            let reads: Vec<_> = global
                .reads()
                .iter()
                .filter(|r| g.group_of_chunk(r.chunk as u64) == group)
                .copied()
                .collect();
            assert_eq!(alone.reads, reads, "{policy} group {group}");
        }
        assert!(p.group_plan(2, g.groups).is_err());
    }
    assert!(
        planner(layout(100, 4), &config(Policy::Direct, 10, 1, 0, false))
            .group_plan(0, 0)
            .is_err()
    );
}

/// The first serves of a fixed config. If this changes, every user's
/// sample order changes with it: change it only on purpose, with a note in
/// the changelog.
#[test]
fn golden_brand_order() {
    let mut p = planner(layout(1_000, 16), &config(Policy::Brand, 200, 1, 42, false));
    let first: Vec<(u64, u64)> = p
        .epoch(0)
        .filter_map(|e| match e {
            Event::Serve { position, sample, .. } => Some((position, sample)),
            _ => None,
        })
        .take(16)
        .collect();
    let want: Vec<(u64, u64)> = GOLDEN.iter().enumerate().map(|(i, &s)| (i as u64, s)).collect();
    assert_eq!(first, want);
}

const GOLDEN: [u64; 16] = [
    728, 927, 917, 640, 442, 78, 914, 120, 792, 926, 569, 788, 570, 126, 916, 575,
];

#[test]
fn seek_past_the_end_is_an_error() {
    let mut p = planner(layout(100, 8), &config(Policy::Brand, 20, 1, 0, false));
    assert!(p.seek(0, 100).is_ok());
    assert!(p.seek(0, 101).is_err());
}

#[test]
fn planner_seek_resumes_at_a_step_of_its_rank() {
    let mut cfg = config(Policy::Brand, 50, 3, 7, false);
    cfg.rank = 2;
    let mut p = planner(layout(500, 8), &cfg);
    let position = p.position_of_step(40);
    assert_eq!(position, 2 + 40 * 3);
    let serves: Vec<u64> = p
        .seek(1, position)
        .expect("in range")
        .filter_map(|e| match e {
            Event::Serve { position, .. } => Some(position),
            Event::Read { .. } => None,
        })
        .collect();
    assert_eq!(serves.first(), Some(&position));
    assert_eq!(serves.len() as u64, p.geometry().steps - 40);
}

/// A packed-looking index with records of `min..max` KiB, 100 labels.
fn synthetic_index(samples: u64, k: u32, min_kib: u32, max_kib: u32) -> Index {
    let mut rng = Prng::stream(77, &[]);
    let mut metas = Vec::new();
    let mut chunks = Vec::new();
    let mut offset = 0u64;
    for c in 0..samples.div_ceil(k as u64) {
        let records = (samples - c * k as u64).min(k as u64) as u32;
        let mut rel = 512u32; // room for a header
        for _ in 0..records {
            let len = (min_kib + rng.below((max_kib - min_kib) as u64) as u32) * 1024 + rng.below(1024) as u32;
            metas.push(SampleMeta {
                rel_offset: rel,
                stored_len: len,
                raw_len: len,
                crc: 0,
                label: rng.below(100) as i64,
                key: Vec::new(),
            });
            rel += len;
        }
        chunks.push(ChunkLoc {
            segment: 0,
            record_count: records,
            offset,
        });
        offset += align_up(rel as u64);
    }
    assert_eq!(offset % ALIGN, 0);
    Index::new(k, 1, chunks, metas).expect("valid synthetic index")
}

#[test]
fn simulate_metrics_tell_policies_apart() {
    let index = synthetic_index(20_000, 64, 10, 210);
    let run = |policy, memory| {
        let mut cfg = PlanConfig::new(memory);
        cfg.policy = policy;
        simulate(&index, &cfg, 2).expect("simulate")
    };
    let ten = Memory::Percent(10.0);
    let brand = run(Policy::Brand, ten);
    let direct = run(Policy::Direct, ten);
    let sequential = run(Policy::Sequential, ten);
    for r in [&brand, &direct, &sequential] {
        for e in &r.epochs {
            assert!(e.exactly_once && e.reads_cover_serves, "{}: {e:?}", r.policy);
            assert_eq!(e.requests, 20_000);
        }
    }
    let b = &brand.epochs[1];
    let amp_whole = b.amplification_whole.expect("bytes served");
    let amp_sparse = b.amplification_sparse.expect("bytes served");
    assert!(
        (5.0..15.0).contains(&amp_whole),
        "brand whole-chunk amplification {amp_whole}"
    );
    assert!(
        (1.0..1.3).contains(&amp_sparse),
        "brand sparse amplification {amp_sparse}"
    );
    assert!(b.peak_resident <= brand.geometry.world_slots);

    let dispersion = |r: &brand_plan::simulate::SimReport| r.epochs[1].chunk_mate_dispersion.expect("pairs");
    assert!(dispersion(&sequential) < 0.05, "sequential {}", dispersion(&sequential));
    assert!(
        (0.95..1.05).contains(&dispersion(&direct)),
        "direct {}",
        dispersion(&direct)
    );
    assert!(dispersion(&brand) > 0.5, "brand {}", dispersion(&brand));

    let spearman = |r: &brand_plan::simulate::SimReport| r.epochs[1].spearman_vs_previous.expect("epoch 1");
    assert!(spearman(&direct).abs() < 0.05, "direct {}", spearman(&direct));
    assert!((spearman(&sequential) - 1.0).abs() < 1e-9);
    assert_eq!(direct.epochs[0].spearman_vs_previous, None);

    let labels = direct.epochs[1].label_diversity.expect("batches");
    assert!((0.97..1.03).contains(&labels), "direct label diversity {labels}");
    // Direct reads one record per sample: sparse bytes are the records.
    assert_eq!(direct.epochs[1].reads, 20_000);

    // The whole dataset in memory: the second epoch reads nothing.
    let resident = run(Policy::Brand, Memory::Percent(100.0));
    assert_eq!(resident.epochs[1].reads, 0);
    assert_eq!(resident.epochs[1].bytes_whole, 0);
    assert_eq!(resident.epochs[0].reads, 313);

    let table = brand.to_string();
    assert!(table.contains("brand") && table.lines().count() >= 5, "{table}");
    let json = serde_json::to_value(&brand).expect("serialisable");
    assert_eq!(json["epochs"][1]["requests"], 20_000);
}

/// Tiered: a pinned sample is read alone just before its serve; the rest
/// are read as whole chunks, each once, never more than the budget held;
/// the pinned samples spread over the whole epoch, so its order spreads
/// chunk-mates more than chunk-shuffle's windows of the same budget.
#[test]
fn tiered_reads_pinned_records_alone_and_the_rest_whole_within_its_budget() {
    let (n, k, slots) = (20_000u64, 64u32, 2_000u64);
    let index = synthetic_index(n, k, 10, 210);
    let chunks = n.div_ceil(k as u64);
    for share in [0u8, 77, 128, 255] {
        let mut cfg = config(Policy::Tiered, slots, 1, 4, false);
        cfg.pinned_share = share;
        let p = planner(layout(n, k), &cfg);
        let global = p.global_epoch(1);
        let pinned = brand_format::pin::pinned(chunks, share);
        let mut whole = vec![0u32; chunks as usize];
        for r in global.reads() {
            if pinned[r.chunk as usize] {
                assert_eq!(r.mask.count_ones(), 1, "share {share}: a pinned read is one record");
                let sample = r.chunk as u64 * k as u64 + r.mask.trailing_zeros() as u64;
                assert_eq!(global.served()[r.time as usize] as u64, sample, "served at its read");
            } else {
                let records = (n - r.chunk as u64 * k as u64).min(k as u64) as u32;
                assert_eq!(
                    r.mask,
                    u64::MAX >> (64 - records),
                    "share {share}: chunk {} read whole",
                    r.chunk
                );
                whole[r.chunk as usize] += 1;
            }
        }
        for c in 0..chunks as usize {
            assert_eq!(whole[c], u32::from(!pinned[c]), "share {share}: chunk {c}");
        }
        assert!(
            global.peak_resident() <= slots,
            "share {share}: {}",
            global.peak_resident()
        );
        // The buffer grows from one chunk: the first batch of 256 waits for
        // the chunks of at most 64 + 3 × 256 samples, not the budget's 2,000.
        let early = global
            .reads()
            .iter()
            .filter(|r| r.time < 256 && r.mask.count_ones() > 1)
            .count();
        if share < 255 {
            assert!(
                (1..=14).contains(&early),
                "share {share}: {early} chunks before the first batch"
            );
        }
        let mut memory = vec![RankMemory::new()];
        check_epoch(&p, 1, &mut memory, Start::Cold { position: 0 });
    }
    let run = |policy, share| {
        let mut cfg = config(policy, slots, 1, 4, false);
        cfg.pinned_share = share;
        simulate(&index, &cfg, 2).expect("simulate").epochs[1]
            .chunk_mate_dispersion
            .expect("pairs")
    };
    let (windows, buffer, pinned) = (
        run(Policy::ChunkShuffle, 0),
        run(Policy::Tiered, 0),
        run(Policy::Tiered, 77),
    );
    // 10 % of the samples in memory: windows ≈ 0.1, a buffer ≈ 0.3; 30 %
    // pinned adds ≈ 0.3 of full spread.
    assert!(buffer > 2.0 * windows, "buffer {buffer} against windows {windows}");
    assert!(pinned > buffer + 0.2, "30 % pinned {pinned} against none {buffer}");
}

#[test]
fn simulate_several_ranks_pads_or_drops() {
    let index = synthetic_index(1_001, 16, 1, 8);
    for drop_last in [false, true] {
        let mut cfg = PlanConfig::new(Memory::Percent(5.0));
        cfg.world = 4;
        cfg.drop_last = drop_last;
        let r = simulate_with(
            &index,
            &cfg,
            &SimOptions {
                epochs: 2,
                batch: 32,
                fetch: None,
                tier: None,
            },
        )
        .expect("simulate");
        for e in &r.epochs {
            assert!(e.exactly_once && e.reads_cover_serves, "{e:?}");
            let (requests, padding) = if drop_last { (1_000, 0) } else { (1_004, 3) };
            assert_eq!((e.requests, e.padding), (requests, padding));
        }
    }
}

#[test]
fn simulate_rejects_a_budget_below_one_chunk() {
    let index = synthetic_index(1_000, 64, 1, 2);
    let cfg = PlanConfig::new(Memory::Bytes(4096));
    assert!(simulate(&index, &cfg, 1).is_err());
}

#[test]
fn simulate_refuses_absurd_worlds_instead_of_aborting() {
    let index = synthetic_index(300, 16, 1, 4);
    let opts = SimOptions {
        epochs: 1,
        batch: 16,
        fetch: None,
        tier: None,
    };
    for world in [301, 100_000, u32::MAX] {
        let mut cfg = PlanConfig::new(Memory::Percent(10.0));
        cfg.world = world;
        let msg = simulate_with(&index, &cfg, &opts)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains(&format!("world {world}")), "{world}: {msg}");
    }
    // As many ranks as samples still simulates.
    let mut cfg = PlanConfig::new(Memory::Percent(10.0));
    cfg.world = 300;
    let report = simulate_with(&index, &cfg, &opts).expect("300 ranks");
    assert!(report.epochs.iter().all(|e| e.exactly_once));
}

#[test]
fn default_budget_serves_a_dataset_smaller_than_ten_chunks() {
    // 10 % of 300 samples is less than one chunk of 64: one chunk instead.
    let index = synthetic_index(300, 64, 1, 4);
    let cfg = PlanConfig::new(Memory::Percent(10.0));
    let report = simulate(&index, &cfg, 2).expect("small dataset");
    assert!(report.epochs.iter().all(|e| e.exactly_once && e.reads_cover_serves));
}

#[test]
fn simulate_shows_what_runs_save_and_cost() {
    let index = synthetic_index(20_000, 64, 10, 210);
    let run = |run_length| {
        let cfg = PlanConfig {
            run_length,
            ..PlanConfig::new(Memory::Percent(10.0))
        };
        simulate(&index, &cfg, 2).expect("simulate")
    };
    let (one, two, chunk) = (run(1), run(2), run(64));
    for r in [&one, &two, &chunk] {
        for e in &r.epochs {
            assert!(
                e.exactly_once && e.reads_cover_serves,
                "run length {}: {e:?}",
                r.run_length
            );
            assert!(e.peak_resident <= r.geometry.world_slots);
        }
    }
    let requests = |r: &brand_plan::simulate::SimReport| r.epochs[1].run_requests;
    let dispersion = |r: &brand_plan::simulate::SimReport| r.epochs[1].chunk_mate_dispersion.expect("pairs");
    // Record by record, a read's records are scattered: most need a request
    // of their own. Runs of 2 halve that; runs of a chunk need few. The
    // price: run-mates are disk neighbours served while both are resident,
    // so the spread of disk neighbours falls to about 1/L of record by
    // record's (each neighbour pair is run-mates with odds (L-1)/L).
    assert!(requests(&one) > 12_000, "run length 1: {}", requests(&one));
    assert!(
        requests(&two) * 10 < requests(&one) * 6,
        "{} vs {}",
        requests(&two),
        requests(&one)
    );
    assert!(
        requests(&chunk) * 10 < requests(&two),
        "{} vs {}",
        requests(&chunk),
        requests(&two)
    );
    assert!(
        dispersion(&two) < dispersion(&one) * 0.7,
        "{} vs {}",
        dispersion(&two),
        dispersion(&one)
    );
    assert!(
        dispersion(&two) > dispersion(&one) * 0.45,
        "{} vs {}",
        dispersion(&two),
        dispersion(&one)
    );
    assert!(dispersion(&chunk) < 0.2, "run length 64: {}", dispersion(&chunk));
    // A different run length is a different, still seeded, order.
    assert_ne!(one.epochs[1].spearman_vs_previous, two.epochs[1].spearman_vs_previous);
}

/// The tier in the simulator (issue 56): as large as the dataset, it fetches
/// each chunk once over three epochs, whatever the world, under either rule;
/// of nothing, every read goes to the store; between, under eviction by the
/// plan a larger tier never fetches more chunks, and under the rule as built
/// it keeps more of them and passes fewer reads; every read is a hit, a
/// miss or passed.
#[test]
fn simulated_tier_fetches_each_chunk_once_when_it_holds_the_dataset() {
    use brand_plan::tier::TierModel;
    let index = synthetic_index(2_000, 16, 1, 8);
    let whole: u64 = (0..index.chunk_count()).map(|c| index.chunk_padded_len(c)).sum();
    for world in [1, 3] {
        let mut cfg = PlanConfig::new(Memory::Percent(10.0));
        cfg.world = world;
        cfg.seed = 5;
        let run = |limit_bytes: u64| {
            let opts = SimOptions {
                epochs: 3,
                batch: 32,
                fetch: None,
                tier: Some(TierModel {
                    limit_bytes,
                    get_bytes: 8 << 20,
                }),
            };
            simulate_with(&index, &cfg, &opts).expect("simulate")
        };
        let all = run(whole);
        for rule in [
            |e: &brand_plan::simulate::EpochReport| e.tier,
            |e: &brand_plan::simulate::EpochReport| e.tier_by_plan,
        ] {
            let misses: Vec<u64> = all.epochs.iter().map(|e| rule(e).expect("tier").misses).collect();
            assert_eq!(misses, [index.chunk_count(), 0, 0], "world {world}");
        }
        let none = run(0);
        let (mut last, mut last_passed) = (u64::MAX, u64::MAX);
        for pct in [0u64, 10, 30, 50, 100] {
            let r = if pct == 0 { none.clone() } else { run(whole * pct / 100) };
            let total: u64 = r.epochs.iter().map(|e| e.tier_by_plan.expect("tier").misses).sum();
            let passed: u64 = r.epochs.iter().map(|e| e.tier.expect("tier").passed).sum();
            for e in &r.epochs {
                let (t, p) = (e.tier.expect("tier"), e.tier_by_plan.expect("tier"));
                assert_eq!(t.hits + t.misses + t.passed, e.reads, "world {world} tier {pct}%");
                assert_eq!(p.hits + p.misses, e.reads, "world {world} tier {pct}%");
                assert!(t.held_bytes <= whole * pct / 100 && p.held_bytes <= whole * pct / 100);
                if pct == 0 {
                    assert_eq!((t.hits, t.misses, t.passed), (0, 0, e.reads));
                    assert_eq!((p.hits, p.misses), (0, e.reads));
                }
            }
            assert!(
                total <= last,
                "world {world}: tier {pct}% fetched {total} chunks, more than a smaller one"
            );
            assert!(passed <= last_passed, "world {world}: tier {pct}% passed {passed}");
            (last, last_passed) = (total, passed);
        }
    }
}
