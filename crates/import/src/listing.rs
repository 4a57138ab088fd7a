//! An importer's listing as it grows, input by input, and kept across runs.
//!
//! The tar, MDS and Parquet importers list their inputs in order (key,
//! label, where each payload is) and copy the payloads of inputs that can
//! only be read in order (gzip, zstd, Parquet pages, objects) into a spool.
//! For a terabyte of `.tar.gz` that pass is hours of decompression. With a
//! listing directory (`.OUT.listing` beside the output, [`ListingJournal`]),
//! the spool is a file there and every finished input's rows are appended
//! to `rows`; every few seconds both are made durable and `journal.json`
//! records the inputs they hold. A later run of the same import into the
//! same OUT reuses the longest prefix of its inputs that the journal holds
//! unchanged (same path, size and modification time or entity tag) and
//! lists only the rest: a pack killed while listing, or while packing,
//! does not decompress a finished input again.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brand_format::error::{Error, IoContext, Result};
use serde::{Deserialize, Serialize};

use crate::input::Input;
use crate::listed::{Listed, ListedFormat, PayloadFile, Payloads};
use brand_pack::source::{Entries, Ints};

/// The journal's record of the inputs listed so far.
pub const JOURNAL_FILE: &str = "journal.json";
const ROWS_FILE: &str = "rows";
const SPOOL_FILE: &str = "spool";

/// How often the journal is made durable while inputs are listed (and at
/// the end of the listing): at most this much listing is lost to a crash.
const COMMIT_EVERY: Duration = Duration::from_secs(2);

/// Where a listing is kept and who hears of its progress: the tar, MDS
/// and Parquet importers' options carry one.
#[derive(Debug, Clone, Default)]
pub struct ListingOptions {
    /// Where the listing is kept for a later run to reuse, spool included;
    /// None: nowhere (an anonymous spool).
    pub dir: Option<PathBuf>,
    /// Called after each input is listed or reused.
    pub on_input: Option<OnInput>,
}

/// What [`ListingOptions::on_input`] hears after each input.
#[derive(Debug)]
pub struct InputListed<'a> {
    pub path: &'a Path,
    /// Inputs listed or reused so far, this one included.
    pub done: usize,
    /// Inputs in all.
    pub of: usize,
    /// Samples listed so far.
    pub samples: usize,
    /// Whether it was taken from an earlier run's listing, not read.
    pub reused: bool,
}

/// A callback per input listed.
#[derive(Clone)]
pub struct OnInput(pub std::sync::Arc<dyn Fn(&InputListed<'_>) + Send + Sync>);

impl std::fmt::Debug for OnInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnInput")
    }
}

/// The listing of the inputs so far: what [`Payloads`] will hold, and the
/// spool being written.
/// Fields drop in order: `spool` (flushing it) before `journal`.
pub(crate) struct Listing {
    pub entries: Entries,
    pub offsets: Vec<u64>,
    pub lens: Ints,
    files: Vec<PayloadFile>,
    spool: Option<BufWriter<File>>,
    /// Bytes in the spool so far.
    spool_len: u64,
    spool_dir: PathBuf,
    /// Samples of the inputs recorded so far: where the next input's start.
    files_end: usize,
    on_input: Option<OnInput>,
    /// Inputs in all (for progress).
    inputs: usize,
    /// Every input's path and identity, in order.
    identities: String,
    journal: Option<ListingJournal>,
}

impl Listing {
    /// An empty listing spooling into `spool_dir` (an anonymous file), or,
    /// with a journal, into the journal's directory.
    pub fn new(spool_dir: &Path, options: &ListingOptions, inputs: usize, what: &str) -> Result<Listing> {
        let journal = match options.dir.as_deref() {
            Some(dir) => Some(ListingJournal::open(
                dir,
                &format!("brand {} {what}", env!("CARGO_PKG_VERSION")),
            )?),
            None => None,
        };
        Ok(Listing {
            entries: Entries::new(),
            offsets: Vec::new(),
            lens: Ints::default(),
            files: Vec::new(),
            spool: None,
            spool_len: 0,
            spool_dir: spool_dir.to_path_buf(),
            files_end: 0,
            on_input: options.on_input.clone(),
            inputs,
            identities: String::new(),
            journal,
        })
    }

