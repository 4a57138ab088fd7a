//! The cache's shared state: which samples are in memory, being read or
//! bad, which jobs need each one and which hold it in a live batch, the
//! byte budget (the arena and the room promised to reads in flight), and
//! the decisions made on it: what a read may take (admission), what leaves
//! memory for room (eviction), what a job is served.
//!
//! A sample is *needed* by each attached job that has not served it in its
//! current epoch.
//!
//! What is served: a job takes, uniformly at random with its own seed, any
//! sample in memory it has not served this epoch ("substitutable", as
//! Quiver says, and "whatever is available", as Brand does).
//! What stays: a sample needed by no job stays until its room is wanted;
//! when the budget is full and a job waits, the cache drops samples that no
//! waiting job needs, fewest needers first: what only a laggard (a job not
//! asking) still needs goes, and that job reads it again later (counted in
//! `dropped_needed`). Samples in a job's live batch are never dropped.

use std::collections::HashMap;

use serde::Serialize;

use brand_format::ids::IdBits;
use brand_format::index::Index;
use brand_format::rng::Prng;
use brand_io::engine::Completion;

use crate::arena::{Arena, footprint};
use crate::cursor::Fill;
use crate::shm::Mapping;
use crate::wire::{Hello, Placed, ToJob};

/// What the cache did, for its report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CacheReport {
    pub memory_bytes: u64,
    /// The fill plan's run length (records per run).
    pub run_length: u32,
    pub jobs_attached: u64,
    pub jobs_now: u64,
    pub jobs_refused: u64,
    /// Bytes the device delivered, and the records they held.
    pub bytes_read: u64,
    pub samples_read: u64,
    pub reads_issued: u64,
    /// Samples handed to jobs (a sample to two jobs counts twice).
    pub samples_served: u64,
    /// Samples dropped while some job still needed them (the laggard
    /// policy's cost: each is read again for that job).
    pub dropped_needed: u64,
    /// Samples dropped that no job needed any more.
    pub dropped_idle: u64,
    /// Corrupt records read (with `on_corrupt = "skip"` each is left out
    /// of the epoch of every job that needed it).
    pub corrupt_records: u64,
    /// Turns of the fill's plan begun (plan epochs).
    pub fill_epochs: u64,
    pub peak_used_bytes: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Where {
    Absent,
    /// Being read.
    Pending,
    Resident(u64),
    /// Its read failed (the error is in `State::bad`).
    Bad,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Where,
    /// Attached jobs that have not served it this epoch.
    need: u32,
    /// Samples of live batches (every job's).
    leases: u32,
    /// Index in `State::present` while resident or bad.
    slot: u32,
}

struct Job {
    epoch: u64,
    served: IdBits,
    rng: Prng,
    seed: u64,
    batch_size: usize,
    waiting: bool,
    leases: HashMap<u32, u32>,
    /// Bytes of its live batches, and how many.
    held_bytes: u64,
    live_batches: u32,
}

impl Job {
    fn has_served(&self, id: u32) -> bool {
        self.served.contains(id as u64)
    }
}

/// A record whose read failed: why, and whether it is the record itself
/// (corrupt: `on_corrupt` applies) or its read (an I/O error).
struct Bad {
    why: String,
    corrupt: bool,
}

/// What the cache holds and who needs and holds what; one, under the
/// mutex every thread of the cache shares.
pub(crate) struct State {
    samples: Vec<Sample>,
    /// Samples resident or bad, for serving.
    present: Vec<u32>,
    bad: HashMap<u32, Bad>,
    /// Samples not in memory that some job needs.
    wanted: u64,
    skip_corrupt: bool,
    arena: Arena,
    /// Room promised to reads in flight.
    reserved: u64,
    jobs: HashMap<u64, Job>,
    next_job: u64,
    /// The reader failed: every job gets this.
    pub(crate) failed: Option<String>,
    /// The cache stops: every job gets this.
    pub(crate) stopping: Option<String>,
    /// Reads or releases since start: a waiting job's sign of progress.
    pub(crate) progress: u64,
    pub(crate) report: CacheReport,
}

/// What a job that asks for a batch gets now.
pub(crate) enum Draw {
    /// Its batch: the samples are leased to it until it releases them.
    Served(ToJob),
    /// The error it fails with: the cache stops or its reads failed, or a
    /// sample drawn is bad (and not skipped).
    Failed(String),
    /// Memory holds less than its batch: it waits for the fill. `began`:
    /// it was not waiting before (now its needs come first, see
    /// [`State::room_for`]).
    Waits { began: bool },
    /// It is detached.
    Gone,
}

/// About what a batch of `size` samples takes in the shared memory.
pub(crate) fn batch_bytes(index: &Index, size: u64) -> u64 {
    let n = index.samples();
    let mean = index.raw_lens().map(|l| footprint(l as u64)).sum::<u64>() / n.max(1);
    size.min(n).saturating_mul(mean)
}

/// A batch's samples and the corrupt records it skips.
type Picked = (Vec<u32>, Vec<u32>);

