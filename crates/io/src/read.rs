//! Reading one extent completely: the bookkeeping both backends share
//! (short reads, EOF, transient errors, O_DIRECT refused at read time), and
//! which extents are read into a buffer that becomes their sample.

use std::os::unix::fs::MetadataExt;

use brand_format::dataset::Dataset;
use brand_format::error::Error;
use brand_format::extents::Extent;

use crate::files::fall_back;
use crate::job::EngineStats;

/// Retries of a read that failed with EAGAIN or EINTR before it is an error.
const TRANSIENT_RETRIES: u32 = 16;

/// How one attempt at a read ended, for [`ReadLoop`].
pub(crate) enum Step {
    /// Read more (or retry).
    Again,
    /// The extent is read.
    Done,
    /// Reopen without O_DIRECT and retry.
    Reopen,
    Fail(Error),
}

/// The bookkeeping of reading one extent completely, shared by both
/// backends: short reads continue, EOF names the file's real end, transient
/// errors are retried a bounded number of times, O_DIRECT refused at read
/// time falls back, and every other errno is an I/O error (not corruption).
pub(crate) struct ReadLoop<'a> {
    pub ds: &'a Dataset,
    pub ext: &'a Extent,
    pub done: usize,
    pub direct: bool,
    pub transient: u32,
}

