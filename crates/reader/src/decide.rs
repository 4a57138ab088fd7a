//! The settings an open leaves to brand (`read_gap = "auto"`, `run_length =
//! "auto"`), decided here once for the dataset and passed down as decided
//! values: the loader, a node's storage and the cache process take numbers
//! and decide nothing. (The io backend is decided where it can only be: the
//! engine tries io_uring when it starts. Decode threads default to what the
//! cores leave when the configuration is made. Memory shared by a process's
//! workers: [`crate::workers`].)

use std::sync::Arc;

use brand_format::Dataset;
use brand_format::error::Result;
use brand_format::extents::ReadGap;
use brand_loader::{LoaderConfig, ReadGapSetting, RunLength};

/// How the opened reader uses its plan, which says what `run_length =
/// "auto"` may become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A loader alone, or the cache process: it reads storage, whose read
    /// gap decides the run length.
    Reads,
    /// A node of a multi-node job (its plan must be the same on every
    /// node), a job attached to a cache (its plan only binds its
    /// checkpoints: the cache fills by its own), or a loader resuming an
    /// attached job's state (it keeps the plan the job saved with): `auto`
    /// plans runs of 1.
    Keeps,
}

/// `cfg` with every automatic setting decided for `ds`, opened as
/// `opening`: the configuration checked, `read_gap = "auto"` measured (the
/// probe is cached per device) where this open reads storage, and
/// `run_length = "auto"` the runs that read gap makes worth it (1 where
/// `opening` keeps its plan). Decided values pass through as they are, so a
/// decided configuration decides nothing again.
pub fn decide(ds: &Arc<Dataset>, cfg: &LoaderConfig, opening: Opening) -> Result<LoaderConfig> {
    cfg.check()?;
    let mut cfg = cfg.clone();
    // An attached job reads nothing: it has no read gap to measure.
    let reads = cfg.cache.is_none();
    // The read gap this open reads with: an attached job's, never
    // measured, stays `auto` in its configuration and counts as whole.
    let gap = match cfg.io.read_gap {
        ReadGapSetting::Auto if reads => {
            let engine = cfg.io.engine_config(ds, cfg.readahead_bytes);
            let gap = brand_io::session::resolve_gap(ds, &engine, ReadGapSetting::Auto)?;
            cfg.io.read_gap = gap.into();
            gap
        }
        ReadGapSetting::Bytes(b) => ReadGap::Bytes(b),
        ReadGapSetting::Whole | ReadGapSetting::Auto => ReadGap::Whole,
    };
    let runs = match (cfg.run_length, opening) {
        (RunLength::Records(n), _) => n,
        (RunLength::Auto, Opening::Keeps) => 1,
        (RunLength::Auto, Opening::Reads) => {
            let index = &ds.index;
            let mean = index.stored_lens().map(|l| l as f64).sum::<f64>() / index.samples().max(1) as f64;
            let runs = brand_io::probe::run_length(gap, mean, index.chunk_size());
            tracing::info!("run_length auto: {runs} (read gap {gap:?}, mean stored sample {mean:.0} bytes)");
            runs
        }
    };
    cfg.run_length = RunLength::Records(runs);
    cfg.plan.run_length = runs;
    cfg.pin(ds);
    Ok(cfg)
}
