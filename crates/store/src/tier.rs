//! A local tier (DESIGN.md §4, "A local tier"): a dataset at a URL kept,
//! chunk by chunk, in a directory on a local disk that every process of the
//! machine shares, so a chunk crosses the network once, not every epoch.
//!
//! Layout of a tier directory `DIR`:
//!
//! * `DIR/lock`, `DIR/usage`: the ledger. `usage` holds the bytes every
//!   dataset in `DIR` holds or has reserved (a u64); it changes only under
//!   an exclusive `flock` of `lock`, so the limit holds under every
//!   interleaving of the machine's processes. Each open recounts it from
//!   the chunk tables, so a process killed with a reservation leaks nothing.
//! * `DIR/<dataset>-<version>/`: one version of one dataset, named by
//!   crc32c of its URL and of what pins its contents (the index's digest,
//!   every segment's name, size and entity tag): an object replaced in the
//!   store is a new version, never stale bytes. Inside: `url` (for people),
//!   `open` (a shared `flock` held by every process reading the version,
//!   so an open of a newer version removes only versions nobody reads),
//!   the segment files at their own names and offsets (sparse: only the
//!   chunks kept are written), and `chunks`, a u64 per chunk: 0 absent,
//!   its length when kept, its length with [`FETCHING`] while a process
//!   fetches it, holding an OFD lock on those 8 bytes (released by the
//!   kernel if it dies).
//!
//! A chunk is kept only once its bytes are checked (every record's crc32c)
//! and on the disk (`fdatasync`), and its entry written after that: a
//! crash leaves an entry marked fetching with no lock, which the next open
//! clears, never a chunk half written and marked kept. Reads still check
//! every record's crc32c, so damage on the disk is found, never served.
//!
//! What a tier keeps: every chunk it is asked for while the limit (and the
//! file system's free space, of which it leaves [`FREE_SHARE`]) allows,
//! then nothing more. So a tier at least the dataset's size holds all of
//! it after one epoch, and a smaller one holds a fixed share of its chunks
//! (hits in proportion, CoorDL's rule: under a fresh order each epoch,
//! evicting by recency keeps nothing useful).
//!
//! When the versions read through one directory want more than its limit,
//! [`Tier::rebalance`] (each reader, every second or so) shares the space
//! by benefit (`crate::placement`): every reader publishes a claim in
//! `DIR/jobs/` (a file it holds an exclusive `flock` on, so a dead
//! reader's claim is known as such); a version short of what it is owed
//! removes versions nobody reads, and a version holding more than it is
//! owed gives up (sheds) its chunks, holes punched in its segment files,
//! while another is short, and takes no free space another is owed. A
//! reader of a chunk shed under it finds the chunk's bytes gone (its
//! records fail their crc32c) and reads the store.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use brand_format::dataset::{Dataset, Origin};
use brand_format::error::{Error, Result};

use crate::placement::{Claim, Placement};

/// Bit of a chunk's entry saying it is being fetched (its length reserved).
const FETCHING: u64 = 1 << 63;

/// Bytes of one chunk's entry in `chunks`.
const ENTRY: u64 = 8;

/// Share of its file system a tier leaves free, whatever its limit.
pub const FREE_SHARE: f64 = 0.10;

/// The directory of readers' claims, in a tier directory.
const JOBS: &str = "jobs";

/// How much a tier may hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TierLimit {
    /// At most this many bytes, every dataset in the directory together.
    Bytes(u64),
    /// At most this share (per cent, (0, 100]) of the dataset opened.
    Percent(f64),
    /// No limit but the disk's ([`FREE_SHARE`] of it left free).
    Disk,
}

