//! What a node takes from a peer, checked before it is acted on: a push
//! stream's hello and every message after it (a consumer's side), a
//! consumer's credits (an owner's side). Pure functions of the messages and
//! of what this node knows, applied by the gRPC side (`net`) and the inbox,
//! and fuzzed (`fuzz/`, target `nodes`) and tested without a network.
//!
//! Every error names what was wrong with the message, in words a user can
//! act on; none of these panics, whatever the bytes said.

use std::collections::BTreeMap;

use crate::config::NodeConfig;
use crate::routes::ConsumerPlan;
use crate::wire::{Credit, Failure, Hello, JobDigest, Push, Sample, push};

/// The most of a peer's failure text kept (the rest is cut, marked `…`):
/// it goes into this node's error messages.
pub const MAX_WHY: usize = 1024;

/// Why a push stream's hello is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a hello, or not one from a node of this world to this node:
    /// only this stream is refused (`INVALID_ARGUMENT`).
    Invalid(String),
    /// Node `from` of this world, whose job digest differs from this
    /// node's: refused (`FAILED_PRECONDITION`). A hello naming this job
    /// (`same_job`) is a misconfigured peer of it, and the job fails,
    /// blamed on `from`; one of another job is only refused.
    Mismatch { from: u32, same_job: bool, why: String },
}

/// Checks the first message of a push stream (`None`: the stream ended
/// before it) against this node (`cfg`) and its job (`ours`): a hello from
/// another node of this world to this one, of the same job.
pub fn hello(first: Option<Push>, cfg: &NodeConfig, ours: &JobDigest) -> Result<Hello, Refusal> {
    let me = cfg.rank;
    let hello = match first {
        Some(Push {
            body: Some(push::Body::Hello(h)),
        }) => h,
        Some(_) => return Err(Refusal::Invalid("a push stream must start with a hello".into())),
        None => return Err(Refusal::Invalid("a push stream ended before its hello".into())),
    };
    if hello.from >= cfg.world() || hello.from == me || hello.to != me {
        return Err(Refusal::Invalid(format!(
            "{} got a hello from node {} to node {} (world {})",
            cfg.name(me),
            hello.from,
            hello.to,
            cfg.world()
        )));
    }
    let theirs = hello.job.clone().unwrap_or_default();
    let diffs = ours.differences(&theirs, &cfg.name(hello.from));
    if !diffs.is_empty() {
        return Err(Refusal::Mismatch {
            from: hello.from,
            same_job: theirs.job == ours.job,
            why: diffs.join("; "),
        });
    }
    Ok(hello)
}

/// What a message after the hello on `from`'s push stream means.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    Sample(Sample),
    /// The job failed: `node` failed first (checked to be of this world),
    /// and why, as this node words it (naming the messenger if it is
    /// another node).
    Failed {
        node: u32,
        why: String,
    },
    Goodbye,
    /// A message no owner sends: `from` is broken, and the job fails
    /// naming it and this.
    Wrong(String),
}

/// Reads a message of `from`'s push stream to this node (`cfg`), after
/// its hello.
pub fn next(m: Push, from: u32, cfg: &NodeConfig) -> Next {
    match m.body {
        Some(push::Body::Sample(s)) => Next::Sample(s),
        Some(push::Body::Failed(f)) => failed(f, from, cfg),
        Some(push::Body::Goodbye(_)) => Next::Goodbye,
        Some(push::Body::Hello(h)) => Next::Wrong(format!(
            "sent a second hello on its stream (from node {} to node {}, attempt {}): this node had accepted its first",
            h.from, h.to, h.attempt
        )),
        None => Next::Wrong("sent a push with no body (or of a kind this node does not know)".into()),
    }
}

fn failed(f: Failure, from: u32, cfg: &NodeConfig) -> Next {
    let me = cfg.rank;
    let why = clip(f.why);
    if f.node >= cfg.world() {
        return Next::Wrong(format!(
            "sent a failure of node {}, outside this job's {} nodes ({why})",
            f.node,
            cfg.world()
        ));
    }
    let from_name = cfg.name(from);
    let why = if f.node == from {
        why
    } else if f.node == me {
        format!("{why} (this node, as {from_name} reports)")
    } else {
        format!("{why} (reported by {from_name})")
    };
    Next::Failed { node: f.node, why }
}

