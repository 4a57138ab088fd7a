//! `brand pack`: turn a [`Source`] of samples into a dataset (DESIGN.md §2);
//! the importers that make a `Source` of what users hold are brand-import's.
//!
//! All samples are shuffled once with the pack seed and the shuffled sequence
//! is cut into chunks of K (paper §3.2). The output is written into a hidden
//! temporary directory beside OUT and renamed into place only when complete,
//! so a failed pack leaves nothing that looks like a dataset (with
//! `--partitions`, OUT is a directory of `part-N` datasets, installed as
//! one). The same input
//! and seed give a byte-identical dataset (no timestamps, single-threaded
//! zstd, fixed order).

mod destination;
pub mod resume;
pub mod source;
pub mod spill;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use brand_format::chunk::{self, FLAG_ALIGNED64, FLAG_BLOCKS, FLAG_ZSTD, RecordIn};
use brand_format::durable::{sync_dir, write_synced};
use brand_format::error::{Error, IoContext, Result};
use brand_format::index::{ChunkLoc, Index, IndexWriter};
use brand_format::manifest::{Manifest, Partition, Provenance, SegmentInfo};
use brand_format::parallel;
use brand_format::rng::{Prng, domain};
use brand_format::{self as format, align_up};
pub use destination::{Destination, pack_to, scratch_dir};
use source::Source;

#[derive(Debug, Clone)]
pub struct PackOptions {
    pub chunk_size: u32,
    pub seed: u64,
    /// zstd level per record, or none.
    pub zstd: Option<i32>,
    /// Largest segment file.
    pub segment_bytes: u64,
    /// Replace OUT if it exists.
    pub force: bool,
    /// The inputs as the user named them, recorded in the manifest.
    pub inputs: Vec<String>,
    /// Write one partition per node instead of one dataset (the paper's
    /// §3.4 placement on nodes' local disks).
    pub partitions: Option<Partitioning>,
}

/// How `pack` splits a dataset into partitions: `OUT/part-W` for each node
/// `W < count` holds the chunks of the groups of `group_chunks` chunks that
/// node owns (group `g` → node `g mod count`, the multi-node rule), and
/// every partition holds the whole index, so every node plans alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partitioning {
    pub count: u32,
    pub group_chunks: u64,
}

/// Directory of partition `index` inside a partitioned pack's output.
pub fn partition_dir(out: &Path, index: u32) -> PathBuf {
    out.join(format!("part-{index}"))
}

/// Most partitions a pack writes (each holds a copy of the index).
pub const MAX_PARTITIONS: u32 = 1024;

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            chunk_size: format::DEFAULT_CHUNK_SIZE,
            seed: 0,
            zstd: None,
            segment_bytes: format::DEFAULT_SEGMENT_BYTES,
            force: false,
            inputs: Vec::new(),
            partitions: None,
        }
    }
}

/// Progress callback: `(samples done, samples total, bytes written)`.
pub type Progress<'a> = &'a (dyn Fn(u64, u64, u64) + Sync);

/// Chunks read and encoded together: bounds memory to a few chunks of
/// samples while giving the thread pool enough work.
const CHUNKS_PER_BATCH: usize = 8;

/// Temporary directories of this process's packs in progress. The CLI's
/// signal watcher removes them ([`remove_unfinished`]) before it lets SIGINT
/// or SIGTERM end the process; a pack holds the lock while it installs its
/// output, so an interrupt never lands between the two renames.
static UNFINISHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn unfinished() -> MutexGuard<'static, Vec<PathBuf>> {
    UNFINISHED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// For a process about to exit on a signal: removes the work directories