impl std::str::FromStr for TierLimit {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => Ok(TierLimit::Percent(p)),
                _ => Err(Error::config(format!(
                    "disk_cache_limit {s:?}: a share of the dataset is (0, 100] %"
                ))),
            };
        }
        match brand_format::units::parse_bytes(t) {
            Ok(0) => Err(Error::config(format!(
                "disk_cache_limit {s:?}: at least one byte (no tier: leave disk_cache out)"
            ))),
            Ok(b) => Ok(TierLimit::Bytes(b)),
            Err(why) => Err(Error::config(format!(
                "disk_cache_limit {s:?}: {why}; expected bytes (\"500GiB\") or a share of the dataset (\"50%\")"
            ))),
        }
    }
}

impl TierLimit {
    /// The bytes this limit allows for `ds` (a share is of its segments' bytes).
    pub fn bytes_for(&self, ds: &Dataset) -> u64 {
        let dataset: u64 = ds.manifest.segments.iter().map(|s| s.bytes).sum();
        match *self {
            TierLimit::Bytes(b) => b,
            TierLimit::Percent(p) => (dataset as f64 * p / 100.0) as u64,
            TierLimit::Disk => u64::MAX,
        }
    }
}

impl std::fmt::Display for TierLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierLimit::Bytes(b) => write!(f, "{b}"),
            TierLimit::Percent(p) => write!(f, "{p}%"),
            TierLimit::Disk => f.write_str("the disk"),
        }
    }
}

/// A tier as a user configures it: the keys `disk_cache` and `disk_cache_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct TierSettings {
    pub dir: PathBuf,
    pub limit: TierLimit,
    /// Take in only the chunks this share pins (`brand_format::pin`, the
    /// tiered policy); `None`: any chunk while there is room.
    pub pinned_share: Option<u8>,
}

/// Why a chunk was not taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The tier's limit is reached.
    Limit,
    /// The file system would have less than [`FREE_SHARE`] free.
    Disk,
    /// The free space is owed to versions that benefit more (placement).
    Placement,
}

/// What [`Tier::admit`] found.
pub enum Admission {
    /// The chunk is kept: read it from the tier.
    Present,
    /// Another process is fetching it.
    Busy,
    /// Not taken in: read it from the store.
    Refused(Refusal),
    /// This process fetches it: [`Reservation::keep`] its bytes.
    Admitted(Reservation),
}

/// The ledger: bytes held or reserved by the directory's datasets.
struct Ledger {
    /// Threads of this process: a `flock` excludes other processes only.
    threads: Mutex<()>,
    lock: File,
    usage: File,
}

impl Ledger {
    fn open(root: &Path) -> std::io::Result<Self> {
        Ok(Ledger {
            threads: Mutex::new(()),
            lock: open_rw(&root.join("lock"))?,
            usage: open_rw(&root.join("usage"))?,
        })
    }

    /// Runs `f` on the usage, alone on the machine; writes it back if changed.
    fn locked<T>(&self, f: impl FnOnce(&mut u64) -> std::io::Result<T>) -> std::io::Result<T> {
        let _threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        self.lock.lock()?;
        let result = (|| {
            let before = read_u64(&self.usage, 0)?;
            let mut usage = before;
            let out = f(&mut usage)?;
            if usage != before {
                self.usage.write_all_at(&usage.to_le_bytes(), 0)?;
            }
            Ok(out)
        })();
        let _ = self.lock.unlock();
        result
    }
}

/// One dataset version's chunks in a tier directory, as one process uses it.
pub struct Tier {
    ds: Arc<Dataset>,
    root: PathBuf,
    dir: PathBuf,
    /// `dir`'s name: the version, as claims name it.
    version: String,
    /// The version's chunks' bytes: the most it could hold.
    want: u64,
    limit: u64,
    /// This reader's claim in `DIR/jobs/`.
    claim: ClaimFile,
    /// Bytes this version may still take in while other versions are short
    /// of what they are owed (its share less what it held at the last
    /// rebalance); `u64::MAX` while nobody is short.
    room: AtomicU64,
    /// Bytes this reader evicted for the placement.
    evicted: AtomicU64,
    ledger: Ledger,
    chunks: File,
    segments: Vec<OnceLock<File>>,
    /// Chunks seen kept (a bit each): they stay until this process forgets them.
    present: Vec<AtomicU64>,
    /// Held while this process reads the version (a shared `flock`).
    _open: File,
}

