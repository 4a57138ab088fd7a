//! The local tier under the object-storage backend (DESIGN.md §4, "A
//! local tier"; the directory itself is `brand_store::tier`): which jobs
//! read the tier's disk and which the store, chunks fetched whole for the
//! tier, the jobs waiting on a chunk being fetched, and what it counted.
//!
//! * A job for a chunk the tier keeps goes to a disk backend reading the
//!   tier's segment files (io_uring, O_DIRECT, only its records).
//! * A job for a chunk not kept takes it in ([`Tier::admit`]) and the
//!   whole chunk is fetched (neighbours merged into GETs as any extents),
//!   kept, and the job's records decoded from the fetched bytes. Jobs for
//!   a chunk this process is fetching wait for it; for a chunk another
//!   process fetches, they wait until it is kept (co-operative misses), at
//!   most the stall timeout, then read the store.
//! * A chunk the tier has no room for is read from the store as without a
//!   tier (only the records asked for); so is a chunk the tiered policy
//!   does not pin (`brand_format::pin`: it reads those whole, once an
//!   epoch), which is never taken in.
//! * A start's first fill is read record by record from the store (its
//!   first batch waits for its records, not for whole chunks); the chunks it
//!   touched that no later read takes in are fetched whole beside the
//!   reader's reads (two GETs at most at a time, within the fetch budget),
//!   so an epoch after the first finds them kept.
//! * A tier that cannot be written (a failed disk, a full one, a read-only
//!   mount) is given up with one warning: the store serves the rest. A read
//!   from the tier that fails (its bytes fail their crc32c: damaged on the
//!   disk) forgets the chunk and reads the job from the store; so does a
//!   read of a chunk shed for the placement meanwhile (silently).
//! * About every second ([`PLACEMENT_PERIOD`]) the reader measures its
//!   benefit (the share of its consumer's time spent waiting, over the
//!   share of its reads served by the store) and rebalances the tier's
//!   space among the machine's readers (`brand_store::placement`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use brand_format::dataset::Dataset;
use brand_format::error::Error;
use brand_store::tier::{Admission, Refusal, Reservation, Tier};

use crate::job::{Completion, Job, JobSender};

/// How often a reader measures its benefit and rebalances the tier.
pub const PLACEMENT_PERIOD: Duration = Duration::from_secs(1);

/// A benefit is measured only over a period in which the store served at
/// least this share of the reader's reads (a reader the tier serves
/// keeps the benefit it measured while the store did: what the tier
/// saves it, not what is left to save).
const MIN_STORE_SHARE: f64 = 0.25;

/// What the tier did for one reader.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TierReport {
    /// Reads served from the tier's disk, and their bytes.
    pub hits: u64,
    pub hit_bytes: u64,
    /// Chunks this reader fetched whole into the tier, and their bytes.
    pub chunks_fetched: u64,
    pub bytes_fetched: u64,
    /// Reads of chunks the tier had no room for (read from the store).
    pub refused: u64,
    /// Reads that waited for another process's fetch of their chunk.
    pub waited: u64,
    /// Reads from the tier that failed and went to the store.
    pub failed_reads: u64,
    /// Chunks of the dataset the tier keeps (as this reader knows).
    pub kept_chunks: u64,
    /// Bytes the tier directory holds, every dataset in it, and its limit here.
    pub held_bytes: u64,
    pub limit_bytes: u64,
    /// The placement: the share of its time this reader's consumer waits
    /// for the store (None: not measured), the bytes of the tier its
    /// dataset is owed, and the bytes it evicted for others.
    pub benefit: Option<f64>,
    pub owed_bytes: u64,
    pub evicted_bytes: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    chunks_fetched: AtomicU64,
    bytes_fetched: AtomicU64,
    refused: AtomicU64,
    waited: AtomicU64,
    failed_reads: AtomicU64,
    /// Bytes of every job routed (to the disk, the store or a fetch).
    routed_bytes: AtomicU64,
}

