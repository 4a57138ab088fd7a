//! Loader metrics: what was read, what was served, and how long the consumer
//! waited for I/O.

use std::time::Duration;

use serde::Serialize;

/// One field of the C ABI's `brand_metrics`, as the table below gives it.
/// brand-capi's `tests/header.rs` writes `capi/src/metrics/c_struct.rs` (the
/// struct and its `From<&Metrics>`) from these, and cbindgen the header
/// from that: a metric is defined once, here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CField {
    /// Its place in `brand_metrics`. 0 is `struct_size`, the caller's size
    /// (capi's, not a metric): the table's start at 1. Fields are only
    /// ever appended (the ABI: a caller's older, shorter struct stays valid).
    pub position: usize,
    pub name: &'static str,
    /// Its Rust type in capi: `u32`, `u64` or `f64`.
    pub ty: &'static str,
    /// Its value: a Rust expression of `m: &Metrics`, in capi's
    /// `metrics` module (where `BRAND_READ_GAP_WHOLE` is).
    pub value: &'static str,
    /// Its doc comment, a line each, as `///` gives them (with the leading space).
    pub docs: &'static [&'static str],
}

/// Defines [`Metrics`] and [`Metrics::c_fields`] from one table. Each field:
/// its docs, `name: Type`, then what C gets of it:
/// * `C[]`: nothing (not representable in a C struct);
/// * `C[n]`: field `n` of `brand_metrics`, same name and type, value `m.name`;
/// * `C[n: Ty = expr]`: field `n` of type `Ty`, value `expr` (of `m: &Metrics`);
///
/// then the C docs in braces when they differ from the Rust docs (`{}`: none,
/// as where one comment covers the fields after it). `C only` lists fields
/// that only C has (derived values), `name => C[n: Ty = expr]`. The JSON
/// (`brand read --json`, Python's `metrics()`) is the struct's serde form, so
/// every field reaches it; its key order is the table's.
///
/// A new metric is one row: a C field takes the next free place (a place
/// never changes: callers' older structs stay valid; brand-capi's abi.rs
/// checks the released offsets), then `BRAND_BLESS=1 cargo test -p
/// brand-capi --test header` rewrites capi's struct and brand.h.
macro_rules! metrics {
    (
        $(#[$attr:meta])*
        pub struct $Metrics:ident {
            $(
                $(#[doc = $doc:literal])*
                $name:ident : $ty:ty => C $c:tt $({ $(#[doc = $cdoc:literal])* })?
            ),* $(,)?
        }
        C only {
            $(
                $(#[doc = $odoc:literal])*
                $oname:ident => C[$opos:literal : $oty:ty = $oval:expr]
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        pub struct $Metrics {
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl $Metrics {
            /// The fields of the C ABI's `brand_metrics` (but `struct_size`),
            /// in the table's order (not the C struct's: see
            /// [`CField::position`]).
            pub fn c_fields() -> Vec<CField> {
                [
                    $( metrics!(@c $name, $ty, $c, [$($doc)*] $([$($cdoc)*])?), )*
                    $(
                        Some(CField {
                            position: $opos,
                            name: stringify!($oname),
                            ty: stringify!($oty),
                            value: stringify!($oval),
                            docs: &[$($odoc),*],
                        }),
                    )*
                ]
                .into_iter()
                .flatten()
                .collect()
            }
        }
    };
    (@c $name:ident, $ty:ty, [], [$($doc:literal)*]) => { None };
    (@c $name:ident, $ty:ty, [$pos:literal], $docs:tt $($cdocs:tt)?) => {
        Some(CField {
            position: $pos,
            name: stringify!($name),
            ty: stringify!($ty),
            value: concat!("m.", stringify!($name)),
            docs: metrics!(@docs $docs $($cdocs)?),
        })
    };
    (@c $name:ident, $ty:ty, [$pos:literal : $cty:ty = $val:expr], $docs:tt $($cdocs:tt)?) => {
        Some(CField {
            position: $pos,
            name: stringify!($name),
            ty: stringify!($cty),
            value: stringify!($val),
            docs: metrics!(@docs $docs $($cdocs)?),
        })
    };
    (@docs [$($doc:literal)*]) => { &[$($doc),*] };
    (@docs [$($doc:literal)*] [$($cdoc:literal)*]) => { &[$($cdoc),*] };
}

metrics! {
    /// Cumulative counters since the loader was built (or since `reset`): one
    /// struct for a loader and for a node of a multi-node job, whose fields
    /// from `nodes` on are 0 for a loader alone.
    #[derive(Debug, Clone, Default, Serialize)]
    pub struct Metrics {
        /// Bytes transferred from storage, counted when the consumer reaches
        /// the read (so read-ahead into the next epoch counts in that epoch).
        bytes_read: u64 => C[2] {
            /// Bytes transferred from storage.
        },
        /// Bytes of samples handed out (as stored).
        bytes_served: u64 => C[3],
        samples_served: u64 => C[4],
        /// Device reads (extents).
        reads_issued: u64 => C[5] {
            /// Device reads issued.
        },
        /// Plan refills (Read events): memory misses.
        refills: u64 => C[6] {
            /// Memory refills of the plan (chunk reads).
        },
        /// Refills read record by record as each comes due: large reads of
        /// the epoch a loader starts at (a Brand start's whole chunks).
        reads_deferred: u64 => C[46] {
            /// Plan reads of a start's first fill read record by record as each
            /// sample came due, not whole (large reads: a Brand start's chunks).
        },
        /// Single-record reads for samples the plan expected in memory but that
        /// were not (after a resume, or for padding repeats).
        recovery_reads: u64 => C[7] {
            /// Single-record reads for samples the plan expected in memory (after a resume).
        },
        /// Times the consumer waited for a read.
        stalls: u64 => C[8] {
            /// Times the consumer waited for a read, and how long.
        },
        stall_secs_total: f64 => C[9],
        stall_p50_secs: f64 => C[10],
        stall_p95_secs: f64 => C[11],
        stall_p99_secs: f64 => C[12],
        stall_max_secs: f64 => C[13],
        /// Peak bytes of resident samples, as served (decoded).
        peak_resident_bytes: u64 => C[14] {
            /// Peak bytes of resident samples as served (decoded).
        },
        peak_resident_samples: u64 => C[15],
        /// The memory this rank's plan holds, in slots (samples' worth):
        /// `memory` as given, or a DataLoader worker's share of its process's
        /// (rounded up where a percentage was too small for it); 0 without a
        /// plan.
        memory_slots: u64 => C[47] {
            /// The memory this loader's plan holds, in slots (samples' worth):
            /// `memory` as given; 0 without a plan (an attached job).
            /// (Appended after `reads_deferred` without an ABI bump, like
            /// `threads_backend`.)
        },
        /// Peak bytes of reads in flight (issued, not yet taken in): bounded by
        /// `readahead`, which the last read issued may overshoot by its own size.
        peak_readahead_bytes: u64 => C[20],
        /// Bytes of read buffers registered with io_uring (fixed buffers).
        registered_buffer_bytes: u64 => C[21],
        /// Peak bytes of ordinary (unregistered) read buffers, in use or
        /// pooled: those of whole-chunk reads and of records over 512 KiB.
        peak_read_buffer_bytes: u64 => C[22],
        /// Samples left out of their epoch because their record was corrupt
        /// (`on_corrupt = "skip"`).
        skipped_corrupt: u64 => C[23],
        /// Whether the engine fell back from O_DIRECT to buffered reads.
        buffered_fallback: bool => C[1: u32 = m.buffered_fallback as u32] {
            /// 1 if reads fell back from O_DIRECT to buffered I/O.
        },
        /// Whether reads go through the threads backend (`pread`), not io_uring.
        threads_backend: bool => C[18: u32 = m.threads_backend as u32] {
            /// 1 if reads go through the threads backend (`pread`), not io_uring.
            /// (This field and those after it were appended in brand 0.1 without an
            /// ABI bump: `struct_size` tells a caller compiled against an older
            /// header from one that has them.)
        },
        /// Whether `io_backend = "auto"` found io_uring refused and fell back to threads.
        uring_refused: bool => C[19: u32 = m.uring_refused as u32] {
            /// 1 if `io_backend = "auto"` found io_uring refused and fell back to threads.
        },
        /// The read gap in effect (None = whole chunks).
        read_gap: Option<u64> => C[16: u64 = m.read_gap.unwrap_or(BRAND_READ_GAP_WHOLE)] {
            /// The read gap in bytes, or `BRAND_READ_GAP_WHOLE`.
        },
        /// The plan's run length (`run_length`; 0 where not reported: a node of a multi-node job).
        // 64 bits in C: a 32-bit last field would leave the struct padding
        // that `brand_get_metrics` would copy out uninitialised.
        run_length: u32 => C[48: u64 = u64::from(m.run_length)] {
            /// The plan's run length (`run_length`, records per run; 0 where not
            /// reported: a node of a multi-node job).
        },
        /// The number of nodes of the multi-node job (0: a loader alone). Of a
        /// node, `bytes_read`/`reads_issued` count its own storage reads (the
        /// chunks it owns), `samples_served`/`bytes_served` what it handed out,
        /// and `stalls` its waits for a sample not yet read or pushed.
        nodes: u32 => C[24] {
            /// The number of nodes of the multi-node job this loader is a node of
            /// (0: a single-process loader; then the fields below are 0). Of a node,
            /// the fields above count: `bytes_read`/`reads_issued` its own storage
            /// reads (the chunks it owns), `samples_served`/`bytes_served` what it
            /// handed out, `stalls` and `stall_*_secs` its waits for a sample not
            /// yet read or pushed (on-demand waits; no percentiles). (Appended
            /// after `skipped_corrupt` without an ABI bump, like `threads_backend`.)
        },
        /// This node's rank.
        node_rank: u32 => C[25] {
            /// This node's rank (0 for a single-process loader).
        },
        /// Samples served that this node read itself (never crossed the network).
        samples_local: u64 => C[26],
        /// Samples served here that another node read and pushed, and their
        /// bytes (what came for an epoch this node never reached is not counted).
        samples_received: u64 => C[27],
        bytes_received: u64 => C[28],
        /// Samples this node pushed to others, and their bytes.
        samples_pushed: u64 => C[29] {
            /// Samples this node pushed to other nodes, and their bytes.
        },
        bytes_pushed: u64 => C[30],
        /// Most bytes of pushed and local samples held at once, and the limit
        /// (`remote_memory`).
        remote_memory_peak: u64 => C[31] {
            /// Most bytes of pushed and local samples held at once (high-water
            /// mark), and the limit (`remote_memory`).
        },
        remote_memory_limit: u64 => C[32],
        /// Most bytes this node held read but not yet pushed.
        owner_peak_bytes: u64 => C[33],
        /// A dataset in object storage (the rest 0 otherwise): requests the
        /// reads sent (GETs, their retries, resumes and hedges; HEADs; not the
        /// open's few: manifest, index, segment HEADs or listing), body bytes
        /// fetched (`bytes_read` counts the extents the loader asked for),
        /// retries and their causes (a status such as "503", "connect", "reset", "stall",
        /// "cut", "slow"), hedged GETs, GET latency (first request to last byte) and
        /// time to first byte, and the GETs-in-flight limit now.
        store_requests: u64 => C[34] {
            /// A dataset in object storage (0 otherwise; appended without an ABI
            /// bump, like `threads_backend`): requests sent (GETs with their
            /// retries, resumes and hedges; HEADs), body bytes fetched, retries
            /// (all causes: 5xx, 429, resets, stalls, cut bodies), hedged GETs,
            /// GET latency P50 and P99 and time to first byte P50 in milliseconds,
            /// and the GETs-in-flight limit now (halved while the store throttles).
        },
        store_bytes_fetched: u64 => C[35],
        store_retries: u64 => C[36],
        // A map (cause → count) has no fixed C layout: C has the total,
        // `store_retries`.
        store_retries_by_cause: std::collections::BTreeMap<String, u64> => C[],
        store_hedges: u64 => C[37],
        store_get_p50_ms: f64 => C[38],
        store_get_p99_ms: f64 => C[39],
        store_first_byte_p50_ms: f64 => C[40],
        store_gets_in_flight_limit: u64 => C[41],
        /// Metadata, outside the sample budget. `index.bin`'s size: mapped
        /// read-only, so every process on the machine that reads the dataset
        /// shares one copy in the page cache (held on the heap instead when
        /// `index_heap_bytes` says so: an index fetched from a store that could
        /// not be cached on disk).
        index_file_bytes: u64 => C[42] {
            /// Metadata outside the sample budget: `index.bin`'s size (mapped and
            /// shared by every process reading the dataset on this machine), the
            /// index's bytes on this process's heap, and the plan's per-sample
            /// state on the heap now and at most.
        },
        /// The index's bytes on this process's heap: 8 a chunk, plus the whole
        /// file when it is held rather than mapped.
        index_heap_bytes: u64 => C[43] {},
        /// The plan's per-sample state on this process's heap now (this
        /// epoch's order and reads, the next epoch's planned ahead), and the
        /// most it held at once.
        plan_bytes: u64 => C[44] {},
        plan_peak_bytes: u64 => C[45],
        /// A dataset at a URL read with a local tier (`disk_cache`; 0
        /// otherwise): reads served from the tier's disk and their bytes,
        /// chunks fetched whole into it and their bytes, reads of chunks it
        /// had no room for (read from the store), reads that waited for
        /// another process's fetch of their chunk, reads from it that failed
        /// (read from the store instead); and now: the dataset's chunks it
        /// keeps, the bytes its directory holds (every dataset in it) and
        /// the limit.
        tier_hits: u64 => C[49] {
            /// (Appended after `run_length` without an ABI bump, like
            /// `threads_backend`.) A dataset at a URL read with a local tier (0 otherwise): reads
            /// served from the tier and their bytes, chunks fetched whole into
            /// it and their bytes, reads it had no room for, reads that waited
            /// for another process's fetch, failed tier reads; the dataset's
            /// chunks kept, the bytes the tier holds and its limit now.
        },
        tier_hit_bytes: u64 => C[50],
        tier_chunks_fetched: u64 => C[51],
        tier_bytes_fetched: u64 => C[52],
        tier_refused: u64 => C[53],
        tier_waited: u64 => C[54],
        tier_failed_reads: u64 => C[55],
        tier_kept_chunks: u64 => C[56],
        tier_held_bytes: u64 => C[57],
        tier_limit_bytes: u64 => C[58],
        /// The tier's placement among the datasets its directory's readers
        /// read: the share of its time this loader's consumer waits for the
        /// store (measured while the store serves most reads; None until
        /// then), the bytes of the tier its dataset is owed, and the bytes
        /// it evicted for datasets owed more room (its own chunks shed,
        /// datasets nobody read removed).
        tier_benefit: Option<f64> => C[59: f64 = m.tier_benefit.unwrap_or(-1.0)] {
            /// The tier's placement: the share of its time this loader's
            /// consumer waits for the store (-1: not measured yet), the bytes of
            /// the tier its dataset is owed, the bytes it evicted for others.
        },
        tier_owed_bytes: u64 => C[60],
        tier_evicted_bytes: u64 => C[61],
    }
    C only {
        /// `bytes_read / bytes_served` (0 before anything was served).
        read_amplification => C[17: f64 = m.read_amplification()],
    }
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
    /// The tier's fields from `now`, counted since `base` (what it keeps,
    /// holds and may hold are `now`'s).
    pub fn set_tier(&mut self, now: &brand_io::tier::TierReport, base: Option<&brand_io::tier::TierReport>) {
        let zero = brand_io::tier::TierReport::default();
        let base = base.unwrap_or(&zero);
        self.tier_hits = now.hits.saturating_sub(base.hits);
        self.tier_hit_bytes = now.hit_bytes.saturating_sub(base.hit_bytes);
        self.tier_chunks_fetched = now.chunks_fetched.saturating_sub(base.chunks_fetched);
        self.tier_bytes_fetched = now.bytes_fetched.saturating_sub(base.bytes_fetched);
        self.tier_refused = now.refused.saturating_sub(base.refused);
        self.tier_waited = now.waited.saturating_sub(base.waited);
        self.tier_failed_reads = now.failed_reads.saturating_sub(base.failed_reads);
        self.tier_kept_chunks = now.kept_chunks;
        self.tier_held_bytes = now.held_bytes;
        self.tier_limit_bytes = now.limit_bytes;
        self.tier_benefit = now.benefit;
        self.tier_owed_bytes = now.owed_bytes;
        self.tier_evicted_bytes = now.evicted_bytes.saturating_sub(base.evicted_bytes);
    }

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
    fn every_metric_has_a_c_field_but_the_retry_causes() {
        // What `brand read --json` and Python's metrics() show, against brand_metrics.
        let json = serde_json::to_value(Metrics::default()).expect("json");
        let c: Vec<&str> = Metrics::c_fields().iter().map(|f| f.name).collect();
        let rust_only: Vec<&str> = json
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .filter(|k| !c.contains(k))
            .collect();
        assert_eq!(rust_only, ["store_retries_by_cause"]);
    }

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
