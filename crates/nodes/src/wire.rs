//! What nodes say to each other, as protobuf messages (prost derives on
//! hand-written structs: no .proto file, no protoc), and the generated gRPC
//! service `brand.nodes.Node/Push`.
//!
//! One stream per (owner, consumer) pair: the owner opens it on the
//! consumer's address and sends a [`Hello`] then [`Sample`]s in the
//! consumer's step order; the consumer answers with [`Credit`]s (which steps
//! the owner may send). The first credit accepts the hello; a refused hello
//! is a `FAILED_PRECONDITION` status naming what differs.
//!
//! The lifecycle (DESIGN.md §6): an owner that has sent all it owes says
//! [`Goodbye`] and ends its stream, a consumer that needs nothing more ends
//! its credit stream (a goodbye: the owner stops owing it), and an owner
//! that fails sends a [`Failure`] naming the node that failed first, so the
//! consumer names that node and not the messenger. A stream that breaks
//! without either is the loss of that peer, unless nothing came on it: then
//! it is an attempt its owner gave up (the answer to its hello was lost on
//! the way; the owner connects again with a higher [`Hello::attempt`]).

/// Bumped whenever a message changes meaning. 2: `Failure` names the node
/// that failed first (1 sent only a text). 3: a goodbye is a `Goodbye`
/// message (2 took a stream's clean end for one), hellos count attempts.
/// 4: a consumer credits the next epoch while in the current one (3 owners
/// kept one credit per consumer: the next epoch's replaced the current's).
pub const PROTOCOL: u32 = 4;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Push {
    #[prost(oneof = "push::Body", tags = "1, 2, 4, 5")]
    pub body: Option<push::Body>,
}

pub mod push {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "1")]
        Hello(super::Hello),
        #[prost(message, tag = "2")]
        Sample(super::Sample),
        /// The owner cannot deliver (a read failed, or the job failed):
        /// the consumer stops. (Tag 3 was protocol 1's text-only failure.)
        #[prost(message, tag = "4")]
        Failed(super::Failure),
        /// The owner has sent all it will send on this stream.
        #[prost(message, tag = "5")]
        Goodbye(super::Goodbye),
    }
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Goodbye {}

/// Why a job stopped: the node that failed first (which may be the sender,
/// or a peer it lost or heard of) and the cause.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Failure {
    #[prost(uint32, tag = "1")]
    pub node: u32,
    #[prost(string, tag = "2")]
    pub why: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Hello {
    /// The owner's node index.
    #[prost(uint32, tag = "1")]
    pub from: u32,
    /// The consumer's node index, as the owner believes it.
    #[prost(uint32, tag = "2")]
    pub to: u32,
    #[prost(message, optional, tag = "3")]
    pub job: Option<JobDigest>,
    /// This owner's connection attempt to this consumer, from 1: a later
    /// one replaces an earlier one that sent nothing (its answer was lost).
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// Everything two nodes must agree on to share an epoch: the job, the
/// dataset and the plan's configuration. Sent whole (not hashed) so a
/// mismatch can name the field.
#[derive(Clone, PartialEq, prost::Message)]
pub struct JobDigest {
    #[prost(uint32, tag = "1")]
    pub protocol: u32,
    #[prost(string, tag = "2")]
    pub job: String,
    /// crc32c of the manifest (high half) and of the index (low half).
    #[prost(fixed64, tag = "3")]
    pub dataset: u64,
    #[prost(uint64, tag = "4")]
    pub samples: u64,
    #[prost(string, tag = "5")]
    pub policy: String,
    #[prost(string, tag = "6")]
    pub memory: String,
    #[prost(uint64, tag = "7")]
    pub seed: u64,
    #[prost(uint32, tag = "8")]
    pub world: u32,
    #[prost(bool, tag = "9")]
    pub drop_last: bool,
    #[prost(string, tag = "10")]
    pub nodes: String,
    /// Where every node starts: the epoch, and the global position in it
    /// (samples of the world's sequence already served, see
    /// `NodeLoader::open_elastic`), the same on every node.
    #[prost(uint64, tag = "11")]
    pub start_epoch: u64,
    #[prost(uint64, tag = "12")]
    pub start_position: u64,
}

impl JobDigest {
    /// What differs between this node's digest (`self`) and `other`'s, one
    /// phrase per field ("seed 1 here, 2 on node 3").
    pub fn differences(&self, other: &JobDigest, other_name: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |field: &str, here: String, there: String| {
            if here != there {
                out.push(format!("{field} {here} here, {there} on {other_name}"));
            }
        };
        cmp("protocol", self.protocol.to_string(), other.protocol.to_string());
        cmp("job", format!("{:?}", self.job), format!("{:?}", other.job));
        cmp(
            "dataset fingerprint",
            format!("{:016x}", self.dataset),
            format!("{:016x}", other.dataset),
        );
        cmp("samples", self.samples.to_string(), other.samples.to_string());
        cmp("policy", self.policy.clone(), other.policy.clone());
        cmp("memory", self.memory.clone(), other.memory.clone());
        cmp("seed", self.seed.to_string(), other.seed.to_string());
        cmp("world", self.world.to_string(), other.world.to_string());
        cmp("drop_last", self.drop_last.to_string(), other.drop_last.to_string());
        cmp("nodes", format!("[{}]", self.nodes), format!("[{}]", other.nodes));
        cmp(
            "start",
            format!("epoch {} sample {}", self.start_epoch, self.start_position),
            format!("epoch {} sample {}", other.start_epoch, other.start_position),
        );
        out
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    /// The consumer's step (its serve number in the epoch).
    #[prost(uint64, tag = "2")]
    pub step: u64,
    #[prost(uint64, tag = "3")]
    pub sample: u64,
    /// The decoded bytes.
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
}

/// The owner may send the consumer's steps below `window` of `epoch`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Credit {
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    #[prost(uint64, tag = "2")]
    pub window: u64,
}

#[allow(clippy::all, clippy::pedantic)]
pub mod service {
    include!(concat!(env!("OUT_DIR"), "/brand.nodes.Node.rs"));
}
