//! The loader's configuration: its keys of brand's one key table, each
//! parsed in [`LoaderConfig::set`] and range-checked in
//! [`LoaderConfig::check`], nowhere else.
//!
//! Every entry point resolves its configuration through one function,
//! `brand_reader::Config::resolve` (a TOML text, then flags or keywords over
//! it, then the launcher's environment); that function takes the multi-node
//! keys out (the multi-node crate owns them) and hands the rest to
//! [`LoaderConfig::from_table`]. The loader's keys, every one optional:
//!
//! ```toml
//! batch_size = 256      # 1..=1048576
//! memory = "10%"        # per rank: "10%" (0-100000 %), bytes ("4GiB", ≥ 1) or "N slots" (≥ 1)
//! policy = "brand"      # brand, brand-random, direct, chunk-shuffle, sequential, tiered
//! seed = 0              # 0..=2^63-1 (a TOML integer)
//! rank = 0              # 0..world
//! world = 1             # 1..=65536
//! drop_last = false     # false: pad every rank to the same number of steps
//! readahead = "64MiB"   # bytes of planned reads in flight ahead of consumption, 0..=1TiB
//! queue_depth = 32      # reads in flight, 1..=4096
//! read_gap = "auto"     # "whole" (paper), "auto" (probe the device) or bytes up to 1GiB, e.g. "16KiB"
//! run_length = 1        # brand policies: refills fill runs of this many neighbouring records, read in one
//!                       # request: 1..=64 (1: record by record, the paper) or "auto" (from the read gap;
//!                       # the order then depends on the device, so it is not the default)
//! verify = true         # check every record's crc32c
//! direct = true         # O_DIRECT; false reads through the page cache
//! io_backend = "auto"   # "auto" (io_uring, threads where refused), "uring" or "threads"
//! decode_threads = 2    # threads decompressing zstd records read by io_uring, 0..=64 (0: on the io thread);
//!                       # default: the cores the (at most 2) io threads leave, at most 8
//! io_timeout = 60       # how long a read may take before it is an error, (0, 86400] s ("60s", "2m" or seconds)
//! gets_in_flight = "auto" # a dataset at a URL: ranged GETs in flight, "auto" (sized as they complete: enough
//!                       # to fill the link) or at most 1..=1024; halved while the store throttles
//! get_size = "8MiB"     # a dataset at a URL: neighbouring reads merge into GETs of at most this, 64KiB..=1GiB
//! stall_timeout = 10    # a dataset at a URL: time without a byte ("10s", "500ms" or seconds) before a GET is retried at most
//!                       # (less once first bytes are timed: 8 × their slowest 1 %, ≥ 1 s), (0, 3600]
//! retries = 10          # a dataset at a URL: retries of one request (backing off from 100 ms to 5 s) before its error, 0..=100
//! disk_cache = "/nvme/brand" # a dataset at a URL: keep its chunks in this directory on a local disk, shared by the
//!                       # machine's processes (fetched once, read from there after); none by default
//! disk_cache_limit = "500GiB" # the most that directory holds, every dataset in it together: bytes (≥ 1) or a share of
//!                       # the dataset ("50%", (0, 100]); default: what the disk has, leaving 10 % of it free
//! on_corrupt = "error"  # "error" (fail when the sample is due) or "skip" (leave it out, counted)
//! cache = "/run/brand/imagenet.sock"  # attach to the `brand cache` at this socket instead of reading storage
//! ```
//!
//! Byte counts go through the one parser, [`brand_format::units::parse_bytes`];
//! durations through [`brand_format::units::parse_duration`] (a number is
//! seconds), `peer_timeout` too.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use brand_format::error::{Error, Result};
use brand_plan::{Memory, PlanConfig};

use crate::IoConfig;

