//! The fill: one thread follows the reads of the cache's own plan and
//! reads, through one [`ReadSession`], the records some job needs into the
//! shared memory (DESIGN.md §9).
//!
//! The reader follows the reads of the cache's own plan (`brand_plan`, the
//! policy, seed and run length it is configured with, over its memory),
//! epoch after epoch: Brand's fill of the abstract memory, records of many
//! chunks at Brand's fill rates. Of each planned read it reads the records
//! some job needs that are not in memory, and skips the rest; a plan epoch
//! covers every sample once, so a job's epoch is one turn of the fill from
//! wherever it joined.

use std::time::Duration;

use brand_io::ReadSession;
use brand_plan::Planner;

use crate::server::{Shared, lock};

/// Where the fill is in the cache's plan: the reads of plan epoch `epoch`
/// (chunk, records), the next at `next`. The reader thread's own: what
/// memory holds is in [`State`](crate::state::State).
pub(crate) struct Fill {
    planner: Planner,
    epoch: u64,
    reads: Vec<(u64, u64)>,
    next: usize,
}

impl Fill {
    pub(crate) fn new(planner: Planner) -> Self {
        let reads = Self::plan(&planner, 0);
        Fill {
            planner,
            epoch: 0,
            reads,
            next: 0,
        }
    }

    /// The reads of plan epoch `epoch`. A budget that holds the dataset
    /// plans no reads (everything stays): then every chunk once, whole.
    fn plan(planner: &Planner, epoch: u64) -> Vec<(u64, u64)> {
        let g = planner.geometry();
        if g.holds_all {
            let k = g.chunk_size as u64;
            return (0..g.chunks)
                .map(|c| {
                    let records = (g.samples - c * k).min(k);
                    (c, if records >= 64 { u64::MAX } else { (1 << records) - 1 })
                })
                .collect();
        }
        let global = planner.global_epoch(epoch);
        global.reads().iter().map(|r| (r.chunk as u64, r.mask)).collect()
    }

    /// The planned read at the cursor (the next plan epoch begins when one
    /// ends; `true` then).
    pub(crate) fn current(&mut self) -> ((u64, u64), bool) {
        let mut turned = false;
        while self.next >= self.reads.len() {
            self.epoch += 1;
            self.reads = Self::plan(&self.planner, self.epoch);
            self.next = 0;
            turned = true;
        }
        (self.reads[self.next], turned)
    }

    pub(crate) fn advance(&mut self) {
        self.next += 1;
    }
}

pub(crate) fn read_loop(sh: &Shared, mut session: ReadSession<()>, mut fill: Fill, depth: usize, readahead: u64) {
    let index = &sh.ds.index;
    loop {
        {
            let mut s = lock(&sh.state);
            if s.stopping.is_some() {
                break;
            }
            while s.failed.is_none() && session.in_flight() < depth && session.in_flight_read_bytes() < readahead {
                let Some((chunk, lacking)) = s.choose(index, &mut fill) else {
                    break;
                };
                let force = s.any_waiting() && session.in_flight() == 0;
                let Some(mask) = s.room_for(index, chunk, lacking, force) else {
                    break;
                };
                s.reading(index, chunk, mask);
                if mask == lacking {
                    fill.advance();
                }
                s.report.reads_issued += 1;
                for ext in session.extents(chunk, mask) {
                    if let Err(e) = session.submit(ext, ()) {
                        s.failed = Some(format!("the cache's reads failed: {e}"));
                        break;
                    }
                }
            }
            if session.in_flight() == 0 {
                let _ = sh.changed.wait_timeout(s, Duration::from_millis(100));
                continue;
            }
        }
        match session.recv() {
            Ok(((), c)) => {
                let mut s = lock(&sh.state);
                s.accept(index, &sh.memory, c);
            }
            Err(e) => {
                lock(&sh.state).failed = Some(format!("the cache's reads failed: {e}"));
            }
        }
        sh.changed.notify_all();
    }
    let _ = session.drain();
}
