//! Loader metrics: what was read, what was served, and how long the consumer
//! waited for I/O.

use std::time::Duration;

use serde::Serialize;

/// Cumulative counters since the loader was built (or since `reset`): one
/// struct for a loader and for a node of a multi-node job, whose fields
/// from `nodes` on are 0 for a loader alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Metrics {
    /// Bytes transferred from storage, counted when the consumer reaches
    /// the read (so read-ahead into the next epoch counts in that epoch).
    pub bytes_read: u64,
    /// Bytes of samples handed out (as stored).
    pub bytes_served: u64,
    pub samples_served: u64,
    /// Device reads (extents).
    pub reads_issued: u64,
    /// Plan refills (Read events): memory misses.
    pub refills: u64,
    /// Refills read record by record as each comes due: large reads of
    /// the epoch a loader starts at (a Brand start's whole chunks).
    pub reads_deferred: u64,
    /// Single-record reads for samples the plan expected in memory but that
    /// were not (after a resume, or for padding repeats).
    pub recovery_reads: u64,
    /// Times the consumer waited for a read.
    pub stalls: u64,
    pub stall_secs_total: f64,
    pub stall_p50_secs: f64,
    pub stall_p95_secs: f64,
    pub stall_p99_secs: f64,
    pub stall_max_secs: f64,
    /// Peak bytes of resident samples, as served (decoded).
    pub peak_resident_bytes: u64,
    pub peak_resident_samples: u64,
    /// The memory this rank's plan holds, in slots (samples' worth):
    /// `memory` as given, or a DataLoader worker's share of its process's
    /// (rounded up where a percentage was too small for it); 0 without a
    /// plan.
    pub memory_slots: u64,
    /// Peak bytes of reads in flight (issued, not yet taken in): bounded by
    /// `readahead`, which the last read issued may overshoot by its own size.
    pub peak_readahead_bytes: u64,
    /// Bytes of read buffers registered with io_uring (fixed buffers).
    pub registered_buffer_bytes: u64,
    /// Peak bytes of ordinary (unregistered) read buffers, in use or
    /// pooled: those of whole-chunk reads and of records over 512 KiB.
    pub peak_read_buffer_bytes: u64,
    /// Samples left out of their epoch because their record was corrupt
    /// (`on_corrupt = "skip"`).
    pub skipped_corrupt: u64,
    /// Whether the engine fell back from O_DIRECT to buffered reads.
    pub buffered_fallback: bool,
    /// Whether reads go through the threads backend (`pread`), not io_uring.
    pub threads_backend: bool,
    /// Whether `io_backend = "auto"` found io_uring refused and fell back to threads.
    pub uring_refused: bool,
    /// The read gap in effect (None = whole chunks).
    pub read_gap: Option<u64>,
    /// The plan's run length (`run_length`; 0 where not reported: a node of a multi-node job).
    pub run_length: u32,
    /// The number of nodes of the multi-node job (0: a loader alone). Of a
    /// node, `bytes_read`/`reads_issued` count its own storage reads (the
    /// chunks it owns), `samples_served`/`bytes_served` what it handed out,
    /// and `stalls` its waits for a sample not yet read or pushed.
    pub nodes: u32,
    /// This node's rank.
    pub node_rank: u32,
    /// Samples served that this node read itself (never crossed the network).
    pub samples_local: u64,
    /// Samples served here that another node read and pushed, and their
    /// bytes (what came for an epoch this node never reached is not counted).
    pub samples_received: u64,
    pub bytes_received: u64,
    /// Samples this node pushed to others, and their bytes.
    pub samples_pushed: u64,
    pub bytes_pushed: u64,
    /// Most bytes of pushed and local samples held at once, and the limit
    /// (`remote_memory`).
    pub remote_memory_peak: u64,
    pub remote_memory_limit: u64,
    /// Most bytes this node held read but not yet pushed.
    pub owner_peak_bytes: u64,
    /// A dataset in object storage (the rest 0 otherwise): requests the
    /// reads sent (GETs, their retries, resumes and hedges; HEADs; not the
    /// open's few: manifest, index, segment HEADs or listing), body bytes
    /// fetched (`bytes_read` counts the extents the loader asked for),
    /// retries and their causes (a status such as "503", "connect", "reset", "stall",
    /// "cut", "slow"), hedged GETs, GET latency (first request to last byte) and
    /// time to first byte, and the GETs-in-flight limit now.
    pub store_requests: u64,
    pub store_bytes_fetched: u64,
    pub store_retries: u64,
    pub store_retries_by_cause: std::collections::BTreeMap<String, u64>,
    pub store_hedges: u64,
    pub store_get_p50_ms: f64,
    pub store_get_p99_ms: f64,
    pub store_first_byte_p50_ms: f64,
    pub store_gets_in_flight_limit: u64,
    /// Metadata, outside the sample budget. `index.bin`'s size: mapped
    /// read-only, so every process on the machine that reads the dataset
    /// shares one copy in the page cache (held on the heap instead when
    /// `index_heap_bytes` says so: an index fetched from a store that could
    /// not be cached on disk).
    pub index_file_bytes: u64,
    /// The index's bytes on this process's heap: 8 a chunk, plus the whole
    /// file when it is held rather than mapped.
    pub index_heap_bytes: u64,
    /// The plan's per-sample state on this process's heap now (this
    /// epoch's order and reads, the next epoch's planned ahead), and the
    /// most it held at once.
    pub plan_bytes: u64,
    pub plan_peak_bytes: u64,
}