/// A reader's benefit as it measures it, period by period.
struct Gauge {
    /// When the consumer took its first sample (None: no consumer says
    /// when it waits, as `brand serve`'s nodes; the benefit stays unknown).
    started: Option<Instant>,
    /// The period's start, and the counts then.
    since: Instant,
    waited_ns: u64,
    routed: u64,
    hits: u64,
    benefit: Option<f64>,
    owed: u64,
    /// What the last rebalance logged (to log changes only).
    said: Option<(u64, bool)>,
}

/// Where a batch of jobs goes.
#[derive(Default)]
pub(crate) struct Routed {
    /// Read from the store, records only.
    pub store: Vec<Job>,
    /// Chunks taken in for this process to fetch whole, each with the job
    /// that asked (none for a chunk fetched ahead of any).
    pub fetch: Vec<(Reservation, Option<Job>)>,
    /// Jobs whose chunk another process is fetching.
    pub busy: Vec<(u64, Job)>,
}

/// A reader's use of a tier: the tier, the disk backend reading it, and
/// the jobs waiting on the chunks this process fetches.
pub(crate) struct TierPath {
    pub tier: Arc<Tier>,
    ds: Arc<Dataset>,
    /// Where jobs for kept chunks go; taken when the reader closes (the
    /// disk backend stops once it is dropped).
    disk: Mutex<Option<Box<dyn JobSender>>>,
    /// Chunks being fetched by this process, with the jobs waiting on them.
    fetching: Mutex<HashMap<u64, Vec<Job>>>,
    /// The tier could not be written: no more chunks are taken in.
    given_up: AtomicBool,
    /// Bytes of whole chunks being fetched, in MiB: a reader's read-ahead
    /// bounds what it asked for, and a chunk fetched whole for one record
    /// is more (at most `budget` MiB at once).
    fetching_bytes: Arc<tokio::sync::Semaphore>,
    budget_mib: u32,
    /// Chunks a start's first fill read from the store, to fetch whole
    /// when the store is idle, in chunk order (neighbours share a GET).
    later: Mutex<std::collections::BTreeSet<u64>>,
    /// `pinned[c]`: chunk `c` may be taken in (the tiered policy); `None`:
    /// any chunk may.
    pinned: Option<Vec<bool>>,
    counters: Counters,
    /// Nanoseconds the consumer waited for reads, since it started.
    waited_ns: AtomicU64,
    gauge: Mutex<Gauge>,
}

impl TierPath {
    /// The tier's routing; whole chunks being fetched hold at most
    /// `budget_bytes` (at least one GET's worth); only `pinned` chunks are
    /// taken in, if given.
    pub fn new(
        tier: Arc<Tier>,
        ds: Arc<Dataset>,
        disk: Box<dyn JobSender>,
        budget_bytes: u64,
        pinned: Option<Vec<bool>>,
    ) -> Self {
        let budget_mib = budget_bytes.div_ceil(1 << 20).clamp(1, u32::MAX as u64 >> 4) as u32;
        TierPath {
            fetching_bytes: Arc::new(tokio::sync::Semaphore::new(budget_mib as usize)),
            budget_mib,
            later: Mutex::new(Default::default()),
            tier,
            ds,
            disk: Mutex::new(Some(disk)),
            fetching: Mutex::new(HashMap::new()),
            given_up: AtomicBool::new(false),
            pinned,
            counters: Counters::default(),
            waited_ns: AtomicU64::new(0),
            gauge: Mutex::new(Gauge {
                started: None,
                since: Instant::now(),
                waited_ns: 0,
                routed: 0,
                hits: 0,
                benefit: None,
                owed: 0,
                said: None,
            }),
        }
    }