/// The job's next batch, drawn at random from the samples in memory it has
/// not served, and the corrupt records it skips (with `skip`, every one in
/// memory it has not served): `None` while fewer than a batch (or the
/// epoch's rest) are there and none is skipped; an error if a drawn sample
/// is bad and not skipped.
fn pick(
    job: &mut Job,
    samples: &[Sample],
    present: &[u32],
    bad: &HashMap<u32, Bad>,
    skip: bool,
) -> std::result::Result<Option<Picked>, String> {
    let n = samples.len() as u64;
    let (skipped, mut open): (Vec<u32>, Vec<u32>) = present
        .iter()
        .copied()
        .filter(|&i| !job.has_served(i))
        .partition(|i| skip && bad.get(i).is_some_and(|b| b.corrupt));
    let rest = n - job.served.len() - skipped.len() as u64;
    let want = (job.batch_size as u64).min(rest) as usize;
    if open.len() < want {
        return Ok((!skipped.is_empty()).then_some((Vec::new(), skipped)));
    }
    for k in 0..want {
        let j = k + job.rng.below((open.len() - k) as u64) as usize;
        open.swap(k, j);
    }
    open.truncate(want);
    if let Some(b) = open.iter().find_map(|i| bad.get(i)) {
        return Err(b.why.clone());
    }
    Ok(Some((open, skipped)))
}

impl State {
    /// Nothing in memory and no job attached: `samples` samples, a budget
    /// of `bytes`; `run_length` is the fill plan's, for the report.
    pub(crate) fn new(samples: usize, bytes: u64, skip_corrupt: bool, run_length: u32) -> Self {
        State {
            samples: vec![
                Sample {
                    at: Where::Absent,
                    need: 0,
                    leases: 0,
                    slot: 0,
                };
                samples
            ],
            present: Vec::new(),
            bad: HashMap::new(),
            wanted: 0,
            skip_corrupt,
            arena: Arena::new(bytes),
            reserved: 0,
            jobs: HashMap::new(),
            next_job: 1,
            failed: None,
            stopping: None,
            progress: 0,
            report: CacheReport {
                memory_bytes: bytes,
                run_length,
                fill_epochs: 1,
                ..CacheReport::default()
            },
        }
    }

    /// One more job needs `id`.
    fn need_more(&mut self, id: u32) {
        let s = &mut self.samples[id as usize];
        s.need += 1;
        if s.at == Where::Absent && s.need == 1 {
            self.wanted += 1;
        }
    }

    fn need_less(&mut self, id: u32) {
        let s = &mut self.samples[id as usize];
        s.need -= 1;
        if s.at == Where::Absent && s.need == 0 {
            self.wanted -= 1;
        }
    }

    /// Attaches the job `h` introduced, which served `served`: its id.
    pub(crate) fn attach_job(&mut self, h: &Hello, served: IdBits) -> u64 {
        let id = self.next_job;
        self.next_job += 1;
        self.add_job(id, h, served);
        self.report.jobs_attached += 1;
        id
    }

    pub(crate) fn jobs_now(&self) -> u64 {
        self.jobs.len() as u64
    }

    /// Some job waits for a batch.
    pub(crate) fn any_waiting(&self) -> bool {
        self.jobs.values().any(|j| j.waiting)
    }

    /// The shared memory's bytes for samples.
    pub(crate) fn memory_size(&self) -> u64 {
        self.arena.size()
    }

    /// Attaches job `id`, which `h` introduced and which served `served`.
    fn add_job(&mut self, id: u64, h: &Hello, served: IdBits) {
        let n = self.samples.len();
        let mut job = Job {
            epoch: h.epoch,
            served,
            rng: Prng::stream(h.seed, &[0xcac4e, h.epoch]),
            seed: h.seed,
            batch_size: h.batch_size.max(1) as usize,
            waiting: false,
            leases: HashMap::new(),
            held_bytes: 0,
            live_batches: 0,
        };
        if job.served.len() == n as u64 {
            // Saved after the epoch's last sample: the next one starts.
            job.served.clear();
            job.epoch += 1;
            job.rng = Prng::stream(h.seed, &[0xcac4e, job.epoch]);
        }
        for i in 0..n as u32 {
            if !job.has_served(i) {
                self.need_more(i);
            }
        }
        self.jobs.insert(id, job);
    }

    /// The job is gone: what it still needed and held is let go.
    pub(crate) fn remove_job(&mut self, id: u64) {
        let Some(job) = self.jobs.remove(&id) else {
            return;
        };
        for i in 0..self.samples.len() as u32 {
            if !job.has_served(i) {
                self.need_less(i);
            }
        }
        for (i, k) in job.leases {
            self.samples[i as usize].leases -= k;
        }
        self.progress += 1;
    }

