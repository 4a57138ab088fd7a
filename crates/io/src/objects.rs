//! The object-storage backend: extents become ranged GETs on an async
//! runtime this engine owns (brand-store's; made where the engine starts, so
//! a forked child's engine has its own). What a store wants is few, large
//! requests, many in flight:
//!
//! * Jobs waiting together whose extents touch in one segment become one
//!   GET of at most
//!   `get_bytes` (8 MiB by default: AWS's guidance for S3); an extent
//!   longer than that is fetched in `get_bytes` parts at once.
//! * GETs in flight are limited by brand-store's `Limiter`: by default
//!   sized as GETs complete (enough to fill the link, no more: every extra
//!   GET delays the ones the loader needs first), or at most
//!   `gets_in_flight`; halved when the store throttles, grown back as GETs
//!   succeed. The loader's read-ahead bounds the bytes in flight as for a
//!   disk.
//! * Each GET is retried, resumed, hedged and pinned to the segment's
//!   entity tag as `brand_store::get` says; the body is copied once, into a
//!   page-aligned buffer, and records are decoded from it (crc32c, zstd) as
//!   on a disk, on a blocking thread so the runtime keeps receiving.
//!
//! Groups start in the order their first job arrived (plan order), so the
//! reads the loader needs first are asked for first.
//!
//! With a local tier (`crate::tier`), jobs for chunks it keeps go to a
//! disk backend instead, and chunks it takes in are fetched whole and kept
//! before their jobs are decoded from the same bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use brand_format::buffer::AlignedBuf;
use brand_format::dataset::{Dataset, Origin};
use brand_format::decode::ExtentBytes;
use brand_format::error::{Error, Result};
use brand_format::extents::{get_parts, group_touching};
use brand_store::Connection;
use brand_store::get::{self, GetCounters, GetPolicy};
use brand_store::limiter::{Limiter, Permit};
use brand_store::location::Location;
use brand_store::runtime::IoRuntime;

use crate::config::GetsInFlight;
use crate::job::{Completion, Job, Shared, Started, StoreStats};
use crate::read::reads_in_place;
use crate::tier::TierPath;

/// Threads of the engine's runtime: HTTP and copying bodies, not decoding.
const RUNTIME_THREADS: usize = 2;

/// Most time a closing reader waits for its runtime's decoding to end.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

struct Ctx {
    shared: Shared,
    conn: Connection,
    policy: GetPolicy,
    stats: Arc<StoreStats>,
    tier: Option<Arc<TierPath>>,
}

