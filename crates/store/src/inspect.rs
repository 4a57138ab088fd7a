//! `brand inspect`: a dataset's vital statistics, from its index (the ground
//! truth) and manifest.

use serde::Serialize;

use brand_format::dataset::Dataset;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub path: String,
    pub format_version: u32,
    pub samples: u64,
    pub chunk_size: u32,
    pub chunks: u64,
    pub segments: u64,
    /// Bytes of the segment files on disk (headers and padding included).
    pub data_bytes: u64,
    /// Sum of the samples' original sizes.
    pub raw_bytes: u64,
    /// Sum of the records as stored (compressed if zstd).
    pub stored_bytes: u64,
    /// Record layout: "blocks" (format 2: no record spans a 4 KiB block more
    /// than its length needs) or "format 1, no blocks".
    pub layout: String,
    /// Zeros placed so that records span no extra block (from the index).
    pub block_padding_bytes: u64,
    /// Header bytes: fixed parts, record tables and keys of all chunks.
    pub header_bytes: u64,
    pub mean_sample_bytes: f64,
    pub min_sample_bytes: u64,
    pub max_sample_bytes: u64,
    pub compression: String,
    pub labels: u64,
    pub pack_seed: u64,
    pub source: String,
    /// A partition (`brand pack --partitions`): which one, and its share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionSummary {
    pub index: u32,
    pub count: u32,
    pub group_chunks: u64,
    /// Chunks, samples and segment bytes held here.
    pub chunks: u64,
    pub samples: u64,
    pub data_bytes: u64,
}

pub fn summary(ds: &Dataset) -> Summary {
    let idx = &ds.index;
    let raw: u64 = idx.raw_lens().map(|x| x as u64).sum();
    let stored: u64 = idx.stored_lens().map(|x| x as u64).sum();
    let labels: std::collections::BTreeSet<i64> = idx.labels().collect();
    let m = &ds.manifest;
    let compression = match m.zstd_level {
        Some(l) if m.compression == "zstd" => format!("zstd (level {l})"),
        _ => m.compression.clone(),
    };
    Summary {
        path: ds.dir().display().to_string(),
        format_version: m.format_version,
        samples: idx.samples(),
        chunk_size: idx.chunk_size(),
        chunks: idx.chunk_count(),
        segments: idx.segment_count() as u64,
        data_bytes: m.segments.iter().map(|s| s.bytes).sum(),
        raw_bytes: raw,
        stored_bytes: stored,
        layout: if m.format_version >= 2 {
            "blocks"
        } else {
            "format 1, no blocks"
        }
        .into(),
        block_padding_bytes: idx.block_padding(),
        header_bytes: (0..idx.chunk_count()).map(|c| idx.chunk_header_len(c)).sum(),
        mean_sample_bytes: raw as f64 / idx.samples().max(1) as f64,
        min_sample_bytes: idx.raw_lens().min().unwrap_or(0) as u64,
        max_sample_bytes: idx.raw_lens().max().unwrap_or(0) as u64,
        compression,
        labels: labels.len() as u64,
        pack_seed: m.pack_seed,
        source: m.provenance.source.clone(),
        partition: m.partition.map(|p| {
            let held: Vec<u64> = (0..idx.chunk_count()).filter(|&c| ds.holds_chunk(c)).collect();
            PartitionSummary {
                index: p.index,
                count: p.count,
                group_chunks: p.group_chunks,
                chunks: held.len() as u64,
                samples: held.iter().map(|&c| idx.chunk_records(c) as u64).sum(),
                data_bytes: (0..m.segments.len() as u32)
                    .filter(|&s| ds.holds_segment(s))
                    .map(|s| m.segments[s as usize].bytes)
                    .sum(),
            }
        }),
    }
}

fn mib(x: u64) -> f64 {
    x as f64 / (1u64 << 20) as f64
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "dataset      {}", self.path)?;
        writeln!(f, "samples      {}", self.samples)?;
        writeln!(f, "chunk size   {}", self.chunk_size)?;
        writeln!(f, "chunks       {}", self.chunks)?;
        writeln!(
            f,
            "segments     {} ({:.1} MiB on disk)",
            self.segments,
            mib(self.data_bytes)
        )?;
        writeln!(
            f,
            "samples size {:.1} MiB raw, {:.1} MiB stored",
            mib(self.raw_bytes),
            mib(self.stored_bytes)
        )?;
        writeln!(
            f,
            "layout       {}: {:.1} MiB block padding ({:.2} % of stored), {:.1} MiB headers, {:.1} MiB other padding",
            self.layout,
            mib(self.block_padding_bytes),
            100.0 * self.block_padding_bytes as f64 / self.stored_bytes.max(1) as f64,
            mib(self.header_bytes),
            mib(self
                .data_bytes
                .saturating_sub(self.stored_bytes + self.header_bytes + self.block_padding_bytes))
        )?;
        writeln!(
            f,
            "sample bytes mean {:.0}, min {}, max {}",
            self.mean_sample_bytes, self.min_sample_bytes, self.max_sample_bytes
        )?;
        writeln!(f, "compression  {}", self.compression)?;
        writeln!(f, "labels       {}", self.labels)?;
        writeln!(f, "pack seed    {}", self.pack_seed)?;
        writeln!(f, "source       {}", self.source)?;
        if let Some(p) = &self.partition {
            writeln!(
                f,
                "partition    {} of {} (groups of {} chunks): holds {} chunks, {} samples, {:.1} MiB",
                p.index,
                p.count,
                p.group_chunks,
                p.chunks,
                p.samples,
                mib(p.data_bytes)
            )?;
        }
        Ok(())
    }
}