    /// Samples listed so far.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Adds a sample whose payload is `len` bytes at `offset` (of its input
    /// file, or of the spool).
    pub fn push(&mut self, key: &[u8], label: i64, offset: u64, len: u64) {
        self.entries.push(key, label);
        self.offsets.push(offset);
        self.lens.push(len as i64);
    }

    /// The spool to append payloads to, and its length so far (the offset
    /// of the next payload). Call [`Listing::spooled`] after writing.
    pub fn spool(&mut self) -> Result<(&mut BufWriter<File>, u64)> {
        if self.spool.is_none() {
            let file = match &self.journal {
                Some(j) => j.spool_for_append()?,
                None => tempfile::tempfile_in(&self.spool_dir).at(&self.spool_dir)?,
            };
            // Appends land at the file's end: it must be where the next
            // payload's offset says.
            let len = file.metadata().at(self.spool_place())?.len();
            if len != self.spool_len {
                return Err(Error::config(format!(
                    "internal: the spool in {} holds {len} bytes, the listing {}",
                    self.spool_place().display(),
                    self.spool_len
                )));
            }
            self.spool = Some(BufWriter::with_capacity(1 << 20, file));
        }
        let len = self.spool_len;
        match self.spool.as_mut() {
            Some(s) => Ok((s, len)),
            None => Err(Error::config("internal: no spool file")),
        }
    }

    /// Records that `n` more bytes were written to the spool.
    pub fn spooled(&mut self, n: u64) {
        self.spool_len += n;
    }

    /// Where spooled payloads go (for errors).
    pub fn spool_place(&self) -> &Path {
        match &self.journal {
            Some(j) => &j.dir,
            None => &self.spool_dir,
        }
    }

    /// Before listing `input`: if the journal holds it, unchanged, as the
    /// next input, its rows are restored and the importer's state after it
    /// (what it recorded with [`Listing::input_done`]) is returned; the
    /// importer then skips the input.
    pub fn reuse(&mut self, input: &Input) -> Result<Option<serde_json::Value>> {
        let Some(journal) = self.journal.as_mut() else {
            return Ok(None);
        };
        let Some((record, rows)) = journal.reuse(input)? else {
            return Ok(None);
        };
        // Checked whole before any of it is taken: rows that are not what
        // was written, or do not parse, mean this input and the rest are
        // listed again.
        let checked = if crc32c::crc32c(&rows) == record.rows_crc {
            parse_rows(&rows, record.samples, |_, _, _, _| {})
        } else {
            Err("its rows are damaged (checksum)".to_string())
        };
        if let Err(what) = checked {
            let journal = self
                .journal
                .as_mut()
                .ok_or_else(|| Error::config("internal: no journal"))?;
            tracing::warn!(
                "{}: {what}; listing {} again",
                journal.dir.display(),
                input.path().display()
            );
            journal.drop_from(journal.next - 1)?;
            return Ok(None);
        }
        let first = self.offsets.len();
        parse_rows(&rows, record.samples, |key, label, offset, len| {
            self.push(key, label, offset, len)
        })
        .map_err(Error::config)?;
        self.files.push(PayloadFile {
            path: input.path().to_path_buf(),
            first,
            spooled: record.spooled,
        });
        self.files_end = self.offsets.len();
        self.spool_len = record.spool_end;
        self.heard(input, &record.identity, true);
        Ok(Some(record.state))
    }

