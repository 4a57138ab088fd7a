//! Elastic resume: every rank's state of a world of W ranks, restored on W'
//! ranks, continuing the same global order.
//!
//! The plan's served sequence is one global sequence of positions that
//! depends on the total memory (W × slots per rank), not on W; rank `r` of
//! W serves positions `r, r + W, …`. So the W states together say how many
//! positions of the epoch were served, `P`, provided they are a prefix of
//! the sequence (the states of one global step are). Rank `r'` of W' then
//! continues at its first position at or after `P`: step `⌈(P − r')/W'⌉`,
//! which is an ordinary [`LoaderState`] of the new world.

use brand_format::error::{Error, Result};
use brand_format::index::Index;
use brand_plan::{Geometry, PlanConfig, Planner};

use crate::LoaderState;

/// What a world of ranks saved: the plan config they ran (its `rank` is
/// ignored, its `world` is the number of states) and every rank's state,
/// `states[r]` for rank `r`.
#[derive(Debug, Clone)]
pub struct SavedWorld {
    pub plan: PlanConfig,
    pub states: Vec<LoaderState>,
}

/// Where a whole world stopped: `position` global positions of `epoch` were
/// served (every position below it, none at or after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalPosition {
    pub epoch: u64,
    pub position: u64,
}

impl GlobalPosition {
    /// The position of every rank's state together; `steps` is what each
    /// rank of that world serves per epoch. Refused, naming the ranks, when
    /// the states are not one prefix of the global sequence (saved at
    /// different steps).
    pub fn of_ranks(states: &[LoaderState], steps: u64) -> Result<Self> {
        let world = states.len() as u64;
        let Some(epoch) = states.iter().map(|s| s.epoch).max() else {
            return Err(Error::config("no rank states to resume from"));
        };
        // A rank saved after its epoch's last batch, before it saw the
        // epoch end, is at the start of the next one.
        let norm: Vec<u64> = states
            .iter()
            .enumerate()
            .map(|(r, s)| match s {
                s if s.epoch == epoch => Ok(s.served.min(steps)),
                s if s.epoch + 1 == epoch && s.served >= steps => Ok(0),
                s => Err(Error::config(format!(
                    "rank {r} is at epoch {} sample {}, another rank at epoch {epoch}: the states are not of one global step",
                    s.epoch, s.served
                ))),
            })
            .collect::<Result<_>>()?;
        let position: u64 = norm.iter().sum();
        for (r, &served) in norm.iter().enumerate() {
            let due = Self::steps_before(position, r as u64, world);
            if served != due {
                return Err(Error::config(format!(
                    "rank {r} served {served} samples of epoch {epoch} but the {world} ranks served {position} together, which leaves it {due}: the states are not of one global step (save every rank after the same step)"
                )));
            }
        }
        Ok(GlobalPosition { epoch, position })
    }

    /// Steps of rank `rank` of `world` at positions below `position`.
    fn steps_before(position: u64, rank: u64, world: u64) -> u64 {
        position.saturating_sub(rank).div_ceil(world)
    }

    /// Rank `rank` of `world`, which serves `steps` per epoch, at this
    /// position: its first serve is its first position at or after it.
    pub fn rank_state(&self, rank: u32, world: u32, steps: u64) -> LoaderState {
        LoaderState {
            epoch: self.epoch,
            served: Self::steps_before(self.position, rank as u64, world as u64).min(steps),
        }
    }
}

/// Where `saved` stopped, checked against the plan `now` runs over `index`:
/// the served order must be the same one (policy, seed, drop_last and the
/// total memory, world × slots per rank); the error says what differs.
pub fn global_position(index: &Index, saved: &SavedWorld, now: &Planner) -> Result<GlobalPosition> {
    let world = saved.states.len() as u32;
    if world != saved.plan.world {
        return Err(Error::config(format!(
            "{world} rank states for a saved world of {}: every rank's state is needed",
            saved.plan.world
        )));
    }
    let old = Planner::new(
        index,
        &PlanConfig {
            rank: 0,
            ..saved.plan.clone()
        },
    )?;
    check_same_order(&saved.plan, old.geometry(), now.config(), now.geometry())?;
    GlobalPosition::of_ranks(&saved.states, old.geometry().steps)
}

