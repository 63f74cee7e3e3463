//! Metrics of a run: latency percentiles and the paper's f-Util.

use serde::{Deserialize, Serialize};

/// Latency statistics of a set of I/Os, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// I/Os counted.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

impl LatencySummary {
    /// Summarizes latencies given in nanoseconds (nearest-rank percentiles).
    /// Sorts `latencies_ns` in place.
    pub fn from_nanos(latencies_ns: &mut [u64]) -> Self {
        if latencies_ns.is_empty() {
            return LatencySummary::default();
        }
        latencies_ns.sort_unstable();
        let n = latencies_ns.len();
        let at = |q: f64| {
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            latencies_ns[rank - 1] as f64 / 1e3
        };
        let sum: u128 = latencies_ns.iter().map(|&l| u128::from(l)).sum();
        LatencySummary {
            count: n as u64,
            mean_us: sum as f64 / n as f64 / 1e3,
            p50_us: at(0.5),
            p99_us: at(0.99),
            p999_us: at(0.999),
        }
    }
}

/// f-Util of one worker (§5.1): its bandwidth over its fair share of its
/// standalone maximum, `bw / (standalone_max / workers)`; 1 is ideal.
pub fn f_util(bandwidth: f64, standalone_max: f64, workers: usize) -> f64 {
    if standalone_max <= 0.0 || workers == 0 {
        return 0.0;
    }
    bandwidth / (standalone_max / workers as f64)
}

/// The paper's utilization deviation of one worker (§5.3):
/// `|actual − ideal| / ideal` with ideal f-Util 1.
pub fn deviation(f_util: f64) -> f64 {
    (f_util - 1.0).abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut l: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let s = LatencySummary::from_nanos(&mut l);
        assert_eq!(s.count, 1000);
        assert_eq!(s.p50_us, 500.0);
        assert_eq!(s.p99_us, 990.0);
        assert_eq!(s.p999_us, 999.0);
        assert!((s.mean_us - 500.5).abs() < 1e-9);
        assert_eq!(
            LatencySummary::from_nanos(&mut []),
            LatencySummary::default()
        );
    }

    #[test]
    fn f_util_of_a_fair_share_is_one() {
        assert_eq!(f_util(100.0, 1600.0, 16), 1.0);
        assert_eq!(deviation(0.75), 0.25);
        assert_eq!(f_util(1.0, 0.0, 4), 0.0);
    }
}
