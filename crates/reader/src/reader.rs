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

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use brand_cache::{Attached, Served};
use brand_format::Dataset;
use brand_format::error::{Error, Result};
use brand_format::ids::IdBits;
use brand_loader::elastic::GlobalPosition;
use brand_loader::{Batch, Checkpoint, Fingerprint, Loader, LoaderState, Metrics, Resume};
use brand_plan::Planner;

use brand_nodes::NodeLoader;

use crate::Config;
use crate::decide::{Opening, decide};

pub struct Reader {
    kind: Kind,
    /// Samples this reader serves per epoch.
    epoch_len: u64,
    /// The last batches (at most [`RECENT`], oldest first) of a reader whose
    /// state is a bitmap (attached, or resumed from an attached job's
    /// state), so a position inside them can be saved: a consumer that keeps
    /// a batch ahead of its user and hands its batch out sample by sample
    /// saves where its user is.
    recent: VecDeque<LastBatch>,
}

/// Batches a position to save may lie in: the user's and one fetched ahead.
const RECENT: usize = 2;

/// A batch handed out and the reader's state before it.
struct LastBatch {
    before: LoaderState,
    ids: Vec<u64>,
}

enum Kind {
    Alone(Box<Loader>),
    /// A loader alone continuing an epoch an attached job began: the plan's
    /// order, leaving out what the job served (the plan still reads it).
    Resumed(Box<Loader>, Skip),
    Node(Box<Node>),
    Attached(Box<AttachedJob>),
}

/// The samples of `epoch` served: those before a resume from an attached
/// job's state and those handed out since.
struct Skip {
    epoch: u64,
    served: IdBits,
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
                &self.cfg.loader,
                &self.cfg.nodes,
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
    // A URL's open waits as long as its reads: the user's stall_timeout.
    let policy = cfg.loader.io.store.get_policy();
    if cfg.nodes.world() > 1 {
        brand_store::open_any_with(path, &policy)
    } else {
        brand_store::open_with(path, &policy)
    }
}

impl Reader {
    /// Opens the dataset directory `path` (made by `brand pack`) as `cfg`
    /// says, where `resume` says. A checkpoint with a bitmap (an attached
    /// job's) resumes attached again if `cfg` names a cache, else as a
    /// loader alone that serves the rest of that epoch in its plan's order,
    /// leaving out what the bitmap marks (its batches of that epoch are
    /// shorter where it does): each sample once in the epoch either way.
    pub fn open(path: &Path, cfg: &Config, resume: Resume) -> Result<Self> {
        let ds = Arc::new(open_dataset(path, cfg)?);
        let served = matches!(&resume, Resume::Checkpoint(c) if c.bitmap.is_some());
        // `run_length = "auto"` is the device's to decide for a loader
        // alone; an attached job, a node and a bitmap's resume keep their
        // plan (see `Opening`).
        let alone = cfg.loader.cache.is_none() && cfg.nodes.world() <= 1 && !served;
        let opening = if alone { Opening::Reads } else { Opening::Keeps };
        let cfg = &Config {
            loader: decide(&ds, &cfg.loader, opening)?,
            nodes: cfg.nodes.clone(),
        };
        let planner = Planner::new(&ds.index, &cfg.loader.plan)?;
        let epoch_len = planner.geometry().steps;
        let kind = match resume {
            Resume::Checkpoint(c) if c.bitmap.is_some() => Self::open_served(ds, cfg, planner, c)?,
            resume => Self::open_kind(ds, cfg, planner, resume)?,
        };
        Ok(Reader {
            kind,
            epoch_len,
            recent: VecDeque::new(),
        })
    }

    fn open_kind(ds: Arc<Dataset>, cfg: &Config, planner: Planner, resume: Resume) -> Result<Kind> {
        Ok(if let Some(socket) = &cfg.loader.cache {
            if cfg.nodes.world() > 1 {
                return Err(Error::config(
                    "cache and nodes together: a job attaches to its machine's cache or is a node of a multi-node job, not both",
                ));
            }
            let fingerprint = Fingerprint::of(&ds, &planner);
            let state = resume.start(&ds, &planner, &fingerprint)?.state;
            if state.served > 0 {
                return Err(Error::InvalidState(format!(
                    "an attached job's order depends on timing: it resumes mid-epoch only from a state with the samples it served (one an attached job saved), not from a count ({} of epoch {})",
                    state.served, state.epoch
                )));
            }
            let from = Served {
                epoch: state.epoch,
                ids: IdBits::new(ds.index.samples()),
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
        })
    }

    /// Opens where a checkpoint with a bitmap says (see [`open`](Self::open)).
    fn open_served(ds: Arc<Dataset>, cfg: &Config, planner: Planner, c: Checkpoint) -> Result<Kind> {
        let fingerprint = Fingerprint::of(&ds, &planner);
        c.check(&fingerprint, planner.geometry().steps)?;
        let epoch = c.state.epoch;
        let ids = c.bitmap.unwrap_or_else(|| IdBits::new(ds.index.samples()));
        if let Some(socket) = &cfg.loader.cache {
            let job = Attached::open(ds, &cfg.loader, socket, Served { epoch, ids })?;
            return Ok(Kind::Attached(Box::new(AttachedJob { job, fingerprint })));
        }
        if cfg.nodes.world() > 1 {
            return Err(Error::config(
                "an attached job's state resumes one consumer: attached again, or a loader alone (not a node of a multi-node job)",
            ));
        }
        let loader = Loader::open_planned(ds, &cfg.loader, planner, Resume::At(LoaderState { epoch, served: 0 }))?;
        Ok(Kind::Resumed(Box::new(loader), Skip { epoch, served: ids }))
    }

    /// The largest state blob ([`Checkpoint::to_bytes`]) this reader saves:
    /// with a bitmap when its state can be one.
    pub fn checkpoint_len(&self) -> usize {
        match &self.kind {
            Kind::Attached(_) | Kind::Resumed(..) => Checkpoint::len_with_bitmap(self.dataset().index.samples()),
            Kind::Alone(_) | Kind::Node(_) => Checkpoint::LEN,
        }
    }

    /// The samples a reader opened with these arguments serves per epoch,
    /// from the dataset's metadata only: starts no engine, allocates no
    /// buffers, probes no device (tf.data's cardinality).
    pub fn epoch_len_for(path: &Path, cfg: &Config) -> Result<u64> {
        let ds = brand_store::open_any_with(path, &cfg.loader.io.store.get_policy())?;
        Ok(Planner::new(&ds.index, &cfg.loader.plan)?.geometry().steps)
    }

    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        let before = self.state();
        let batch = self.next_of_kind()?;
        let bitmap_epoch = match &self.kind {
            Kind::Attached(_) => batch.as_ref().map(|b| b.epoch),
            Kind::Resumed(_, skip) => Some(skip.epoch),
            Kind::Alone(_) | Kind::Node(_) => None,
        };
        if let Some(b) = &batch
            && bitmap_epoch == Some(b.epoch)
        {
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(LastBatch {
                before,
                ids: b.ids().to_vec(),
            });
        }
        Ok(batch)
    }

