//! One reader over a loader alone, a node of a multi-node job and a job
//! attached to a `brand cache`, chosen by the configuration (`nodes`, or the
//! launcher's environment; `cache`): what every interface opens (the C ABI,
//! and through it the TF op; Python).
//!
//! An open makes one planner and passes it down. A node connects to its
//! peers at its first batch, not when it is opened: so
//! [`start_epoch`](Reader::start_epoch) right after [`open`](Reader::open)
//! (as the TF op does for a first epoch other than 0) sets where every node
//! starts, which all nodes must agree on when they connect.

use std::path::Path;
use std::sync::Arc;

use brand_cache::{Attached, Served};
use brand_format::Dataset;
use brand_format::error::{Error, Result};
use brand_loader::elastic::GlobalPosition;
use brand_loader::{Batch, Checkpoint, Fingerprint, Loader, LoaderState, Metrics, Resume};
use brand_plan::Planner;

use crate::{Config, NodeLoader};

pub struct Reader {
    kind: Kind,
    /// Samples this reader serves per epoch.
    epoch_len: u64,
}

enum Kind {
    Alone(Box<Loader>),
    /// A loader alone continuing an epoch an attached job began: the plan's
    /// order, leaving out what the job served (the plan still reads it).
    Resumed(Box<Loader>, Skip),
    Node(Box<Node>),
    Attached(Box<AttachedJob>),
}

/// The samples of `epoch` served before a resume from an attached job.
struct Skip {
    epoch: u64,
    bitmap: Vec<u64>,
    served_before: u64,
    /// Samples of `epoch` handed out since the resume.
    given: u64,
}

impl Skip {
    fn has(&self, id: u64) -> bool {
        self.bitmap
            .get(id as usize / 64)
            .is_some_and(|w| w >> (id % 64) & 1 == 1)
    }
}

/// A job attached to a cache, with what its checkpoints are bound to.
struct AttachedJob {
    job: Attached,
    fingerprint: Fingerprint,
}

/// A node before and after it connects.
struct Node {
    ds: Arc<Dataset>,
    cfg: Config,
    fingerprint: Fingerprint,
    /// The plan, until the node connects and takes it.
    planner: Option<Planner>,
    /// Where every node starts, and this rank's state there (what
    /// `state()` says before the node connects).
    start: GlobalPosition,
    start_state: LoaderState,
    live: Option<NodeLoader>,
}

impl Node {
    fn live(&mut self) -> Result<&mut NodeLoader> {
        if self.live.is_none() {
            let planner = match self.planner.take() {
                Some(p) => p,
                None => Planner::new(&self.ds.index, &self.cfg.loader.plan)?,
            };
            self.live = Some(NodeLoader::open_planned(
                self.ds.clone(),
                &self.cfg,
                planner,
                self.start,
            )?);
        }
        match self.live.as_mut() {
            Some(l) => Ok(l),
            None => unreachable!("set above"),
        }
    }
}

/// The dataset at `path` as `cfg` needs it: a node may be given its
/// partition of a partitioned pack; a loader alone needs the whole dataset
/// (`Dataset::open` refuses a partition).
fn open_dataset(path: &Path, cfg: &Config) -> Result<Dataset> {
    if cfg.nodes.world() > 1 {
        Dataset::open_any(path)
    } else {
        Dataset::open(path)
    }
}

