//! A consumer's pushed samples: held by step until served, within
//! `remote_memory` bytes, granted to owners as credit in the consumer's own
//! order, checked against the consumer's plan on arrival.
//!
//! Credit is a window of steps: every owner may send the steps below
//! `window` it owns. The window grows while the bytes of the samples in
//! `[cursor, window)` fit `remote_memory`, so whatever arrives fits, and the
//! step the consumer waits for is always inside it (no owner can block
//! another's sample: no deadlock).
//!
//! Once the window reaches the epoch's end, what `remote_memory` has left
//! is credited to the next epoch's first steps (the same bound covers
//! both), so the next epoch's first batches arrive while this one finishes.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use brand_format::dataset::Dataset;
use brand_loader::SampleBytes;

use crate::config::NodeConfig;
use crate::control::{Control, JobOutcome};
use crate::routes::ConsumerPlan;
use crate::wire::{Credit, Failure, Sample};

/// Where an owner's credits go.
pub enum CreditSink {
    /// This node's own owner thread.
    Local(crossbeam_channel::Sender<Control>),
    /// A peer's stream (the response side of its push call).
    Remote(tokio::sync::mpsc::UnboundedSender<Result<Credit, tonic::Status>>),
}

impl CreditSink {
    fn send(&self, me: u32, credit: Credit) {
        // A closed sink means the owner is gone; its absence is noticed
        // when its samples are due.
        let _ = match self {
            CreditSink::Local(tx) => tx.send(Control::Credit { consumer: me, credit }).map_err(|_| ()),
            CreditSink::Remote(tx) => tx.send(Ok(credit)).map_err(|_| ()),
        };
    }
}

/// Counters of what was served (local or pushed: a sample pushed for an
/// epoch this node never starts is not counted) and what waited.
#[derive(Debug, Clone, Default)]
pub struct InboxStats {
    pub samples_local: u64,
    pub samples_received: u64,
    pub bytes_received: u64,
    pub held_peak_bytes: u64,
    pub stall_nanos: Vec<u64>,
}

/// A sample held until served, and whether it came from a peer.
struct Held {
    bytes: SampleBytes,
    pushed: bool,
}

/// One epoch's credit and held samples.
struct EpochWindow {
    plan: Arc<ConsumerPlan>,
    /// Next step to serve.
    cursor: u64,
    window: u64,
    /// Bytes of the samples of steps `[cursor, window)`.
    granted: u64,
    last_sent_window: u64,
    held: HashMap<u64, Held>,
    /// Per owner, the smallest step it may send next (steps arrive in order).
    next_from: Vec<u64>,
}

impl EpochWindow {
    fn new(plan: ConsumerPlan, from_step: u64, owners: usize) -> Self {
        let from = from_step.min(plan.steps());
        EpochWindow {
            plan: Arc::new(plan),
            cursor: from,
            window: from,
            granted: 0,
            last_sent_window: from,
            held: HashMap::new(),
            next_from: vec![from; owners],
        }
    }

    fn held_bytes(&self) -> u64 {
        self.held.values().map(|h| h.bytes.len() as u64).sum()
    }

    fn credit(&self) -> Credit {
        Credit {
            epoch: self.plan.epoch,
            window: self.window,
        }
    }
}

struct State {
    /// The epoch being served.
    cur: EpochWindow,
    /// The next one, credited early: once `cur` is credited to its end,
    /// what `remote_memory` has left over goes to the next epoch's first
    /// steps, so its first batches are pushed while this one finishes.
    /// None after the job's last epoch (see `Inbox::set_next`).
    next: Option<EpochWindow>,
    /// Bytes held, of both epochs.
    held_bytes: u64,
    sinks: Vec<Option<CreditSink>>,
    /// Per owner: its stream to us has been accepted (once; never reset, so
    /// a peer that joined, served and left has still joined).
    joined: Vec<bool>,
    /// Per owner: it said goodbye (ended its stream to us cleanly).
    closed: Vec<bool>,
    /// Per owner: its stream to us is being read (attached, not yet ended).
    reading: Vec<bool>,
    /// Per owner: the attempt (`Hello::attempt`) of its stream attached
    /// last; the ends of earlier ones are ignored.
    attempt: Vec<u32>,
    /// Per owner: a sample came on that attempt's stream (so the owner had
    /// our answer, and a later attempt is no retry but a second stream).
    delivered: Vec<bool>,
    /// Per peer: it accepted our pushes (once; never reset).
    outbound: Vec<bool>,
    /// This consumer needs nothing more (closed, or failed): owners that
    /// attach now are told goodbye at once.
    left: bool,
    /// The first failure of the job, as this node learnt it.
    failed: Option<Failure>,
    stats: InboxStats,
}

