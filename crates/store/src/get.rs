//! One ranged GET, made to survive object storage: every attempt bounded by
//! a stall timeout (no byte for that long, not a total; a body is allowed
//! far less silence once first bytes have been timed), retried with
//! jittered exponential backoff on 5xx, 429, broken connections and stalls,
//! a cut body resumed from the byte it stopped at (never started over), a
//! hedged second GET when the first byte is slower than nearly all GETs so
//! far, a body far slower than the GETs before it dropped and its rest
//! asked for again (a connection that trickles never stalls), and every
//! request pinned with `If-Match` to the entity tag the
//! object had when the dataset was opened, so a replaced object is an
//! error rather than a mix of two datasets. After the retries, the error
//! names the object, the byte range and the last status.
//!
//! Each GET tells its [`Limiter`] how it went (a throttle; its bytes and
//! first byte); [`GetCounters`] counts requests, bytes, retries by cause,
//! hedges and latencies for the loader's metrics.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use brand_format::error::{Error, Result};
use futures_util::StreamExt;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStoreExt};

use crate::connect::{Connection, redact};
use crate::limiter::Limiter;

/// How GETs are retried and bounded.
#[derive(Debug, Clone)]
pub struct GetPolicy {
    /// An attempt that receives nothing (headers or body bytes) for this long
    /// fails; once first bytes are timed, sooner ([`QUIET_FACTOR`]).
    pub stall: Duration,
    /// Attempts after the first, per GET.
    pub retries: u32,
    /// The first backoff; each retry doubles it (jittered), up to `backoff_max`.
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// Hedge: a second GET when the first byte is slower than this at
    /// least, and than the slowest 1 % of first bytes so far.
    pub hedge_min: Duration,
    /// A body that, after `slow_after` of it, has come this many times
    /// slower than the median pace of recent GETs is dropped and its rest
    /// asked for again (a new connection: the slow one is closed).
    pub slow_factor: u32,
    pub slow_after: Duration,
}

/// An attempt that brought at least this much (or the rest) before its
/// connection broke or was dropped as slow made progress: its failure does
/// not count against the retries, so a store that cuts every connection
/// after some megabytes still delivers a large GET.
const PROGRESS: usize = 64 << 10;

/// Bodies of at least this size set the pace slow bodies are judged by
/// (smaller ones are mostly their first byte).
const PACE_MIN_BYTES: usize = 64 << 10;

/// How many recent bodies the pace is the median of.
const PACE_WINDOW: usize = 64;

/// A body that sends nothing for this many times the slowest 1 % of first
/// bytes (at least `slow_after`) is dropped and its rest asked for again:
/// a connection that went silent mid-body would otherwise hold its GET, and
/// the batch waiting on it, for the whole stall timeout. Bytes of a body
/// that flows come far closer together than a request's first byte.
const QUIET_FACTOR: u32 = 8;

/// How often a silent body's allowance is looked at again (it shrinks
/// once enough first bytes have been timed, as at a start).
const QUIET_TICK: Duration = Duration::from_millis(250);

/// A request sent before any first byte was timed (a dataset's open, a
/// start) is hedged after this: an object store answers far sooner, and
/// a connection that is never answered held an open for the whole stall
/// timeout (10 s behind `bench/fault_proxy.py --fault blackhole`).
const UNTIMED_HEDGE: Duration = Duration::from_secs(1);

impl Default for GetPolicy {
    fn default() -> Self {
        GetPolicy {
            stall: Duration::from_secs(10),
            retries: 10,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            hedge_min: Duration::from_millis(50),
            slow_factor: 16,
            slow_after: Duration::from_secs(1),
        }
    }
}

/// What the GETs of a reader did, counted as they happen.
#[derive(Debug, Default)]
pub struct GetCounters {
    /// Requests sent: GETs, their retries, resumes and hedges, and HEADs.
    requests: AtomicU64,
    /// Body bytes received.
    bytes: AtomicU64,
    retries: AtomicU64,
    hedges: AtomicU64,
    hedges_won: AtomicU64,
    /// Retries by cause: a status ("503"), "connect", "reset", "stall", "cut",
    /// "slow", and "crc" (bytes fetched again because a record was damaged).
    causes: Mutex<BTreeMap<String, u64>>,
    /// Whole GETs (first request to last byte) and first bytes, in µs.
    latency: Histogram,
    first_byte: Histogram,
    /// The recent bodies' ns per byte, and their median once there are 16
    /// (0 before): the pace a slow body is judged against. Recent, not
    /// all: a path that slows down for good sets a new pace.
    paces: Mutex<VecDeque<u64>>,
    pace_median: AtomicU64,
    /// When a retry was last told ([`GetCounters::retrying`]).
    warned: Mutex<Option<Instant>>,
}

