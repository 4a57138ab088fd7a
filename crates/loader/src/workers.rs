//! A process's memory shared by ranks of its own (DESIGN.md §5): each
//! DataLoader worker of `brand.torch` and each prefetch process of
//! `brand.grain` is a brand rank, and the budget the user gave is the
//! process's, whatever the number of workers.
//!
//! Ranks of one world hold equal slots (the plan's abstract memory is
//! `world × slots per rank`), so `k` workers get `⌊M / k⌋` slots each of the
//! process's `M`; the `M mod k` slots left (fewer than `k` samples' worth)
//! are unused. The total, and with it the global order, is the same for any
//! two worker counts that divide `M`.

use brand_format::error::{Error, Result};
use brand_format::index::Index;
use brand_plan::{Layout, PlanConfig, Planner};

/// How a process's budget is shared by its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerMemory {
    /// What the process's `memory` is in slots (one rank's budget, the
    /// plan's `rank_slots`).
    pub process_slots: u64,
    /// Slots of each worker: `⌊process_slots / workers⌋`.
    pub worker_slots: u64,
}

/// The slots of each of `workers` ranks sharing the budget of `plan` (the
/// process's plan: its memory, rank and world; the workers' world is
/// `world × workers`). With two or more workers, each must hold at least two
/// batches of `batch_size` (its whole share of an epoch if that is less) and
/// one chunk; the error names the number of workers and the least memory
/// that gives them that. One worker has the process's budget, as the
/// process alone.
pub fn split_memory(layout: Layout, plan: &PlanConfig, batch_size: usize, workers: u32) -> Result<WorkerMemory> {
    if workers == 0 {
        return Err(Error::config("workers must be at least 1"));
    }
    let process = Planner::from_layout(layout, plan)?;
    let total = process.geometry().rank_slots;
    let per = total / workers as u64;
    let split = WorkerMemory {
        process_slots: total,
        worker_slots: per,
    };
    if workers == 1 {
        return Ok(split);
    }
    let Some(world) = plan.world.checked_mul(workers) else {
        return Err(Error::config(format!(
            "world {} × {workers} workers is more than {} brand ranks",
            plan.world,
            u32::MAX
        )));
    };
    let (n, k) = (layout.samples, layout.chunk_size as u64);
    let world = world as u64;
    let share = if plan.drop_last { n / world } else { n.div_ceil(world) };
    let batches = (2 * batch_size as u64).min(share.max(1));
    let chunk = n.min(k);
    let need = batches.max(chunk);
    if per >= need {
        return Ok(split);
    }
    let why = if chunk > batches {
        format!("one chunk, {chunk} samples")
    } else if batches < 2 * batch_size as u64 {
        format!("its whole share of an epoch, {batches} samples")
    } else {
        format!("two batches of {batch_size}")
    };
    let least = need * workers as u64;
    let bytes = |slots: u64| (slots.min(n) as u128 * layout.sample_bytes as u128).div_ceil(n as u128);
    Err(Error::config(format!(
        "memory {} is {total} slots (samples' worth, about {} bytes) for this process, shared by its {workers} \
         workers: {per} each, and each needs at least {need} ({why}). Give memory at least \"{least} slots\" \
         (about {} bytes, {:.3} % of the dataset) or use fewer workers",
        plan.memory,
        bytes(total),
        bytes(least),
        least as f64 * 100.0 / n as f64
    )))
}

/// [`split_memory`] of the dataset whose index is `index`.
pub fn split_memory_of(index: &Index, plan: &PlanConfig, batch_size: usize, workers: u32) -> Result<WorkerMemory> {
    split_memory(Layout::of(index), plan, batch_size, workers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brand_plan::Memory;

    fn layout() -> Layout {
        // 20,000 samples of 100 bytes in chunks of 64.
        Layout {
            samples: 20_000,
            chunk_size: 64,
            sample_bytes: 2_000_000,
        }
    }

    fn plan(memory: &str, world: u32) -> PlanConfig {
        PlanConfig {
            world,
            ..PlanConfig::new(memory.parse().expect("memory"))
        }
    }

    #[test]
    fn workers_share_the_process_slots_whatever_the_unit() {
        for memory in ["10%", "200000", "2000 slots"] {
            for (workers, each) in [(1, 2000), (2, 1000), (4, 500), (8, 250), (3, 666)] {
                let got = split_memory(layout(), &plan(memory, 1), 64, workers).expect("fits");
                assert_eq!(
                    got,
                    WorkerMemory {
                        process_slots: 2000,
                        worker_slots: each
                    },
                    "{memory} on {workers}"
                );
            }
        }
        // The process's budget does not depend on the world; the minimum does.
        let got = split_memory(layout(), &plan("10%", 4), 64, 4).expect("fits");
        assert_eq!(got.worker_slots, 500);
    }

    #[test]
    fn too_little_for_two_batches_per_worker_names_the_workers_and_the_least() {
        // 2000 slots on 8 workers: 250 each, two batches of 256 need 512.
        let e = split_memory(layout(), &plan("10%", 1), 256, 8)
            .expect_err("too small")
            .to_string();
        assert!(
            e.contains("its 8 workers: 250 each")
                && e.contains("at least 512 (two batches of 256)")
                && e.contains("\"4096 slots\"")
                && e.contains("20.480 %"),
            "{e}"
        );
        // One worker has it all, as the process alone.
        assert!(split_memory(layout(), &plan("10%", 1), 256, 1).is_ok());
        // Exactly two batches each is enough.
        assert!(split_memory(layout(), &plan("4096 slots", 1), 256, 8).is_ok());
        // Below one chunk each.
        let e = split_memory(layout(), &plan("100 slots", 1), 4, 2)
            .expect_err("chunk")
            .to_string();
        assert!(
            e.contains("one chunk, 64 samples") && e.contains("\"128 slots\""),
            "{e}"
        );
        // A tiny dataset: two batches are more than a worker's share.
        let tiny = Layout {
            samples: 40,
            chunk_size: 8,
            sample_bytes: 4000,
        };
        let e = split_memory(tiny, &PlanConfig::new(Memory::Slots(12)), 64, 4)
            .expect_err("share")
            .to_string();
        assert!(e.contains("whole share of an epoch, 10 samples"), "{e}");
        assert!(split_memory(tiny, &PlanConfig::new(Memory::Slots(40)), 64, 4).is_ok());
    }

    #[test]
    fn the_process_plan_is_checked_first() {
        let e = split_memory(layout(), &plan("10 slots", 1), 4, 2).expect_err("below a chunk");
        assert!(e.to_string().contains("less than one chunk"), "{e}");
        assert!(split_memory(layout(), &plan("10%", 1), 4, 0).is_err());
    }
}