    /// The job let go of these samples (one batch). Every one must be
    /// held by the job (else nothing is let go, and the error names the
    /// first that is not): a job releases only what it was handed.
    pub(crate) fn release(&mut self, index: &Index, id: u64, ids: &[u32]) -> std::result::Result<(), String> {
        let Some(job) = self.jobs.get_mut(&id) else {
            return Ok(());
        };
        let mut count: HashMap<u32, u32> = HashMap::new();
        for &i in ids {
            let k = count.entry(i).or_insert(0);
            *k += 1;
            if job.leases.get(&i).copied().unwrap_or(0) < *k {
                return Err(format!(
                    "the job sent a release of sample {i}, which it does not hold{}",
                    if *k > 1 { " that many times" } else { "" }
                ));
            }
        }
        for &i in ids {
            if let Some(k) = job.leases.get_mut(&i) {
                *k -= 1;
                if *k == 0 {
                    job.leases.remove(&i);
                }
                self.samples[i as usize].leases -= 1;
                job.held_bytes = job.held_bytes.saturating_sub(footprint(index.raw_len(i as u64) as u64));
            }
        }
        job.live_batches = job.live_batches.saturating_sub(1);
        self.progress += 1;
        Ok(())
    }

    /// Job `id` asks for its next batch: drawn from memory if there is one
    /// (see [`pick`]); else the job is marked waiting.
    pub(crate) fn draw(&mut self, index: &Index, id: u64) -> Draw {
        if let Some(why) = self.stopping.clone().or_else(|| self.failed.clone()) {
            return Draw::Failed(why);
        }
        let State {
            jobs,
            samples,
            present,
            bad,
            skip_corrupt,
            ..
        } = self;
        let Some(job) = jobs.get_mut(&id) else {
            return Draw::Gone;
        };
        match pick(job, samples, present, bad, *skip_corrupt) {
            Ok(Some((ids, skipped))) => {
                job.waiting = false;
                return Draw::Served(self.serve(index, id, &ids, &skipped));
            }
            Ok(None) => {}
            Err(why) => return Draw::Failed(why),
        }
        let began = !job.waiting;
        job.waiting = true;
        Draw::Waits { began }
    }

    /// Hands `ids` (in memory, unserved by the job) to job `id`, and marks
    /// `skipped` (corrupt, left out) served for it.
    fn serve(&mut self, index: &Index, id: u64, ids: &[u32], skipped: &[u32]) -> ToJob {
        let mut placed = Vec::with_capacity(ids.len());
        for &i in ids {
            let Where::Resident(offset) = self.samples[i as usize].at else {
                continue;
            };
            placed.push(Placed {
                id: i,
                offset,
                len: index.raw_len(i as u64),
            });
            self.samples[i as usize].leases += 1;
            self.need_less(i);
        }
        for &i in skipped {
            self.need_less(i);
        }
        let n = self.samples.len() as u64;
        let Some(job) = self.jobs.get_mut(&id) else {
            return ToJob::Failed("internal: job gone while served".into());
        };
        let epoch = job.epoch;
        for p in &placed {
            job.served.insert(p.id as u64);
            *job.leases.entry(p.id).or_insert(0) += 1;
            job.held_bytes += footprint(p.len as u64);
        }
        for &i in skipped {
            job.served.insert(i as u64);
        }
        if !placed.is_empty() {
            job.live_batches += 1;
        }
        self.report.samples_served += placed.len() as u64;
        if job.served.len() == n {
            // The job's next epoch starts now: it needs every sample again.
            job.epoch += 1;
            job.served.clear();
            job.rng = Prng::stream(job.seed, &[0xcac4e, job.epoch]);
            for i in 0..n as u32 {
                self.need_more(i);
            }
        }
        ToJob::Batch {
            epoch,
            samples: placed,
            skipped: skipped.to_vec(),
        }
    }

    pub(crate) fn leased_bytes(&self, index: &Index) -> u64 {
        self.present
            .iter()
            .filter(|&&i| self.samples[i as usize].leases > 0)
            .map(|&i| footprint(index.raw_len(i as u64) as u64))
            .sum()
    }

    /// Every job waits for a batch, and the memory their batches leave
    /// cannot hold the next batch of any of them: nobody can go on until
    /// one lets go, and each waits instead.
    pub(crate) fn deadlocked(&self, index: &Index) -> bool {
        if self.jobs.is_empty() || !self.jobs.values().all(|j| j.waiting) {
            return false;
        }
        let room = self.arena.size().saturating_sub(self.leased_bytes(index));
        let n = self.samples.len() as u64;
        self.jobs.values().all(|j| {
            let want = (j.batch_size as u64).min(n - j.served.len());
            batch_bytes(index, want) > room
        })
    }

    /// Why every job waits for ever: the message a deadlock fails them with.
    pub(crate) fn deadlock(&self, index: &Index) -> String {
        let held: u64 = self.jobs.values().map(|j| j.held_bytes).sum();
        let batches: u32 = self.jobs.values().map(|j| j.live_batches).sum();
        let most = self.jobs.values().map(|j| j.live_batches).max().unwrap_or(0);
        let need: u64 = self
            .jobs
            .values()
            .map(|j| (j.live_batches as u64 + 1) * batch_bytes(index, j.batch_size as u64))
            .sum();
        format!(
            "the jobs attached to the cache ({}) hold {batches} batches ({held} bytes, up to {most} per job) and each waits for another: the cache's memory ({} bytes) cannot take what they lack. {} such jobs need about {need} bytes (what they hold and one batch more): start the cache with more --memory, use a smaller batch_size or keep fewer batches",
            self.jobs.len(),
            self.arena.size(),
            self.jobs.len()
        )
    }

