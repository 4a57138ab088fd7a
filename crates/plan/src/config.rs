//! What a plan is asked for: memory budget, policy, seed, rank and world.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use brand_format::error::{Error, Result};

/// How samples are ordered and which chunks are read when (DESIGN.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Brand (paper §3.3): serve whatever the abstract chunk holds at the
    /// requested slot, refill with the chunk that fills the most empty slots.
    #[default]
    Brand,
    /// Brand with the refill chunk chosen uniformly (the paper's ablation).
    BrandRandom,
    /// LIRS: the epoch permutation itself, one read per sample.
    Direct,
    /// DIESEL: shuffle chunk order, read a window of chunks that fits the
    /// budget, serve the window's samples shuffled.
    ChunkShuffle,
    /// Chunks in order, samples in order.
    Sequential,
    /// For a local tier smaller than the dataset (`brand_format::pin`): the
    /// samples of the chunks the tier pins served at random over the whole
    /// epoch, read record by record from the tier; the other chunks read
    /// whole from the store into a shuffle buffer of the budget's size
    /// (few, large requests: the store sees each byte once an epoch).
    Tiered,
}

impl Policy {
    pub const ALL: [Policy; 6] = [
        Policy::Brand,
        Policy::BrandRandom,
        Policy::Direct,
        Policy::ChunkShuffle,
        Policy::Sequential,
        Policy::Tiered,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Brand => "brand",
            Policy::BrandRandom => "brand-random",
            Policy::Direct => "direct",
            Policy::ChunkShuffle => "chunk-shuffle",
            Policy::Sequential => "sequential",
            Policy::Tiered => "tiered",
        }
    }

    /// Brand and its ablation share the abstract-memory protocol.
    pub fn is_brand(self) -> bool {
        matches!(self, Policy::Brand | Policy::BrandRandom)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        Policy::ALL.into_iter().find(|p| p.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            Error::config(format!("unknown policy {s:?}: expected one of {}", names.join(", ")))
        })
    }
}

/// The memory budget of one rank.
///
/// It becomes a number of abstract slots, `M = budget / mean decoded sample
/// size` (paper §3.2, `M = C/d`; decoded: what memory holds once read). The protocol's abstract memory is the
/// world's: `world × M` slots, so a rank holds about `M` samples on average.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Memory {
    /// A byte budget.
    Bytes(u64),
    /// A percentage of the dataset's samples (`10.0` is 10 %). A share
    /// smaller than one chunk rounds up to one chunk (the whole dataset if
    /// it is smaller), so small datasets work with the default 10 %.
    Percent(f64),
    /// Abstract slots directly, for experiments and tests.
    Slots(u64),
}

impl Memory {
    /// Most a percentage may be (a budget of 1000× the dataset is already
    /// "everything").
    pub const MAX_PERCENT: f64 = 100_000.0;

    /// The one range check of a budget: a percentage in (0, 100000], at
    /// least one byte or one slot. Parsing and planning both call it.
    pub fn check(&self) -> Result<()> {
        let outside = |what: String, range: &str| Err(Error::config(format!("memory {what} outside {range}")));
        match *self {
            Memory::Percent(p) if !(p > 0.0 && p <= Self::MAX_PERCENT) => outside(format!("{p}%"), "(0, 100000] %"),
            Memory::Bytes(0) => outside("0 bytes".into(), "1 byte and up"),
            Memory::Slots(0) => outside("0 slots".into(), "1 slot and up"),
            _ => Ok(()),
        }
    }
}

impl FromStr for Memory {
    type Err = Error;

    /// `"10%"`, `"12.5%"`, `"512MiB"`, `"2G"`, `"1.5GB"`, `"1048576"`, `"4096 slots"`.
    /// Every unit is binary, as in memory flags: `K`, `KB` and `KiB` are
    /// all 1024 bytes, `2G` is 2 GiB. The value is range-checked
    /// ([`Memory::check`]).
    fn from_str(s: &str) -> Result<Self> {
        let text = s.trim();
        let bad = |why: &str| {
            Error::config(format!(
                "memory {s:?}: {why} (expected e.g. \"10%\", \"512MiB\", \"2G\" or a byte count)"
            ))
        };
        let memory = if let Some(pct) = text.strip_suffix('%') {
            Memory::Percent(pct.trim().parse().map_err(|_| bad("not a percentage"))?)
        } else if let Some(n) = text.to_ascii_lowercase().strip_suffix("slots") {
            Memory::Slots(n.trim().parse().map_err(|_| bad("not a slot count"))?)
        } else {
            Memory::Bytes(brand_format::units::parse_bytes(text).map_err(bad)?)
        };
        memory.check()?;
        Ok(memory)
    }
}

