//! Generated from brand-loader's metrics table (crates/loader/src/stats.rs)
//! by capi/tests/header.rs: edit the table, then run
//! `BRAND_BLESS=1 cargo test -p brand-capi --test header`. Do not edit.

use super::*;

/// Loader counters (`brand_get_metrics`), cumulative since the loader was opened. Set
/// `struct_size = sizeof(brand_metrics)` before the call: the library fills
/// at most that many bytes and sets `struct_size` to the bytes it filled,
/// so fields appended later never overrun an older caller's struct, and a
/// newer caller can tell which fields an older library filled.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct brand_metrics {
    /// In: the caller's `sizeof(brand_metrics)`. Out: the bytes filled.
    pub struct_size: u32,
    /// 1 if reads fell back from O_DIRECT to buffered I/O.
    pub buffered_fallback: u32,
    /// Bytes transferred from storage.
    pub bytes_read: u64,
    /// Bytes of samples handed out (as stored).
    pub bytes_served: u64,
    pub samples_served: u64,
    /// Device reads issued.
    pub reads_issued: u64,
    /// Memory refills of the plan (chunk reads).
    pub refills: u64,
    /// Single-record reads for samples the plan expected in memory (after a resume).
    pub recovery_reads: u64,
    /// Times the consumer waited for a read, and how long.
    pub stalls: u64,
    pub stall_secs_total: f64,
    pub stall_p50_secs: f64,
    pub stall_p95_secs: f64,
    pub stall_p99_secs: f64,
    pub stall_max_secs: f64,
    /// Peak bytes of resident samples as served (decoded).
    pub peak_resident_bytes: u64,
    pub peak_resident_samples: u64,
    /// The read gap in bytes, or `BRAND_READ_GAP_WHOLE`.
    pub read_gap: u64,
    /// `bytes_read / bytes_served` (0 before anything was served).
    pub read_amplification: f64,
    /// 1 if reads go through the threads backend (`pread`), not io_uring.
    /// (This field and those after it were appended in brand 0.1 without an
    /// ABI bump: `struct_size` tells a caller compiled against an older
    /// header from one that has them.)
    pub threads_backend: u32,
    /// 1 if `io_backend = "auto"` found io_uring refused and fell back to threads.
    pub uring_refused: u32,
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
    /// The number of nodes of the multi-node job this loader is a node of
    /// (0: a single-process loader; then the fields below are 0). Of a node,
    /// the fields above count: `bytes_read`/`reads_issued` its own storage
    /// reads (the chunks it owns), `samples_served`/`bytes_served` what it
    /// handed out, `stalls` and `stall_*_secs` its waits for a sample not
    /// yet read or pushed (on-demand waits; no percentiles). (Appended
    /// after `skipped_corrupt` without an ABI bump, like `threads_backend`.)
    pub nodes: u32,
    /// This node's rank (0 for a single-process loader).
    pub node_rank: u32,
    /// Samples served that this node read itself (never crossed the network).
    pub samples_local: u64,
    /// Samples served here that another node read and pushed, and their
    /// bytes (what came for an epoch this node never reached is not counted).
    pub samples_received: u64,
    pub bytes_received: u64,
    /// Samples this node pushed to other nodes, and their bytes.
    pub samples_pushed: u64,
    pub bytes_pushed: u64,
    /// Most bytes of pushed and local samples held at once (high-water
    /// mark), and the limit (`remote_memory`).
    pub remote_memory_peak: u64,
    pub remote_memory_limit: u64,
    /// Most bytes this node held read but not yet pushed.
    pub owner_peak_bytes: u64,
    /// A dataset in object storage (0 otherwise; appended without an ABI
    /// bump, like `threads_backend`): requests sent (GETs with their
    /// retries, resumes and hedges; HEADs), body bytes fetched, retries
    /// (all causes: 5xx, 429, resets, stalls, cut bodies), hedged GETs,
    /// GET latency P50 and P99 and time to first byte P50 in milliseconds,
    /// and the GETs-in-flight limit now (halved while the store throttles).
    pub store_requests: u64,
    pub store_bytes_fetched: u64,
    pub store_retries: u64,
    pub store_hedges: u64,
    pub store_get_p50_ms: f64,
    pub store_get_p99_ms: f64,
    pub store_first_byte_p50_ms: f64,
    pub store_gets_in_flight_limit: u64,
    /// Metadata outside the sample budget: `index.bin`'s size (mapped and
    /// shared by every process reading the dataset on this machine), the
    /// index's bytes on this process's heap, and the plan's per-sample
    /// state on the heap now and at most.
    pub index_file_bytes: u64,
    pub index_heap_bytes: u64,
    pub plan_bytes: u64,
    pub plan_peak_bytes: u64,
    /// Plan reads of a start's first fill read record by record as each
    /// sample came due, not whole (large reads: a Brand start's chunks).
    pub reads_deferred: u64,
    /// The memory this loader's plan holds, in slots (samples' worth):
    /// `memory` as given; 0 without a plan (an attached job).
    /// (Appended after `reads_deferred` without an ABI bump, like
    /// `threads_backend`.)
    pub memory_slots: u64,
    /// The plan's run length (`run_length`, records per run; 0 where not
    /// reported: a node of a multi-node job).
    pub run_length: u64,
    /// (Appended after `run_length` without an ABI bump, like
    /// `threads_backend`.) A dataset at a URL read with a local tier (0 otherwise): reads
    /// served from the tier and their bytes, chunks fetched whole into
    /// it and their bytes, reads it had no room for, reads that waited
    /// for another process's fetch, failed tier reads; the dataset's
    /// chunks kept, the bytes the tier holds and its limit now.
    pub tier_hits: u64,
    pub tier_hit_bytes: u64,
    pub tier_chunks_fetched: u64,
    pub tier_bytes_fetched: u64,
    pub tier_refused: u64,
    pub tier_waited: u64,
    pub tier_failed_reads: u64,
    pub tier_kept_chunks: u64,
    pub tier_held_bytes: u64,
    pub tier_limit_bytes: u64,
    /// The tier's placement: the share of its time this loader's
    /// consumer waits for the store (-1: not measured yet), the bytes of
    /// the tier its dataset is owed, the bytes it evicted for others.
    pub tier_benefit: f64,
    pub tier_owed_bytes: u64,
    pub tier_evicted_bytes: u64,
}

