//! brand-io: the I/O engine. It executes the plan's reads (DESIGN.md §4) with
//! O_DIRECT through io_uring (or, where io_uring is refused, threads doing
//! `pread`) and knows nothing of sampling: what to read comes from the
//! loader, how to read it is decided here: the read gap (set, or measured
//! by [`probe`]) and so the extents of each read
//! ([`ReadSession::extents`], by [`brand_format::extents`]).
//!
//! * [`config`]: the settings ([`IoConfig`], [`ReadGapSetting`],
//!   [`IoBackend`], [`EngineConfig`](config::EngineConfig)).
//! * [`engine`]: the [`Engine`](engine::Engine): starts a backend, takes
//!   jobs, hands back completions.
//! * [`probe`]: `read_gap = auto`, measured through an engine.
//! * [`session`]: a [`ReadSession`]: an engine, the resolved read gap and
//!   the reads in flight, each with the caller's payload (what the loader
//!   and multi-node storage do around the engine).
//!
//! A dataset in object storage is read by a third backend, `objects`
//! (ranged GETs through brand-store), behind the same jobs and completions.
//!
//! Inside, the two file backends (`uring`, `threads`) share only the vocabulary
//! modules: `job` (what passes between the engine and a backend), `read`
//! (reading one extent completely), `files` (the segment file cache) and
//! `pool` (the read buffer pool); record decoding is
//! [`brand_format::decode`].

pub mod config;
pub mod engine;
mod files;
mod job;
mod objects;
mod page_buf;
mod pool;
pub mod probe;
mod read;
pub mod session;
mod threads;
pub mod tier;
mod uring;

pub use config::{GetsInFlight, IoBackend, IoConfig, ReadGapSetting, StoreSettings};
pub use session::ReadSession;
