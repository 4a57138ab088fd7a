//! `index.bin`: the metadata snapshot (DIESEL), mapped read-only and read
//! in place (LIRS: a few bytes per sample, no per-sample allocation or hash
//! map). Every process that opens a dataset maps the same file, so the page
//! cache holds one copy per machine, and a process's resident set holds only
//! the pages it touched: the columns a read needs, never the keys unless it
//! asks for them.
//!
//! Version 2 (written by this build; format 3 in the manifest):
//!
//! ```text
//! header, 64 bytes:
//!   magic "BRDINDEX", version u32 = 2, chunk_size u32, samples u64, chunks u64,
//!   segments u32, widths u32, keys_len u64, reserved [u8; 16]
//!   widths: byte 0 label bytes (0: every label is -1; 1, 2, 4 or 8, signed),
//!           byte 1 raw_len column present (0: raw_len = stored_len),
//!           byte 2 key_end bytes (4 or 8), byte 3 zero
//! chunks × 16: segment u32, record_count u32, offset u64          (per chunk)
//! samples × 4 each, column by column: rel_offset, stored_len, [raw_len], crc32c;
//!   then samples × label bytes: label
//! samples × key_end bytes: key_end; keys: keys_len bytes
//!   (sample i's key is keys[key_end[i-1]..key_end[i]])
//! trailer: crc32c u32 of the header, chunks and columns; crc32c u32 of
//!   key_end and keys; magic "BRDIEND\0"
//! ```
//!
//! Opening checks the first crc only, so the keys are not read (`brand
//! verify` checks both); a key is bounds-checked when asked for, so a
//! damaged key section gives a wrong key, never a panic or a wrong record.
//!
//! Version 1 (formats 1 and 2) is read in place too: the same columns at
//! fixed widths (label and key_end 8 bytes, raw_len always present) and one
//! crc32c over every byte before the trailer.
//!
//! Chunk `c` holds samples `[c*K, min((c+1)*K, N))`; a sample's id is its
//! position in the packed order.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{ALIGN, Reader, align_up};
use crate::error::{Error, Result};
use crate::mapped::Mapped;

pub const INDEX_MAGIC: [u8; 8] = *b"BRDINDEX";
pub const INDEX_END: [u8; 8] = *b"BRDIEND\0";
/// The index version this build writes.
pub const INDEX_VERSION: u32 = 2;
const HEADER: usize = 64;

/// Where a chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLoc {
    pub segment: u32,
    pub record_count: u32,
    /// Byte offset in the segment, a multiple of [`ALIGN`].
    pub offset: u64,
}

/// The bytes an index is read from.
enum Backing {
    Mapped(Mapped),
    Heap(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m.bytes(),
            Backing::Heap(v) => v,
        }
    }
}

/// Where each section starts in the file, and the column widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sections {
    version: u32,
    chunks: usize,
    rel_offset: usize,
    stored_len: usize,
    raw_len: Option<usize>,
    crc: usize,
    label: usize,
    label_width: usize,
    key_end: usize,
    key_end_width: usize,
    keys: usize,
    keys_len: usize,
    /// First byte of the trailer.
    trailer: usize,
}

/// The index of a dataset, read in place from its bytes (mapped from
/// `index.bin`, or held in memory when fetched or built). Cloning is cheap:
/// the bytes are shared.
#[derive(Clone)]
pub struct Index {
    bytes: Arc<Backing>,
    chunk_size: u32,
    segments: u32,
    samples: usize,
    chunk_count: usize,
    at: Sections,
    /// Padded on-disk length of each chunk (derived: end of its last record,
    /// rounded up to [`ALIGN`]): 8 bytes a chunk, on the heap.
    chunk_padded_len: Vec<u64>,
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

#[inline]
fn le<const W: usize>(b: &[u8], at: usize) -> [u8; W] {
    b.get(at..at + W).and_then(|s| s.try_into().ok()).unwrap_or([0; W])
}

impl Index {
    /// Builds and checks an index in memory: chunk `c` must hold exactly
    /// `min(K, N - c*K)` samples, offsets aligned, records in order.
    pub fn new(
        chunk_size: u32,
        segments: u32,
        chunks: Vec<ChunkLoc>,
        samples: Vec<SampleMeta>,
    ) -> Result<Self, String> {
        let mut w = IndexWriter::in_memory(chunk_size);
        for c in chunks {
            w.push_chunk(c).map_err(|e| e.to_string())?;
        }
        for s in &samples {
            w.push_sample(s.rel_offset, s.stored_len, s.raw_len, s.crc, s.label, &s.key)
                .map_err(|e| e.to_string())?;
        }
        let mut bytes = Vec::new();
        w.finish(segments, &mut bytes).map_err(|e| e.to_string())?;
        Self::from_vec(bytes, Path::new(crate::INDEX_FILE)).map_err(|e| e.to_string())
    }

