//! Packs that survive a crash. Every few seconds a pack makes what it has
//! written durable and records how far it got in `resume.json` in its work
//! directory (`.NAME.packing-PID`). A pack killed (SIGKILL, OOM, power loss)
//! or interrupted (SIGINT, SIGTERM) leaves that directory; the next pack of
//! the same inputs with the same options into the same OUT takes it over,
//! cuts segments and index columns back to the checkpoint and goes on from
//! the chunk after it. The dataset is byte-identical to an uninterrupted
//! pack's: the pack order is a function of the seed and the listing, and the
//! checkpoint of the listing, options and build (its fingerprint) must match.
//! Anything else (other inputs or options, a damaged directory) starts over.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use brand_format::error::{Error, IoContext, Result};
use brand_format::index::IndexWriterState;
use brand_format::manifest::SegmentInfo;
use serde::{Deserialize, Serialize};

use crate::PackOptions;
use crate::source::Source;

/// The checkpoint's file in a pack's work directory.
pub const CHECKPOINT_FILE: &str = "resume.json";

/// How far a pack got, durably: everything it needs to go on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// Of the listing, options and build ([`fingerprint`]).
    pub fingerprint: String,
    /// Chunks written, in pack order; the pack goes on at this chunk.
    pub chunks_done: u64,
    pub chunks_total: u64,
    /// Every segment started so far (an open one's `bytes` are not final).
    pub segments: Vec<SegmentInfo>,
    /// Per partition, the segment being written.
    pub open_segments: Vec<Option<OpenSegment>>,
    pub index: IndexWriterState,
    pub totals: Totals,
}

/// A segment being written, as a checkpoint records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OpenSegment {
    pub number: u32,
    pub offset: u64,
    pub chunks: u64,
}

/// What the manifest sums over every chunk written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Totals {
    pub labels: BTreeSet<i64>,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub min_len: u64,
    pub max_len: u64,
    pub data_bytes: u64,
    pub block_padding_bytes: u64,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            labels: BTreeSet::new(),
            raw_bytes: 0,
            stored_bytes: 0,
            min_len: u64::MAX,
            max_len: 0,
            data_bytes: 0,
            block_padding_bytes: 0,
        }
    }
}

/// What decides the bytes a pack writes: the build, the options, the
/// inputs' sizes and times (where they are local files or directories) and
/// the listing (every key and label, in order). A resume needs the same.
/// Files rewritten in place with the same size and time are not noticed.
pub(crate) fn fingerprint(source: &dyn Source, opts: &PackOptions) -> String {
    // SipHash with fixed keys: the same for the same build, which is all a
    // resume needs (the build's version is hashed too).
    let mut h = std::hash::DefaultHasher::new();
    concat!("brand ", env!("CARGO_PKG_VERSION")).hash(&mut h);
    brand_format::FORMAT_VERSION.hash(&mut h);
    source.kind().hash(&mut h);
    (opts.chunk_size, opts.seed, opts.zstd, opts.segment_bytes).hash(&mut h);
    opts.partitions.map(|p| (p.count, p.group_chunks)).hash(&mut h);
    opts.inputs.hash(&mut h);
    for input in &opts.inputs {
        if let Ok(meta) = std::fs::metadata(input) {
            meta.len().hash(&mut h);
            meta.modified().ok().hash(&mut h);
        }
    }
    source.len().hash(&mut h);
    for i in 0..source.len() {
        source.key(i).hash(&mut h);
        source.label(i).hash(&mut h);
    }
    source.label_names().hash(&mut h);
    source.inputs_identity().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Reads the checkpoint in `dir`, if it has one.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>> {
    let path = dir.join(CHECKPOINT_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::format(&path, e.column() as u64, format!("not a pack checkpoint: {e}")))
}

/// Writes the checkpoint into `dir` atomically (a crash leaves the old one
/// or the new one): after the data it describes is durable.
pub(crate) fn write(dir: &Path, cp: &Checkpoint) -> Result<()> {
    let path = dir.join(CHECKPOINT_FILE);
    let tmp = dir.join(format!("{CHECKPOINT_FILE}.new"));
    let bytes = serde_json::to_vec(cp).map_err(|e| Error::config(format!("internal: checkpoint: {e}")))?;
    brand_format::durable::write_synced(&tmp, &bytes)?;
    std::fs::rename(&tmp, &path).at(&path)?;
    brand_format::durable::sync_dir(dir)
}

/// Removes the checkpoint from a finished pack's directory.
pub(crate) fn remove(dir: &Path) -> Result<()> {
    let path = dir.join(CHECKPOINT_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(&path, e)),
        _ => Ok(()),
    }
}

/// Chunks done and in all, as a work directory's checkpoint says: for the
/// message of an interrupted pack.
pub fn progress_of(dir: &Path) -> Option<(u64, u64)> {
    read(dir).ok().flatten().map(|cp| (cp.chunks_done, cp.chunks_total))
}