/// of packs in progress, except those holding a checkpoint, which it
/// returns (the same pack run again goes on there: [`resume`]), and keeps
/// every pack of this process from going on.
pub fn remove_unfinished() -> Vec<PathBuf> {
    let mut dirs = unfinished();
    let mut kept = Vec::new();
    for dir in dirs.drain(..) {
        if dir.join(resume::CHECKPOINT_FILE).is_file() {
            kept.push(dir);
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    // Held until the process exits: no pack installs a half-written output
    // or writes another checkpoint (they take it to).
    std::mem::forget(dirs);
    kept
}

/// The temporary directory beside `out`; removed on drop unless disarmed.
struct TempDir {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.armed {
            let mut dirs = unfinished();
            let _ = std::fs::remove_dir_all(&self.path);
            dirs.retain(|d| d != &self.path);
        }
    }
}

/// `out`'s parent directory and the name of a hidden entry there for
/// `out` (`.NAME.WHAT`): where a pack keeps its work beside its output.
pub fn beside(out: &Path, what: &str) -> Result<(PathBuf, String)> {
    let name = out
        .file_name()
        .ok_or_else(|| Error::config(format!("{}: output must name a directory", out.display())))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, format!(".{}.{what}", name.to_string_lossy())))
}

/// `.NAME.packing-PID` beside `out` and `out`'s parent.
fn temp_name(out: &Path) -> Result<(PathBuf, String)> {
    beside(out, "packing-")
}

fn temp_dir_for(out: &Path) -> Result<TempDir> {
    let (parent, prefix) = temp_name(out)?;
    let path = parent.join(format!("{prefix}{}", std::process::id()));
    let mut dirs = unfinished();
    if path.exists() {
        std::fs::remove_dir_all(&path).at(&path)?;
    }
    std::fs::create_dir(&path).at(&path)?;
    dirs.push(path.clone());
    Ok(TempDir { path, armed: true })
}

/// How often a pack makes its progress durable ([`resume`]): the most work
/// a crash can cost.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// A pack's work directory and its state: new, or taken over from a pack
/// that stopped (at its checkpoint).
struct Work {
    tmp: TempDir,
    writers: Vec<Option<SegmentWriter>>,
    index: IndexWriter,
    segments: Vec<SegmentInfo>,
    totals: resume::Totals,
    chunks_done: u64,
}

impl Work {
    /// The directories segments go to: one per partition, or the work
    /// directory itself.
    fn part_dirs(tmp: &Path, opts: &PackOptions) -> Vec<PathBuf> {
        match opts.partitions {
            Some(p) => (0..p.count).map(|w| partition_dir(tmp, w)).collect(),
            None => vec![tmp.to_path_buf()],
        }
    }