impl Metrics {
    /// The object-storage fields from `now`, counted since `base` (the
    /// latencies and the limit are `now`'s: they are not sums).
    pub fn set_store(&mut self, now: &brand_store::GetReport, base: Option<&brand_store::GetReport>) {
        let zero = brand_store::GetReport::default();
        let base = base.unwrap_or(&zero);
        self.store_requests = now.requests.saturating_sub(base.requests);
        self.store_bytes_fetched = now.bytes.saturating_sub(base.bytes);
        self.store_retries = now.retries.saturating_sub(base.retries);
        self.store_retries_by_cause = now
            .retries_by_cause
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.saturating_sub(base.retries_by_cause.get(k).copied().unwrap_or(0)),
                )
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        self.store_hedges = now.hedges.saturating_sub(base.hedges);
        self.store_get_p50_ms = now.latency_p50_ms;
        self.store_get_p99_ms = now.latency_p99_ms;
        self.store_first_byte_p50_ms = now.first_byte_p50_ms;
        self.store_gets_in_flight_limit = now.in_flight_limit;
    }
}

impl Metrics {
    /// Bytes read per byte served.
    pub fn read_amplification(&self) -> f64 {
        if self.bytes_served == 0 {
            0.0
        } else {
            self.bytes_read as f64 / self.bytes_served as f64
        }
    }
}

/// Stall durations, for percentiles, in bounded memory: a log-linear
/// histogram (each power of two split in [`SUB`] buckets, so a percentile is
/// within 1/[`SUB`] of the true value) plus the exact count, sum and max.
#[derive(Debug, Clone)]
pub struct StallLog {
    buckets: Vec<u64>,
    count: u64,
    total_nanos: u128,
    max_nanos: u64,
}

/// Buckets per power of two.
const SUB: u64 = 128;
const SUB_BITS: u32 = 7;

impl Default for StallLog {
    fn default() -> Self {
        StallLog {
            buckets: vec![0; (64 * SUB) as usize],
            count: 0,
            total_nanos: 0,
            max_nanos: 0,
        }
    }
}

/// The bucket of `v`: values below SUB are exact; above, the top SUB_BITS
/// bits after the leading one pick the bucket within its power of two.
fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // ≥ SUB_BITS
    let shift = exp - SUB_BITS;
    let mantissa = (v >> shift) - SUB; // 0..SUB
    ((shift as u64 + 1) * SUB + mantissa) as usize
}

