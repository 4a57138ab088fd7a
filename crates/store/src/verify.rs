//! `brand verify`: re-read every chunk and check it against itself and the
//! index; and rebuilding `index.bin` from the self-contained chunks.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use brand_format::chunk::{self, ChunkHeader, FIXED_HEADER};
use brand_format::dataset::Dataset;
use brand_format::error::{Error, IoContext, Result};
use brand_format::index::{ChunkLoc, Index, SampleMeta};
use brand_format::manifest::Manifest;
use brand_format::{self as format, align_up};

/// One thing wrong with the dataset.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    pub segment: PathBuf,
    /// Byte offset in the segment.
    pub offset: u64,
    pub chunk: Option<u64>,
    pub sample: Option<u64>,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.segment.display())?;
        if let Some(c) = self.chunk {
            write!(f, "chunk {c} ")?;
        }
        write!(f, "at byte {}", self.offset)?;
        if let Some(s) = self.sample {
            write!(f, ", sample {s}")?;
        }
        write!(f, ": {}", self.what)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Chunks (and their samples) checked: a partition's own only.
    pub chunks: u64,
    pub samples: u64,
    pub bytes_read: u64,
    /// Chunks of a dataset in object storage fetched a second time because
    /// their first fetch failed a check (the problems are the second's).
    pub fetched_again: u64,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every chunk of `ds`: the header parses, describes the chunk the