impl fmt::Display for Memory {
    /// Parses back to the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Memory::Percent(p) => write!(f, "{p}%"),
            Memory::Slots(n) => write!(f, "{n} slots"),
            Memory::Bytes(b) => {
                for (suffix, unit) in [
                    ("TiB", 1u64 << 40),
                    ("GiB", 1 << 30),
                    ("MiB", 1 << 20),
                    ("KiB", 1 << 10),
                ] {
                    if b >= unit && b % unit == 0 {
                        return write!(f, "{}{suffix}", b / unit);
                    }
                }
                write!(f, "{b}")
            }
        }
    }
}

/// Everything a plan depends on besides the dataset's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanConfig {
    /// Budget of one rank (see [`Memory`]).
    pub memory: Memory,
    pub policy: Policy,
    pub seed: u64,
    /// This rank, `0..world`.
    pub rank: u32,
    /// Number of ranks sharing the epoch (DistributedSampler's world size).
    pub world: u32,
    /// Each rank gets `floor(N / world)` samples and the tail is dropped;
    /// otherwise `ceil(N / world)`, short ranks repeating samples from the
    /// start of the epoch (marked as padding).
    pub drop_last: bool,
    /// Brand policies: refills fill a chunk's records in runs of this many
    /// neighbours (1..=[`MAX_RUN_LENGTH`]), which one request reads where
    /// requests cost more than bytes (packing shuffled placement, so
    /// neighbours are random samples). 1 fills record by record (the
    /// paper). Other policies ignore it: direct reads one record per
    /// request by definition, chunk-shuffle and sequential whole chunks.
    #[serde(default = "one")]
    pub run_length: u32,
    /// The `tiered` policy: the share of the chunks its tier pins, in
    /// 255ths ([`brand_format::pin`]); decided from the tier's limit when
    /// a reader opens (`brand_io::IoConfig::pinned_share`), 0 without a
    /// tier. Other policies ignore it.
    #[serde(default)]
    pub pinned_share: u8,
}

/// Longest run: a chunk.
pub const MAX_RUN_LENGTH: u32 = brand_format::MAX_CHUNK_SIZE;

fn one() -> u32 {
    1
}

impl PlanConfig {
    /// `brand`, seed 0, one rank, padding.
    pub fn new(memory: Memory) -> Self {
        PlanConfig {
            memory,
            policy: Policy::default(),
            seed: 0,
            rank: 0,
            world: 1,
            drop_last: false,
            run_length: 1,
            pinned_share: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_by_name() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().ok(), Some(p));
            assert_eq!(p.to_string().to_uppercase().parse::<Policy>().ok(), Some(p));
        }
        assert_eq!("chunk_shuffle".parse::<Policy>().ok(), Some(Policy::ChunkShuffle));
        let err = "lru".parse::<Policy>().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("brand-random"), "{err}");
    }

    #[test]
    fn memory_parses_units() {
        let cases = [
            ("10%", Memory::Percent(10.0)),
            (" 12.5 % ", Memory::Percent(12.5)),
            ("512MiB", Memory::Bytes(512 << 20)),
            ("2G", Memory::Bytes(2 << 30)),
            ("2g", Memory::Bytes(2 << 30)),
            ("2GB", Memory::Bytes(2 << 30)),
            ("64 KB", Memory::Bytes(64 << 10)),
            ("1.5GiB", Memory::Bytes(3 << 29)),
            ("4096", Memory::Bytes(4096)),
            ("100B", Memory::Bytes(100)),
            ("64 slots", Memory::Slots(64)),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Memory>().ok(), Some(want), "{text}");
        }
        for bad in [
            "",
            "%",
            "-5%",
            "0%",
            "NaN%",
            "ten",
            "5XB",
            "99999999999T",
            "-1G",
            "100001%",
            "0",
            "0 slots",
        ] {
            assert!(bad.parse::<Memory>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn memory_display_round_trips() {
        for m in [
            Memory::Bytes(512 << 20),
            Memory::Bytes(12345),
            Memory::Bytes(3 << 40),
            Memory::Percent(7.25),
            Memory::Slots(99),
        ] {
            assert_eq!(m.to_string().parse::<Memory>().ok(), Some(m), "{m}");
        }
    }
}
