//! The gRPC side of a node: a server on this node's own address that takes
//! owners' push streams into the inbox, and one client stream to every
//! other node that carries this node's pushes. Deadlines: connecting,
//! the hello and every silence are bounded by `peer_timeout`; HTTP/2
//! keepalive notices a peer that stops answering.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use brand_format::error::{Error, Result};

use crate::check::{self, CreditCheck, Next, Refusal};
use crate::config::NodeConfig;
use crate::control::{Control, PushSink};
use crate::inbox::{CreditSink, Inbox};
use crate::wire::service::node_client::NodeClient;
use crate::wire::service::node_server::{Node, NodeServer};
use crate::wire::{Credit, Hello, JobDigest, Push, push};

/// How often idle connections are pinged.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// Pause between connection attempts to a peer that is not up yet.
const RETRY: Duration = Duration::from_millis(50);

/// Fault injection for tests (`brand_nodes::lose_first_hello_answers`):
/// every push stream drops the answer to its first hello, as a connection
/// that breaks between the peer's accepting it and the answer's arrival
/// does, and tries again.
pub(crate) static LOSE_FIRST_ANSWER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The running transport; dropping it closes every connection.
pub struct Net {
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    /// This node's push streams; each ends once its consumer has read
    /// everything sent (or the peer is gone).
    streams: Vec<tokio::task::JoinHandle<()>>,
    /// How long closing waits for them.
    timeout: Duration,
    inbox: Arc<Inbox>,
}

pub struct Ctx {
    pub cfg: Arc<NodeConfig>,
    pub digest: JobDigest,
    pub inbox: Arc<Inbox>,
    pub control: crossbeam_channel::Sender<Control>,
    /// Largest message (a sample plus framing).
    pub max_message: usize,
    /// Steps of every consumer's epoch (what a credit may grant).
    pub steps: u64,
}

impl Net {
    /// Listens on this node's address and starts a push stream to every peer.
    pub fn start(ctx: Ctx) -> Result<Net> {
        let ctx = Arc::new(ctx);
        let me = ctx.cfg.rank;
        let addr = ctx.cfg.nodes[me as usize].clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("brand-nodes")
            // A write to a peer that has closed its connection fails with
            // EPIPE, which the node reports, instead of killing the process.
            .on_thread_start(brand_store::runtime::block_sigpipe)
            .enable_all()
            .build()
            .map_err(|e| Error::io("<brand-nodes runtime>", e))?;
        // Bound here, synchronously, so a taken port is an error from open().
        let listener = std::net::TcpListener::bind(&addr)
            .map_err(|e| Error::config(format!("{}: cannot listen: {e}", ctx.cfg.name(me))))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("<listener>", e))?;
        let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
        let service = NodeServer::new(Service { ctx: ctx.clone() })
            .max_decoding_message_size(ctx.max_message)
            .max_encoding_message_size(ctx.max_message);
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| Error::io("<listener>", e))?;
            let incoming = TcpListenerStream::new(listener);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .tcp_nodelay(true)
                    .http2_keepalive_interval(Some(KEEPALIVE))
                    .http2_keepalive_timeout(Some(ctx.cfg.peer_timeout))
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = on_shutdown.await;
                    }),
            );
            Ok::<(), Error>(())
        })?;
        let streams = (0..ctx.cfg.world())
            .filter(|&peer| peer != me)
            .map(|peer| runtime.spawn(push_stream(ctx.clone(), peer)))
            .collect();
        Ok(Net {
            runtime: Some(runtime),
            shutdown: Some(shutdown),
            streams,
            timeout: ctx.cfg.peer_timeout,
            inbox: ctx.inbox.clone(),
        })
    }

    /// Closes after every push stream has delivered what was queued on it
    /// (the owner has ended, so each stream is at its end) and every peer's
    /// stream to this node has ended (this consumer said goodbye or failed,
    /// so each peer ends it), waiting at most `peer_timeout` for each.
    pub fn close(mut self) {
        self.wait_pushes_ended();
        self.inbox.wait_streams_ended(self.timeout);
    }

    /// Waits, at most `peer_timeout`, until every push stream of this node
    /// has ended: its peer ended the credit stream (it left or failed, after
    /// reading what was queued before: the owner has ended, so a failure
    /// was queued ahead of the end) or is gone. Once only: later calls
    /// return at once.
    pub fn wait_pushes_ended(&mut self) {
        let streams = std::mem::take(&mut self.streams);
        if let Some(rt) = &self.runtime {
            rt.block_on(async {
                let _ = tokio::time::timeout(self.timeout, async {
                    for s in streams {
                        let _ = s.await;
                    }
                })
                .await;
            });
        }
    }
}

