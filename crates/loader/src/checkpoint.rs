//! Checkpoints: where a loader is ([`LoaderState`]), saved as a blob bound
//! to its dataset and plan ([`Checkpoint`]), and where an open resumes
//! ([`Resume`]) — the same for a [`Loader`](crate::Loader), a multi-node
//! node, the C ABI (`brand_state_save` / `brand_open_at`), the TF op and
//! Python.
//!
//! The blob, every integer little-endian. Version 1, 88 bytes: a position
//! in a plan's order (a count). Version 2: the same header, then which
//! samples of the epoch were served, for a job attached to a `brand cache`,
//! whose order depends on timing (a count cannot say which samples it
//! served). Version 1 is written whenever a count is the whole state.
//!
//! ```text
//!  0  magic      8   "BRDSTATE"
//!  8  version    u32 1, or 2 with the bitmap
//! 12  length     u32 the whole blob: 88, or 88 + 8 x ceil(samples / 64)
//! 16  epoch      u64 LoaderState::epoch
//! 24  served     u64 LoaderState::served (samples of `epoch` already handed
//!                    out; in version 2 the bitmap's count of set bits)
//!     -- the dataset --
//! 32  samples    u64
//! 40  chunk_size u32
//! 44  content    u32 crc32c over the index's per-record crc32c column (which
//!                    data: two packs of different inputs differ here)
//! 48  pack_seed  u64
//!     -- the plan config (everything the served order depends on) --
//! 56  rank_slots u64 the memory budget as abstract slots per rank (what the
//!                    plan uses: "10%" and an equal byte budget are the same)
//! 64  seed       u64
//! 72  rank       u32
//! 76  world      u32
//! 80  policy     u8  0 brand, 1 brand-random, 2 direct, 3 chunk-shuffle, 4 sequential,
//!                    5 tiered
//! 81  drop_last  u8  0 or 1
//! 82  run_length u8  the plan's run length minus 1 (0 in states saved
//!                    before runs existed, which ran length 1)
//! 83  pinned     u8  the tiered policy's pinned share of the chunks, in
//!                    255ths (zero for every other policy, and in states
//!                    saved before it existed, where it was reserved)
//!     -- version 2 only --
//! 84  bitmap     ceil(samples / 64) u64 words: bit i % 64 of word i / 64 is
//!                    set when sample i was served in `epoch`
//! end-4 crc32c   u32 of every byte before it (at 84 in version 1)
//! ```
//!
//! I/O settings (batch size, read gap, queue depth, readahead, verify) are
//! not part of it: they change how fast the plan's sequence arrives, never
//! the sequence, so a run may resume with different ones.
//!
//! Elastic resume needs no other version: the states of all W ranks carry
//! each rank's `rank`, `world`, `rank_slots` and `served`, so together they give
//! the total memory (W × slots) and the global position (the sum of
//! `served`, checked to be one prefix of the global sequence), which a
//! single blob could only assume (see `brand_loader::elastic`).

use serde::{Deserialize, Serialize};

use brand_format::Dataset;
use brand_format::error::{Error, Result};
use brand_format::ids::IdBits;
use brand_plan::{Memory, PlanConfig, Planner, Policy};

use crate::elastic::{GlobalPosition, SavedWorld, global_position};

const MAGIC: [u8; 8] = *b"BRDSTATE";
/// A count only.
const VERSION: u32 = 1;
/// A count and the bitmap of the samples it counts.
const VERSION_BITMAP: u32 = 2;

/// Where a loader is: enough to resume it exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    /// Samples of `epoch` this rank already handed out.
    pub served: u64,
}

/// What a state must agree with before it is restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub samples: u64,
    pub chunk_size: u32,
    pub content: u32,
    pub pack_seed: u64,
    pub rank_slots: u64,
    pub seed: u64,
    pub rank: u32,
    pub world: u32,
    pub policy: u8,
    pub drop_last: bool,
    pub run_length: u32,
    /// The tiered policy's pinned share (0 for the others).
    pub pinned_share: u8,
}

