//! Where the cache's fill is in its own plan: the plan cursor (the reads
//! of one plan epoch after another), the reader thread's own and free of
//! I/O, so the state's choices can be tested with it alone.

use brand_plan::Planner;

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
