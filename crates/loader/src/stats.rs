//! Loader metrics: what was read, what was served, and how long the consumer
//! waited for I/O.

use std::time::Duration;

use serde::Serialize;

/// Cumulative counters since the loader was built (or since `reset`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Metrics {
    /// Bytes transferred from storage.
    pub bytes_read: u64,
    /// Bytes of samples handed out (as stored).
    pub bytes_served: u64,
    pub samples_served: u64,
    /// Device reads (extents).
    pub reads_issued: u64,
    /// Plan refills (Read events): memory misses.
    pub refills: u64,
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
    pub peak_resident_bytes: u64,
    pub peak_resident_samples: u64,
    /// Whether the engine fell back from O_DIRECT to buffered reads.
    pub buffered_fallback: bool,
    /// The read gap in effect (None = whole chunks).
    pub read_gap: Option<u64>,
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

/// Stall durations, for percentiles.
#[derive(Debug, Default, Clone)]
pub(crate) struct StallLog {
    nanos: Vec<u64>,
}

impl StallLog {
    pub fn record(&mut self, d: Duration) {
        self.nanos.push(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    pub fn fill(&self, m: &mut Metrics) {
        let mut v = self.nanos.clone();
        v.sort_unstable();
        let pct = |p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i] as f64 * 1e-9
        };
        m.stalls = v.len() as u64;
        m.stall_secs_total = v.iter().sum::<u64>() as f64 * 1e-9;
        m.stall_p50_secs = pct(0.50);
        m.stall_p95_secs = pct(0.95);
        m.stall_p99_secs = pct(0.99);
        m.stall_max_secs = v.last().map(|&x| x as f64 * 1e-9).unwrap_or(0.0);
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
        assert!((m.stall_p50_secs - 0.050).abs() < 1e-9);
        assert!((m.stall_p95_secs - 0.095).abs() < 1e-9);
        assert!((m.stall_p99_secs - 0.099).abs() < 1e-9);
        assert!((m.stall_max_secs - 0.100).abs() < 1e-9);
    }
}