    /// Takes over the stopped pack among `stale` whose checkpoint has this
    /// `fingerprint` (removing the others), or starts a new work directory.
    fn take_over(out: &Path, stale: &[PathBuf], fingerprint: &str, opts: &PackOptions) -> Result<Work> {
        let mut taken = None;
        for dir in stale {
            let why = match resume::read(dir) {
                Ok(Some(cp)) if cp.fingerprint == fingerprint && taken.is_none() => {
                    match Self::resume(out, dir, cp, opts) {
                        Ok(work) => {
                            taken = Some(work);
                            continue;
                        }
                        Err(e) => format!("it cannot go on ({e})"),
                    }
                }
                Ok(_) => "its inputs or options differ".to_string(),
                Err(e) => e.to_string(),
            };
            tracing::warn!(
                "{}: not resuming the pack stopped there: {why}; removing it",
                dir.display()
            );
            match std::fs::remove_dir_all(dir) {
                // Gone already: a failed resume removes what it took over.
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(dir, e)),
                _ => {}
            }
        }
        match taken {
            Some(work) => Ok(work),
            None => Self::start(out, opts),
        }
    }

    fn start(out: &Path, opts: &PackOptions) -> Result<Work> {
        let tmp = temp_dir_for(out)?;
        if opts.partitions.is_some() {
            for d in Self::part_dirs(&tmp.path, opts) {
                std::fs::create_dir(&d).at(&d)?;
            }
        }
        let parts = opts.partitions.map_or(1, |p| p.count) as usize;
        Ok(Work {
            // The index goes to files as chunks are written, not to memory.
            index: IndexWriter::spilled(opts.chunk_size, &tmp.path)?,
            tmp,
            writers: (0..parts).map(|_| None).collect(),
            segments: Vec::new(),
            totals: resume::Totals::default(),
            chunks_done: 0,
        })
    }

    /// Moves `dir` to this process's work directory and cuts what it holds
    /// back to its checkpoint `cp`.
    fn resume(out: &Path, dir: &Path, cp: resume::Checkpoint, opts: &PackOptions) -> Result<Work> {
        if cp.chunks_done > cp.chunks_total || cp.segments.len() > u32::MAX as usize {
            return Err(Error::config(format!(
                "its checkpoint says {} of {} chunks",
                cp.chunks_done, cp.chunks_total
            )));
        }
        let (parent, prefix) = temp_name(out)?;
        let path = parent.join(format!("{prefix}{}", std::process::id()));
        let tmp = {
            let mut dirs = unfinished();
            if path.exists() {
                std::fs::remove_dir_all(&path).at(&path)?;
            }
            std::fs::rename(dir, &path).at(dir)?;
            dirs.push(path.clone());
            TempDir { path, armed: true }
        };
        let part_dirs = Self::part_dirs(&tmp.path, opts);
        let open = resume::restore_segments(&part_dirs, &cp)?;
        let mut writers = Vec::with_capacity(open.len());
        for (o, path) in cp.open_segments.iter().zip(open) {
            writers.push(match (o, path) {
                (Some(o), Some(path)) => {
                    let mut file = std::fs::OpenOptions::new().write(true).open(&path).at(&path)?;
                    file.set_len(o.offset).at(&path)?;
                    std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0)).at(&path)?;
                    Some(SegmentWriter {
                        file,
                        path,
                        number: o.number,
                        offset: o.offset,
                        chunks: o.chunks,
                    })
                }
                _ => None,
            });
        }
        let index = IndexWriter::resume_spilled(opts.chunk_size, &tmp.path, &cp.index)?;
        tracing::warn!(
            "{}: resuming the pack stopped there at chunk {} of {}",
            tmp.path.display(),
            cp.chunks_done,
            cp.chunks_total
        );
        Ok(Work {
            tmp,
            writers,
            index,
            segments: cp.segments,
            totals: cp.totals,
            chunks_done: cp.chunks_done,
        })
    }
}

/// Where [`install`] moves an existing `out` aside: the temp dir's name + `.old`.
fn aside_path(tmp: &Path) -> PathBuf {
    let mut name = tmp.as_os_str().to_owned();
    name.push(".old");
    PathBuf::from(name)
}

/// Cleans up after packs into `out` that died without cleaning up (SIGKILL,
/// power loss): their `.NAME.packing-PID` directories are removed once
/// `/proc/PID` says the process is gone, except those holding a checkpoint
/// ([`resume`]), which are returned: a pack of the same inputs goes on
/// there. A previous dataset they had moved aside (`….old`) is put back if
/// `out` is missing, else removed.
fn remove_stale(out: &Path) -> Result<Vec<PathBuf>> {
    let (parent, prefix) = temp_name(out)?;
    let mut resumable = Vec::new();
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return Ok(resumable); // a missing parent fails later, with its name
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let (pid, aside) = match rest.strip_suffix(".old") {
            Some(pid) => (pid, true),
            None => (rest, false),
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        if aside && !out.exists() {
            tracing::warn!("{}: restoring the dataset a killed pack had moved aside", out.display());
            std::fs::rename(&path, out).at(&path)?;
        } else if !aside && path.join(resume::CHECKPOINT_FILE).is_file() {
            // Taken over (or removed) once the pack knows its inputs.
            resumable.push(path);
        } else {
            tracing::warn!("{}: removing what a killed pack (pid {pid}) left", path.display());
            std::fs::remove_dir_all(&path).at(&path)?;
        }
    }
    Ok(resumable)
}