    /// After listing `input` (its samples pushed since the previous input's
    /// end): records it, with the importer's `state` after it, so a later
    /// run can reuse it.
    pub fn input_done(&mut self, input: &Input, spooled: bool, state: serde_json::Value) -> Result<()> {
        let first = self.files_end;
        self.files_end = self.offsets.len();
        self.files.push(PayloadFile {
            path: input.path().to_path_buf(),
            first,
            spooled,
        });
        let identity = input.identity()?;
        self.heard(input, &identity, false);
        let Some(journal) = self.journal.as_mut() else {
            return Ok(());
        };
        let mut rows = Vec::new();
        for i in first..self.offsets.len() {
            let key = self.entries.key(i);
            rows.extend_from_slice(&(key.len() as u32).to_le_bytes());
            rows.extend_from_slice(key);
            rows.extend_from_slice(&self.entries.label(i).to_le_bytes());
            rows.extend_from_slice(&self.offsets[i].to_le_bytes());
            rows.extend_from_slice(&(self.lens.get(i) as u64).to_le_bytes());
        }
        let record = InputRecord {
            path: input.path().display().to_string(),
            identity,
            samples: (self.offsets.len() - first) as u64,
            rows_end: 0,
            rows_crc: crc32c::crc32c(&rows),
            spool_end: self.spool_len,
            spooled,
            state,
        };
        journal.append(record, &rows)?;
        if journal.last_commit.elapsed() >= COMMIT_EVERY {
            journal.commit(self.spool.as_mut())?;
        }
        Ok(())
    }

    /// Notes `input`'s identity (for [`Listed::inputs_identity`]) and tells
    /// `on_input`.
    fn heard(&mut self, input: &Input, identity: &str, reused: bool) {
        self.identities
            .push_str(&format!("{}\t{identity}\n", input.path().display()));
        if let Some(OnInput(f)) = &self.on_input {
            f(&InputListed {
                path: input.path(),
                done: self.files.len(),
                of: self.inputs,
                samples: self.offsets.len(),
                reused,
            });
        }
    }

    /// The finished listing: spool flushed (and, with a journal, every
    /// input recorded durably).
    pub fn finish<F: ListedFormat>(mut self, label_names: Vec<String>) -> Result<Listed<F>> {
        if let Some(journal) = self.journal.as_mut() {
            journal.stop_reusing()?;
            journal.commit(self.spool.as_mut())?;
        }
        let spool = match (self.spool.take(), &self.journal) {
            (Some(writer), _) => Some(writer.into_inner().map_err(|e| e.into_error()).at(self.spool_place())?),
            // Held while the source lives, even if no input was spooled: it
            // keeps the lock (and reused inputs' payloads are there).
            (None, Some(j)) => Some(j.spool_for_append()?),
            (None, None) => None,
        };
        let mut payloads = Payloads {
            files: std::mem::take(&mut self.files),
            entries: std::mem::take(&mut self.entries),
            offsets: std::mem::take(&mut self.offsets),
            lens: std::mem::take(&mut self.lens),
            spool,
            noun: F::NOUN,
            format: F::NAME,
        };
        payloads.shrink_to_fit();
        Ok(Listed {
            payloads,
            label_names,
            inputs_identity: std::mem::take(&mut self.identities),
            format: std::marker::PhantomData,
        })
    }
}

/// Calls `push` with each of the `samples` rows in `rows` (key length u32,
/// key, label i64, offset u64, length u64; little-endian).
fn parse_rows(
    mut rows: &[u8],
    samples: u64,
    mut push: impl FnMut(&[u8], i64, u64, u64),
) -> std::result::Result<(), String> {
    fn take<'a>(rows: &mut &'a [u8], n: usize) -> std::result::Result<&'a [u8], String> {
        if rows.len() < n {
            return Err("its rows are cut short".into());
        }
        let (head, rest) = rows.split_at(n);
        *rows = rest;
        Ok(head)
    }
    fn word(rows: &mut &[u8], n: usize) -> std::result::Result<u64, String> {
        Ok(take(rows, n)?
            .iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }
    for _ in 0..samples {
        let key_len = word(&mut rows, 4)? as usize;
        let key = take(&mut rows, key_len)?;
        let label = word(&mut rows, 8)? as i64;
        let offset = word(&mut rows, 8)?;
        let len = word(&mut rows, 8)?;
        push(key, label, offset, len);
    }
    if !rows.is_empty() {
        return Err("its rows hold more than its samples".into());
    }
    Ok(())
}

