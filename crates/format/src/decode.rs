//! From stored records to samples: the one place a record's length, crc32c
//! and zstd frame are checked against the index, for `cat`, `verify` and the
//! io engine alike. Errors name the segment file, chunk, offset and sample.

use crate::buffer::AlignedBuf;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::extents::Extent;

/// The bytes an extent read brought, as the reader holds them.
pub enum ExtentBytes<'a> {
    /// In a read buffer the reader keeps (and reuses): each sample is a copy.
    Borrowed(&'a [u8]),
    /// In a buffer of the extent's own, which becomes the sample when the
    /// extent carries one uncompressed record (no copy; see
    /// [`AlignedBuf::into_window`]); otherwise samples are copied out of it.
    Owned(AlignedBuf),
}

/// One record's stored bytes, as [`Dataset::decode_stored`] takes them.
enum Stored<'a> {
    /// Exactly the record's bytes.
    Slice(&'a [u8]),
    /// The uncompressed record at `at` in a buffer that becomes its sample.
    Window(AlignedBuf, usize),
}

impl Dataset {
    /// The sample of record `id` from its stored bytes (exactly the
    /// record's), in a fresh [`SAMPLE_ALIGN`](crate::buffer::SAMPLE_ALIGN)-aligned
    /// buffer. The length and zstd frame are always checked, the crc32c with
    /// `check_crc`.
    pub fn decode(&self, id: u64, stored: &[u8], check_crc: bool) -> Result<AlignedBuf> {
        self.decode_stored(id, Stored::Slice(stored), check_crc)
    }

    /// Each record `ext` carries, decoded from the extent's bytes: each gets
    /// its own outcome, so one bad record spoils no other.
    pub fn decode_extent(
        &self,
        ext: &Extent,
        bytes: ExtentBytes<'_>,
        check_crc: bool,
    ) -> Vec<(u64, Result<AlignedBuf>)> {
        let buf = match bytes {
            ExtentBytes::Owned(buf) => match ext.records[..] {
                [(id, at)] if !self.zstd() => {
                    let result = self
                        .record_inside(ext, id, at, buf.len())
                        .and_then(|at| self.decode_stored(id, Stored::Window(buf, at), check_crc));
                    return vec![(id, result)];
                }
                _ => buf,
            },
            ExtentBytes::Borrowed(bytes) => return self.decode_each(ext, bytes, check_crc),
        };
        self.decode_each(ext, &buf, check_crc)
    }

    fn decode_each(&self, ext: &Extent, bytes: &[u8], check_crc: bool) -> Vec<(u64, Result<AlignedBuf>)> {
        ext.records
            .iter()
            .map(|&(id, at)| {
                let result = self.record_inside(ext, id, at, bytes.len()).and_then(|at| {
                    let end = at + self.index.stored_len(id) as usize;
                    self.decode_stored(id, Stored::Slice(&bytes[at..end]), check_crc)
                });
                (id, result)
            })
            .collect()
    }

    /// Where record `id` starts among the `read` bytes of `ext`, if it ends
    /// inside them.
    fn record_inside(&self, ext: &Extent, id: u64, at: u64, read: usize) -> Result<usize> {
        let stored_len = self.index.stored_len(id) as u64;
        match at.checked_add(stored_len) {
            Some(end) if end <= read as u64 => Ok(at as usize),
            _ => Err(Error::Corrupt {
                segment: self.segment_path(ext.segment),
                chunk: self.index.chunk_of(id),
                offset: ext.offset + at,
                sample: id,
                what: format!("record of {stored_len} bytes runs past its read"),
            }),
        }
    }

    /// The one decoder. An uncompressed record is checksummed as it is
    /// copied (each block while in L1, so its bytes are read once) or as it
    /// moves into place in its own buffer; a zstd record is checksummed,
    /// then decompressed.
    fn decode_stored(&self, id: u64, stored: Stored<'_>, check_crc: bool) -> Result<AlignedBuf> {
        let i = id as usize;
        let want = self.index.stored_len(i as u64) as usize;
        let wrong_length = |len: usize| self.corrupt(id, format!("record is {len} bytes, index says {want}"));
        let (sample, crc) = match stored {
            Stored::Slice(s) if s.len() != want => return Err(wrong_length(s.len())),
            Stored::Slice(s) if self.zstd() => {
                if check_crc {
                    self.check_crc(id, crc32c::crc32c(s))?;
                }
                let raw_len = self.index.raw_len(i as u64) as usize;
                return AlignedBuf::zstd_decompressed(s, raw_len).map_err(|what| self.corrupt(id, what));
            }
            Stored::Slice(s) if check_crc => AlignedBuf::copy_of_with_crc32c(s),
            Stored::Slice(s) => (AlignedBuf::copy_of(s), 0),
            Stored::Window(buf, at) => {
                let len = buf.len().saturating_sub(at);
                buf.into_window(at, want, check_crc).map_err(|_| wrong_length(len))?
            }
        };
        if check_crc {
            self.check_crc(id, crc)?;
        }
        Ok(sample)
    }

    /// Checks every record of chunk `c` in `bytes` (the chunk's bytes from
    /// its start): each ends inside them and matches its crc32c. What a
    /// local tier checks before it keeps a chunk fetched whole.
    pub fn check_chunk(&self, c: u64, bytes: &[u8]) -> Result<()> {
        for id in self.index.chunk_ids(c) {
            let at = self.index.rel_offset(id) as usize;
            let end = at + self.index.stored_len(id) as usize;
            let Some(stored) = bytes.get(at..end) else {
                return Err(self.corrupt(
                    id,
                    format!("record ends at {end}, past the chunk's {} bytes", bytes.len()),
                ));
            };
            self.check_crc(id, crc32c::crc32c(stored))?;
        }
        Ok(())
    }

    fn check_crc(&self, id: u64, computed: u32) -> Result<()> {
        let stored = self.index.crc(id);
        if computed != stored {
            return Err(self.corrupt(
                id,
                format!("crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"),
            ));
        }
        Ok(())
    }

    fn corrupt(&self, id: u64, what: String) -> Error {
        let (segment, offset, _) = self.index.record_location(id);
        Error::Corrupt {
            segment: self.segment_path(segment),
            chunk: self.index.chunk_of(id),
            offset,
            sample: id,
            what,
        }
    }
}