    /// The consumer took its first sample: from now on it says how long it
    /// waits for reads ([`Self::consumer_waited`]), and the reader's
    /// benefit is measured.
    pub fn consumer_started(&self) {
        let mut g = self.gauge.lock().unwrap_or_else(|p| p.into_inner());
        if g.started.is_none() {
            let now = Instant::now();
            g.started = Some(now);
            g.since = now;
            g.waited_ns = self.waited_ns.load(Ordering::Relaxed);
            g.routed = self.counters.routed_bytes.load(Ordering::Relaxed);
            g.hits = self.counters.hit_bytes.load(Ordering::Relaxed);
        }
    }

    /// The consumer waited `d` for a read.
    pub fn consumer_waited(&self, d: Duration) {
        self.waited_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Every [`PLACEMENT_PERIOD`]: the benefit measured over the period
    /// and the tier rebalanced with it.
    fn tick(&self) {
        let mut g = match self.gauge.try_lock() {
            Ok(g) => g,
            Err(_) => return,
        };
        let now = Instant::now();
        let wall = now.duration_since(g.since);
        if wall < PLACEMENT_PERIOD || self.given_up.load(Ordering::Relaxed) {
            return;
        }
        let (waited, routed, hits) = (
            self.waited_ns.load(Ordering::Relaxed),
            self.counters.routed_bytes.load(Ordering::Relaxed),
            self.counters.hit_bytes.load(Ordering::Relaxed),
        );
        if g.started.is_some() {
            let read = routed.saturating_sub(g.routed);
            let from_store = 1.0 - hits.saturating_sub(g.hits) as f64 / read.max(1) as f64;
            if read > 0 && from_store >= MIN_STORE_SHARE {
                let waiting = waited.saturating_sub(g.waited_ns) as f64 / wall.as_nanos() as f64;
                let now_measured = (waiting / from_store).clamp(0.0, 1.0);
                // Half the last period, half what came before: a change of
                // phase shows within a few periods, one stall does not.
                g.benefit = Some(g.benefit.map_or(now_measured, |b| (b + now_measured) / 2.0));
            }
        }
        (g.since, g.waited_ns, g.routed, g.hits) = (now, waited, routed, hits);
        match self.tier.rebalance(g.benefit) {
            Ok(r) => {
                g.owed = r.owed;
                if r.evicted > 0 || g.said != Some((r.owed, r.yielding)) {
                    g.said = Some((r.owed, r.yielding));
                    let others: Vec<String> = r
                        .placement
                        .shares
                        .iter()
                        .filter(|s| s.version != self.tier.version())
                        .map(|s| format!("{} owed {} (benefit {})", s.version, s.owed, benefit_text(s.benefit)))
                        .collect();
                    tracing::info!(
                        "tier placement: this dataset ({}) waits {} of its time for the store; owed {} bytes of {}, \
                         holds {}{}{}; others: {}",
                        self.tier.version(),
                        benefit_text(g.benefit),
                        r.owed,
                        self.tier.limit(),
                        r.held,
                        if r.evicted > 0 {
                            format!(", evicted {} bytes", r.evicted)
                        } else {
                            String::new()
                        },
                        if r.yielding {
                            ", leaves the free space to others"
                        } else {
                            ""
                        },
                        if others.is_empty() {
                            "none".to_string()
                        } else {
                            others.join(", ")
                        }
                    );
                }
            }
            Err(e) => {
                drop(g);
                self.give_up(&Error::io(self.tier.root(), e));
            }
        }
    }

    /// The chunk an extent (a job's, a completion's) reads.
    pub fn chunk_of(&self, extent: &brand_format::extents::Extent) -> Option<u64> {
        extent.records.first().map(|&(id, _)| self.ds.index.chunk_of(id))
    }

    /// Sends the jobs for kept chunks to the disk, joins those for chunks
    /// being fetched here, and sorts the rest.
    pub fn route(&self, jobs: Vec<Job>) -> Routed {
        self.tick();
        let mut routed = Routed::default();
        for job in jobs {
            self.counters.routed_bytes.fetch_add(job.extent.len, Ordering::Relaxed);
            let Some(c) = self.chunk_of(&job.extent) else {
                routed.store.push(job);
                continue;
            };
            if self.tier.is_present(c) {
                self.to_disk(job);
                continue;
            }
            if self.given_up.load(Ordering::Relaxed) || !self.takes_in(c) {
                routed.store.push(job);
                continue;
            }
            if job.first_fill {
                self.later.lock().unwrap_or_else(|p| p.into_inner()).insert(c);
                routed.store.push(job);
                continue;
            }
            let mut fetching = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(waiting) = fetching.get_mut(&c) {
                waiting.push(job);
                continue;
            }
            match self.tier.admit(c) {
                Ok(Admission::Present) => {
                    drop(fetching);
                    self.to_disk(job);
                }
                Ok(Admission::Admitted(r)) => {
                    fetching.insert(c, Vec::new());
                    routed.fetch.push((r, Some(job)));
                }
                Ok(Admission::Busy) => routed.busy.push((c, job)),
                Ok(Admission::Refused(why)) => {
                    if self.counters.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                        let why = match why {
                            Refusal::Limit => format!("its limit, {} bytes, is reached", self.tier.limit()),
                            Refusal::Disk => format!(
                                "its disk would have less than {:.0} % free",
                                brand_store::tier::FREE_SHARE * 100.0
                            ),
                            Refusal::Placement => "its free space is owed to jobs that wait for the store more".into(),
                        };
                        tracing::info!(
                            "{}: the tier keeps no more chunks ({why}); the others are read from the store",
                            self.tier.root().display()
                        );
                    }
                    routed.store.push(job);
                }
                Err(e) => {
                    drop(fetching);
                    self.give_up(&Error::io(self.tier.dir(), e));
                    routed.store.push(job);
                }
            }
        }
        routed
    }

