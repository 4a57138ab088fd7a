//! The owner: reads the chunks of the groups this node owns, in the plan's
//! order, and pushes every record to the consumer that serves it, in that
//! consumer's step order, within the credit it granted.
//!
//! Reads are demand-driven: a read is issued once some consumer's credit
//! reaches a record of it (plus `readahead` bytes beyond), so what the
//! owner holds is what the plan holds, not the whole epoch.
//!
//! A read carries records for every consumer, and those not yet credited
//! wait here. So that a consumer far behind the others cannot make that
//! unbounded, credit counts towards reads only for steps within
//! [`drift_steps`] of the slowest live consumer's window: a rank that runs
//! ahead waits for the others (back-pressure), the slowest is never held
//! up (its steps are inside the limit), so nothing deadlocks. What the
//! owner holds is then its share of the plan's memory, plus about
//! `drift_steps` steps of every consumer, plus `readahead`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use brand_format::buffer::AlignedBuf;
use brand_loader::split_budget;
use brand_plan::Planner;

use brand_format::dataset::Dataset;

use crate::control::{Control, PushSink};
use crate::first_fill::{FirstFill, position};
use crate::inbox::Inbox;
use crate::routes::{OwnerPlan, Ownership};
use crate::storage::Storage;
use crate::wire::{Failure, Push, Sample, push};

/// The owner's counters, read by the consumer's `metrics()`.
#[derive(Debug, Default)]
pub struct OwnerStats {
    pub bytes_read: AtomicU64,
    pub reads_issued: AtomicU64,
    /// Reads of the start's first fill fetched record by record.
    pub reads_deferred: AtomicU64,
    pub samples_pushed: AtomicU64,
    pub bytes_pushed: AtomicU64,
    pub held_peak_bytes: AtomicU64,
    pub buffered_fallback: AtomicU64,
}

enum Outlet {
    Local,
    Pending,
    Remote(PushSink),
    Gone,
}

pub struct Owner {
    pub planner: Planner,
    pub ownership: Ownership,
    /// How far past the slowest consumer's window credit counts for reads.
    pub drift_steps: u64,
    pub node: u32,
    pub storage: Storage,
    pub inbox: Arc<Inbox>,
    pub control: crossbeam_channel::Receiver<Control>,
    pub stats: Arc<OwnerStats>,
    pub start_epoch: u64,
    pub start_step: u64,
    pub readahead_bytes: u64,
    /// How long a stopping owner waits without progress for peers it owes.
    pub linger: Duration,
}

/// One epoch's progress.
struct Progress {
    plan: OwnerPlan,
    /// Per consumer: queue entries covered by its credit.
    demand: Vec<usize>,
    /// Per consumer: queue entries whose reads are due (credited and within
    /// the drift limit).
    due: Vec<usize>,
    /// Per consumer: queue entries pushed.
    sent: Vec<usize>,
    /// Highest read index some credited entry needs.
    needed: Option<usize>,
    next_read: usize,
    ready: HashMap<(u32, u64), AlignedBuf>,
    first_fill: FirstFill,
}

impl Progress {
    fn new(plan: OwnerPlan, first_fill: FirstFill) -> Self {
        let w = plan.queues.len();
        Progress {
            plan,
            demand: vec![0; w],
            due: vec![0; w],
            sent: vec![0; w],
            needed: None,
            next_read: 0,
            ready: HashMap::new(),
            first_fill,
        }
    }

    fn finished(&self) -> bool {
        self.plan.queues.iter().zip(&self.sent).all(|(q, &s)| s >= q.len())
    }
}

