//! `index.bin`: the metadata snapshot (DIESEL), loaded once into flat arrays
//! (LIRS: a few bytes per sample, no per-sample allocation or hash map).
//!
//! ```text
//! header, 64 bytes:
//!   magic "BRDINDEX", version u32, chunk_size u32, samples u64, chunks u64,
//!   segments u32, reserved u32, keys_len u64, reserved [u8; 16]
//! chunks × 16: segment u32, record_count u32, offset u64          (per chunk)
//! samples × 4 each, column by column: rel_offset u32, stored_len u32,
//!   raw_len u32, crc32c u32; then samples × 8: label i64, key_end u64
//! keys: keys_len bytes (sample i's key is keys[key_end[i-1]..key_end[i]])
//! trailer: crc32c u32 of every byte before it, then magic "BRDIEND\0"
//! ```
//!
//! Chunk `c` holds samples `[c*K, min((c+1)*K, N))`; a sample's id is its
//! position in the packed order.

use std::path::Path;

use super::{ALIGN, Reader, align_up};
use crate::error::{Error, Result};

pub const INDEX_MAGIC: [u8; 8] = *b"BRDINDEX";
pub const INDEX_END: [u8; 8] = *b"BRDIEND\0";
pub const INDEX_VERSION: u32 = 1;
const HEADER: usize = 64;

/// Where a chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLoc {
    pub segment: u32,
    pub record_count: u32,
    /// Byte offset in the segment, a multiple of [`ALIGN`].
    pub offset: u64,
}

/// The whole index in flat arrays. Build it with [`Index::new`] (which
/// checks consistency) or [`Index::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    chunk_size: u32,
    segments: u32,
    pub chunks: Vec<ChunkLoc>,
    /// Padded on-disk length of each chunk (derived: end of its last record,
    /// rounded up to [`ALIGN`]).
    chunk_padded_len: Vec<u64>,
    /// Payload offset from the chunk start.
    pub rel_offset: Vec<u32>,
    pub stored_len: Vec<u32>,
    pub raw_len: Vec<u32>,
    pub crc: Vec<u32>,
    pub label: Vec<i64>,
    key_end: Vec<u64>,
    keys: Vec<u8>,
}

/// Columns for one sample, used to build an index.
#[derive(Debug, Clone)]
pub struct SampleMeta {
    pub rel_offset: u32,
    pub stored_len: u32,
    pub raw_len: u32,
    pub crc: u32,
    pub label: i64,
    pub key: Vec<u8>,
}

impl Index {
    /// Builds and checks an index: chunk `c` must hold exactly
    /// `min(K, N - c*K)` samples, offsets aligned, records in order.
    pub fn new(
        chunk_size: u32,
        segments: u32,
        chunks: Vec<ChunkLoc>,
        samples: Vec<SampleMeta>,
    ) -> Result<Self, String> {
        let n = samples.len();
        let mut idx = Index {
            chunk_size,
            segments,
            chunk_padded_len: Vec::with_capacity(chunks.len()),
            chunks,
            rel_offset: Vec::with_capacity(n),
            stored_len: Vec::with_capacity(n),
            raw_len: Vec::with_capacity(n),
            crc: Vec::with_capacity(n),
            label: Vec::with_capacity(n),
            key_end: Vec::with_capacity(n),
            keys: Vec::new(),
        };
        for s in samples {
            idx.rel_offset.push(s.rel_offset);
            idx.stored_len.push(s.stored_len);
            idx.raw_len.push(s.raw_len);
            idx.crc.push(s.crc);
            idx.label.push(s.label);
            idx.keys.extend_from_slice(&s.key);
            idx.key_end.push(idx.keys.len() as u64);
        }
        idx.check_and_derive()?;
        Ok(idx)
    }