    /// Maps `path` and checks it (a few bytes a sample are read: the
    /// columns, not the keys).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_named(path, path)
    }

    /// [`load`](Self::load) of a copy of another file: what the copy's
    /// bytes hold wrong is named as `name`'s (a fetched index: its URL).
    pub fn load_named(path: &Path, name: &Path) -> Result<Self> {
        let mapped = Mapped::open(path)?;
        Self::parse(Backing::Mapped(mapped), name)
    }

    /// Parses `index.bin` bytes (copied); `path` only names the file in
    /// errors. Never panics on any input.
    pub fn from_bytes(buf: &[u8], path: &Path) -> Result<Self> {
        Self::from_vec(buf.to_vec(), path)
    }

    /// [`from_bytes`](Self::from_bytes) of bytes it keeps.
    pub fn from_vec(buf: Vec<u8>, path: &Path) -> Result<Self> {
        Self::parse(Backing::Heap(buf), path)
    }

    fn parse(backing: Backing, path: &Path) -> Result<Self> {
        let buf = backing.bytes();
        let bad = |offset: usize, what: String| Error::format(path, offset as u64, what);
        let mut r = Reader::new(buf);
        let trunc = |r: &Reader| bad(r.pos, format!("truncated index: {} bytes", buf.len()));
        if buf.len() < HEADER + 12 {
            return Err(bad(buf.len(), format!("truncated index: {} bytes", buf.len())));
        }
        if r.bytes(8) != Some(&INDEX_MAGIC[..]) {
            return Err(bad(0, "bad index magic (not a brand index)".into()));
        }
        let version = r.u32().ok_or_else(|| trunc(&r))?;
        if !(1..=INDEX_VERSION).contains(&version) {
            return Err(bad(
                8,
                format!("unsupported index version {version} (this build reads 1 to {INDEX_VERSION})"),
            ));
        }
        let chunk_size = r.u32().ok_or_else(|| trunc(&r))?;
        let n = r.u64().ok_or_else(|| trunc(&r))?;
        let nchunks = r.u64().ok_or_else(|| trunc(&r))?;
        let segments = r.u32().ok_or_else(|| trunc(&r))?;
        let widths = r.u32().ok_or_else(|| trunc(&r))?.to_le_bytes();
        let keys_len = r.u64().ok_or_else(|| trunc(&r))?;
        let (label_width, raw, key_end_width, trailer_len) = if version == 1 {
            (8u64, true, 8u64, 12usize)
        } else {
            if ![0, 1, 2, 4, 8].contains(&widths[0]) || widths[1] > 1 || ![4, 8].contains(&widths[2]) || widths[3] != 0
            {
                return Err(bad(36, format!("bad column widths {widths:?}")));
            }
            (widths[0] as u64, widths[1] == 1, widths[2] as u64, 16usize)
        };
        // Sizes come from the file: check they add up to its length before
        // any column is read.
        let per_sample = 4 * (3 + raw as u64) + label_width + key_end_width;
        let want = HEADER as u128 + nchunks as u128 * 16 + n as u128 * per_sample as u128 + keys_len as u128;
        let body_len = buf.len() - trailer_len;
        if want != body_len as u128 {
            return Err(bad(
                16,
                format!(
                    "header promises {want} bytes ({n} samples, {nchunks} chunks, {keys_len} key bytes), file body has {body_len}"
                ),
            ));
        }
        let (n, nchunks, keys_len) = (n as usize, nchunks as usize, keys_len as usize);
        let chunks = HEADER;
        let rel_offset = chunks + nchunks * 16;
        let stored_len = rel_offset + 4 * n;
        let raw_len = raw.then_some(stored_len + 4 * n);
        let crc = stored_len + 4 * n * (1 + raw as usize);
        let label = crc + 4 * n;
        let key_end = label + label_width as usize * n;
        let keys = key_end + key_end_width as usize * n;
        let at = Sections {
            version,
            chunks,
            rel_offset,
            stored_len,
            raw_len,
            crc,
            label,
            label_width: label_width as usize,
            key_end,
            key_end_width: key_end_width as usize,
            keys,
            keys_len,
            trailer: body_len,
        };
        let mut t = Reader::new(&buf[body_len..]);
        let stored_crc = t.u32().unwrap_or(0);
        if version > 1 {
            t.u32();
        }
        if t.bytes(8) != Some(&INDEX_END[..]) {
            return Err(bad(
                body_len + trailer_len - 8,
                "missing index end marker (truncated or not an index)".into(),
            ));
        }
        let checked = if version == 1 { body_len } else { key_end };
        let crc = crc32c::crc32c(&buf[..checked]);
        if crc != stored_crc {
            return Err(bad(
                body_len,
                format!("index checksum mismatch (stored {stored_crc:#010x}, computed {crc:#010x})"),
            ));
        }
        let mut idx = Index {
            bytes: Arc::new(backing),
            chunk_size,
            segments,
            samples: n,
            chunk_count: nchunks,
            at,
            chunk_padded_len: Vec::new(),
        };
        idx.check_and_derive().map_err(|e| bad(HEADER, e))?;
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
        if self.chunk_count as u64 != want_chunks {
            return Err(format!(
                "{} chunks for {n} samples of chunk size {k}; expected {want_chunks}",
                self.chunk_count
            ));
        }
        let mut padded_lens = Vec::with_capacity(self.chunk_count);
        for c in 0..self.chunk_count {
            let loc = self.chunk(c as u64);
            let want = (n - c as u64 * k as u64).min(k as u64);
            if loc.record_count as u64 != want {
                return Err(format!("chunk {c}: {} records, expected {want}", loc.record_count));
            }
            if !loc.offset.is_multiple_of(ALIGN) {
                return Err(format!("chunk {c}: offset {} is not {ALIGN}-aligned", loc.offset));
            }
            if loc.segment >= self.segments {
                return Err(format!("chunk {c}: segment {} of {}", loc.segment, self.segments));
            }
            let first = c as u64 * k as u64;
            let mut end = 0u64;
            for i in first..first + want {
                let start = self.rel_offset(i) as u64;
                if start < end {
                    return Err(format!("sample {i}: record overlaps the one before it"));
                }
                end = start + self.stored_len(i) as u64;
            }
            let padded = align_up(end.max(1));
            if loc.offset.checked_add(padded).is_none_or(|e| e > i64::MAX as u64) {
                return Err(format!(
                    "chunk {c}: offset {} + {padded} bytes overflows a file offset",
                    loc.offset
                ));
            }
            padded_lens.push(padded);
        }
        self.chunk_padded_len = padded_lens;
        Ok(())
    }

