//! How many GETs are in flight. A store's cost is its time to first byte:
//! to fill a link, enough GETs must be waiting for theirs while others
//! transfer — but every GET beyond that only shares the link with the
//! GETs the reader needs first, and makes them later. So the number is
//! sized from what the GETs do, as TCP Vegas sizes a window:
//!
//! * it starts at 32 (what fills 1 Gbit/s at 20 ms with the ~170 KB GETs
//!   `read_gap = auto` makes: measured, docs/bench/objstore-results.md);
//! * while the window's median first byte is within 1.25× the base (the
//!   fastest seen: no queue on the path) and GETs waited for a place, it
//!   grows by half per window (a window: as many GETs as the limit);
//! * when the median passes 2× the base, a queue is building (the link or
//!   the store is full): it shrinks by a quarter;
//! * it is never more than what keeps twice the link's worth in flight,
//!   as BBR sizes its window: Little's law on the recent delivery rate
//!   and the time a GET takes unqueued (fastest first byte, then its
//!   body at the fastest stream's rate: a store that caps each stream
//!   needs more streams). Queues do not always show in the first byte (a
//!   relay's or a server's buffers, drops): this is what stops those;
//! * a 503 SlowDown or 429 halves it, at most once per window (a burst is
//!   one cut), and a ceiling then grows back by one per window's worth of
//!   successes, as AWS asks of clients.
//!
//! The base first byte is the fastest seen; when no first byte has come
//! near it for a while (a queue that never drains, or a path that got
//! slower), two windows run at the minimum to measure it again, as BBR
//! does. A fixed limit (`gets_in_flight = N`) keeps only the last rule.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The adaptive limit's bounds and start.
pub const AUTO_START: usize = 32;
pub const AUTO_MIN: usize = 4;
pub const AUTO_MAX: usize = 256;

/// Windows without a first byte near the base before the base is measured
/// again (a path that got slower for good is noticed after this many).
const BASE_REFRESH: usize = 64;

/// The GETs in flight, limited (see the module's text).
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<State>,
    freed: tokio::sync::Notify,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// The store's ceiling: `max`, halved on throttling, grown back by one
    /// per ceiling's worth of successes.
    ceiling: usize,
    max: usize,
    /// Completions since the ceiling last changed.
    since_cut: usize,
    /// `None`: a fixed limit.
    sizing: Option<Sizing>,
}

impl State {
    fn limit(&self) -> usize {
        match &self.sizing {
            Some(s) => s.target.min(self.ceiling),
            None => self.ceiling,
        }
    }
}

/// One GET's place in flight; dropped, it frees the place.
pub struct Permit(Arc<Limiter>);

impl Drop for Permit {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.state.lock() {
            s.in_flight -= 1;
        }
        self.0.freed.notify_one();
    }
}

impl Limiter {
    /// At most `max` GETs in flight (halved while the store throttles).
    pub fn new(max: usize) -> Limiter {
        Self::with(max.max(1), None)
    }

    /// A limit sized as GETs complete, from [`AUTO_START`] within
    /// [`AUTO_MIN`]..=[`AUTO_MAX`].
    pub fn adaptive() -> Limiter {
        Self::with(AUTO_MAX, Some(Sizing::new(AUTO_START, AUTO_MIN, AUTO_MAX)))
    }

    fn with(max: usize, sizing: Option<Sizing>) -> Limiter {
        Limiter {
            state: Mutex::new(State {
                in_flight: 0,
                ceiling: max,
                max,
                since_cut: 0,
                sizing,
            }),
            freed: tokio::sync::Notify::new(),
        }
    }

    pub fn limit(&self) -> usize {
        self.state.lock().map_or(1, |s| s.limit())
    }

