//! `manifest.toml`: what a person (or a tool) needs to know about a dataset
//! without parsing the index.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u32,
    pub samples: u64,
    pub chunk_size: u32,
    pub chunks: u64,
    pub pack_seed: u64,
    /// "none" or "zstd".
    pub compression: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zstd_level: Option<i32>,
    /// Always "crc32c" in format 1.
    pub checksum: String,
    /// Chunk offset and length alignment in bytes.
    pub alignment: u64,
    /// Sum of the samples' original sizes.
    pub raw_bytes: u64,
    /// Sum of the records' stored sizes (compressed if zstd).
    pub stored_bytes: u64,
    /// Sum of the segment files' sizes.
    pub data_bytes: u64,
    /// Of `data_bytes`, the zeros that keep records from spanning an extra
    /// 4 KiB block (format 2; absent, so 0, in format 1).
    #[serde(default)]
    pub block_padding_bytes: u64,
    pub mean_sample_bytes: f64,
    pub min_sample_bytes: u64,
    pub max_sample_bytes: u64,
    /// Number of distinct labels.
    pub labels: u64,
    /// Class names by label, where the source has them (ImageFolder).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_names: Vec<String>,
    pub segments: Vec<SegmentInfo>,
    pub provenance: Provenance,
    /// Set only in a partition written by `brand pack --partitions`: this
    /// directory holds one node's share of the chunks (the segments listed
    /// here that it owns), with the whole dataset's index. Builds before
    /// partitions refuse the key (`deny_unknown_fields`); whole datasets
    /// never write it, so they are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
}

/// Which share of a partitioned dataset a directory holds: the chunks of
/// the groups node `index` owns in a world of `count` nodes (group `g`,
/// chunks `[g·group_chunks, (g+1)·group_chunks)`, belongs to node `g mod
/// count`, as in the multi-node mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
    pub group_chunks: u64,
}

