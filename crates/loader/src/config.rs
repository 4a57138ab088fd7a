//! The loader's configuration as TOML: what `brand read --config`, the C ABI
//! (`brand_open`) and the TensorFlow op accept. Every key is optional; this
//! is the one table of keys (`brand read`'s flags set the same ones through
//! [`ConfigKeys::apply`]), and [`LoaderConfig::check`] range-checks each.
//!
//! ```toml
//! batch_size = 256      # 1..=1048576
//! memory = "10%"        # per rank: "10%" (0-100000 %), bytes ("4GiB", ≥ 1) or "N slots" (≥ 1)
//! policy = "brand"      # brand, brand-random, direct, chunk-shuffle, sequential
//! seed = 0              # any u64
//! rank = 0              # 0..world
//! world = 1             # 1..=65536
//! drop_last = false     # false: pad every rank to the same number of steps
//! readahead = "64MiB"   # planned reads issued ahead of consumption, 0..=1TiB
//! queue_depth = 32      # reads in flight, 1..=4096
//! read_gap = "auto"     # "whole" (paper), "auto" (probe the device) or bytes up to 1GiB, e.g. "16KiB"
//! verify = true         # check every record's crc32c
//! direct = true         # O_DIRECT; false reads through the page cache
//! io_backend = "auto"   # "auto" (io_uring, threads where refused), "uring" or "threads"
//! decode_threads = 2    # threads verifying/decompressing io_uring reads, 0..=64 (0: on the io thread)
//! io_timeout = 60       # seconds a read may take before it is an error, (0, 86400]
//! on_corrupt = "error"  # "error" (fail when the sample is due) or "skip" (leave it out, counted)
//! ```
//!
//! Byte counts go through the one parser, [`brand_format::units::parse_bytes`].

use serde::Deserialize;

use super::{IoBackend, IoConfig, LoaderConfig, OnCorrupt, ReadGapSetting};
use brand_format::error::{Error, Result};
use brand_plan::{Memory, PlanConfig, Policy};

/// The configuration keys, each optional: what a TOML text sets, and what
/// command-line flags set on top of it. [`apply`](Self::apply) is the one
/// place a key's value is parsed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigKeys {
    pub batch_size: Option<usize>,
    pub memory: Option<String>,
    pub policy: Option<String>,
    pub seed: Option<u64>,
    pub rank: Option<u32>,
    pub world: Option<u32>,
    pub drop_last: Option<bool>,
    pub readahead: Option<String>,
    pub queue_depth: Option<usize>,
    pub read_gap: Option<String>,
    pub verify: Option<bool>,
    pub direct: Option<bool>,
    pub io_backend: Option<String>,
    pub decode_threads: Option<usize>,
    pub io_timeout: Option<f64>,
    pub on_corrupt: Option<String>,
}

impl ConfigKeys {
    /// Sets the keys given here on `c`, then checks the result.
    pub fn apply(self, c: &mut LoaderConfig) -> Result<()> {
        if let Some(v) = self.batch_size {
            c.io.batch_size = v;
        }
        if let Some(v) = self.memory {
            c.plan.memory = v.parse()?;
        }
        if let Some(v) = self.policy {
            c.plan.policy = v.parse::<Policy>()?;
        }
        if let Some(v) = self.seed {
            c.plan.seed = v;
        }
        if let Some(v) = self.rank {
            c.plan.rank = v;
        }
        if let Some(v) = self.world {
            c.plan.world = v;
        }
        if let Some(v) = self.drop_last {
            c.plan.drop_last = v;
        }
        if let Some(v) = self.readahead {
            c.io.readahead_bytes =
                brand_format::units::parse_bytes(&v).map_err(|why| Error::config(format!("readahead {v:?}: {why}")))?;
        }
        if let Some(v) = self.queue_depth {
            c.io.queue_depth = v;
        }
        if let Some(v) = self.read_gap {
            c.io.read_gap = v.parse::<ReadGapSetting>()?;
        }
        if let Some(v) = self.verify {
            c.io.verify = v;
        }
        if let Some(v) = self.direct {
            c.io.direct = v;
        }
        if let Some(v) = self.io_backend {
            c.io.io_backend = v.parse::<IoBackend>()?;
        }
        if let Some(v) = self.decode_threads {
            c.io.decode_threads = v;
        }
        if let Some(v) = self.io_timeout {
            if !(v > 0.0 && v <= MAX_IO_TIMEOUT_SECS) {
                return Err(Error::config(format!("io_timeout {v} outside (0, 86400] seconds")));
            }
            c.io.io_timeout = std::time::Duration::from_secs_f64(v);
        }
        if let Some(v) = self.on_corrupt {
            c.io.on_corrupt = v.parse::<OnCorrupt>()?;
        }
        c.check()
    }
}