/// The midpoint of bucket `b`'s range.
fn value_of(b: usize) -> f64 {
    let b = b as u64;
    if b < SUB {
        return b as f64;
    }
    let shift = b / SUB - 1;
    let lo = (SUB + b % SUB) << shift;
    lo as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
}

impl StallLog {
    pub fn record(&mut self, d: Duration) {
        let n = d.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[bucket_of(n)] += 1;
        self.count += 1;
        self.total_nanos += n as u128;
        self.max_nanos = self.max_nanos.max(n);
    }

    pub fn fill(&self, m: &mut Metrics) {
        let pct = |p: f64| -> f64 {
            if self.count == 0 {
                return 0.0;
            }
            let rank = ((p * self.count as f64).ceil() as u64).clamp(1, self.count);
            let mut seen = 0;
            for (b, &c) in self.buckets.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return value_of(b).min(self.max_nanos as f64) * 1e-9;
                }
            }
            self.max_nanos as f64 * 1e-9
        };
        m.stalls = self.count;
        m.stall_secs_total = self.total_nanos as f64 * 1e-9;
        m.stall_p50_secs = pct(0.50);
        m.stall_p95_secs = pct(0.95);
        m.stall_p99_secs = pct(0.99);
        m.stall_max_secs = self.max_nanos as f64 * 1e-9;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_right_ranks() {
        let mut s = StallLog::default();
        for ms in 1..=100 {
            s.record(Duration::from_millis(ms));
        }
        let mut m = Metrics::default();
        s.fill(&mut m);
        assert_eq!(m.stalls, 100);
        let close = |got: f64, want: f64| (got - want).abs() <= want / SUB as f64;
        assert!(close(m.stall_p50_secs, 0.050), "{}", m.stall_p50_secs);
        assert!(close(m.stall_p95_secs, 0.095), "{}", m.stall_p95_secs);
        assert!(close(m.stall_p99_secs, 0.099), "{}", m.stall_p99_secs);
        assert!((m.stall_max_secs - 0.100).abs() < 1e-9);
        assert!((m.stall_secs_total - 5.050).abs() < 1e-6);
    }

    #[test]
    fn a_long_run_keeps_the_log_bounded_and_the_percentiles_right() {
        let mut s = StallLog::default();
        let size = s.buckets.len();
        // Five million stalls: 1 µs .. 5 s, uniform in rank.
        for i in 1..=5_000_000u64 {
            s.record(Duration::from_micros(i));
        }
        assert_eq!(s.buckets.len(), size, "the log must not grow");
        let mut m = Metrics::default();
        s.fill(&mut m);
        let close = |got: f64, want: f64| (got - want).abs() <= want / SUB as f64;
        assert_eq!(m.stalls, 5_000_000);
        assert!(close(m.stall_p50_secs, 2.5), "{}", m.stall_p50_secs);
        assert!(close(m.stall_p99_secs, 4.95), "{}", m.stall_p99_secs);
        assert!((m.stall_max_secs - 5.0).abs() < 1e-9);
    }

    #[test]
    fn buckets_cover_every_value_in_order() {
        for v in (0..20u32)
            .flat_map(|e| [(1u64 << e) - 1, 1 << e, (1 << e) + 1, 3 << e])
            .chain([u64::MAX])
        {
            let b = bucket_of(v);
            assert!(b < (64 * SUB) as usize, "{v}");
            assert!(
                (value_of(b) - v as f64).abs() <= v as f64 / SUB as f64 + 0.5,
                "{v} → {b} → {}",
                value_of(b)
            );
        }
        let mut last = 0;
        for v in (0..2_000_000u64).step_by(7) {
            let b = bucket_of(v);
            assert!(b >= last, "bucket of {v} goes back");
            last = b;
        }
    }
}