/// At most one retry warning per reader in this long: a store that
/// throttles hundreds of GETs at once says so once, not hundreds of times.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A snapshot of [`GetCounters`] and the limiter.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GetReport {
    pub requests: u64,
    pub bytes: u64,
    pub retries: u64,
    pub retries_by_cause: BTreeMap<String, u64>,
    pub hedges: u64,
    pub hedges_won: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub first_byte_p50_ms: f64,
    pub in_flight_limit: u64,
}

impl GetCounters {
    pub fn report(&self, limiter: Option<&Limiter>) -> GetReport {
        GetReport {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            retries_by_cause: self.causes.lock().map(|c| c.clone()).unwrap_or_default(),
            hedges: self.hedges.load(Ordering::Relaxed),
            hedges_won: self.hedges_won.load(Ordering::Relaxed),
            latency_p50_ms: self.latency.quantile(0.5) / 1e3,
            latency_p99_ms: self.latency.quantile(0.99) / 1e3,
            first_byte_p50_ms: self.first_byte.quantile(0.5) / 1e3,
            in_flight_limit: limiter.map_or(0, |l| l.limit() as u64),
        }
    }

    /// Counts a retry of `cause`.
    pub fn retried(&self, cause: &str) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut c) = self.causes.lock() {
            *c.entry(cause.to_string()).or_default() += 1;
        }
    }

    /// Counts a retry of a request to `url` and says why, at most every
    /// [`WARN_EVERY`]: before, a wrong endpoint or a store refusing every
    /// request was 20 s of silence before its error (10 retries with
    /// backoff); bodies resumed after they were cut or dropped as slow are
    /// only counted (they made progress, and a proxy may cut every one).
    fn retrying(&self, url: &str, f: &Failure) {
        self.retried(&f.cause);
        if f.cause == "cut" || f.cause == "slow" {
            return;
        }
        let Ok(mut warned) = self.warned.lock() else { return };
        if warned.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        *warned = Some(Instant::now());
        let retries = self.retries.load(Ordering::Relaxed);
        tracing::warn!(
            "{url}: {}: retrying ({retries} retr{} by this reader so far)",
            f.what,
            if retries == 1 { "y" } else { "ies" }
        );
    }

    /// One body's pace: `bytes` in `took` from its first byte.
    fn paced(&self, bytes: usize, took: Duration) {
        let ns_per_byte = u64::try_from(took.as_nanos() / bytes.max(1) as u128).unwrap_or(u64::MAX);
        let Ok(mut recent) = self.paces.lock() else { return };
        if recent.len() == PACE_WINDOW {
            recent.pop_front();
        }
        recent.push_back(ns_per_byte);
        if recent.len() >= 16 {
            let mut sorted = Vec::from_iter(recent.iter().copied());
            let mid = sorted.len() / 2;
            let (_, median, _) = sorted.select_nth_unstable(mid);
            self.pace_median.store((*median).max(1), Ordering::Relaxed);
        }
    }

    /// The slowest 1 % of first bytes, once 50 have been timed.
    fn first_byte_p99(&self) -> Option<Duration> {
        if self.first_byte.count() < 50 {
            return None;
        }
        Some(Duration::from_micros(self.first_byte.quantile(0.99) as u64))
    }

    /// How long an answer may take before a hedge: the slowest 1 % of first
    /// bytes so far, [`UNTIMED_HEDGE`] before 50 were timed; at least `min`.
    fn hedge_after(&self, min: Duration) -> Duration {
        self.first_byte_p99().unwrap_or(UNTIMED_HEDGE).max(min)
    }

    /// How long a body may send nothing: [`QUIET_FACTOR`] × the slowest 1 %
    /// of first bytes, at least `slow_after`, doubled for each failed
    /// attempt of the GET (a path slow for good gets more patience, not a
    /// failed GET), at most the stall timeout; the stall timeout until 50
    /// first bytes have been timed.
    fn quiet_after(&self, p: &GetPolicy, attempt: u32) -> Duration {
        let Some(p99) = self.first_byte_p99() else {
            return p.stall;
        };
        let doubled = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        p99.saturating_mul(QUIET_FACTOR)
            .max(p.slow_after)
            .saturating_mul(doubled)
            .min(p.stall)
    }
}

