//! Where the loader's plan events come from: the plan of each epoch, the
//! next one planned in the background while this one is read (FFCV's split
//! of the schedule from the reading).

use brand_format::error::{Error, Result};
use brand_plan::{Event, Planner};

/// A rank's plan events for one epoch.
pub type Events = Box<dyn Iterator<Item = Event> + Send>;

/// Produces this rank's plan events for `epoch`, starting after its first
/// `served` serves (a resume when `served > 0`). `warm` says memory holds
/// what the previous epoch left (this process ran it to its end); when
/// false, memory is empty.
pub type EventSource = Box<dyn FnMut(u64, u64, bool) -> Result<Events> + Send>;

/// The event source of a real plan. A plan streamed as it is taken makes
/// its events on a thread of their own, a few blocks ahead of the consumer
/// ([`Pipelined`]), so the protocol does not run on the thread that hands
/// out batches; a cut plan's events are lookups, cheaper than the hand-over
/// (4 KiB samples: 6 % fewer samples/s when those went through it too).
pub fn plan_events(mut planner: Planner) -> EventSource {
    Box::new(move |epoch, served, warm| {
        if served >= planner.geometry().steps {
            // Saved after the epoch's last serve: nothing is left of it.
            return Ok(Box::new(std::iter::empty()));
        }
        let plan = if served == 0 && warm {
            planner.epoch(epoch)
        } else {
            let position = planner.position_of_step(served);
            planner.seek(epoch, position)?
        };
        if plan.is_streamed() {
            Ok(Pipelined::spawn(Box::new(plan)))
        } else {
            Ok(Box::new(plan))
        }
    })
}

/// Events made on a thread of their own and handed over in blocks, at most
/// [`Pipelined::BLOCKS`] ahead of the consumer. Dropping it stops the thread
/// at its next block (its send fails) and frees the plan there.
pub struct Pipelined {
    blocks: std::sync::mpsc::Receiver<Vec<Event>>,
    block: std::vec::IntoIter<Event>,
}

impl Pipelined {
    /// Events a block: the channel's cost is paid once for these.
    const BLOCK: usize = 4096;
    /// Blocks made ahead of the consumer.
    const BLOCKS: usize = 4;

    /// Runs `events` on a new thread; on the caller's when none can start.
    pub fn spawn(mut events: Events) -> Events {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Event>>(Self::BLOCKS);
        // The events are moved in only once the thread runs, so that a
        // failed spawn gives them back.
        let (give, take) = std::sync::mpsc::sync_channel::<Events>(1);
        let spawned = std::thread::Builder::new()
            .name("brand-plan-events".into())
            .spawn(move || {
                let Ok(mut events) = take.recv() else { return };
                loop {
                    let block: Vec<Event> = events.by_ref().take(Self::BLOCK).collect();
                    let last = block.len() < Self::BLOCK;
                    if tx.send(block).is_err() || last {
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("plan events made on the loader's thread: cannot start a thread: {e}");
            return events;
        }
        match give.send(events) {
            Ok(()) => Box::new(Pipelined {
                blocks: rx,
                block: Vec::new().into_iter(),
            }),
            Err(std::sync::mpsc::SendError(back)) => {
                events = back;
                events
            }
        }
    }
}

impl Iterator for Pipelined {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.block.next() {
                return Some(e);
            }
            // The thread sends a short (maybe empty) last block and ends.
            self.block = self.blocks.recv().ok()?.into_iter();
            if self.block.len() == 0 {
                return None;
            }
        }
    }
}

/// A background plan: gives the source back with the events it made.
type Planning = std::thread::JoinHandle<(EventSource, Result<Events>)>;

/// The next step of the plan, as [`PlanFeed::next`] gives it.
pub(crate) enum Next {
    Event(Event),
    /// The epoch's events are all taken.
    EpochEnd,
    /// The next epoch is still being planned and the consumer has other
    /// steps to take first.
    NotYet,
}

/// Plan events epoch after epoch, each next epoch planned in the
/// background once the current one starts.
pub(crate) struct PlanFeed {
    /// `None` while lent to the planning thread.
    source: Option<EventSource>,
    /// The next epoch's events, being planned.
    planning: Option<(u64, Planning)>,
    state: FeedState,
    /// The epoch events are taken of.
    epoch: u64,
    /// The epoch the feed started at (opened or restarted), whose memory
    /// starts empty with nothing read ahead for it.
    first: u64,
    /// The last epoch the consumer will take: past its end, the next epoch
    /// starts only when asked for, never as read-ahead.
    last: Option<u64>,
}

enum FeedState {
    /// Not asked for yet: `warm` says whether memory holds the previous
    /// epoch's leftovers.
    Start {
        warm: bool,
    },
    Running(Events),
    /// The epoch's events are all taken; the next come from `planning`.
    Between,
}

impl PlanFeed {
    pub fn new(source: EventSource, epoch: u64) -> Self {
        PlanFeed {
            source: Some(source),
            planning: None,
            state: FeedState::Start { warm: true },
            epoch,
            first: epoch,
            last: None,
        }
    }