/// A local tier's disk backend, started by the engine for this backend.
pub(crate) struct TierDisk {
    pub path: Arc<TierPath>,
    /// The disk backend's completions (disconnected once it has stopped).
    pub done: crossbeam_channel::Receiver<Completion>,
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

/// A job sent back to the dispatcher, and whether it must skip the tier.
type Again = (Job, bool);

/// A run of neighbouring jobs' extents in one segment, read by one GET (or
/// by `get_bytes` parts of it).
struct Group {
    segment: u32,
    start: u64,
    end: u64,
    jobs: Vec<Job>,
    /// Chunks the group fetches whole for the tier.
    keep: Vec<brand_store::tier::Reservation>,
}

pub(crate) fn start(shared: Shared, tier: Option<TierDisk>) -> Result<Started> {
    let ds = shared.ds.clone();
    let Location::Url(url) = Location::parse(&ds.dir().to_string_lossy())? else {
        return Err(Error::config(format!(
            "{}: not an object-storage URL",
            ds.dir().display()
        )));
    };
    let policy = shared.cfg.store.get_policy();
    let conn = Connection::new(&url, policy.stall)?;
    let stats = Arc::new(StoreStats {
        counters: GetCounters::default(),
        limiter: Arc::new(match shared.cfg.store.gets_in_flight {
            GetsInFlight::Auto => Limiter::adaptive(),
            GetsInFlight::Fixed(n) => Limiter::new(n),
        }),
    });
    let _ = shared.stats.store.set(stats.clone());
    let rt = IoRuntime::new(RUNTIME_THREADS)?;
    let (job_tx, job_rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
    let (again_tx, again_rx) = tokio::sync::mpsc::unbounded_channel::<Again>();
    let (exit_tx, exit_rx) = crossbeam_channel::bounded::<()>(0);
    let mut threads = Vec::new();
    let path = match tier {
        Some(disk) => {
            let TierDisk {
                path,
                done,
                threads: disk_threads,
            } = disk;
            threads.extend(disk_threads);
            let (forward_to, forward_path, exit) = (shared.done.clone(), path.clone(), exit_tx.clone());
            let again = again_tx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("brand-tier".into())
                    .spawn(move || {
                        let _exit = exit;
                        forward(done, forward_to, &forward_path, again);
                    })
                    .map_err(|e| Error::io("<brand-tier thread>", e))?,
            );
            Some(path)
        }
        None => None,
    };
    let ctx = Arc::new(Ctx {
        shared,
        conn,
        policy,
        stats,
        tier: path,
    });
    threads.push(
        std::thread::Builder::new()
            .name("brand-objects".into())
            .spawn(move || {
                let _exit = exit_tx;
                rt.block_on(dispatch(job_rx, again_rx, again_tx, ctx.clone()));
                if let Some(t) = &ctx.tier {
                    t.close();
                }
                // Its connections' tasks stop before the engine says it exited:
                // a request they had queued is not sent after the reader closed.
                rt.shutdown(SHUTDOWN_WAIT);
            })
            .map_err(|e| Error::io("<brand-objects thread>", e))?,
    );
    Ok(Started {
        jobs: Box::new(job_tx),
        threads,
        exited: exit_rx,
    })
}

/// Hands the tier's disk reads on; one that failed goes back to the
/// dispatcher for the store. Ends when the disk backend has stopped.
fn forward(
    done: crossbeam_channel::Receiver<Completion>,
    to: crossbeam_channel::Sender<Completion>,
    path: &TierPath,
    again: tokio::sync::mpsc::UnboundedSender<Again>,
) {
    for c in done.iter() {
        let failed = match &c.result {
            Err(_) => true,
            Ok(records) => records.iter().any(|(_, r)| r.is_err()),
        };
        if failed {
            path.read_failed(&c);
            // A dispatcher gone is a reader closed: nobody wants the job.
            let _ = again.send((Job::new(c.tag, c.extent), true));
        } else if to.send(c).is_err() {
            break;
        }
    }
}

/// Takes every job waiting, groups neighbours, starts a task per group;
/// returns once the job channel closed. A closed channel is a reader gone
/// (the engine dropped): nobody takes completions any more, so jobs not
/// started are dropped and GETs in flight are aborted, not finished (they
/// were the next epoch's read-ahead of a closed loader, still fetching).
async fn dispatch(
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>,
    mut again: tokio::sync::mpsc::UnboundedReceiver<Again>,
    again_tx: tokio::sync::mpsc::UnboundedSender<Again>,
    ctx: Arc<Ctx>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut waiting = Vec::new();
    let mut store_only = Vec::new();
    let get_bytes = ctx.shared.cfg.store.get_bytes;
    // GETs fetching chunks ahead for the tier.
    let ahead = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    'taking: loop {
        while let Some(path) = &ctx.tier
            && ahead.load(Ordering::Relaxed) < FETCHES_AHEAD
            && let Some(task) = fetch_ahead(&ctx, path, get_bytes, &ahead)
        {
            tasks.spawn(task);
        }
        tokio::select! {
            n = jobs.recv_many(&mut waiting, 4096) => {
                if n == 0 {
                    break;
                }
            }
            Some((job, skip_tier)) = again.recv() => {
                if skip_tier { store_only.push(job) } else { waiting.push(job) }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        }
        let mut store = std::mem::take(&mut store_only);
        let mut groups = Vec::new();
        match &ctx.tier {
            Some(path) => {
                let routed = path.route(std::mem::take(&mut waiting));
                store.extend(routed.store);
                groups = whole_chunks(&ctx.shared.ds, routed.fetch, get_bytes);
                for (c, job) in routed.busy {
                    let (path, again) = (path.clone(), again_tx.clone());
                    tasks.spawn(wait_for_chunk(path, c, job, again, ctx.policy.stall));
                }
            }
            None => store.append(&mut waiting),
        }
        groups.extend(coalesce(store, get_bytes));
        for group in groups {
            // A tier's whole chunks wait for room in its budget first.
            let budget = match &ctx.tier {
                Some(path) if !group.keep.is_empty() => Some(path.fetch_room(group.end - group.start).await),
                _ => None,
            };
            // Places in flight are taken here, in the plan's order: a task
            // taking its own would start in the scheduler's (last spawned
            // first), and the reads needed first would wait behind later ones.
            // One place is waited for; the group's other parts take only
            // places free now. Waiting for a place per part deadlocked once
            // a group had more parts than the limit (2 GETs in flight of
            // 1 MiB parts and a 7 MiB chunk: the bench's sweep).
            let limiter = &ctx.stats.limiter;
            let mut permits = vec![limiter.acquire().await];
            while permits.len() < ctx.parts(&group) {
                match limiter.try_acquire() {
                    Some(p) => permits.push(p),
                    None => break,
                }
            }
            if jobs.is_closed() {
                break 'taking;
            }
            let ctx = ctx.clone();
            tasks.spawn(async move {
                ctx.read(group, permits).await;
                drop(budget);
            });
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// GETs at most fetching chunks ahead for the tier at once: the link is
/// shared with the reader's own GETs, which take their places in order
/// with these, and all the chunks a first fill passed by (a memory's worth
/// at most) are fetched within the epoch.
const FETCHES_AHEAD: usize = 2;

/// One GET of chunks a start's first fill passed by, when the budget has
/// room for it now (never waited for: the reader's own reads come first);
/// it waits for its place among the reader's GETs. None if there is
/// nothing to fetch.
fn fetch_ahead(
    ctx: &Arc<Ctx>,
    path: &TierPath,
    get_bytes: u64,
    ahead: &Arc<std::sync::atomic::AtomicUsize>,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let budget = path.try_fetch_room(get_bytes)?;
    let fetch = path.take_later(get_bytes);
    // One run of neighbours: one group.
    let group = whole_chunks(
        &ctx.shared.ds,
        fetch.into_iter().map(|r| (r, None)).collect(),
        get_bytes,
    )
    .into_iter()
    .next()?;
    ahead.fetch_add(1, Ordering::Relaxed);
    let (ctx, ahead) = (ctx.clone(), ahead.clone());
    Some(async move {
        let place = ctx.stats.limiter.acquire().await;
        ctx.read(group, vec![place]).await;
        drop(budget);
        ahead.fetch_sub(1, Ordering::Relaxed);
    })
}

/// A job whose chunk another process is fetching for the tier: to the disk
/// once the chunk is kept, or to the store if it is not within `stall`
/// (that process may be stuck or gone).
async fn wait_for_chunk(
    path: Arc<TierPath>,
    c: u64,
    job: Job,
    again: tokio::sync::mpsc::UnboundedSender<Again>,
    stall: std::time::Duration,
) {
    path.waited();
    let deadline = tokio::time::Instant::now() + stall;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        if path.tier.is_present(c) {
            path.to_disk(job);
            return;
        }
    }
    let _ = again.send((job, true));
}

/// Chunks taken in for the tier, as groups of whole chunks: neighbours in
/// a segment merged up to `limit` bytes (as [`coalesce`] merges extents),
/// each with the job that asked for it and its reservation.
fn whole_chunks(ds: &Dataset, fetch: Vec<(brand_store::tier::Reservation, Option<Job>)>, limit: u64) -> Vec<Group> {
    let chunk = |(r, _): &(brand_store::tier::Reservation, Option<Job>)| {
        let loc = ds.index.chunk(r.chunk());
        (loc.segment, loc.offset, ds.index.chunk_padded_len(r.chunk()))
    };
    grouped(fetch, chunk, limit, |members| {
        let (keep, jobs): (Vec<_>, Vec<Option<Job>>) = members.into_iter().unzip();
        (jobs.into_iter().flatten().collect(), keep)
    })
}

/// Neighbouring extents of one segment grouped (at most `limit` bytes a
/// group unless one extent is longer), groups in their first job's order:
/// [`group_touching`], which `brand simulate` counts GETs with.
fn coalesce(jobs: Vec<Job>, limit: u64) -> Vec<Group> {
    let extent = |j: &Job| (j.extent.segment, j.extent.offset, j.extent.len);
    grouped(jobs, extent, limit, |jobs| (jobs, Vec::new()))
}

/// `items` grouped by their byte ranges (segment, offset, length) with
/// [`group_touching`], in their first item's order; `split` makes each
/// group's items its jobs and reservations.
fn grouped<T>(
    items: Vec<T>,
    range: impl Fn(&T) -> (u32, u64, u64),
    limit: u64,
    split: impl Fn(Vec<T>) -> (Vec<Job>, Vec<brand_store::tier::Reservation>),
) -> Vec<Group> {
    let ranges: Vec<(u32, u64, u64)> = items.iter().map(range).collect();
    let mut items: Vec<Option<T>> = items.into_iter().map(Some).collect();
    group_touching(&ranges, limit)
        .into_iter()
        .map(|g| {
            // Each index is in exactly one group: every take finds its item.
            let members = g
                .members
                .iter()
                .filter_map(|&i| items.get_mut(i).and_then(Option::take))
                .collect();
            let (jobs, keep) = split(members);
            Group {
                segment: g.segment,
                start: g.start,
                end: g.end,
                jobs,
                keep,
            }
        })
        .collect()
}

impl Group {
    /// Each job's completion: the fetch's error.
    fn failed(self, e: &Error) -> Vec<Completion> {
        self.jobs
            .into_iter()
            .map(|job| Completion {
                tag: job.tag,
                extent: job.extent,
                result: Err(e.duplicate()),
            })
            .collect()
    }
}

impl Ctx {
    /// GETs the group is fetched in.
    fn parts(&self, g: &Group) -> usize {
        get_parts(g.end - g.start, self.shared.cfg.store.get_bytes) as usize
    }

    /// Fetches the group and hands its records on. A record that fails its
    /// check (crc32c, zstd) is fetched once more before it is an error: a
    /// byte damaged on its way here is not the object's, and one bad byte on
    /// the network should not end a run. Damaged again, it is the object's.
    /// Only the damaged reads are fetched again (the span from the first to
    /// the last of them), not the whole group: one bad byte in an 8 MiB GET
    /// costs its read's bytes, not 8 MiB more.
    async fn read(self: Arc<Self>, mut group: Group, permits: Vec<Permit>) {
        let places = permits.len();
        let mut permits = Some(permits);
        for last in [false, true] {
            let len = (group.end - group.start) as usize;
            let mut buf = AlignedBuf::for_extent(len);
            self.shared.stats.pool_grew(buf.capacity() as u64);
            let fetched = self.fetch(&group, &mut buf.spare_mut()[..len], places).await;
            drop(permits.take());
            let segment = group.segment;
            let this = self.clone();
            // Decoding (crc32c, zstd) is CPU work: off the runtime's threads.
            let decoded = tokio::task::spawn_blocking(move || {
                let cap = buf.capacity() as u64;
                let completions = match fetched {
                    Ok(()) => {
                        buf.set_len(len);
                        let group = this.settle(group, Some(buf.as_slice()));
                        this.decode(group, buf)
                    }
                    Err(e) => this.settle(group, None).failed(&e),
                };
                this.shared.stats.pool_shrank(cap);
                this.hand_on(segment, completions, last)
            })
            .await;
            match decoded {
                Ok(Some(damaged)) => {
                    self.stats.counters.retried("crc");
                    group = damaged;
                }
                Ok(None) => return,
                Err(e) => {
                    let ds = self.shared.ds.dir().display();
                    tracing::error!("{ds}: decoding a GET's records failed: {e}");
                    return;
                }
            }
        }
    }

    /// The group's chunks fetched for the tier kept (from `fetched`, its
    /// bytes; none if the fetch failed), and the jobs that waited on them
    /// joined to it: they are decoded from the same bytes (or fail with it).
    fn settle(&self, mut g: Group, fetched: Option<&[u8]>) -> Group {
        let Some(path) = &self.tier else { return g };
        for r in std::mem::take(&mut g.keep) {
            let c = r.chunk();
            if let Some(bytes) = fetched {
                let at = (self.shared.ds.index.chunk(c).offset - g.start) as usize;
                let len = self.shared.ds.index.chunk_padded_len(c) as usize;
                if let Some(chunk) = bytes.get(at..at + len) {
                    path.keep(r, chunk);
                }
            }
            g.jobs.extend(path.waiting_on(c));
        }
        g
    }

    /// Sends a `segment` group's completions on, but for those with a
    /// damaged record when this was not the `last` fetch: those are
    /// returned as the group to fetch again.
    fn hand_on(&self, segment: u32, completions: Vec<Completion>, last: bool) -> Option<Group> {
        let (on, again) = if last {
            (completions, None)
        } else {
            split_damaged(segment, completions)
        };
        for c in on {
            if self.shared.done.send(c).is_err() {
                break;
            }
        }
        again
    }

    /// The group's bytes into `dst`: one GET, or `get_bytes` parts, `places` at once.
    async fn fetch(&self, g: &Group, dst: &mut [u8], places: usize) -> Result<()> {
        use futures_util::StreamExt;
        let ds = &self.shared.ds;
        let name = &ds.manifest.segments[g.segment as usize].name;
        let e_tag = match &ds.origin {
            Origin::Objects(v) => v.get(g.segment as usize).and_then(|v| v.e_tag.as_deref()),
            Origin::Dir => None,
        };
        let part = self.shared.cfg.store.get_bytes.max(brand_format::ALIGN) as usize;
        let (c, p, l) = (&self.stats.counters, &self.policy, &self.stats.limiter);
        let mut parts = Vec::new();
        for (i, d) in dst.chunks_mut(part).enumerate() {
            let from = g.start + (i * part) as u64;
            let range = from..from + d.len() as u64;
            parts.push(get::get_into(&self.conn, name, range, e_tag, d, p, c, l));
        }
        // As many parts at once as places the group holds.
        let mut fetched = futures_util::stream::iter(parts).buffer_unordered(places.max(1));
        while let Some(r) = fetched.next().await {
            r?;
        }
        Ok(())
    }

    /// Each job's records from the group's buffer.
    fn decode(&self, g: Group, buf: AlignedBuf) -> Vec<Completion> {
        let ds: &Dataset = &self.shared.ds;
        let verify = self.shared.cfg.verify;
        if let [job] = &g.jobs[..]
            && reads_in_place(ds, &job.extent)
            && job.extent.offset == g.start
        {
            let job = g.jobs.into_iter().next().map(|j| (j.tag, j.extent));
            return job
                .map(|(tag, extent)| {
                    let records = ds.decode_extent(&extent, ExtentBytes::Owned(buf), verify);
                    Completion {
                        tag,
                        extent,
                        result: Ok(records),
                    }
                })
                .into_iter()
                .collect();
        }
        g.jobs
            .into_iter()
            .map(|job| {
                let at = (job.extent.offset - g.start) as usize;
                let bytes = &buf.as_slice()[at..at + job.extent.len as usize];
                let records = ds.decode_extent(&job.extent, ExtentBytes::Borrowed(bytes), verify);
                Completion {
                    tag: job.tag,
                    extent: job.extent,
                    result: Ok(records),
                }
            })
            .collect()
    }
}

/// A `segment` group's completions split into those to send on and the
/// group of the damaged reads, spanning the first to the last of them.
fn split_damaged(segment: u32, completions: Vec<Completion>) -> (Vec<Completion>, Option<Group>) {
    let (again, on): (Vec<Completion>, Vec<Completion>) = completions.into_iter().partition(|c| damaged(c).is_some());
    let Some(first) = again.first().and_then(damaged) else {
        return (on, None);
    };
    tracing::warn!("{first}: fetching its bytes again");
    let start = again.iter().map(|c| c.extent.offset).min().unwrap_or(0);
    let end = again
        .iter()
        .map(|c| c.extent.offset + c.extent.len)
        .max()
        .unwrap_or(start);
    let jobs = again.into_iter().map(|c| Job::new(c.tag, c.extent)).collect();
    (
        on,
        Some(Group {
            segment,
            start,
            end,
            jobs,
            keep: Vec::new(),
        }),
    )
}

/// A read's first record error, if one is damaged bytes (an error of the
/// whole GET is the store's, already retried).
fn damaged(c: &Completion) -> Option<&Error> {
    c.result
        .as_ref()
        .ok()?
        .iter()
        .find_map(|(_, r)| r.as_ref().err().filter(|e| matches!(e, Error::Corrupt { .. })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brand_format::extents::{Extent, Records};

    fn job(tag: u64, segment: u32, offset: u64, len: u64) -> Job {
        Job {
            tag,
            extent: Extent {
                segment,
                offset,
                len,
                records: Records::new(),
            },
            first_fill: false,
        }
    }

    fn shape(groups: &[Group]) -> Vec<(u32, u64, u64, Vec<u64>)> {
        groups
            .iter()
            .map(|g| (g.segment, g.start, g.end, g.jobs.iter().map(|j| j.tag).collect()))
            .collect()
    }

    #[test]
    fn neighbours_in_a_segment_coalesce_up_to_the_limit_in_arrival_order() {
        let mb = 1 << 20;
        let jobs = vec![
            job(0, 1, 10 * mb, mb),
            job(1, 0, 0, 4 * mb),
            job(2, 0, 4 * mb, 4 * mb),
            job(3, 0, 8 * mb, 4 * mb), // would pass 8 MiB: a new group
            job(4, 1, 0, mb),
            job(5, 1, mb, mb),            // touching: merged
            job(6, 1, 2 * mb + 4096, mb), // a gap: its own
        ];
        let g = coalesce(jobs, 8 * mb);
        assert_eq!(
            shape(&g),
            vec![
                (1, 10 * mb, 11 * mb, vec![0]),
                (0, 0, 8 * mb, vec![1, 2]),
                (0, 8 * mb, 12 * mb, vec![3]),
                (1, 0, 2 * mb, vec![4, 5]),
                (1, 2 * mb + 4096, 3 * mb + 4096, vec![6]),
            ]
        );
    }

    fn completion(tag: u64, offset: u64, len: u64, damaged: bool) -> Completion {
        let record = if damaged {
            Err(Error::Corrupt {
                segment: "data-00000.brd".into(),
                chunk: tag,
                offset,
                sample: tag,
                what: "crc32c mismatch".into(),
            })
        } else {
            Ok(AlignedBuf::for_extent(4096))
        };
        Completion {
            tag,
            extent: job(tag, 0, offset, len).extent,
            result: Ok(vec![(tag, record)]),
        }
    }

    #[test]
    fn only_the_damaged_reads_of_a_group_are_fetched_again() {
        let kb = 1 << 10;
        // A group of 0..4 MiB, four reads of 1 MiB: the second and third damaged.
        let done: Vec<Completion> = (0..4)
            .map(|i| completion(i, i * 1024 * kb, 1024 * kb, i == 1 || i == 2))
            .collect();
        let (on, again) = split_damaged(3, done);
        assert_eq!(on.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![0, 3]);
        let again = again.expect("a group to fetch again");
        assert_eq!(shape(&[again]), vec![(3, 1024 * kb, 3 * 1024 * kb, vec![1, 2])]);
        // Nothing damaged: everything goes on.
        let (on, again) = split_damaged(0, (0..2).map(|i| completion(i, i * kb, kb, false)).collect());
        assert_eq!(on.len(), 2);
        assert!(again.is_none());
    }

    #[test]
    fn overlapping_extents_are_not_merged() {
        let g = coalesce(vec![job(0, 0, 0, 8192), job(1, 0, 4096, 8192)], 1 << 30);
        assert_eq!(g.len(), 2);
    }
}