    fn buf(&self) -> &[u8] {
        self.bytes.bytes()
    }

    /// The index file's bytes as they were read.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf()
    }

    /// Which index version the bytes are (1 or [`INDEX_VERSION`]).
    pub fn version(&self) -> u32 {
        self.at.version
    }

    /// Bytes of the index file (mapped and shared, or held when fetched).
    pub fn file_bytes(&self) -> u64 {
        self.buf().len() as u64
    }

    /// Bytes of the index on this process's heap: the derived per-chunk
    /// lengths, and the whole file when it is held rather than mapped.
    pub fn heap_bytes(&self) -> u64 {
        let held = match &*self.bytes {
            Backing::Heap(v) => v.len() as u64,
            Backing::Mapped(_) => 0,
        };
        held + self.chunk_padded_len.capacity() as u64 * 8
    }

    /// Whether the bytes are a mapping of `index.bin` (shared between
    /// processes) rather than a copy on the heap.
    pub fn is_mapped(&self) -> bool {
        matches!(&*self.bytes, Backing::Mapped(_))
    }

    /// Checks the keys' crc32c (not checked at open: `brand verify` and
    /// whoever relies on every key being right).
    pub fn check_keys(&self) -> Result<(), String> {
        if self.at.version == 1 {
            return Ok(()); // one crc over everything, checked at open
        }
        let b = self.buf();
        let stored = u32::from_le_bytes(le(b, self.at.trailer + 4));
        let crc = crc32c::crc32c(&b[self.at.key_end..self.at.trailer]);
        if crc != stored {
            return Err(format!(
                "index keys checksum mismatch (stored {stored:#010x}, computed {crc:#010x})"
            ));
        }
        let mut prev = 0u64;
        for i in 0..self.samples {
            let e = self.key_end(i);
            if e < prev || e > self.at.keys_len as u64 {
                return Err(format!(
                    "sample {i}: key end {e} out of order or past {}",
                    self.at.keys_len
                ));
            }
            prev = e;
        }
        Ok(())
    }

    /// crc32c over every record's crc32c in id order: a cheap stand-in for
    /// the dataset's content (4 bytes a sample), different for different
    /// contents; checkpoints and the cache's handshake compare it.
    pub fn content_digest(&self) -> u32 {
        let b = &self.buf()[self.at.crc..self.at.crc + 4 * self.samples];
        crc32c::crc32c(b)
    }

    pub fn samples(&self) -> u64 {
        self.samples as u64
    }
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }
    pub fn chunk_count(&self) -> u64 {
        self.chunk_count as u64
    }
    pub fn segment_count(&self) -> u32 {
        self.segments
    }
    /// Where chunk `c` lives.
    pub fn chunk(&self, c: u64) -> ChunkLoc {
        let at = self.at.chunks + 16 * c as usize;
        let b = self.buf();
        ChunkLoc {
            segment: u32::from_le_bytes(le(b, at)),
            record_count: u32::from_le_bytes(le(b, at + 4)),
            offset: u64::from_le_bytes(le(b, at + 8)),
        }
    }
    /// Every chunk's location, in chunk order.
    pub fn chunk_locs(&self) -> impl Iterator<Item = ChunkLoc> + '_ {
        (0..self.chunk_count()).map(|c| self.chunk(c))
    }
    /// Payload offset of sample `id` from its chunk's start.
    #[inline]
    pub fn rel_offset(&self, id: u64) -> u32 {
        u32::from_le_bytes(le(self.buf(), self.at.rel_offset + 4 * id as usize))
    }
    /// Bytes of sample `id` as stored (compressed if zstd).
    #[inline]
    pub fn stored_len(&self, id: u64) -> u32 {
        u32::from_le_bytes(le(self.buf(), self.at.stored_len + 4 * id as usize))
    }
    /// Bytes of sample `id` as served (decompressed).
    #[inline]
    pub fn raw_len(&self, id: u64) -> u32 {
        match self.at.raw_len {
            Some(at) => u32::from_le_bytes(le(self.buf(), at + 4 * id as usize)),
            None => self.stored_len(id),
        }
    }
    /// crc32c of sample `id`'s stored bytes.
    #[inline]
    pub fn crc(&self, id: u64) -> u32 {
        u32::from_le_bytes(le(self.buf(), self.at.crc + 4 * id as usize))
    }
    /// Label of sample `id` (-1 where the source had none).
    #[inline]
    pub fn label(&self, id: u64) -> i64 {
        let (b, at) = (self.buf(), self.at.label + self.at.label_width * id as usize);
        match self.at.label_width {
            0 => -1,
            1 => i8::from_le_bytes(le(b, at)) as i64,
            2 => i16::from_le_bytes(le(b, at)) as i64,
            4 => i32::from_le_bytes(le(b, at)) as i64,
            _ => i64::from_le_bytes(le(b, at)),
        }
    }
    /// Every sample's stored length, in id order.
    pub fn stored_lens(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.samples()).map(|i| self.stored_len(i))
    }
    /// Every sample's raw length, in id order.
    pub fn raw_lens(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.samples()).map(|i| self.raw_len(i))
    }
    /// Every sample's label, in id order.
    pub fn labels(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.samples()).map(|i| self.label(i))
    }
    fn key_end(&self, i: usize) -> u64 {
        let (b, at) = (self.buf(), self.at.key_end + self.at.key_end_width * i);
        match self.at.key_end_width {
            4 => u32::from_le_bytes(le(b, at)) as u64,
            _ => u64::from_le_bytes(le(b, at)),
        }
    }
    /// Records in chunk `c` (K except possibly for the last chunk).
    pub fn chunk_records(&self, c: u64) -> u32 {
        self.chunk(c).record_count
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
        let loc = self.chunk(self.chunk_of(id));
        (
            loc.segment,
            loc.offset + self.rel_offset(id) as u64,
            self.stored_len(id),
        )
    }
    /// Sample `id`'s key (empty if the key section is damaged: see
    /// [`check_keys`](Self::check_keys)).
    pub fn key(&self, id: u64) -> &[u8] {
        let i = id as usize;
        if i >= self.samples {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.key_end(i - 1) };
        let end = self.key_end(i);
        let (start, end) = (start as usize, end as usize);
        if start > end || end > self.at.keys_len {
            return &[];
        }
        &self.buf()[self.at.keys + start..self.at.keys + end]
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
                    .map(|i| (self.rel_offset(i) as u64, self.stored_len(i) as u64));
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
}