fn policy_code(p: Policy) -> u8 {
    match p {
        Policy::Brand => 0,
        Policy::BrandRandom => 1,
        Policy::Direct => 2,
        Policy::ChunkShuffle => 3,
        Policy::Sequential => 4,
        Policy::Tiered => 5,
    }
}

fn policy_of(code: u8) -> Option<Policy> {
    Policy::ALL.into_iter().find(|&p| policy_code(p) == code)
}

fn policy_name(code: u8) -> String {
    policy_of(code).map_or_else(|| format!("unknown policy #{code}"), |p| p.name().to_string())
}

impl Fingerprint {
    /// What a loader of `planner`'s plan over `ds` saves.
    pub fn of(ds: &Dataset, planner: &Planner) -> Self {
        let (plan, geometry) = (planner.config(), planner.geometry());
        let content = ds.index.content_digest();
        Fingerprint {
            samples: ds.index.samples(),
            chunk_size: ds.index.chunk_size(),
            content,
            pack_seed: ds.manifest.pack_seed,
            rank_slots: geometry.rank_slots,
            seed: plan.seed,
            rank: plan.rank,
            world: plan.world,
            policy: policy_code(plan.policy),
            drop_last: plan.drop_last,
            run_length: plan.run_length,
            pinned_share: if plan.policy == Policy::Tiered {
                plan.pinned_share
            } else {
                0
            },
        }
    }

    /// What differs from `now`, one phrase each (empty: they agree): the
    /// dataset's, then the plan's.
    fn differences(&self, now: &Fingerprint) -> (Vec<String>, Vec<String>) {
        let mut data = Vec::new();
        let mut plan = Vec::new();
        let cmp = |list: &mut Vec<String>, what: &str, saved: String, current: String| {
            if saved != current {
                list.push(format!("{what} {saved} in the state, {current} now"));
            }
        };
        let (s, n) = (self, now);
        cmp(&mut data, "samples", s.samples.to_string(), n.samples.to_string());
        cmp(
            &mut data,
            "chunk size",
            s.chunk_size.to_string(),
            n.chunk_size.to_string(),
        );
        cmp(&mut data, "pack seed", s.pack_seed.to_string(), n.pack_seed.to_string());
        cmp(
            &mut data,
            "content checksum",
            format!("{:#010x}", s.content),
            format!("{:#010x}", n.content),
        );
        cmp(&mut plan, "policy", policy_name(s.policy), policy_name(n.policy));
        cmp(&mut plan, "seed", s.seed.to_string(), n.seed.to_string());
        cmp(
            &mut plan,
            "memory (slots per rank)",
            s.rank_slots.to_string(),
            n.rank_slots.to_string(),
        );
        cmp(&mut plan, "rank", s.rank.to_string(), n.rank.to_string());
        cmp(&mut plan, "world", s.world.to_string(), n.world.to_string());
        cmp(&mut plan, "drop_last", s.drop_last.to_string(), n.drop_last.to_string());
        cmp(
            &mut plan,
            "run length",
            s.run_length.to_string(),
            n.run_length.to_string(),
        );
        cmp(
            &mut plan,
            "pinned share (255ths, from the tier's limit)",
            s.pinned_share.to_string(),
            n.pinned_share.to_string(),
        );
        (data, plan)
    }

    /// Why a state saved with `self` cannot be restored on `now`, if so.
    pub fn mismatch(&self, now: &Fingerprint) -> Option<String> {
        let (data, plan) = self.differences(now);
        Self::describe(data, plan).map(|why| {
            if self.world != now.world {
                format!(
                    "{why} (to continue a world of {} ranks on {}, pass every rank's state to brand_open_at_elastic)",
                    self.world, now.world
                )
            } else {
                why
            }
        })
    }