    /// `id` leaves memory (or its pending read is given up): jobs that need
    /// it will have it read again.
    fn make_absent(&mut self, index: &Index, id: u32) {
        let s = self.samples[id as usize];
        if let Where::Resident(at) = s.at {
            self.arena.free(at, index.raw_len(id as u64) as u64);
        }
        if matches!(s.at, Where::Resident(_) | Where::Bad) {
            let slot = s.slot as usize;
            self.present.swap_remove(slot);
            if let Some(&moved) = self.present.get(slot) {
                self.samples[moved as usize].slot = slot as u32;
            }
            self.bad.remove(&id);
        }
        self.samples[id as usize].at = Where::Absent;
        if s.need > 0 {
            self.wanted += 1;
        }
    }

    fn make_present(&mut self, id: u32, at: Where) {
        self.samples[id as usize].at = at;
        self.samples[id as usize].slot = self.present.len() as u32;
        self.present.push(id);
    }

    /// Records of `chunk` in `mask` that some job needs and memory lacks.
    fn lacking(&self, index: &Index, chunk: u64, mask: u64) -> u64 {
        let first = chunk * index.chunk_size() as u64;
        let mut m = mask;
        let mut lacking = 0;
        while m != 0 {
            let r = m.trailing_zeros();
            m &= m - 1;
            let s = &self.samples[(first + r as u64) as usize];
            if s.at == Where::Absent && s.need > 0 {
                lacking |= 1 << r;
            }
        }
        lacking
    }

    /// The next read of the fill's plan with records some job lacks (planned
    /// reads none lacks are passed over): the chunk and those records; the
    /// cursor stays on it until it is read whole. `None` if no job lacks
    /// anything.
    pub(crate) fn choose(&mut self, index: &Index, fill: &mut Fill) -> Option<(u64, u64)> {
        if self.wanted == 0 {
            return None;
        }
        // A plan epoch reads every sample, each read at least one record:
        // within 2 N steps every lacking sample is passed.
        for _ in 0..2 * self.samples.len() + 2 {
            let ((chunk, mask), turned) = fill.current();
            if turned {
                self.report.fill_epochs += 1;
            }
            let lacking = self.lacking(index, chunk, mask);
            if lacking != 0 {
                return Some((chunk, lacking));
            }
            fill.advance();
        }
        None
    }

    /// Frees room for `bytes` more: first samples no job needs; when `force`
    /// (a job waits), then samples no waiting job needs, fewest needers
    /// first, then the rest. Never a sample of a live batch. False if the
    /// room cannot be made.
    fn make_room(&mut self, index: &Index, bytes: u64, force: bool) -> bool {
        if self.free() >= bytes {
            return true;
        }
        for (_, need, i) in self.victims(force) {
            if self.free() >= bytes {
                break;
            }
            self.drop_sample(index, i, need);
        }
        self.free() >= bytes
    }

    fn free(&self) -> u64 {
        self.arena.available().saturating_sub(self.reserved)
    }

    /// The records of `mask` (of `chunk`) to read now: all of them if room
    /// can be made; when `force` and it cannot, the first that fit (so a
    /// waiting job gets what little room is left, rather than nothing).
    pub(crate) fn room_for(&mut self, index: &Index, chunk: u64, mask: u64, force: bool) -> Option<u64> {
        let first = chunk * index.chunk_size() as u64;
        let size = |r: u32| footprint(index.raw_len(first + r as u64) as u64);
        let mut bytes = 0;
        let mut m = mask;
        while m != 0 {
            bytes += size(m.trailing_zeros());
            m &= m - 1;
        }
        if self.make_room(index, bytes, force) {
            return Some(mask);
        }
        if !force {
            return None;
        }
        let (mut fit, mut room) = (0u64, self.free());
        let mut m = mask;
        while m != 0 {
            let r = m.trailing_zeros();
            m &= m - 1;
            if size(r) <= room {
                room -= size(r);
                fit |= 1 << r;
            }
        }
        (fit != 0).then_some(fit)
    }

    /// Room for a sample of `len` bytes: its reservation is free in bytes,
    /// but the free bytes may be scattered; then victims go (in
    /// [`make_room`](Self::make_room)'s order) until a region fits.
    fn place(&mut self, index: &Index, len: u64) -> Option<u64> {
        if let Some(at) = self.arena.alloc(len) {
            return Some(at);
        }
        for (_, need, i) in self.victims(true) {
            self.drop_sample(index, i, need);
            if let Some(at) = self.arena.alloc(len) {
                return Some(at);
            }
        }
        None
    }