impl Reader {
    /// Opens the dataset directory `path` (made by `brand pack`) as `cfg`
    /// says, where `resume` says.
    pub fn open(path: &Path, cfg: &Config, resume: Resume) -> Result<Self> {
        let ds = Arc::new(open_dataset(path, cfg)?);
        let planner = Planner::new(&ds.index, &cfg.loader.plan)?;
        let epoch_len = planner.geometry().steps;
        let kind = if let Some(socket) = &cfg.loader.cache {
            if cfg.nodes.world() > 1 {
                return Err(Error::config(
                    "cache and nodes together: a job attaches to its machine's cache or is a node of a multi-node job, not both",
                ));
            }
            let fingerprint = Fingerprint::of(&ds, &planner);
            let state = resume.start(&ds, &planner, &fingerprint)?.state;
            if state.served > 0 {
                return Err(Error::InvalidState(format!(
                    "an attached job's order depends on timing: it resumes mid-epoch only from the samples it served (brand_cache::Attached::open with Served), not from a count ({} of epoch {})",
                    state.served, state.epoch
                )));
            }
            let from = Served {
                epoch: state.epoch,
                bitmap: Vec::new(),
            };
            Kind::Attached(Box::new(AttachedJob {
                job: Attached::open(ds, &cfg.loader, socket, from)?,
                fingerprint,
            }))
        } else if cfg.nodes.world() > 1 {
            let fingerprint = Fingerprint::of(&ds, &planner);
            let start = resume.start(&ds, &planner, &fingerprint)?;
            Kind::Node(Box::new(Node {
                ds,
                cfg: cfg.clone(),
                fingerprint,
                planner: Some(planner),
                start: start.global,
                start_state: start.state,
                live: None,
            }))
        } else {
            Kind::Alone(Box::new(Loader::open_planned(ds, &cfg.loader, planner, resume)?))
        };
        Ok(Reader { kind, epoch_len })
    }

    /// Opens where an attached job's state `blob` ([`served_state`](Self::served_state))
    /// says: attached again if `cfg` names a cache, else a loader alone that
    /// serves the rest of that epoch in its plan's order, leaving out what the
    /// job served (its batches of that epoch are shorter where it does).
    /// Either way each sample comes once in the epoch.
    pub fn open_served(path: &Path, cfg: &Config, blob: &[u8]) -> Result<Self> {
        let ds = Arc::new(open_dataset(path, cfg)?);
        let served = Served::from_bytes(blob, &ds)?;
        let planner = Planner::new(&ds.index, &cfg.loader.plan)?;
        let epoch_len = planner.geometry().steps;
        if let Some(socket) = &cfg.loader.cache {
            let fingerprint = Fingerprint::of(&ds, &planner);
            let job = Attached::open(ds, &cfg.loader, socket, served)?;
            return Ok(Reader {
                kind: Kind::Attached(Box::new(AttachedJob { job, fingerprint })),
                epoch_len,
            });
        }
        if cfg.nodes.world() > 1 || cfg.loader.plan.world > 1 {
            return Err(Error::config(
                "an attached job's state resumes one consumer: attached, or a loader alone with world 1",
            ));
        }
        let state = LoaderState {
            epoch: served.epoch,
            served: 0,
        };
        let served_before = served.count();
        let loader = Loader::open_planned(ds, &cfg.loader, planner, Resume::At(state))?;
        Ok(Reader {
            kind: Kind::Resumed(
                Box::new(loader),
                Skip {
                    epoch: served.epoch,
                    bitmap: served.bitmap,
                    served_before,
                    given: 0,
                },
            ),
            epoch_len,
        })
    }

    /// An attached job's state with the samples it served this epoch (a
    /// versioned blob, [`Served::to_bytes`]), for [`open_served`](Self::open_served).
    pub fn served_state(&self) -> Result<Vec<u8>> {
        match &self.kind {
            Kind::Attached(a) => Ok(a.job.served().to_bytes(a.job.dataset())),
            _ => Err(Error::config(
                "only a job attached to a cache has a served-samples state; use checkpoint()",
            )),
        }
    }