    /// Why a state saved with `self` cannot be one of the states an elastic
    /// resume on `now` starts from, if so: the dataset and the order's
    /// settings must agree; rank, world and memory per rank may differ
    /// (the total memory is checked across all the states).
    pub fn elastic_mismatch(&self, now: &Fingerprint) -> Option<String> {
        let same_world = Fingerprint {
            rank: now.rank,
            world: now.world,
            rank_slots: now.rank_slots,
            ..*self
        };
        let (data, plan) = same_world.differences(now);
        Self::describe(data, plan)
    }

    /// The plan config the saved world ran (rank 0; memory in its slots).
    pub fn saved_plan(&self) -> Result<PlanConfig, String> {
        Ok(PlanConfig {
            memory: Memory::Slots(self.rank_slots),
            policy: policy_of(self.policy)
                .ok_or_else(|| format!("loader state has unknown policy #{}", self.policy))?,
            seed: self.seed,
            rank: 0,
            world: self.world,
            drop_last: self.drop_last,
            run_length: self.run_length,
            pinned_share: self.pinned_share,
        })
    }

    fn describe(data: Vec<String>, plan: Vec<String>) -> Option<String> {
        let mut parts = Vec::new();
        if !data.is_empty() {
            parts.push(format!("it was saved for a different dataset ({})", data.join(", ")));
        }
        if !plan.is_empty() {
            parts.push(format!(
                "it was saved with a different plan config ({})",
                plan.join(", ")
            ));
        }
        (!parts.is_empty()).then(|| format!("cannot restore the loader state: {}", parts.join("; ")))
    }
}

/// A saved loader: its state, bound to its dataset and plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub state: LoaderState,
    pub fingerprint: Fingerprint,
    /// Which samples of `state.epoch` were served, when the count is not
    /// the whole state: a job attached to a cache serves in an order that
    /// depends on timing. `None`: the first `state.served` samples of the
    /// plan's order.
    pub bitmap: Option<IdBits>,
}

impl Checkpoint {
    /// The size of a blob without a bitmap (version 1).
    pub const LEN: usize = 88;

    /// The size of a blob with the bitmap of a dataset of `samples`
    /// (version 2): the largest state a reader of it saves.
    pub fn len_with_bitmap(samples: u64) -> usize {
        LEN + 8 * samples.div_ceil(64) as usize
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        encode(self)
    }

    /// Parses a blob (either version); [`Error::InvalidState`] says what is
    /// wrong with it.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        decode(b).map_err(Error::InvalidState)
    }

    /// Whether this checkpoint can be restored on `now` (what the opening
    /// reader would save), whose epochs serve `steps` samples:
    /// [`Error::StateMismatch`] names every difference.
    pub fn check(&self, now: &Fingerprint, steps: u64) -> Result<()> {
        if let Some(why) = self.fingerprint.mismatch(now) {
            return Err(Error::StateMismatch(why));
        }
        if let Some(ids) = &self.bitmap
            && ids.samples() != self.fingerprint.samples
        {
            return Err(Error::InvalidState(format!(
                "loader state has a served bitmap of {} samples for a dataset of {}",
                ids.samples(),
                self.fingerprint.samples
            )));
        }
        if self.state.served > steps {
            return Err(Error::InvalidState(format!(
                "loader state has {} samples served of an epoch of {steps}",
                self.state.served
            )));
        }
        Ok(())
    }
}

const LEN: usize = Checkpoint::LEN;

/// Where an open starts.
#[derive(Debug, Clone)]
pub enum Resume {
    /// At this state (`LoaderState::default()`: the first epoch's start).
    At(LoaderState),
    /// Where a saved loader of this rank stopped: its dataset and plan must
    /// be this one's ([`Error::StateMismatch`] says what differs).
    Checkpoint(Checkpoint),
    /// Where a whole saved world stopped: the checkpoints of every one of
    /// its ranks, in any order, saved at one global step; any number of
    /// ranks, the same total memory (elastic resume, [`crate::elastic`]).
    Elastic(Vec<Checkpoint>),
    /// As `Elastic`, from a world already put together.
    World(SavedWorld),
}

