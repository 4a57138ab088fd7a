//! What the owner thread is told, by its own consumer (stop, abort, its
//! credit), by the network (a peer consumer attached, its credit, gone):
//! its own module, so the inbox and the network that send it and the owner
//! that receives it depend on it and not on each other.

use std::sync::Arc;

use crate::wire::{Credit, Failure, Goodbye, Push, push};

/// Whether the job failed, asked by a push stream as it ends (the node's
/// inbox records the job's first failure).
pub trait JobOutcome: Send + Sync {
    fn failure(&self) -> Option<Failure>;
}

/// The owner's side of a push stream to a consumer. Dropping it ends the
/// stream: with the job's failure if the job failed, then a goodbye. So
/// however the owner ends — even before the stream was handed to it (its
/// hello answered while the job was failing) — the consumer learns it
/// sends nothing more, and why, and names the node that failed first
/// rather than this messenger.
pub struct PushSink {
    tx: tokio::sync::mpsc::UnboundedSender<Push>,
    job: Arc<dyn JobOutcome>,
}

impl PushSink {
    pub fn new(tx: tokio::sync::mpsc::UnboundedSender<Push>, job: Arc<dyn JobOutcome>) -> Self {
        PushSink { tx, job }
    }

    /// Queues `msg`; false if the stream is gone.
    pub fn send(&self, msg: Push) -> bool {
        self.tx.send(msg).is_ok()
    }
}

impl Drop for PushSink {
    fn drop(&mut self) {
        if let Some(f) = self.job.failure() {
            let _ = self.tx.send(Push {
                body: Some(push::Body::Failed(f)),
            });
        }
        let _ = self.tx.send(Push {
            body: Some(push::Body::Goodbye(Goodbye {})),
        });
    }
}

/// What the owner thread is told.
pub enum Control {
    /// The stream to `consumer` is open (its hello was accepted).
    Attached {
        consumer: u32,
        sink: PushSink,
    },
    Credit {
        consumer: u32,
        credit: Credit,
    },
    /// `consumer` left (said goodbye, died, or never connected): nothing
    /// more is sent to it or waited for.
    Gone {
        consumer: u32,
    },
    /// The local consumer stopped in `epoch`: the peers will finish that
    /// epoch, so serve them all of it (they leave early by closing their
    /// streams), then end.
    Stop {
        epoch: u64,
    },
    /// The job failed (the local consumer saw it, or this node was
    /// aborted): tell every peer which node failed first and why, then end,
    /// so they name that node rather than this one.
    Abort(Failure),
}