    /// Samples that may leave memory, in the order they should: (waiting
    /// jobs that need it, jobs that need it, id).
    fn victims(&self, force: bool) -> Vec<(u32, u32, u32)> {
        let waiting: Vec<&Job> = self.jobs.values().filter(|j| j.waiting).collect();
        let mut victims: Vec<(u32, u32, u32)> = self
            .present
            .iter()
            .filter(|&&i| {
                let s = &self.samples[i as usize];
                s.leases == 0 && (force || s.need == 0)
            })
            .map(|&i| {
                let wanted = waiting.iter().filter(|j| !j.has_served(i)).count() as u32;
                (wanted, self.samples[i as usize].need, i)
            })
            .collect();
        victims.sort_unstable();
        victims
    }

    fn drop_sample(&mut self, index: &Index, i: u32, need: u32) {
        if need > 0 {
            self.report.dropped_needed += 1;
        } else {
            self.report.dropped_idle += 1;
        }
        self.make_absent(index, i);
    }

    /// Marks the records of `chunk` in `mask` as being read.
    pub(crate) fn reading(&mut self, index: &Index, chunk: u64, mask: u64) -> u64 {
        let first = chunk * index.chunk_size() as u64;
        let mut bytes = 0;
        for r in 0..64 {
            if mask >> r & 1 == 0 {
                continue;
            }
            let id = (first + r) as u32;
            if self.samples[id as usize].need > 0 {
                self.wanted -= 1;
            }
            self.samples[id as usize].at = Where::Pending;
            bytes += footprint(index.raw_len(id as u64) as u64);
        }
        self.reserved += bytes;
        bytes
    }

    /// Takes a finished read in: each record into the shared memory (the
    /// samples it was asked for are its extent's records).
    pub(crate) fn accept(&mut self, index: &Index, memory: &Mapping, c: Completion) {
        self.report.bytes_read += c.extent.len;
        self.progress += 1;
        let ids = c.extent.records.iter().map(|&(id, _)| id as u32);
        for id in ids.clone() {
            self.reserved -= footprint(index.raw_len(id as u64) as u64);
        }
        let records = match c.result {
            Ok(r) => r,
            Err(e) => {
                for id in ids {
                    self.make_present(id, Where::Bad);
                    self.bad.insert(
                        id,
                        Bad {
                            why: e.to_string(),
                            corrupt: false,
                        },
                    );
                }
                return;
            }
        };
        for (id, r) in records {
            let id = id as u32;
            self.report.samples_read += 1;
            let bytes = match r {
                Ok(b) => b,
                Err(e) => {
                    self.report.corrupt_records += 1;
                    if self.skip_corrupt {
                        tracing::warn!("skipping a corrupt record for every job: {e}");
                    }
                    self.make_present(id, Where::Bad);
                    self.bad.insert(
                        id,
                        Bad {
                            why: e.to_string(),
                            corrupt: true,
                        },
                    );
                    continue;
                }
            };
            match self.place(index, bytes.len() as u64) {
                // SAFETY: the region was just allocated: no job has been
                // told of it since it was freed.
                Some(at) if unsafe { memory.write(at, &bytes) } => {
                    self.make_present(id, Where::Resident(at));
                }
                Some(at) => {
                    self.arena.free(at, bytes.len() as u64);
                    self.make_absent(index, id);
                }
                // No room (fragmented, or held by batches): read it again later.
                None => self.make_absent(index, id),
            }
        }
        self.report.peak_used_bytes = self.report.peak_used_bytes.max(self.arena.used());
    }
}

#[cfg(test)]
mod tests {
    use brand_format::buffer::AlignedBuf;
    use brand_format::error::Error;
    use brand_format::extents::Extent;
    use brand_format::index::{ChunkLoc, SampleMeta};
    use brand_io::engine::RecordResult;
    use brand_plan::{Layout, Memory, PlanConfig, Planner};

    use super::*;
    use crate::wire::Digest;

    /// Records per chunk.
    const K: u32 = 4;
    /// Every sample's bytes: one slot of memory each.
    const LEN: u32 = 100;
    const SLOT: u64 = 128;

    /// `n` samples of `LEN` bytes, `K` to a chunk, a chunk every 4 KiB.
    fn index(n: u64) -> Index {
        let chunks = (0..n.div_ceil(K as u64))
            .map(|c| ChunkLoc {
                segment: 0,
                record_count: (n - c * K as u64).min(K as u64) as u32,
                offset: c * 4096,
            })
            .collect();
        let samples = (0..n)
            .map(|i| SampleMeta {
                rel_offset: 512 + LEN * (i % K as u64) as u32,
                stored_len: LEN,
                raw_len: LEN,
                crc: 0,
                label: 0,
                key: Vec::new(),
            })
            .collect();
        Index::new(K, 1, chunks, samples).expect("a valid index")
    }

    /// The state of a cache of `index` with `slots` samples' room, and
    /// that room as shared memory.
    fn cache(index: &Index, slots: u64, skip_corrupt: bool) -> (State, Mapping) {
        let bytes = slots * SLOT;
        let (memory, _fd) = Mapping::create(bytes as usize).expect("a memfd");
        (State::new(index.samples() as usize, bytes, skip_corrupt, 1), memory)
    }