    /// Whether chunk `c` may be taken in (every chunk, unless the tiered
    /// policy pins some).
    fn takes_in(&self, c: u64) -> bool {
        self.pinned
            .as_ref()
            .is_none_or(|p| p.get(c as usize).copied().unwrap_or(false))
    }

    /// Chunks a start's first fill passed by, taken in for this reader to
    /// fetch now: a run of neighbours in one segment, at most `limit` bytes,
    /// none kept or being fetched. Empty when there are none, or no room.
    pub fn take_later(&self, limit: u64) -> Vec<Reservation> {
        let mut later = self.later.lock().unwrap_or_else(|p| p.into_inner());
        let mut fetching = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        let mut run: Vec<Reservation> = Vec::new();
        let mut end: Option<(u32, u64)> = None;
        let mut bytes = 0;
        while let Some(&c) = later.first() {
            let loc = self.ds.index.chunk(c);
            let len = self.ds.index.chunk_padded_len(c);
            let next_to_run = end.is_none_or(|e| e == (loc.segment, loc.offset));
            if !next_to_run || (bytes > 0 && bytes + len > limit) {
                break;
            }
            later.remove(&c);
            if self.given_up.load(Ordering::Relaxed) || fetching.contains_key(&c) {
                continue;
            }
            match self.tier.admit(c) {
                Ok(Admission::Admitted(r)) => {
                    fetching.insert(c, Vec::new());
                    run.push(r);
                    bytes += len;
                    end = Some((loc.segment, loc.offset + len));
                }
                Ok(Admission::Refused(_)) => {
                    // No room: nothing passed by will be taken in.
                    later.clear();
                    break;
                }
                // Kept, or another process fetches it.
                Ok(Admission::Present | Admission::Busy) => {}
                Err(e) => {
                    drop((later, fetching));
                    self.give_up(&Error::io(self.tier.dir(), e));
                    return run;
                }
            }
        }
        run
    }