/// Everything a loader is configured with: the plan (what is read and
/// served), how the consumer takes it (batches, read-ahead, corrupt
/// records) and the engine (how it is read).
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub plan: PlanConfig,
    /// Samples per batch.
    pub batch_size: usize,
    /// Bytes of planned reads issued ahead of consumption; 0 reads only when
    /// a read is needed. Reads in flight also stop at two batches' worth
    /// (at least 512), whatever the bytes.
    pub readahead_bytes: u64,
    pub on_corrupt: OnCorrupt,
    pub io: IoConfig,
    /// The socket of a `brand cache` to attach to instead of reading
    /// storage (`brand_reader::Reader` opens an attached job then).
    pub cache: Option<std::path::PathBuf>,
    /// Where `plan.run_length` comes from.
    pub run_length: RunLength,
}

/// The `run_length` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// Chosen when a loader opens, from the read gap it resolves
    /// ([`brand_io::probe::run_length`]); until then `plan.run_length` is 1.
    Auto,
    /// This many (also in `plan.run_length`).
    Records(u32),
}

impl std::str::FromStr for RunLength {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim() == "auto" {
            return Ok(RunLength::Auto);
        }
        s.trim()
            .parse()
            .map(RunLength::Records)
            .map_err(|_| Error::config(format!("run_length {s:?}: expected auto or 1..=64")))
    }
}

/// What to do with a sample whose record is corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnCorrupt {
    /// Fail the batch it is due in; the batch is all or nothing, so the
    /// good samples before it are served again by the next call, after
    /// `start_epoch` (the state points at the first of them).
    Error,
    /// Leave it out of the epoch, count it (`skipped_corrupt`) and log it.
    Skip,
}

impl std::str::FromStr for OnCorrupt {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "error" => Ok(OnCorrupt::Error),
            "skip" => Ok(OnCorrupt::Skip),
            _ => Err(Error::config(format!("on_corrupt {s:?}: expected error or skip"))),
        }
    }
}

/// Default budget when none is given.
pub const DEFAULT_MEMORY: Memory = Memory::Percent(10.0);

/// The loader's keys, in the order the module docs list them.
pub const KEYS: [&str; 24] = [
    "batch_size",
    "memory",
    "policy",
    "seed",
    "rank",
    "world",
    "drop_last",
    "readahead",
    "queue_depth",
    "read_gap",
    "run_length",
    "verify",
    "direct",
    "io_backend",
    "decode_threads",
    "io_timeout",
    "gets_in_flight",
    "get_size",
    "stall_timeout",
    "retries",
    "disk_cache",
    "disk_cache_limit",
    "on_corrupt",
    "cache",
];

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            plan: PlanConfig::new(DEFAULT_MEMORY),
            batch_size: 256,
            readahead_bytes: 64 << 20,
            on_corrupt: OnCorrupt::Error,
            io: IoConfig::default(),
            cache: None,
            run_length: RunLength::Records(1),
        }
    }
}

/// A TOML text as a table of keys; a syntax error names its line.
pub fn parse_table(text: &str) -> Result<toml::Table> {
    toml::from_str(text).map_err(|e| {
        let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
        let line_no = text[..at].matches('\n').count() + 1;
        let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
        Error::config(format!("config line {line_no} `{line}`: {}", e.message().trim()))
    })
}

impl LoaderConfig {
    /// The defaults with every key of `table` set, then range-checked. A
    /// key that is not the loader's is an error naming it (the multi-node
    /// keys are taken out before, by `brand_reader::Config::resolve`).
    pub fn from_table(table: &toml::Table) -> Result<Self> {
        let mut c = LoaderConfig::default();
        for (key, value) in table {
            c.set(key, value)?;
        }
        c.check()?;
        Ok(c)
    }

    /// [`from_table`](Self::from_table) of a TOML text.
    pub fn from_toml(text: &str) -> Result<Self> {
        Self::from_table(&parse_table(text)?)
    }