impl PartialEq for Index {
    fn eq(&self, other: &Self) -> bool {
        self.buf() == other.buf()
    }
}
impl Eq for Index {}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("version", &self.at.version)
            .field("samples", &self.samples)
            .field("chunk_size", &self.chunk_size)
            .field("chunks", &self.chunk_count)
            .field("segments", &self.segments)
            .field("bytes", &self.buf().len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

/// One column being written: in memory, or spilled to a file so that a
/// pack of a billion samples holds none of them.
enum Column {
    Memory(Vec<u8>),
    File { out: BufWriter<File>, path: PathBuf },
}

impl Column {
    fn push(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Column::Memory(v) => {
                v.extend_from_slice(b);
                Ok(())
            }
            Column::File { out, .. } => out.write_all(b),
        }
    }

    /// Makes what was pushed so far durable (a spilled column's file).
    fn sync(&mut self) -> std::io::Result<()> {
        match self {
            Column::Memory(_) => Ok(()),
            Column::File { out, .. } => {
                out.flush()?;
                out.get_ref().sync_data()
            }
        }
    }

    /// The column's bytes from the start, to be copied into the index.
    fn into_reader(self) -> std::io::Result<Box<dyn Read>> {
        match self {
            Column::Memory(v) => Ok(Box::new(std::io::Cursor::new(v))),
            Column::File { out, path } => {
                let file = out.into_inner().map_err(|e| e.into_error())?;
                drop(file);
                let f = File::open(&path)?;
                // The name goes now; the open descriptor keeps the bytes.
                std::fs::remove_file(&path)?;
                Ok(Box::new(BufReader::with_capacity(1 << 20, f)))
            }
        }
    }
}