// No padding: brand_get_metrics copies the struct out as bytes.
const _: () = assert!(size_of::<brand_metrics>() == 472);

impl From<&Metrics> for brand_metrics {
    fn from(m: &Metrics) -> Self {
        brand_metrics {
            struct_size: size_of::<brand_metrics>() as u32,
            buffered_fallback: m.buffered_fallback as u32,
            bytes_read: m.bytes_read,
            bytes_served: m.bytes_served,
            samples_served: m.samples_served,
            reads_issued: m.reads_issued,
            refills: m.refills,
            recovery_reads: m.recovery_reads,
            stalls: m.stalls,
            stall_secs_total: m.stall_secs_total,
            stall_p50_secs: m.stall_p50_secs,
            stall_p95_secs: m.stall_p95_secs,
            stall_p99_secs: m.stall_p99_secs,
            stall_max_secs: m.stall_max_secs,
            peak_resident_bytes: m.peak_resident_bytes,
            peak_resident_samples: m.peak_resident_samples,
            read_gap: m.read_gap.unwrap_or(BRAND_READ_GAP_WHOLE),
            read_amplification: m.read_amplification(),
            threads_backend: m.threads_backend as u32,
            uring_refused: m.uring_refused as u32,
            peak_readahead_bytes: m.peak_readahead_bytes,
            registered_buffer_bytes: m.registered_buffer_bytes,
            peak_read_buffer_bytes: m.peak_read_buffer_bytes,
            skipped_corrupt: m.skipped_corrupt,
            nodes: m.nodes,
            node_rank: m.node_rank,
            samples_local: m.samples_local,
            samples_received: m.samples_received,
            bytes_received: m.bytes_received,
            samples_pushed: m.samples_pushed,
            bytes_pushed: m.bytes_pushed,
            remote_memory_peak: m.remote_memory_peak,
            remote_memory_limit: m.remote_memory_limit,
            owner_peak_bytes: m.owner_peak_bytes,
            store_requests: m.store_requests,
            store_bytes_fetched: m.store_bytes_fetched,
            store_retries: m.store_retries,
            store_hedges: m.store_hedges,
            store_get_p50_ms: m.store_get_p50_ms,
            store_get_p99_ms: m.store_get_p99_ms,
            store_first_byte_p50_ms: m.store_first_byte_p50_ms,
            store_gets_in_flight_limit: m.store_gets_in_flight_limit,
            index_file_bytes: m.index_file_bytes,
            index_heap_bytes: m.index_heap_bytes,
            plan_bytes: m.plan_bytes,
            plan_peak_bytes: m.plan_peak_bytes,
            reads_deferred: m.reads_deferred,
            memory_slots: m.memory_slots,
            run_length: u64::from(m.run_length),
            tier_hits: m.tier_hits,
            tier_hit_bytes: m.tier_hit_bytes,
            tier_chunks_fetched: m.tier_chunks_fetched,
            tier_bytes_fetched: m.tier_bytes_fetched,
            tier_refused: m.tier_refused,
            tier_waited: m.tier_waited,
            tier_failed_reads: m.tier_failed_reads,
            tier_kept_chunks: m.tier_kept_chunks,
            tier_held_bytes: m.tier_held_bytes,
            tier_limit_bytes: m.tier_limit_bytes,
            tier_benefit: m.tier_benefit.unwrap_or(-1.0),
            tier_owed_bytes: m.tier_owed_bytes,
            tier_evicted_bytes: m.tier_evicted_bytes,
        }
    }
}
