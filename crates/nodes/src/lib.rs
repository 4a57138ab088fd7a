//! brand-nodes: the multi-node mode (DESIGN.md §6, paper §3.4).
//!
//! Groups are assigned to nodes (group `g` → node `g mod W`); a node reads
//! only the chunks of its groups, once, through the io engine, and pushes
//! each record to the rank that serves it, in that rank's order and ahead
//! of its request, within the `remote_memory` the consumer granted (credit
//! flow control). Every rank serves exactly the sequence the single-process
//! plan gives it (`Planner::rank_plan` for its rank in a world of W): the
//! order is the plan's, I/O and the network only change how fast it comes.
//!
//! Modules: `routes` (who reads and who serves what: pure), `check` (what
//! a peer sends, checked before it is acted on: pure), `owner` (reads
//! and pushes), `first_fill` (a start's large reads, record by record in
//! serve order), `control` (what the owner is told), `inbox` (a consumer's
//! held samples and credit), `net` (gRPC), `storage` (the one use of the io
//! engine), `wire` (the messages) and `config` (the multi-node keys).
//! Interfaces open a node through `brand_reader`, whose configuration path
//! gives this crate its [`NodeConfig`].

pub mod check;
pub mod config;
mod control;
mod first_fill;
mod inbox;
mod net;
mod owner;
pub mod routes;
mod storage;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use brand_format::dataset::Dataset;
use brand_format::error::{Error, Result};
pub use brand_loader::Batch;
use brand_loader::elastic::{GlobalPosition, SavedWorld};
use brand_loader::stats::StallLog;
use brand_loader::{Checkpoint, Fingerprint, LoaderConfig, LoaderState, Metrics, Resume};
use brand_plan::Planner;

pub use config::NodeConfig;
use control::Control;
use inbox::{CreditSink, Inbox, sample_len};
use owner::{Owner, OwnerStats};
use routes::{ConsumerPlan, Ownership};

/// Fault injection for tests: from now on, in this process, every node's
/// push stream to a peer loses the answer to its first hello (the peer
/// accepted it; the owner never hears so and tries again), as a connection
/// through a relay or proxy can.
#[doc(hidden)]
pub fn lose_first_hello_answers() {
    net::LOSE_FIRST_ANSWER.store(true, Ordering::Relaxed);
}

/// One node of a multi-node job: serves this rank's batches, and reads and
/// pushes the samples of the groups it owns. A single node (no `nodes`)
/// listens nowhere and serves everything itself.
pub struct NodeLoader {
    ds: Arc<Dataset>,
    cfg: Arc<NodeConfig>,
    planner: Planner,
    fingerprint: Fingerprint,
    /// The read gap this node's storage chose (None: whole chunks).
    read_gap: Option<u64>,
    ownership: Ownership,
    batch_size: usize,
    epoch: u64,
    served: u64,
    /// The last batch call returned the end of `epoch`.
    epoch_ended: bool,
    samples_served: u64,
    bytes_served: u64,
    inbox: Arc<Inbox>,
    owner_stats: Arc<OwnerStats>,
    control: crossbeam_channel::Sender<Control>,
    owner: Option<std::thread::JoinHandle<()>>,
    net: Option<net::Net>,
    /// The job's failure, once this node has seen it: every later call
    /// returns it, and leaving tells the peers.
    failed: Option<wire::Failure>,
}

/// The digest nodes exchange: job, dataset fingerprint, plan configuration
/// and the global position they start at.
pub fn job_digest(ds: &Dataset, loader: &LoaderConfig, peers: &NodeConfig, at: GlobalPosition) -> wire::JobDigest {
    // Partitions of one pack differ only in which part they are: the
    // fingerprint is the whole dataset's (and the partitioning's).
    let mut logical = ds.manifest.clone();
    if let Some(p) = &mut logical.partition {
        p.index = 0;
    }
    let manifest = crc32c::crc32c(logical.to_toml().as_bytes()) as u64;
    // Every record's crc32c (not the whole index: its keys stay unread).
    let index = ds.index.content_digest() as u64;
    let p = &loader.plan;
    wire::JobDigest {
        protocol: wire::PROTOCOL,
        job: peers.job.clone(),
        dataset: (manifest << 32) | index,
        samples: ds.index.samples(),
        policy: p.policy.to_string(),
        memory: p.memory.to_string(),
        seed: p.seed,
        world: p.world,
        drop_last: p.drop_last,
        nodes: peers.nodes.join(","),
        start_epoch: at.epoch,
        start_position: at.position,
    }
}

