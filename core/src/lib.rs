//! brand: a training-data loader for datasets far larger than memory.
//!
//! Data flows one way (DESIGN.md §1): [`pack`] writes a dataset → `plan`
//! decides from metadata alone what is read and served → `io` executes the
//! reads → `loader` hands out batches.

pub mod dataset;
pub mod error;
pub mod format;
pub mod inspect;
pub mod io;
pub mod loader;
pub mod pack;
pub mod plan;
pub mod rng;
pub mod simulate;
pub mod synthetic;
pub mod units;
pub mod verify;

pub use dataset::Dataset;
pub use error::{Error, Result};
