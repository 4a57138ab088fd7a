//! What a reader's requests did, counted as they happen ([`GetCounters`]:
//! requests, bytes, retries by cause, hedges, latencies), the figures the
//! transport's timeouts are derived from (first bytes, body pace), and
//! their snapshot for the metrics ([`GetReport`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::diagnosis::Failure;
use super::policy::{GetPolicy, PACE_WINDOW, QUIET_FACTOR, UNTIMED_HEDGE};
use crate::limiter::Limiter;

/// What the GETs of a reader did, counted as they happen.
#[derive(Debug, Default)]
pub struct GetCounters {
    /// Requests sent: GETs, their retries, resumes and hedges, and HEADs.
    pub(super) requests: AtomicU64,
    /// Body bytes received.
    pub(super) bytes: AtomicU64,
    retries: AtomicU64,
    pub(super) hedges: AtomicU64,
    pub(super) hedges_won: AtomicU64,
    /// Retries by cause: a status ("503"), "connect", "reset", "stall", "cut",
    /// "slow", and "crc" (bytes fetched again because a record was damaged).
    causes: Mutex<BTreeMap<String, u64>>,
    /// Whole GETs (first request to last byte) and first bytes, in µs.
    pub(super) latency: Histogram,
    pub(super) first_byte: Histogram,
    /// The recent bodies' ns per byte, and their median once there are 16
    /// (0 before): the pace a slow body is judged against. Recent, not
    /// all: a path that slows down for good sets a new pace.
    paces: Mutex<VecDeque<u64>>,
    pub(super) pace_median: AtomicU64,
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
    pub(super) fn retrying(&self, url: &str, f: &Failure) {
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
    pub(super) fn paced(&self, bytes: usize, took: Duration) {
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
    pub(super) fn hedge_after(&self, min: Duration) -> Duration {
        self.first_byte_p99().unwrap_or(UNTIMED_HEDGE).max(min)
    }

    /// How long a body may send nothing: [`QUIET_FACTOR`] × the slowest 1 %
    /// of first bytes, at least `slow_after`, doubled for each failed
    /// attempt of the GET (a path slow for good gets more patience, not a
    /// failed GET), at most the stall timeout; the stall timeout until 50
    /// first bytes have been timed.
    pub(super) fn quiet_after(&self, p: &GetPolicy, attempt: u32) -> Duration {
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
pub(super) struct Histogram {
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

    pub(super) fn record(&self, d: Duration) {
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

#[cfg(test)]
mod tests {
    use super::*;
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
}