impl From<LoaderState> for Resume {
    fn from(s: LoaderState) -> Self {
        Resume::At(s)
    }
}

impl From<Checkpoint> for Resume {
    fn from(c: Checkpoint) -> Self {
        Resume::Checkpoint(c)
    }
}

impl From<SavedWorld> for Resume {
    fn from(w: SavedWorld) -> Self {
        Resume::World(w)
    }
}

/// Where an open begins: this rank's state, and the global position of the
/// world (what a multi-node job starts its nodes at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    pub state: LoaderState,
    pub global: GlobalPosition,
}

impl Resume {
    /// Where an open of `planner`'s plan over `ds` begins; `now` is what its
    /// checkpoints will say. The checks every entry point gets.
    pub fn start(self, ds: &Dataset, planner: &Planner, now: &Fingerprint) -> Result<Start> {
        let (plan, geo) = (planner.config(), planner.geometry());
        let saved = match self {
            Resume::At(state) => {
                return Ok(Start {
                    state,
                    global: GlobalPosition {
                        epoch: state.epoch,
                        position: state.served.saturating_mul(geo.world as u64),
                    },
                });
            }
            Resume::Checkpoint(c) => {
                c.check(now, geo.steps)?;
                if c.bitmap.is_some() {
                    return Err(Error::InvalidState(format!(
                        "this state holds the samples a job attached to a cache served in epoch {} (a bitmap, not a position in the plan's order): open it through brand_reader::Reader, which resumes it attached or alone",
                        c.state.epoch
                    )));
                }
                return Resume::At(c.state).start(ds, planner, now);
            }
            Resume::Elastic(checkpoints) => saved_world(&checkpoints, now)?,
            Resume::World(saved) => saved,
        };
        let global = global_position(&ds.index, &saved, planner).map_err(|e| match e {
            Error::Config(why) => Error::StateMismatch(why),
            e => e,
        })?;
        Ok(Start {
            state: global.rank_state(plan.rank, plan.world, geo.steps),
            global,
        })
    }
}

/// The saved world of every rank's checkpoint, checked against `now` (what
/// this loader would save): the dataset and the order's settings must agree
/// and the checkpoints must be of ranks 0..W of one world, each once.
fn saved_world(saved: &[Checkpoint], now: &Fingerprint) -> Result<SavedWorld> {
    let mismatch = Error::StateMismatch;
    for (i, c) in saved.iter().enumerate() {
        if c.bitmap.is_some() {
            return Err(Error::InvalidState(format!(
                "state {i} is a job's attached to a cache (the samples it served in epoch {}, not a position in a plan's order): an elastic resume continues a world's plan; resume that job with one state (brand_open_at)",
                c.state.epoch
            )));
        }
        if let Some(why) = c.fingerprint.elastic_mismatch(now) {
            return Err(mismatch(format!("state {i}: {why}")));
        }
    }
    let Some(first) = saved.first().map(|c| c.fingerprint) else {
        return Err(Error::InvalidState(
            "no states to resume from (every rank's state is needed)".into(),
        ));
    };
    let world = first.world;
    if world as usize != saved.len() {
        return Err(mismatch(format!(
            "cannot restore the loader states: {} states given, of a world of {world} ranks (every rank's state is needed)",
            saved.len()
        )));
    }
    let mut states = vec![None; world as usize];
    for (i, c) in saved.iter().enumerate() {
        let f = &c.fingerprint;
        if f.world != world || f.rank_slots != first.rank_slots {
            return Err(mismatch(format!(
                "cannot restore the loader states: state {i} is of a world of {} ranks with {} slots per rank, state 0 of {world} with {}",
                f.world, f.rank_slots, first.rank_slots
            )));
        }
        match states.get_mut(f.rank as usize) {
            Some(slot @ None) => *slot = Some(c.state),
            _ => {
                return Err(mismatch(format!(
                    "cannot restore the loader states: rank {} appears twice (state {i})",
                    f.rank
                )));
            }
        }
    }
    Ok(SavedWorld {
        plan: first.saved_plan().map_err(Error::InvalidState)?,
        states: states.into_iter().flatten().collect(),
    })
}