impl Drop for Net {
    /// Closes at once (what is still queued is lost, as in a crash).
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// This node's pushes to `peer`: connect (retrying until `peer_timeout`),
/// say hello, hand the stream to the owner, then pass credits on. However
/// it ends, the owner is told `peer` is gone, so a stopping owner never
/// waits for a peer it cannot reach.
async fn push_stream(ctx: Arc<Ctx>, peer: u32) {
    push_stream_until_gone(&ctx, peer).await;
    let _ = ctx.control.send(Control::Gone { consumer: peer });
}

async fn push_stream_until_gone(ctx: &Arc<Ctx>, peer: u32) {
    let cfg = &ctx.cfg;
    let timeout = cfg.peer_timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{}", cfg.nodes[peer as usize])) {
        Ok(e) => e
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(timeout)
            .keep_alive_while_idle(true),
        Err(e) => return ctx.inbox.fail(peer, format!("bad address: {e}")),
    };
    // Connect and say hello until the peer answers, refuses, or the
    // deadline passes. A connection that breaks before the answer is a
    // peer not up yet behind something that accepted for it (a proxy, a
    // load balancer, a relay: the connection succeeds, then resets), and is
    // retried as a refused connection is.
    let mut last = String::new();
    let silent = |last: &str| {
        let why = if last.is_empty() {
            String::new()
        } else {
            format!(" (last: {last})")
        };
        format!("did not answer within {timeout:?}{why}")
    };
    let mut attempt = 0u32;
    let (tx, mut credits) = loop {
        attempt += 1;
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => {
                let cause = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
                last = format!("{e} {cause}").trim().to_string();
                if tokio::time::Instant::now() + RETRY >= deadline {
                    return ctx.inbox.fail(peer, format!("unreachable for {timeout:?}: {last}"));
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let hello = Push {
            body: Some(push::Body::Hello(Hello {
                from: cfg.rank,
                to: peer,
                job: Some(ctx.digest.clone()),
                attempt,
            })),
        };
        let _ = tx.send(hello);
        let mut client = NodeClient::new(channel)
            .max_decoding_message_size(ctx.max_message)
            .max_encoding_message_size(ctx.max_message);
        match tokio::time::timeout_at(deadline, client.push(UnboundedReceiverStream::new(rx))).await {
            Ok(Ok(_)) if attempt == 1 && LOSE_FIRST_ANSWER.load(std::sync::atomic::Ordering::Relaxed) => {
                last = "the answer was lost (fault injection)".into();
                tokio::time::sleep(RETRY).await;
            }
            Ok(Ok(r)) => break (tx, r.into_inner()),
            Ok(Err(status)) if broke_before_answer(&status) => {
                last = status.message().to_string();
                if tokio::time::Instant::now() + RETRY >= deadline {
                    return ctx.inbox.fail(peer, silent(&last));
                }
                tokio::time::sleep(RETRY).await;
            }
            Ok(Err(status)) => {
                return ctx.inbox.fail(peer, format!("refused this node: {}", status.message()));
            }
            Err(_) => return ctx.inbox.fail(peer, silent(&last)),
        }
    };
    // If the owner has ended already, the sink comes back and is dropped
    // here: the stream ends with the job's failure, if any, and a goodbye.
    let _ = ctx.control.send(Control::Attached {
        consumer: peer,
        sink: PushSink::new(tx, ctx.inbox.clone()),
    });
    ctx.inbox.outbound_ready(peer);
    // Ends when the consumer says goodbye (it needs nothing more: it read
    // all of our stream, or it closed or failed) or dies: its own stream to
    // us tells our consumer if it died. Drained until then: dropping it
    // early could cut off samples still queued. Only news reaches the
    // owner; a credit no consumer sends fails the job, naming the peer.
    let mut check = CreditCheck::new(ctx.digest.start_epoch, ctx.steps);
    while let Ok(Some(credit)) = credits.message().await {
        match check.take(credit) {
            Ok(true) => {
                let _ = ctx.control.send(Control::Credit { consumer: peer, credit });
            }
            Ok(false) => {}
            Err(why) => return ctx.inbox.fail(peer, why),
        }
    }
}

/// The hello's call ended without the peer's answer (the connection broke,
/// was reset or cancelled, or was not HTTP/2): not a refusal, which is a
/// status the peer's service chose (see `Service::push`).
fn broke_before_answer(status: &Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Cancelled
    )
}

struct Service {
    ctx: Arc<Ctx>,
}

#[tonic::async_trait]
impl Node for Service {
    type PushStream = UnboundedReceiverStream<Result<Credit, Status>>;