impl Tier {
    /// The tier of `ds` (at `url`) in `settings.dir`, made if new; the
    /// ledger recounted and the dataset's versions nobody reads removed.
    pub fn open(settings: &TierSettings, url: &str, ds: Arc<Dataset>) -> std::io::Result<Arc<Tier>> {
        let root = settings.dir.clone();
        std::fs::create_dir_all(&root)?;
        let (dataset, version) = keys(url, &ds);
        let version = format!("{dataset}-{version}");
        let dir = root.join(&version);
        let open = open_version(&dir, url)?;
        let chunk_count = ds.index.chunk_count();
        let chunks = open_rw(&dir.join("chunks"))?;
        if chunks.metadata()?.len() < chunk_count * ENTRY {
            chunks.set_len(chunk_count * ENTRY)?;
        }
        let limit = settings.limit.bytes_for(&ds);
        let want = (0..chunk_count).map(|c| ds.index.chunk_padded_len(c)).sum();
        let ledger = Ledger::open(&root)?;
        let claim = ClaimFile::create(&root.join(JOBS), &version)?;
        ledger.locked(|usage| {
            remove_unread_versions(&root, &dataset, &dir);
            *usage = recount(&root)?.values().sum();
            claim.write(&Claim {
                version: version.clone(),
                want,
                benefit: None,
            })
        })?;
        let tier = Tier {
            segments: (0..ds.manifest.segments.len()).map(|_| OnceLock::new()).collect(),
            present: (0..chunk_count.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            ds,
            root,
            dir,
            version,
            want,
            limit,
            claim,
            room: AtomicU64::new(u64::MAX),
            evicted: AtomicU64::new(0),
            ledger,
            chunks,
            _open: open,
        };
        let table = read_table(&tier.chunks)?;
        for (c, &entry) in table.iter().enumerate().take(chunk_count as usize) {
            if entry != 0 && entry & FETCHING == 0 {
                tier.mark(c as u64, true);
            }
        }
        Ok(Arc::new(tier))
    }

    /// The directory holding this version's segment files (a local view of
    /// the dataset reads its kept chunks there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tier directory every dataset shares.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Most bytes this process lets the directory hold.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The version's name in the directory (its claims' and placement's).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Bytes this reader evicted for the placement (its own chunks shed,
    /// versions nobody read removed).
    pub fn evicted_bytes(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Whether chunk `c`'s entry says kept now (one 8-byte read): false
    /// after a reader shed it.
    pub fn entry_kept(&self, c: u64) -> bool {
        matches!(read_u64(&self.chunks, c * ENTRY), Ok(e) if e != 0 && e & FETCHING == 0)
    }

    /// Publishes this reader's `benefit` (share of its time waiting for the
    /// store; None: not measured) and acts on the placement the directory's
    /// live claims give: removes versions nobody reads while this one is
    /// short of its share and the free space cannot cover it; sheds this
    /// version's chunks beyond its share while others are short; stops
    /// taking free space others are owed.
    pub fn rebalance(&self, benefit: Option<f64>) -> std::io::Result<Rebalanced> {
        let claim = Claim {
            version: self.version.clone(),
            want: self.want,
            benefit,
        };
        let done = self.ledger.locked(|usage| {
            self.claim.write(&claim)?;
            let placement = Placement::of(&live_claims(&self.root.join(JOBS))?, self.limit);
            let mut held = held_by_version(&self.root)?;
            let short = |held: &HashMap<String, u64>, v: &str| {
                placement.owed(v).saturating_sub(held.get(v).copied().unwrap_or(0))
            };
            let mut evicted = 0;
            let free = self.limit.saturating_sub(*usage);
            let own_short = short(&held, &self.version);
            if own_short > free {
                let removed = remove_idle_versions(&self.root, &self.dir, own_short - free, &held);
                if removed > 0 {
                    evicted += removed;
                    held = recount(&self.root)?;
                    *usage = held.values().sum();
                }
            }
            let others_short: u64 = placement
                .shares
                .iter()
                .filter(|s| s.version != self.version)
                .map(|s| short(&held, &s.version))
                .sum();
            let owed = placement.owed(&self.version);
            let mut own_held = held.get(&self.version).copied().unwrap_or(0);
            let free = self.limit.saturating_sub(*usage);
            if own_held > owed && others_short > free {
                let shed = self.shed((own_held - owed).min(others_short - free), usage)?;
                own_held -= shed;
                evicted += shed;
            }
            // While others are short, this version takes free space only up
            // to its own share (beyond it, it would take what they are owed
            // and shed it again at the next rebalance).
            let yielding = others_short > 0;
            let room = if yielding {
                owed.saturating_sub(own_held)
            } else {
                u64::MAX
            };
            self.room.store(room, Ordering::Relaxed);
            Ok(Rebalanced {
                placement,
                held: own_held,
                owed,
                evicted,
                yielding,
            })
        })?;
        self.evicted.fetch_add(done.evicted, Ordering::Relaxed);
        Ok(done)
    }

    /// Gives up kept chunks of this version, the last first, until `bytes`
    /// are freed: entries cleared (`usage` with them), holes punched where
    /// their bytes were. Chunks being fetched stay. Under the ledger's lock.
    fn shed(&self, bytes: u64, usage: &mut u64) -> std::io::Result<u64> {
        let table = read_table(&self.chunks)?;
        let mut freed = 0;
        for (c, &entry) in table.iter().enumerate().rev() {
            if freed >= bytes {
                break;
            }
            let c = c as u64;
            if entry == 0
                || entry & FETCHING != 0
                || c >= self.ds.index.chunk_count()
                || !ofd_try_lock(&self.chunks, c)?
            {
                continue;
            }
            let done = (|| -> std::io::Result<u64> {
                let entry = read_u64(&self.chunks, c * ENTRY)?;
                if entry == 0 || entry & FETCHING != 0 {
                    return Ok(0);
                }
                self.mark(c, false);
                self.chunks.write_all_at(&0u64.to_le_bytes(), c * ENTRY)?;
                *usage = usage.saturating_sub(entry);
                let loc = self.ds.index.chunk(c);
                punch_hole(self.segment_file(loc.segment)?, loc.offset, entry)?;
                Ok(entry)
            })();
            ofd_unlock(&self.chunks, c);
            freed += done?;
        }
        Ok(freed)
    }

    /// Bytes the directory holds or has reserved, every dataset together.
    pub fn held_bytes(&self) -> u64 {
        read_u64(&self.ledger.usage, 0).unwrap_or(0)
    }

    /// Chunks of this dataset kept, as this process knows them.
    pub fn kept_chunks(&self) -> u64 {
        self.present
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as u64)
            .sum()
    }

    /// Whether chunk `c` is kept: known here, or (one 8-byte read) kept by
    /// another process since.
    pub fn is_present(&self, c: u64) -> bool {
        if self.known(c) {
            return true;
        }
        match read_u64(&self.chunks, c * ENTRY) {
            Ok(e) if e != 0 && e & FETCHING == 0 => {
                self.mark(c, true);
                true
            }
            _ => false,
        }
    }

    /// Takes chunk `c` in for this process to fetch, unless it is kept,
    /// another process fetches it, or there is no room.
    pub fn admit(self: &Arc<Self>, c: u64) -> std::io::Result<Admission> {
        if self.known(c) {
            return Ok(Admission::Present);
        }
        if !ofd_try_lock(&self.chunks, c)? {
            return Ok(Admission::Busy);
        }
        let decided = (|| {
            let entry = read_u64(&self.chunks, c * ENTRY)?;
            if entry != 0 && entry & FETCHING == 0 {
                self.mark(c, true);
                return Ok(Some(Admission::Present));
            }
            let len = self.ds.index.chunk_padded_len(c);
            // A fetch whose process died: its reservation is counted already.
            let reserved = entry & FETCHING != 0;
            self.ledger.locked(|usage| {
                if !reserved {
                    let room = self.room.load(Ordering::Relaxed);
                    if room != u64::MAX {
                        if room < len {
                            return Ok(Some(Admission::Refused(Refusal::Placement)));
                        }
                        // Under the ledger's lock: no other admission races this one.
                        self.room.store(room - len, Ordering::Relaxed);
                    }
                    if usage.saturating_add(len) > self.limit {
                        return Ok(Some(Admission::Refused(Refusal::Limit)));
                    }
                    if !room_on_disk(&self.dir, len)? {
                        return Ok(Some(Admission::Refused(Refusal::Disk)));
                    }
                    *usage += len;
                }
                self.chunks.write_all_at(&(len | FETCHING).to_le_bytes(), c * ENTRY)?;
                Ok(None)
            })
        })();
        match decided {
            Ok(None) => Ok(Admission::Admitted(Reservation {
                tier: self.clone(),
                chunk: c,
                kept: false,
            })),
            Ok(Some(found)) => {
                ofd_unlock(&self.chunks, c);
                Ok(found)
            }
            Err(e) => {
                ofd_unlock(&self.chunks, c);
                Err(e)
            }
        }
    }

    /// Forgets chunk `c` (a read of it from the tier failed): its entry and
    /// bytes are given up, so the next read fetches it again. A chunk no
    /// longer kept (shed) or being fetched is only forgotten here.
    pub fn forget(&self, c: u64) {
        self.mark(c, false);
        // A fetch's entry is left alone: its lock may be this process's own
        // (an OFD lock taken twice is held once).
        if !self.entry_kept(c) || !matches!(ofd_try_lock(&self.chunks, c), Ok(true)) {
            return;
        }
        let _ = self.clear(c, true);
        ofd_unlock(&self.chunks, c);
    }

    /// Clears chunk `c`'s entry (kept, or also reserved unless `kept_only`)
    /// and gives its bytes back to the ledger. The caller holds the entry's lock.
    fn clear(&self, c: u64, kept_only: bool) -> std::io::Result<()> {
        self.ledger.locked(|usage| {
            let entry = read_u64(&self.chunks, c * ENTRY)?;
            if entry != 0 && !(kept_only && entry & FETCHING != 0) {
                *usage = usage.saturating_sub(entry & !FETCHING);
                self.chunks.write_all_at(&0u64.to_le_bytes(), c * ENTRY)?;
            }
            Ok(())
        })
    }

    fn known(&self, c: u64) -> bool {
        self.present
            .get((c / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (c % 64)) != 0)
    }

    fn mark(&self, c: u64, kept: bool) {
        if let Some(w) = self.present.get((c / 64) as usize) {
            let bit = 1u64 << (c % 64);
            if kept {
                w.fetch_or(bit, Ordering::Relaxed);
            } else {
                w.fetch_and(!bit, Ordering::Relaxed);
            }
        }
    }

    /// Segment `s`'s file in the tier, opened for writing (and sized, sparse,
    /// to the segment's length) the first time.
    fn segment_file(&self, s: u32) -> std::io::Result<&File> {
        let cell = self
            .segments
            .get(s as usize)
            .ok_or_else(|| std::io::Error::other(format!("no segment {s}")))?;
        if let Some(f) = cell.get() {
            return Ok(f);
        }
        let seg = &self.ds.manifest.segments[s as usize];
        let f = open_rw(&self.dir.join(&seg.name))?;
        if f.metadata()?.len() < seg.bytes {
            f.set_len(seg.bytes)?;
        }
        Ok(cell.get_or_init(|| f))
    }
}

/// What one [`Tier::rebalance`] found and did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rebalanced {
    /// The directory's space shared out among the versions read now.
    pub placement: Placement,
    /// Bytes this version holds (kept or being fetched) and is owed.
    pub held: u64,
    pub owed: u64,
    /// Bytes evicted now: this version's chunks shed, versions nobody reads removed.
    pub evicted: u64,
    /// Others are short of their shares: this version takes free space only
    /// up to its own.
    pub yielding: bool,
}