/// `why`, at most [`MAX_WHY`] bytes of it (cut at a character).
fn clip(mut why: String) -> String {
    if why.len() > MAX_WHY {
        let mut end = MAX_WHY;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push('…');
    }
    why
}

/// Checks a sample `owner` pushed against this consumer's `plan` of its
/// epoch: the step is the plan's, its sample and owner are the plan's,
/// it comes in order (`next_from`: the smallest step the owner may send
/// next) and within the credit granted (steps below `window`), and its
/// bytes measure what the index says (`len` of a sample id). The error is
/// the owner's failure.
pub fn sample(
    m: &Sample,
    owner: u32,
    plan: &ConsumerPlan,
    next_from: u64,
    window: u64,
    len: impl Fn(u64) -> u64,
) -> Result<(), String> {
    let bad = |why: String| {
        format!(
            "sent a bad push (epoch {}, step {}, sample {}): {why}",
            m.epoch, m.step, m.sample
        )
    };
    let at = usize::try_from(m.step).ok();
    match at.and_then(|i| Some((plan.samples.get(i)?, plan.owners.get(i)?))) {
        Some((&y, &o)) if y as u64 == m.sample && o == owner => {}
        Some((&y, &o)) => {
            return Err(bad(format!("the plan serves sample {y} from node {o} at that step")));
        }
        None => return Err(bad(format!("the epoch has {} steps", plan.steps()))),
    }
    if m.step < next_from {
        return Err(bad(format!(
            "out of order or repeated (expected step {next_from} or later)"
        )));
    }
    if m.step >= window {
        return Err(bad(format!("beyond the credit granted (steps below {window})")));
    }
    let want = len(m.sample);
    if m.data.len() as u64 != want {
        return Err(bad(format!("{} bytes, the index says {want}", m.data.len())));
    }
    Ok(())
}

/// One consumer's credits on one push stream, as its owner takes them: a
/// consumer credits its current epoch and the next, windows that only
/// grow, never past the epoch's `steps`, and never an epoch before the
/// one the job starts at or two before one it credited already. What
/// repeats a window is no news (not passed on), so a flood of credits
/// costs the owner nothing; what breaks these rules is the consumer's
/// failure, named.
#[derive(Debug, Clone)]
pub struct CreditCheck {
    start_epoch: u64,
    steps: u64,
    /// The windows of the last two epochs credited.
    windows: BTreeMap<u64, u64>,
}

impl CreditCheck {
    /// For a job that starts at `start_epoch`, of `steps` steps per epoch.
    pub fn new(start_epoch: u64, steps: u64) -> Self {
        CreditCheck {
            start_epoch,
            steps,
            windows: BTreeMap::new(),
        }
    }