/// Why plans `a` (saved) and `b` (now) serve different global sequences, if they do.
fn check_same_order(a: &PlanConfig, ga: &Geometry, b: &PlanConfig, gb: &Geometry) -> Result<()> {
    let mut diff = Vec::new();
    if a.policy != b.policy {
        diff.push(format!("policy {} saved, {} now", a.policy, b.policy));
    }
    if a.seed != b.seed {
        diff.push(format!("seed {} saved, {} now", a.seed, b.seed));
    }
    if a.drop_last != b.drop_last {
        diff.push(format!("drop_last {} saved, {} now", a.drop_last, b.drop_last));
    }
    if a.run_length != b.run_length {
        diff.push(format!("run length {} saved, {} now", a.run_length, b.run_length));
    }
    if ga.world_slots != gb.world_slots || ga.holds_all != gb.holds_all {
        let fix = if ga.world_slots.is_multiple_of(gb.world as u64) {
            format!(
                "memory = \"{} slots\" per rank keeps it",
                ga.world_slots / gb.world as u64
            )
        } else {
            format!("no whole number of slots per rank of {} gives it", gb.world)
        };
        diff.push(format!(
            "total memory {} × {} = {} slots saved, {} × {} = {} slots now ({fix})",
            ga.world, ga.rank_slots, ga.world_slots, gb.world, gb.rank_slots, gb.world_slots
        ));
    }
    if diff.is_empty() {
        return Ok(());
    }
    Err(Error::config(format!(
        "cannot resume {} ranks on {}: the global order would differ ({})",
        ga.world,
        gb.world,
        diff.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(epoch: u64, served: u64) -> LoaderState {
        LoaderState { epoch, served }
    }

    #[test]
    fn a_prefix_of_positions_is_found_and_split_for_any_world() {
        // 3 ranks at step 4: positions 0..12 served.
        let p = GlobalPosition::of_ranks(&[st(2, 4), st(2, 4), st(2, 4)], 34).expect("one step");
        assert_eq!(p, GlobalPosition { epoch: 2, position: 12 });
        // On 2 ranks: both at step 6; on 5 ranks: 12 = 2·5 + 2, ranks 0, 1 at 3.
        assert_eq!(p.rank_state(1, 2, 50), st(2, 6));
        let five: Vec<u64> = (0..5).map(|r| p.rank_state(r, 5, 20).served).collect();
        assert_eq!(five, [3, 3, 2, 2, 2]);
        // Lower ranks one ahead is still a prefix (positions 0..13).
        let p = GlobalPosition::of_ranks(&[st(0, 5), st(0, 4), st(0, 4)], 34).expect("prefix");
        assert_eq!(p.position, 13);
        // A rank that saved after its last batch is at the next epoch's start.
        let p = GlobalPosition::of_ranks(&[st(1, 0), st(0, 34), st(1, 0)], 34).expect("boundary");
        assert_eq!(p, GlobalPosition { epoch: 1, position: 0 });
    }

    #[test]
    fn states_of_different_steps_are_refused_naming_the_rank() {
        let e = GlobalPosition::of_ranks(&[st(0, 4), st(0, 5), st(0, 4)], 34)
            .expect_err("not a prefix")
            .to_string();
        assert!(
            e.contains("rank 0 served 4") && e.contains("served 13 together") && e.contains("not of one global step"),
            "{e}"
        );
        let e = GlobalPosition::of_ranks(&[st(0, 4), st(2, 4)], 34)
            .expect_err("epochs")
            .to_string();
        assert!(e.contains("rank 0 is at epoch 0"), "{e}");
        assert!(GlobalPosition::of_ranks(&[], 3).is_err());
    }
}
