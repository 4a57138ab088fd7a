//! Plan throughput: requests planned per second for an ImageNet-sized
//! layout (1.28 M samples of ~110 KiB, chunks of 64, 10 % budget). The plan
//! is computed from metadata only, so this is pure CPU.

use std::hint::black_box;

use brand_plan::{Event, Layout, Memory, PlanConfig, Planner, Policy, Start};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const SAMPLES: u64 = 1_280_000;

fn planner(policy: Policy, world: u32) -> Planner {
    let layout = Layout {
        samples: SAMPLES,
        chunk_size: 64,
        sample_bytes: SAMPLES * 110 * 1024,
    };
    // The world's memory is 10 % of the dataset whatever the world size.
    let mut config = PlanConfig::new(Memory::Percent(10.0 / world as f64));
    config.policy = policy;
    config.world = world;
    Planner::from_layout(layout, &config).expect("valid bench config")
}

/// Computes an epoch and walks rank 0's events, as a loader would.
fn plan_epoch(p: &Planner, epoch: u64) -> u64 {
    let plan = p
        .global_epoch(epoch)
        .rank_plan(0, Start::Continue)
        .expect("rank 0 exists");
    plan.map(|e| match e {
        Event::Read { mask, .. } => mask,
        Event::Serve { sample, .. } => sample,
    })
    .fold(0u64, u64::wrapping_add)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group.sample_size(10);
    group.throughput(Throughput::Elements(SAMPLES));
    for (name, policy, world) in [
        ("brand", Policy::Brand, 1),
        ("brand-random", Policy::BrandRandom, 1),
        ("direct", Policy::Direct, 1),
        // Rank 0 of 8: the global protocol plus cutting out one rank's share.
        ("brand-rank0-of-8", Policy::Brand, 8),
    ] {
        let p = planner(policy, world);
        let mut epoch = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                epoch += 1;
                black_box(plan_epoch(&p, epoch))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