/// A log-linear histogram of µs: 8 buckets per power of two.
#[derive(Debug)]
struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..Self::BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Histogram {
    const BUCKETS: usize = 16 + 40 * 8;

    fn index(us: u64) -> usize {
        if us < 16 {
            return us as usize;
        }
        let e = 63 - us.leading_zeros() as usize; // ≥ 4
        let sub = ((us >> (e - 3)) & 7) as usize;
        (16 + (e - 4) * 8 + sub).min(Self::BUCKETS - 1)
    }

    /// The smallest value of bucket `i`.
    fn low(i: usize) -> f64 {
        if i < 16 {
            return i as f64;
        }
        let (e, sub) = ((i - 16) / 8 + 4, (i - 16) % 8);
        ((8 + sub) as f64) * (1u64 << (e - 3)) as f64
    }

    fn record(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        self.buckets[Self::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The `q` quantile in µs (the middle of its bucket); 0 when empty.
    fn quantile(&self, q: f64) -> f64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return (Self::low(i) + Self::low(i + 1)) / 2.0;
            }
        }
        Self::low(Self::BUCKETS - 1)
    }
}

/// Why one attempt failed.
#[derive(Debug)]
struct Failure {
    /// For the counters: a status ("503"), "connect", "tls", "reset", "stall", "cut", "slow", "range".
    cause: String,
    retryable: bool,
    kind: std::io::ErrorKind,
    what: String,
}

impl Failure {
    fn new(cause: impl Into<String>, retryable: bool, kind: std::io::ErrorKind, what: impl Into<String>) -> Self {
        Failure {
            cause: cause.into(),
            retryable,
            kind,
            what: what.into(),
        }
    }

    fn throttle(&self) -> bool {
        self.cause == "503" || self.cause == "429"
    }
}

/// What an object_store error means here. Its text names the request (no
/// credentials: they travel in headers, and query strings are redacted).
fn classify(e: &object_store::Error) -> Failure {
    use std::io::ErrorKind as K;
    let text = redact(&e.to_string());
    let code = s3_code(&text);
    let with_code = |what: &str| match &code {
        Some(c) => format!("{what} ({c})"),
        None => what.to_string(),
    };
    match e {
        object_store::Error::NotFound { .. } => {
            let what = if text.contains("NoSuchBucket") {
                "the bucket does not exist"
            } else {
                "no such object"
            };
            Failure::new("404", false, K::NotFound, with_code(what))
        }
        object_store::Error::Precondition { .. } => Failure::new(
            "412",
            false,
            K::InvalidData,
            "the object changed since the dataset was opened (its entity tag differs)",
        ),
        // A server that ignores Range (a plain HTTP file server) or answers
        // other bytes than asked will do so every time.
        object_store::Error::NotSupported { .. } => Failure::new(
            "range",
            false,
            K::Unsupported,
            "the server does not answer byte ranges (HTTP Range; it sent the whole object): \
             brand reads a dataset only from a server that does",
        ),
        _ if text.contains("non-partial response")
            || text.contains("Content-Range")
            || text.contains("CONTENT_RANGE")
            || (text.contains("Requested ") && text.contains(", got ")) =>
        {
            Failure::new(
                "range",
                false,
                K::InvalidData,
                format!("the store answered other bytes than the range asked for: {text}"),
            )
        }
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => Failure::new(
            "403",
            false,
            K::PermissionDenied,
            with_code("access refused: check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, …)"),
        ),
        _ => {
            let status = http_status(&text).or_else(|| {
                if text.contains("SlowDown") {
                    Some(503)
                } else if text.contains("InternalError") {
                    Some(500)
                } else {
                    None
                }
            });
            match status {
                Some(401 | 403) => Failure::new(
                    "403",
                    false,
                    K::PermissionDenied,
                    with_code("access refused: check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, …)"),
                ),
                Some(s) => {
                    // 501 and 505 say what the server cannot do, every time.
                    let retryable = (s >= 500 && s != 501 && s != 505) || s == 429 || s == 408;
                    // A HEAD's answer has no body to name the cause: S3 answers a
                    // request signed for another region than the bucket's 400
                    // (AuthorizationHeaderMalformed) or 301.
                    let hint = match (s, code.as_deref()) {
                        (400, None | Some("AuthorizationHeaderMalformed")) | (301, _) => {
                            "; with S3, most often AWS_REGION is not the bucket's region"
                        }
                        _ => "",
                    };
                    Failure::new(
                        s.to_string(),
                        retryable,
                        K::Other,
                        format!("{}{hint}", with_code(&format!("the store answered {s}"))),
                    )
                }
                None => {
                    // object_store's text stops at "error sending request":
                    // the cause (refused, DNS, TLS, reset) is further down.
                    let text = redact(&with_sources(e));
                    if let Some(hint) = tls_refused(&text) {
                        Failure::new("tls", false, K::InvalidData, format!("{text}: {hint}"))
                    } else if refused(e) {
                        Failure::new("connect", true, K::ConnectionRefused, text)
                    } else {
                        Failure::new("reset", true, K::ConnectionReset, text)
                    }
                }
            }
        }
    }
}

