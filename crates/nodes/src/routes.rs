//! Who reads and who serves what, per epoch: pure functions of the plan.
//!
//! Group `g` belongs to node `g mod W`: the plan's groups with the dataset
//! on shared storage, the groups a partitioned dataset was packed with
//! otherwise (the same ones when the job's budget is the pack's; if not,
//! ownership still follows where the chunks are). The plan's global epoch says which
//! position serves which sample and when the protocol reads each chunk; the
//! serving rank of position `p` is `p mod W` (step `p / W`). From that an
//! owner knows, for every record it reads, the consumer and step it goes
//! to, and a consumer knows which owner sends each of its steps.

use brand_format::error::Result;
use brand_plan::{Layout, PlanConfig, Planner};

/// Which node owns (alone reads) each chunk: groups of `group_chunks`
/// chunks, group `g` to node `g mod world`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    pub group_chunks: u64,
    pub world: u32,
    pub chunk_size: u32,
}

impl Ownership {
    /// The plan's groups (the dataset on shared storage).
    pub fn of_plan(planner: &Planner) -> Self {
        let geo = planner.geometry();
        Ownership {
            group_chunks: geo.group_size,
            world: geo.world,
            chunk_size: geo.chunk_size,
        }
    }

    /// The groups a job of `plan.world` nodes under `plan` assigns for a
    /// dataset of `layout`: what `brand pack --partitions` places on each
    /// node so that every node's chunks are on its own disk.
    pub fn of_layout(layout: Layout, plan: &PlanConfig) -> Result<Self> {
        let plan = PlanConfig {
            rank: 0,
            ..plan.clone()
        };
        Ok(Self::of_plan(&Planner::from_layout(layout, &plan)?))
    }

    pub fn owner_of_chunk(&self, chunk: u64) -> u32 {
        ((chunk / self.group_chunks.max(1)) % self.world.max(1) as u64) as u32
    }

    pub fn owner_of_sample(&self, sample: u64) -> u32 {
        self.owner_of_chunk(sample / self.chunk_size.max(1) as u64)
    }
}

/// One consumer's epoch: the sample of each step and the node that sends it.
pub struct ConsumerPlan {
    pub epoch: u64,
    pub samples: Vec<u32>,
    pub owners: Vec<u32>,
}

impl ConsumerPlan {
    pub fn new(planner: &Planner, own: &Ownership, epoch: u64, rank: u32) -> Self {
        let geo = *planner.geometry();
        let global = planner.global_epoch(epoch);
        let served = global.served();
        let (n, w) = (geo.samples, geo.world as u64);
        let samples: Vec<u32> = (0..geo.steps)
            .map(|i| served[((rank as u64 + i * w) % n) as usize])
            .collect();
        let owners = samples.iter().map(|&y| own.owner_of_sample(y as u64)).collect();
        ConsumerPlan { epoch, samples, owners }
    }

    pub fn steps(&self) -> u64 {
        self.samples.len() as u64
    }
}

/// One read an owner makes, and where each record of it goes.
pub struct OwnedRead {
    pub chunk: u64,
    pub mask: u64,
    /// `(sample, consumer, step)` for each record read.
    pub deliveries: Vec<(u64, u32, u64)>,
}

/// An owner's epoch: its reads in the protocol's time order, and for each
/// consumer the `(step, read)` pairs it sends, in step order.
pub struct OwnerPlan {
    pub epoch: u64,
    pub reads: Vec<OwnedRead>,
    pub queues: Vec<Vec<(u64, usize)>>,
}

impl OwnerPlan {
    /// `node`'s reads and pushes of `epoch`, leaving out every step below
    /// `from_step` (a resume: those were served before the restart).
    pub fn new(planner: &Planner, own: &Ownership, epoch: u64, node: u32, from_step: u64) -> Self {
        let geo = *planner.geometry();
        let global = planner.global_epoch(epoch);
        let (n, k, w) = (geo.samples, geo.chunk_size as u64, geo.world as u64);
        let served = global.served();
        let pos = global.serve_positions();
        // Positions at or beyond this are served by nobody (drop_last tail).
        let served_limit = geo.positions.min(n);
        let wanted = |p: u64| p < served_limit && p / w >= from_step;
        let mut reads = Vec::new();
        for r in global.reads() {
            let chunk = r.chunk as u64;
            if own.owner_of_chunk(chunk) != node {
                continue;
            }
            let (mut mask, mut deliveries) = (0u64, Vec::new());
            let mut bits = r.mask;
            while bits != 0 {
                let j = bits.trailing_zeros() as u64;
                bits &= bits - 1;
                let sample = chunk * k + j;
                let p = pos[sample as usize] as u64;
                if wanted(p) {
                    mask |= 1 << j;
                    deliveries.push((sample, (p % w) as u32, p / w));
                }
            }
            if mask != 0 {
                reads.push(OwnedRead {
                    chunk,
                    mask,
                    deliveries,
                });
            }
        }
        // Padding: position q ≥ N repeats the sample of q − N, read afresh.
        for q in n..geo.positions {
            let sample = served[(q - n) as usize] as u64;
            if q / w < from_step || own.owner_of_sample(sample) != node {
                continue;
            }
            reads.push(OwnedRead {
                chunk: sample / k,
                mask: 1 << (sample % k),
                deliveries: vec![(sample, (q % w) as u32, q / w)],
            });
        }
        let mut queues = vec![Vec::new(); w as usize];
        for (i, r) in reads.iter().enumerate() {
            for &(_, consumer, step) in &r.deliveries {
                queues[consumer as usize].push((step, i));
            }
        }
        for q in &mut queues {
            q.sort_unstable();
        }
        OwnerPlan { epoch, reads, queues }
    }
}
