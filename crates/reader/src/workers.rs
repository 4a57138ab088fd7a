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
//!
//! A share must hold one chunk (the least the protocol runs on) and two of
//! the worker's batches (one being served, one being filled), or its whole
//! share of an epoch if that is less. Where it does not, the share is
//! fitted before anything is refused, so that the defaults work at any
//! dataset size: batches a worker only passes on sample by sample (its
//! internal batch) shrink to half its share; a share given as a
//! percentage, which already rounds up to one chunk for a process alone,
//! rounds up to one chunk per worker and, for batches the worker yields
//! whole, to its whole share of an epoch when that is less than two
//! batches (a small dataset). A budget in bytes or slots is the user's
//! hard limit: too small, it is an error that names the least that works.

use brand_format::error::{Error, Result};
use brand_format::index::Index;
use brand_plan::{Layout, Memory, PlanConfig, Planner};

/// What a worker does with its loader's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batches {
    /// Passed on sample by sample (`batched=False`): the batch size is
    /// internal and may shrink to fit the share.
    Internal,
    /// Yielded whole (`batched=True`): the batch size is the user's.
    Yielded,
}

/// How a process's budget is shared by its workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerMemory {
    /// What the process's `memory` is in slots (one rank's budget, the
    /// plan's `rank_slots`).
    pub process_slots: u64,
    /// Slots of each worker: `⌊process_slots / workers⌋`, or more where a
    /// percentage rounded up.
    pub worker_slots: u64,
    /// Each worker's loader batch size: the one asked for, or less where an
    /// internal batch shrank to fit the share.
    pub batch_size: usize,
    /// Set when the shares were rounded up past the process's budget: what
    /// to tell the user, once.
    pub rounded_up: Option<String>,
}