/// What went wrong in a request, as a message names it: the cause found
/// under object_store's text (refused, DNS, TLS) and what to check.
pub(crate) fn describe(e: &object_store::Error) -> String {
    classify(e).what
}

/// What to do about a TLS handshake that failed (rustls's words in
/// `text`), or `None` for another failure. It fails the same way every
/// time, so it is not retried: before, ten retries took 20 s to say
/// "UnknownIssuer" under a cause of "reset".
fn tls_refused(text: &str) -> Option<&'static str> {
    if text.contains("invalid peer certificate") {
        Some(
            "the server's TLS certificate is not trusted; one a private authority signed needs that \
             authority's certificate named: AWS_CA_BUNDLE=FILE (s3://) or SSL_CERT_FILE=FILE (any URL)",
        )
    } else if [
        "received corrupt message",
        "received fatal alert",
        "peer is incompatible",
        "peer misbehaved",
    ]
    .iter()
    .any(|m| text.contains(m))
    {
        Some(
            "no TLS handshake with the server; one that serves plain HTTP is named http:// \
             (with AWS_ALLOW_HTTP=true or GOOGLE_ALLOW_HTTP=true)",
        )
    } else {
        None
    }
}

/// An error's text followed by each of its sources' that adds to it.
fn with_sources(e: &(dyn std::error::Error + 'static)) -> String {
    chain(e).skip(1).fold(e.to_string(), |text, s| {
        let more = s.to_string();
        if text.contains(&more) {
            text
        } else {
            format!("{text}: {more}")
        }
    })
}

/// An error and its sources, outermost first.
fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |s| s.source())
}

/// Whether a connection could not be made at all (refused, or no such host).
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    chain(e).any(|s| {
        s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| matches!(io.kind(), K::ConnectionRefused | K::HostUnreachable))
            || s.to_string().contains("dns error")
    })
}

/// The HTTP status in object_store's "status code: 503 …" text.
fn http_status(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// An S3 error code (`<Code>SlowDown</Code>`) in a message.
fn s3_code(text: &str) -> Option<String> {
    let start = text.find("<Code>")? + "<Code>".len();
    let end = text[start..].find("</Code>")? + start;
    Some(text[start..end].to_string())
}

/// A jittered backoff: uniform in [d/2, d] with d = first · 2^attempt ≤ max.
fn backoff(p: &GetPolicy, attempt: u32) -> Duration {
    let d = p
        .backoff
        .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX))
        .min(p.backoff_max);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let frac = (nanos.wrapping_mul(2654435761) % 1000) as f64 / 1000.0;
    d.mul_f64(0.5 + frac / 2.0)
}

/// The object's size and entity tag (HEAD), retried as a GET is.
pub async fn head(conn: &Connection, name: &str, p: &GetPolicy, counters: &GetCounters) -> Result<ObjectMeta> {
    let path = conn.url.object(name);
    let mut attempt = 0;
    loop {
        let request = || -> Request<'_, ObjectMeta> {
            counters.requests.fetch_add(1, Ordering::Relaxed);
            Box::pin(conn.store.head(&path))
        };
        let failure = match answered(counters, p, attempt, request).await {
            Ok(meta) => return Ok(meta),
            Err(failure) => failure,
        };
        if !failure.retryable || attempt >= p.retries {
            return Err(object_error(&conn.url.object_url(name), None, &failure, attempt));
        }
        counters.retrying(&conn.url.object_url(name), &failure);
        tokio::time::sleep(backoff(p, attempt)).await;
        attempt += 1;
    }
}