/// What an [`IndexWriter`] has taken so far: with its spilled columns, all
/// a pack needs to go on after a crash ([`IndexWriter::resume_spilled`]).
/// Each column's length follows from the counts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexWriterState {
    pub samples: u64,
    pub chunks: u64,
    pub keys_len: u64,
    pub label_min: i64,
    pub label_max: i64,
    pub raw_differs: bool,
}

/// Writes the index as samples arrive, in chunk and id order, at full width
/// into columns (in memory, or spilled to files); [`finish`](Self::finish)
/// narrows each column to what its values need and writes `index.bin`.
pub struct IndexWriter {
    chunk_size: u32,
    chunks: Column,
    rel_offset: Column,
    stored_len: Column,
    raw_len: Column,
    crc: Column,
    label: Column,
    key_end: Column,
    keys: Column,
    samples: u64,
    chunk_count: u64,
    keys_len: u64,
    label_min: i64,
    label_max: i64,
    raw_differs: bool,
}

impl IndexWriter {
    fn with_columns(chunk_size: u32, mut column: impl FnMut(&str) -> std::io::Result<Column>) -> std::io::Result<Self> {
        Ok(IndexWriter {
            chunk_size,
            chunks: column("chunks")?,
            rel_offset: column("rel_offset")?,
            stored_len: column("stored_len")?,
            raw_len: column("raw_len")?,
            crc: column("crc")?,
            label: column("label")?,
            key_end: column("key_end")?,
            keys: column("keys")?,
            samples: 0,
            chunk_count: 0,
            keys_len: 0,
            label_min: -1,
            label_max: -1,
            raw_differs: false,
        })
    }

    /// A writer holding its columns in memory.
    pub fn in_memory(chunk_size: u32) -> Self {
        let writer = Self::with_columns(chunk_size, |_| Ok(Column::Memory(Vec::new())));
        writer.unwrap_or_else(|_| unreachable!("memory columns cannot fail"))
    }

    /// A writer spilling its columns to files in `dir` (which must exist;
    /// the files are removed by [`finish`](Self::finish)).
    pub fn spilled(chunk_size: u32, dir: &Path) -> Result<Self> {
        Self::with_columns(chunk_size, |name| {
            let path = dir.join(format!("index-{name}.spill"));
            let out = BufWriter::with_capacity(1 << 16, File::create(&path)?);
            Ok(Column::File { out, path })
        })
        .map_err(|e| Error::io(dir, e))
    }

    /// Spilled columns' file names in `dir`, each with the bytes it holds
    /// after `state`: the column's name, its path and its length.
    fn spill_files(dir: &Path, state: &IndexWriterState) -> [(PathBuf, u64); 8] {
        let n = state.samples;
        [
            ("chunks", state.chunks * 16),
            ("rel_offset", n * 4),
            ("stored_len", n * 4),
            ("raw_len", n * 4),
            ("crc", n * 4),
            ("label", n * 8),
            ("key_end", n * 8),
            ("keys", state.keys_len),
        ]
        .map(|(name, len)| (dir.join(format!("index-{name}.spill")), len))
    }

    /// Makes every column durable and says how far it got: a pack records
    /// the state beside its own progress and, after a crash, goes on from
    /// there with [`resume_spilled`](Self::resume_spilled).
    pub fn checkpoint(&mut self) -> std::io::Result<IndexWriterState> {
        for c in [
            &mut self.chunks,
            &mut self.rel_offset,
            &mut self.stored_len,
            &mut self.raw_len,
            &mut self.crc,
            &mut self.label,
            &mut self.key_end,
            &mut self.keys,
        ] {
            c.sync()?;
        }
        Ok(IndexWriterState {
            samples: self.samples,
            chunks: self.chunk_count,
            keys_len: self.keys_len,
            label_min: self.label_min,
            label_max: self.label_max,
            raw_differs: self.raw_differs,
        })
    }