    /// A place in flight, waiting for one. Callers take places in the
    /// order GETs should start (the plan's), then start them: a task that
    /// waited for its place itself would start in the scheduler's order.
    pub async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            let freed = self.freed.notified();
            {
                let Ok(mut s) = self.state.lock() else {
                    return Permit(self.clone());
                };
                if s.in_flight < s.limit() {
                    s.in_flight += 1;
                    return Permit(self.clone());
                }
                if let Some(z) = &mut s.sizing {
                    z.window.bound = true;
                }
            }
            freed.await;
        }
    }

    /// A place in flight if one is free now (never waits).
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let mut s = self.state.lock().ok()?;
        if s.in_flight < s.limit() {
            s.in_flight += 1;
            Some(Permit(self.clone()))
        } else {
            if let Some(z) = &mut s.sizing {
                z.window.bound = true;
            }
            None
        }
    }

    /// A GET of `bytes` completed; its (last) first byte took `first_byte`.
    pub(crate) fn succeeded(&self, bytes: u64, first_byte: Option<Duration>, took: Duration) {
        let grew = match self.state.lock() {
            Ok(mut s) => {
                let before = s.limit();
                s.since_cut += 1;
                if s.since_cut >= s.ceiling && s.ceiling < s.max {
                    s.ceiling += 1;
                    s.since_cut = 0;
                }
                if let Some(z) = &mut s.sizing {
                    z.completed(Instant::now(), bytes, first_byte, took);
                }
                s.limit() > before
            }
            Err(_) => false,
        };
        if grew {
            self.freed.notify_waiters();
        }
    }

    /// The store said slow down (503, 429).
    pub(crate) fn throttled(&self) {
        if let Ok(mut s) = self.state.lock() {
            let limit = s.limit();
            if s.since_cut >= limit / 2 || s.ceiling == s.max {
                s.ceiling = (limit / 2).max(1);
                s.since_cut = 0;
                if s.ceiling != limit {
                    tracing::info!("object store throttled: GETs in flight {limit} → {}", s.ceiling);
                }
            }
        }
    }
}

/// The adaptive limit: pure arithmetic on what completed GETs report, so
/// it is tested without a store.
#[derive(Debug, Clone)]
struct Sizing {
    target: usize,
    min: usize,
    max: usize,
    window: Window,
    /// The fastest first byte seen (µs) while nothing queued: the path's own.
    base_us: u64,
    /// Windows since a first byte near `base_us` was last seen.
    base_age: usize,
    /// Windows left at the minimum to measure the base again, and the
    /// target to go back to.
    draining: Option<(usize, usize)>,
    /// Bytes and seconds of recent windows in which GETs waited for a place
    /// (their sum is the delivery rate: one window's alone swings with the
    /// completions that happen to close it), and the fastest body of a
    /// large GET in recent windows.
    delivered: [(f64, f64); RATE_WINDOWS],
    stream_rates: [f64; RATE_WINDOWS],
    windows: usize,
}

#[derive(Debug, Clone)]
struct Window {
    start: Option<Instant>,
    bytes: u64,
    gets: usize,
    first_bytes_us: Vec<u64>,
    /// The fastest body (bytes/s after the first byte) of a GET of at
    /// least [`STREAM_PROBE_BYTES`].
    stream_rate: f64,
    /// A GET waited for a place: the limit, not the reader, held GETs back.
    bound: bool,
}

impl Window {
    fn new() -> Window {
        Window {
            start: None,
            bytes: 0,
            gets: 0,
            first_bytes_us: Vec::new(),
            stream_rate: 0.0,
            bound: false,
        }
    }
}

/// A GET this large times one stream's rate (a smaller one's body is
/// over before its rate means anything).
const STREAM_PROBE_BYTES: u64 = 1 << 20;

/// Windows the delivery rate and the stream rate are remembered over.
const RATE_WINDOWS: usize = 8;

impl Sizing {
    fn new(start: usize, min: usize, max: usize) -> Sizing {
        Sizing {
            target: start.clamp(min, max),
            min,
            max,
            window: Window::new(),
            base_us: u64::MAX,
            base_age: 0,
            draining: None,
            delivered: [(0.0, 0.0); RATE_WINDOWS],
            stream_rates: [0.0; RATE_WINDOWS],
            windows: 0,
        }
    }