    fn check_and_derive(&mut self) -> Result<(), String> {
        let k = self.chunk_size;
        if k == 0 || k > super::MAX_CHUNK_SIZE {
            return Err(format!("chunk size {k} outside 1..={}", super::MAX_CHUNK_SIZE));
        }
        let n = self.samples();
        if n > u32::MAX as u64 {
            return Err(format!("{n} samples: at most 2^32 - 1 are supported"));
        }
        let want_chunks = n.div_ceil(k as u64);
        if self.chunks.len() as u64 != want_chunks {
            return Err(format!(
                "{} chunks for {n} samples of chunk size {k}; expected {want_chunks}",
                self.chunks.len()
            ));
        }
        self.chunk_padded_len.clear();
        for (c, loc) in self.chunks.iter().enumerate() {
            let want = (n - c as u64 * k as u64).min(k as u64);
            if loc.record_count as u64 != want {
                return Err(format!("chunk {c}: {} records, expected {want}", loc.record_count));
            }
            if loc.offset % ALIGN != 0 {
                return Err(format!("chunk {c}: offset {} is not {ALIGN}-aligned", loc.offset));
            }
            if loc.segment >= self.segments {
                return Err(format!("chunk {c}: segment {} of {}", loc.segment, self.segments));
            }
            let first = c * k as usize;
            let mut end = 0u64;
            for i in first..first + want as usize {
                let start = self.rel_offset[i] as u64;
                if start < end {
                    return Err(format!("sample {i}: record overlaps the one before it"));
                }
                end = start + self.stored_len[i] as u64;
            }
            let padded = align_up(end.max(1));
            if loc.offset.checked_add(padded).is_none_or(|e| e > i64::MAX as u64) {
                return Err(format!(
                    "chunk {c}: offset {} + {padded} bytes overflows a file offset",
                    loc.offset
                ));
            }
            self.chunk_padded_len.push(padded);
        }
        Ok(())
    }

    /// crc32c over every record's crc32c in id order: a cheap stand-in for
    /// the dataset's content (4 bytes a sample), different for different
    /// contents; checkpoints and the cache's handshake compare it.
    pub fn content_digest(&self) -> u32 {
        let mut digest = 0u32;
        let mut buf = Vec::with_capacity(4096);
        for part in self.crc.chunks(1024) {
            buf.clear();
            buf.extend(part.iter().flat_map(|c| c.to_le_bytes()));
            digest = crc32c::crc32c_append(digest, &buf);
        }
        digest
    }