impl Partition {
    /// The partition (node) that holds `chunk`.
    pub fn owner_of_chunk(&self, chunk: u64) -> u32 {
        ((chunk / self.group_chunks.max(1)) % self.count.max(1) as u64) as u32
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentInfo {
    pub name: String,
    pub bytes: u64,
    pub chunks: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// dir, list, tfrecord or lmdb.
    pub source: String,
    /// The inputs as given to `brand pack`.
    pub inputs: Vec<String>,
    /// The brand version that packed it.
    pub packer: String,
}

impl Manifest {
    pub fn to_toml(&self) -> String {
        // Serialising plain data to TOML cannot fail for this struct (no
        // maps with non-string keys, no NaN: mean is finite by construction).
        toml::to_string_pretty(self).unwrap_or_else(|e| panic!("manifest serialisation: {e}"))
    }

    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(bytes, path)
    }

    /// A manifest from its bytes (read from `path`, which names it in errors).
    pub fn from_bytes(bytes: Vec<u8>, path: &Path) -> Result<Self> {
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to() as u64;
            Error::format(path, at, "not UTF-8 text")
        })?;
        let m: Manifest = toml::from_str(&text).map_err(|e| {
            let offset = e.span().map(|s| s.start as u64).unwrap_or(0);
            Error::format(path, offset, e.message().to_string())
        })?;
        m.check(path, &text)?;
        if !super::READ_FORMAT_VERSIONS.contains(&m.format_version) {
            return Err(Error::format(
                path,
                key_offset(&text, "format_version"),
                format!(
                    "format version {} (this build reads versions {} to {}{})",
                    m.format_version,
                    super::READ_FORMAT_VERSIONS.start(),
                    super::READ_FORMAT_VERSIONS.end(),
                    if m.format_version > super::FORMAT_VERSION {
                        "; the dataset was packed by a newer brand"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(m)
    }

    /// Refuses values this build does not understand instead of guessing:
    /// an unknown compression would serve stored bytes as samples, a segment
    /// name with a directory part would open a file outside the dataset.
    fn check(&self, path: &Path, text: &str) -> Result<()> {
        let bad = |key: &str, what: String| Error::format(path, key_offset(text, key), format!("key `{key}`: {what}"));
        if !matches!(self.compression.as_str(), "none" | "zstd") {
            return Err(bad(
                "compression",
                format!(
                    "{:?} is not understood (expected \"none\" or \"zstd\")",
                    self.compression
                ),
            ));
        }
        if self.checksum != "crc32c" {
            return Err(bad(
                "checksum",
                format!("{:?} is not understood (expected \"crc32c\")", self.checksum),
            ));
        }
        if self.alignment != super::ALIGN {
            return Err(bad(
                "alignment",
                format!("{} is not understood (expected {})", self.alignment, super::ALIGN),
            ));
        }
        if let Some(p) = &self.partition
            && (p.count == 0 || p.index >= p.count || p.group_chunks == 0)
        {
            return Err(bad(
                "index",
                format!(
                    "partition {} of {} with groups of {} chunks is not a partition",
                    p.index, p.count, p.group_chunks
                ),
            ));
        }
        for s in &self.segments {
            if !is_plain_file_name(&s.name) {
                return Err(bad(
                    "name",
                    format!("segment {:?} must be a file name inside the dataset directory", s.name),
                ));
            }
        }
        Ok(())
    }
}

/// One normal path component: no separator, not `.`/`..`, not empty.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Byte offset of the first line that assigns `key` (for error messages), or 0.
fn key_offset(text: &str, key: &str) -> u64 {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return (at + line.len() - t.len()) as u64;
        }
        at += line.len();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> String {
        r#"format_version = 1
samples = 1
chunk_size = 1
chunks = 1
pack_seed = 0
compression = "none"
checksum = "crc32c"
alignment = 4096
raw_bytes = 1
stored_bytes = 1
data_bytes = 4096
mean_sample_bytes = 1.0
min_sample_bytes = 1
max_sample_bytes = 1
labels = 1

[[segments]]
name = "data-00000.brd"
bytes = 4096
chunks = 1

[provenance]
source = "dir"
inputs = []
packer = "brand 0.1.0"
"#
        .to_string()
    }

    fn load(text: &str) -> Result<Manifest> {
        // Tests run in parallel: each load its own directory.
        static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("brand-manifest-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let path = dir.join("manifest.toml");
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        let r = Manifest::load(&path);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    #[test]
    fn values_not_understood_are_refused_naming_the_key() {
        assert!(load(&good()).is_ok());
        let cases = [
            ("compression = \"none\"", "compression = \"lz4\"", "`compression`"),
            ("compression = \"none\"", "compression = \"ZSTD\"", "`compression`"),
            ("checksum = \"crc32c\"", "checksum = \"md5\"", "`checksum`"),
            ("alignment = 4096", "alignment = 512", "`alignment`"),
            ("\"data-00000.brd\"", "\"../data-00000.brd\"", "`name`"),
            ("\"data-00000.brd\"", "\"/etc/passwd\"", "`name`"),
            ("\"data-00000.brd\"", "\"sub/data-00000.brd\"", "`name`"),
            ("\"data-00000.brd\"", "\"..\"", "`name`"),
            ("\"data-00000.brd\"", "\"\"", "`name`"),
        ];
        for (from, to, key) in cases {
            let text = good().replace(from, to);
            let msg = load(&text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.contains("manifest.toml") && msg.contains(key), "{to}: {msg:?}");
            assert!(!msg.contains("at byte 0:"), "{to}: the offset points at the key: {msg}");
        }
    }

    #[test]
    fn a_partition_table_that_is_no_partition_is_refused() {
        let with = |index: u32, count: u32, group_chunks: u64| {
            format!(
                "{}\n[partition]\nindex = {index}\ncount = {count}\ngroup_chunks = {group_chunks}\n",
                good()
            )
        };
        let m = load(&with(2, 3, 4)).expect("a partition");
        assert_eq!(m.partition.map(|p| (p.index, p.count, p.group_chunks)), Some((2, 3, 4)));
        for (index, count, group_chunks) in [(3, 3, 4), (0, 0, 4), (0, 3, 0), (u32::MAX, 1, 1)] {
            let msg = load(&with(index, count, group_chunks))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                msg.contains("manifest.toml") && msg.contains("is not a partition"),
                "{index}/{count}/{group_chunks}: {msg:?}"
            );
        }
    }

    #[test]
    fn versions_1_to_3_are_read_and_others_refused_by_number() {
        for v in [1, 2, 3] {
            let m = load(&good().replace("format_version = 1", &format!("format_version = {v}"))).expect("readable");
            assert_eq!(m.format_version, v);
        }
        for (v, newer) in [(0, false), (4, true), (99, true)] {
            let msg = load(&good().replace("format_version = 1", &format!("format_version = {v}")))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                msg.contains("manifest.toml")
                    && msg.contains(&format!("format version {v} (this build reads versions 1 to 3")),
                "{v}: {msg:?}"
            );
            assert_eq!(msg.contains("packed by a newer brand"), newer, "{msg}");
        }
    }
}