/// One listed input, as the journal records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct InputRecord {
    /// Its path or URL, as given or listed.
    path: String,
    /// Size and modification time, or size and entity tag ([`Input::identity`]).
    identity: String,
    samples: u64,
    /// Where its rows end in `rows` (they start where the previous input's end).
    rows_end: u64,
    /// crc32c of its rows: rows damaged in place are not taken.
    rows_crc: u32,
    /// The spool's length after it.
    spool_end: u64,
    spooled: bool,
    /// The importer's state after it (tar `--label dir`: the class names
    /// it saw first).
    state: serde_json::Value,
}

/// What `journal.json` holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct JournalState {
    /// The build, the format and its options: another's journal is not reused.
    what: String,
    inputs: Vec<InputRecord>,
}

/// A listing directory: `rows`, `spool` and `journal.json`. The spool file
/// is locked (`flock`) while a pack uses it, so two packs into one OUT
/// cannot write it at once.
pub(crate) struct ListingJournal {
    dir: PathBuf,
    /// The spool, opened for reading and appending; holds the lock.
    spool: File,
    /// What `journal.json` records (durable).
    committed: JournalState,
    /// Inputs listed since the last commit.
    pending: Vec<InputRecord>,
    /// The next input's number.
    next: usize,
    /// Whether recorded inputs may still be reused (until one differs).
    reusing: bool,
    rows: BufWriter<File>,
    rows_len: u64,
    last_commit: Instant,
}

