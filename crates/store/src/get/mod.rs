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
//!
//! The module by concern: [`policy`] (the bounds and retries), [`counters`]
//! (what happened), [`diagnosis`] (what a failure means), and here the
//! requests themselves (HEAD, LIST, GET).

mod counters;
mod diagnosis;
pub mod policy;

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use brand_format::error::{Error, Result};
use futures_util::StreamExt;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStoreExt};

use crate::connect::{Connection, redact};
use crate::limiter::Limiter;

pub use counters::{GetCounters, GetReport};
pub(crate) use diagnosis::describe;
use diagnosis::{Failure, classify, object_error};
pub use policy::GetPolicy;
use policy::{PACE_MIN_BYTES, PROGRESS, QUIET_TICK, backoff};

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