/// A reader's claim file in `DIR/jobs/`, held under an exclusive `flock`
/// while it lives (the kernel drops it when the process dies), removed
/// when it closes.
struct ClaimFile {
    path: PathBuf,
    file: File,
}

impl ClaimFile {
    fn create(jobs: &Path, version: &str) -> std::io::Result<ClaimFile> {
        static READERS: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(jobs)?;
        let n = READERS.fetch_add(1, Ordering::Relaxed);
        let path = jobs.join(format!("{version}.{}.{n}", std::process::id()));
        let file = open_rw(&path)?;
        file.lock()?;
        Ok(ClaimFile { path, file })
    }

    /// Writes `claim` (under the ledger's lock: nobody reads it half written).
    fn write(&self, claim: &Claim) -> std::io::Result<()> {
        let text = claim.encode();
        self.file.set_len(0)?;
        self.file.write_all_at(text.as_bytes(), 0)
    }
}

impl Drop for ClaimFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The claims of the live readers in `jobs`; a dead reader's claim (its
/// lock free) is removed.
fn live_claims(jobs: &Path) -> std::io::Result<Vec<Claim>> {
    let mut claims = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(jobs)?.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Ok(file) = File::open(&path) else { continue };
        match file.try_lock_shared() {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                claims.extend(Claim::decode(&text));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    Ok(claims)
}

/// Bytes each version in `root` holds or has reserved, by its name.
fn held_by_version(root: &Path) -> std::io::Result<HashMap<String, u64>> {
    let mut held = HashMap::new();
    for e in std::fs::read_dir(root)?.flatten() {
        let Ok(file) = File::open(e.path().join("chunks")) else {
            continue;
        };
        let bytes = read_table(&file)?
            .into_iter()
            .fold(0u64, |sum, entry| sum.saturating_add(entry & !FETCHING));
        held.insert(e.file_name().to_string_lossy().into_owned(), bytes);
    }
    Ok(held)
}

/// Removes versions in `root` nobody reads (their `open` lock free), other
/// than `keep`, until `need` bytes are freed (by `held`'s count); returns
/// the bytes freed. Best effort.
fn remove_idle_versions(root: &Path, keep: &Path, need: u64, held: &HashMap<String, u64>) -> u64 {
    let mut idle: Vec<(String, u64)> = held
        .iter()
        .filter(|&(name, &bytes)| bytes > 0 && root.join(name) != keep)
        .map(|(name, &bytes)| (name.clone(), bytes))
        .collect();
    idle.sort();
    let mut freed = 0;
    for (name, bytes) in idle {
        if freed >= need {
            break;
        }
        let path = root.join(&name);
        if remove_if_unread(&path) {
            tracing::info!(
                "{}: removed a version nobody reads ({bytes} bytes) for a job that benefits from the room",
                path.display()
            );
            freed += bytes;
        }
    }
    freed
}

/// A chunk this process fetches for the tier: [`keep`](Self::keep) its
/// bytes, or drop it to give the reservation back.
pub struct Reservation {
    tier: Arc<Tier>,
    chunk: u64,
    kept: bool,
}

impl Reservation {
    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Writes the chunk's `bytes` (from its start, its padded length),
    /// checked first (every record's crc32c: damage from the network is
    /// not kept), syncs them, then marks the chunk kept.
    pub fn keep(mut self, bytes: &[u8]) -> Result<()> {
        let tier = self.tier.clone();
        let c = self.chunk;
        tier.ds.check_chunk(c, bytes)?;
        let loc = tier.ds.index.chunk(c);
        let io = |e: std::io::Error| Error::io(tier.dir.join(&tier.ds.manifest.segments[loc.segment as usize].name), e);
        let file = tier.segment_file(loc.segment).map_err(io)?;
        file.write_all_at(bytes, loc.offset).map_err(io)?;
        file.sync_data().map_err(io)?;
        // The chunk is on the disk: the page cache need not keep it (the
        // tier is read with O_DIRECT, and the plan is the cache).
        // SAFETY: an open descriptor; fadvise only advises the kernel.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                loc.offset as libc::off_t,
                bytes.len() as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
        let len = tier.ds.index.chunk_padded_len(c);
        tier.chunks
            .write_all_at(&len.to_le_bytes(), c * ENTRY)
            .map_err(|e| Error::io(tier.dir.join("chunks"), e))?;
        tier.mark(c, true);
        self.kept = true;
        ofd_unlock(&tier.chunks, c);
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let (tier, c) = (&self.tier, self.chunk);
        if let Err(e) = tier.clear(c, false) {
            tracing::debug!("{}: chunk {c}'s reservation not given back: {e}", tier.dir.display());
        }
        ofd_unlock(&tier.chunks, c);
    }
}

/// The names of `ds`'s directory in a tier: its dataset part (the URL's
/// crc32c) and its version part (what pins its contents).
fn keys(url: &str, ds: &Dataset) -> (String, String) {
    let dataset = crc32c::crc32c(url.as_bytes());
    let mut v = crc32c::crc32c_append(dataset ^ 0x7a1e_5eed, &ds.index.content_digest().to_le_bytes());
    for (i, seg) in ds.manifest.segments.iter().enumerate() {
        v = crc32c::crc32c_append(v, seg.name.as_bytes());
        v = crc32c::crc32c_append(v, &seg.bytes.to_le_bytes());
        if let Origin::Objects(objects) = &ds.origin
            && let Some(tag) = objects.get(i).and_then(|o| o.e_tag.as_deref())
        {
            v = crc32c::crc32c_append(v, tag.as_bytes());
        }
    }
    (format!("{dataset:08x}"), format!("{v:08x}"))
}

/// Removes the versions of `dataset` other than `keep` that no process
/// reads (their `open` lock free). Best effort.
fn remove_unread_versions(root: &Path, dataset: &str, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if path == keep || !name.starts_with(&format!("{dataset}-")) || !path.is_dir() {
            continue;
        }
        if remove_if_unread(&path) {
            tracing::info!("{}: removed a version of the dataset nobody reads", path.display());
        }
    }
}