impl ListingJournal {
    fn open(dir: &Path, what: &str) -> Result<ListingJournal> {
        std::fs::create_dir_all(dir).at(dir)?;
        let spool_path = dir.join(SPOOL_FILE);
        let spool = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&spool_path)
            .at(&spool_path)?;
        match spool.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::config(format!(
                    "{}: another pack into the same output is running (it holds {})",
                    dir.display(),
                    spool_path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&spool_path, e)),
        }
        let rows_path = dir.join(ROWS_FILE);
        let rows = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&rows_path)
            .at(&rows_path)?;
        let mut committed = read_state(dir, what);
        // Only what the files still hold whole (a damaged or cut directory
        // gives back the inputs it can).
        let rows_len = rows.metadata().at(&rows_path)?.len();
        let spool_len = spool.metadata().at(&spool_path)?.len();
        let mut last = (0, 0);
        let whole = committed
            .inputs
            .iter()
            .take_while(|r| {
                let fits =
                    r.rows_end >= last.0 && r.spool_end >= last.1 && r.rows_end <= rows_len && r.spool_end <= spool_len;
                last = (r.rows_end, r.spool_end);
                fits
            })
            .count();
        if whole < committed.inputs.len() {
            tracing::warn!(
                "{}: the listing's files hold {whole} of the {} inputs its journal records",
                dir.display(),
                committed.inputs.len()
            );
            committed.inputs.truncate(whole);
        }
        committed.what = what.to_string();
        let reusing = !committed.inputs.is_empty();
        let mut journal = ListingJournal {
            dir: dir.to_path_buf(),
            spool,
            committed,
            pending: Vec::new(),
            next: 0,
            reusing: true,
            rows: BufWriter::with_capacity(1 << 20, rows),
            rows_len,
            last_commit: Instant::now(),
        };
        if reusing {
            tracing::info!(
                "{}: {} listed input(s) of an earlier run may be reused",
                dir.display(),
                journal.committed.inputs.len()
            );
        } else {
            journal.stop_reusing()?;
        }
        Ok(journal)
    }

    /// The recorded next input and its rows, if `input` is it, unchanged.
    fn reuse(&mut self, input: &Input) -> Result<Option<(InputRecord, Vec<u8>)>> {
        if !self.reusing {
            return Ok(None);
        }
        let identity = input.identity()?;
        let path = input.path().display().to_string();
        let Some(record) = self
            .committed
            .inputs
            .get(self.next)
            .filter(|r| r.path == path && r.identity == identity)
            .cloned()
        else {
            self.stop_reusing()?;
            return Ok(None);
        };
        let start = match self.next {
            0 => 0,
            n => self.committed.inputs[n - 1].rows_end,
        };
        let rows_path = self.dir.join(ROWS_FILE);
        let mut rows = vec![0u8; usize::try_from(record.rows_end - start).map_err(|_| Error::config("rows too long"))?];
        let file = self.rows.get_mut();
        file.seek(SeekFrom::Start(start)).at(&rows_path)?;
        file.read_exact(&mut rows).at(&rows_path)?;
        self.next += 1;
        Ok(Some((record, rows)))
    }

    /// Keeps the inputs reused so far and drops the rest: the journal is
    /// rewritten first, then the files are cut back, so a crash in
    /// between leaves a journal that holds only what the files hold.
    fn stop_reusing(&mut self) -> Result<()> {
        if !self.reusing {
            return Ok(());
        }
        self.drop_from(self.next)
    }

    /// Keeps the first `kept` recorded inputs (all of them reused) and
    /// drops the rest; input `kept` is the next to list.
    fn drop_from(&mut self, kept: usize) -> Result<()> {
        self.reusing = false;
        self.next = kept;
        self.committed.inputs.truncate(self.next);
        self.write_state()?;
        let (rows_end, spool_end) = self
            .committed
            .inputs
            .last()
            .map_or((0, 0), |r| (r.rows_end, r.spool_end));
        let rows_path = self.dir.join(ROWS_FILE);
        let file = self.rows.get_mut();
        file.set_len(rows_end).at(&rows_path)?;
        file.seek(SeekFrom::Start(rows_end)).at(&rows_path)?;
        self.rows_len = rows_end;
        self.spool.set_len(spool_end).at(self.dir.join(SPOOL_FILE))?;
        Ok(())
    }

    /// A handle of the spool (the lock's: it lasts while any is open).
    fn spool_for_append(&self) -> Result<File> {
        self.spool.try_clone().at(self.dir.join(SPOOL_FILE))
    }

    fn append(&mut self, mut record: InputRecord, rows: &[u8]) -> Result<()> {
        self.stop_reusing()?;
        self.rows.write_all(rows).at(self.dir.join(ROWS_FILE))?;
        self.rows_len += rows.len() as u64;
        record.rows_end = self.rows_len;
        self.pending.push(record);
        self.next += 1;
        Ok(())
    }

    /// Makes the rows and the spool durable, then records the inputs they
    /// hold.
    fn commit(&mut self, spool: Option<&mut BufWriter<File>>) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let spool_path = self.dir.join(SPOOL_FILE);
        if let Some(s) = spool {
            s.flush().at(&spool_path)?;
        }
        // The journal's handle: one file, whichever descriptor wrote it.
        self.spool.sync_data().at(&spool_path)?;
        let rows_path = self.dir.join(ROWS_FILE);
        self.rows.flush().at(&rows_path)?;
        self.rows.get_ref().sync_data().at(&rows_path)?;
        self.committed.inputs.append(&mut self.pending);
        self.write_state()?;
        self.last_commit = Instant::now();
        Ok(())
    }

    fn write_state(&self) -> Result<()> {
        let path = self.dir.join(JOURNAL_FILE);
        let tmp = self.dir.join(format!("{JOURNAL_FILE}.new"));
        let bytes = serde_json::to_vec(&self.committed)
            .map_err(|e| Error::config(format!("internal: listing journal: {e}")))?;
        brand_format::durable::write_synced(&tmp, &bytes)?;
        std::fs::rename(&tmp, &path).at(&path)?;
        brand_format::durable::sync_dir(&self.dir)
    }
}