/// The objects under `prefix` (the key prefix, without its trailing `/`;
/// empty: the bucket's root), retried as a GET is: with `recursive`, every
/// object below it; without, those directly under it and the names of the
/// prefixes one level down (a directory's files and subdirectories).
pub async fn list(
    conn: &Connection,
    prefix: &str,
    recursive: bool,
    p: &GetPolicy,
    counters: &GetCounters,
) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
    use futures_util::TryStreamExt;
    let at = (!prefix.is_empty()).then(|| object_store::path::Path::from(prefix));
    let mut attempt = 0;
    loop {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let listing = async {
            if recursive {
                let objects: Vec<ObjectMeta> = conn.store.list(at.as_ref()).try_collect().await?;
                Ok((objects, Vec::new()))
            } else {
                let l = conn.store.list_with_delimiter(at.as_ref()).await?;
                let prefixes = l.common_prefixes.iter().map(|p| p.as_ref().to_string()).collect();
                Ok((l.objects, prefixes))
            }
        };
        // Pages of a long listing each answer within the stall timeout; the
        // whole listing gets one per thousand objects it may hold.
        let r = tokio::time::timeout(p.stall.saturating_mul(8), listing).await;
        let failure = match r {
            Ok(Ok(listing)) => return Ok(listing),
            Ok(Err(e)) => {
                let e: object_store::Error = e;
                if e.to_string().contains("NoSuchBucket") {
                    Failure::new(
                        "404",
                        false,
                        std::io::ErrorKind::NotFound,
                        format!("the bucket {} does not exist", conn.url.bucket()),
                    )
                } else {
                    classify(&e)
                }
            }
            Err(_) => Failure::new(
                "stall",
                true,
                std::io::ErrorKind::TimedOut,
                format!("no listing in {:?}", p.stall.saturating_mul(8)),
            ),
        };
        // `prefix` is a key prefix from the bucket's root, not the URL's.
        let url = if prefix.is_empty() {
            conn.url.root.clone()
        } else {
            format!("{}/{prefix}", conn.url.root)
        };
        if !failure.retryable || attempt >= p.retries {
            return Err(object_error(&url, None, &failure, attempt));
        }
        counters.retrying(&url, &failure);
        tokio::time::sleep(backoff(p, attempt)).await;
        attempt += 1;
    }
}

/// The whole object `name` (HEAD, then GETs pinned to its entity tag).
pub async fn get_whole(
    conn: &Connection,
    name: &str,
    p: &GetPolicy,
    counters: &GetCounters,
    limiter: &std::sync::Arc<Limiter>,
) -> Result<(Vec<u8>, ObjectMeta)> {
    let meta = head(conn, name, p, counters).await?;
    let buf = get_version_held(conn, name, &meta, p, counters, limiter).await?;
    Ok((buf, meta))
}

/// [`get_version`] into a buffer of its own: an error naming the object,
/// not an abort, when its size is more than can be allocated.
pub async fn get_version_held(
    conn: &Connection,
    name: &str,
    meta: &ObjectMeta,
    p: &GetPolicy,
    counters: &GetCounters,
    limiter: &std::sync::Arc<Limiter>,
) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    usize::try_from(meta.size)
        .ok()
        .and_then(|n| buf.try_reserve_exact(n).ok().map(|()| buf.resize(n, 0)))
        .ok_or_else(|| {
            let too_large = format!("{} bytes: more than this process can allocate", meta.size);
            Error::io(conn.url.object_url(name), std::io::Error::other(too_large))
        })?;
    get_version(conn, name, meta, &mut buf, p, counters, limiter).await?;
    Ok(buf)
}

/// Parts a whole object is fetched in, at once (as many as the limiter
/// lets): an index of tens of millions of samples is hundreds of MB, which
/// one connection (~90 MB/s on S3) takes seconds for.
pub const WHOLE_PART: usize = 8 << 20;

/// The whole object `name` as `meta` (from a HEAD) describes it, pinned to
/// its entity tag, into `dst` (exactly its size), in [`WHOLE_PART`]s, each
/// holding a place in flight.
pub async fn get_version(
    conn: &Connection,
    name: &str,
    meta: &ObjectMeta,
    dst: &mut [u8],
    p: &GetPolicy,
    counters: &GetCounters,
    limiter: &std::sync::Arc<Limiter>,
) -> Result<()> {
    use futures_util::TryStreamExt;
    assert_eq!(dst.len() as u64, meta.size, "{name} into a buffer of {}", dst.len());
    let parts = dst.chunks_mut(WHOLE_PART).enumerate().map(|(i, dst)| async move {
        let _permit = limiter.acquire().await;
        let from = (i * WHOLE_PART) as u64;
        let range = from..from + dst.len() as u64;
        get_into(conn, name, range, meta.e_tag.as_deref(), dst, p, counters, limiter).await
    });
    futures_util::stream::iter(parts)
        // The limiter bounds the parts in flight; this, the parts waiting.
        .buffer_unordered(crate::limiter::AUTO_MAX)
        .try_collect::<()>()
        .await
}