/// Whether a pack may write `out`: it does not exist, or `force` and it is
/// a dataset [`pack`] may replace. Callers check it before a long listing.
pub fn check_output(out: &Path, force: bool) -> Result<()> {
    if out.exists() && !force {
        return Err(Error::config(format!(
            "{} already exists (use --force to replace it)",
            out.display()
        )));
    }
    check_replaceable(out)
}

/// `--force` replaces a brand dataset (a directory with a manifest.toml) or
/// an empty directory, nothing else: a typo must not delete a user's files.
fn check_replaceable(out: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(out, e)),
    };
    if !meta.is_dir() {
        return Err(Error::config(format!(
            "{} exists and is not a directory; --force replaces only a brand dataset",
            out.display()
        )));
    }
    if out.join(format::MANIFEST_FILE).is_file() || std::fs::read_dir(out).at(out)?.next().is_none() {
        return Ok(());
    }
    // A partitioned pack's output: nothing but `part-N` datasets.
    let mut entries = std::fs::read_dir(out).at(out)?;
    let all_parts = entries.all(|e| {
        e.is_ok_and(|e| {
            e.file_name().to_string_lossy().starts_with("part-") && e.path().join(format::MANIFEST_FILE).is_file()
        })
    });
    if all_parts {
        return Ok(());
    }
    Err(Error::config(format!(
        "{} exists and is not a brand dataset (no {}); --force replaces only a brand dataset",
        out.display(),
        format::MANIFEST_FILE
    )))
}

/// A segment being written.
struct SegmentWriter {
    file: File,
    path: PathBuf,
    /// Its number in the dataset's segment list.
    number: u32,
    offset: u64,
    chunks: u64,
}

/// Checks the options [`pack`] takes (chunk and segment size, partitions,
/// zstd level) without packing: for callers that gather samples first
/// (Python's `brand.Writer`), so that a bad option fails before, not after.
pub fn check_options(opts: &PackOptions) -> Result<()> {
    let k = opts.chunk_size;
    if k == 0 || k > format::MAX_CHUNK_SIZE {
        return Err(Error::config(format!(
            "chunk size {k}: must be 1..={}",
            format::MAX_CHUNK_SIZE
        )));
    }
    if opts.segment_bytes < format::ALIGN {
        return Err(Error::config(format!(
            "segment size {} is below {} bytes",
            opts.segment_bytes,
            format::ALIGN
        )));
    }
    if let Some(p) = opts.partitions
        && (p.count == 0 || p.count > MAX_PARTITIONS || p.group_chunks == 0)
    {
        return Err(Error::config(format!(
            "{} partitions of groups of {} chunks: need 1..={MAX_PARTITIONS} partitions and groups of at least one chunk",
            p.count, p.group_chunks
        )));
    }
    if let Some(level) = opts.zstd
        && !zstd::compression_level_range().contains(&level)
    {
        return Err(Error::config(format!(
            "zstd level {level} outside {:?}",
            zstd::compression_level_range()
        )));
    }
    Ok(())
}

/// Packs `source` into the dataset directory `out`.
pub fn pack(source: &dyn Source, out: &Path, opts: &PackOptions, progress: Progress<'_>) -> Result<Manifest> {
    let hooks = Hooks {
        progress,
        cancel: &AtomicBool::new(false),
    };
    pack_with(source, out, opts, &hooks, &|_, _| Ok(()))
}

/// The error of a pack stopped by its `cancel` flag.
pub const CANCELLED: &str = "the pack was cancelled; the unfinished dataset was removed";

/// What a caller of [`pack_to`] hears while it packs, and how it stops it.
pub struct Hooks<'a> {
    pub progress: Progress<'a>,
    /// Stops the pack once set (checked before each sample is read, each
    /// chunk written and the install), leaving no dataset and failing with
    /// [`CANCELLED`]: for callers that stop a pack without ending the
    /// process (Python's `brand.pack` on Ctrl-C).
    pub cancel: &'a AtomicBool,
}