/// Who reads which chunk: the plan's groups, or, for a partition, the
/// groups it was packed with, which must be this node's of this world.
fn ownership(ds: &Dataset, planner: &Planner, peers: &NodeConfig, me: u32) -> Result<Ownership> {
    let plan = Ownership::of_plan(planner);
    let Some(p) = ds.manifest.partition else {
        return Ok(plan);
    };
    if p.count != peers.world() || p.index != me {
        return Err(Error::config(format!(
            "{}: partition {} of {}, but this is node {me} of {}: each node opens its own partition of a pack for as many nodes",
            ds.dir().display(),
            p.index,
            p.count,
            peers.world()
        )));
    }
    if p.group_chunks != plan.group_chunks {
        tracing::warn!(
            "{}: packed for groups of {} chunks, the plan's are {} (another memory budget): each node still reads only its own chunks",
            ds.dir().display(),
            p.group_chunks,
            plan.group_chunks
        );
    }
    Ok(Ownership {
        group_chunks: p.group_chunks,
        ..plan
    })
}

/// The plan of the epoch after `epoch`, to credit early, unless the job
/// ends with `epoch`.
fn next_plan(planner: &Planner, own: &Ownership, cfg: &NodeConfig, epoch: u64) -> Option<ConsumerPlan> {
    let next = epoch.checked_add(1)?;
    cfg.last_epoch
        .is_none_or(|last| next <= last)
        .then(|| ConsumerPlan::new(planner, own, next, cfg.rank))
}

impl NodeLoader {
    /// Opens this node (`peers.rank` of `peers.nodes`), configured by
    /// `loader` and `peers`, where
    /// `resume` says: a state every node starts at, this rank's checkpoint,
    /// or every rank's checkpoints of a saved world of any number of nodes
    /// (the same total memory; every node opens with the same ones). With
    /// peers, returns once every peer has connected and agreed on the job,
    /// or fails naming those that did not within `peer_timeout`.
    pub fn open(
        ds: Arc<Dataset>,
        loader: &LoaderConfig,
        peers: &NodeConfig,
        resume: impl Into<Resume>,
    ) -> Result<Self> {
        let planner = Planner::new(&ds.index, &loader.plan)?;
        let fingerprint = Fingerprint::of(&ds, &planner);
        let start = resume.into().start(&ds, &planner, &fingerprint)?;
        Self::open_planned(ds, loader, peers, planner, start.global)
    }

    /// [`open`](Self::open) where the whole world `saved` stopped.
    pub fn open_elastic(
        ds: Arc<Dataset>,
        loader: &LoaderConfig,
        peers: &NodeConfig,
        saved: &SavedWorld,
    ) -> Result<Self> {
        Self::open(ds, loader, peers, Resume::World(saved.clone()))
    }