/// A listing that ends early (an error in a later input, a panic) still
/// records the inputs it finished: the rerun starts after them. The spool's
/// writer was dropped (flushed) before, as it is declared before the
/// journal in [`Listing`].
impl Drop for ListingJournal {
    fn drop(&mut self) {
        if let Err(e) = self.commit(None) {
            tracing::warn!("{}: the listing's last inputs are not kept: {e}", self.dir.display());
        }
    }
}

/// The journal in `dir` if it is one of `what`; else an empty one (said why).
fn read_state(dir: &Path, what: &str) -> JournalState {
    let path = dir.join(JOURNAL_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("{}: {e}; listing every input again", path.display());
            }
            return JournalState::default();
        }
    };
    match serde_json::from_slice::<JournalState>(&bytes) {
        Ok(state) if state.what == what => state,
        Ok(_) => {
            tracing::warn!(
                "{}: the listing of another import (other format, options or build); listing every input again",
                path.display()
            );
            JournalState::default()
        }
        Err(e) => {
            tracing::warn!(
                "{}: not a listing journal ({e}); listing every input again",
                path.display()
            );
            JournalState::default()
        }
    }
}

/// `.NAME.listing` beside `out`: where a pack into `out` keeps its listing.
pub fn dir_for(out: &Path) -> Result<PathBuf> {
    let (parent, name) = brand_pack::beside(out, "listing")?;
    Ok(parent.join(name))
}

