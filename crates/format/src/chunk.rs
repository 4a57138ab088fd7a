//! Chunk encoding and header parsing (layout in the module above).

use super::{Reader, align_up};

pub const CHUNK_MAGIC: [u8; 8] = *b"BRDCHNK\0";
pub const CHUNK_VERSION: u16 = 1;
pub const FIXED_HEADER: usize = 48;
pub const RECORD_ENTRY: usize = 32;
pub const FLAG_ZSTD: u16 = 1;
/// Each record starts at a multiple of [`RECORD_ALIGN`] from the chunk start
/// (zero bytes pad the gaps), so a record read with O_DIRECT lands 64-byte
/// aligned in its read buffer and can be served from it without a copy.
/// Without it, records follow one another with no gap.
pub const FLAG_ALIGNED64: u16 = 2;
/// No record spans more [`ALIGN`](crate::ALIGN)-byte blocks than its length
/// needs: a record that would (from where it would otherwise start) begins
/// at the next block boundary instead, zero bytes between. So a record of
/// at most one block is read as one block, and one whose length is a
/// multiple of the block as exactly its blocks. The padding is less than
/// the record's length and less than one block, and paid only where it
/// saves a block on every read of the record alone (`direct`, small read
/// gaps). Format version 2 (the manifest's `format_version`).
pub const FLAG_BLOCKS: u16 = 4;
/// Every flag this build knows; any other bit is refused.
const KNOWN_FLAGS: u16 = FLAG_ZSTD | FLAG_ALIGNED64 | FLAG_BLOCKS;
/// Where records start in a chunk flagged [`FLAG_ALIGNED64`].
pub const RECORD_ALIGN: u64 = 64;
const CRC_FIELD: std::ops::Range<usize> = 28..32;

/// One record as the chunk's table describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEntry {
    /// Byte offset of the payload from the chunk start.
    pub offset: u32,
    pub stored_len: u32,
    pub raw_len: u32,
    /// crc32c of the stored bytes.
    pub crc: u32,
    pub label: i64,
    pub key: Vec<u8>,
}

/// A parsed, checked chunk header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub chunk_id: u64,
    pub header_len: u32,
    /// Unpadded length: header and payloads.
    pub chunk_len: u64,
    pub records: Vec<RecordEntry>,
}

impl ChunkHeader {
    pub fn padded_len(&self) -> u64 {
        align_up(self.chunk_len)
    }
    pub fn zstd(&self) -> bool {
        self.flags & FLAG_ZSTD != 0
    }
    pub fn aligned64(&self) -> bool {
        self.flags & FLAG_ALIGNED64 != 0
    }
    pub fn blocks(&self) -> bool {
        self.flags & FLAG_BLOCKS != 0
    }
}

/// Where a record of `len` bytes after one ending at `end` starts in a chunk
/// with `flags`.
pub fn record_offset(end: u64, len: u64, flags: u16) -> u64 {
    let at = if flags & FLAG_ALIGNED64 != 0 {
        end.next_multiple_of(RECORD_ALIGN)
    } else {
        end
    };
    if flags & FLAG_BLOCKS != 0 && extra_block(at, len) {
        crate::align_up(at)
    } else {
        at
    }
}

/// Whether `len` bytes at `at` span one more block than `len` bytes need.
pub fn extra_block(at: u64, len: u64) -> bool {
    let spanned = (at + len).div_ceil(crate::ALIGN) - at / crate::ALIGN;
    len > 0 && spanned > len.div_ceil(crate::ALIGN)
}

/// Bytes of zeros that [`FLAG_BLOCKS`] put before records: for each record,
/// its offset minus where it would start without the flag. `records` are
/// `(offset, stored_len)` in chunk order; `header_len` is the chunk's.
pub fn block_padding(header_len: u64, flags: u16, records: impl IntoIterator<Item = (u64, u64)>) -> u64 {
    let mut end = header_len;
    let mut padding = 0;
    for (offset, len) in records {
        padding += offset.saturating_sub(record_offset(end, len, flags & !FLAG_BLOCKS));
        end = offset + len;
    }
    padding
}