    /// The samples a reader opened with these arguments serves per epoch,
    /// from the dataset's metadata only: starts no engine, allocates no
    /// buffers, probes no device (tf.data's cardinality).
    pub fn epoch_len_for(path: &Path, cfg: &Config) -> Result<u64> {
        let ds = Dataset::open_any(path)?;
        Ok(Planner::new(&ds.index, &cfg.loader.plan)?.geometry().steps)
    }

    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        match &mut self.kind {
            Kind::Alone(l) => l.next_batch(),
            Kind::Resumed(l, skip) => loop {
                let Some(b) = l.next_batch()? else { return Ok(None) };
                if b.epoch != skip.epoch {
                    return Ok(Some(b));
                }
                let keep: Vec<usize> = (0..b.len()).filter(|&i| !skip.has(b.ids()[i])).collect();
                skip.given += keep.len() as u64;
                if keep.len() == b.len() {
                    return Ok(Some(b));
                }
                if keep.is_empty() {
                    continue;
                }
                let ids = keep.iter().map(|&i| b.ids()[i]).collect();
                let data = keep.iter().map(|&i| b.buffers()[i].clone()).collect();
                return Ok(Some(Batch::new(b.epoch, b.dataset().clone(), ids, data)));
            },
            Kind::Node(n) => n.live()?.next_batch(),
            Kind::Attached(a) => a.job.next_batch(),
        }
    }

    /// Where this reader is (after an epoch's end: the next epoch and 0).
    pub fn state(&self) -> LoaderState {
        match &self.kind {
            Kind::Alone(l) => l.state(),
            Kind::Resumed(l, skip) => {
                let s = l.state();
                if s.epoch == skip.epoch {
                    LoaderState {
                        epoch: s.epoch,
                        served: skip.served_before + skip.given,
                    }
                } else {
                    s
                }
            }
            Kind::Node(n) => n.live.as_ref().map_or(n.start_state, NodeLoader::state),
            Kind::Attached(a) => a.job.state(),
        }
    }

    /// The state bound to the dataset and plan, to reopen with
    /// [`Resume::Checkpoint`] (or, with every rank's, [`Resume::Elastic`]).
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.checkpoint_at(self.state())
    }

    /// The checkpoint of `state`, a position this reader has been at in
    /// its current epoch: a consumer that fetches a batch ahead saves where
    /// its user is, not where the reader is. Refused where a count is not
    /// the whole state (an attached job mid-epoch).
    pub fn checkpoint_at(&self, state: LoaderState) -> Result<Checkpoint> {
        let fingerprint = match &self.kind {
            Kind::Alone(l) => l.checkpoint()?.fingerprint,
            Kind::Resumed(l, skip) => {
                if state.epoch == skip.epoch && state.served > 0 {
                    return Err(Error::InvalidState(format!(
                        "a loader resumed from an attached job's state has no count-only state until epoch {} ends",
                        skip.epoch
                    )));
                }
                l.checkpoint()?.fingerprint
            }
            Kind::Node(n) => n.fingerprint,
            Kind::Attached(a) => {
                if state.served > 0 {
                    return Err(Error::InvalidState(format!(
                        "an attached job mid-epoch ({} of epoch {} served) has no count-only state: its served samples are a bitmap (brand_cache::Attached::served), which the state blob does not hold yet",
                        state.served, state.epoch
                    )));
                }
                a.fingerprint
            }
        };
        Ok(Checkpoint { state, fingerprint })
    }

    /// Samples served per epoch.
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// Jumps to the start of `epoch`. A node can only be told where to
    /// start before it connects (every node must start at the same place);
    /// once running, only a jump to where it already is succeeds.
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        let to = LoaderState { epoch, served: 0 };
        let there = self.state() == to;
        match &mut self.kind {
            Kind::Alone(l) | Kind::Resumed(l, _) => l.start_epoch(epoch),
            Kind::Attached(a) => a.job.start_epoch(epoch),
            Kind::Node(n) if n.live.is_none() => {
                n.start = GlobalPosition { epoch, position: 0 };
                n.start_state = to;
                Ok(())
            }
            Kind::Node(_) if there => Ok(()),
            Kind::Node(_) => Err(Error::config(format!(
                "a node of a multi-node job cannot jump to epoch {epoch} on its own once it has served: close every node and open them at that epoch"
            ))),
        }
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        match &self.kind {
            Kind::Alone(l) | Kind::Resumed(l, _) => l.dataset(),
            Kind::Node(n) => &n.ds,
            Kind::Attached(a) => a.job.dataset(),
        }
    }

    /// The counters; of a node that has not connected yet, its rank and
    /// world with zero counts.
    pub fn metrics(&self) -> Metrics {
        match &self.kind {
            Kind::Alone(l) | Kind::Resumed(l, _) => l.metrics(),
            Kind::Attached(a) => a.job.metrics(),
            Kind::Node(n) => match &n.live {
                Some(l) => l.metrics(),
                None => Metrics {
                    nodes: n.cfg.nodes.world(),
                    node_rank: n.cfg.nodes.rank,
                    remote_memory_limit: n.cfg.nodes.remote_memory,
                    ..Metrics::default()
                },
            },
        }
    }
}