/// Bytes `range` of object `name` into `dst` (exactly their length),
/// pinned to `e_tag` when given. The caller holds the GET's place in
/// flight ([`Limiter::acquire`]) for the whole GET, its retries included;
/// `limiter` hears how it went (throttled, succeeded).
#[allow(clippy::too_many_arguments)]
pub async fn get_into(
    conn: &Connection,
    name: &str,
    range: Range<u64>,
    e_tag: Option<&str>,
    dst: &mut [u8],
    p: &GetPolicy,
    counters: &GetCounters,
    limiter: &Limiter,
) -> Result<()> {
    assert_eq!(
        dst.len() as u64,
        range.end - range.start,
        "GET of {range:?} into a buffer of {}",
        dst.len()
    );
    let path = conn.url.object(name);
    let started = Instant::now();
    // `attempt`: the failed attempts that made no progress, which the
    // retries bound; `retried`: all of them.
    let (mut done, mut attempt, mut retried, mut first_byte) = (0usize, 0u32, 0u32, None);
    while done < dst.len() {
        let from = range.start + done as u64;
        let into = &mut dst[done..];
        let rest = into.len();
        let (got, failure) = attempt_once(
            conn,
            &path,
            from..range.end,
            e_tag,
            into,
            p,
            counters,
            attempt,
            &mut first_byte,
        )
        .await;
        done += got;
        let Some(failure) = failure else { continue };
        if failure.throttle() {
            limiter.throttled();
        }
        // A stall took `stall` already: it always counts, or a store that
        // stalls after every 64 KiB would hold a GET for len / 64 KiB stalls.
        let progress = failure.cause != "stall" && got >= PROGRESS.min(rest);
        if !failure.retryable || (!progress && attempt >= p.retries) {
            return Err(object_error(
                &conn.url.object_url(name),
                Some(&range),
                &failure,
                retried,
            ));
        }
        counters.retrying(&conn.url.object_url(name), &failure);
        retried += 1;
        // Progress made: the store is answering, so resume at once.
        if !progress {
            if got == 0 {
                tokio::time::sleep(backoff(p, attempt)).await;
            }
            attempt += 1;
        }
    }
    counters.latency.record(started.elapsed());
    limiter.succeeded(dst.len() as u64, first_byte, started.elapsed());
    Ok(())
}

/// A request to the store, made again for a hedge.
type Request<'a, T> = futures_util::future::BoxFuture<'a, object_store::Result<T>>;

/// The answer (the headers) to a request, attempt `attempt` of its GET or
/// HEAD: hedged with a second one when the first has not answered in
/// [`GetCounters::hedge_after`], the first answer taken; a stall once
/// neither answered in [`GetCounters::quiet_after`]. Both are looked at
/// again every [`QUIET_TICK`]: a request sent before first bytes were
/// timed is bounded by them as soon as they are.
async fn answered<'a, T>(
    counters: &GetCounters,
    p: &GetPolicy,
    attempt: u32,
    request: impl Fn() -> Request<'a, T>,
) -> std::result::Result<T, Failure> {
    use futures_util::future::{Either, select};
    let asked = Instant::now();
    let mut first = request();
    let mut hedge: Option<Request<'a, T>> = None;
    loop {
        let quiet = counters.quiet_after(p, attempt);
        let hedge_after = hedge.is_none().then(|| counters.hedge_after(p.hedge_min));
        let until = hedge_after.map_or(quiet, |h| h.min(quiet));
        let answer = async {
            match hedge.as_mut() {
                None => (first.as_mut().await, false),
                Some(second) => match select(first.as_mut(), second.as_mut()).await {
                    Either::Left((r, _)) => (r, false),
                    Either::Right((r, _)) => (r, true),
                },
            }
        };
        let tick = until.saturating_sub(asked.elapsed()).min(QUIET_TICK);
        match tokio::time::timeout(tick, answer).await {
            Ok((r, hedge_won)) => {
                if hedge_won {
                    counters.hedges_won.fetch_add(1, Ordering::Relaxed);
                }
                return r.map_err(|e| classify(&e));
            }
            Err(_) if asked.elapsed() >= quiet => {
                let what = format!("no answer in {:.1?}", asked.elapsed());
                return Err(Failure::new("stall", true, std::io::ErrorKind::TimedOut, what));
            }
            Err(_) => {
                if hedge_after.is_some_and(|h| asked.elapsed() >= h) {
                    counters.hedges.fetch_add(1, Ordering::Relaxed);
                    hedge = Some(request());
                }
            }
        }
    }
}