    fn next_of_kind(&mut self) -> Result<Option<Batch>> {
        match &mut self.kind {
            Kind::Alone(l) => l.next_batch(),
            Kind::Resumed(l, skip) => loop {
                let Some(b) = l.next_batch()? else { return Ok(None) };
                if b.epoch != skip.epoch {
                    return Ok(Some(b));
                }
                let keep: Vec<usize> = (0..b.len()).filter(|&i| skip.served.insert(b.ids()[i])).collect();
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
                        served: skip.served.len(),
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
    /// Of a job attached to a cache mid-epoch (or a loader resumed from
    /// one, until that epoch ends) it carries the bitmap of the samples
    /// served: their order depends on timing, so a count is not the state.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.checkpoint_at(self.state())
    }

    /// The checkpoint of `state`, a position this reader has been at in
    /// its current epoch: a consumer that fetches a batch ahead saves where
    /// its user is, not where the reader is. Where the state is a bitmap,
    /// `state` must be now or inside one of the last 2 batches (its first
    /// `state.served - before` samples served); else `InvalidState`.
    pub fn checkpoint_at(&self, state: LoaderState) -> Result<Checkpoint> {
        let (fingerprint, bitmap) = match &self.kind {
            Kind::Alone(l) => (l.checkpoint()?.fingerprint, None),
            Kind::Node(n) => (n.fingerprint, None),
            Kind::Resumed(l, skip) => {
                let bitmap = if state.epoch == skip.epoch {
                    self.bitmap_at(state, skip.epoch, &skip.served)?
                } else {
                    None
                };
                (l.checkpoint()?.fingerprint, bitmap)
            }
            Kind::Attached(a) => {
                let served = a.job.served();
                (a.fingerprint, self.bitmap_at(state, served.epoch, &served.ids)?)
            }
        };
        Ok(Checkpoint {
            state,
            fingerprint,
            bitmap,
        })
    }

    /// The samples served at `state` (None at an epoch's start, where the
    /// count says it all), from `served`, those of `epoch` served now.
    fn bitmap_at(&self, state: LoaderState, epoch: u64, served: &IdBits) -> Result<Option<IdBits>> {
        if state.served == 0 {
            return Ok(None);
        }
        if state == self.state() && epoch == state.epoch {
            return Ok(Some(served.clone()));
        }
        let inside = self.recent.iter().position(|l| {
            l.before.epoch == state.epoch
                && (l.before.served..=l.before.served + l.ids.len() as u64).contains(&state.served)
        });
        let Some(first) = inside else {
            let (epoch, served) = (state.epoch, state.served);
            return Err(Error::InvalidState(format!(
                "{served} samples of epoch {epoch} is not where this job is nor inside its last batches: a job attached to a cache saves its served samples as they are now (or within its last batches), not at an earlier count"
            )));
        };
        let mut ids = if epoch == state.epoch {
            served.clone()
        } else {
            // The last batch ended the epoch (an attached job moves on at
            // once): every sample of it was served.
            IdBits::full(self.dataset().index.samples())
        };
        // Not served at `state`: the rest of its batch and the later
        // batches of its epoch.
        for (i, later) in self.recent.iter().enumerate().skip(first) {
            if later.before.epoch != state.epoch {
                continue;
            }
            let kept = if i == first {
                (state.served - later.before.served) as usize
            } else {
                0
            };
            for &id in &later.ids[kept..] {
                ids.remove(id);
            }
        }
        Ok(Some(ids))
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
        self.recent.clear();
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

    /// Reads ahead no further than the end of `epoch`, the last the caller
    /// takes (`None`: into the next, the default): a loader alone's
    /// [`Loader::set_last_epoch`]. A node or an attached job reads what its
    /// job reads; the hint does not change them.
    pub fn set_last_epoch(&mut self, epoch: Option<u64>) {
        if let Kind::Alone(l) | Kind::Resumed(l, _) = &mut self.kind {
            l.set_last_epoch(epoch);
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