impl State {
    /// The window of `epoch`: the current one or the next.
    fn epoch_mut(&mut self, epoch: u64) -> Option<&mut EpochWindow> {
        std::iter::once(&mut self.cur)
            .chain(self.next.as_mut())
            .find(|e| e.plan.epoch == epoch)
    }
}

pub struct Inbox {
    ds: Arc<Dataset>,
    cfg: Arc<NodeConfig>,
    state: Mutex<State>,
    cond: Condvar,
}

/// Decoded length of `sample`: what its pushed bytes must measure.
pub fn sample_len(ds: &Dataset, sample: u64) -> u64 {
    if ds.zstd() {
        ds.index.raw_len(sample) as u64
    } else {
        ds.index.stored_len(sample) as u64
    }
}

/// Credits are sent once the window has grown by this many steps (or when
/// the consumer is about to wait).
const CREDIT_BATCH: u64 = 16;

impl Inbox {
    pub fn new(ds: Arc<Dataset>, cfg: Arc<NodeConfig>, plan: ConsumerPlan, from_step: u64) -> Self {
        let w = cfg.world() as usize;
        let mut state = State {
            cur: EpochWindow::new(plan, from_step, w),
            next: None,
            held_bytes: 0,
            sinks: (0..w).map(|_| None).collect(),
            joined: vec![false; w],
            closed: vec![false; w],
            reading: vec![false; w],
            attempt: vec![0; w],
            delivered: vec![false; w],
            outbound: vec![false; w],
            left: false,
            failed: None,
            stats: InboxStats::default(),
        };
        Self::grow_windows(&ds, &cfg, &mut state);
        Inbox {
            ds,
            cfg,
            state: Mutex::new(state),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug elsewhere; the data is
        // still consistent enough to report errors.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Grows the current epoch's window while its samples fit
    /// `remote_memory`; once it reaches the epoch's end, the next epoch's
    /// with what is left (both epochs' granted bytes within the bound).
    fn grow_windows(ds: &Dataset, cfg: &NodeConfig, s: &mut State) {
        let cur = &mut s.cur;
        while cur.window < cur.plan.steps() {
            let len = sample_len(ds, cur.plan.samples[cur.window as usize] as u64);
            // The step being waited for always fits (remote_memory is at
            // least the largest sample, checked at open).
            if cur.window > cur.cursor && cur.granted + len > cfg.remote_memory {
                return;
            }
            cur.granted += len;
            cur.window += 1;
        }
        let Some(next) = &mut s.next else { return };
        while next.window < next.plan.steps() {
            let len = sample_len(ds, next.plan.samples[next.window as usize] as u64);
            if cur.granted + next.granted + len > cfg.remote_memory {
                return;
            }
            next.granted += len;
            next.window += 1;
        }
    }

    /// Sends each epoch's window once it grew by a batch of steps, or
    /// reached the epoch's end (it grows no further: held back, the last
    /// steps would be credited only when the consumer waits for them), or
    /// when `force`d.
    fn send_credits(&self, s: &mut State, force: bool) {
        let State { cur, next, sinks, .. } = s;
        for ep in std::iter::once(cur).chain(next.as_mut()) {
            let batched = ep.window - ep.last_sent_window >= CREDIT_BATCH || ep.window == ep.plan.steps();
            if ep.window != ep.last_sent_window && (force || batched) {
                self.broadcast_credit(sinks, ep);
            }
        }
    }

    /// Grants every attached owner `ep`'s current window.
    fn broadcast_credit(&self, sinks: &[Option<CreditSink>], ep: &mut EpochWindow) {
        for sink in sinks.iter().flatten() {
            sink.send(self.cfg.rank, ep.credit());
        }
        ep.last_sent_window = ep.window;
    }

    /// Starts `plan`'s epoch at `from_step` and grants its first credit.
    /// The epoch credited early (`set_next`) carries on with what it holds
    /// and was granted.
    pub fn start_epoch(&self, plan: ConsumerPlan, from_step: u64) {
        let mut s = self.lock();
        let w = s.sinks.len();
        let early = s.next.take().filter(|n| n.plan.epoch == plan.epoch && from_step == 0);
        s.cur = early.unwrap_or_else(|| EpochWindow::new(plan, from_step, w));
        s.held_bytes = s.cur.held_bytes();
        Self::grow_windows(&self.ds, &self.cfg, &mut s);
        let State { cur, sinks, .. } = &mut *s;
        self.broadcast_credit(sinks, cur);
    }

    /// The epoch after the current one, `plan`, to credit early (once the
    /// current one is credited to its end); None: the job serves no
    /// epoch after this one, so nothing of the next is pushed or read.
    pub fn set_next(&self, plan: Option<ConsumerPlan>) {
        let mut s = self.lock();
        let w = s.sinks.len();
        let keep = |n: &EpochWindow| plan.as_ref().is_some_and(|p| p.epoch == n.plan.epoch);
        if s.next.as_ref().is_some_and(keep) {
            return;
        }
        s.next = plan
            .filter(|p| p.epoch == s.cur.plan.epoch + 1)
            .map(|p| EpochWindow::new(p, 0, w));
        s.held_bytes = s.cur.held_bytes();
        Self::grow_windows(&self.ds, &self.cfg, &mut s);
        self.send_credits(&mut s, false);
    }

    /// Registers `owner`'s credit sink (of its connection `attempt`) and
    /// grants it the current window. An attempt that replaces one on which
    /// nothing came is a retry (the owner never had our answer): the earlier
    /// one is dropped. After this consumer left, the sink is dropped at
    /// once: the owner's credit stream ends, its goodbye.
    pub fn attach(&self, owner: u32, attempt: u32, sink: CreditSink) -> Result<(), String> {
        let mut s = self.lock();
        let i = owner as usize;
        if i >= s.sinks.len() {
            return Err(format!("no node {owner}"));
        }
        let connected = s.sinks[i].is_some() || s.reading[i];
        if connected && (attempt <= s.attempt[i] || s.delivered[i]) {
            return Err(format!("{} is already connected", self.cfg.name(owner)));
        }
        s.sinks[i] = None;
        s.attempt[i] = attempt;
        s.delivered[i] = false;
        s.joined[owner as usize] = true;
        // This node's own owner has no stream to end.
        s.reading[owner as usize] = owner != self.cfg.rank;
        self.cond.notify_all();
        if s.left {
            return Ok(());
        }
        sink.send(self.cfg.rank, s.cur.credit());
        if let Some(next) = s.next.as_ref().filter(|n| n.window > 0) {
            sink.send(self.cfg.rank, next.credit());
        }
        s.sinks[owner as usize] = Some(sink);
        Ok(())
    }

    /// This consumer needs nothing more: every owner's credit stream ends
    /// (its goodbye to them), so owners stop owing it and can leave.
    pub fn leave(&self) {
        let mut s = self.lock();
        s.left = true;
        s.sinks.iter_mut().for_each(|x| *x = None);
    }

    /// Our pushes to `peer` were accepted.
    pub fn outbound_ready(&self, peer: u32) {
        let mut s = self.lock();
        if let Some(o) = s.outbound.get_mut(peer as usize) {
            *o = true;
        }
        self.cond.notify_all();
    }

    /// Waits until every peer has connected to us and accepted our pushes
    /// (at some point: a peer may already have served us and left); the
    /// error names those that did not.
    pub fn wait_connected(&self, timeout: Duration) -> Result<(), Failure> {
        let deadline = Instant::now() + timeout;
        let me = self.cfg.rank as usize;
        let mut s = self.lock();
        loop {
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            let missing: Vec<u32> = (0..s.joined.len())
                .filter(|&i| i != me && (!s.joined[i] || !s.outbound[i]))
                .map(|i| i as u32)
                .collect();
            let Some(&first) = missing.first() else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                let others: Vec<String> = missing[1..].iter().map(|&i| self.cfg.name(i)).collect();
                return Err(Failure {
                    node: first,
                    why: format!(
                        "did not connect within {timeout:?}{}",
                        if others.is_empty() {
                            String::new()
                        } else {
                            format!(" (nor did {})", others.join(", "))
                        }
                    ),
                });
            }
            s = self
                .cond
                .wait_timeout(s, deadline - now)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// A pushed sample from `owner`, checked against this consumer's plan
    /// (the error is `owner`'s failure).
    pub fn deliver(&self, owner: u32, attempt: u32, m: Sample) -> Result<(), String> {
        let mut s = self.lock();
        let bad = |why: String| {
            format!(
                "sent a bad push (epoch {}, step {}, sample {}): {why}",
                m.epoch, m.step, m.sample
            )
        };
        if s.attempt.get(owner as usize) != Some(&attempt) {
            return Err(bad(format!(
                "on its connection attempt {attempt}, replaced by a later one"
            )));
        }
        let serving = s.cur.plan.epoch;
        let Some(ep) = s.epoch_mut(m.epoch) else {
            return Err(bad(format!("this node is in epoch {serving}")));
        };
        let expected_from = ep.next_from.get(owner as usize).copied().unwrap_or(u64::MAX);
        crate::check::sample(&m, owner, &ep.plan, expected_from, ep.window, |y| {
            sample_len(&self.ds, y)
        })?;
        ep.next_from[owner as usize] = m.step + 1;
        let bytes = Arc::new(brand_format::buffer::AlignedBuf::copy_of(&m.data));
        s.delivered[owner as usize] = true;
        self.hold(&mut s, m.epoch, m.step, Held { bytes, pushed: true });
        Ok(())
    }

    /// A sample this node owns and serves itself, of `epoch` (the current
    /// one, or the next credited early).
    pub fn deliver_local(&self, epoch: u64, step: u64, bytes: SampleBytes) {
        let mut s = self.lock();
        self.hold(&mut s, epoch, step, Held { bytes, pushed: false });
    }

    fn hold(&self, s: &mut State, epoch: u64, step: u64, h: Held) {
        // The owner pushes only what was credited, so the epoch is here.
        let Some(ep) = s.epoch_mut(epoch) else {
            return;
        };
        let len = h.bytes.len() as u64;
        ep.held.insert(step, h);
        s.held_bytes += len;
        s.stats.held_peak_bytes = s.stats.held_peak_bytes.max(s.held_bytes);
        self.cond.notify_all();
    }

    /// Records the job's failure: `node` failed, `why`. The first one
    /// stands (later ones are its consequences, such as a messenger that
    /// left because of it); every later `take` reports it. A failed consumer
    /// needs nothing more, so its owners' credit streams end.
    pub fn fail(&self, node: u32, why: String) {
        let mut s = self.lock();
        if s.failed.is_none() {
            s.failed = Some(Failure { node, why });
        }
        s.left = true;
        s.sinks.iter_mut().for_each(|x| *x = None);
        self.cond.notify_all();
    }

    /// Whether `attempt` is `owner`'s current stream (not one replaced by
    /// a retry).
    fn current(s: &State, owner: u32, attempt: u32) -> bool {
        s.attempt.get(owner as usize) == Some(&attempt)
    }

    /// `owner`'s stream `attempt` to us ended, however (see
    /// `wait_streams_ended`).
    pub fn stream_ended(&self, owner: u32, attempt: u32) {
        let mut s = self.lock();
        if Self::current(&s, owner, attempt) {
            s.reading[owner as usize] = false;
        }
        self.cond.notify_all();
    }

    /// Waits (up to `timeout`) until every owner's stream to us has ended.
    /// A node that left waits for this before its server goes: an owner
    /// whose hello it accepted may not have had the answer yet (it would
    /// see a transport error instead of the goodbye), and every owner ends
    /// its stream once this consumer's goodbye reaches it.
    pub fn wait_streams_ended(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.reading.iter().any(|&r| r) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            s = self
                .cond
                .wait_timeout(s, deadline - now)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// The failure recorded, if any.
    pub fn failure(&self) -> Option<Failure> {
        self.lock().failed.clone()
    }

    /// `owner` said goodbye: it sends nothing more (an error only if a
    /// sample of it is still due). Its credit stream ends too, which lets
    /// the owner's side finish.
    pub fn closed(&self, owner: u32, attempt: u32) {
        let mut s = self.lock();
        if !Self::current(&s, owner, attempt) {
            return;
        }
        s.closed[owner as usize] = true;
        s.sinks[owner as usize] = None;
        self.cond.notify_all();
    }

    /// `owner`'s stream `attempt` ended (cleanly, or broken) with nothing
    /// on it: an attempt the owner gave up, its answer lost on the way (it
    /// connects again). Neither a goodbye nor a loss: the answer's stream
    /// ends, and if the owner never comes back, its first sample due is
    /// waited for up to `peer_timeout` and it is named then.
    pub fn abandoned(&self, owner: u32, attempt: u32) {
        let mut s = self.lock();
        if Self::current(&s, owner, attempt) {
            s.sinks[owner as usize] = None;
        }
        self.cond.notify_all();
    }

    /// `owner`'s stream to us broke (`why`) without a goodbye or a failure
    /// message: it died, or its host or the network did. That is the job's
    /// failure, blamed on `owner` now, whether or not a sample of it is due
    /// yet, so that a survivor names the node that died, not a peer that
    /// left later because of it. Once this consumer left, it is no failure:
    /// nothing is due. Nor is it one if nothing came on the stream: the
    /// owner may have given that attempt up (see `abandoned`).
    pub fn lost(&self, owner: u32, attempt: u32, why: String) {
        {
            let s = self.lock();
            if s.left || !Self::current(&s, owner, attempt) {
                return;
            }
            if !s.delivered[owner as usize] {
                drop(s);
                return self.abandoned(owner, attempt);
            }
        }
        self.fail(owner, why);
    }

    /// The next step's sample, waiting up to `peer_timeout` for its push;
    /// `None` at the end of the epoch.
    pub fn take(&self) -> Result<Option<(u64, SampleBytes)>, Failure> {
        let mut s = self.lock();
        let mut stalled: Option<Instant> = None;
        loop {
            if let Some(f) = &s.failed {
                return Err(f.clone());
            }
            let step = s.cur.cursor;
            if step >= s.cur.plan.steps() {
                return Ok(None);
            }
            let sample = s.cur.plan.samples[step as usize] as u64;
            if let Some(h) = s.cur.held.remove(&step) {
                let len = h.bytes.len() as u64;
                s.held_bytes -= len;
                // Counted as served: what came for an epoch this node never
                // started (credited early, then the job stopped) is not.
                if h.pushed {
                    s.stats.samples_received += 1;
                    s.stats.bytes_received += len;
                } else {
                    s.stats.samples_local += 1;
                }
                s.cur.granted -= sample_len(&self.ds, sample);
                s.cur.cursor += 1;
                Self::grow_windows(&self.ds, &self.cfg, &mut s);
                self.send_credits(&mut s, false);
                if let Some(t) = stalled {
                    s.stats
                        .stall_nanos
                        .push(t.elapsed().as_nanos().min(u64::MAX as u128) as u64);
                }
                return Ok(Some((sample, h.bytes)));
            }
            let owner = s.cur.plan.owners[step as usize];
            if s.closed[owner as usize] {
                return Err(Failure {
                    node: owner,
                    why: format!(
                        "left (closed) before sending sample {sample} (epoch {}, step {step})",
                        s.cur.plan.epoch
                    ),
                });
            }
            self.send_credits(&mut s, true);
            let started = *stalled.get_or_insert_with(Instant::now);
            let waited = started.elapsed();
            if waited >= self.cfg.peer_timeout {
                return Err(Failure {
                    node: owner,
                    why: format!(
                        "no push of sample {sample} (epoch {}, step {step}) within {:?}",
                        s.cur.plan.epoch, self.cfg.peer_timeout
                    ),
                });
            }
            s = self
                .cond
                .wait_timeout(s, self.cfg.peer_timeout - waited)
                .map(|r| r.0)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    pub fn stats(&self) -> InboxStats {
        self.lock().stats.clone()
    }
}

impl JobOutcome for Inbox {
    fn failure(&self) -> Option<Failure> {
        Inbox::failure(self)
    }
}