    /// Takes `c`: whether it is news (a window larger than the epoch's
    /// last), or what is wrong with it.
    pub fn take(&mut self, c: Credit) -> Result<bool, String> {
        let bad = |why: String| format!("sent a bad credit (epoch {}, steps below {}): {why}", c.epoch, c.window);
        if c.window > self.steps {
            return Err(bad(format!("an epoch has {} steps", self.steps)));
        }
        if c.epoch < self.start_epoch {
            return Err(bad(format!("the job starts at epoch {}", self.start_epoch)));
        }
        let newest = self.windows.keys().next_back().copied();
        if let Some(newest) = newest
            && c.epoch.saturating_add(1) < newest
        {
            return Err(bad(format!(
                "after crediting epoch {newest} (a consumer credits its current epoch and the next)"
            )));
        }
        let last = self.windows.entry(c.epoch).or_insert(0);
        let news = c.window > *last;
        *last = (*last).max(c.window);
        // Only the last two epochs can be credited again.
        while self.windows.len() > 2 {
            self.windows.pop_first();
        }
        Ok(news)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Goodbye;

    fn cfg(world: usize, rank: u32) -> NodeConfig {
        NodeConfig {
            nodes: (0..world).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect(),
            rank,
            remote_memory: 1 << 20,
            peer_timeout: std::time::Duration::from_secs(1),
            job: "j".into(),
            last_epoch: None,
        }
    }

    fn digest() -> JobDigest {
        JobDigest {
            protocol: crate::wire::PROTOCOL,
            job: "j".into(),
            seed: 1,
            world: 3,
            ..Default::default()
        }
    }

    fn hello_push(from: u32, to: u32, job: JobDigest) -> Push {
        Push {
            body: Some(push::Body::Hello(Hello {
                from,
                to,
                job: Some(job),
                attempt: 1,
            })),
        }
    }

    #[test]
    fn a_hello_from_outside_the_world_or_to_another_node_is_refused_naming_both() {
        let c = cfg(3, 0);
        assert!(hello(Some(hello_push(1, 0, digest())), &c, &digest()).is_ok());
        for (from, to) in [(3, 0), (u32::MAX, 0), (0, 0), (1, 2)] {
            assert_eq!(
                hello(Some(hello_push(from, to, digest())), &c, &digest()),
                Err(Refusal::Invalid(format!(
                    "node 0 (127.0.0.1:7000) got a hello from node {from} to node {to} (world 3)"
                )))
            );
        }
        let sample = Push {
            body: Some(push::Body::Sample(Sample::default())),
        };
        assert_eq!(
            hello(Some(sample), &c, &digest()),
            Err(Refusal::Invalid("a push stream must start with a hello".into()))
        );
        assert_eq!(
            hello(None, &c, &digest()),
            Err(Refusal::Invalid("a push stream ended before its hello".into()))
        );
    }

    #[test]
    fn a_hello_of_another_configuration_names_the_field_and_fails_only_its_own_job() {
        let c = cfg(3, 0);
        let seed = JobDigest { seed: 2, ..digest() };
        assert_eq!(
            hello(Some(hello_push(2, 0, seed)), &c, &digest()),
            Err(Refusal::Mismatch {
                from: 2,
                same_job: true,
                why: "seed 1 here, 2 on node 2 (127.0.0.1:7002)".into()
            })
        );
        let other = JobDigest {
            job: "k".into(),
            ..digest()
        };
        assert!(matches!(
            hello(Some(hello_push(2, 0, other)), &c, &digest()),
            Err(Refusal::Mismatch { same_job: false, .. })
        ));
        let none = Push {
            body: Some(push::Body::Hello(Hello {
                from: 1,
                to: 0,
                job: None,
                attempt: 1,
            })),
        };
        assert!(matches!(
            hello(Some(none), &c, &digest()),
            Err(Refusal::Mismatch { .. })
        ));
    }

    #[test]
    fn what_follows_a_hello_is_named_and_a_failure_outside_the_world_is_the_messengers() {
        let c = cfg(3, 0);
        let m = |body| Push { body: Some(body) };
        assert_eq!(next(m(push::Body::Goodbye(Goodbye {})), 1, &c), Next::Goodbye);
        assert_eq!(
            next(hello_push(1, 0, digest()), 1, &c),
            Next::Wrong(
                "sent a second hello on its stream (from node 1 to node 0, attempt 1): this node had accepted its first"
                    .into()
            )
        );
        assert!(matches!(next(Push { body: None }, 1, &c), Next::Wrong(w) if w.contains("no body")));
        let f = |node, why: &str| next(m(push::Body::Failed(Failure { node, why: why.into() })), 1, &c);
        assert_eq!(
            f(1, "disk"),
            Next::Failed {
                node: 1,
                why: "disk".into()
            }
        );
        assert_eq!(
            f(0, "x"),
            Next::Failed {
                node: 0,
                why: "x (this node, as node 1 (127.0.0.1:7001) reports)".into()
            }
        );
        assert_eq!(
            f(2, "x"),
            Next::Failed {
                node: 2,
                why: "x (reported by node 1 (127.0.0.1:7001))".into()
            }
        );
        assert_eq!(
            f(7, "x"),
            Next::Wrong("sent a failure of node 7, outside this job's 3 nodes (x)".into())
        );
        let long = "é".repeat(MAX_WHY);
        let Next::Failed { why, .. } = f(1, &long) else {
            panic!("a failure");
        };
        assert_eq!(why.len(), MAX_WHY + '…'.len_utf8());
        assert!(why.ends_with('…'));
    }

    #[test]
    fn a_sample_out_of_the_plan_order_or_credit_is_named() {
        let plan = ConsumerPlan {
            epoch: 4,
            samples: vec![10, 11, 12, 13],
            owners: vec![1, 2, 1, 1],
        };
        let s = |step, sample, len: usize| Sample {
            epoch: 4,
            step,
            sample,
            data: vec![0; len],
        };
        let check = |m: &Sample, next_from| sample(m, 1, &plan, next_from, 3, |y| y);
        assert_eq!(check(&s(0, 10, 10), 0), Ok(()));
        assert_eq!(
            check(&s(u64::MAX, 10, 10), 0),
            Err("sent a bad push (epoch 4, step 18446744073709551615, sample 10): the epoch has 4 steps".into())
        );
        assert_eq!(
            check(&s(1, 11, 11), 0),
            Err(
                "sent a bad push (epoch 4, step 1, sample 11): the plan serves sample 11 from node 2 at that step"
                    .into()
            )
        );
        assert_eq!(
            check(&s(0, u64::MAX, 10), 0),
            Err(
                "sent a bad push (epoch 4, step 0, sample 18446744073709551615): the plan serves sample 10 from node 1 at that step"
                    .into()
            )
        );
        assert_eq!(
            check(&s(0, 10, 10), 1),
            Err(
                "sent a bad push (epoch 4, step 0, sample 10): out of order or repeated (expected step 1 or later)"
                    .into()
            )
        );
        assert_eq!(
            check(&s(3, 13, 13), 0),
            Err("sent a bad push (epoch 4, step 3, sample 13): beyond the credit granted (steps below 3)".into())
        );
        assert_eq!(
            check(&s(2, 12, 99), 0),
            Err("sent a bad push (epoch 4, step 2, sample 12): 99 bytes, the index says 12".into())
        );
    }

    #[test]
    fn credits_past_the_epoch_or_back_in_time_are_named_and_repeats_are_no_news() {
        let mut c = CreditCheck::new(5, 100);
        let credit = |epoch, window| Credit { epoch, window };
        assert_eq!(c.take(credit(5, 10)), Ok(true));
        assert_eq!(c.take(credit(5, 10)), Ok(false), "a repeat");
        assert_eq!(c.take(credit(5, 4)), Ok(false), "a smaller window");
        assert_eq!(c.take(credit(6, 1)), Ok(true));
        assert_eq!(c.take(credit(5, 100)), Ok(true));
        assert_eq!(
            c.take(credit(5, 101)),
            Err("sent a bad credit (epoch 5, steps below 101): an epoch has 100 steps".into())
        );
        assert_eq!(
            c.take(credit(4, 1)),
            Err("sent a bad credit (epoch 4, steps below 1): the job starts at epoch 5".into())
        );
        assert_eq!(c.take(credit(7, 1)), Ok(true));
        assert_eq!(
            c.take(credit(5, 100)),
            Err(
                "sent a bad credit (epoch 5, steps below 100): after crediting epoch 7 (a consumer credits its current epoch and the next)"
                    .into()
            )
        );
        // A flood over ever later epochs keeps two.
        for e in 8..10_000 {
            assert_eq!(c.take(credit(e, 1)), Ok(true));
        }
        assert_eq!(c.windows.len(), 2);
        assert_eq!(c.take(credit(u64::MAX, 1)), Ok(true));
        assert!(c.take(credit(9_999, 2)).is_err());
    }
}
