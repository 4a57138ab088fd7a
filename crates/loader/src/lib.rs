//! brand-loader: runs the plan and hands out batches (DESIGN.md §5).
//!
//! The [`Loader`] walks its rank's plan, keeps the engine busy with the
//! plan's future reads (clairvoyant prefetch, bounded by `readahead`), and
//! hands out batches in the plan's served order. The served sequence is the
//! plan's and nothing else: I/O timing, the read gap, the queue depth and
//! the backend change only how fast it arrives.
//!
//! Memory is held in bytes: the plan's memory bound
//! ([`brand_plan::Geometry::rank_memory_bytes`], its slots in decoded
//! bytes) plus `readahead` bounds the decoded bytes the loader holds
//! (samples in memory plus reads in flight). The next epoch is planned in
//! the background and read ahead across the boundary within the same bounds
//! (not past a last epoch the caller names: [`Loader::set_last_epoch`]).
//!
//! Checkpoints ([`checkpoint`]) belong here: a loader's state saved as a
//! blob bound to its dataset and plan, restored on the same world or, from
//! every rank's checkpoint, on another one ([`elastic`]).
//!
//! Fork: a loader belongs to the process that opened it (its engine's
//! threads do not survive `fork()`). Used in a forked child it fails at
//! once with an error; open a new loader in the child instead.
//!
//! Modules: [`config`] (the loader's keys), [`batch`], [`checkpoint`],
//! [`elastic`], [`stats`]; inside: `planning` (plan events, the next epoch
//! planned in the background), `held` (samples in memory), `deferred` (a
//! start's first fill, read record by record as each comes due) and
//! `loader` (the walk itself, reading through a [`brand_io::ReadSession`]).

pub mod batch;
pub mod checkpoint;
pub mod config;
mod deferred;
pub mod elastic;
mod held;
mod loader;
mod planning;
pub mod stats;

pub use batch::{Batch, SampleBytes, SampleRef};
pub use brand_io::{IoBackend, IoConfig, ReadGapSetting};
pub use checkpoint::{Checkpoint, Fingerprint, LoaderState, Resume, Start};
pub use config::{LoaderConfig, OnCorrupt, RunLength};
pub use deferred::{split_budget, worth_splitting};
pub use loader::Loader;
pub use planning::{EventSource, Events, plan_events};
pub use stats::Metrics;