    /// A spilled writer going on from `state` with the column files a
    /// [`spilled`](Self::spilled) writer left in `dir`: each is cut back to
    /// the length `state` gives (what was pushed after the checkpoint goes).
    /// A file shorter than that is an error: it is not the checkpoint's.
    pub fn resume_spilled(chunk_size: u32, dir: &Path, state: &IndexWriterState) -> Result<Self> {
        let files = Self::spill_files(dir, state);
        for (path, len) in &files {
            let have = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
            if have < *len {
                return Err(Error::format(
                    path,
                    have,
                    format!("the file ends here, before the {len} bytes its checkpoint recorded"),
                ));
            }
        }
        let mut files = files.into_iter();
        let mut writer = Self::with_columns(chunk_size, |_| {
            let (path, len) = files
                .next()
                .ok_or_else(|| std::io::Error::other("internal: column count"))?;
            let file = std::fs::OpenOptions::new().write(true).open(&path)?;
            file.set_len(len)?;
            let mut out = BufWriter::with_capacity(1 << 16, file);
            std::io::Seek::seek(&mut out, std::io::SeekFrom::End(0))?;
            Ok(Column::File { out, path })
        })
        .map_err(|e| Error::io(dir, e))?;
        writer.samples = state.samples;
        writer.chunk_count = state.chunks;
        writer.keys_len = state.keys_len;
        writer.label_min = state.label_min;
        writer.label_max = state.label_max;
        writer.raw_differs = state.raw_differs;
        Ok(writer)
    }

    pub fn push_chunk(&mut self, loc: ChunkLoc) -> std::io::Result<()> {
        self.chunk_count += 1;
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&loc.segment.to_le_bytes());
        b[4..8].copy_from_slice(&loc.record_count.to_le_bytes());
        b[8..].copy_from_slice(&loc.offset.to_le_bytes());
        self.chunks.push(&b)
    }

    pub fn push_sample(
        &mut self,
        rel_offset: u32,
        stored_len: u32,
        raw_len: u32,
        crc: u32,
        label: i64,
        key: &[u8],
    ) -> std::io::Result<()> {
        if self.samples == 0 {
            (self.label_min, self.label_max) = (label, label);
        }
        self.samples += 1;
        self.label_min = self.label_min.min(label);
        self.label_max = self.label_max.max(label);
        self.raw_differs |= raw_len != stored_len;
        self.keys_len += key.len() as u64;
        self.rel_offset.push(&rel_offset.to_le_bytes())?;
        self.stored_len.push(&stored_len.to_le_bytes())?;
        self.raw_len.push(&raw_len.to_le_bytes())?;
        self.crc.push(&crc.to_le_bytes())?;
        self.label.push(&label.to_le_bytes())?;
        self.key_end.push(&self.keys_len.to_le_bytes())?;
        self.keys.push(key)
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Bytes each label needs: 0 when every label is -1.
    fn label_width(&self) -> u8 {
        let fits = |bits: u32| {
            let (lo, hi) = (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1);
            self.label_min >= lo && self.label_max <= hi
        };
        match () {
            _ if self.label_min == -1 && self.label_max == -1 => 0,
            _ if fits(8) => 1,
            _ if fits(16) => 2,
            _ if fits(32) => 4,
            _ => 8,
        }
    }

    /// Writes the index for a dataset of `segments` segments to `out`.
    pub fn finish(self, segments: u32, out: &mut dyn Write) -> std::io::Result<()> {
        let label_width = self.label_width();
        let key_end_width: u8 = if self.keys_len <= u32::MAX as u64 { 4 } else { 8 };
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(&INDEX_MAGIC);
        head.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        head.extend_from_slice(&self.chunk_size.to_le_bytes());
        head.extend_from_slice(&self.samples.to_le_bytes());
        head.extend_from_slice(&self.chunk_count.to_le_bytes());
        head.extend_from_slice(&segments.to_le_bytes());
        head.extend_from_slice(&[label_width, self.raw_differs as u8, key_end_width, 0]);
        head.extend_from_slice(&self.keys_len.to_le_bytes());
        head.resize(HEADER, 0);
        let mut meta = CrcWriter { out: &mut *out, crc: 0 };
        meta.write_all(&head)?;
        std::io::copy(&mut self.chunks.into_reader()?, &mut meta)?;
        std::io::copy(&mut self.rel_offset.into_reader()?, &mut meta)?;
        std::io::copy(&mut self.stored_len.into_reader()?, &mut meta)?;
        if self.raw_differs {
            std::io::copy(&mut self.raw_len.into_reader()?, &mut meta)?;
        } else {
            drop(self.raw_len.into_reader()?);
        }
        std::io::copy(&mut self.crc.into_reader()?, &mut meta)?;
        narrow(self.label.into_reader()?, label_width as usize, &mut meta)?;
        let meta_crc = meta.crc;
        let mut keys = CrcWriter { out: &mut *out, crc: 0 };
        narrow(self.key_end.into_reader()?, key_end_width as usize, &mut keys)?;
        std::io::copy(&mut self.keys.into_reader()?, &mut keys)?;
        let keys_crc = keys.crc;
        out.write_all(&meta_crc.to_le_bytes())?;
        out.write_all(&keys_crc.to_le_bytes())?;
        out.write_all(&INDEX_END)
    }
}