    /// Opens this node with the plan made and global positions
    /// `..at.position` of `at.epoch` served. Nodes start at a common step
    /// `at.position / W`; a node whose position of that step is below
    /// `at.position` (served already) takes and drops that one sample, so
    /// every node's next serve is its first position at or after
    /// `at.position`.
    pub fn open_planned(
        ds: Arc<Dataset>,
        loader: &LoaderConfig,
        peers: &NodeConfig,
        planner: Planner,
        at: GlobalPosition,
    ) -> Result<Self> {
        let peers = Arc::new(peers.clone());
        let me = peers.rank;
        if loader.plan.world != peers.world() || loader.plan.rank != me {
            return Err(Error::config(format!(
                "rank {} of world {} but this is node {me} of {}",
                loader.plan.rank,
                loader.plan.world,
                peers.world()
            )));
        }
        let geo = *planner.geometry();
        if !loader.plan.policy.is_brand() || geo.holds_all {
            return Err(Error::config(format!(
                "multi-node mode needs policy brand or brand-random and a memory budget below the dataset (policy {}, memory {}{})",
                loader.plan.policy,
                loader.plan.memory,
                if geo.holds_all { ", which holds it all" } else { "" }
            )));
        }
        let largest = (0..ds.index.samples()).map(|id| sample_len(&ds, id)).max().unwrap_or(0);
        if peers.remote_memory < largest {
            return Err(Error::config(format!(
                "remote_memory {} is smaller than the largest sample ({largest} bytes)",
                peers.remote_memory
            )));
        }
        let world = peers.world() as u64;
        let common_step = (at.position / world).min(geo.steps);
        let state = LoaderState {
            epoch: at.epoch,
            served: common_step,
        };
        let drop_first = common_step < geo.steps && common_step * world + (me as u64) < at.position;
        let ownership = ownership(&ds, &planner, &peers, me)?;
        let consumer_plan = ConsumerPlan::new(&planner, &ownership, state.epoch, me);
        let inbox = Arc::new(Inbox::new(ds.clone(), peers.clone(), consumer_plan, state.served));
        inbox.set_next(next_plan(&planner, &ownership, &peers, state.epoch));
        let (control, control_rx) = crossbeam_channel::unbounded();
        inbox
            .attach(me, 0, CreditSink::Local(control.clone()))
            .map_err(Error::config)?;
        let storage = storage::Storage::open(ds.clone(), &loader.io, loader.readahead_bytes)?;
        let read_gap = storage.read_gap();
        let owner_stats = Arc::new(OwnerStats::default());
        let owner = Owner {
            planner: planner.clone(),
            ownership,
            drift_steps: owner::drift_steps(&ds, peers.remote_memory),
            node: me,
            storage,
            inbox: inbox.clone(),
            control: control_rx,
            stats: owner_stats.clone(),
            start_epoch: state.epoch,
            start_step: state.served,
            readahead_bytes: loader.readahead_bytes,
            linger: peers.peer_timeout,
        };
        let owner = std::thread::Builder::new()
            .name(format!("brand-owner-{me}"))
            .spawn(move || owner.run())
            .map_err(|e| Error::io("<brand-owner thread>", e))?;
        let fingerprint = Fingerprint::of(&ds, &planner);
        let mut this = NodeLoader {
            ds: ds.clone(),
            cfg: peers.clone(),
            planner,
            fingerprint,
            read_gap,
            ownership,
            batch_size: loader.batch_size,
            epoch: state.epoch,
            served: state.served,
            epoch_ended: false,
            samples_served: 0,
            bytes_served: 0,
            inbox: inbox.clone(),
            owner_stats,
            control: control.clone(),
            owner: Some(owner),
            net: None,
            failed: None,
        };
        if peers.world() > 1 {
            match net::Net::start(net::Ctx {
                cfg: peers.clone(),
                digest: job_digest(&ds, loader, &peers, at),
                inbox: inbox.clone(),
                control,
                max_message: largest as usize + (64 << 10),
                steps: geo.steps,
            }) {
                Ok(n) => this.net = Some(n),
                Err(e) => {
                    // No peer can be told (nothing listens): leave at once.
                    this.failed = Some(wire::Failure {
                        node: me,
                        why: e.to_string(),
                    });
                    return Err(e);
                }
            }
            // Failing here is failing the job: dropping `this` tells the
            // peers which node failed first (see `stop_owner`).
            if let Err(f) = inbox.wait_connected(peers.peer_timeout) {
                return Err(this.fail(f));
            }
        }
        if drop_first {
            match this.inbox.take() {
                Ok(_) => this.served += 1,
                Err(f) => return Err(this.fail(f)),
            }
        }
        Ok(this)
    }

    /// Records the job's failure `f`, tells the peers before the caller
    /// hears of it, and returns it as this node's error.
    ///
    /// Told first because a caller that hears of a failure may end its
    /// process at once (a C program's `exit`, an exception through Python):
    /// its connections then break, and a peer that had not yet learnt the
    /// failure on its own would blame this node, which only stopped because
    /// of it. So the owner sends `f` (naming the node that failed first) to
    /// every peer and ends, and this waits, up to `peer_timeout`, until each
    /// peer has acknowledged by ending its credit to this node (it failed
    /// or left) or is gone.
    fn fail(&mut self, f: wire::Failure) -> Error {
        let e = self.peer_error(&f);
        self.failed = Some(f);
        self.stop_owner();
        if let Some(net) = &mut self.net {
            net.wait_pushes_ended();
        }
        e
    }