/// How many inputs the listing directory `dir` holds durably (0 for none).
fn inputs_kept(dir: &Path) -> usize {
    std::fs::read(dir.join(JOURNAL_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<JournalState>(&b).ok())
        .map_or(0, |s| s.inputs.len())
}

/// Ends a pack's use of its listing directory: removed once the dataset
/// is installed (`installed`), or when it holds no finished input; else
/// kept for the next run. Returns how many inputs it keeps.
pub fn settle(dir: &Path, installed: bool) -> Result<usize> {
    let kept = if installed { 0 } else { inputs_kept(dir) };
    if kept == 0 {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(dir, e)),
            _ => {}
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lists `inputs` (each: its samples' keys) into a listing kept in
    /// `dir`, reusing what it can; returns how many inputs were reused and
    /// the listing's keys.
    fn list(dir: &Path, inputs: &[(PathBuf, Vec<&str>)]) -> (usize, Vec<Vec<u8>>) {
        let options = ListingOptions {
            dir: Some(dir.to_path_buf()),
            on_input: None,
        };
        let mut listing = Listing::new(dir, &options, inputs.len(), "test").expect("listing");
        let mut reused = 0;
        for (path, keys) in inputs {
            let input = Input::File(path.clone());
            if listing.reuse(&input).expect("reuse").is_some() {
                reused += 1;
                continue;
            }
            for key in keys {
                let (spool, offset) = listing.spool().expect("spool");
                spool.write_all(key.as_bytes()).expect("spool");
                listing.spooled(key.len() as u64);
                listing.push(key.as_bytes(), 1, offset, key.len() as u64);
            }
            listing.input_done(&input, true, serde_json::Value::Null).expect("done");
        }
        let listed: Listed<Tar> = listing.finish(Vec::new()).expect("finish");
        let keys = (0..listed.payloads.len())
            .map(|i| listed.payloads.key(i).to_vec())
            .collect();
        for i in 0..listed.payloads.len() {
            assert_eq!(listed.payloads.read(i).expect("read"), listed.payloads.key(i).to_vec());
        }
        (reused, keys)
    }

    #[derive(Debug)]
    struct Tar;
    impl ListedFormat for Tar {
        const KIND: &'static str = "test";
        const NAME: &'static str = "test";
        const NOUN: &'static str = "sample";
    }

    #[test]
    fn a_listing_is_reused_while_whole_and_listed_again_when_damaged() {
        let t = tempfile::tempdir().expect("tempdir");
        let inputs: Vec<(PathBuf, Vec<&str>)> = [vec!["a0", "a1"], vec!["b0"], vec!["c0", "c1", "c2"]]
            .into_iter()
            .enumerate()
            .map(|(k, keys)| {
                let path = t.path().join(format!("in{k}"));
                std::fs::write(&path, format!("input {k}")).expect("write");
                (path, keys)
            })
            .collect();
        let dir = t.path().join("listing");
        let want: Vec<Vec<u8>> = ["a0", "a1", "b0", "c0", "c1", "c2"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert_eq!(list(&dir, &inputs), (0, want.clone()));
        assert_eq!(list(&dir, &inputs), (3, want.clone()));
        // The last input's rows cut short: the first two are reused.
        let rows = dir.join(ROWS_FILE);
        let len = std::fs::metadata(&rows).expect("rows").len();
        std::fs::File::options()
            .write(true)
            .open(&rows)
            .expect("open")
            .set_len(len - 3)
            .expect("cut");
        assert_eq!(list(&dir, &inputs), (2, want.clone()));
        // Garbage rows for the second input (its length kept): it and the
        // rest are listed again, and the result is still whole.
        let mut bytes = std::fs::read(&rows).expect("rows");
        let first_input_rows = 2 * (4 + 2 + 8 + 8 + 8);
        bytes[first_input_rows..first_input_rows + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&rows, &bytes).expect("write");
        assert_eq!(list(&dir, &inputs), (1, want.clone()));
        // The spool cut inside the second input's payloads (the first's
        // are its 4 bytes): only the first is reused.
        let spool = dir.join(SPOOL_FILE);
        std::fs::File::options()
            .write(true)
            .open(&spool)
            .expect("open")
            .set_len(5)
            .expect("cut");
        assert_eq!(list(&dir, &inputs), (1, want.clone()));
        // A journal that is not JSON, or of another import: nothing reused.
        std::fs::write(dir.join(JOURNAL_FILE), b"{not json").expect("write");
        assert_eq!(list(&dir, &inputs), (0, want.clone()));
        let other = ListingOptions {
            dir: Some(dir.clone()),
            on_input: None,
        };
        drop(Listing::new(&dir, &other, 3, "another").expect("listing"));
        assert_eq!(list(&dir, &inputs), (0, want.clone()));
        // A label changed in place (the rows still parse): the checksum
        // refuses them, and the first input on are listed again.
        assert_eq!(list(&dir, &inputs), (3, want.clone()));
        let mut bytes = std::fs::read(&rows).expect("rows");
        bytes[4 + 2] ^= 1;
        std::fs::write(&rows, &bytes).expect("write");
        assert_eq!(list(&dir, &inputs), (0, want.clone()));
        // An input changed since: it and those after it are listed again.
        assert_eq!(list(&dir, &inputs), (3, want.clone()));
        std::fs::write(&inputs[1].0, "changed, and longer").expect("write");
        assert_eq!(list(&dir, &inputs), (1, want));
    }

    #[test]
    fn a_second_listing_of_one_directory_is_refused_while_the_first_is_open() {
        let t = tempfile::tempdir().expect("tempdir");
        let options = ListingOptions {
            dir: Some(t.path().join("listing")),
            on_input: None,
        };
        let first = Listing::new(t.path(), &options, 1, "test").expect("first");
        let Err(e) = Listing::new(t.path(), &options, 1, "test") else {
            panic!("a second listing of the same directory")
        };
        assert!(
            e.to_string().contains("another pack into the same output is running"),
            "{e}"
        );
        drop(first);
        Listing::new(t.path(), &options, 1, "test").expect("free again");
    }
}