/// [`pack`] with [`Hooks`], and `segment_done` called with each segment
/// file (path, name) once it is complete and synced, in order: a pack to a
/// URL ([`pack_to`]) uploads it then, while the next is written. An error
/// stops the pack.
pub(crate) fn pack_with(
    source: &dyn Source,
    out: &Path,
    opts: &PackOptions,
    hooks: &Hooks<'_>,
    segment_done: &dyn Fn(&Path, &str) -> Result<()>,
) -> Result<Manifest> {
    let (progress, cancel) = (hooks.progress, hooks.cancel);
    let check_cancel = || {
        if cancel.load(Ordering::Relaxed) {
            Err(Error::config(CANCELLED))
        } else {
            Ok(())
        }
    };
    check_options(opts)?;
    let k = opts.chunk_size;
    let stale = remove_stale(out)?;
    check_output(out, opts.force)?;
    let n = source.len();
    if n == 0 {
        return Err(Error::config("the input has no samples"));
    }
    if n > u32::MAX as usize {
        return Err(Error::config(format!("{n} samples: at most 2^32 - 1 are supported")));
    }

    // packed position p holds source entry order[p]
    let order = Prng::stream(opts.seed, &[domain::PACK]).permutation(n);
    // Records on 64-byte boundaries (readers serve them without a copy),
    // none spanning a 4 KiB block more than it needs (a record read alone
    // costs no extra block).
    let flags = FLAG_ALIGNED64 | FLAG_BLOCKS | if opts.zstd.is_some() { FLAG_ZSTD } else { 0 };
    // Which partition's segments a chunk goes to (the one when whole).
    let part_of = |chunk: u64| match opts.partitions {
        Some(p) => ((chunk / p.group_chunks) % p.count as u64) as usize,
        None => 0,
    };
    let chunk_count = n.div_ceil(k as usize);
    let fingerprint = resume::fingerprint(source, opts);
    let Work {
        tmp,
        mut writers,
        mut index,
        mut segments,
        mut totals,
        chunks_done,
    } = Work::take_over(out, &stale, &fingerprint, opts)?;
    let part_dirs = Work::part_dirs(&tmp.path, opts);
    let mut last_checkpoint = std::time::Instant::now();
    progress(
        (chunks_done as usize * k as usize).min(n) as u64,
        n as u64,
        totals.data_bytes,
    );

    for batch_start in (chunks_done as usize..chunk_count).step_by(CHUNKS_PER_BATCH) {
        let batch_end = (batch_start + CHUNKS_PER_BATCH).min(chunk_count);
        let first = batch_start * k as usize;
        let last = (batch_end * k as usize).min(n);
        // Read (and compress) the batch's samples in parallel; order is kept.
        let batch = &order[first..last];
        let records: Vec<(Vec<u8>, u32)> = parallel::try_map(batch.len(), |i| {
            check_cancel()?;
            let src = batch[i] as usize;
            let raw = source.read(src)?;
            let raw_len = u32::try_from(raw.len()).map_err(|_| {
                Error::config(format!(
                    "sample {:?} is {} bytes; a record is limited to 4 GiB",
                    String::from_utf8_lossy(&source.key(src)),
                    raw.len()
                ))
            })?;
            let stored = match opts.zstd {
                Some(level) => zstd::bulk::compress(&raw, level).map_err(|e| {
                    Error::config(format!(
                        "zstd on sample {:?}: {e}",
                        String::from_utf8_lossy(&source.key(src))
                    ))
                })?,
                None => raw,
            };
            Ok((stored, raw_len))
        })?;

        for c in batch_start..batch_end {
            check_cancel()?;
            let lo = c * k as usize;
            let hi = ((c + 1) * k as usize).min(n);
            // The chunk's keys, held only while it is encoded.
            let keys: Vec<_> = (lo..hi).map(|p| source.key(order[p] as usize)).collect();
            let recs: Vec<RecordIn> = (lo..hi)
                .zip(&keys)
                .map(|(p, key)| {
                    let (stored, raw_len) = &records[p - first];
                    RecordIn {
                        stored,
                        raw_len: *raw_len,
                        label: source.label(order[p] as usize),
                        key,
                    }
                })
                .collect();
            let (bytes, table) = chunk::encode(c as u64, flags, &recs).map_err(Error::config)?;
            let key_bytes: usize = table.iter().map(|e| e.key.len()).sum();
            totals.block_padding_bytes += chunk::block_padding(
                chunk::header_len(table.len(), key_bytes) as u64,
                flags,
                table.iter().map(|e| (e.offset as u64, e.stored_len as u64)),
            );
            let len = bytes.len() as u64;
            if len > opts.segment_bytes {
                let biggest = (lo..hi).max_by_key(|&p| records[p - first].0.len()).unwrap_or(lo);
                return Err(Error::config(format!(
                    "chunk {c} needs {len} bytes, more than the segment size {} (its largest sample is {:?}, {} bytes): raise the segment size (--segment-mib; segment_mib= in Python) or lower the chunk size",
                    opts.segment_bytes,
                    String::from_utf8_lossy(&source.key(order[biggest] as usize)),
                    records[biggest - first].0.len()
                )));
            }
            let seg = &mut writers[part_of(c as u64)];
            if seg.as_ref().is_none_or(|s| s.offset + len > opts.segment_bytes) {
                if let Some(s) = seg.take() {
                    finish_segment(s, &mut segments, segment_done)?;
                }
                let number = segments.len() as u32;
                let name = format::segment_name(number);
                let path = part_dirs[part_of(c as u64)].join(&name);
                let file = File::create(&path).at(&path)?;
                segments.push(SegmentInfo {
                    name,
                    bytes: 0,
                    chunks: 0,
                });
                *seg = Some(SegmentWriter {
                    file,
                    path,
                    number,
                    offset: 0,
                    chunks: 0,
                });
            }
            let s = seg.as_mut().ok_or_else(|| Error::config("internal: no open segment"))?;
            s.file.write_all(&bytes).at(&s.path)?;
            index
                .push_chunk(ChunkLoc {
                    segment: s.number,
                    record_count: (hi - lo) as u32,
                    offset: s.offset,
                })
                .at(&tmp.path)?;
            s.offset += len;
            s.chunks += 1;
            totals.data_bytes += len;
            for e in table {
                totals.raw_bytes += e.raw_len as u64;
                totals.stored_bytes += e.stored_len as u64;
                totals.min_len = totals.min_len.min(e.raw_len as u64);
                totals.max_len = totals.max_len.max(e.raw_len as u64);
                totals.labels.insert(e.label);
                index
                    .push_sample(e.offset, e.stored_len, e.raw_len, e.crc, e.label, &e.key)
                    .at(&tmp.path)?;
            }
        }
        if batch_end < chunk_count && last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
            let state = index.checkpoint().at(&tmp.path)?;
            let mut open_segments = Vec::with_capacity(writers.len());
            for w in &writers {
                open_segments.push(match w {
                    Some(s) => {
                        s.file.sync_data().at(&s.path)?;
                        Some(resume::OpenSegment {
                            number: s.number,
                            offset: s.offset,
                            chunks: s.chunks,
                        })
                    }
                    None => None,
                });
            }
            let cp = resume::Checkpoint {
                fingerprint: fingerprint.clone(),
                chunks_done: batch_end as u64,
                chunks_total: chunk_count as u64,
                segments: segments.clone(),
                open_segments,
                index: state,
                totals: totals.clone(),
            };
            {
                // Not while a signal's cleanup decides what to keep.
                let _dirs = unfinished();
                resume::write(&tmp.path, &cp)?;
            }
            last_checkpoint = std::time::Instant::now();
        }
        progress(last as u64, n as u64, totals.data_bytes);
    }
    for s in writers.iter_mut().filter_map(Option::take) {
        finish_segment(s, &mut segments, segment_done)?;
    }
    resume::remove(&tmp.path)?;

    // Written once, checked as a reader will open it, then copied into
    // every partition.
    let index_path = tmp.path.join(format::INDEX_FILE);
    {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, File::create(&index_path).at(&index_path)?);
        index.finish(segments.len() as u32, &mut f).at(&index_path)?;
        f.into_inner()
            .map_err(|e| e.into_error())
            .at(&index_path)?
            .sync_all()
            .at(&index_path)?;
    }
    Index::load(&index_path).map_err(|e| Error::config(format!("internal: the packed index is inconsistent: {e}")))?;
    let mut manifest = Manifest {
        format_version: format::FORMAT_VERSION,
        samples: n as u64,
        chunk_size: k,
        chunks: chunk_count as u64,
        pack_seed: opts.seed,
        compression: if opts.zstd.is_some() { "zstd" } else { "none" }.into(),
        zstd_level: opts.zstd,
        checksum: "crc32c".into(),
        alignment: format::ALIGN,
        raw_bytes: totals.raw_bytes,
        stored_bytes: totals.stored_bytes,
        data_bytes: totals.data_bytes,
        block_padding_bytes: totals.block_padding_bytes,
        mean_sample_bytes: totals.raw_bytes as f64 / n as f64,
        min_sample_bytes: totals.min_len,
        max_sample_bytes: totals.max_len,
        labels: totals.labels.len() as u64,
        label_names: source.label_names(),
        segments,
        provenance: Provenance {
            source: source.kind().into(),
            inputs: opts.inputs.clone(),
            packer: concat!("brand ", env!("CARGO_PKG_VERSION")).into(),
        },
        partition: None,
    };
    // Every partition holds the whole index and manifest (so every node
    // plans alike and can name any sample), marked with which part it is.
    for (w, dir) in part_dirs.iter().enumerate() {
        manifest.partition = opts.partitions.map(|p| Partition {
            index: w as u32,
            count: p.count,
            group_chunks: p.group_chunks,
        });
        if *dir != tmp.path {
            let to = dir.join(format::INDEX_FILE);
            std::fs::copy(&index_path, &to).at(&to)?;
            File::open(&to).at(&to)?.sync_all().at(&to)?;
        }
        write_synced(&dir.join(format::MANIFEST_FILE), manifest.to_toml().as_bytes())?;
        sync_dir(dir)?;
    }
    if opts.partitions.is_some() {
        std::fs::remove_file(&index_path).at(&index_path)?;
    }
    sync_dir(&tmp.path)?;
    check_cancel()?;
    install(tmp, out, opts.force)?;
    manifest.partition = None;
    Ok(manifest)
}

