//! A latency histogram updated from I/O threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds: 50 µs (a request
/// served from a target's RAM over a fast network) to 10 s (a reconnect
/// the request waited out), roughly 1-2.5-5 per decade so that quantiles
/// estimated from them are within a factor of about 2.
pub const LATENCY_BOUNDS_SECONDS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

const BOUNDS_NS: [u64; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Counts per bucket (not cumulative) and the sum, with relaxed atomics:
/// an observation is a bucket search over 17 bounds and two adds, no
/// lock. A scrape may see an observation's bucket before its sum; the
/// count is derived from the buckets, so buckets and count always agree.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; 18],
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one latency.
    pub fn observe(&self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|b| *b < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A copy for rendering.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: &LATENCY_BOUNDS_SECONDS,
            counts: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// A histogram to render: `counts[i]` observations were at most
/// `bounds[i]` and above the bound before; the last count is those above
/// every bound (the `+Inf` bucket's own share).
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds, increasing.
    pub bounds: &'static [f64],
    /// Per bucket, `bounds.len() + 1` of them.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum_seconds: f64,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_agree_and_increase() {
        for (s, ns) in LATENCY_BOUNDS_SECONDS.iter().zip(BOUNDS_NS) {
            assert_eq!((s * 1e9).round() as u64, ns);
        }
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_value_on_a_bound_is_in_that_bucket() {
        let h = LatencyHistogram::new();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_nanos(50_001));
        h.observe(Duration::from_secs(3600));
        let s = h.snapshot();
        assert_eq!((s.counts[0], s.counts[1], s.counts[17]), (1, 1, 1));
        assert_eq!(s.count(), 3);
    }
}