/// Removes version directory `path` if no process reads it (its `open`
/// file's lock free, taken for the removal); whether it did. Best effort.
fn remove_if_unread(path: &Path) -> bool {
    let Ok(open) = File::options().read(true).write(true).open(path.join("open")) else {
        return false;
    };
    if open.try_lock().is_err() {
        return false;
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!("{}: not removed: {e}", path.display());
            false
        }
    }
}

/// Bytes each version in `root` holds or has reserved, by its name: kept
/// chunks, and chunks being fetched by a live process (their entry's lock
/// held). An entry marked fetching with no lock is a dead process's:
/// cleared. Their sum is the ledger's usage.
fn recount(root: &Path) -> std::io::Result<HashMap<String, u64>> {
    let mut held = HashMap::new();
    for e in std::fs::read_dir(root)?.flatten() {
        let path = e.path().join("chunks");
        let Ok(file) = File::options().read(true).write(true).open(&path) else {
            continue;
        };
        let mut total = 0u64;
        for (c, entry) in read_table(&file)?.into_iter().enumerate() {
            if entry & FETCHING == 0 {
                total = total.saturating_add(entry);
            } else if ofd_locked(&file, c as u64)? {
                total = total.saturating_add(entry & !FETCHING);
            } else {
                file.write_all_at(&0u64.to_le_bytes(), c as u64 * ENTRY)?;
            }
        }
        held.insert(e.file_name().to_string_lossy().into_owned(), total);
    }
    Ok(held)
}