/// Default budget when none is given.
pub const DEFAULT_MEMORY: Memory = Memory::Percent(10.0);

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            plan: PlanConfig::new(DEFAULT_MEMORY),
            io: IoConfig::default(),
        }
    }
}

impl LoaderConfig {
    /// Parses the TOML text; keys not given keep their defaults.
    pub fn from_toml(text: &str) -> Result<Self> {
        let keys: ConfigKeys = toml::from_str(text).map_err(|e| {
            // One line that says where: the line number and its text.
            let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
            let line_no = text[..at].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            Error::config(format!("config line {line_no} `{line}`: {}", e.message().trim()))
        })?;
        let mut c = LoaderConfig::default();
        keys.apply(&mut c)?;
        Ok(c)
    }

    /// Rejects settings that cannot work, before anything is opened: every
    /// key against its range (module docs).
    pub fn check(&self) -> Result<()> {
        let (io, plan) = (&self.io, &self.plan);
        let outside =
            |key: &str, value: String, range: &str| Err(Error::config(format!("{key} {value} outside {range}")));
        if !(1..=MAX_BATCH_SIZE).contains(&io.batch_size) {
            return outside("batch_size", io.batch_size.to_string(), "1..=1048576");
        }
        match plan.memory {
            Memory::Percent(p) if !(p > 0.0 && p <= MAX_MEMORY_PERCENT) => {
                return outside("memory", format!("{p}%"), "(0, 100000] %");
            }
            Memory::Bytes(0) => return outside("memory", "0 bytes".into(), "1 byte and up"),
            Memory::Slots(0) => return outside("memory", "0 slots".into(), "1 slot and up"),
            _ => {}
        }
        if !(1..=MAX_WORLD).contains(&plan.world) {
            return outside("world", plan.world.to_string(), "1..=65536");
        }
        if plan.rank >= plan.world {
            return Err(Error::config(format!(
                "rank {} out of range for world {}",
                plan.rank, plan.world
            )));
        }
        if io.readahead_bytes > MAX_READAHEAD {
            return outside("readahead", io.readahead_bytes.to_string(), "0..=1TiB");
        }
        if !(1..=MAX_QUEUE_DEPTH).contains(&io.queue_depth) {
            return outside("queue_depth", io.queue_depth.to_string(), "1..=4096");
        }
        if io.decode_threads > MAX_DECODE_THREADS {
            return outside("decode_threads", io.decode_threads.to_string(), "0..=64");
        }
        let timeout = io.io_timeout.as_secs_f64();
        if !(timeout > 0.0 && timeout <= MAX_IO_TIMEOUT_SECS) {
            return outside("io_timeout", format!("{timeout}s"), "(0, 86400] seconds");
        }
        if let ReadGapSetting::Bytes(gap) = io.read_gap
            && gap > MAX_READ_GAP
        {
            return outside("read_gap", gap.to_string(), "0..=1GiB");
        }
        Ok(())
    }
}

