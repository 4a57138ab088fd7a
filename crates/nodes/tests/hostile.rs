//! Peers that speak the push protocol wrongly on purpose, over gRPC on
//! 127.0.0.1. A stranger's stream (a hello from outside the world, to
//! another node, of another job, a second hello for a node already
//! connected, no hello at all) is refused with a status naming what was
//! wrong, while the job's honest nodes finish their epochs. A member of
//! the job that sends a message no node sends (a second hello on its
//! stream, a step or a sample out of the plan, a message past any bound, a
//! failure of a node outside the world, a credit past the epoch after a
//! flood of credits) fails the job with an error naming it and what it
//! sent, while another job running beside it finishes. Every wait is
//! bounded.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_loader::elastic::GlobalPosition;
use brand_nodes::NodeLoader;
use brand_nodes::wire::service::node_client::NodeClient;
use brand_nodes::wire::service::node_server::{Node, NodeServer};
use brand_nodes::wire::{Credit, Failure, Hello, JobDigest, Push, Sample, push};
use common::Config;

mod common;
use common::{Served, addresses, assert_ranks_serve_their_plans, node_config, serve_epochs};

const SAMPLES: u64 = 300;
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long anything here may take (two loaded cores).
const BOUND: Duration = Duration::from_secs(30);

fn dataset(root: &std::path::Path) -> Arc<Dataset> {
    Arc::new(Dataset::open(small_dataset(root, SAMPLES).expect("gen and pack")).expect("open"))
}

fn config(nodes: &[String], rank: u32, job: &str) -> Config {
    let mut cfg = node_config(nodes, rank, job);
    cfg.nodes.peer_timeout = TIMEOUT;
    cfg
}

/// The digest node `rank` of `cfg`'s job says hello with.
fn digest(ds: &Dataset, cfg: &Config) -> JobDigest {
    brand_nodes::job_digest(ds, &cfg.loader, &cfg.nodes, GlobalPosition { epoch: 0, position: 0 })
}

