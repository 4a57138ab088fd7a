//! brand's configuration as TOML: what `brand read --config`, `brand serve
//! --config`, the C ABI (`brand_open`) and the TensorFlow op accept. Every
//! key is optional; this is the one table of keys (command-line flags set
//! the same ones), and each is range-checked here: the loader's by
//! [`LoaderConfig::check`], the multi-node ones by [`ConfigKeys::take_nodes`].
//!
//! ```toml
//! batch_size = 256      # 1..=1048576
//! memory = "10%"        # per rank: "10%" (0-100000 %), bytes ("4GiB", ≥ 1) or "N slots" (≥ 1)
//! policy = "brand"      # brand, brand-random, direct, chunk-shuffle, sequential
//! seed = 0              # any u64
//! rank = 0              # 0..world
//! world = 1             # 1..=65536
//! drop_last = false     # false: pad every rank to the same number of steps
//! readahead = "64MiB"   # bytes of planned reads in flight ahead of consumption, 0..=1TiB
//! queue_depth = 32      # reads in flight, 1..=4096
//! read_gap = "auto"     # "whole" (paper), "auto" (probe the device) or bytes up to 1GiB, e.g. "16KiB"
//! verify = true         # check every record's crc32c
//! direct = true         # O_DIRECT; false reads through the page cache
//! io_backend = "auto"   # "auto" (io_uring, threads where refused), "uring" or "threads"
//! decode_threads = 2    # threads decompressing zstd records read by io_uring, 0..=64 (0: on the io thread);
//!                       # default: the cores the (at most 2) io threads leave, at most 8
//! io_timeout = 60       # seconds a read may take before it is an error, (0, 86400]
//! on_corrupt = "error"  # "error" (fail when the sample is due) or "skip" (leave it out, counted)
//!
//! # Multi-node (brand-nodes): with 2 or more nodes this process is node `rank`
//! # of a job; `world` and `rank` then follow the node list.
//! nodes = ["10.0.0.1:7070", "10.0.0.2:7070"]  # every node's host:port by rank, 1..=65536 of them
//! remote_memory = "256MiB"  # pushed samples a node holds ahead of use, 1 byte..=1TiB (≥ the largest sample)
//! peer_timeout = "30s"      # a silent or unreachable peer is an error after this, (0s, 24h]
//! job = "resnet-run-7"      # nodes of different jobs refuse each other; 1..=256 bytes
//! tf_port_offset = 1000     # with TF_CONFIG: brand listens on each worker's port + this, 1..=65535
//! ```
//!
//! Without `nodes`, the launcher's environment may give them (brand-nodes's
//! `config` module: `BRAND_NODES` with `RANK`/`WORLD_SIZE`, or `TF_CONFIG`).
//! Nothing at all: a single node, which listens nowhere.
//!
//! Byte counts go through the one parser, [`brand_format::units::parse_bytes`].

use std::time::Duration;

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
    pub nodes: Option<Vec<String>>,
    pub remote_memory: Option<String>,
    pub peer_timeout: Option<String>,
    pub job: Option<String>,
    pub tf_port_offset: Option<u32>,
}

/// The multi-node keys of a [`ConfigKeys`], parsed and range-checked (see
/// the module docs); `None` where the key was not given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeKeys {
    pub nodes: Option<Vec<String>>,
    pub remote_memory: Option<u64>,
    pub peer_timeout: Option<Duration>,
    pub job: Option<String>,
    pub tf_port_offset: Option<u16>,
}