/// index says is there, every record's crc32c (and zstd frame) is good, and
/// the segment files have the sizes the manifest records. Problems are
/// collected, not returned as the first error, so one run lists them all.
pub fn verify(ds: &Dataset, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<VerifyReport> {
    verify_with(ds, &crate::GetPolicy::default(), progress)
}

/// [`verify`], a dataset in object storage fetched under `policy` (the
/// user's `stall_timeout` and retries).
pub fn verify_with(
    ds: &Dataset,
    policy: &crate::GetPolicy,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<VerifyReport> {
    if ds.is_remote() {
        return verify_objects(ds, policy, progress);
    }
    let idx = &ds.index;
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for (s, info) in ds.manifest.segments.iter().enumerate() {
        let path = ds.segment_path(s as u32);
        // Another partition's segment: not here, by design.
        if !ds.holds_segment(s as u32) {
            files.push(None);
            continue;
        }
        match File::open(&path) {
            Ok(f) => {
                let len = f.metadata().at(&path)?.len();
                if len != info.bytes {
                    problems.push(Problem {
                        segment: path.clone(),
                        offset: len.min(info.bytes),
                        chunk: None,
                        sample: None,
                        what: format!("segment is {len} bytes, manifest.toml says {}", info.bytes),
                    });
                }
                files.push(Some((f, len)));
            }
            Err(e) => {
                problems.push(Problem {
                    segment: path,
                    offset: 0,
                    chunk: None,
                    sample: None,
                    what: format!("cannot open: {e}"),
                });
                files.push(None);
            }
        }
    }
    let done = std::sync::atomic::AtomicU64::new(0);
    let held = held_chunks(ds);
    let total = held.len() as u64;
    let per_chunk: Vec<(u64, Vec<Problem>)> = brand_format::parallel::try_map(held.len(), |i| {
        let c = held[i];
        let loc = idx.chunk(c);
        let r = match &files[loc.segment as usize] {
            Some((f, file_len)) => check_chunk(ds, f, *file_len, c),
            None => (0, Vec::new()), // already reported as unopenable
        };
        let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if d.is_multiple_of(64) || d == total {
            progress(d, total);
        }
        Ok::<_, std::convert::Infallible>(r)
    })
    .unwrap_or_else(|never| match never {});
    let mut bytes_read = 0;
    for (b, p) in per_chunk {
        bytes_read += b;
        problems.extend(p);
    }
    Ok(report(ds, &held, bytes_read, problems))
}

fn check_chunk(ds: &Dataset, file: &File, file_len: u64, c: u64) -> (u64, Vec<Problem>) {
    let loc = ds.index.chunk(c);
    let len = ds.index.chunk_padded_len(c);
    // Checked before allocating: the length comes from the index.
    if loc.offset.saturating_add(len) > file_len {
        let what = format!("chunk's {len} bytes run past the end of the segment (truncated at byte {file_len})");
        return (0, vec![chunk_problem(ds, c, what)]);
    }
    let mut buf = vec![0u8; len as usize];
    if let Err(e) = read_full_at(file, &mut buf, loc.offset) {
        let what = format!("cannot read the chunk's {len} bytes: {e}");
        return (0, vec![chunk_problem(ds, c, what)]);
    }
    let mut problems = Vec::new();
    check_chunk_bytes(ds, c, &buf, &mut problems);
    (len, problems)
}

/// A problem with chunk `c` as a whole, at its offset.
fn chunk_problem(ds: &Dataset, c: u64, what: String) -> Problem {
    let loc = ds.index.chunk(c);
    Problem {
        segment: ds.segment_path(loc.segment),
        offset: loc.offset,
        chunk: Some(c),
        sample: None,
        what,
    }
}

/// Every check of chunk `c` on its bytes `buf` (the index's padded length of it).
fn check_chunk_bytes(ds: &Dataset, c: u64, buf: &[u8], problems: &mut Vec<Problem>) {
    let idx = &ds.index;
    let loc = idx.chunk(c);
    let segment = ds.segment_path(loc.segment);
    let len = buf.len();
    let mut problem = |sample: Option<u64>, offset: u64, what: String| {
        problems.push(Problem {
            segment: segment.clone(),
            offset,
            chunk: Some(c),
            sample,
            what,
        })
    };
    let header = match chunk::parse_header(buf) {
        Ok(h) => h,
        Err(e) => {
            problem(None, loc.offset, format!("bad chunk header: {e}"));
            return;
        }
    };
    if header.chunk_id != c {
        problem(
            None,
            loc.offset,
            format!("header says chunk {}, index expects chunk {c}", header.chunk_id),
        );
    }
    if header.zstd() != ds.zstd() {
        problem(None, loc.offset, "compression flag disagrees with manifest.toml".into());
    }
    if header.records.len() != loc.record_count as usize {
        problem(
            None,
            loc.offset,
            format!("{} records, index says {}", header.records.len(), loc.record_count),
        );
        return;
    }
    let first = c * idx.chunk_size() as u64;
    for (slot, rec) in header.records.iter().enumerate() {
        let id = first + slot as u64;
        let i = id as usize;
        let at = loc.offset + rec.offset as u64;
        let mut mismatch = |field: &str, chunk_has: String, index_has: String| {
            problem(
                Some(id),
                at,
                format!("{field}: chunk header has {chunk_has}, index.bin has {index_has}"),
            )
        };
        if rec.offset != idx.rel_offset(i as u64) {
            mismatch("offset", rec.offset.to_string(), idx.rel_offset(i as u64).to_string());
        }
        if rec.stored_len != idx.stored_len(i as u64) {
            mismatch(
                "stored length",
                rec.stored_len.to_string(),
                idx.stored_len(i as u64).to_string(),
            );
        }
        if rec.raw_len != idx.raw_len(i as u64) {
            mismatch("raw length", rec.raw_len.to_string(), idx.raw_len(i as u64).to_string());
        }
        if rec.crc != idx.crc(i as u64) {
            mismatch(
                "crc32c",
                format!("{:#010x}", rec.crc),
                format!("{:#010x}", idx.crc(i as u64)),
            );
        }
        if rec.label != idx.label(i as u64) {
            mismatch("label", rec.label.to_string(), idx.label(i as u64).to_string());
        }
        if rec.key != idx.key(id) {
            mismatch(
                "key",
                format!("{:?}", String::from_utf8_lossy(&rec.key)),
                format!("{:?}", String::from_utf8_lossy(idx.key(id))),
            );
        }
        // The header's records are checked against its own chunk length,
        // the buffer against the index's: they may disagree.
        let range = rec.offset as usize..rec.offset as usize + rec.stored_len as usize;
        let Some(stored) = buf.get(range) else {
            problem(
                Some(id),
                at,
                format!(
                    "record runs past the {len} bytes index.bin gives chunk {c} (header says {} bytes)",
                    header.chunk_len
                ),
            );
            continue;
        };
        if let Err(e) = ds.decode(id, stored, true) {
            let what = match e {
                Error::Corrupt { what, .. } => what,
                other => other.to_string(),
            };
            problem(Some(id), at, what);
        }
    }
}

/// The chunks `ds`'s directory (or store prefix) holds: all of a whole
/// dataset's, a partition's own.
fn held_chunks(ds: &Dataset) -> Vec<u64> {
    (0..ds.index.chunk_count()).filter(|&c| ds.holds_chunk(c)).collect()
}

/// The report of checking the chunks `held`.
fn report(ds: &Dataset, held: &[u64], bytes_read: u64, mut problems: Vec<Problem>) -> VerifyReport {
    // The index's keys are not checked when it is opened (readers need not
    // touch them): here they are.
    if let Err(what) = ds.index.check_keys() {
        problems.push(Problem {
            segment: ds.dir().join(brand_format::INDEX_FILE),
            offset: 0,
            chunk: None,
            sample: None,
            what,
        });
    }
    VerifyReport {
        chunks: held.len() as u64,
        samples: held.iter().map(|&c| ds.index.chunk_records(c) as u64).sum(),
        bytes_read,
        fetched_again: 0,
        problems,
    }
}

/// [`verify`] of a dataset in object storage: every chunk fetched (ranged
/// GETs, many in flight, pinned to the versions opened; the objects' sizes
/// were checked against the manifest at open) and checked as from a file.
fn verify_objects(
    ds: &Dataset,
    policy: &crate::GetPolicy,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<VerifyReport> {
    let held = held_chunks(ds);
    let total = held.len() as u64;
    let (mut problems, mut bytes_read, mut done) = (Vec::new(), 0u64, 0u64);
    let mut fetched_again = 0;
    // Bytes damaged on the way are not the dataset's: a chunk that fails a
    // check is fetched once more, and what that fetch shows is the answer.
    crate::for_each_chunk(ds, &held, policy, &mut |c, bytes, again| {
        if !again {
            done += 1;
            if done.is_multiple_of(64) || done == total {
                progress(done, total);
            }
        }
        match bytes {
            Ok(buf) => {
                bytes_read += buf.len() as u64;
                let mut found = Vec::new();
                check_chunk_bytes(ds, c, &buf, &mut found);
                if !found.is_empty() && !again {
                    fetched_again += 1;
                    return true;
                }
                problems.extend(found);
            }
            Err(e) => {
                let what = if again {
                    "cannot fetch the chunk again"
                } else {
                    "cannot fetch the chunk"
                };
                problems.push(chunk_problem(ds, c, format!("{what}: {e}")));
            }
        }
        false
    })?;
    let mut r = report(ds, &held, bytes_read, problems);
    r.fetched_again = fetched_again;
    Ok(r)
}

/// `read_exact_at` with a message that says how far the file got.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("segment ends at byte {} (truncated)", offset + done as u64),
                ));
            }
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Rebuilds `index.bin` from the segments named in `manifest.toml`, walking
/// the self-contained chunk headers. Writes the new index atomically and
/// returns it. Fails (naming segment and offset) if a chunk header is bad:
/// the index cannot be rebuilt past it.
pub fn rebuild_index(dir: &Path) -> Result<Index> {
    let mpath = dir.join(format::MANIFEST_FILE);
    let manifest = Manifest::load(&mpath)?;
    if let Some(p) = manifest.partition {
        return Err(Error::format(
            &mpath,
            0,
            format!(
                "partition {} of {}: its chunks alone cannot rebuild the whole index; copy index.bin from another partition of the same pack",
                p.index, p.count
            ),
        ));
    }
    let mut chunks = Vec::new();
    let mut samples = Vec::new();
    for (s, info) in manifest.segments.iter().enumerate() {
        let path = dir.join(&info.name);
        let file = File::open(&path).at(&path)?;
        let size = file.metadata().at(&path)?.len();
        let mut offset = 0u64;
        while offset < size {
            let header = read_header_at(&file, &path, offset)?;
            let expect = chunks.len() as u64;
            if header.chunk_id != expect {
                return Err(Error::format(
                    &path,
                    offset,
                    format!("chunk {} where chunk {expect} was expected", header.chunk_id),
                ));
            }
            if offset + header.padded_len() > size {
                return Err(Error::format(
                    &path,
                    offset,
                    format!("chunk {expect} runs past the end of the segment (truncated at byte {size})"),
                ));
            }
            chunks.push(ChunkLoc {
                segment: s as u32,
                record_count: header.records.len() as u32,
                offset,
            });
            for r in header.records.iter() {
                samples.push(SampleMeta {
                    rel_offset: r.offset,
                    stored_len: r.stored_len,
                    raw_len: r.raw_len,
                    crc: r.crc,
                    label: r.label,
                    key: r.key.clone(),
                });
            }
            offset += header.padded_len();
        }
    }
    let ipath = dir.join(format::INDEX_FILE);
    let index = Index::new(manifest.chunk_size, manifest.segments.len() as u32, chunks, samples)
        .map_err(|e| Error::format(&ipath, 0, format!("rebuilt index is inconsistent: {e}")))?;
    let tmp = dir.join(".index.bin.rebuild");
    brand_format::durable::write_synced(&tmp, index.as_bytes())?;
    std::fs::rename(&tmp, &ipath).at(&ipath)?;
    Ok(index)
}

fn read_header_at(file: &File, path: &Path, offset: u64) -> Result<ChunkHeader> {
    let mut fixed = vec![0u8; FIXED_HEADER];
    read_full_at(file, &mut fixed, offset).map_err(|e| Error::format(path, offset, format!("chunk header: {e}")))?;
    let (hlen, _) = chunk::peek_lengths(&fixed).map_err(|e| Error::format(path, offset, e))?;
    let mut head = vec![0u8; align_up(hlen as u64) as usize];
    read_full_at(file, &mut head[..hlen as usize], offset)
        .map_err(|e| Error::format(path, offset, format!("chunk header: {e}")))?;
    chunk::parse_header(&head[..hlen as usize]).map_err(|e| Error::format(path, offset, e))
}
