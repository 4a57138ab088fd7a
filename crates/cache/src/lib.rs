//! brand-cache: several jobs on one machine share one read of a dataset
//! (Quiver's case, on Brand's idea; DESIGN.md §9).
//!
//! [`CacheHandle::start`] runs a cache (`brand cache`): one abstract memory
//! for a dataset in shared memory (a memfd), filled by one reader, served to
//! every job attached over a Unix socket. [`Attached`] is a job's side: what
//! the configuration key `cache = "PATH"` opens instead of a loader. Each
//! job serves every sample exactly once per epoch, in its own random order
//! (its seed), from whatever is in memory; a read feeds every job that
//! still needs its samples. Samples reach the jobs without a copy: the job
//! maps the cache's memory read-only and a batch's samples point into it
//! until the batch is dropped (then the job tells the cache).
//!
//! Modules: `server` (the cache: its socket and threads), `state` (what
//! the cache holds and decides), `fill` (its reader) and `cursor` (where it is in
//! its plan), `session` (a job's connection to it), `shared` (what the
//! threads share), `client` (a job), `wire` (the messages), `shm` (the
//! shared memory and descriptor passing), `arena` (where samples go in it).

mod arena;
mod client;
mod cursor;
mod fill;
mod server;
mod session;
mod shared;
mod shm;
mod state;
pub mod wire;

pub use client::{Attached, Served};
pub use server::{CacheConfig, CacheHandle, CachePolicy, budget_bytes};
pub use state::CacheReport;