impl ConfigKeys {
    /// Parses a TOML text into keys; the error names the line.
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| {
            // One line that says where: the line number and its text.
            let at = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
            let line_no = text[..at].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            Error::config(format!("config line {line_no} `{line}`: {}", e.message().trim()))
        })
    }

    /// Takes the multi-node keys out (checked), leaving the loader's.
    pub fn take_nodes(&mut self) -> Result<NodeKeys> {
        let nodes = self.nodes.take();
        if let Some(list) = &nodes {
            if list.len() > MAX_WORLD as usize {
                return Err(Error::config(format!("nodes: {} listed, at most 65536", list.len())));
            }
            for (i, n) in list.iter().enumerate() {
                check_address(n).map_err(|why| Error::config(format!("node {i} address {n:?}: {why}")))?;
            }
        }
        let remote_memory = match self.remote_memory.take() {
            Some(v) => {
                let b = brand_format::units::parse_bytes(&v)
                    .map_err(|why| Error::config(format!("remote_memory {v:?}: {why}")))?;
                if !(1..=MAX_REMOTE_MEMORY).contains(&b) {
                    return Err(Error::config(format!("remote_memory {v:?} outside 1 byte..=1TiB")));
                }
                Some(b)
            }
            None => None,
        };
        let peer_timeout = match self.peer_timeout.take() {
            Some(v) => {
                let d = parse_duration(&v)?;
                if d > MAX_PEER_TIMEOUT {
                    return Err(Error::config(format!("peer_timeout {v:?} outside (0s, 24h]")));
                }
                Some(d)
            }
            None => None,
        };
        let job = self.job.take();
        if let Some(j) = &job
            && !(1..=MAX_JOB_BYTES).contains(&j.len())
        {
            return Err(Error::config(format!("job {j:?}: {} bytes, expected 1..=256", j.len())));
        }
        let tf_port_offset = match self.tf_port_offset.take() {
            Some(v) => Some(
                u16::try_from(v)
                    .ok()
                    .filter(|&o| o > 0)
                    .ok_or_else(|| Error::config(format!("tf_port_offset {v} outside 1..=65535")))?,
            ),
            None => None,
        };
        Ok(NodeKeys {
            nodes,
            remote_memory,
            peer_timeout,
            job,
            tf_port_offset,
        })
    }

    /// Sets the keys given here on `c`, then checks the result. The
    /// multi-node keys must have been taken out ([`take_nodes`](Self::take_nodes)):
    /// a loader alone is one node.
    pub fn apply(self, c: &mut LoaderConfig) -> Result<()> {
        let multi_node = [
            ("nodes", self.nodes.is_some()),
            ("remote_memory", self.remote_memory.is_some()),
            ("peer_timeout", self.peer_timeout.is_some()),
            ("job", self.job.is_some()),
            ("tf_port_offset", self.tf_port_offset.is_some()),
        ];
        if let Some((key, _)) = multi_node.iter().find(|(_, set)| *set) {
            return Err(Error::config(format!(
                "{key} is a multi-node key: open this config as a node (brand_nodes::Config, brand serve, brand_open), not as a Loader alone"
            )));
        }
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
    /// The multi-node keys are refused: see [`ConfigKeys::apply`].
    pub fn from_toml(text: &str) -> Result<Self> {
        let keys = ConfigKeys::from_toml(text)?;
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
const MAX_REMOTE_MEMORY: u64 = 1 << 40;
const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const MAX_JOB_BYTES: usize = 256;

/// `host:port` with a port in 1..=65535 (IPv6 hosts in brackets).
fn check_address(a: &str) -> std::result::Result<(), String> {
    let (host, port) = a.rsplit_once(':').ok_or("expected host:port")?;
    if host.trim().is_empty() || host != host.trim() {
        return Err("expected host:port".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("port {port:?} outside 1..=65535")),
    }
}

/// `"30s"`, `"500ms"`, `"2m"`, or plain seconds (`"1.5"`); more than 0.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || Error::config(format!("duration {s:?}: expected e.g. \"30s\", \"500ms\", \"2m\""));
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let secs = v * scale;
    if !(secs.is_finite() && secs > 0.0 && secs <= 1e9) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

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

    fn node_keys(text: &str) -> Result<NodeKeys> {
        ConfigKeys::from_toml(text)?.take_nodes()
    }

    #[test]
    fn node_keys_are_parsed_and_range_checked_here() {
        let k = node_keys(
            r#"nodes = ["127.0.0.1:7000", "[::1]:7001"]
               remote_memory = "1MiB"
               peer_timeout = "1500ms"
               job = "j"
               tf_port_offset = 7"#,
        )
        .expect("valid");
        assert_eq!(k.nodes.as_deref().map(<[String]>::len), Some(2));
        assert_eq!(k.remote_memory, Some(1 << 20));
        assert_eq!(k.peer_timeout, Some(Duration::from_millis(1500)));
        assert_eq!((k.job.as_deref(), k.tf_port_offset), (Some("j"), Some(7)));
        assert_eq!(node_keys("batch_size = 3").expect("none"), NodeKeys::default());
        let long_job = format!("job = \"{}\"", "x".repeat(257));
        for (text, word) in [
            ("nodes = [\"nohost\"]", "nohost"),
            ("nodes = [\"h:0\"]", "port"),
            ("nodes = [\"h:65536\"]", "65536"),
            ("nodes = [\":7\"]", "host:port"),
            ("remote_memory = \"lots\"", "remote_memory"),
            ("remote_memory = \"0\"", "remote_memory"),
            ("remote_memory = \"2TiB\"", "remote_memory"),
            ("peer_timeout = \"soon\"", "soon"),
            ("peer_timeout = \"0s\"", "0s"),
            ("peer_timeout = \"25h\"", "25h"),
            ("peer_timeout = \"90000s\"", "peer_timeout"),
            ("job = \"\"", "job"),
            (long_job.as_str(), "job"),
            ("tf_port_offset = 0", "tf_port_offset"),
            ("tf_port_offset = 65536", "tf_port_offset"),
            ("nodes = 3", "nodes"),
        ] {
            let e = node_keys(text).expect_err(text).to_string();
            assert!(e.contains(word), "{text}: {e}");
        }
    }

    #[test]
    fn a_loader_alone_refuses_node_keys_by_name() {
        for key in [
            "nodes = [\"h:1\", \"h:2\"]",
            "remote_memory = \"1MiB\"",
            "peer_timeout = \"1s\"",
            "job = \"j\"",
            "tf_port_offset = 3",
        ] {
            let e = LoaderConfig::from_toml(key).expect_err(key).to_string();
            let name = key.split(' ').next().unwrap_or_default();
            assert!(e.contains(&format!("{name} is a multi-node key")), "{key}: {e}");
        }
    }
}