/// Copies a column of 8-byte little-endian values keeping the low `width`
/// bytes of each (which hold the value: the width was chosen for its range).
fn narrow(mut from: Box<dyn Read>, width: usize, to: &mut dyn Write) -> std::io::Result<()> {
    if width == 0 {
        return std::io::copy(&mut from, &mut std::io::sink()).map(|_| ());
    }
    let mut inb = vec![0u8; 8 << 12];
    let mut outb = Vec::with_capacity(width << 12);
    loop {
        let mut got = 0;
        while got < inb.len() {
            match from.read(&mut inb[got..])? {
                0 => break,
                k => got += k,
            }
        }
        if !got.is_multiple_of(8) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "column cut mid-value",
            ));
        }
        outb.clear();
        for v in inb[..got].chunks_exact(8) {
            outb.extend_from_slice(&v[..width]);
        }
        to.write_all(&outb)?;
        if got < inb.len() {
            return Ok(());
        }
    }
}

/// A writer that keeps a running crc32c of what went through it.
struct CrcWriter<'a> {
    out: &'a mut dyn Write,
    crc: u32,
}

impl Write for CrcWriter<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let k = self.out.write(b)?;
        self.crc = crc32c::crc32c_append(self.crc, &b[..k]);
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metas(labels: &[i64], raw_extra: u32) -> Vec<SampleMeta> {
        labels
            .iter()
            .enumerate()
            .map(|(i, &label)| SampleMeta {
                rel_offset: 100 + (i as u32 % 2) * 10,
                stored_len: 10,
                raw_len: 10 + raw_extra,
                crc: i as u32,
                label,
                key: format!("k{i}").into_bytes(),
            })
            .collect()
    }

    fn chunks() -> Vec<ChunkLoc> {
        vec![
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
        ]
    }

    fn small() -> Index {
        Index::new(2, 2, chunks(), metas(&[-2, -1, 0, 1, 2], 0)).expect("valid index")
    }

    /// The version-1 bytes of `idx` (what formats 1 and 2 wrote).
    fn v1_bytes(idx: &Index) -> Vec<u8> {
        let n = idx.samples();
        let mut out = Vec::new();
        out.extend_from_slice(&INDEX_MAGIC);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&idx.chunk_size().to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&idx.chunk_count().to_le_bytes());
        out.extend_from_slice(&idx.segment_count().to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let keys: Vec<u8> = (0..n).flat_map(|i| idx.key(i).to_vec()).collect();
        out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        out.resize(HEADER, 0);
        for c in idx.chunk_locs() {
            out.extend_from_slice(&c.segment.to_le_bytes());
            out.extend_from_slice(&c.record_count.to_le_bytes());
            out.extend_from_slice(&c.offset.to_le_bytes());
        }
        for col in [Index::rel_offset, Index::stored_len, Index::raw_len, Index::crc] {
            (0..n).for_each(|i| out.extend_from_slice(&col(idx, i).to_le_bytes()));
        }
        (0..n).for_each(|i| out.extend_from_slice(&idx.label(i).to_le_bytes()));
        let mut end = 0u64;
        for i in 0..n {
            end += idx.key(i).len() as u64;
            out.extend_from_slice(&end.to_le_bytes());
        }
        out.extend_from_slice(&keys);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&INDEX_END);
        out
    }

    fn same_columns(a: &Index, b: &Index) {
        assert_eq!(a.samples(), b.samples());
        assert_eq!(a.chunk_locs().collect::<Vec<_>>(), b.chunk_locs().collect::<Vec<_>>());
        for i in 0..a.samples() {
            assert_eq!(
                (
                    a.rel_offset(i),
                    a.stored_len(i),
                    a.raw_len(i),
                    a.crc(i),
                    a.label(i),
                    a.key(i)
                ),
                (
                    b.rel_offset(i),
                    b.stored_len(i),
                    b.raw_len(i),
                    b.crc(i),
                    b.label(i),
                    b.key(i)
                ),
                "sample {i}"
            );
        }
    }

    #[test]
    fn round_trip() {
        let idx = small();
        let back = Index::from_bytes(idx.as_bytes(), Path::new("index.bin")).expect("parse");
        assert_eq!(back, idx);
        assert_eq!(back.version(), INDEX_VERSION);
        assert_eq!(back.key(3), b"k3");
        assert_eq!(back.label(0), -2);
        assert_eq!(back.find_key(b"k4"), Some(4));
        assert_eq!(back.record_location(3), (0, 4096 + 110, 10));
        assert_eq!(back.chunk_padded_len(2), 4096);
        back.check_keys().expect("keys intact");
    }

    #[test]
    fn columns_are_as_narrow_as_their_values() {
        // (labels, raw_len differs) -> bytes a sample in the columns
        let cases: [(&[i64], u32, usize); 6] = [
            (&[-1, -1, -1, -1, -1], 0, 12),
            (&[0, 1, 2, 3, 127], 0, 13),
            (&[0, 1, 2, 3, 128], 0, 14),
            (&[0, -40000, 2, 3, 4], 0, 16),
            (&[0, 1, 2, 3, 1 << 40], 0, 20),
            (&[0, 1, 2, 3, 4], 7, 17),
        ];
        for (labels, extra, per_sample) in cases {
            let idx = Index::new(2, 2, chunks(), metas(labels, extra)).expect("valid");
            // + 4 bytes of key end and 2 of key a sample
            let want = HEADER + 3 * 16 + 5 * (per_sample + 4 + 2) + 16;
            assert_eq!(idx.as_bytes().len(), want, "labels {labels:?}, raw + {extra}");
            for (i, &l) in labels.iter().enumerate() {
                assert_eq!(idx.label(i as u64), l);
                assert_eq!(idx.raw_len(i as u64), 10 + extra);
            }
        }
    }

    #[test]
    fn version_1_indexes_still_read_with_the_same_columns() {
        for extra in [0, 3] {
            let idx = Index::new(2, 2, chunks(), metas(&[-2, 70000, 0, 1, i64::MIN], extra)).expect("valid");
            let v1 = Index::from_vec(v1_bytes(&idx), Path::new("index.bin")).expect("version 1 parses");
            assert_eq!(v1.version(), 1);
            same_columns(&v1, &idx);
            assert_eq!(v1.content_digest(), idx.content_digest());
        }
    }

    #[test]
    fn a_mapped_index_reads_like_one_in_memory() {
        let dir = std::env::temp_dir().join(format!("brand-index-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("index.bin");
        // Written through spilled columns, as a pack writes it.
        let mut w = IndexWriter::spilled(2, &dir).expect("writer");
        chunks().into_iter().for_each(|c| w.push_chunk(c).expect("chunk"));
        for m in metas(&[3, 1, 4, 1, 5], 0) {
            w.push_sample(m.rel_offset, m.stored_len, m.raw_len, m.crc, m.label, &m.key)
                .expect("sample");
        }
        let mut f = File::create(&path).expect("create");
        w.finish(2, &mut f).expect("finish");
        drop(f);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("index.bin")], "spill files removed");
        let mapped = Index::load(&path).expect("load");
        assert!(mapped.is_mapped());
        assert_eq!(mapped.heap_bytes(), 3 * 8);
        same_columns(
            &mapped,
            &Index::new(2, 2, chunks(), metas(&[3, 1, 4, 1, 5], 0)).expect("valid"),
        );
        std::fs::remove_dir_all(&dir).expect("clean");
    }

    #[test]
    fn every_truncation_and_flip_is_a_named_error() {
        let idx = small();
        for bytes in [idx.as_bytes().to_vec(), v1_bytes(&idx)] {
            for n in 0..bytes.len() {
                let e = Index::from_bytes(&bytes[..n], Path::new("x/index.bin")).expect_err("truncated");
                assert!(e.to_string().starts_with("x/index.bin"), "{e}");
            }
        }
        // Version 2: a flip outside the keys fails the open; one in the
        // keys is found by check_keys (and never makes key() panic).
        let bytes = idx.as_bytes();
        let len = bytes.len();
        let keys_at = len - 16 - 10 - 5 * 4;
        let keys_crc_covers = |i: usize| (keys_at..len - 16).contains(&i) || (len - 12..len - 8).contains(&i);
        for i in 0..len {
            let mut b = bytes.to_vec();
            b[i] ^= 1;
            match Index::from_bytes(&b, Path::new("index.bin")) {
                Err(_) => assert!(!keys_crc_covers(i), "flip at {i} in the keys refused the open"),
                Ok(opened) => {
                    assert!(keys_crc_covers(i), "flip at {i} opened");
                    assert!(opened.check_keys().is_err(), "flip at {i} in the keys not found");
                    (0..6).for_each(|s| assert!(opened.key(s).len() <= 5));
                }
            }
        }
        let v1 = v1_bytes(&idx);
        for i in 0..v1.len() {
            let mut b = v1.clone();
            b[i] ^= 1;
            assert!(Index::from_bytes(&b, Path::new("index.bin")).is_err(), "v1 flip at {i}");
        }
    }

    #[test]
    fn inconsistent_chunks_are_rejected() {
        let mut chunks = chunks();
        chunks[2].record_count = 2;
        assert!(Index::new(2, 2, chunks, metas(&[0; 5], 0)).is_err());
    }
}
