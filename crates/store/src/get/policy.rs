//! How requests to a store are bounded and retried: [`GetPolicy`], built
//! once from a user's configuration (`brand_io::StoreSettings::get_policy`)
//! and passed to every request a reader, a pack or a command makes; the
//! backoff between attempts; the tuning that is not the user's to set.

use std::time::Duration;

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
pub(super) const PROGRESS: usize = 64 << 10;

/// Bodies of at least this size set the pace slow bodies are judged by
/// (smaller ones are mostly their first byte).
pub(super) const PACE_MIN_BYTES: usize = 64 << 10;

/// How many recent bodies the pace is the median of.
pub(super) const PACE_WINDOW: usize = 64;

/// A body that sends nothing for this many times the slowest 1 % of first
/// bytes (at least `slow_after`) is dropped and its rest asked for again:
/// a connection that went silent mid-body would otherwise hold its GET, and
/// the batch waiting on it, for the whole stall timeout. Bytes of a body
/// that flows come far closer together than a request's first byte.
pub(super) const QUIET_FACTOR: u32 = 8;

/// How often a silent body's allowance is looked at again (it shrinks
/// once enough first bytes have been timed, as at a start).
pub(super) const QUIET_TICK: Duration = Duration::from_millis(250);

/// A request sent before any first byte was timed (a dataset's open, a
/// start) is hedged after this: an object store answers far sooner, and
/// a connection that is never answered held an open for the whole stall
/// timeout (10 s behind `bench/fault_proxy.py --fault blackhole`).
pub(super) const UNTIMED_HEDGE: Duration = Duration::from_secs(1);

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

/// A jittered backoff: uniform in [d/2, d] with d = first · 2^attempt ≤ max.
pub(super) fn backoff(p: &GetPolicy, attempt: u32) -> Duration {
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

#[cfg(test)]
mod tests {
    use super::*;
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