    /// The job's failure, as seen from this node: `node R (addr): node P
    /// (addr): why`, P being the node that failed first.
    fn peer_error(&self, f: &wire::Failure) -> Error {
        let why = if f.node == self.cfg.rank {
            f.why.clone()
        } else {
            format!("{}: {}", self.cfg.name(f.node), f.why)
        };
        Error::io(
            self.cfg.name(self.cfg.rank),
            std::io::Error::new(std::io::ErrorKind::ConnectionAborted, why),
        )
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    /// Where this rank is: enough to resume every node exactly (all nodes
    /// must resume from the same state). After an epoch's end (`None`), the
    /// next epoch's start, as a `Loader` says.
    pub fn state(&self) -> LoaderState {
        if self.epoch_ended {
            LoaderState {
                epoch: self.epoch + 1,
                served: 0,
            }
        } else {
            LoaderState {
                epoch: self.epoch,
                served: self.served,
            }
        }
    }

    /// This node's state bound to its dataset and plan (every node must
    /// resume from the same state, or from every rank's checkpoints).
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            state: self.state(),
            fingerprint: self.fingerprint,
            bitmap: None,
        }
    }

    pub fn metrics(&self) -> Metrics {
        let s = self.inbox.stats();
        let o = &self.owner_stats;
        let mut m = Metrics {
            samples_served: self.samples_served,
            bytes_served: self.bytes_served,
            bytes_read: o.bytes_read.load(Ordering::Relaxed),
            reads_issued: o.reads_issued.load(Ordering::Relaxed),
            reads_deferred: o.reads_deferred.load(Ordering::Relaxed),
            buffered_fallback: o.buffered_fallback.load(Ordering::Relaxed) != 0,
            read_gap: self.read_gap,
            nodes: self.cfg.world(),
            node_rank: self.cfg.rank,
            samples_local: s.samples_local,
            samples_received: s.samples_received,
            bytes_received: s.bytes_received,
            samples_pushed: o.samples_pushed.load(Ordering::Relaxed),
            bytes_pushed: o.bytes_pushed.load(Ordering::Relaxed),
            remote_memory_peak: s.held_peak_bytes,
            remote_memory_limit: self.cfg.remote_memory,
            memory_slots: self.planner.geometry().rank_slots,
            owner_peak_bytes: o.held_peak_bytes.load(Ordering::Relaxed),
            ..Metrics::default()
        };
        let mut stalls = StallLog::default();
        for &nanos in &s.stall_nanos {
            stalls.record(std::time::Duration::from_nanos(nanos));
        }
        stalls.fill(&mut m);
        m
    }

    /// The next batch of the current epoch, or `None` at its end; the call
    /// after `None` starts the next epoch. A peer that fails, leaves, sends
    /// something wrong or stays silent past `peer_timeout` is an error that
    /// names it; after one, every call returns it again.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        if let Some(f) = &self.failed {
            return Err(self.peer_error(f));
        }
        if self.epoch_ended {
            self.epoch += 1;
            self.served = 0;
            self.epoch_ended = false;
            let plan = ConsumerPlan::new(&self.planner, &self.ownership, self.epoch, self.cfg.rank);
            self.inbox.start_epoch(plan, 0);
            self.inbox
                .set_next(next_plan(&self.planner, &self.ownership, &self.cfg, self.epoch));
        }
        let mut ids = Vec::with_capacity(self.batch_size);
        let mut data = Vec::with_capacity(self.batch_size);
        while ids.len() < self.batch_size {
            match self.inbox.take() {
                Ok(Some((id, bytes))) => {
                    ids.push(id);
                    data.push(bytes);
                }
                Ok(None) => break,
                Err(f) => return Err(self.fail(f)),
            }
        }
        if ids.is_empty() {
            self.epoch_ended = true;
            return Ok(None);
        }
        self.served += ids.len() as u64;
        self.samples_served += ids.len() as u64;
        self.bytes_served += ids.iter().map(|&id| self.ds.index.stored_len(id) as u64).sum::<u64>();
        Ok(Some(Batch::new(self.epoch, self.ds.clone(), ids, data)))
    }
}

impl NodeLoader {
    /// Leaves cleanly: first serves the peers what they are owed of the
    /// current epoch (see `Drop`), then returns the final metrics (which
    /// then count every read and push this node made).
    pub fn close(mut self) -> Metrics {
        self.stop_owner();
        self.metrics()
    }

    /// Leaves at once, as a crashed node would: connections close without
    /// finishing what peers are owed or a word (they fail naming this node).
    pub fn abort(mut self) {
        self.net.take();
        // The owner then ends at once; what it would tell the peers goes nowhere.
        self.failed = Some(wire::Failure {
            node: self.cfg.rank,
            why: "aborted".into(),
        });
    }
}

impl Drop for NodeLoader {
    fn drop(&mut self) {
        self.stop_owner();
        if let Some(net) = self.net.take() {
            net.close();
        }
    }
}

impl NodeLoader {
    fn stop_owner(&mut self) {
        if self.owner.is_none() {
            return;
        }
        // Failing: the owner tells every peer which node failed first, then
        // ends. Finishing: this consumer says goodbye (needs nothing more, so
        // peers that stop too need not wait for it); the owner first serves
        // what the peers still need (bounded by peer_timeout without
        // progress), then the network goes.
        let failed = self.failed.clone().or_else(|| self.inbox.failure());
        let _ = self.control.send(match failed {
            Some(f) => Control::Abort(f),
            None => {
                self.inbox.leave();
                Control::Stop { epoch: self.epoch }
            }
        });
        if let Some(t) = self.owner.take() {
            let _ = t.join();
        }
    }
}