    /// A job of batches of `batch_size` that served `served` already.
    fn attach(s: &mut State, batch_size: u32, served: &[u64]) -> u64 {
        let mut ids = IdBits::new(s.samples.len() as u64);
        for &i in served {
            ids.insert(i);
        }
        let hello = Hello {
            digest: Digest {
                samples: 0,
                chunk_size: 0,
                content: 0,
                pack_seed: 0,
            },
            seed: 7,
            batch_size,
            epoch: 0,
            served: Vec::new(),
        };
        s.attach_job(&hello, ids)
    }

    /// A finished read of `ids` (with their outcomes).
    fn read(ids: &[u32], result: brand_format::error::Result<Vec<(u64, RecordResult)>>) -> Completion {
        Completion {
            tag: 0,
            extent: Extent {
                segment: 0,
                offset: 0,
                len: 4096,
                records: ids.iter().map(|&i| (i as u64, 0)).collect(),
            },
            result,
        }
    }

    fn mask_ids(index: &Index, chunk: u64, mask: u64) -> Vec<u32> {
        let first = chunk * index.chunk_size() as u64;
        (0..64)
            .filter(|r| mask >> r & 1 == 1)
            .map(|r| (first + r) as u32)
            .collect()
    }

    /// The fill reads the records of `mask` (of `chunk`) and they arrive whole.
    fn fill(s: &mut State, index: &Index, memory: &Mapping, chunk: u64, mask: u64) {
        s.reading(index, chunk, mask);
        let ids = mask_ids(index, chunk, mask);
        let records = ids
            .iter()
            .map(|&i| (i as u64, Ok(AlignedBuf::for_sample(LEN as usize))))
            .collect();
        s.accept(index, memory, read(&ids, Ok(records)));
    }

    fn resident(s: &State, id: u32) -> bool {
        matches!(s.samples[id as usize].at, Where::Resident(_))
    }

    /// The ids of a batch served, sorted.
    fn served(d: Draw) -> Vec<u32> {
        match d {
            Draw::Served(ToJob::Batch { samples, .. }) => {
                let mut ids: Vec<u32> = samples.iter().map(|p| p.id).collect();
                ids.sort_unstable();
                ids
            }
            _ => panic!("expected a batch"),
        }
    }

    fn failed(d: Draw) -> String {
        match d {
            Draw::Failed(why) => why,
            _ => panic!("expected an error"),
        }
    }

    #[test]
    fn a_read_is_admitted_within_the_budget_counting_reads_in_flight() {
        let index = index(12);
        let (mut s, memory) = cache(&index, 6, false);
        attach(&mut s, 4, &[]);
        assert_eq!(s.room_for(&index, 0, 0b1111, false), Some(0b1111), "4 of 6 slots");
        assert_eq!(s.reading(&index, 0, 0b1111), 4 * SLOT);
        assert_eq!(
            (s.free(), s.arena.used()),
            (2 * SLOT, 0),
            "in flight: reserved, not yet placed"
        );
        assert_eq!(s.room_for(&index, 1, 0b1111, false), None, "2 slots left for 4 records");
        assert_eq!(
            s.room_for(&index, 1, 0b1111, true),
            Some(0b0011),
            "a waiting job gets the records that fit"
        );
        let records = (0..4).map(|i| (i, Ok(AlignedBuf::for_sample(LEN as usize)))).collect();
        s.accept(&index, &memory, read(&[0, 1, 2, 3], Ok(records)));
        assert_eq!((s.reserved, s.arena.used(), s.free()), (0, 4 * SLOT, 2 * SLOT));
        assert!((0..4).all(|i| resident(&s, i)));
        assert_eq!((s.report.samples_read, s.report.peak_used_bytes), (4, 4 * SLOT));
        // Everything in memory is needed by the job: nothing goes for a read
        // unless a job waits.
        assert_eq!(s.room_for(&index, 1, 0b1111, false), None);
        assert_eq!((s.report.dropped_needed, s.report.dropped_idle), (0, 0));
        assert!((0..4).all(|i| resident(&s, i)));
    }

    #[test]
    fn room_goes_first_from_samples_no_job_needs_then_from_what_only_laggards_need() {
        let index = index(8);
        let (mut s, memory) = cache(&index, 4, false);
        // Needers: sample 0 none, 1 only a, 2 only b, 3 both.
        let a = attach(&mut s, 4, &[0, 2]);
        attach(&mut s, 4, &[0, 1]);
        fill(&mut s, &index, &memory, 0, 0b1111);
        let needs: Vec<u32> = (0..4).map(|i| s.samples[i].need).collect();
        assert_eq!(needs, [0, 1, 1, 2]);

        assert_eq!(s.room_for(&index, 1, 0b0001, false), Some(0b0001));
        assert!(
            !resident(&s, 0) && (1..4).all(|i| resident(&s, i)),
            "the idle sample went"
        );
        assert_eq!((s.report.dropped_idle, s.report.dropped_needed), (1, 0));
        let records = vec![(4, Ok(AlignedBuf::for_sample(LEN as usize)))];
        s.reading(&index, 1, 0b0001);
        s.accept(&index, &memory, read(&[4], Ok(records)));

        // a waits (1, 3 and 4 are fewer than its batch); b does not ask.
        assert!(matches!(s.draw(&index, a), Draw::Waits { began: true }));
        assert!(matches!(s.draw(&index, a), Draw::Waits { began: false }));
        assert_eq!(s.room_for(&index, 1, 0b0010, false), None, "no sample is idle");
        assert_eq!(s.room_for(&index, 1, 0b0010, true), Some(0b0010));
        assert!(
            !resident(&s, 2) && [1, 3, 4].iter().all(|&i| resident(&s, i)),
            "the sample only the laggard needs went, not one the waiting job needs"
        );
        assert_eq!((s.report.dropped_idle, s.report.dropped_needed), (1, 1));
        assert_eq!(
            s.lacking(&index, 0, 0b1111),
            0b0100,
            "the laggard's sample is read again"
        );
    }