    /// Room for `bytes` of whole chunks in the fetch budget, if free now.
    pub fn try_fetch_room(&self, bytes: u64) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.fetching_bytes
            .clone()
            .try_acquire_many_owned(self.budget_units(bytes))
            .ok()
    }

    /// Room for `bytes` of whole chunks in the fetch budget, waited for
    /// (a group larger than the budget takes all of it).
    pub async fn fetch_room(&self, bytes: u64) -> Option<tokio::sync::OwnedSemaphorePermit> {
        // The semaphore is never closed: None only if it were.
        self.fetching_bytes
            .clone()
            .acquire_many_owned(self.budget_units(bytes))
            .await
            .ok()
    }

    /// The budget's units (MiB) `bytes` takes: all of it at most.
    fn budget_units(&self, bytes: u64) -> u32 {
        bytes.div_ceil(1 << 20).clamp(1, self.budget_mib as u64) as u32
    }

    /// A job for a kept chunk, to the tier's disk.
    pub fn to_disk(&self, job: Job) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.counters.hit_bytes.fetch_add(job.extent.len, Ordering::Relaxed);
        // No disk backend (or a stopped one) is a closing reader: nobody
        // waits for the job.
        if let Some(disk) = &*self.disk.lock().unwrap_or_else(|p| p.into_inner()) {
            disk.send(job);
        }
    }

    /// Stops sending jobs to the disk backend, so it ends.
    pub fn close(&self) {
        self.disk.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// The chunk's fetched `bytes` kept (checked, written, synced); a
    /// damaged chunk is not kept (its jobs' records find the damage), a
    /// tier that cannot be written is given up.
    pub fn keep(&self, r: Reservation, bytes: &[u8]) {
        match r.keep(bytes) {
            Ok(()) => {
                self.counters.chunks_fetched.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_fetched
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            Err(Error::Corrupt { .. }) => {}
            Err(e) => self.give_up(&e),
        }
    }

    /// The jobs that waited on chunk `c`, which this process no longer fetches.
    pub fn waiting_on(&self, c: u64) -> Vec<Job> {
        let mut fetching = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        fetching.remove(&c).unwrap_or_default()
    }

    /// A read from the tier failed: the chunk is forgotten (fetched again
    /// by the next read that wants it) and this read goes to the store.
    pub fn read_failed(&self, c: &Completion) {
        let Some(chunk) = self.chunk_of(&c.extent) else {
            return;
        };
        if !self.tier.entry_kept(chunk) {
            // Shed for the placement (by this reader or another): not damage.
            self.tier.forget(chunk);
            return;
        }
        if self.counters.failed_reads.fetch_add(1, Ordering::Relaxed) == 0 {
            let why = match &c.result {
                Err(e) => e.to_string(),
                Ok(records) => records
                    .iter()
                    .find_map(|(_, r)| r.as_ref().err().map(|e| e.to_string()))
                    .unwrap_or_default(),
            };
            tracing::warn!("a read from the local tier failed ({why}); reading it from the store");
        }
        self.tier.forget(chunk);
    }

    /// Counts a read that waited for another process's fetch.
    pub fn waited(&self) {
        self.counters.waited.fetch_add(1, Ordering::Relaxed);
    }

    fn give_up(&self, e: &Error) {
        if !self.given_up.swap(true, Ordering::Relaxed) {
            tracing::warn!("the local tier cannot be written ({e}); reading from the store without it");
        }
    }

    pub fn report(&self) -> TierReport {
        let g = self.gauge.lock().unwrap_or_else(|p| p.into_inner());
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TierReport {
            hits: n(&c.hits),
            hit_bytes: n(&c.hit_bytes),
            chunks_fetched: n(&c.chunks_fetched),
            bytes_fetched: n(&c.bytes_fetched),
            refused: n(&c.refused),
            waited: n(&c.waited),
            failed_reads: n(&c.failed_reads),
            kept_chunks: self.tier.kept_chunks(),
            held_bytes: self.tier.held_bytes(),
            limit_bytes: self.tier.limit(),
            benefit: g.benefit,
            owed_bytes: g.owed,
            evicted_bytes: self.tier.evicted_bytes(),
        }
    }
}

fn benefit_text(b: Option<f64>) -> String {
    b.map_or("(not measured)".into(), |b| format!("{b:.2}"))
}
