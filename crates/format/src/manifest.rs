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
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let m: Manifest = toml::from_str(&text).map_err(|e| {
            let offset = e.span().map(|s| s.start as u64).unwrap_or(0);
            Error::format(path, offset, e.message().to_string())
        })?;
        if m.format_version != super::FORMAT_VERSION {
            return Err(Error::format(
                path,
                0,
                format!(
                    "format version {} (this build reads {})",
                    m.format_version,
                    super::FORMAT_VERSION
                ),
            ));
        }
        Ok(m)
    }
}