    /// Sets one key from its value: the one place a key's value is parsed.
    /// Ranges are [`check`](Self::check)'s.
    pub fn set(&mut self, key: &str, value: &toml::Value) -> Result<()> {
        let v = Value { key, value };
        match key {
            "batch_size" => self.batch_size = v.whole()?,
            "memory" => self.plan.memory = v.text()?.parse()?,
            "policy" => self.plan.policy = v.text()?.parse()?,
            "seed" => self.plan.seed = v.whole()?,
            "rank" => self.plan.rank = v.whole()?,
            "world" => self.plan.world = v.whole()?,
            "drop_last" => self.plan.drop_last = v.flag()?,
            "readahead" => self.readahead_bytes = v.bytes()?,
            "queue_depth" => self.io.queue_depth = v.whole()?,
            "read_gap" => self.io.read_gap = v.text()?.parse()?,
            "run_length" => {
                self.run_length = match v.value {
                    toml::Value::Integer(_) => RunLength::Records(v.whole()?),
                    _ => v.text()?.parse()?,
                };
                if let RunLength::Records(n) = self.run_length {
                    self.plan.run_length = n;
                }
            }
            "verify" => self.io.verify = v.flag()?,
            "direct" => self.io.direct = v.flag()?,
            "io_backend" => self.io.backend = v.text()?.parse()?,
            "decode_threads" => self.io.decode_threads = v.whole()?,
            // The ranges are check()'s.
            "io_timeout" => self.io.io_timeout = v.duration()?,
            "gets_in_flight" => {
                self.io.store.gets_in_flight = match v.value {
                    toml::Value::Integer(_) => brand_io::GetsInFlight::Fixed(v.whole()?),
                    _ => v.text()?.parse()?,
                }
            }
            "get_size" => self.io.store.get_bytes = v.bytes()?,
            "stall_timeout" => self.io.store.stall_timeout = v.duration()?,
            "retries" => self.io.store.retries = v.whole()?,
            "disk_cache" => {
                let dir = v.text()?;
                if dir.is_empty() {
                    return Err(Error::config("disk_cache = \"\": expected a directory on a local disk"));
                }
                self.io.disk_cache = Some(dir.into());
            }
            "disk_cache_limit" => self.io.disk_cache_limit = Some(v.text()?.parse()?),
            "on_corrupt" => self.on_corrupt = v.text()?.parse()?,
            "cache" => {
                let path = v.text()?;
                if path.is_empty() {
                    return Err(Error::config(
                        "cache = \"\": expected the path of a brand cache's socket",
                    ));
                }
                self.cache = Some(path.into());
            }
            _ => {
                return Err(Error::config(format!(
                    "unknown key `{key}`: expected one of {}",
                    KEYS.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Decides what a tiered plan pins of `ds` from its tier's limit
    /// (`brand_io::IoConfig::pinned_share`); other policies pin nothing.
    pub fn pin(&mut self, ds: &brand_format::Dataset) {
        self.plan.pinned_share = match self.plan.policy {
            brand_plan::Policy::Tiered => self.io.pinned_share(ds),
            _ => 0,
        };
    }

    /// Rejects settings that cannot work, before anything is opened: every
    /// key against its range (module docs). The one range check.
    pub fn check(&self) -> Result<()> {
        let (io, plan) = (&self.io, &self.plan);
        let outside =
            |key: &str, value: String, range: &str| Err(Error::config(format!("{key} {value} outside {range}")));
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return outside("batch_size", self.batch_size.to_string(), "1..=1048576");
        }
        plan.memory.check()?;
        if !(1..=MAX_WORLD).contains(&plan.world) {
            return outside("world", plan.world.to_string(), "1..=65536");
        }
        if plan.rank >= plan.world {
            return Err(Error::config(format!(
                "rank {} out of range for world {}",
                plan.rank, plan.world
            )));
        }
        if self.readahead_bytes > MAX_READAHEAD {
            return outside("readahead", self.readahead_bytes.to_string(), "0..=1TiB");
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
        if let brand_io::GetsInFlight::Fixed(n) = io.store.gets_in_flight
            && !(1..=MAX_GETS_IN_FLIGHT).contains(&n)
        {
            return outside("gets_in_flight", n.to_string(), "auto or 1..=1024");
        }
        if !(MIN_GET_BYTES..=MAX_GET_BYTES).contains(&io.store.get_bytes) {
            return outside("get_size", io.store.get_bytes.to_string(), "64KiB..=1GiB");
        }
        let stall = io.store.stall_timeout.as_secs_f64();
        if !(stall > 0.0 && stall <= MAX_STALL_SECS) {
            return outside("stall_timeout", format!("{stall}s"), "(0, 3600] seconds");
        }
        if io.store.retries > MAX_RETRIES {
            return outside("retries", io.store.retries.to_string(), "0..=100");
        }
        if io.disk_cache_limit.is_some() && io.disk_cache.is_none() {
            return Err(Error::config(
                "disk_cache_limit without disk_cache: say which directory the tier is in",
            ));
        }
        if let RunLength::Records(n) = self.run_length
            && !(1..=brand_plan::MAX_RUN_LENGTH).contains(&n)
        {
            return outside("run_length", n.to_string(), "1..=64");
        }
        if let crate::ReadGapSetting::Bytes(gap) = io.read_gap
            && gap > MAX_READ_GAP
        {
            return outside("read_gap", gap.to_string(), "0..=1GiB");
        }
        Ok(())
    }
}

const MAX_BATCH_SIZE: usize = 1 << 20;
const MAX_WORLD: u32 = 1 << 16;
const MAX_READAHEAD: u64 = 1 << 40;
const MAX_QUEUE_DEPTH: usize = 4096;
const MAX_READ_GAP: u64 = 1 << 30;
const MAX_DECODE_THREADS: usize = 64;
const MAX_IO_TIMEOUT_SECS: f64 = 86_400.0;
const MAX_GETS_IN_FLIGHT: usize = 1024;
const MIN_GET_BYTES: u64 = 64 << 10;
const MAX_GET_BYTES: u64 = 1 << 30;
const MAX_STALL_SECS: f64 = 3_600.0;
/// More retries than this hold a request for most of an hour (5 s apart).
const MAX_RETRIES: u32 = 100;

/// A key's value, read as the type the key takes; errors name the key.
pub struct Value<'a> {
    pub key: &'a str,
    pub value: &'a toml::Value,
}

impl<'a> Value<'a> {
    fn wrong(&self, expected: &str) -> Error {
        Error::config(format!("{} = {}: expected {expected}", self.key, self.value))
    }

    /// A whole number that fits `T`.
    pub fn whole<T: TryFrom<i64>>(&self) -> Result<T> {
        let n = self.value.as_integer().ok_or_else(|| self.wrong("a whole number"))?;
        T::try_from(n).map_err(|_| Error::config(format!("{} {n} is out of range", self.key)))
    }

    pub fn text(&self) -> Result<&'a str> {
        self.value.as_str().ok_or_else(|| self.wrong("a string"))
    }

    pub fn flag(&self) -> Result<bool> {
        self.value.as_bool().ok_or_else(|| self.wrong("true or false"))
    }

    /// A byte count: a string with a unit ("64MiB") or a whole number.
    pub fn bytes(&self) -> Result<u64> {
        match self.value {
            toml::Value::Integer(_) => self.whole(),
            toml::Value::String(s) => {
                brand_format::units::parse_bytes(s).map_err(|why| Error::config(format!("{} {s:?}: {why}", self.key)))
            }
            _ => Err(self.wrong("a byte count such as \"64MiB\"")),
        }
    }

    /// A duration: a number of seconds, or a string with a unit ("30s",
    /// "500ms", "2m"), as every duration key reads it.
    pub fn duration(&self) -> Result<Duration> {
        let why = "more than 0 and at most 10^9 seconds";
        match self.value {
            toml::Value::Integer(n) => {
                brand_format::units::seconds(*n as f64).ok_or_else(|| Error::config(format!("{} {n}: {why}", self.key)))
            }
            toml::Value::Float(x) => {
                brand_format::units::seconds(*x).ok_or_else(|| Error::config(format!("{} {x}: {why}", self.key)))
            }
            toml::Value::String(s) => {
                brand_format::units::parse_duration(s).map_err(|e| Error::config(format!("{} {s:?}: {e}", self.key)))
            }
            _ => Err(self.wrong("a duration such as \"30s\" or a number of seconds")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReadGapSetting;
    use brand_plan::Policy;

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
               run_length = 4
               verify = false
               direct = false
               io_backend = "threads"
               decode_threads = 0
               io_timeout = 2.5
               gets_in_flight = 8
               get_size = "16MiB"
               stall_timeout = "500ms"
               disk_cache = "/nvme/brand"
               disk_cache_limit = "1.5TiB"
               on_corrupt = "skip"
               cache = "/run/brand/ds.sock""#,
        )
        .expect("valid");
        assert_eq!(c.io.disk_cache.as_deref(), Some(std::path::Path::new("/nvme/brand")));
        assert_eq!(
            c.io.disk_cache_limit,
            Some(brand_store::tier::TierLimit::Bytes(3 << 39))
        );
        let pct = LoaderConfig::from_toml("disk_cache = \"/t\"\ndisk_cache_limit = \"12.5%\"").expect("a share");
        assert_eq!(
            pct.io.disk_cache_limit,
            Some(brand_store::tier::TierLimit::Percent(12.5))
        );
        assert_eq!(c.cache.as_deref(), Some(std::path::Path::new("/run/brand/ds.sock")));
        assert_eq!(c.batch_size, 8);
        assert_eq!(c.plan.memory, Memory::Bytes(512 << 20));
        assert_eq!(c.plan.policy, Policy::ChunkShuffle);
        assert_eq!(
            (c.plan.seed, c.plan.rank, c.plan.world, c.plan.drop_last),
            (3, 1, 2, true)
        );
        assert_eq!((c.readahead_bytes, c.io.queue_depth), (1 << 20, 4));
        assert_eq!(c.io.read_gap, ReadGapSetting::Bytes(16 << 10));
        assert_eq!((c.run_length, c.plan.run_length), (RunLength::Records(4), 4));
        assert!(!c.io.verify);
        assert!(!c.io.direct);
        assert_eq!(c.io.backend, crate::IoBackend::Threads);
        assert_eq!(c.io.decode_threads, 0);
        assert_eq!(c.io.io_timeout, Duration::from_millis(2500));
        assert_eq!(
            (
                c.io.store.gets_in_flight,
                c.io.store.get_bytes,
                c.io.store.stall_timeout
            ),
            (brand_io::GetsInFlight::Fixed(8), 16 << 20, Duration::from_millis(500))
        );
        assert_eq!(c.on_corrupt, OnCorrupt::Skip);
        let d = LoaderConfig::from_toml("").expect("empty is all defaults");
        assert_eq!(d.plan.memory, DEFAULT_MEMORY);
        assert_eq!(d.io.read_gap, ReadGapSetting::Auto);
        assert_eq!(d.io.store.gets_in_flight, brand_io::GetsInFlight::Auto);
        let auto = LoaderConfig::from_toml("gets_in_flight = \"auto\"").expect("auto");
        assert_eq!(auto.io.store.gets_in_flight, brand_io::GetsInFlight::Auto);
        assert_eq!((d.run_length, d.plan.run_length), (RunLength::Records(1), 1));
        let auto = LoaderConfig::from_toml("run_length = \"auto\"").expect("auto");
        assert_eq!((auto.run_length, auto.plan.run_length), (RunLength::Auto, 1));
        assert_eq!(
            LoaderConfig::from_toml("run_length = \"8\"")
                .map(|c| c.plan.run_length)
                .ok(),
            Some(8)
        );
        for bad in [
            "run_length = 0",
            "run_length = 65",
            "run_length = \"some\"",
            "run_length = true",
        ] {
            let err = LoaderConfig::from_toml(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("run_length"), "{bad}: {err}");
        }
        assert!(LoaderConfig::from_toml("run_length = -1").is_err());
        assert!(d.io.direct);
        assert_eq!(d.io.backend, crate::IoBackend::Auto);
        assert_eq!(d.on_corrupt, OnCorrupt::Error);
        assert_eq!(d.io.io_timeout, Duration::from_secs(60));
        let int = LoaderConfig::from_toml("io_timeout = 60\nreadahead = 4096").expect("ints");
        assert_eq!((int.io.io_timeout.as_secs(), int.readahead_bytes), (60, 4096));
    }

    #[test]
    fn rejects_bad_settings_by_name() {
        for (text, word) in [
            ("cache = \"\"", "cache"),
            ("cache = 3", "cache"),
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
            ("batch_size = -1", "batch_size"),
            ("memory = \"0%\"", "memory"),
            ("memory = \"100001%\"", "memory"),
            ("memory = \"0\"", "memory"),
            ("memory = \"0 slots\"", "memory"),
            ("world = 0", "world"),
            ("world = 65537", "world"),
            ("readahead = \"2TiB\"", "readahead"),
            ("read_gap = \"2GiB\"", "read_gap"),
            ("read_gap = \"-1\"", "read gap"),
            ("bogus = 1", "unknown key `bogus`"),
            ("io_backend = \"epoll\"", "io_backend"),
            ("decode_threads = 65", "decode_threads"),
            ("io_timeout = 0", "io_timeout"),
            ("io_timeout = -1", "io_timeout"),
            ("io_timeout = 86401", "io_timeout"),
            ("io_timeout = \"soon\"", "io_timeout \"soon\": expected e.g."),
            ("stall_timeout = \"0s\"", "stall_timeout \"0s\""),
            ("stall_timeout = true", "stall_timeout"),
            ("gets_in_flight = 0", "gets_in_flight"),
            ("gets_in_flight = 1025", "gets_in_flight"),
            (
                "gets_in_flight = \"many\"",
                "gets_in_flight \"many\": expected \"auto\"",
            ),
            ("get_size = \"32KiB\"", "get_size"),
            ("get_size = \"2GiB\"", "get_size"),
            ("stall_timeout = 0", "stall_timeout"),
            ("stall_timeout = -1", "stall_timeout"),
            ("stall_timeout = 3601", "stall_timeout"),
            ("retries = 101", "retries 101 outside 0..=100"),
            ("disk_cache = \"\"", "disk_cache = \"\": expected a directory"),
            ("disk_cache = 3", "disk_cache"),
            ("disk_cache_limit = \"50%\"", "disk_cache_limit without disk_cache"),
            (
                "disk_cache = \"/t\"\ndisk_cache_limit = \"0\"",
                "disk_cache_limit \"0\": at least one byte",
            ),
            ("disk_cache = \"/t\"\ndisk_cache_limit = \"0%\"", "(0, 100] %"),
            ("disk_cache = \"/t\"\ndisk_cache_limit = \"101%\"", "(0, 100] %"),
            (
                "disk_cache = \"/t\"\ndisk_cache_limit = \"lots\"",
                "disk_cache_limit \"lots\": not a byte count",
            ),
            ("retries = -1", "retries -1 is out of range"),
            ("retries = \"many\"", "retries"),
            ("on_corrupt = \"ignore\"", "on_corrupt"),
            ("batch_size = \"8\"", "batch_size"),
            ("verify = 1", "verify"),
            ("nodes = [\"h:1\", \"h:2\"]", "unknown key `nodes`"),
        ] {
            let e = LoaderConfig::from_toml(text).expect_err(text).to_string();
            assert!(e.contains(word), "{text}: {e}");
        }
    }

    #[test]
    fn durations_read_the_same_for_every_key() {
        // A number of seconds or a string with a unit, as peer_timeout.
        for (text, want) in [
            ("1", 1000),
            ("1.5", 1500),
            ("\"1s\"", 1000),
            ("\"250ms\"", 250),
            ("\"2m\"", 120_000),
        ] {
            let c = LoaderConfig::from_toml(&format!("stall_timeout = {text}\nio_timeout = {text}")).expect(text);
            assert_eq!(c.io.store.stall_timeout, Duration::from_millis(want), "{text}");
            assert_eq!(c.io.io_timeout, Duration::from_millis(want), "{text}");
        }
    }
}