impl<'a> ReadLoop<'a> {
    pub fn new(ds: &'a Dataset, ext: &'a Extent, direct: bool) -> Self {
        ReadLoop {
            ds,
            ext,
            done: 0,
            direct,
            transient: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.ext.len as usize
    }

    pub fn pos(&self) -> u64 {
        self.ext.offset + self.done as u64
    }

    /// Accounts for one read's result.
    pub fn step(&mut self, res: std::io::Result<usize>, stats: &EngineStats) -> Step {
        match res {
            Ok(0) => Step::Fail(self.short_read()),
            Ok(n) => {
                self.done += n;
                if self.done >= self.len() {
                    Step::Done
                } else {
                    Step::Again
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && self.direct => {
                let path = self.ds.segment_path(self.ext.segment);
                fall_back(&path, stats);
                self.direct = false;
                Step::Reopen
            }
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR))
                    && self.transient < TRANSIENT_RETRIES =>
            {
                self.transient += 1;
                Step::Again
            }
            Err(e) => Step::Fail(self.io_error(e)),
        }
    }

    /// An I/O error of this read, naming the file and the offset.
    pub fn io_error(&self, e: std::io::Error) -> Error {
        Error::io(
            self.ds.segment_path(self.ext.segment),
            std::io::Error::new(
                e.kind(),
                format!("reading {} bytes at byte {}: {e}", self.len() - self.done, self.pos()),
            ),
        )
    }

    /// The segment ended before the extent did: data is missing.
    fn short_read(&self) -> Error {
        let path = self.ds.segment_path(self.ext.segment);
        let end = std::fs::metadata(&path).map(|m| m.size()).unwrap_or(self.pos());
        let sample = self.ext.records.first().map(|r| r.0).unwrap_or(0);
        Error::Corrupt {
            chunk: self.ds.index.chunk_of(sample),
            segment: path,
            offset: self.pos(),
            sample,
            what: format!(
                "segment ends at byte {end} (truncated?): needed bytes {}..{}",
                self.ext.offset,
                self.ext.offset + self.ext.len
            ),
        }
    }
}

/// Uncompressed records of at least this many bytes that are alone in their
/// extent are read into a buffer of their own that becomes the sample
/// ([`ExtentBytes::Owned`](brand_format::decode::ExtentBytes::Owned)): no
/// copy out of a read buffer. Smaller ones are too when their extent's
/// bytes beyond the record are at most 1/8 of it (a 4 KiB sample in its
/// block: the small samples' size classes waste as much); others are copied
/// (their page slack would be a larger share of resident memory).
pub(crate) const IN_PLACE_MIN: usize = brand_format::extents::READ_ALONE_BYTES as usize;

/// Whether `ext` is read into a buffer that becomes its record's sample
/// (see [`IN_PLACE_MIN`]). Compressed records are decompressed into a
/// buffer of their own anyway.
pub(crate) fn reads_in_place(ds: &Dataset, ext: &Extent) -> bool {
    let [(id, _)] = ext.records.as_slice() else {
        return false;
    };
    if *id >= ds.index.samples() {
        return false;
    }
    let stored = ds.index.stored_len(*id) as u64;
    !ds.zstd() && (stored >= IN_PLACE_MIN as u64 || ext.len.saturating_sub(stored) <= stored / 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use brand_format::buffer::{AlignedBuf, SAMPLE_ALIGN};
    use brand_format::decode::ExtentBytes;
    use brand_format::extents::Records;
    use brand_import::synthetic::{GenOptions, generate_and_pack};
    use brand_pack::PackOptions;

    /// A dataset packed from generated samples under `root/src`.
    fn dataset(root: &Path, zstd: Option<i32>) -> Dataset {
        let g = GenOptions {
            samples: 24,
            mean_bytes: 90_000,
            min_bytes: 100,
            max_bytes: 200_000,
            classes: 2,
            compressible: zstd.map(|_| 3),
            ..Default::default()
        };
        let p = PackOptions {
            chunk_size: 8,
            zstd,
            ..Default::default()
        };
        Dataset::open(generate_and_pack(root, &g, &p).expect("pack")).expect("open")
    }

    /// The generator's file for sample `id` (its key is the path under
    /// `root/src`): what decoding must give back, found without the decoder.
    fn source_bytes(root: &Path, ds: &Dataset, id: u64) -> Vec<u8> {
        let key = std::str::from_utf8(ds.index.key(id)).expect("utf-8 key");
        std::fs::read(root.join("src").join(key)).expect("source file")
    }

    /// Record `id` exactly as stored in its segment.
    fn stored_bytes(ds: &Dataset, id: u64) -> Vec<u8> {
        let (segment, offset, len) = ds.index.record_location(id);
        let seg = std::fs::read(ds.segment_path(segment)).expect("segment");
        seg[offset as usize..offset as usize + len as usize].to_vec()
    }

    /// A record read alone into a buffer of its own is served from that very
    /// buffer, 64-aligned, with the generator's bytes, wherever it starts in
    /// it (on a 64-byte boundary or not); a damaged record gets its crc
    /// error, not a sample; one that runs past its read, its own error.
    #[test]
    fn in_place_decode_serves_the_record_aligned_and_names_damage() {
        let t = tempfile::tempdir().expect("tempdir");
        let ds = dataset(t.path(), None);
        let id = (0..ds.index.samples())
            .find(|&i| ds.index.stored_len(i) as usize >= IN_PLACE_MIN)
            .expect("a record of at least IN_PLACE_MIN bytes");
        let segment = ds.index.record_location(id).0;
        let record = stored_bytes(&ds, id);
        let want = source_bytes(t.path(), &ds, id);
        let len = record.len();
        for at in [0usize, 64, 4096 + 192, 1, 63, 100, 4095] {
            for damaged in [false, true] {
                let ext = Extent {
                    segment,
                    offset: 0,
                    len: brand_format::align_up((at + len) as u64),
                    records: Records::from_slice(&[(id, at as u64)]),
                };
                assert!(reads_in_place(&ds, &ext));
                let mut buf = AlignedBuf::for_extent(ext.len as usize);
                buf.spare_mut()[..ext.len as usize].fill(0xee);
                buf.spare_mut()[at..at + len].copy_from_slice(&record);
                if damaged {
                    buf.spare_mut()[at + len / 2] ^= 0x01;
                }
                buf.set_len(ext.len as usize);
                let base = buf.as_ptr() as usize;
                let mut out = ds.decode_extent(&ext, ExtentBytes::Owned(buf), true);
                assert_eq!(out.len(), 1);
                let (got, result) = out.remove(0);
                assert_eq!(got, id);
                if damaged {
                    let err = result.expect_err("a damaged record is no sample").to_string();
                    assert!(
                        err.contains("crc32c mismatch") && err.contains(&format!("sample {id}")),
                        "at {at}: {err}"
                    );
                    continue;
                }
                let sample = result.expect("good record");
                assert_eq!(&sample[..], &want[..], "at {at}");
                assert_eq!(sample.as_ptr() as usize % SAMPLE_ALIGN, 0, "at {at}");
                assert_eq!(
                    sample.as_ptr() as usize,
                    base + at / SAMPLE_ALIGN * SAMPLE_ALIGN,
                    "at {at}: served from the buffer it was read into"
                );
            }
        }
        // The record runs past the bytes read: its own error, no panic.
        let ext = Extent {
            segment,
            offset: 0,
            len: brand_format::align_up(len as u64) - 4096,
            records: Records::from_slice(&[(id, 0)]),
        };
        let mut buf = AlignedBuf::for_extent(ext.len as usize);
        buf.set_len(ext.len as usize);
        let out = ds.decode_extent(&ext, ExtentBytes::Owned(buf), true);
        let err = out[0].1.as_ref().expect_err("short").to_string();
        assert!(err.contains("runs past its read"), "{err}");
        // Compressed records take the copying path.
        let ext_of = |id| Extent {
            segment,
            offset: 0,
            len: 4096,
            records: Records::from_slice(&[(id, 0)]),
        };
        let t = tempfile::tempdir().expect("tempdir");
        assert!(!reads_in_place(&dataset(t.path(), Some(3)), &ext_of(id)));
    }

    /// A dataset of `n` samples of exactly `bytes` bytes each.
    fn sized_dataset(root: &Path, bytes: u64, n: u64) -> Dataset {
        let g = GenOptions {
            samples: n,
            mean_bytes: bytes,
            min_bytes: bytes,
            max_bytes: bytes,
            classes: 2,
            ..Default::default()
        };
        let p = PackOptions {
            chunk_size: 16,
            ..Default::default()
        };
        Dataset::open(generate_and_pack(root, &g, &p).expect("pack")).expect("open")
    }

    /// Records of whole blocks (4 and 8 KiB), read one to an extent, are
    /// read straight into the page-aligned buffer that becomes the sample
    /// (no copy out of a read buffer), still checksummed: a damaged one is
    /// its crc error. A small record with more page slack than 1/8 of it is
    /// copied out instead.
    #[test]
    fn whole_block_records_are_read_into_their_samples() {
        use brand_format::extents::{ReadGap, extents};
        for bytes in [4096u64, 8192] {
            let t = tempfile::tempdir().expect("tempdir");
            let ds = sized_dataset(t.path(), bytes, 40);
            let seg = std::fs::read(ds.segment_path(0)).expect("segment");
            let mut n = 0;
            for chunk in 0..ds.index.chunk_count() {
                for ext in extents(&ds.index, chunk, 0b10101, ReadGap::Bytes(0)) {
                    assert!(reads_in_place(&ds, &ext), "{bytes}: {ext:?}");
                    let (id, at) = ext.records[0];
                    assert_eq!(
                        (at, ext.len),
                        (0, bytes),
                        "the blocks layout puts it alone in its blocks"
                    );
                    for damaged in [false, true] {
                        let mut buf = AlignedBuf::for_extent(ext.len as usize);
                        let base = buf.spare_ptr() as usize;
                        assert_eq!(base % brand_format::ALIGN as usize, 0, "O_DIRECT-aligned");
                        let (from, to) = (ext.offset as usize, (ext.offset + ext.len) as usize);
                        buf.spare_mut()[..ext.len as usize].copy_from_slice(&seg[from..to]);
                        if damaged {
                            buf.spare_mut()[7] ^= 0x20;
                        }
                        buf.set_len(ext.len as usize);
                        let mut out = ds.decode_extent(&ext, ExtentBytes::Owned(buf), true);
                        let (got, result) = out.remove(0);
                        assert_eq!(got, id);
                        if damaged {
                            let err = result.expect_err("damaged").to_string();
                            assert!(err.contains("crc32c mismatch"), "{err}");
                            continue;
                        }
                        let sample = result.expect("good record");
                        assert_eq!(&sample[..], &source_bytes(t.path(), &ds, id)[..]);
                        assert_eq!(sample.as_ptr() as usize, base, "served from the buffer read into");
                        n += 1;
                    }
                }
            }
            assert_eq!(n, 3 * ds.index.chunk_count() as usize, "{bytes}");
        }
        // 2,000 bytes in a 4 KiB block: the slack is more than the record; copied.
        let t = tempfile::tempdir().expect("tempdir");
        let ds = sized_dataset(t.path(), 2000, 20);
        let ext = &extents(&ds.index, 0, 1, ReadGap::Bytes(0))[0];
        assert_eq!(ext.len, 4096);
        assert!(!reads_in_place(&ds, ext));
        // 3,900 bytes in a 4 KiB block (slack under 1/8): read in place.
        let t = tempfile::tempdir().expect("tempdir");
        let ds = sized_dataset(t.path(), 3900, 20);
        assert!(reads_in_place(&ds, &extents(&ds.index, 0, 1, ReadGap::Bytes(0))[0]));
    }

    /// Decoding a record (the one-pass copy and crc32c where uncompressed,
    /// zstd where compressed) gives the generator's bytes, alone or among
    /// its extent's records; a damaged record gets its named error, not a
    /// sample, and spoils no neighbour.
    #[test]
    fn fast_decode_matches_the_source_and_names_damage() {
        for zstd in [None, Some(3)] {
            let t = tempfile::tempdir().expect("tempdir");
            let ds = dataset(t.path(), zstd);
            for id in 0..ds.index.samples() {
                let want = source_bytes(t.path(), &ds, id);
                let mut stored = stored_bytes(&ds, id);
                let decoded = ds.decode(id, &stored, true).expect("good record");
                assert_eq!(&decoded[..], &want[..], "{zstd:?} sample {id}");
                assert_eq!(decoded.as_ptr() as usize % SAMPLE_ALIGN, 0);
                let last = stored.len() - 1;
                stored[last] ^= 0x10;
                let err = ds.decode(id, &stored, true).expect_err("damaged record");
                assert!(
                    err.to_string().contains("crc32c mismatch"),
                    "{zstd:?} sample {id}: {err}"
                );
                let err = ds.decode(id, &stored[..last], true).expect_err("short record");
                assert!(err.to_string().contains("index says"), "{zstd:?} sample {id}: {err}");
            }
            // Whole chunks, one record damaged in the read buffer.
            for chunk in 0..ds.index.chunk_count() {
                let ext =
                    brand_format::extents::extents(&ds.index, chunk, u64::MAX, brand_format::extents::ReadGap::Whole);
                let [ext] = &ext[..] else {
                    panic!("one extent per whole chunk")
                };
                let seg = std::fs::read(ds.segment_path(ext.segment)).expect("segment");
                let mut bytes = seg[ext.offset as usize..(ext.offset + ext.len) as usize].to_vec();
                let (bad, at) = ext.records[1];
                bytes[at as usize] ^= 0x01;
                let out = ds.decode_extent(ext, ExtentBytes::Borrowed(&bytes), true);
                assert_eq!(out.len(), ext.records.len());
                for (id, result) in out {
                    if id == bad {
                        let err = result.expect_err("damaged record").to_string();
                        assert!(err.contains("crc32c mismatch"), "{zstd:?} sample {id}: {err}");
                    } else {
                        let sample = result.expect("good record");
                        assert_eq!(
                            &sample[..],
                            &source_bytes(t.path(), &ds, id)[..],
                            "{zstd:?} sample {id}"
                        );
                    }
                }
            }
        }
    }
}