fn encode(c: &Checkpoint) -> Vec<u8> {
    let (state, f) = (c.state, &c.fingerprint);
    let words = c.bitmap.as_ref().map_or(&[][..], IdBits::words);
    let (version, len) = match c.bitmap {
        None => (VERSION, LEN),
        Some(_) => (VERSION_BITMAP, LEN + 8 * words.len()),
    };
    let mut b = vec![0u8; len];
    let mut put = |at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &MAGIC);
    put(8, &version.to_le_bytes());
    // An attached job's samples have u32 ids (the cache's wire), so its
    // bitmap is at most 512 MiB: the length fits.
    put(12, &u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    put(16, &state.epoch.to_le_bytes());
    put(24, &state.served.to_le_bytes());
    put(32, &f.samples.to_le_bytes());
    put(40, &f.chunk_size.to_le_bytes());
    put(44, &f.content.to_le_bytes());
    put(48, &f.pack_seed.to_le_bytes());
    put(56, &f.rank_slots.to_le_bytes());
    put(64, &f.seed.to_le_bytes());
    put(72, &f.rank.to_le_bytes());
    put(76, &f.world.to_le_bytes());
    // A run length is 1..=64 (checked when the plan is made): fits a byte.
    put(
        80,
        &[
            f.policy,
            f.drop_last as u8,
            f.run_length.saturating_sub(1) as u8,
            f.pinned_share,
        ],
    );
    for (i, w) in words.iter().enumerate() {
        put(84 + 8 * i, &w.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b[..len - 4]);
    b[len - 4..].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Parses a blob; the error says what is wrong with it.
fn decode(b: &[u8]) -> Result<Checkpoint, String> {
    if b.len() < 16 || b[..8] != MAGIC {
        return Err(format!(
            "not a brand loader state ({} bytes without the \"BRDSTATE\" magic)",
            b.len()
        ));
    }
    let version = u32_at(b, 8);
    if version != VERSION && version != VERSION_BITMAP {
        return Err(format!(
            "loader state version {version}; this library reads versions {VERSION} and {VERSION_BITMAP}"
        ));
    }
    let len = u32_at(b, 12) as usize;
    let fits = match version {
        VERSION => len == LEN,
        _ => len > LEN && (len - LEN).is_multiple_of(8),
    };
    if !fits || b.len() != len {
        return Err(format!(
            "loader state is {} bytes (its header says {len}); version {VERSION} states are {LEN}, version {VERSION_BITMAP} states 88 + 8 per 64 samples",
            b.len()
        ));
    }
    let (stored, computed) = (u32_at(b, len - 4), crc32c::crc32c(&b[..len - 4]));
    if stored != computed {
        return Err(format!(
            "loader state is damaged: crc32c {computed:#010x}, the state says {stored:#010x}"
        ));
    }
    let pins = b[80] == policy_code(Policy::Tiered);
    if b[81] > 1 || b[82] as u32 >= brand_plan::MAX_RUN_LENGTH || (b[83] != 0 && !pins) {
        return Err("loader state has invalid flag bytes".to_string());
    }
    let state = LoaderState {
        epoch: u64_at(b, 16),
        served: u64_at(b, 24),
    };
    let f = Fingerprint {
        samples: u64_at(b, 32),
        chunk_size: u32_at(b, 40),
        content: u32_at(b, 44),
        pack_seed: u64_at(b, 48),
        rank_slots: u64_at(b, 56),
        seed: u64_at(b, 64),
        rank: u32_at(b, 72),
        world: u32_at(b, 76),
        policy: b[80],
        drop_last: b[81] == 1,
        run_length: b[82] as u32 + 1,
        pinned_share: b[83],
    };
    let bitmap = (version == VERSION_BITMAP)
        .then(|| bitmap_of(&b[84..len - 4], &f, state))
        .transpose()?;
    Ok(Checkpoint {
        state,
        fingerprint: f,
        bitmap,
    })
}

/// The served bitmap of a version 2 blob, checked against its header.
fn bitmap_of(bytes: &[u8], f: &Fingerprint, state: LoaderState) -> Result<IdBits, String> {
    let samples = f.samples;
    if bytes.len() as u64 / 8 != samples.div_ceil(64) {
        return Err(format!(
            "loader state has a served bitmap of {} bytes for {samples} samples (needs {})",
            bytes.len(),
            samples.div_ceil(64) * 8
        ));
    }
    let words = bytes.chunks_exact(8).map(|c| u64_at(c, 0)).collect();
    let ids = IdBits::from_words(words, samples).map_err(|e| format!("loader state's served bitmap {e}"))?;
    if ids.len() != state.served {
        return Err(format!(
            "loader state's served bitmap marks {} samples, its count says {}",
            ids.len(),
            state.served
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp() -> Fingerprint {
        Fingerprint {
            samples: 1000,
            chunk_size: 16,
            content: 0xdead_beef,
            pack_seed: 7,
            rank_slots: 128,
            seed: 3,
            rank: 1,
            world: 4,
            policy: 2,
            drop_last: true,
            run_length: 3,
            pinned_share: 0,
        }
    }

    fn at(state: LoaderState, bitmap: Option<IdBits>) -> Checkpoint {
        Checkpoint {
            state,
            fingerprint: fp(),
            bitmap,
        }
    }

    #[test]
    fn round_trips_and_has_the_documented_layout() {
        let c = at(LoaderState { epoch: 5, served: 77 }, None);
        let b = encode(&c);
        assert_eq!(b.len(), 88);
        assert_eq!(&b[..8], b"BRDSTATE");
        assert_eq!(u32_at(&b, 8), 1);
        assert_eq!(u32_at(&b, 12), 88);
        assert_eq!((u64_at(&b, 16), u64_at(&b, 24)), (5, 77));
        assert_eq!(u64_at(&b, 32), 1000);
        assert_eq!((b[80], b[81]), (2, 1));
        assert_eq!(decode(&b), Ok(c));
    }

    #[test]
    fn a_tiered_state_keeps_its_pinned_share_and_no_other_policy_has_one() {
        let tiered = Fingerprint {
            policy: policy_code(Policy::Tiered),
            pinned_share: 77,
            ..fp()
        };
        let c = Checkpoint {
            state: LoaderState { epoch: 1, served: 9 },
            fingerprint: tiered,
            bitmap: None,
        };
        let mut b = encode(&c);
        assert_eq!(b[83], 77);
        assert_eq!(decode(&b), Ok(c));
        let other = Fingerprint {
            pinned_share: 78,
            ..tiered
        };
        let why = tiered.mismatch(&other).unwrap_or_default();
        assert!(why.contains("pinned share"), "{why}");
        // A pinned share under another policy is not a state this library wrote.
        b[80] = 2;
        let crc = crc32c::crc32c(&b[..84]);
        b[84..].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&b).is_err());
    }

    /// Samples 0, 63, 64 and 999 of 1000 (16 words) served.
    fn bitmap() -> IdBits {
        let mut ids = IdBits::new(1000);
        for id in [0, 63, 64, 999] {
            ids.insert(id);
        }
        ids
    }

    #[test]
    fn a_bitmap_state_is_version_2_with_the_bitmap_after_the_header() {
        let c = at(LoaderState { epoch: 2, served: 4 }, Some(bitmap()));
        let b = encode(&c);
        assert_eq!(b.len(), Checkpoint::len_with_bitmap(1000));
        assert_eq!(b.len(), 88 + 16 * 8);
        assert_eq!((u32_at(&b, 8), u32_at(&b, 12) as usize), (2, b.len()));
        assert_eq!(u64_at(&b, 84), 1 | 1 << 63);
        assert_eq!(u64_at(&b, 92), 1);
        assert_eq!(u64_at(&b, 84 + 15 * 8), 1 << (999 % 64));
        assert_eq!(u32_at(&b, b.len() - 4), crc32c::crc32c(&b[..b.len() - 4]));
        assert_eq!(decode(&b), Ok(c));
    }

    /// A version 2 blob with its crc made right again after `edit`: what a
    /// careless writer (not a damaged copy) would produce.
    fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> Result<Checkpoint, String> {
        let mut b = encode(&at(LoaderState { epoch: 2, served: 4 }, Some(bitmap())));
        edit(&mut b);
        let n = b.len();
        let crc = crc32c::crc32c(&b[..n - 4]);
        b[n - 4..].copy_from_slice(&crc.to_le_bytes());
        decode(&b)
    }

    #[test]
    fn a_bitmap_that_disagrees_with_its_header_is_refused_naming_what() {
        let count = edited(|b| b[24] = 5).expect_err("count");
        assert!(count.contains("marks 4 samples, its count says 5"), "{count}");
        let past = edited(|b| {
            let at = 84 + 15 * 8 + 7;
            b[at] |= 0x80;
        })
        .expect_err("past the end");
        assert!(
            past.contains("bitmap marks sample 1023, past the dataset's 1000"),
            "{past}"
        );
        let short = edited(|b| {
            b.truncate(b.len() - 8);
            let n = b.len() as u32;
            b[12..16].copy_from_slice(&n.to_le_bytes());
        })
        .expect_err("a word short");
        assert!(short.contains("120 bytes for 1000 samples (needs 128)"), "{short}");
    }

    #[test]
    fn a_bitmap_of_another_number_of_samples_is_not_restored() {
        let c = at(LoaderState { epoch: 2, served: 0 }, Some(IdBits::new(999)));
        let e = c.check(&fp(), 1000).expect_err("999 of 1000").to_string();
        assert!(e.contains("served bitmap of 999 samples for a dataset of 1000"), "{e}");
        assert!(
            at(LoaderState { epoch: 2, served: 4 }, Some(bitmap()))
                .check(&fp(), 1000)
                .is_ok()
        );
    }

    #[test]
    fn every_damage_is_refused_with_a_reason() {
        for good in [
            encode(&at(LoaderState { epoch: 1, served: 2 }, None)),
            encode(&at(LoaderState { epoch: 2, served: 4 }, Some(bitmap()))),
        ] {
            let n = good.len();
            assert!(decode(&good[..40]).is_err_and(|e| e.contains("40 bytes")));
            assert!(decode(b"hello").is_err_and(|e| e.contains("not a brand loader state")));
            for i in 16..n {
                let mut b = good.clone();
                b[i] ^= 0x10;
                assert!(decode(&b).is_err_and(|e| e.contains("damaged")), "byte {i} of {n}");
            }
            let mut v3 = good.clone();
            v3[8] = 3;
            assert!(decode(&v3).is_err_and(|e| e.contains("version 3")));
            let mut longer = good.clone();
            longer.push(0);
            assert!(decode(&longer).is_err_and(|e| e.contains(&format!("{} bytes", n + 1))));
        }
        // A version 1 blob relabelled 2 has no bitmap: its size is wrong.
        let mut v2 = encode(&at(LoaderState { epoch: 1, served: 2 }, None));
        v2[8] = 2;
        assert!(decode(&v2).is_err_and(|e| e.contains("88 + 8 per 64 samples")));
    }

    #[test]
    fn mismatches_name_each_field() {
        assert_eq!(fp().mismatch(&fp()), None);
        let mut other = fp();
        other.samples = 999;
        other.seed = 4;
        other.policy = 0;
        let m = fp().mismatch(&other).unwrap_or_default();
        assert!(
            m.contains("different dataset (samples 1000 in the state, 999 now)"),
            "{m}"
        );
        assert!(m.contains("policy direct in the state, brand now"), "{m}");
        assert!(m.contains("seed 3 in the state, 4 now"), "{m}");
    }
}