    pub fn samples(&self) -> u64 {
        self.rel_offset.len() as u64
    }
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }
    pub fn chunk_count(&self) -> u64 {
        self.chunks.len() as u64
    }
    pub fn segment_count(&self) -> u32 {
        self.segments
    }
    /// Records in chunk `c` (K except possibly for the last chunk).
    pub fn chunk_records(&self, c: u64) -> u32 {
        self.chunks[c as usize].record_count
    }
    /// Bytes a whole-chunk read of `c` transfers (padded to [`ALIGN`]).
    pub fn chunk_padded_len(&self, c: u64) -> u64 {
        self.chunk_padded_len[c as usize]
    }
    /// Chunk holding sample `id`.
    pub fn chunk_of(&self, id: u64) -> u64 {
        id / self.chunk_size as u64
    }
    /// `(segment, absolute byte offset, stored length)` of sample `id`.
    pub fn record_location(&self, id: u64) -> (u32, u64, u32) {
        let loc = self.chunks[self.chunk_of(id) as usize];
        (
            loc.segment,
            loc.offset + self.rel_offset[id as usize] as u64,
            self.stored_len[id as usize],
        )
    }
    pub fn key(&self, id: u64) -> &[u8] {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.key_end[i - 1] as usize };
        &self.keys[start..self.key_end[i] as usize]
    }
    /// Bytes of zeros placed before records so that none spans an extra 4
    /// KiB block ([`FLAG_BLOCKS`](crate::chunk::FLAG_BLOCKS)): every gap
    /// beyond the 64-byte alignment, summed over all chunks (0 for datasets
    /// packed without the flag). The headers' lengths follow from the record
    /// counts and keys, so no chunk is read.
    pub fn block_padding(&self) -> u64 {
        (0..self.chunk_count())
            .map(|c| {
                let table = self
                    .chunk_ids(c)
                    .map(|i| (self.rel_offset[i as usize] as u64, self.stored_len[i as usize] as u64));
                crate::chunk::block_padding(self.chunk_header_len(c), crate::chunk::FLAG_ALIGNED64, table)
            })
            .sum()
    }
    /// Sample ids of chunk `c`.
    pub fn chunk_ids(&self, c: u64) -> std::ops::Range<u64> {
        let first = c * self.chunk_size as u64;
        first..first + self.chunk_records(c) as u64
    }
    /// Bytes of chunk `c`'s header (fixed part, record table, keys),
    /// derived from its record count and keys.
    pub fn chunk_header_len(&self, c: u64) -> u64 {
        let keys: usize = self.chunk_ids(c).map(|i| self.key(i).len()).sum();
        crate::chunk::header_len(self.chunk_records(c) as usize, keys) as u64
    }
    /// Sample id with this key (a linear scan: keys are for lookups by hand).
    pub fn find_key(&self, key: &[u8]) -> Option<u64> {
        (0..self.samples()).find(|&i| self.key(i) == key)
    }

    /// Serialises to the `index.bin` byte layout.
    pub fn to_bytes(&self) -> Vec<u8> {
        let n = self.rel_offset.len();
        let mut out = Vec::with_capacity(HEADER + self.chunks.len() * 16 + n * 32 + self.keys.len() + 12);
        out.extend_from_slice(&INDEX_MAGIC);
        out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&(n as u64).to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.segments.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.keys.len() as u64).to_le_bytes());
        out.resize(HEADER, 0);
        for c in &self.chunks {
            out.extend_from_slice(&c.segment.to_le_bytes());
            out.extend_from_slice(&c.record_count.to_le_bytes());
            out.extend_from_slice(&c.offset.to_le_bytes());
        }
        for col in [&self.rel_offset, &self.stored_len, &self.raw_len, &self.crc] {
            for v in col.iter() {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        for v in &self.label {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.key_end {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.keys);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&INDEX_END);
        out
    }

    /// Parses `index.bin` bytes; `path` only names the file in errors.
    /// Never panics on any input.
    pub fn from_bytes(buf: &[u8], path: &Path) -> Result<Self> {
        let bad = |offset: usize, what: String| Error::format(path, offset as u64, what);
        if buf.len() < HEADER + 12 {
            return Err(bad(buf.len(), format!("truncated index: {} bytes", buf.len())));
        }
        let body_len = buf.len() - 12;
        let mut t = Reader::new(&buf[body_len..]);
        let stored_crc = t.u32().unwrap_or(0);
        if t.bytes(8) != Some(&INDEX_END[..]) {
            return Err(bad(
                body_len + 4,
                "missing index end marker (truncated or not an index)".into(),
            ));
        }
        let crc = crc32c::crc32c(&buf[..body_len]);
        if crc != stored_crc {
            return Err(bad(
                body_len,
                format!("index checksum mismatch (stored {stored_crc:#010x}, computed {crc:#010x})"),
            ));
        }
        let mut r = Reader::new(&buf[..body_len]);
        let trunc = |r: &Reader| bad(r.pos, "truncated index".into());
        if r.bytes(8) != Some(&INDEX_MAGIC[..]) {
            return Err(bad(0, "bad index magic (not a brand index)".into()));
        }
        let version = r.u32().ok_or_else(|| trunc(&r))?;
        if version != INDEX_VERSION {
            return Err(bad(
                8,
                format!("unsupported index version {version} (this build reads {INDEX_VERSION})"),
            ));
        }
        let chunk_size = r.u32().ok_or_else(|| trunc(&r))?;
        let n = r.u64().ok_or_else(|| trunc(&r))?;
        let nchunks = r.u64().ok_or_else(|| trunc(&r))?;
        let segments = r.u32().ok_or_else(|| trunc(&r))?;
        r.u32();
        let keys_len = r.u64().ok_or_else(|| trunc(&r))?;
        // Sizes come from the file: check they fit before allocating.
        let want = (HEADER as u128) + nchunks as u128 * 16 + n as u128 * 32 + keys_len as u128;
        if want != body_len as u128 {
            return Err(bad(
                16,
                format!(
                    "header promises {want} bytes ({n} samples, {nchunks} chunks, {keys_len} key bytes), file body has {body_len}"
                ),
            ));
        }
        r.pos = HEADER;
        let (n, nchunks) = (n as usize, nchunks as usize);
        let mut chunks = Vec::with_capacity(nchunks);
        for _ in 0..nchunks {
            let segment = r.u32().ok_or_else(|| trunc(&r))?;
            let record_count = r.u32().ok_or_else(|| trunc(&r))?;
            let offset = r.u64().ok_or_else(|| trunc(&r))?;
            chunks.push(ChunkLoc {
                segment,
                record_count,
                offset,
            });
        }
        let col32 = |r: &mut Reader| -> Result<Vec<u32>> { (0..n).map(|_| r.u32().ok_or_else(|| trunc(r))).collect() };
        let rel_offset = col32(&mut r)?;
        let stored_len = col32(&mut r)?;
        let raw_len = col32(&mut r)?;
        let crc = col32(&mut r)?;
        let label = (0..n)
            .map(|_| r.i64().ok_or_else(|| trunc(&r)))
            .collect::<Result<Vec<_>>>()?;
        let key_end = (0..n)
            .map(|_| r.u64().ok_or_else(|| trunc(&r)))
            .collect::<Result<Vec<_>>>()?;
        let keys_at = r.pos;
        let keys = r.bytes(keys_len as usize).ok_or_else(|| trunc(&r))?.to_vec();
        let mut prev = 0;
        for (i, &e) in key_end.iter().enumerate() {
            if e < prev || e > keys_len {
                return Err(bad(
                    keys_at,
                    format!("sample {i}: key end {e} out of order or past {keys_len}"),
                ));
            }
            prev = e;
        }
        let mut idx = Index {
            chunk_size,
            segments,
            chunks,
            chunk_padded_len: Vec::new(),
            rel_offset,
            stored_len,
            raw_len,
            crc,
            label,
            key_end,
            keys,
        };
        idx.check_and_derive().map_err(|e| bad(HEADER, e))?;
        Ok(idx)
    }

    pub fn load(path: &Path) -> Result<Self> {
        let buf = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&buf, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Index {
        let samples = (0..5)
            .map(|i| SampleMeta {
                rel_offset: 100 + (i % 2) * 10,
                stored_len: 10,
                raw_len: 10,
                crc: i,
                label: i as i64 - 2,
                key: format!("k{i}").into_bytes(),
            })
            .collect();
        let chunks = vec![
            ChunkLoc {
                segment: 0,
                record_count: 2,
                offset: 0,
            },
            ChunkLoc {
                segment: 0,
                record_count: 2,
                offset: 4096,
            },
            ChunkLoc {
                segment: 1,
                record_count: 1,
                offset: 0,
            },
        ];
        Index::new(2, 2, chunks, samples).expect("valid index")
    }

    #[test]
    fn round_trip() {
        let idx = small();
        let bytes = idx.to_bytes();
        let back = Index::from_bytes(&bytes, Path::new("index.bin")).expect("parse");
        assert_eq!(back, idx);
        assert_eq!(back.key(3), b"k3");
        assert_eq!(back.find_key(b"k4"), Some(4));
        assert_eq!(back.record_location(3), (0, 4096 + 110, 10));
        assert_eq!(back.chunk_padded_len(2), 4096);
    }

    #[test]
    fn every_truncation_and_flip_is_a_named_error() {
        let bytes = small().to_bytes();
        for n in 0..bytes.len() {
            let e = Index::from_bytes(&bytes[..n], Path::new("x/index.bin")).expect_err("truncated");
            assert!(e.to_string().starts_with("x/index.bin"), "{e}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(Index::from_bytes(&b, Path::new("index.bin")).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn inconsistent_chunks_are_rejected() {
        let idx = small();
        let mut chunks = idx.chunks.clone();
        chunks[2].record_count = 2;
        let samples: Vec<SampleMeta> = (0..5)
            .map(|_| SampleMeta {
                rel_offset: 0,
                stored_len: 1,
                raw_len: 1,
                crc: 0,
                label: 0,
                key: vec![],
            })
            .collect();
        assert!(Index::new(2, 2, chunks, samples).is_err());
    }
}