const MAX_BATCH_SIZE: usize = 1 << 20;
const MAX_MEMORY_PERCENT: f64 = 100_000.0;
const MAX_WORLD: u32 = 1 << 16;
const MAX_READAHEAD: u64 = 1 << 40;
const MAX_QUEUE_DEPTH: usize = 4096;
const MAX_READ_GAP: u64 = 1 << 30;
const MAX_DECODE_THREADS: usize = 64;
const MAX_IO_TIMEOUT_SECS: f64 = 86_400.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let c = LoaderConfig::from_toml(
            r#"batch_size = 8
               memory = "512MiB"
               policy = "chunk-shuffle"
               seed = 3
               rank = 1
               world = 2
               drop_last = true
               readahead = "1MiB"
               queue_depth = 4
               read_gap = "16KiB"
               verify = false
               direct = false
               io_backend = "threads"
               decode_threads = 0
               io_timeout = 2.5
               on_corrupt = "skip""#,
        )
        .expect("valid");
        assert_eq!(c.io.batch_size, 8);
        assert_eq!(c.plan.memory, Memory::Bytes(512 << 20));
        assert_eq!(c.plan.policy, Policy::ChunkShuffle);
        assert_eq!(
            (c.plan.seed, c.plan.rank, c.plan.world, c.plan.drop_last),
            (3, 1, 2, true)
        );
        assert_eq!((c.io.readahead_bytes, c.io.queue_depth), (1 << 20, 4));
        assert_eq!(c.io.read_gap, ReadGapSetting::Bytes(16 << 10));
        assert!(!c.io.verify);
        assert!(!c.io.direct);
        assert_eq!(c.io.io_backend, IoBackend::Threads);
        assert_eq!(c.io.decode_threads, 0);
        assert_eq!(c.io.io_timeout, std::time::Duration::from_millis(2500));
        assert_eq!(c.io.on_corrupt, OnCorrupt::Skip);
        let d = LoaderConfig::from_toml("").expect("empty is all defaults");
        assert_eq!(d.plan.memory, DEFAULT_MEMORY);
        assert_eq!(d.io.read_gap, ReadGapSetting::Auto);
        assert!(d.io.direct);
        assert_eq!(d.io.io_backend, IoBackend::Auto);
        assert_eq!(d.io.on_corrupt, OnCorrupt::Error);
        assert_eq!(d.io.io_timeout, std::time::Duration::from_secs(60));
        assert_eq!(
            LoaderConfig::from_toml("io_timeout = 60")
                .expect("int")
                .io
                .io_timeout
                .as_secs(),
            60
        );
    }

    #[test]
    fn rejects_bad_settings_by_name() {
        for (text, word) in [
            ("batch_size = 0", "batch_size"),
            ("rank = 2\nworld = 2", "rank 2"),
            ("policy = \"lru\"", "lru"),
            ("memory = \"lots\"", "lots"),
            ("read_gap = \"sometimes\"", "sometimes"),
            ("readahead = \"x\"", "readahead"),
            ("queue_depth = 0", "queue_depth"),
            ("queue_depth = 4097", "queue_depth"),
            ("batch_size = 1048577", "batch_size"),
            ("batch_size = 18446744073709551615", "batch_size"),
            ("memory = \"0%\"", "memory"),
            ("memory = \"100001%\"", "memory"),
            ("memory = \"0\"", "memory"),
            ("memory = \"0 slots\"", "memory"),
            ("world = 0", "world"),
            ("world = 65537", "world"),
            ("readahead = \"2TiB\"", "readahead"),
            ("read_gap = \"2GiB\"", "read_gap"),
            ("read_gap = \"-1\"", "read gap"),
            ("bogus = 1", "bogus"),
            ("io_backend = \"epoll\"", "io_backend"),
            ("decode_threads = 65", "decode_threads"),
            ("io_timeout = 0", "io_timeout"),
            ("io_timeout = -1", "io_timeout"),
            ("io_timeout = 86401", "io_timeout"),
            ("on_corrupt = \"ignore\"", "on_corrupt"),
            ("batch_size = \"8\"", "batch_size"),
        ] {
            let e = LoaderConfig::from_toml(text).expect_err(text).to_string();
            assert!(e.contains(word), "{text}: {e}");
        }
    }
}