/// What is wrong with a chunk header; the caller adds file and offset.
pub type HeaderError = String;

/// Bytes of the header for `records` records carrying `key_bytes` of keys.
pub fn header_len(records: usize, key_bytes: usize) -> usize {
    FIXED_HEADER + records * RECORD_ENTRY + key_bytes
}

/// A record to encode: its stored bytes (already compressed if zstd).
pub struct RecordIn<'a> {
    pub stored: &'a [u8],
    pub raw_len: u32,
    pub label: i64,
    pub key: &'a [u8],
}

/// Encodes a chunk, zero-padded to [`ALIGN`](crate::ALIGN); with [`FLAG_ALIGNED64`] in
/// `flags`, each record zero-padded to start at a multiple of
/// [`RECORD_ALIGN`]; with [`FLAG_BLOCKS`], placed as that flag says. Returns the bytes and the table as written (offsets and
/// crcs filled in). Errors if the chunk would exceed the format's 4 GiB
/// chunk limit, a field would overflow, or `flags` has an unknown bit.
pub fn encode(chunk_id: u64, flags: u16, records: &[RecordIn<'_>]) -> Result<(Vec<u8>, Vec<RecordEntry>), HeaderError> {
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown chunk flags {flags:#06x}"));
    }
    let key_bytes: usize = records.iter().map(|r| r.key.len()).sum();
    let hlen = header_len(records.len(), key_bytes);
    let mut offsets = Vec::with_capacity(records.len());
    let mut chunk_len = hlen as u64;
    for r in records {
        let at = record_offset(chunk_len, r.stored.len() as u64, flags);
        offsets.push(at);
        chunk_len = at + r.stored.len() as u64;
    }
    if chunk_len > u32::MAX as u64 {
        return Err(format!(
            "chunk {chunk_id} would be {chunk_len} bytes; a chunk is limited to 4 GiB"
        ));
    }
    let mut out = Vec::with_capacity(align_up(chunk_len) as usize);
    out.extend_from_slice(&CHUNK_MAGIC);
    out.extend_from_slice(&CHUNK_VERSION.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&chunk_id.to_le_bytes());
    out.extend_from_slice(&(hlen as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // crc, patched below
    out.extend_from_slice(&chunk_len.to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    let mut entries = Vec::with_capacity(records.len());
    for (r, &offset) in records.iter().zip(&offsets) {
        let key_len = u32::try_from(r.key.len()).map_err(|_| "key longer than 4 GiB".to_string())?;
        let stored_len = r.stored.len() as u32; // bounded by chunk_len check
        let e = RecordEntry {
            offset: offset as u32, // bounded by chunk_len check
            stored_len,
            raw_len: r.raw_len,
            crc: crc32c::crc32c(r.stored),
            label: r.label,
            key: r.key.to_vec(),
        };
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.stored_len.to_le_bytes());
        out.extend_from_slice(&e.raw_len.to_le_bytes());
        out.extend_from_slice(&e.crc.to_le_bytes());
        out.extend_from_slice(&e.label.to_le_bytes());
        out.extend_from_slice(&key_len.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        entries.push(e);
    }
    for r in records {
        out.extend_from_slice(r.key);
    }
    let crc = crc32c::crc32c(&out[..hlen]);
    out[CRC_FIELD].copy_from_slice(&crc.to_le_bytes());
    for (r, &offset) in records.iter().zip(&offsets) {
        out.resize(offset as usize, 0);
        out.extend_from_slice(r.stored);
    }
    out.resize(align_up(chunk_len) as usize, 0);
    Ok((out, entries))
}

/// The fixed part: enough to learn `header_len` and `chunk_len` before the
/// table has been read. `buf` must hold at least [`FIXED_HEADER`] bytes.
pub fn peek_lengths(buf: &[u8]) -> Result<(u32, u64), HeaderError> {
    let mut r = Reader::new(buf);
    let magic = r.bytes(8).ok_or("truncated chunk header")?;
    if magic != CHUNK_MAGIC {
        return Err("bad chunk magic (not a brand chunk)".into());
    }
    let version = r.u16().ok_or("truncated chunk header")?;
    if version != CHUNK_VERSION {
        return Err(format!(
            "unsupported chunk version {version} (this build reads {CHUNK_VERSION})"
        ));
    }
    r.pos = 24;
    let hlen = r.u32().ok_or("truncated chunk header")?;
    r.pos = 32;
    let clen = r.u64().ok_or("truncated chunk header")?;
    if (hlen as usize) < FIXED_HEADER || hlen as u64 > clen {
        return Err(format!("inconsistent lengths: header {hlen} bytes, chunk {clen} bytes"));
    }
    if clen > u32::MAX as u64 {
        return Err(format!("chunk length {clen} exceeds the 4 GiB limit"));
    }
    Ok((hlen, clen))
}

/// Whether the chunk at the start of `buf` says its records are zstd frames:
/// magic, version and flags only, no checksum (see
/// [`Dataset::check_chunk_compression`](crate::Dataset::check_chunk_compression)).
pub fn compression_flag(buf: &[u8]) -> Result<bool, HeaderError> {
    let mut r = Reader::new(buf);
    if r.bytes(8).ok_or("truncated chunk header")? != CHUNK_MAGIC {
        return Err("bad chunk magic (not a brand chunk)".into());
    }
    let version = r.u16().ok_or("truncated chunk header")?;
    if version != CHUNK_VERSION {
        return Err(format!(
            "unsupported chunk version {version} (this build reads {CHUNK_VERSION})"
        ));
    }
    let flags = r.u16().ok_or("truncated chunk header")?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown chunk flags {flags:#06x}"));
    }
    Ok(flags & FLAG_ZSTD != 0)
}

/// Parses and checks a chunk header from `buf`, which starts at the chunk and
/// holds at least `header_len` bytes. Never panics on any input.
pub fn parse_header(buf: &[u8]) -> Result<ChunkHeader, HeaderError> {
    let (hlen, chunk_len) = peek_lengths(buf)?;
    let head = buf
        .get(..hlen as usize)
        .ok_or_else(|| format!("truncated chunk header: {} of {hlen} bytes", buf.len()))?;
    let mut r = Reader::new(head);
    r.pos = 10;
    let flags = r.u16().ok_or("truncated")?;
    let count = r.u32().ok_or("truncated")? as usize;
    let chunk_id = r.u64().ok_or("truncated")?;
    r.pos = 28;
    let stored_crc = r.u32().ok_or("truncated")?;
    let mut crc_input = head.to_vec();
    crc_input[CRC_FIELD].fill(0);
    let crc = crc32c::crc32c(&crc_input);
    if crc != stored_crc {
        return Err(format!(
            "chunk header checksum mismatch (stored {stored_crc:#010x}, computed {crc:#010x})"
        ));
    }
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown chunk flags {flags:#06x}"));
    }
    let table_end = count
        .checked_mul(RECORD_ENTRY)
        .and_then(|t| t.checked_add(FIXED_HEADER))
        .filter(|&e| e <= hlen as usize)
        .ok_or_else(|| format!("record table of {count} records does not fit a {hlen}-byte header"))?;
    r.pos = FIXED_HEADER;
    let mut key_pos = table_end;
    // The end of the header, then of each record.
    let mut end = hlen as u64;
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let offset = r.u32().ok_or("truncated")?;
        let stored_len = r.u32().ok_or("truncated")?;
        let raw_len = r.u32().ok_or("truncated")?;
        let crc = r.u32().ok_or("truncated")?;
        let label = r.i64().ok_or("truncated")?;
        let key_len = r.u32().ok_or("truncated")? as usize;
        r.u32().ok_or("truncated")?;
        let expected_offset = record_offset(end, stored_len as u64, flags);
        if offset as u64 != expected_offset {
            let why = match (flags & FLAG_ALIGNED64 != 0, flags & FLAG_BLOCKS != 0) {
                (true, false) => {
                    format!(" (the first 64-byte boundary at or after byte {end}: the chunk is flagged aligned64)")
                }
                (_, true) => format!(
                    " (after byte {end}, where a {stored_len}-byte record spans no more 4 KiB blocks than it needs: the chunk is flagged blocks)"
                ),
                (false, false) => String::new(),
            };
            return Err(format!("record {i}: offset {offset}, expected {expected_offset}{why}"));
        }
        end = expected_offset + stored_len as u64;
        if end > chunk_len {
            return Err(format!("record {i}: ends at {end}, past the chunk end {chunk_len}"));
        }
        let key = head
            .get(key_pos..key_pos.saturating_add(key_len))
            .ok_or_else(|| format!("record {i}: key runs past the header"))?
            .to_vec();
        key_pos += key_len;
        if flags & FLAG_ZSTD == 0 && raw_len != stored_len {
            return Err(format!(
                "record {i}: uncompressed but raw length {raw_len} != stored {stored_len}"
            ));
        }
        records.push(RecordEntry {
            offset,
            stored_len,
            raw_len,
            crc,
            label,
            key,
        });
    }
    if key_pos != hlen as usize {
        return Err(format!(
            "header has {} unexplained bytes after the keys",
            hlen as usize - key_pos
        ));
    }
    if end != chunk_len {
        return Err(format!("records end at {end}, chunk length says {chunk_len}"));
    }
    Ok(ChunkHeader {
        flags,
        chunk_id,
        header_len: hlen,
        chunk_len,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ALIGN;

    fn sample_chunk() -> Vec<u8> {
        let a = b"hello".to_vec();
        let b = vec![7u8; 5000];
        let recs = [
            RecordIn {
                stored: &a,
                raw_len: 5,
                label: 3,
                key: b"cls/a.jpg",
            },
            RecordIn {
                stored: &b,
                raw_len: 5000,
                label: -1,
                key: b"",
            },
        ];
        encode(9, 0, &recs).expect("encode").0
    }

    #[test]
    fn round_trip() {
        let bytes = sample_chunk();
        assert_eq!(bytes.len() as u64 % ALIGN, 0);
        let h = parse_header(&bytes).expect("parse");
        assert_eq!(h.chunk_id, 9);
        assert_eq!(h.records.len(), 2);
        assert_eq!(h.records[0].key, b"cls/a.jpg");
        assert_eq!(h.records[1].label, -1);
        let r = &h.records[1];
        let payload = &bytes[r.offset as usize..(r.offset + r.stored_len) as usize];
        assert_eq!(payload, &vec![7u8; 5000][..]);
        assert_eq!(crc32c::crc32c(payload), r.crc);
        assert_eq!(h.padded_len(), bytes.len() as u64);
    }

    #[test]
    fn any_header_byte_flip_is_caught() {
        let bytes = sample_chunk();
        let hlen = parse_header(&bytes).expect("parse").header_len as usize;
        for i in 0..hlen {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(parse_header(&b).is_err(), "flip at byte {i} went unnoticed");
        }
    }

    #[test]
    fn compression_flag_reads_the_fixed_header() {
        let plain = sample_chunk();
        assert_eq!(compression_flag(&plain), Ok(false));
        let z = encode(0, FLAG_ZSTD, &[]).expect("encode").0;
        assert_eq!(compression_flag(&z), Ok(true));
        assert!(compression_flag(&plain[..11]).is_err());
        assert!(compression_flag(&[0u8; 48]).is_err());
    }

    /// The sample chunk's records, encoded with `flags`.
    fn chunk_with(flags: u16) -> Vec<u8> {
        let (a, b, c) = (b"hello".to_vec(), vec![7u8; 5000], vec![9u8; 64]);
        let recs = [(&a, &b"k1"[..]), (&b, &b""[..]), (&c, &b"key three"[..])].map(|(s, key)| RecordIn {
            stored: s,
            raw_len: s.len() as u32,
            label: 1,
            key,
        });
        encode(4, flags, &recs).expect("encode").0
    }

    /// `bytes` with its header edited by `edit` and its checksum made
    /// right again, so what is refused is the edit, not the checksum.
    fn edited(mut bytes: Vec<u8>, edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let hlen = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")) as usize;
        edit(&mut bytes[..hlen]);
        bytes[CRC_FIELD].fill(0);
        let crc = crc32c::crc32c(&bytes[..hlen]);
        bytes[CRC_FIELD].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    fn set_u32(head: &mut [u8], at: usize, v: u32) {
        head[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn an_aligned64_chunk_round_trips_with_records_on_64_byte_boundaries() {
        for flags in [FLAG_ALIGNED64, FLAG_ALIGNED64 | FLAG_ZSTD] {
            let bytes = chunk_with(flags);
            let h = parse_header(&bytes).expect("parse");
            assert!(h.aligned64());
            assert_eq!(h.zstd(), flags & FLAG_ZSTD != 0);
            assert_eq!(compression_flag(&bytes), Ok(flags & FLAG_ZSTD != 0));
            let mut end = h.header_len as usize;
            for (r, (fill, len)) in h.records.iter().zip([(b'h', 5), (7, 5000), (9, 64)]) {
                let at = r.offset as usize;
                assert_eq!(at % 64, 0, "{r:?}");
                assert_eq!(
                    at,
                    end.next_multiple_of(64),
                    "{r:?}: padded no more than to the next boundary"
                );
                assert!(bytes[end..at].iter().all(|&b| b == 0), "the padding is zeros");
                let payload = &bytes[at..at + r.stored_len as usize];
                assert_eq!((payload[0], payload.len()), (fill, len));
                assert_eq!(crc32c::crc32c(payload), r.crc);
                end = at + len;
            }
            assert_eq!(h.chunk_len, end as u64);
            assert_eq!(h.padded_len(), bytes.len() as u64);
            assert_eq!(h.records[2].key, b"key three");
        }
        // Unflagged: back to back, as in every dataset packed before the flag.
        let h = parse_header(&chunk_with(0)).expect("parse");
        assert!(!h.aligned64());
        assert_eq!(h.records[1].offset, h.records[0].offset + 5);
        assert!(encode(0, 8, &[]).is_err(), "unknown flags are not written");
    }

    #[test]
    fn an_aligned64_chunk_refuses_any_gap_but_the_padding() {
        let flagged = chunk_with(FLAG_ALIGNED64);
        let h = parse_header(&flagged).expect("parse");
        let (r1, r2) = (h.records[1].offset, h.records[2].offset);
        // Record 1 a further 64 bytes on (still aligned; chunk_len stays right for the end).
        let e = parse_header(&edited(flagged.clone(), |head| set_u32(head, 48 + 32, r1 + 64))).expect_err("gap");
        assert!(
            e.contains(&format!("record 1: offset {}, expected {r1}", r1 + 64)) && e.contains("aligned64"),
            "{e}"
        );
        // Record 2 back to back with record 1, as an unflagged chunk would have it.
        let back_to_back = r1 + 5000;
        assert_ne!(back_to_back, r2);
        let e = parse_header(&edited(flagged.clone(), |head| set_u32(head, 48 + 64, back_to_back)))
            .expect_err("no padding");
        assert!(
            e.contains(&format!("record 2: offset {back_to_back}, expected {r2}")),
            "{e}"
        );
        // The flag cleared: the padding is a gap an unflagged chunk refuses.
        let e = parse_header(&edited(flagged.clone(), |head| head[10] = 0)).expect_err("unflagged with gaps");
        assert!(e.contains("record 0: offset") && !e.contains("aligned64"), "{e}");
        // The flag set on a back-to-back chunk: its records are not where the flag says.
        let e = parse_header(&edited(chunk_with(0), |head| head[10] = FLAG_ALIGNED64 as u8)).expect_err("flag only");
        assert!(e.contains("record 0: offset") && e.contains("aligned64"), "{e}");
        // A flag this build does not know.
        let e = parse_header(&edited(flagged, |head| head[10] |= 8)).expect_err("unknown flag");
        assert!(e.contains("unknown chunk flags 0x000a"), "{e}");
    }

    /// A chunk of `lens`-byte records (record i filled with byte i + 1) under `flags`.
    fn chunk_of(lens: &[usize], flags: u16) -> (Vec<u8>, ChunkHeader) {
        let payloads: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
        let recs: Vec<RecordIn<'_>> = payloads
            .iter()
            .map(|p| RecordIn {
                stored: p,
                raw_len: p.len() as u32,
                label: 0,
                key: b"k",
            })
            .collect();
        let bytes = encode(1, flags, &recs).expect("encode").0;
        let h = parse_header(&bytes).expect("parse");
        (bytes, h)
    }

    #[test]
    fn a_blocks_chunk_reads_every_record_in_the_fewest_blocks() {
        // Sizes that straddle a block from a 64-byte boundary unless moved:
        // one block exactly, multiples of it, small ones, one over a block.
        let lens = [
            4096, 100, 4096, 3000, 2000, 8192, 64, 4097, 0, 12288, 1, 4095, 5000, 4000,
        ];
        let flags = FLAG_ALIGNED64 | FLAG_BLOCKS;
        let (bytes, h) = chunk_of(&lens, flags);
        assert!(h.blocks() && h.aligned64());
        let mut end = h.header_len as u64;
        let mut padding = 0;
        for (i, (r, &len)) in h.records.iter().zip(&lens).enumerate() {
            let (at, len) = (r.offset as u64, len as u64);
            let blocks = (at + len).div_ceil(ALIGN) - at / ALIGN;
            assert!(
                len == 0 || blocks == len.div_ceil(ALIGN),
                "record {i} ({len} B at {at}) spans {blocks} blocks"
            );
            assert_eq!(at % 64, 0, "record {i}");
            let unmoved = end.next_multiple_of(64);
            // Moved only when it had to be, and then to the next boundary.
            assert!(
                at == unmoved || (extra_block(unmoved, len) && at == unmoved.next_multiple_of(ALIGN)),
                "record {i} at {at}, {unmoved} unmoved"
            );
            assert!(
                at - unmoved <= len.min(ALIGN).saturating_sub(1),
                "record {i}: padding under the record and a block"
            );
            assert!(bytes[end as usize..at as usize].iter().all(|&b| b == 0));
            assert!(
                bytes[at as usize..(at + len) as usize]
                    .iter()
                    .all(|&b| b == i as u8 + 1)
            );
            padding += at - unmoved;
            end = at + len;
        }
        assert!(padding > 0, "the sizes chosen make some record move");
        let table = h.records.iter().map(|r| (r.offset as u64, r.stored_len as u64));
        assert_eq!(block_padding(h.header_len as u64, flags, table), padding);
        // Without the flag, the same sizes straddle (what the flag is for).
        let (_, plain) = chunk_of(&lens, FLAG_ALIGNED64);
        assert!(
            plain
                .records
                .iter()
                .zip(&lens)
                .any(|(r, &len)| extra_block(r.offset as u64, len as u64))
        );
        let table = plain.records.iter().map(|r| (r.offset as u64, r.stored_len as u64));
        assert_eq!(block_padding(plain.header_len as u64, FLAG_ALIGNED64, table), 0);
    }

    #[test]
    fn a_blocks_chunk_refuses_a_record_not_where_the_flag_puts_it() {
        let flags = FLAG_ALIGNED64 | FLAG_BLOCKS;
        let (bytes, h) = chunk_of(&[4096, 4096, 3000], flags);
        let hl = h.header_len as u64;
        // Record 0 moved to the first block boundary (the header ends inside block 0).
        assert_eq!(h.records[0].offset as u64, hl.next_multiple_of(ALIGN));
        // Where aligned64 alone would put it: refused, naming the flag.
        let e = parse_header(&edited(bytes.clone(), |head| {
            set_u32(head, 48, hl.next_multiple_of(64) as u32)
        }))
        .expect_err("not moved");
        assert!(e.contains("record 0: offset") && e.contains("flagged blocks"), "{e}");
        // The flag cleared: the moved records are gaps aligned64 refuses.
        let e = parse_header(&edited(bytes, |head| head[10] = FLAG_ALIGNED64 as u8)).expect_err("flag cleared");
        assert!(e.contains("record 0: offset") && e.contains("aligned64"), "{e}");
    }

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        let bytes = sample_chunk();
        let hlen = parse_header(&bytes).expect("parse").header_len as usize;
        for n in 0..hlen {
            assert!(parse_header(&bytes[..n]).is_err());
        }
    }
}