impl Owner {
    /// Runs until stopped (or until a read fails, which every consumer is told).
    pub fn run(mut self) {
        let w = self.planner.geometry().world as usize;
        let mut outlets: Vec<Outlet> = (0..w)
            .map(|c| {
                if c as u32 == self.node {
                    Outlet::Local
                } else {
                    Outlet::Pending
                }
            })
            .collect();
        let mut credits = Credits(vec![BTreeMap::new(); w]);
        let mut epoch = self.start_epoch;
        // Memory is empty at the start: its epoch's first fill is split
        // (see `first_fill`) as a loader alone splits its own.
        let first_fill = FirstFill::new(split_budget(
            self.readahead_bytes,
            self.planner.config(),
            self.planner.geometry().rank_memory_bytes,
        ));
        let mut p = Progress::new(
            OwnerPlan::new(&self.planner, &self.ownership, epoch, self.node, self.start_step),
            first_fill,
        );
        let mut held: u64 = 0;
        let mut in_flight_bytes: u64 = 0;
        // The last epoch to serve, once the local consumer stopped.
        let mut stopping: Option<u64> = None;
        let mut last_progress = Instant::now();
        loop {
            // 1. Messages.
            while let Ok(c) = self.control.try_recv() {
                if let Control::Abort(f) = c {
                    return self.tell_all(&outlets, f);
                }
                if apply(c, &mut outlets, &mut credits, &mut stopping) {
                    last_progress = Instant::now();
                }
            }
            credits.forget_before(epoch);
            // Consumers that left are owed nothing.
            for (c, o) in outlets.iter().enumerate() {
                if matches!(o, Outlet::Gone) {
                    let len = p.plan.queues[c].len();
                    p.demand[c] = len;
                    p.due[c] = len;
                    p.sent[c] = len;
                    p.ready.retain(|&(rc, _), b| {
                        if rc as usize == c {
                            held -= b.len() as u64;
                            false
                        } else {
                            true
                        }
                    });
                }
            }
            // 2. What the credits cover, and which of it is due for reading:
            // steps within the drift limit of the slowest live consumer.
            let horizon = (0..w)
                .filter(|&c| !matches!(outlets[c], Outlet::Gone))
                .filter_map(|c| credits.window(c, epoch))
                .min()
                .map_or(u64::MAX, |slowest| slowest.saturating_add(self.drift_steps));
            for c in 0..w {
                let Some(window) = credits.window(c, epoch) else {
                    continue;
                };
                let q = &p.plan.queues[c];
                while p.demand[c] < q.len() && q[p.demand[c]].0 < window {
                    p.demand[c] += 1;
                }
                while p.due[c] < p.demand[c] && q[p.due[c]].0 < horizon {
                    let read = q[p.due[c]].1;
                    p.needed = Some(p.needed.map_or(read, |n| n.max(read)));
                    p.due[c] += 1;
                }
            }
            // 3. Reads: everything credited, then readahead (once some
            // consumer has started the epoch).
            let started = (0..w).any(|c| credits.window(c, epoch).is_some());
            if let Err(e) = self.issue_reads(&mut p, &outlets, started, held, &mut in_flight_bytes) {
                return self.fail_all(&outlets, format!("could not read: {e}"));
            }
            // 4. Pushes, in each consumer's order.
            for (c, outlet) in outlets.iter_mut().enumerate() {
                while p.sent[c] < p.demand[c] {
                    let (step, _) = p.plan.queues[c][p.sent[c]];
                    let Some(buf) = p.ready.remove(&(c as u32, step)) else {
                        break;
                    };
                    held -= buf.len() as u64;
                    let delivered = match outlet {
                        Outlet::Local => {
                            self.inbox.deliver_local(epoch, step, Arc::new(buf));
                            true
                        }
                        Outlet::Remote(tx) => {
                            let sample = self.sample_at(&p, c, step);
                            let len = buf.len() as u64;
                            let msg = Push {
                                body: Some(push::Body::Sample(Sample {
                                    epoch,
                                    step,
                                    sample,
                                    data: buf.to_vec(),
                                })),
                            };
                            // Counted before sending: the consumer may see
                            // the sample before this thread runs again.
                            self.stats.samples_pushed.fetch_add(1, Ordering::Relaxed);
                            self.stats.bytes_pushed.fetch_add(len, Ordering::Relaxed);
                            let ok = tx.send(msg);
                            if !ok {
                                self.stats.samples_pushed.fetch_sub(1, Ordering::Relaxed);
                                self.stats.bytes_pushed.fetch_sub(len, Ordering::Relaxed);
                            }
                            ok
                        }
                        Outlet::Pending | Outlet::Gone => false,
                    };
                    if !delivered {
                        *outlet = Outlet::Gone;
                        break;
                    }
                    p.sent[c] += 1;
                    last_progress = Instant::now();
                }
            }
            // 5. The epoch is done for everyone: plan the next one.
            if p.finished() && self.storage.in_flight() == 0 {
                if stopping.is_some_and(|last| epoch >= last) {
                    return;
                }
                epoch += 1;
                p = Progress::new(
                    OwnerPlan::new(&self.planner, &self.ownership, epoch, self.node, 0),
                    FirstFill::new(0),
                );
                held = 0;
                in_flight_bytes = 0;
                continue;
            }
            if let Some(last) = stopping {
                // Finishing: stay while a peer may still need this node,
                // that is until each has said goodbye (it needs nothing
                // more) or been sent all of the last epoch, and has
                // connected (a peer not yet attached may be joining late,
                // and leaving now would leave it unable to reach us).
                // Bounded: `linger` without progress (a push, a credit, an
                // attach) and the owner leaves anyway.
                let owed = epoch <= last
                    && (0..w).any(|c| match outlets[c] {
                        Outlet::Remote(_) => p.sent[c] < p.plan.queues[c].len(),
                        Outlet::Pending => true,
                        Outlet::Local | Outlet::Gone => false,
                    });
                if !owed || last_progress.elapsed() > self.linger {
                    return;
                }
            }
            // 6. Wait for a read, or for a message.
            if self.storage.in_flight() > 0 {
                match self.storage.recv() {
                    Ok(done) => {
                        in_flight_bytes = in_flight_bytes.saturating_sub(done.bytes_read);
                        self.stats.bytes_read.fetch_add(done.bytes_read, Ordering::Relaxed);
                        match done.result {
                            Ok(samples) => {
                                let r = &p.plan.reads[done.read];
                                for (id, buf) in samples {
                                    if let Some(&(_, c, step)) = r.deliveries.iter().find(|d| d.0 == id)
                                        && !matches!(outlets[c as usize], Outlet::Gone)
                                    {
                                        held += buf.len() as u64;
                                        p.ready.insert((c, step), buf);
                                    }
                                }
                                self.stats.held_peak_bytes.fetch_max(held, Ordering::Relaxed);
                            }
                            Err(e) => return self.fail_all(&outlets, format!("could not read: {e}")),
                        }
                    }
                    Err(e) => return self.fail_all(&outlets, format!("could not read: {e}")),
                }
                if self.storage.buffered_fallback() {
                    self.stats.buffered_fallback.store(1, Ordering::Relaxed);
                }
            } else {
                match self.control.recv_timeout(Duration::from_millis(200)) {
                    Ok(Control::Abort(f)) => return self.tell_all(&outlets, f),
                    Ok(c) => {
                        if apply(c, &mut outlets, &mut credits, &mut stopping) {
                            last_progress = Instant::now();
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                }
            }
        }
    }

    /// Issues the reads that may start now: everything credited, and within
    /// `readahead` (counting `held`) once `started`. Split records (see
    /// `first_fill`) and whole reads go in serve order: a record within
    /// `readahead` in flight, before any whole read whose first record is
    /// served after it.
    fn issue_reads(
        &mut self,
        p: &mut Progress,
        outlets: &[Outlet],
        started: bool,
        held: u64,
        in_flight_bytes: &mut u64,
    ) -> brand_format::error::Result<()> {
        let w = outlets.len() as u64;
        let live = |c: u32| !matches!(outlets[c as usize], Outlet::Gone);
        loop {
            let mut next = None;
            if p.next_read < p.plan.reads.len() {
                let due = p.needed.is_some_and(|n| p.next_read <= n);
                if due || (started && held + *in_flight_bytes < self.readahead_bytes) {
                    next = Some(&p.plan.reads[p.next_read]);
                }
            }
            let whole_first = match next {
                Some(r) if !r.deliveries.iter().any(|d| live(d.1)) => {
                    p.next_read += 1;
                    continue;
                }
                Some(r) => {
                    let split = p.first_fill.splitting() && {
                        let bytes = self.storage.bytes(r.chunk, r.mask);
                        p.first_fill.split(p.next_read, r, bytes, self.storage.gap(), w)
                    };
                    if split {
                        self.stats.reads_deferred.fetch_add(1, Ordering::Relaxed);
                        self.stats.reads_issued.fetch_add(1, Ordering::Relaxed);
                        p.next_read += 1;
                        continue;
                    }
                    r.deliveries.iter().map(|&(_, c, step)| position(step, c, w)).min()
                }
                None => None,
            };
            let record_first = p
                .first_fill
                .soonest()
                .is_some_and(|s| whole_first.is_none_or(|f| s < f));
            if record_first {
                if *in_flight_bytes >= self.readahead_bytes {
                    return Ok(());
                }
                let Some((read, sample)) = p.first_fill.pop() else {
                    return Ok(());
                };
                let r = &p.plan.reads[read];
                if r.deliveries.iter().any(|d| d.0 == sample && live(d.1)) {
                    let record = sample - r.chunk * self.ownership.chunk_size as u64;
                    *in_flight_bytes += self.storage.submit_first_fill(read, r.chunk, 1 << record)?;
                }
            } else if let Some(r) = next {
                *in_flight_bytes += self.storage.submit(p.next_read, r.chunk, r.mask)?;
                self.stats.reads_issued.fetch_add(1, Ordering::Relaxed);
                p.next_read += 1;
            } else {
                return Ok(());
            }
        }
    }

    fn sample_at(&self, p: &Progress, consumer: usize, step: u64) -> u64 {
        let (_, read) = p.plan.queues[consumer][p.sent[consumer]];
        p.plan.reads[read]
            .deliveries
            .iter()
            .find(|d| d.1 as usize == consumer && d.2 == step)
            .map_or(u64::MAX, |d| d.0)
    }

    /// A read failed: no consumer can get its samples; this node failed,
    /// tell them all why (the local one too).
    fn fail_all(&self, outlets: &[Outlet], why: String) {
        self.inbox.fail(self.node, format!("{why} (this node)"));
        self.tell_all(outlets, Failure { node: self.node, why });
    }

    /// Tells every peer consumer the job failed (`f` names the node that
    /// failed first), before this owner ends its streams: the failure is
    /// queued ahead of the end, so it arrives before the stream closes.
    /// Recorded in the inbox too, so that a stream handed over after this
    /// owner ended says it as well (see `PushSink`).
    fn tell_all(&self, outlets: &[Outlet], f: Failure) {
        self.inbox.fail(f.node, f.why.clone());
        for o in outlets {
            if let Outlet::Remote(tx) = o {
                tx.send(Push {
                    body: Some(push::Body::Failed(f.clone())),
                });
            }
        }
    }
}

/// Per consumer, the window it granted in each epoch: the epoch being
/// served and, credited early, the next (a consumer credits the next epoch
/// once the current one is credited to its end, so this owner may still be
/// pushing the current epoch to others).
struct Credits(Vec<BTreeMap<u64, u64>>);

impl Credits {
    fn window(&self, consumer: usize, epoch: u64) -> Option<u64> {
        self.0[consumer].get(&epoch).copied()
    }

    /// Epochs this owner is done with are credited no more.
    fn forget_before(&mut self, epoch: u64) {
        for c in &mut self.0 {
            c.retain(|&e, _| e >= epoch);
        }
    }
}

/// Takes in one message; whether it is progress of a stopping owner (a
/// peer attached, granted credit or left: what it waits for moved).
fn apply(c: Control, outlets: &mut [Outlet], credits: &mut Credits, stopping: &mut Option<u64>) -> bool {
    match c {
        Control::Attached { consumer, sink } => {
            if let Some(o) = outlets.get_mut(consumer as usize) {
                *o = Outlet::Remote(sink);
            }
        }
        Control::Credit { consumer, credit } => {
            if let Some(c) = credits.0.get_mut(consumer as usize) {
                c.insert(credit.epoch, credit.window);
                // A consumer credits its current epoch and the next: one
                // that credits an epoch has all it needed of those two
                // before (see `check::CreditCheck`), so at most two stay.
                while c.len() > 2 {
                    c.pop_first();
                }
            }
        }
        Control::Gone { consumer } => {
            if let Some(o) = outlets.get_mut(consumer as usize) {
                *o = Outlet::Gone;
            }
        }
        Control::Stop { epoch } => *stopping = Some(epoch),
        // Handled where messages are taken in.
        Control::Abort(_) => {}
    }
    true
}

/// Steps a consumer's credit may run ahead of the slowest consumer's and
/// still make the owner read: about what `remote_memory` holds of average
/// samples, and never fewer than two credit batches (credits arrive in
/// batches, so a smaller limit could hold up the slowest consumer itself).
pub fn drift_steps(ds: &Dataset, remote_memory: u64) -> u64 {
    let mean = ds.manifest.mean_sample_bytes.max(1.0);
    ((remote_memory as f64 / mean) as u64).max(MIN_DRIFT_STEPS)
}

/// Two credit batches (see `inbox::CREDIT_BATCH`), and then some.
const MIN_DRIFT_STEPS: u64 = 64;
