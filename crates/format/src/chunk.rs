//! Chunk encoding and header parsing (layout in the module above).

use super::{ALIGN, Reader, align_up};

pub const CHUNK_MAGIC: [u8; 8] = *b"BRDCHNK\0";
pub const CHUNK_VERSION: u16 = 1;
pub const FIXED_HEADER: usize = 48;
pub const RECORD_ENTRY: usize = 32;
pub const FLAG_ZSTD: u16 = 1;
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

/// Encodes a chunk, zero-padded to [`ALIGN`]. Returns the bytes and the table
/// as written (offsets and crcs filled in). Errors if the chunk would exceed
/// the format's 4 GiB chunk limit or a field would overflow.
pub fn encode(chunk_id: u64, flags: u16, records: &[RecordIn<'_>]) -> Result<(Vec<u8>, Vec<RecordEntry>), HeaderError> {
    let key_bytes: usize = records.iter().map(|r| r.key.len()).sum();
    let hlen = header_len(records.len(), key_bytes);
    let payload: u64 = records.iter().map(|r| r.stored.len() as u64).sum();
    let chunk_len = hlen as u64 + payload;
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
    let mut offset = hlen as u32;
    for r in records {
        let key_len = u32::try_from(r.key.len()).map_err(|_| "key longer than 4 GiB".to_string())?;
        let stored_len = r.stored.len() as u32; // bounded by chunk_len check
        let e = RecordEntry {
            offset,
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
        offset += stored_len;
        entries.push(e);
    }
    for r in records {
        out.extend_from_slice(r.key);
    }
    let crc = crc32c::crc32c(&out[..hlen]);
    out[CRC_FIELD].copy_from_slice(&crc.to_le_bytes());
    for r in records {
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
    if flags & !FLAG_ZSTD != 0 {
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
    if flags & !FLAG_ZSTD != 0 {
        return Err(format!("unknown chunk flags {flags:#06x}"));
    }
    let table_end = count
        .checked_mul(RECORD_ENTRY)
        .and_then(|t| t.checked_add(FIXED_HEADER))
        .filter(|&e| e <= hlen as usize)
        .ok_or_else(|| format!("record table of {count} records does not fit a {hlen}-byte header"))?;
    r.pos = FIXED_HEADER;
    let mut key_pos = table_end;
    let mut expected_offset = hlen as u64;
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let offset = r.u32().ok_or("truncated")?;
        let stored_len = r.u32().ok_or("truncated")?;
        let raw_len = r.u32().ok_or("truncated")?;
        let crc = r.u32().ok_or("truncated")?;
        let label = r.i64().ok_or("truncated")?;
        let key_len = r.u32().ok_or("truncated")? as usize;
        r.u32().ok_or("truncated")?;
        if offset as u64 != expected_offset {
            return Err(format!("record {i}: offset {offset}, expected {expected_offset}"));
        }
        expected_offset += stored_len as u64;
        if expected_offset > chunk_len {
            return Err(format!(
                "record {i}: ends at {expected_offset}, past the chunk end {chunk_len}"
            ));
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
    if expected_offset != chunk_len {
        return Err(format!(
            "records end at {expected_offset}, chunk length says {chunk_len}"
        ));
    }
    Ok(ChunkHeader {
        flags,
        chunk_id,
        header_len: hlen,
        chunk_len,
        records,
    })
}

/// How many bytes to read to be sure of holding the whole header, given the
/// fixed part: rounded up to [`ALIGN`].
pub fn header_read_len(header_len: u32) -> u64 {
    align_up(header_len as u64).max(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        let bytes = sample_chunk();
        let hlen = parse_header(&bytes).expect("parse").header_len as usize;
        for n in 0..hlen {
            assert!(parse_header(&bytes[..n]).is_err());
        }
    }
}