/// One request for `range` into `dst`, the GET's attempt number `attempt`
/// (failed attempts without progress before it): how many bytes it
/// brought, and why it stopped short if it did; `first_byte` is set when
/// its headers came.
#[allow(clippy::too_many_arguments)]
async fn attempt_once(
    conn: &Connection,
    path: &object_store::path::Path,
    range: Range<u64>,
    e_tag: Option<&str>,
    dst: &mut [u8],
    p: &GetPolicy,
    counters: &GetCounters,
    attempt: u32,
    first_byte: &mut Option<Duration>,
) -> (usize, Option<Failure>) {
    use std::io::ErrorKind as K;
    let opts = GetOptions {
        range: Some(GetRange::Bounded(range.clone())),
        if_match: e_tag.map(str::to_string),
        ..Default::default()
    };
    let request = || -> Request<'_, object_store::GetResult> {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        Box::pin(conn.store.get_opts(path, opts.clone()))
    };
    let asked = Instant::now();
    let result = match answered(counters, p, attempt, request).await {
        Ok(r) => r,
        Err(failure) => return (0, Some(failure)),
    };
    let waited = asked.elapsed();
    counters.first_byte.record(waited);
    *first_byte = Some(waited);
    if let (Some(want), Some(got)) = (e_tag, result.meta.e_tag.as_deref())
        && want != got
    {
        let what = "the object changed since the dataset was opened (its entity tag differs)";
        return (0, Some(Failure::new("412", false, K::InvalidData, what)));
    }
    if result.range.start != range.start {
        let what = format!(
            "the store answered bytes from {} for a GET from {}",
            result.range.start, range.start
        );
        return (0, Some(Failure::new("range", false, K::InvalidData, what)));
    }
    let mut body = result.into_stream();
    let mut got = 0usize;
    let body_started = Instant::now();
    // The pace is judged over windows of `slow_after`, so a body that turns
    // slow halfway is caught as soon as one that starts slow.
    let mut window = (body_started, 0usize);
    // When the last bytes (or the headers) came.
    let mut heard = body_started;
    loop {
        let quiet = counters.quiet_after(p, attempt);
        let left = quiet.saturating_sub(heard.elapsed());
        // `next()` is cancel-safe: a tick that ends it loses no bytes.
        match tokio::time::timeout(left.min(QUIET_TICK), body.next()).await {
            Err(_) if heard.elapsed() < quiet => continue,
            Err(_) => {
                let what = format!(
                    "the body stalled for {:.1?} at byte {}",
                    heard.elapsed(),
                    range.start + got as u64
                );
                return (got, Some(Failure::new("stall", true, K::TimedOut, what)));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                let what = format!(
                    "the body broke at byte {}: {}",
                    range.start + got as u64,
                    redact(&e.to_string())
                );
                return (got, Some(Failure::new("cut", true, K::UnexpectedEof, what)));
            }
            Ok(Some(Ok(bytes))) => {
                let Some(into) = dst.get_mut(got..got + bytes.len()) else {
                    let what = format!("the store sent more than the {} bytes asked for", dst.len());
                    return (got, Some(Failure::new("range", false, K::InvalidData, what)));
                };
                into.copy_from_slice(&bytes);
                heard = Instant::now();
                got += bytes.len();
                counters.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                let took = window.0.elapsed();
                if took >= p.slow_after {
                    let (came, rest) = (got - window.1, dst.len() - got);
                    if let Some(f) = too_slow(counters, p, took, came, rest, range.start + got as u64) {
                        return (got, Some(f));
                    }
                    window = (Instant::now(), got);
                }
            }
        }
    }
    if got >= PACE_MIN_BYTES {
        counters.paced(got, body_started.elapsed());
    }
    if got < dst.len() {
        let what = format!("the body ended at byte {} of {}", range.start + got as u64, range.end);
        return (got, Some(Failure::new("cut", true, K::UnexpectedEof, what)));
    }
    (got, None)
}

