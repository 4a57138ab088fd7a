//! A test tool, not shipped: an S3-compatible HTTP server on 127.0.0.1 for
//! brand's tests and benchmarks, with fault injection and server-side
//! counters.
//!
//! The S3 protocol (routing, XML, SigV4) is `s3s`; the store is `s3s-fs`'s
//! `FileSystem` (one directory per bucket, one file per object). [`Server`]
//! wraps that store in its own [`s3s::S3`] implementation which delegates
//! every operation and intercepts `GetObject` to inject the [`Faults`] and
//! count the bytes it sends ([`Stats`]). The same port answers a small admin
//! interface under `/_admin/` (see README.md) for tests that are not in Rust.

mod admin;
mod body;
mod store;

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

/// How to start a [`Server`].
#[derive(Clone, Debug)]
pub struct Options {
    /// The access key id a request must be signed with.
    pub access_key: String,
    /// The secret key a request must be signed with.
    pub secret_key: String,
    /// The port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// The region a request's signature must name (a request signed for
    /// another region gets 400 `AuthorizationHeaderMalformed`, as on S3).
    pub region: String,
    /// Serve requests without a signature (and no others): a public bucket,
    /// as a reader of `https://host/bucket/key` URLs sees one. Another
    /// server on the same directory can take signed uploads.
    pub anonymous: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            access_key: "brand-test-ak".to_owned(),
            secret_key: "brand-test-sk".to_owned(),
            port: 0,
            region: "us-east-1".to_owned(),
            anonymous: false,
        }
    }
}

/// Counters kept at the server since it started or since
/// [`Server::reset_stats`]. Only requests that passed authentication and
/// reached the store are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// GetObject requests, faulted ones included.
    pub get_requests: u64,
    /// GetObject body bytes handed to the connection.
    pub get_bytes: u64,
    /// HeadObject requests.
    pub head_requests: u64,
    /// PutObject and UploadPart requests.
    pub put_requests: u64,
    /// ListObjects and ListObjectsV2 requests.
    pub list_requests: u64,
    /// Faults that fired: failed, cut and stalled GETs (delays not counted).
    pub errors_injected: u64,
    /// Every other operation (CreateBucket, Create/Complete/AbortMultipartUpload,
    /// DeleteObject, HeadBucket, ...).
    pub other_requests: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) get_requests: AtomicU64,
    pub(crate) get_bytes: AtomicU64,
    pub(crate) head_requests: AtomicU64,
    pub(crate) put_requests: AtomicU64,
    pub(crate) list_requests: AtomicU64,
    pub(crate) errors_injected: AtomicU64,
    pub(crate) other_requests: AtomicU64,
}

impl Counters {
    fn all(&self) -> [&AtomicU64; 7] {
        [
            &self.get_requests,
            &self.get_bytes,
            &self.head_requests,
            &self.put_requests,
            &self.list_requests,
            &self.errors_injected,
            &self.other_requests,
        ]
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let [
            get_requests,
            get_bytes,
            head_requests,
            put_requests,
            list_requests,
            errors_injected,
            other_requests,
        ] = self.all().map(|c| c.load(Ordering::Relaxed));
        Stats {
            get_requests,
            get_bytes,
            head_requests,
            put_requests,
            list_requests,
            errors_injected,
            other_requests,
        }
    }