/// Version directory `dir` (made if new) with its `open` file locked
/// shared. A version removed between making it and locking it (by a
/// reader that found it idle) is made again.
fn open_version(dir: &Path, url: &str) -> std::io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    let mut tries = 0;
    loop {
        std::fs::create_dir_all(dir)?;
        if !dir.join("url").exists() {
            std::fs::write(dir.join("url"), format!("{url}\n"))?;
        }
        let open = open_rw(&dir.join("open"));
        if let Ok(open) = open {
            open.lock_shared()?;
            let still = std::fs::metadata(dir.join("open")).map(|m| m.ino());
            if still.is_ok_and(|ino| ino == open.metadata().map(|m| m.ino()).unwrap_or(0)) {
                return Ok(open);
            }
        }
        tries += 1;
        if tries == 3 {
            return Err(std::io::Error::other(format!(
                "{}: removed again and again while being opened",
                dir.display()
            )));
        }
    }
}

/// Frees the disk blocks of `len` bytes at `offset` of `file` (its size kept).
fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: an open descriptor; fallocate changes only the file's blocks.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `path` opened for reading and writing, made empty if new.
fn open_rw(path: &Path) -> std::io::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

fn read_table(file: &File) -> std::io::Result<Vec<u64>> {
    let len = file.metadata()?.len();
    let mut bytes = vec![0u8; (len - len % ENTRY) as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes
        .chunks_exact(ENTRY as usize)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .collect())
}