    /// A GET of `bytes` completed `took` after it was asked for, its first
    /// byte after `first_byte`.
    fn completed(&mut self, now: Instant, bytes: u64, first_byte: Option<Duration>, took: Duration) {
        let w = &mut self.window;
        let start = *w.start.get_or_insert(now);
        w.bytes += bytes;
        w.gets += 1;
        if let Some(t) = first_byte {
            w.first_bytes_us.push(t.as_micros().min(u64::MAX as u128) as u64);
            let body = took.saturating_sub(t).as_secs_f64();
            if bytes >= STREAM_PROBE_BYTES && body > 0.0 {
                w.stream_rate = w.stream_rate.max(bytes as f64 / body);
            }
        }
        if w.gets >= self.target.max(8) && !w.first_bytes_us.is_empty() {
            let elapsed = now.saturating_duration_since(start);
            self.close(elapsed);
        }
    }

    /// The window's verdict on the target.
    fn close(&mut self, elapsed: Duration) {
        let mut w = std::mem::replace(&mut self.window, Window::new());
        w.first_bytes_us.sort_unstable();
        let fastest = w.first_bytes_us[0];
        let median = w.first_bytes_us[w.first_bytes_us.len() / 2] as f64;
        // Draining: the minimum in flight for two windows (the first lets
        // the GETs queued before it finish), then the second's fastest first
        // byte is the base.
        if let Some((left, back_to)) = self.draining {
            if left > 1 {
                self.draining = Some((left - 1, back_to));
            } else {
                self.draining = None;
                self.base_us = fastest;
                self.base_age = 0;
                self.target = back_to;
            }
            return;
        }
        if fastest as f64 <= self.base_us as f64 * 1.1 {
            self.base_us = self.base_us.min(fastest);
            self.base_age = 0;
        } else {
            self.base_age += 1;
        }
        let slot = self.windows % RATE_WINDOWS;
        self.windows += 1;
        let secs = elapsed.as_secs_f64();
        self.delivered[slot] = if w.bound { (w.bytes as f64, secs) } else { (0.0, 0.0) };
        self.stream_rates[slot] = w.stream_rate;
        let base = self.base_us as f64 / 1e6;
        // Margins in µs too: at a base of 100 µs, scheduling noise alone is
        // half of it.
        let queue_building = median > self.base_us as f64 * 2.0 + 1_000.0;
        let clear = median <= self.base_us as f64 * 1.25 + 500.0;
        if queue_building {
            self.target = self.target * 3 / 4;
        } else if w.bound {
            let want = if clear {
                self.target + self.target.div_ceil(2)
            } else {
                self.target
            };
            self.target = want.min(self.fills_twice(base, w.bytes as f64 / w.gets as f64));
        }
        self.target = self.target.clamp(self.min, self.max);
        // A queue that never drains hides the path's own first byte: once in
        // a while, drain it to see (BBR's ProbeRTT).
        if self.base_age >= BASE_REFRESH {
            self.draining = Some((2, self.target));
            self.target = self.min;
        }
    }