    pub(crate) fn reset(&self) {
        for c in self.all() {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
struct FaultState {
    key_filter: Option<String>,
    fail: u64,
    fail_status: u16,
    cut: u64,
    cut_after: u64,
    stall: u64,
    stall_after: u64,
    stall_all: bool,
    trickle: u64,
    trickle_after: u64,
    trickle_rate: u64,
    flip: u64,
    flip_at: u64,
    listing: Listing,
    delay_ms: u64,
}

/// How ListObjectsV2 answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Listing {
    /// As S3 does: every object with its entity tag.
    #[default]
    Tagged,
    /// Without entity tags, as s3s-fs and some S3-compatible servers list.
    Untagged,
    /// Refused (AccessDenied), as for a credential that may read objects
    /// but not list them.
    Denied,
}

/// How one GET's body is to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    Serve,
    Cut(u64),
    Stall(u64),
    /// After `after` bytes, the rest at `rate` bytes per second.
    Trickle {
        after: u64,
        rate: u64,
    },
    /// The body's byte at this offset inverted, the rest as stored.
    Flip(u64),
}

/// Faults injected into GetObject; shared with the running server, so they
/// can be changed while it runs. Counts decrement as they fire. Every fault
/// applies only to GETs whose key contains the key filter, when one is set.
///
/// A GET suffers at most one counted fault: fail when it arrives, else,
/// once its object is found (and `If-Match` holds), stall, else cut, else
/// trickle, else flip.
/// `delay_gets` and `stall_all` apply before all that.
pub struct Faults {
    state: Mutex<FaultState>,
    /// Bumped to release every stalled GET.
    release: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            state: Mutex::new(FaultState::default()),
            release: watch::Sender::new(0),
        }
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").field("state", &*self.lock()).finish()
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // A panic while holding this lock leaves plain numbers behind.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next `n` matching GETs answer an S3 error with this HTTP status:
    /// 503 `SlowDown`, 500 `InternalError`, 429 `TooManyRequests`, or any
    /// other status with the code `InjectedFault`.
    pub fn fail_gets(&self, n: u64, status: u16) {
        let mut s = self.lock();
        s.fail = n;
        s.fail_status = status;
    }

    /// The next `n` matching GETs send their headers (with the full
    /// Content-Length) and `after_bytes` of the body, then drop the
    /// connection.
    pub fn cut_bodies(&self, n: u64, after_bytes: u64) {
        let mut s = self.lock();
        s.cut = n;
        s.cut_after = after_bytes;
    }

    /// The next `n` matching GETs send their headers and `after_bytes` of the
    /// body, then nothing more, keeping the connection open until
    /// [`Faults::release_stalls`] (after which the rest is sent) or until
    /// the server is dropped.
    pub fn stall_gets(&self, n: u64, after_bytes: u64) {
        let mut s = self.lock();
        s.stall = n;
        s.stall_after = after_bytes;
    }

    /// The next `n` matching GETs send their headers and `after_bytes` of the
    /// body at full speed, then the rest at `bytes_per_sec` (at least one
    /// byte every 20 ms): slow, but never quiet long enough to
    /// look stalled.
    pub fn trickle_bodies(&self, n: u64, after_bytes: u64, bytes_per_sec: u64) {
        let mut s = self.lock();
        s.trickle = n;
        s.trickle_after = after_bytes;
        s.trickle_rate = bytes_per_sec;
    }

    /// The next `n` matching GETs send their body's byte at offset `at`
    /// inverted (a shorter body goes as stored, and counts): damage on the
    /// way, which only the records' checksums can tell.
    pub fn flip_bytes(&self, n: u64, at: u64) {
        let mut s = self.lock();
        s.flip = n;
        s.flip_at = at;
    }

    /// How listings answer from now on.
    pub fn set_listing(&self, listing: Listing) {
        self.lock().listing = listing;
    }

    pub(crate) fn listing(&self) -> Listing {
        self.lock().listing
    }

    /// While on, every matching GET stalls before answering anything (no
    /// headers) until [`Faults::release_stalls`] or the server is dropped.
    /// Turning it off does not release the GETs already stalled.
    pub fn stall_all(&self, on: bool) {
        self.lock().stall_all = on;
    }

    /// Every matching GET waits this long before answering; zero turns it off.
    pub fn delay_gets(&self, delay: Duration) {
        self.lock().delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    }

    /// Restrict every fault to GETs whose object key contains `filter`
    /// (`None`: all GETs).
    pub fn set_key_filter(&self, filter: Option<&str>) {
        self.lock().key_filter = filter.map(str::to_owned);
    }