/// The u64 at `at` (0 past the end: a new file).
fn read_u64(file: &File, at: u64) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    match file.read_exact_at(&mut b, at) {
        Ok(()) => Ok(u64::from_le_bytes(b)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
        Err(e) => Err(e),
    }
}

/// Whether `len` more bytes leave the file system of `dir` [`FREE_SHARE`] free.
fn room_on_disk(dir: &Path, len: u64) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path and a zeroed struct statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointers live across the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let block = st.f_frsize as u64;
    let free = (st.f_bavail as u64).saturating_mul(block);
    let total = (st.f_blocks as u64).saturating_mul(block);
    Ok(free >= len.saturating_add((total as f64 * FREE_SHARE) as u64))
}

fn entry_lock(kind: libc::c_int, c: u64) -> libc::flock {
    // SAFETY: a plain C struct; zero is a valid value of every field.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = (c * ENTRY) as libc::off_t;
    l.l_len = ENTRY as libc::off_t;
    l
}

/// Takes the OFD write lock on chunk `c`'s entry, without waiting; false
/// if another open file holds it.
fn ofd_try_lock(file: &File, c: u64) -> std::io::Result<bool> {
    let l = entry_lock(libc::F_WRLCK, c);
    // SAFETY: an open descriptor and a struct flock that lives across the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &l) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

fn ofd_unlock(file: &File, c: u64) {
    let l = entry_lock(libc::F_UNLCK, c);
    // SAFETY: as in `ofd_try_lock`; unlocking cannot block.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &l) };
}

/// Whether some open file holds a lock on chunk `c`'s entry.
fn ofd_locked(file: &File, c: u64) -> std::io::Result<bool> {
    let mut l = entry_lock(libc::F_WRLCK, c);
    // SAFETY: an open descriptor and a struct flock the kernel fills.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l.l_type != libc::F_UNLCK as libc::c_short)
}