fn hello_push(from: u32, to: u32, job: JobDigest, attempt: u32) -> Push {
    Push {
        body: Some(push::Body::Hello(Hello {
            from,
            to,
            job: Some(job),
            attempt,
        })),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Opens a push stream to `addr` (retrying while nothing listens there
/// yet, unless `gone` says nothing will) and sends `msgs`; the answer to
/// its hello, and the sender that keeps the stream open.
async fn push_to(
    addr: &str,
    msgs: Vec<Push>,
    gone: impl Fn() -> bool,
) -> Option<(Result<(), Status>, mpsc::UnboundedSender<Push>)> {
    let deadline = Instant::now() + BOUND;
    let channel = loop {
        match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(_) if gone() => return None,
            Err(e) => {
                assert!(Instant::now() < deadline, "{addr}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    for m in msgs {
        tx.send(m).expect("queued");
    }
    let mut client = NodeClient::new(channel).max_encoding_message_size(64 << 20);
    let answer = tokio::time::timeout(BOUND, client.push(UnboundedReceiverStream::new(rx)))
        .await
        .expect("an answer in time");
    Some((answer.map(|_| ()), tx))
}

/// Two honest nodes of `job` serving 2 epochs, with `meanwhile` run once
/// both have opened (and so connected) and before they serve their second
/// epoch: both serve their plans, each sample once per epoch.
fn honest_job(ds: &Arc<Dataset>, job: &str, meanwhile: impl FnOnce(&[String])) {
    let nodes = addresses(2);
    let cfgs: Vec<Config> = (0..2).map(|r| config(&nodes, r, job)).collect();
    let opened = Arc::new(Barrier::new(3));
    let started = Instant::now();
    let served: Vec<Served> = std::thread::scope(|scope| {
        let ranks: Vec<_> = cfgs
            .iter()
            .map(|cfg| {
                let (ds, cfg, opened) = (ds.clone(), cfg.clone(), opened.clone());
                scope.spawn(move || {
                    let mut l = NodeLoader::open(ds, &cfg.loader, &cfg.nodes, LoaderState::default())
                        .expect("honest node opens");
                    let mut s = serve_epochs(&mut l, 1).expect("first epoch");
                    opened.wait();
                    opened.wait();
                    s.extend(serve_epochs(&mut l, 1).expect("second epoch"));
                    l.close();
                    s
                })
            })
            .collect();
        opened.wait();
        meanwhile(&nodes);
        opened.wait();
        ranks.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let refs: Vec<&Served> = served.iter().collect();
    assert_ranks_serve_their_plans(&refs, &cfgs, ds, SAMPLES);
    assert!(started.elapsed() < BOUND + BOUND, "took {:?}", started.elapsed());
}

#[test]
fn strangers_streams_are_refused_naming_what_is_wrong_while_the_jobs_nodes_finish() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    honest_job(&ds, "honest", |nodes| {
        let ours = digest(&ds, &config(nodes, 1, "honest"));
        let other = digest(&ds, &config(nodes, 1, "stranger"));
        let node0 = format!("node 0 ({})", nodes[0]);
        let sample = Push {
            body: Some(push::Body::Sample(Sample::default())),
        };
        let cases = [
            (
                vec![hello_push(7, 0, ours.clone(), 1)],
                tonic::Code::InvalidArgument,
                format!("{node0} got a hello from node 7 to node 0 (world 2)"),
            ),
            (
                vec![hello_push(1, 1, ours.clone(), 1)],
                tonic::Code::InvalidArgument,
                format!("{node0} got a hello from node 1 to node 1 (world 2)"),
            ),
            (
                vec![hello_push(0, 0, ours.clone(), 1)],
                tonic::Code::InvalidArgument,
                format!("{node0} got a hello from node 0 to node 0 (world 2)"),
            ),
            (
                vec![sample],
                tonic::Code::InvalidArgument,
                "a push stream must start with a hello".into(),
            ),
            (
                vec![hello_push(1, 0, other, 1)],
                tonic::Code::FailedPrecondition,
                format!(
                    "{node0} refuses the push: job \"honest\" here, \"stranger\" on node 1 ({})",
                    nodes[1]
                ),
            ),
            // Node 1 is connected and its first attempt is current: a
            // second hello as node 1 (an attempt not after it) is refused.
            (
                vec![hello_push(1, 0, ours.clone(), 1)],
                tonic::Code::AlreadyExists,
                format!("node 1 ({}) is already connected", nodes[1]),
            ),
            (
                vec![hello_push(1, 0, ours, 0)],
                tonic::Code::AlreadyExists,
                format!("node 1 ({}) is already connected", nodes[1]),
            ),
        ];
        let rt = runtime();
        for (msgs, code, want) in cases {
            let (answer, _open) = rt.block_on(push_to(&nodes[0], msgs, || false)).expect("node 0 is up");
            let status = answer.expect_err("refused");
            assert_eq!((status.code(), status.message()), (code, want.as_str()));
        }
    });
}

/// Node 1 of a 2-node job, played by the test: it answers node 0's push
/// stream with `credits`, and keeps it open until node 0 ends it.
struct Played {
    credits: Vec<Credit>,
}

#[tonic::async_trait]
impl Node for Played {
    type PushStream = UnboundedReceiverStream<Result<Credit, Status>>;

    async fn push(&self, request: Request<Streaming<Push>>) -> Result<Response<Self::PushStream>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        for c in &self.credits {
            let _ = tx.send(Ok(*c));
        }
        let mut stream = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(_)) = stream.message().await {}
            drop(tx);
        });
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }
}

/// Node 0 honest, node 1 played by the test: node 1's server answers with
/// `credits`, its push stream to node 0 says hello and then `then`. Node
/// 0's error (opening or serving), which must come within the bound, and
/// how it names node 1.
fn node0_against_played(ds: &Arc<Dataset>, credits: Vec<Credit>, then: Vec<Push>) -> (String, String) {
    let nodes = addresses(2);
    let cfg0 = config(&nodes, 0, "played");
    let ours = digest(ds, &config(&nodes, 1, "played"));
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&nodes[1]))
        .expect("node 1's address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(NodeServer::new(Played { credits }))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let started = Instant::now();
    let ds0 = ds.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let node0_done = done.clone();
    let node0 = std::thread::spawn(move || {
        let r = NodeLoader::open(ds0, &cfg0.loader, &cfg0.nodes, LoaderState::default()).and_then(|mut l| {
            while l.next_batch()?.is_some() {}
            Ok(())
        });
        node0_done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    });
    let mut msgs = vec![hello_push(1, 0, ours, 1)];
    msgs.extend(then);
    // The stream ends after what was queued on it. Node 0 may have failed
    // (a bad credit) and gone before it connects.
    let gone = || done.load(std::sync::atomic::Ordering::SeqCst);
    drop(rt.block_on(push_to(&nodes[0], msgs, gone)));
    let e = match node0.join().expect("node 0") {
        Ok(()) => "no error".to_string(),
        Err(e) => e.to_string(),
    };
    let _ = stop.send(());
    assert!(started.elapsed() < BOUND, "took {:?}: {e}", started.elapsed());
    (e, format!("node 1 ({}): ", nodes[1]))
}

#[test]
fn a_member_that_sends_what_no_node_sends_is_named_while_another_job_finishes() {
    let t = tempfile::tempdir().expect("tempdir");
    let ds = dataset(t.path());
    let largest = (0..SAMPLES)
        .map(|id| ds.index.stored_len(id) as usize)
        .max()
        .unwrap_or(0);
    let sample = |step, sample, len| Push {
        body: Some(push::Body::Sample(Sample {
            epoch: 0,
            step,
            sample,
            data: vec![0; len],
        })),
    };
    let cases: Vec<(Vec<Credit>, Vec<Push>, &str)> = vec![
        (
            vec![],
            vec![hello_push(1, 0, JobDigest::default(), 2)],
            "sent a second hello on its stream (from node 1 to node 0, attempt 2)",
        ),
        (
            vec![],
            vec![sample(u64::MAX, 0, 10)],
            "sent a bad push (epoch 0, step 18446744073709551615, sample 0): the epoch has 150 steps",
        ),
        (
            vec![],
            vec![sample(0, u64::MAX, 10)],
            "sample 18446744073709551615): the plan serves sample",
        ),
        (
            vec![],
            vec![sample(0, 0, largest + (64 << 10) + 1)],
            "sent a malformed push: Error, decoded message length too large",
        ),
        (
            vec![],
            vec![Push {
                body: Some(push::Body::Failed(Failure {
                    node: 7,
                    why: "x".repeat(32 << 10),
                })),
            }],
            "sent a failure of node 7, outside this job's 2 nodes (xxx",
        ),
        (vec![], vec![Push { body: None }], "sent a push with no body"),
        (
            std::iter::repeat_n(Credit { epoch: 0, window: 1 }, 100_000)
                .chain([Credit { epoch: 0, window: 151 }])
                .collect(),
            vec![],
            "sent a bad credit (epoch 0, steps below 151): an epoch has 150 steps",
        ),
        (
            vec![
                Credit { epoch: 0, window: 1 },
                Credit { epoch: 5, window: 1 },
                Credit { epoch: 0, window: 2 },
            ],
            vec![],
            "sent a bad credit (epoch 0, steps below 2): after crediting epoch 5",
        ),
    ];
    std::thread::scope(|scope| {
        let other = scope.spawn(|| honest_job(&ds, "beside", |_| {}));
        // Every case runs; the assertion lists those that went wrong.
        let wrong: Vec<String> = cases
            .into_iter()
            .map(|(credits, then, want)| (node0_against_played(&ds, credits, then), want))
            .filter(|((e, node1), want)| !e.contains(want) || !e.contains(node1.as_str()) || e.len() > 4096)
            .map(|((e, node1), want)| format!("wanted {node1:?} and {want:?} in {:.300}", e))
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
        other.join().expect("the other job");
    });
}
