//! brand-format: the dataset on disk (DESIGN.md §2), version 3, and what every
//! later stage shares: the opened [`Dataset`] and its record decoder
//! ([`decode`]: length, crc32c, zstd), the index, read extents, aligned
//! buffers, the pinned PRNG, byte counts, the one [`Error`] type, and the two
//! helpers every writer and checker shares: durable writes ([`durable`]) and a
//! parallel map ([`parallel`]).
//!
//! A dataset is a directory holding `manifest.toml`, `index.bin` and one or
//! more `data-NNNNN.brd` segment files. All integers are little-endian.
//!
//! Segment: a sequence of chunks. Every chunk starts at a multiple of
//! [`ALIGN`] and is zero-padded to a multiple of it, so a whole chunk is one
//! aligned O_DIRECT read.
//!
//! Chunk (self-contained, so the index can be rebuilt from segments alone):
//!
//! ```text
//! 0   magic "BRDCHNK\0"        8
//! 8   version u16, flags u16   (bit 0: records are zstd frames; bit 1: aligned64;
//!                              bit 2: blocks; both below)
//! 12  record_count u32
//! 16  chunk_id u64
//! 24  header_len u32           fixed part + record table + keys
//! 28  header_crc u32           crc32c of bytes [0, header_len) with this field zeroed
//! 32  chunk_len u64            unpadded bytes from chunk start to the end of the last payload
//! 40  reserved [u8; 8]
//! 48  record table, RECORD_ENTRY bytes a record:
//!       offset u32 (from chunk start), stored_len u32, raw_len u32,
//!       crc32c u32 (of the stored bytes), label i64, key_len u32, reserved u32
//!     keys, concatenated in record order
//!     payloads, in record order: the first right after the keys and each
//!     next right after the one before (unflagged), or, in a chunk flagged
//!     aligned64, each at the first multiple of 64 bytes from the chunk
//!     start at or after that point; in a chunk flagged blocks, moved on
//!     to the next 4 KiB boundary from there if it would otherwise span
//!     one more 4 KiB block than its length needs; zero bytes between
//! ```
//!
//! `brand pack` writes aligned64 + blocks chunks. aligned64: a record
//! starts 64-byte aligned in an O_DIRECT read buffer (chunks are 4
//! KiB-aligned), so the reader serves it from that buffer instead of
//! copying it to an aligned one. blocks ([`chunk::FLAG_BLOCKS`]): a record
//! read alone costs no block more than its length needs (a 4 KiB sample
//! is one 4 KiB read, not two), for padding of less than one block and
//! less than the record (`brand inspect` shows it).
//!
//! Versions: 1 (no blocks flag; unflagged or aligned64 chunks), 2 (blocks
//! chunks) and 3 (index version 2: columns as narrow as their values, keys
//! checked apart, see [`index`]). This build reads all three and writes 3;
//! a build that reads only older versions refuses a newer dataset when
//! opening it, naming the version, rather than at its first chunk or its
//! index.
//!
//! The per-record crc32c covers the bytes as stored (compressed if zstd), so
//! a record is verified before it is decompressed and whether or not the rest
//! of its chunk was read.

pub mod buffer;
pub mod chunk;
pub mod dataset;
pub mod decode;
pub mod durable;
pub mod error;
pub mod extents;
pub mod ids;
pub mod index;
pub mod manifest;
pub mod mapped;
pub mod parallel;
pub mod pin;
pub mod rng;
pub mod units;

pub use dataset::Dataset;
pub use error::{Error, Result};

/// Alignment of chunk offsets and lengths: O_DIRECT on a 4 KiB-block device.
pub const ALIGN: u64 = 4096;

/// The format version written by this build.
pub const FORMAT_VERSION: u32 = 3;

/// The format versions this build reads.
pub const READ_FORMAT_VERSIONS: std::ops::RangeInclusive<u32> = 1..=FORMAT_VERSION;

/// Largest chunk size (records per chunk): fill masks are one `u64`.
pub const MAX_CHUNK_SIZE: u32 = 64;

/// Default records per chunk (the paper's choice, §3.2).
pub const DEFAULT_CHUNK_SIZE: u32 = 64;

/// Default largest segment file.
pub const DEFAULT_SEGMENT_BYTES: u64 = 4 << 30;

pub const MANIFEST_FILE: &str = "manifest.toml";
pub const INDEX_FILE: &str = "index.bin";

/// File name of segment `n`.
pub fn segment_name(n: u32) -> String {
    format!("data-{n:05}.brd")
}

/// Round `x` up to a multiple of [`ALIGN`].
pub const fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Round `x` down to a multiple of [`ALIGN`].
pub const fn align_down(x: u64) -> u64 {
    x / ALIGN * ALIGN
}

/// Little-endian cursor over a byte slice that reports where it ran out.
pub(crate) struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// `n` bytes, or `None` if fewer remain.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}