    /// An owner's push stream to this node: check its hello, grant credit,
    /// and take its samples into the inbox.
    async fn push(&self, request: Request<Streaming<Push>>) -> Result<Response<Self::PushStream>, Status> {
        let ctx = self.ctx.clone();
        let cfg = &ctx.cfg;
        let mut stream = request.into_inner();
        let first = tokio::time::timeout(cfg.peer_timeout, stream.message()).await;
        let first = match first {
            Ok(Ok(m)) => m,
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(Status::deadline_exceeded("no hello")),
        };
        let me = cfg.rank;
        let hello = match check::hello(first, cfg, &ctx.digest) {
            Ok(h) => h,
            Err(Refusal::Invalid(why)) => return Err(Status::invalid_argument(why)),
            Err(Refusal::Mismatch { from, same_job, why }) => {
                // A push for the same job from a misconfigured peer stops
                // this job; one for another job is only refused.
                if same_job {
                    ctx.inbox.fail(from, format!("does not match this node: {why}"));
                }
                return Err(Status::failed_precondition(format!(
                    "{} refuses the push: {why}",
                    cfg.name(me)
                )));
            }
        };
        let from = hello.from;
        let attempt = hello.attempt;
        let (tx, rx) = mpsc::unbounded_channel();
        ctx.inbox
            .attach(from, attempt, CreditSink::Remote(tx))
            .map_err(Status::already_exists)?;
        let inbox = ctx.inbox.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            loop {
                match stream.message().await {
                    Ok(Some(m)) => match check::next(m, from, &ctx.cfg) {
                        Next::Sample(s) => {
                            if let Err(e) = inbox.deliver(from, attempt, s) {
                                inbox.fail(from, e);
                                break;
                            }
                        }
                        // The job failed: name the node that failed first;
                        // the messenger only if it is another.
                        Next::Failed { node, why } => {
                            inbox.fail(node, why);
                            break;
                        }
                        Next::Goodbye => {
                            inbox.closed(from, attempt);
                            break;
                        }
                        Next::Wrong(why) => {
                            inbox.fail(from, why);
                            break;
                        }
                    },
                    // Ended without a goodbye: an attempt the owner gave up.
                    Ok(None) => {
                        inbox.abandoned(from, attempt);
                        break;
                    }
                    // Undecodable bytes, or a length past any push's
                    // (refused before its body is buffered): the peer is
                    // broken, whatever is due.
                    Err(s) if matches!(s.code(), tonic::Code::Internal | tonic::Code::OutOfRange) => {
                        inbox.fail(from, format!("sent a malformed push: {}", s.message()));
                        break;
                    }
                    Err(s) => {
                        inbox.lost(from, attempt, format!("connection lost ({})", s.message()));
                        break;
                    }
                }
            }
            inbox.stream_ended(from, attempt);
        });
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }
}