    /// Let every GET stalled so far go on.
    pub fn release_stalls(&self) {
        self.release.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Remove every fault and the key filter, and release the stalled GETs.
    pub fn clear(&self) {
        *self.lock() = FaultState::default();
        self.release_stalls();
    }

    /// A receiver whose next change releases the GETs stalled from now on.
    pub(crate) fn stall_signal(&self) -> watch::Receiver<u64> {
        self.release.subscribe()
    }

    /// For one GET of `key` as it arrives: the delay, whether to stall
    /// before answering, whether to fail it (with this status), and whether
    /// its body is to be faulted (`take_body` then decides how). Decrements
    /// the fail count when it fires.
    pub(crate) fn take(&self, key: &str) -> (Duration, bool, Option<u16>, bool) {
        let mut s = self.lock();
        if s.key_filter.as_deref().is_some_and(|f| !key.contains(f)) {
            return (Duration::ZERO, false, None, false);
        }
        let fail = (s.fail > 0).then(|| {
            s.fail -= 1;
            s.fail_status
        });
        (Duration::from_millis(s.delay_ms), s.stall_all, fail, true)
    }

    /// For a GET that `take` let through and that found its object: how to
    /// send the body. Decrements the count of the fault it picks.
    pub(crate) fn take_body(&self) -> Plan {
        let mut s = self.lock();
        if s.stall > 0 {
            s.stall -= 1;
            Plan::Stall(s.stall_after)
        } else if s.cut > 0 {
            s.cut -= 1;
            Plan::Cut(s.cut_after)
        } else if s.trickle > 0 {
            s.trickle -= 1;
            Plan::Trickle {
                after: s.trickle_after,
                rate: s.trickle_rate,
            }
        } else if s.flip > 0 {
            s.flip -= 1;
            Plan::Flip(s.flip_at)
        } else {
            Plan::Serve
        }
    }

    /// The faults set now, as JSON (for the admin interface).
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(&*self.lock()).unwrap_or_default()
    }
}

/// State shared by the store wrapper, the admin interface and [`Server`].
pub(crate) struct Shared {
    pub(crate) faults: Faults,
    pub(crate) counters: Counters,
}

/// A running S3 server on 127.0.0.1, on its own tokio runtime and thread.
/// Dropping it stops it, and drops every open connection (stalled ones too).
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serve the buckets under `dir` (created if missing; each subdirectory
    /// is a bucket) on 127.0.0.1, port `opts.port` (0: any free one).
    pub fn start(dir: &Path, opts: Options) -> io::Result<Server> {
        std::fs::create_dir_all(dir)?;
        let store = s3s_fs::FileSystem::new(dir).map_err(|e| io::Error::other(format!("{e:?}")))?;
        let shared = Arc::new(Shared {
            faults: Faults::default(),
            counters: Counters::default(),
        });
        let service = {
            let mut b = S3ServiceBuilder::new(store::Store::new(
                store,
                dir.canonicalize()?,
                Arc::clone(&shared),
                opts.region,
            ));
            if !opts.anonymous {
                b.set_auth(SimpleAuth::from_single(opts.access_key, opts.secret_key));
            }
            b.build()
        };

        let listener = std::net::TcpListener::bind(("127.0.0.1", opts.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("brand-s3-server")
            .enable_all()
            .build()?;
        let listener = {
            let _in_rt = rt.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let (shutdown, mut stop) = oneshot::channel::<()>();
        let admin_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("brand-s3-server".to_owned())
            .spawn(move || {
                rt.block_on(async move {
                    let http = ConnBuilder::new(TokioExecutor::new());
                    loop {
                        let socket = tokio::select! {
                            r = listener.accept() => match r {
                                Ok((socket, _)) => socket,
                                // Out of descriptors and the like: back off, go on.
                                Err(_) => {
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                    continue;
                                }
                            },
                            _ = &mut stop => break,
                        };
                        let _ = socket.set_nodelay(true);
                        let svc = admin::Service::new(service.clone(), Arc::clone(&admin_shared));
                        let conn = http.serve_connection(TokioIo::new(socket), svc).into_owned();
                        tokio::spawn(async move {
                            let _ = conn.await;
                        });
                    }
                });
                // Drops every connection task, stalled ones included; the
                // timeout bounds the wait for file reads in the blocking pool.
                rt.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(Server {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The faults, changeable while it runs.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// Zero the counters.
    pub fn reset_stats(&self) {
        self.shared.counters.reset();
    }

    fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