    /// Takes no step of an epoch after `last` while the consumer has other
    /// steps to take (see [`PlanFeed::next`]).
    pub fn set_last_epoch(&mut self, last: Option<u64>) {
        self.last = last;
    }

    /// The next event. `served` is what the consumer already took of
    /// `epoch` if it is the feed's (a resume); `busy` says the consumer has
    /// other steps to take, so an unfinished background plan is not waited
    /// for, nor an epoch after the last started.
    pub fn next(&mut self, consumer_epoch: u64, served: u64, busy: bool) -> Result<Next> {
        loop {
            match &mut self.state {
                FeedState::Running(events) => match events.next() {
                    Some(ev) => return Ok(Next::Event(ev)),
                    None => {
                        self.state = FeedState::Between;
                        self.epoch += 1;
                        return Ok(Next::EpochEnd);
                    }
                },
                FeedState::Start { warm } => {
                    let warm = *warm;
                    let served = if self.epoch == consumer_epoch { served } else { 0 };
                    self.start_running(warm, served)?;
                }
                FeedState::Between => {
                    let ready = self.planning.as_ref().is_none_or(|(_, h)| h.is_finished());
                    let past_last = self.last.is_some_and(|last| self.epoch > last);
                    if (!ready || past_last) && busy {
                        return Ok(Next::NotYet);
                    }
                    self.start_running(true, 0)?;
                }
            }
        }
    }

    /// Starts the feed's epoch (the background plan if it is that one, else
    /// planned now) and plans the one after it in the background.
    fn start_running(&mut self, warm: bool, served: u64) -> Result<()> {
        let epoch = self.epoch;
        let planned = match &self.planning {
            Some((e, _)) => *e == epoch && warm && served == 0,
            None => false,
        };
        let events = match self.planning.take() {
            Some((_, handle)) if planned => {
                let (source, events) = handle
                    .join()
                    .map_err(|_| Error::config("the planning thread panicked"))?;
                self.source = Some(source);
                events?
            }
            other => {
                self.planning = other;
                self.stop();
                let source = self
                    .source
                    .as_mut()
                    .ok_or_else(|| Error::config("the plan is unavailable (its thread could not start)"))?;
                source(epoch, served, warm)?
            }
        };
        self.state = FeedState::Running(events);
        self.plan_ahead(epoch + 1);
        Ok(())
    }

    /// Starts over at `epoch` with memory empty (a jump or a reset).
    pub fn restart(&mut self, epoch: u64) {
        self.stop();
        self.state = FeedState::Start { warm: false };
        self.epoch = epoch;
        self.first = epoch;
    }

    /// Whether events are taken of the epoch the feed started at.
    pub fn starting(&self) -> bool {
        self.epoch == self.first
    }

    /// Gets the source back from the planning thread (its plan is dropped).
    pub fn stop(&mut self) {
        if let Some((_, handle)) = self.planning.take()
            && let Ok((source, _)) = handle.join()
        {
            self.source = Some(source);
        }
    }

    /// In a forked child, whose planning thread is not there: leaves its
    /// handle alone rather than join a thread that does not exist.
    pub fn forget_in_child(&mut self) {
        if let Some(p) = self.planning.take() {
            std::mem::forget(p);
        }
        // Its events may come from a thread that is not here either, over a
        // channel whose lock that thread may have held at the fork.
        std::mem::forget(std::mem::replace(&mut self.state, FeedState::Between));
    }

    /// Starts planning `epoch` (from its start, memory warm) in the background.
    fn plan_ahead(&mut self, epoch: u64) {
        let Some(mut source) = self.source.take() else {
            return;
        };
        let spawned = std::thread::Builder::new().name("brand-plan".into()).spawn(move || {
            let events = source(epoch, 0, true);
            (source, events)
        });
        match spawned {
            Ok(h) => self.planning = Some((epoch, h)),
            // No thread: the source was moved into the closure that failed
            // to spawn and is lost; the next epoch reports it.
            Err(e) => tracing::warn!("cannot start the planning thread: {e}"),
        }
    }
}