/// The number of a segment file's name (`data-00042.brd` → 42).
pub(crate) fn segment_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("data-")?.strip_suffix(".brd")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Checks that the directories hold what `cp` says was written (every
/// finished segment whole, every open one at least as long as recorded)
/// and removes the segments started after it. Returns, per partition, the
/// path of the open segment.
pub(crate) fn restore_segments(part_dirs: &[PathBuf], cp: &Checkpoint) -> Result<Vec<Option<PathBuf>>> {
    if cp.open_segments.len() != part_dirs.len() {
        return Err(Error::config(format!(
            "the checkpoint has {} partitions, the pack {}",
            cp.open_segments.len(),
            part_dirs.len()
        )));
    }
    let open: Vec<Option<u32>> = cp.open_segments.iter().map(|o| o.map(|o| o.number)).collect();
    let mut found = vec![false; cp.segments.len()];
    for dir in part_dirs {
        for entry in std::fs::read_dir(dir).at(dir)? {
            let entry = entry.at(dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(number) = segment_number(&name) else { continue };
            let path = entry.path();
            let Some(info) = cp.segments.get(number as usize) else {
                // Started after the checkpoint.
                std::fs::remove_file(&path).at(&path)?;
                continue;
            };
            let len = entry.metadata().at(&path)?.len();
            let recorded = match cp.open_segments.iter().flatten().find(|o| o.number == number) {
                Some(o) => o.offset,
                None => info.bytes,
            };
            let whole = open.contains(&Some(number)) || len == info.bytes;
            if len < recorded || !whole {
                return Err(Error::format(
                    &path,
                    len,
                    format!("the segment ends here; its checkpoint recorded {recorded} bytes"),
                ));
            }
            found[number as usize] = true;
        }
    }
    if let Some(missing) = found.iter().position(|f| !f) {
        return Err(Error::config(format!(
            "segment {} of the checkpoint is missing",
            brand_format::segment_name(missing as u32)
        )));
    }
    Ok(cp
        .open_segments
        .iter()
        .zip(part_dirs)
        .map(|(o, dir)| o.map(|o| dir.join(brand_format::segment_name(o.number))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(segments: &[(u64, u64)], open: Option<OpenSegment>) -> Checkpoint {
        Checkpoint {
            fingerprint: String::new(),
            chunks_done: 0,
            chunks_total: 1,
            segments: segments
                .iter()
                .enumerate()
                .map(|(i, &(bytes, chunks))| SegmentInfo {
                    name: brand_format::segment_name(i as u32),
                    bytes,
                    chunks,
                })
                .collect(),
            open_segments: vec![open],
            index: IndexWriterState {
                samples: 0,
                chunks: 0,
                keys_len: 0,
                label_min: -1,
                label_max: -1,
                raw_differs: false,
            },
            totals: Totals::default(),
        }
    }

    #[test]
    fn segment_names_parse_back_to_their_numbers_and_nothing_else_does() {
        assert_eq!(segment_number(&brand_format::segment_name(42)), Some(42));
        assert_eq!(segment_number("data-00000.brd"), Some(0));
        for other in [
            "data-.brd",
            "data-1x.brd",
            "index.bin",
            "data-+1.brd",
            "data-00001.brd.new",
        ] {
            assert_eq!(segment_number(other), None, "{other}");
        }
    }

    #[test]
    fn segments_are_checked_against_the_checkpoint_and_later_ones_removed() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().to_path_buf();
        let write = |n: u32, len: usize| std::fs::write(dir.join(brand_format::segment_name(n)), vec![0u8; len]);
        write(0, 8192).expect("write");
        write(1, 6000).expect("write"); // open: 4096 recorded, more written since
        write(2, 100).expect("write"); // started after the checkpoint
        let open = OpenSegment {
            number: 1,
            offset: 4096,
            chunks: 1,
        };
        let cp = checkpoint(&[(8192, 2), (0, 0)], Some(open));
        let paths = restore_segments(std::slice::from_ref(&dir), &cp).expect("restores");
        assert_eq!(paths, vec![Some(dir.join(brand_format::segment_name(1)))]);
        assert!(
            !dir.join(brand_format::segment_name(2)).exists(),
            "the later segment is removed"
        );

        // A finished segment of another length, an open one shorter than
        // recorded, a missing one: each refused, naming the file.
        write(0, 4096).expect("write");
        let err = restore_segments(std::slice::from_ref(&dir), &cp)
            .expect_err("short")
            .to_string();
        assert!(err.contains("data-00000.brd") && err.contains("8192"), "{err}");
        write(0, 8192).expect("write");
        write(1, 100).expect("write");
        let err = restore_segments(std::slice::from_ref(&dir), &cp)
            .expect_err("short")
            .to_string();
        assert!(err.contains("data-00001.brd") && err.contains("4096"), "{err}");
        std::fs::remove_file(dir.join(brand_format::segment_name(1))).expect("rm");
        let err = restore_segments(std::slice::from_ref(&dir), &cp)
            .expect_err("missing")
            .to_string();
        assert!(err.contains("data-00001.brd") && err.contains("missing"), "{err}");
    }
}