/// A body that brought `got` bytes in its last `took` (up to byte `at`),
/// `slow_factor` times slower than the recent median pace, with `rest`
/// bytes to go that would take it `slow_after` or more: a failure (retried
/// from `at`), its pace kept so that a path slow for good becomes the new
/// pace rather than being dropped again and again.
fn too_slow(
    counters: &GetCounters,
    p: &GetPolicy,
    took: Duration,
    got: usize,
    rest: usize,
    at: u64,
) -> Option<Failure> {
    let median = counters.pace_median.load(Ordering::Relaxed);
    if median == 0 {
        return None;
    }
    let ns_per_byte = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX) / (got.max(1) as u64);
    let rest_ns = u128::from(ns_per_byte) * rest as u128;
    if ns_per_byte <= median.saturating_mul(u64::from(p.slow_factor)) || rest_ns < p.slow_after.as_nanos() {
        return None;
    }
    counters.paced(got, took);
    let what = format!(
        "the body came at {:.0} KB/s up to byte {at}, over {}× slower than recent GETs ({:.1} MB/s)",
        got as f64 / took.as_secs_f64() / 1e3,
        p.slow_factor,
        1e3 / median as f64,
    );
    Some(Failure::new("slow", true, std::io::ErrorKind::TimedOut, what))
}

fn object_error(url: &str, range: Option<&Range<u64>>, f: &Failure, retries: u32) -> Error {
    let range = range
        .map(|r| format!("bytes {}..{}: ", r.start, r.end))
        .unwrap_or_default();
    let tail = if retries > 0 {
        format!(" (after {retries} retries; last cause: {})", f.cause)
    } else {
        String::new()
    };
    Error::io(url, std::io::Error::new(f.kind, format!("{range}{}{tail}", f.what)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_handshakes_that_fail_are_told_apart_from_resets() {
        let cert = "error sending request: client error (Connect): invalid peer certificate: UnknownIssuer";
        assert!(tls_refused(cert).is_some_and(|h| h.contains("AWS_CA_BUNDLE")));
        let plain = "client error (Connect): received corrupt message of type InvalidContentType";
        assert!(tls_refused(plain).is_some_and(|h| h.contains("http://")));
        assert_eq!(
            tls_refused("client error (SendRequest): connection reset by peer"),
            None
        );
    }

    #[test]
    fn histogram_quantiles_fall_in_their_bucket() {
        let h = Histogram::default();
        for us in [10u64, 1_000, 1_000, 1_000, 50_000] {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.count(), 5);
        let p50 = h.quantile(0.5);
        assert!((900.0..1_200.0).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((45_000.0..56_000.0).contains(&p99), "{p99}");
        for i in 0..Histogram::BUCKETS - 1 {
            assert!(Histogram::low(i) < Histogram::low(i + 1));
            assert_eq!(Histogram::index(Histogram::low(i) as u64), i);
        }
    }

    #[test]
    fn statuses_and_codes_are_found_in_messages() {
        assert_eq!(
            http_status(
                "Error performing GET x in 1ms - Server returned non-2xx status code: 503 Service Unavailable: "
            ),
            Some(503)
        );
        assert_eq!(http_status("connection reset"), None);
        assert_eq!(
            s3_code("<Error><Code>SlowDown</Code></Error>").as_deref(),
            Some("SlowDown")
        );
    }

    #[test]
    fn a_body_may_be_quiet_for_a_multiple_of_the_slowest_first_bytes_doubled_per_failed_attempt() {
        let p = GetPolicy::default();
        let c = GetCounters::default();
        // Until first bytes have been timed: the stall timeout.
        assert_eq!(c.quiet_after(&p, 0), p.stall);
        for _ in 0..60 {
            c.first_byte.record(Duration::from_millis(200));
        }
        // 8 × ~200 ms (the bucket's middle), doubled per attempt, at most the stall timeout.
        let q = c.quiet_after(&p, 0);
        assert!(
            q > Duration::from_millis(1500) && q < Duration::from_millis(1800),
            "{q:?}"
        );
        assert_eq!(c.quiet_after(&p, 1), q * 2);
        assert_eq!(c.quiet_after(&p, 3), p.stall);
        assert_eq!(c.quiet_after(&p, 40), p.stall);
        // Fast first bytes: at least `slow_after`.
        let fast = GetCounters::default();
        for _ in 0..60 {
            fast.first_byte.record(Duration::from_millis(2));
        }
        assert_eq!(fast.quiet_after(&p, 0), p.slow_after);
    }

    #[test]
    fn backoff_grows_within_bounds() {
        let p = GetPolicy::default();
        for a in 0..30 {
            let d = backoff(&p, a);
            assert!(d <= p.backoff_max, "{a}: {d:?}");
            assert!(d >= p.backoff.min(p.backoff_max) / 2, "{a}: {d:?}");
        }
    }
}
