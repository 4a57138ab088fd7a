//! What an open handle reads through: a [`Loader`] (one process, the
//! default) or a node of a multi-node job ([`NodeLoader`]), chosen by the
//! configuration (`nodes`, or the launcher's environment).
//!
//! A node connects to its peers at its first batch, not when it is opened:
//! so `brand_start_epoch` right after `brand_open` (as the TF op does for a
//! first epoch other than 0) sets where every node starts, which all nodes
//! must agree on when they connect.

use std::sync::Arc;

use brand_format::Dataset;
use brand_format::error::{Error, Result};
use brand_loader::elastic::SavedWorld;
use brand_loader::{Batch, Loader, LoaderState, Metrics, ReadGapSetting};
use brand_nodes::{Config, NodeLoader, NodeMetrics};

pub(crate) enum Reader {
    Local(Box<Loader>),
    Node(Box<Node>),
}

/// Where a node starts when it connects.
pub(crate) enum NodeStart {
    /// Every node at this state.
    At(LoaderState),
    /// Where the saved world stopped (elastic resume).
    Elastic(SavedWorld),
}

pub(crate) struct Node {
    ds: Arc<Dataset>,
    cfg: Config,
    start: NodeStart,
    /// What `state()` says before the node connects.
    start_state: LoaderState,
    live: Option<NodeLoader>,
}

impl Node {
    pub fn new(ds: Arc<Dataset>, cfg: Config, start: NodeStart, start_state: LoaderState) -> Self {
        Node {
            ds,
            cfg,
            start,
            start_state,
            live: None,
        }
    }

    fn live(&mut self) -> Result<&mut NodeLoader> {
        if self.live.is_none() {
            let node = match &self.start {
                NodeStart::At(s) => NodeLoader::open(self.ds.clone(), &self.cfg, *s)?,
                NodeStart::Elastic(saved) => NodeLoader::open_elastic(self.ds.clone(), &self.cfg, saved)?,
            };
            self.live = Some(node);
        }
        match self.live.as_mut() {
            Some(l) => Ok(l),
            None => unreachable!("set above"),
        }
    }
}

impl Reader {
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        match self {
            Reader::Local(l) => l.next_batch(),
            Reader::Node(n) => n.live()?.next_batch(),
        }
    }

    pub fn state(&self) -> LoaderState {
        match self {
            Reader::Local(l) => l.state(),
            Reader::Node(n) => n.live.as_ref().map_or(n.start_state, |l| l.state()),
        }
    }

    /// A node can only be told where to start before it connects (every
    /// node must start at the same place); once running, only a jump to
    /// where it already is succeeds.
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        match self {
            Reader::Local(l) => l.start_epoch(epoch),
            Reader::Node(n) => {
                let to = LoaderState { epoch, served: 0 };
                if n.live.is_none() {
                    n.start = NodeStart::At(to);
                    n.start_state = to;
                    return Ok(());
                }
                if self.state() == to {
                    return Ok(());
                }
                Err(Error::config(format!(
                    "a node of a multi-node job cannot jump to epoch {epoch} on its own once it has served: close every node and open them at that epoch (brand_open, brand_start_epoch, then brand_next)"
                )))
            }
        }
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        match self {
            Reader::Local(l) => l.dataset(),
            Reader::Node(n) => &n.ds,
        }
    }

    /// The loader's metrics, and a node's (zero before it connects), with its rank and world.
    pub fn metrics(&self) -> (Metrics, Option<(NodeMetrics, u32, u32)>) {
        match self {
            Reader::Local(l) => (l.metrics(), None),
            Reader::Node(n) => {
                let d = n.live.as_ref().map(NodeLoader::metrics).unwrap_or_default();
                let m = Metrics {
                    bytes_read: d.bytes_read,
                    bytes_served: d.bytes_served,
                    samples_served: d.samples_served,
                    reads_issued: d.reads_issued,
                    stalls: d.stalls,
                    stall_secs_total: d.stall_secs_total,
                    stall_max_secs: d.stall_max_secs,
                    buffered_fallback: d.buffered_fallback,
                    read_gap: match n.cfg.loader.io.read_gap {
                        ReadGapSetting::Bytes(b) => Some(b),
                        _ => None,
                    },
                    ..Metrics::default()
                };
                (m, Some((d, n.cfg.nodes.rank, n.cfg.nodes.world())))
            }
        }
    }
}