    #[test]
    fn a_sample_in_a_live_batch_stays_until_released_then_its_room_is_free_again() {
        let index = index(8);
        let (mut s, memory) = cache(&index, 4, false);
        let job = attach(&mut s, 4, &[]);
        fill(&mut s, &index, &memory, 0, 0b1111);
        let progress = s.progress;
        let batch = served(s.draw(&index, job));
        assert_eq!(batch, [0, 1, 2, 3]);
        assert_eq!(s.report.samples_served, 4);
        assert_eq!((s.jobs[&job].held_bytes, s.jobs[&job].live_batches), (4 * SLOT, 1));
        assert_eq!(s.leased_bytes(&index), 4 * SLOT);

        assert!(matches!(s.draw(&index, job), Draw::Waits { began: true }));
        assert!(s.victims(true).is_empty());
        assert_eq!(s.room_for(&index, 1, 0b0001, true), None, "every slot is leased");
        assert_eq!(s.place(&index, LEN as u64), None);
        assert!((0..4).all(|i| resident(&s, i)));
        assert_eq!((s.report.dropped_idle, s.report.dropped_needed), (0, 0));

        s.release(&index, job, &batch).expect("the job holds them");
        assert!(s.progress > progress, "a release is progress for a waiting job");
        assert_eq!(
            (
                s.jobs[&job].held_bytes,
                s.jobs[&job].live_batches,
                s.leased_bytes(&index)
            ),
            (0, 0, 0)
        );
        assert!((0..4).all(|i| s.samples[i].leases == 0));
        assert_eq!(
            s.room_for(&index, 1, 0b1111, false),
            Some(0b1111),
            "served samples are idle"
        );
        assert_eq!(s.report.dropped_idle, 4);
    }

    #[test]
    fn a_release_of_samples_the_job_does_not_hold_is_refused_and_lets_nothing_go() {
        let index = index(8);
        let (mut s, memory) = cache(&index, 8, false);
        let job = attach(&mut s, 2, &[]);
        let other = attach(&mut s, 2, &[]);
        fill(&mut s, &index, &memory, 0, 0b1111);
        let batch = served(s.draw(&index, job));
        let not_held = (0..4).find(|i| !batch.contains(i)).expect("2 of 4 held");
        let why = s.release(&index, job, &[batch[0], not_held]).expect_err("not held");
        assert!(
            why.contains(&format!("sample {not_held}, which it does not hold")),
            "{why}"
        );
        let why = s.release(&index, job, &[batch[0], batch[0]]).expect_err("held once");
        assert!(why.contains("that many times"), "{why}");
        let why = s.release(&index, other, &batch).expect_err("another job's");
        assert!(why.contains("does not hold"), "{why}");
        assert_eq!(
            (
                s.jobs[&job].held_bytes,
                s.jobs[&job].live_batches,
                s.leased_bytes(&index)
            ),
            (2 * SLOT, 1, 2 * SLOT),
            "nothing was let go"
        );
        s.release(&index, job, &batch).expect("held");
        assert_eq!(s.leased_bytes(&index), 0);
    }

    #[test]
    fn a_waiting_job_is_served_when_the_fill_brings_its_batch() {
        let index = index(8);
        let (mut s, memory) = cache(&index, 8, false);
        let plan = PlanConfig::new(Memory::Bytes(8 * SLOT));
        let mut cursor = Fill::new(Planner::from_layout(Layout::of(&index), &plan).expect("a plan"));
        assert_eq!(s.choose(&index, &mut cursor), None, "no job: nothing to read");

        let job = attach(&mut s, 4, &[0, 1, 2, 3]);
        assert!(!s.any_waiting());
        assert!(matches!(s.draw(&index, job), Draw::Waits { began: true }));
        assert!(s.any_waiting());
        // The budget holds the dataset: the plan reads every chunk whole;
        // chunk 0 the job served already, so the fill passes over it.
        let (chunk, mask) = s.choose(&index, &mut cursor).expect("the job lacks chunk 1");
        assert_eq!((chunk, mask), (1, 0b1111));
        let progress = s.progress;
        fill(&mut s, &index, &memory, chunk, mask);
        assert!(s.progress > progress, "a read is progress for a waiting job");

        match s.draw(&index, job) {
            Draw::Served(ToJob::Batch {
                epoch,
                samples,
                skipped,
            }) => {
                assert_eq!((epoch, skipped.len()), (0, 0));
                let mut ids: Vec<u32> = samples.iter().map(|p| p.id).collect();
                ids.sort_unstable();
                assert_eq!(ids, [4, 5, 6, 7]);
                for p in &samples {
                    assert!(
                        s.samples[p.id as usize].at == Where::Resident(p.offset),
                        "placed where it is"
                    );
                    assert_eq!(p.len, LEN);
                }
            }
            _ => panic!("expected a batch"),
        }
        assert!(!s.any_waiting());
        // Its epoch is done: the next one needs every sample again.
        let job = &s.jobs[&job];
        assert_eq!((job.epoch, job.served.len()), (1, 0));
        assert!(s.samples.iter().all(|x| x.need == 1));
    }