/// The slots (and batch size) of each of `workers` ranks sharing the
/// budget of `plan` (the process's plan: its memory, rank and world; the
/// workers' world is `world × workers`), as the module documentation says.
/// One worker has the process's budget and batch, as the process alone.
/// The error names the number of workers and the least memory that fits.
pub fn split_memory(
    layout: Layout,
    plan: &PlanConfig,
    batch_size: usize,
    workers: u32,
    batches: Batches,
) -> Result<WorkerMemory> {
    if workers == 0 {
        return Err(Error::config("workers must be at least 1"));
    }
    let process = Planner::from_layout(layout, plan)?;
    let total = process.geometry().rank_slots;
    let mut split = WorkerMemory {
        process_slots: total,
        worker_slots: total / workers as u64,
        batch_size,
        rounded_up: None,
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
    let whole_share = share.max(1);
    let two_batches = 2 * batch_size as u64;
    let chunk = n.min(k);
    let relative = matches!(plan.memory, Memory::Percent(_));
    // Why a percentage rounded the shares up, if it did.
    let mut rounded = None;
    // One chunk each: a percentage rounds up to it, as for a process alone.
    if split.worker_slots < chunk && relative {
        split.worker_slots = chunk;
        rounded = Some(format!("one chunk ({chunk} samples)"));
    }
    if split.worker_slots < two_batches.min(whole_share) {
        match batches {
            Batches::Internal => {
                split.batch_size = (split.worker_slots / 2).clamp(1, batch_size as u64) as usize;
            }
            // A small dataset: a worker's whole share is less than two of
            // the user's batches, and a percentage rounds up to it.
            Batches::Yielded if relative && whole_share < two_batches => {
                split.worker_slots = whole_share;
                rounded = Some(format!(
                    "its whole share of an epoch ({whole_share} samples, less than two batches of {batch_size})"
                ));
            }
            Batches::Yielded => {}
        }
    }
    // An internal batch fits by construction; the user's must.
    let batches_need = match batches {
        Batches::Internal => 0,
        Batches::Yielded => two_batches.min(whole_share),
    };
    let need = batches_need.max(chunk);
    if split.worker_slots < need {
        let why = if chunk >= batches_need {
            format!("one chunk, {chunk} samples")
        } else if batches_need < two_batches {
            format!("its whole share of an epoch, {batches_need} samples")
        } else {
            format!("two batches of {batch_size}")
        };
        let least = need * workers as u64;
        return Err(Error::config(format!(
            "memory {} is {total} slots (samples' worth, about {} bytes) for this process, shared by its {workers} \
             workers: {} each, and each needs at least {need} ({why}). Give memory at least \"{least} slots\" \
             (about {} bytes, {:.3} % of the dataset) or use fewer workers",
            plan.memory,
            layout_bytes(layout, total),
            total / workers as u64,
            layout_bytes(layout, least),
            least as f64 * 100.0 / n as f64
        )));
    }
    if let Some(why) = rounded {
        let held = split.worker_slots * workers as u64;
        split.rounded_up = Some(format!(
            "memory {} is {total} slots (samples' worth) for this process, too few for each of its {workers} \
             workers to hold {why}: each holds {} slots instead, {held} in all (about {} bytes, {:.3} % of the dataset)",
            plan.memory,
            split.worker_slots,
            layout_bytes(layout, held),
            held as f64 * 100.0 / n as f64
        ));
    }
    Ok(split)
}

/// About how many bytes `slots` samples of `layout` hold.
fn layout_bytes(layout: Layout, slots: u64) -> u128 {
    let n = layout.samples.max(1);
    (slots.min(n) as u128 * layout.sample_bytes as u128).div_ceil(n as u128)
}

/// [`split_memory`] of the dataset whose index is `index`.
pub fn split_memory_of(
    index: &Index,
    plan: &PlanConfig,
    batch_size: usize,
    workers: u32,
    batches: Batches,
) -> Result<WorkerMemory> {
    split_memory(Layout::of(index), plan, batch_size, workers, batches)
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
                for batches in [Batches::Internal, Batches::Yielded] {
                    let got = split_memory(layout(), &plan(memory, 1), 64, workers, batches).expect("fits");
                    assert_eq!(
                        got,
                        WorkerMemory {
                            process_slots: 2000,
                            worker_slots: each,
                            batch_size: 64,
                            rounded_up: None,
                        },
                        "{memory} on {workers}"
                    );
                }
            }
        }
        // The process's budget does not depend on the world; the minimum does.
        let got = split_memory(layout(), &plan("10%", 4), 64, 4, Batches::Yielded).expect("fits");
        assert_eq!(got.worker_slots, 500);
    }

    #[test]
    fn too_little_for_two_batches_per_worker_names_the_workers_and_the_least() {
        // 2000 slots on 8 workers: 250 each, two batches of 256 need 512.
        for memory in ["10%", "2000 slots"] {
            let e = split_memory(layout(), &plan(memory, 1), 256, 8, Batches::Yielded)
                .expect_err("too small")
                .to_string();
            assert!(
                e.contains("its 8 workers: 250 each")
                    && e.contains("at least 512 (two batches of 256)")
                    && e.contains("\"4096 slots\"")
                    && e.contains("20.480 %"),
                "{e}"
            );
        }
        // One worker has it all, as the process alone.
        assert!(split_memory(layout(), &plan("10%", 1), 256, 1, Batches::Yielded).is_ok());
        // Exactly two batches each is enough.
        assert!(split_memory(layout(), &plan("4096 slots", 1), 256, 8, Batches::Yielded).is_ok());
        // Below one chunk each, whatever the batches.
        for batches in [Batches::Internal, Batches::Yielded] {
            let e = split_memory(layout(), &plan("100 slots", 1), 4, 2, batches)
                .expect_err("chunk")
                .to_string();
            assert!(
                e.contains("one chunk, 64 samples") && e.contains("\"128 slots\""),
                "{e}"
            );
        }
        // A tiny dataset: two batches are more than a worker's share.
        let tiny = Layout {
            samples: 40,
            chunk_size: 8,
            sample_bytes: 4000,
        };
        let e = split_memory(tiny, &PlanConfig::new(Memory::Slots(12)), 64, 4, Batches::Yielded)
            .expect_err("share")
            .to_string();
        assert!(e.contains("whole share of an epoch, 10 samples"), "{e}");
        assert!(split_memory(tiny, &PlanConfig::new(Memory::Slots(40)), 64, 4, Batches::Yielded).is_ok());
    }

    #[test]
    fn an_internal_batch_shrinks_to_half_the_share() {
        // Issue 54: 2,401 samples, 10 % is 240 slots, 120 for each of 2
        // workers: batches of 60, whatever the unit and the world.
        let small = Layout {
            samples: 2401,
            chunk_size: 16,
            sample_bytes: 2401 * 3000,
        };
        for (memory, world) in [("10%", 1), ("10%", 3), ("240 slots", 1), ("720000", 3)] {
            let got = split_memory(small, &plan(memory, world), 256, 2, Batches::Internal).expect("fits");
            assert_eq!(
                got,
                WorkerMemory {
                    process_slots: 240,
                    worker_slots: 120,
                    batch_size: 60,
                    rounded_up: None,
                },
                "{memory} in a world of {world}"
            );
        }
        // A share of two batches or more keeps the batch.
        let got = split_memory(layout(), &plan("10%", 1), 256, 2, Batches::Internal).expect("fits");
        assert_eq!((got.worker_slots, got.batch_size), (1000, 256));
        // A large dataset's 10 % on 8 workers: 250 slots each, batches of 125.
        let got = split_memory(layout(), &plan("10%", 1), 256, 8, Batches::Internal).expect("fits");
        assert_eq!((got.worker_slots, got.batch_size, got.rounded_up), (250, 125, None));
    }

    #[test]
    fn a_percentage_rounds_each_share_up_to_a_chunk() {
        // 200 samples in chunks of 64: 10 % is one chunk for the process
        // (the plan's rounding), 16 for each of 4 workers: a chunk each.
        let small = Layout {
            samples: 200,
            chunk_size: 64,
            sample_bytes: 200 * 3000,
        };
        for batches in [Batches::Internal, Batches::Yielded] {
            let got = split_memory(small, &plan("10%", 1), 256, 4, batches).expect("fits");
            assert_eq!((got.process_slots, got.worker_slots), (64, 64), "{batches:?}");
            let why = got.rounded_up.expect("told");
            assert!(
                why.contains("each of its 4 workers")
                    && why.contains("one chunk (64 samples)")
                    && why.contains("256 in all")
                    && why.contains("128.000 %"),
                "{why}"
            );
            // A chunk holds a worker's whole share (50 samples): its batch stays.
            assert_eq!(got.batch_size, 256);
        }
        // The same budget in slots is the user's limit: an error.
        let e = split_memory(small, &plan("64 slots", 1), 256, 4, Batches::Internal)
            .expect_err("below a chunk")
            .to_string();
        assert!(
            e.contains("one chunk, 64 samples") && e.contains("\"256 slots\""),
            "{e}"
        );
    }

    #[test]
    fn a_percentage_rounds_yielded_batches_up_to_a_small_datasets_share() {
        // Rank 0 of 3 with 2 workers, 2,401 samples: each worker's share is
        // 401, less than two batches of 256: 120 slots round up to it.
        let small = Layout {
            samples: 2401,
            chunk_size: 16,
            sample_bytes: 2401 * 3000,
        };
        let got = split_memory(small, &plan("10%", 3), 256, 2, Batches::Yielded).expect("fits");
        assert_eq!((got.worker_slots, got.batch_size), (401, 256));
        let why = got.rounded_up.expect("told");
        assert!(why.contains("whole share of an epoch (401 samples"), "{why}");
        // In slots it is the user's limit.
        let e = split_memory(small, &plan("240 slots", 3), 256, 2, Batches::Yielded)
            .expect_err("too small")
            .to_string();
        assert!(
            e.contains("whole share of an epoch, 401 samples") && e.contains("\"802 slots\""),
            "{e}"
        );
    }

    #[test]
    fn the_process_plan_is_checked_first() {
        let e = split_memory(layout(), &plan("10 slots", 1), 4, 2, Batches::Internal).expect_err("below a chunk");
        assert!(e.to_string().contains("less than one chunk"), "{e}");
        assert!(split_memory(layout(), &plan("10%", 1), 4, 0, Batches::Internal).is_err());
    }
}
