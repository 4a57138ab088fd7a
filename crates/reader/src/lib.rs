//! brand-reader: what every interface opens (the `brand` CLI, the C ABI and
//! through it the TF op, Python). It sits above the loader, the cache and
//! the multi-node mode, which do not know of each other, and decides for
//! them:
//!
//! - [`config`]: the one configuration path, [`Config::resolve`] (a TOML
//!   text, flags or keywords over it, the launcher's environment);
//! - [`decide`]: every setting left to brand (`read_gap`, `run_length =
//!   "auto"`), decided once for the dataset and passed down as numbers;
//! - [`reader`]: one [`Reader`] over a loader alone, a node of a multi-node
//!   job, or a job attached to a `brand cache`, chosen by the configuration;
//! - [`workers`]: a process's memory shared by ranks of its own (Python's
//!   DataLoader and Grain workers).

pub mod config;
pub mod decide;
pub mod reader;
pub mod workers;

pub use config::Config;
pub use decide::{Opening, decide};
pub use reader::Reader;