    #[test]
    fn a_read_that_failed_fails_the_job_that_draws_its_samples_naming_why() {
        let index = index(4);
        let (mut s, memory) = cache(&index, 4, false);
        let job = attach(&mut s, 4, &[]);
        assert!(matches!(s.draw(&index, job), Draw::Waits { began: true }));
        s.reading(&index, 0, 0b1111);
        s.accept(
            &index,
            &memory,
            read(&[0, 1, 2, 3], Err(Error::config("the disk is gone"))),
        );
        assert_eq!((s.reserved, s.arena.used()), (0, 0), "a failed read takes no room");
        let why = failed(s.draw(&index, job));
        assert!(why.contains("the disk is gone"), "{why}");
    }

    #[test]
    fn a_corrupt_record_fails_the_job_that_draws_it_or_with_skip_is_left_out_of_its_epoch() {
        let index = index(4);
        let corrupt_read = || {
            let records = (0..4)
                .map(|i| {
                    let r: RecordResult = if i == 3 {
                        Err(Error::config("crc mismatch in record 3"))
                    } else {
                        Ok(AlignedBuf::for_sample(LEN as usize))
                    };
                    (i, r)
                })
                .collect();
            read(&[0, 1, 2, 3], Ok(records))
        };

        let (mut s, memory) = cache(&index, 4, false);
        let job = attach(&mut s, 4, &[]);
        s.reading(&index, 0, 0b1111);
        s.accept(&index, &memory, corrupt_read());
        assert_eq!(s.report.corrupt_records, 1);
        let why = failed(s.draw(&index, job));
        assert!(why.contains("crc mismatch in record 3"), "{why}");

        let (mut s, memory) = cache(&index, 4, true);
        let job = attach(&mut s, 4, &[]);
        s.reading(&index, 0, 0b1111);
        s.accept(&index, &memory, corrupt_read());
        match s.draw(&index, job) {
            Draw::Served(ToJob::Batch {
                epoch,
                samples,
                skipped,
            }) => {
                let mut ids: Vec<u32> = samples.iter().map(|p| p.id).collect();
                ids.sort_unstable();
                assert_eq!((epoch, ids, skipped), (0, vec![0, 1, 2], vec![3]));
            }
            _ => panic!("expected a batch"),
        }
        assert_eq!(s.jobs[&job].epoch, 1, "the skipped record ended the epoch too");
    }

    #[test]
    fn a_stopping_cache_or_failed_reads_answer_every_job_and_a_detached_job_is_gone() {
        let index = index(4);
        let (mut s, memory) = cache(&index, 4, false);
        let job = attach(&mut s, 2, &[]);
        fill(&mut s, &index, &memory, 0, 0b1111);
        s.failed = Some("the cache's reads failed: no device".into());
        assert_eq!(failed(s.draw(&index, job)), "the cache's reads failed: no device");
        s.stopping = Some("the cache at /x stopped: SIGTERM".into());
        assert_eq!(failed(s.draw(&index, job)), "the cache at /x stopped: SIGTERM");
        s.failed = None;
        s.stopping = None;
        s.remove_job(job);
        assert!(matches!(s.draw(&index, job), Draw::Gone));
        assert_eq!(s.jobs_now(), 0);
        assert!(s.samples.iter().all(|x| x.need == 0), "its needs went with it");
    }

    #[test]
    fn jobs_that_each_wait_while_their_batches_fill_the_memory_are_deadlocked() {
        let index = index(8);
        let (mut s, memory) = cache(&index, 4, false);
        let a = attach(&mut s, 2, &[2, 3]);
        let b = attach(&mut s, 2, &[0, 1]);
        fill(&mut s, &index, &memory, 0, 0b1111);
        assert_eq!(served(s.draw(&index, a)), [0, 1]);
        assert_eq!(served(s.draw(&index, b)), [2, 3]);
        assert!(matches!(s.draw(&index, a), Draw::Waits { began: true }));
        assert!(!s.deadlocked(&index), "b may still let go");
        assert!(matches!(s.draw(&index, b), Draw::Waits { began: true }));
        assert!(s.deadlocked(&index));
        let why = s.deadlock(&index);
        assert!(why.contains("(2) hold 2 batches (512 bytes, up to 1 per job)"), "{why}");
        s.release(&index, a, &[0, 1]).expect("held");
        assert!(!s.deadlocked(&index), "a's batch is room again");
    }
}