/// Closes a full segment: durable, recorded, handed to `segment_done`.
fn finish_segment(
    s: SegmentWriter,
    segments: &mut [SegmentInfo],
    segment_done: &dyn Fn(&Path, &str) -> Result<()>,
) -> Result<()> {
    s.file.sync_all().at(&s.path)?;
    debug_assert_eq!(s.offset, align_up(s.offset));
    let info = segments
        .get_mut(s.number as usize)
        .ok_or_else(|| Error::config("internal: a segment not in the list"))?;
    info.bytes = s.offset;
    info.chunks = s.chunks;
    segment_done(&s.path, &info.name)
}

/// Moves the finished temporary directory to `out`. With `force`, an
/// existing `out` is moved aside first and deleted only once the new dataset
/// is in place, so a crash never leaves neither.
fn install(mut tmp: TempDir, out: &Path, force: bool) -> Result<()> {
    let mut aside = None;
    {
        // Both renames under the lock: an interrupt waits for them.
        let mut dirs = unfinished();
        if out.exists() {
            if !force {
                return Err(Error::config(format!(
                    "{} appeared while packing; not replacing it",
                    out.display()
                )));
            }
            check_replaceable(out)?;
            let old = aside_path(&tmp.path);
            std::fs::rename(out, &old).at(out)?;
            aside = Some(old);
        }
        std::fs::rename(&tmp.path, out).at(out)?;
        tmp.armed = false;
        dirs.retain(|d| d != &tmp.path);
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    if let Some(old) = aside {
        std::fs::remove_dir_all(&old).at(&old)?;
    }
    Ok(())
}
