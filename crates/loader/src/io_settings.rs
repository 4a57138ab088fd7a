//! The engine's settings as the loader takes them (how the plan's reads
//! are made: they never change what is served).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
use brand_format::extents::ReadGap;
use brand_io::engine::{Engine, EngineConfig, IoBackend};

/// How to choose the read gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadGapSetting {
    /// Read whole chunks (the paper).
    Whole,
    /// Read only filled records, merging gaps up to this many bytes.
    Bytes(u64),
    /// Measure the device once and choose.
    Auto,
}

impl std::str::FromStr for ReadGapSetting {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "whole" => Ok(ReadGapSetting::Whole),
            "auto" => Ok(ReadGapSetting::Auto),
            n => brand_format::units::parse_bytes(n)
                .map(ReadGapSetting::Bytes)
                .map_err(|why| Error::config(format!("read gap {s:?}: {why}; expected whole, auto or a byte count"))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct IoConfig {
    pub queue_depth: usize,
    pub read_gap: ReadGapSetting,
    pub verify: bool,
    /// O_DIRECT reads (the default: the plan is the cache). `false` reads
    /// through the page cache, for datasets that stay in RAM between runs.
    pub direct: bool,
    pub io_backend: IoBackend,
    /// Threads decompressing zstd records read by io_uring (0: on the io
    /// thread). Default: the cores the io threads leave, at most 8
    /// ([`brand_io::engine::default_decode_threads`]).
    pub decode_threads: usize,
    /// A read that does not complete within this is an error naming its
    /// file and offset; Drop waits no longer than this for reads in flight.
    pub io_timeout: Duration,
}

impl IoConfig {
    /// The engine these settings ask for over `ds`, with at most
    /// `fixed_buffer_bytes` registered with io_uring.
    pub fn engine_config(&self, ds: &Dataset, fixed_buffer_bytes: u64) -> EngineConfig {
        let dataset_bytes: u64 = ds.manifest.segments.iter().map(|s| s.bytes).sum();
        EngineConfig {
            queue_depth: self.queue_depth,
            direct: self.direct,
            verify: self.verify,
            fixed_buffers: true,
            fixed_buffer_bytes: fixed_buffer_bytes.min(dataset_bytes),
            backend: self.io_backend,
            decode_threads: self.decode_threads,
            io_timeout: self.io_timeout,
        }
    }

    /// The read gap these settings ask for; `auto` probes the device through
    /// an engine like `engine` (same backend and registered buffers).
    pub fn read_gap(&self, ds: &Arc<Dataset>, engine: &Engine, fixed_buffer_bytes: u64) -> Result<ReadGap> {
        Ok(match self.read_gap {
            ReadGapSetting::Whole => ReadGap::Whole,
            ReadGapSetting::Bytes(b) => ReadGap::Bytes(b),
            ReadGapSetting::Auto => ReadGap::Bytes(brand_io::probe::auto_gap(
                ds.clone(),
                &EngineConfig {
                    backend: engine.backend(),
                    ..self.engine_config(ds, fixed_buffer_bytes)
                },
            )?),
        })
    }
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            queue_depth: 32,
            read_gap: ReadGapSetting::Auto,
            verify: true,
            direct: true,
            io_backend: IoBackend::Auto,
            decode_threads: brand_io::engine::default_decode_threads(),
            io_timeout: Duration::from_secs(60),
        }
    }
}