    /// GETs of `mean` bytes that keep twice the link's worth in flight, by
    /// Little's law: the delivery rate recently × how long a GET
    /// takes unqueued (the base first byte, then its body at one stream's
    /// rate: a store that caps streams needs more of them) ÷ the GET's
    /// size, + 2 for the GETs whose bodies are arriving.
    fn fills_twice(&self, base: f64, mean: f64) -> usize {
        let (bytes, secs) = self
            .delivered
            .iter()
            .fold((0.0, 0.0), |(b, s), &(wb, ws)| (b + wb, s + ws));
        let rate = if secs > 0.0 { bytes / secs } else { 0.0 };
        if !(rate > 0.0 && mean > 0.0) {
            return usize::MAX;
        }
        let stream = self.stream_rates.iter().copied().fold(0.0, f64::max);
        let body = if stream > 0.0 { stream.min(rate) } else { rate };
        let unqueued = base + mean / body;
        (2.0 * rate * unqueued / mean).ceil() as usize + 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A modelled path: `rate` bytes/s; first bytes after `rtt` when
    /// nothing queues; each stream at most `stream` bytes/s (a store's cap);
    /// a queue in front of the link of at most `queue` seconds that shows in
    /// first bytes once more GETs are in flight than fill it (0: it does not
    /// show, as with drops or buffers in a relay).
    #[derive(Clone, Copy)]
    struct Path {
        rate: f64,
        rtt: f64,
        size: f64,
        stream: f64,
        queue: f64,
    }

    fn path(rate: f64, rtt: f64, size: f64) -> Path {
        Path {
            rate,
            rtt,
            size,
            stream: f64::INFINITY,
            queue: 0.02,
        }
    }

    /// A reader's start: `target` GETs sent on an idle path, the first
    /// bytes of the first ones before any queue formed.
    fn started(p: Path) -> Sizing {
        let mut z = Sizing::new(AUTO_START, AUTO_MIN, AUTO_MAX);
        run(&mut z, p, true);
        z
    }

    /// One window of `target` GETs (at least 8) as the limiter would see
    /// it; the bytes/s delivered.
    fn run_window(z: &mut Sizing, p: Path) -> f64 {
        run(z, p, false)
    }

    fn run(z: &mut Sizing, p: Path, idle: bool) -> f64 {
        let n = z.target as f64;
        let body = p.stream.min(p.rate);
        // Time one GET holds its place unqueued: first byte + its body.
        let alone = p.rtt + p.size / body;
        let fill = p.rate * alone / p.size; // GETs that fill the link
        let (held, first) = if n <= fill {
            (alone, p.rtt)
        } else {
            // Saturated: each GET is held n/fill times as long; the queue
            // shows in the first byte up to `queue`.
            let held = n * p.size / p.rate;
            let queue = if idle { 0.0 } else { (held - alone).min(p.queue) };
            (held, p.rtt + queue)
        };
        let got = n * p.size / held;
        let gets = z.target.max(8);
        let elapsed = Duration::from_secs_f64(gets as f64 * p.size / got);
        z.window.bound = true;
        z.window.bytes = (gets as f64 * p.size) as u64;
        z.window.gets = gets;
        z.window.first_bytes_us = (0..gets).map(|i| ((first + i as f64 * 1e-6) * 1e6) as u64).collect();
        if p.size >= STREAM_PROBE_BYTES as f64 {
            z.window.stream_rate = p.size / (held - first);
        }
        z.close(elapsed);
        got
    }

    fn fill(p: Path) -> f64 {
        p.rate * (p.rtt + p.size / p.stream.min(p.rate)) / p.size
    }

    #[test]
    fn small_gets_over_a_long_path_settle_where_the_link_is_full() {
        // 1 Gbit/s (125 MB/s), 20 ms, 170 KB GETs: ~16 GETs fill it.
        let p = path(125e6, 0.02, 170e3);
        let mut z = started(p);
        let mut last = 0.0;
        let mut targets = Vec::new();
        for _ in 0..60 {
            last = run_window(&mut z, p);
            targets.push(z.target);
        }
        assert!(last > 0.95 * p.rate, "{last} {targets:?}");
        let fill = fill(p);
        let tail = &targets[30..];
        assert!(
            tail.iter().all(|&t| (t as f64) >= fill && (t as f64) <= 3.0 * fill),
            "{fill} {targets:?}"
        );
    }

    #[test]
    fn a_path_that_gets_slower_for_good_is_measured_again_and_filled() {
        let mut z = started(path(125e6, 0.02, 170e3));
        for _ in 0..60 {
            run_window(&mut z, path(125e6, 0.02, 170e3));
        }
        // Three times the round trip from now on: every first byte looks
        // queued against the old base until it is measured again.
        let mut rates = Vec::new();
        for _ in 0..300 {
            rates.push(run_window(&mut z, path(125e6, 0.06, 170e3)));
        }
        let full = rates[200..].iter().filter(|&&r| r > 0.95 * 125e6).count();
        assert!(full >= 95, "{full} of 100 windows full: {:?}", &rates[200..]);
    }

    #[test]
    fn large_gets_need_few_in_flight_and_the_limit_comes_down_to_them() {
        // 8 MiB GETs on the same path: one or two fill it, more only queue
        // (here in a queue of up to 50 ms, which shows in first bytes).
        let p = Path {
            queue: 0.05,
            ..path(125e6, 0.02, 8.0 * 1048576.0)
        };
        let mut z = started(p);
        let mut last = 0.0;
        for _ in 0..40 {
            last = run_window(&mut z, p);
        }
        assert!(z.target <= 6, "{}", z.target);
        assert!(last > 0.95 * p.rate, "{last}");
    }

    #[test]
    fn a_queue_that_does_not_show_in_first_bytes_is_stopped_by_the_links_rate() {
        let p = Path {
            queue: 0.0,
            ..path(125e6, 0.02, 170e3)
        };
        let mut z = started(p);
        let mut last = 0.0;
        for _ in 0..60 {
            last = run_window(&mut z, p);
        }
        assert!(last > 0.95 * p.rate, "{last}");
        let most = 2.5 * fill(p) + 3.0;
        assert!((z.target as f64) <= most, "{} > {most}", z.target);
    }

    #[test]
    fn a_store_that_caps_each_stream_gets_enough_streams_to_fill_the_link() {
        // 10 Gbit/s, 30 ms to first byte, 90 MB/s a stream (S3's), 8 MiB
        // GETs: ~17 fill it.
        let p = Path {
            stream: 90e6,
            ..path(1.25e9, 0.03, 8.0 * 1048576.0)
        };
        let mut z = started(p);
        let mut last = 0.0;
        for _ in 0..60 {
            last = run_window(&mut z, p);
        }
        assert!(last > 0.95 * p.rate, "{last} with {}", z.target);
        assert!((z.target as f64) <= 2.5 * fill(p) + 3.0, "{}", z.target);
    }

    #[test]
    fn a_fast_wide_path_is_given_many_more_gets() {
        // 10 Gbit/s at 50 ms with 100 KB GETs: ~630 fill it; the limit goes to its maximum.
        let mut z = started(path(1.25e9, 0.05, 100e3));
        for _ in 0..60 {
            run_window(&mut z, path(1.25e9, 0.05, 100e3));
        }
        assert_eq!(z.target, AUTO_MAX);
    }

    #[test]
    fn a_reader_that_keeps_few_gets_waiting_does_not_grow_the_limit() {
        let mut z = started(path(125e6, 0.02, 170e3));
        for _ in 0..20 {
            run_window(&mut z, path(125e6, 0.02, 170e3));
            // Nobody waited for a place: the rate says nothing about the link.
            z.window.bound = false;
            let before = z.target;
            z.window.bytes = 1;
            z.window.gets = 8;
            z.window.first_bytes_us = vec![20_000; 8];
            z.close(Duration::from_millis(100));
            assert_eq!(z.target, before);
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_fixed_limit_halves_on_throttling_and_grows_back() {
        let l = Arc::new(Limiter::new(8));
        assert_eq!(l.limit(), 8);
        l.throttled();
        assert_eq!(l.limit(), 4);
        // A burst of 503s right after is the same congestion: one cut.
        l.throttled();
        assert_eq!(l.limit(), 4);
        for _ in 0..4 {
            l.succeeded(4096, None, Duration::from_millis(1));
        }
        assert_eq!(l.limit(), 5);
        let permits: Vec<_> = futures_util::future::join_all((0..5).map(|_| l.acquire())).await;
        assert_eq!(permits.len(), 5);
        // A sixth waits until one is dropped.
        let sixth = tokio::time::timeout(Duration::from_millis(20), l.acquire()).await;
        assert!(sixth.is_err());
        assert!(l.try_acquire().is_none());
        drop(permits);
        assert!(tokio::time::timeout(Duration::from_secs(1), l.acquire()).await.is_ok());
    }

    #[test]
    fn throttling_cuts_an_adaptive_limit_below_its_target() {
        let l = Limiter::adaptive();
        assert_eq!(l.limit(), AUTO_START);
        l.throttled();
        assert_eq!(l.limit(), AUTO_START / 2);
        // Grown back by one per limit's worth of successes.
        for _ in 0..AUTO_START / 2 {
            l.succeeded(4096, Some(Duration::from_millis(20)), Duration::from_millis(21));
        }
        assert_eq!(l.limit(), AUTO_START / 2 + 1);
    }
}
