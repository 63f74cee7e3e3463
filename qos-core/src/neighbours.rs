//! What a gate's probe costs the other tenants of its namespace on the
//! same host: Flint's shadow view (§3) narrowed to the one statistic a
//! view agent sees for free, the end-to-end latency of every volume
//! mounted on the same (target, subsystem, namespace) (issue 14).
//!
//! Why: a gate that sees only its own completions cannot tell a pipeline
//! that delivers more with more in flight from a device whose share it
//! takes from a co-tenant it does not see. Measured in the TCG guest
//! (docs/benchmarks.md, "The tenants on the sim device's own model"): a
//! QD 128 writer beside a QD 1 reader on one device gained 5 % or more
//! per step up, just as the guest's pipelines do, so its gain probe
//! climbed to 4.5-6 while the reader's latency rose with every step.
//! The gate now counts what its probe did to its neighbours:
//!
//! - Each neighbour publishes running totals (completions, and the sum of
//!   their latencies from send to completion) as [`NeighbourTotals`]. A
//!   probe phase's mean latency for a neighbour is the difference of two
//!   snapshots, taken where the phase's own rate is measured.
//! - A probe is judged by **proportional fairness** (Kelly): the sum of
//!   the logarithms of every tenant's throughput must rise by
//!   `ln(1 + UP_GAIN)` for an up probe, and may fall by at most
//!   `ln(1 − DOWN_LOSS)` for a down probe. For a tenant that keeps a fixed
//!   number of requests in flight (a QD 1 reader, or a gated writer
//!   during its cruise) throughput is that number over its latency, so a
//!   neighbour's term is minus the logarithm of its latency ratio: the
//!   probe's phase over the mean of the cruise before and after it (the
//!   A-B-A of [`crate::gain_probe`]). [`probe_cost`] sums those terms;
//!   the gate's own throughput ratio is divided by its exponential.
//! - Why that rule: a probe up that adds 5 % to a writer and 30 % to a
//!   reader's latency is unpaid (the reader lost a quarter of what it
//!   could do), while one that fills a pipeline nobody shares is judged
//!   as before. Two greedy tenants of a saturated device settle where
//!   neither gains by a step: with equal windows on a FIFO device a step
//!   up takes the prober from half the device to 1.5 / 2.5 of it (`ln
//!   1.2`) and the other's latency up by 2.5 / 2 (`ln 1.25`), a net loss
//!   of 0.04; a step down loses `ln 0.8` for the other's `ln(2 / 1.67)`,
//!   a net loss of 0.04 too, beyond what `DOWN_LOSS` allows.
//! - A neighbour counts only when it completed at least
//!   [`MIN_COMPLETIONS`] requests in each of the three phases (an idle
//!   volume says nothing), and each term is clamped to
//!   `±`[`MAX_TERM`], so a neighbour that stalls for another reason (its
//!   path failed over) cannot veto every probe for long.
//! - No neighbours, or none busy: the cost is 0 and the probe decides as
//!   before. The single-volume cases of the bench are unchanged.

/// One neighbour's running totals, as it publishes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NeighbourTotals {
    /// A token that names the neighbour while it lives (not a pid: one
    /// process serves many volumes).
    pub id: u64,
    /// Requests completed since the neighbour started.
    pub completions: u64,
    /// Sum of their latencies, send to completion (ns).
    pub latency_ns: u64,
}

/// Completions a neighbour needs in each phase of a comparison to count.
pub const MIN_COMPLETIONS: u64 = 16;

/// Largest magnitude of one neighbour's term (`ln 4`: a latency four
/// times higher or lower than the cruise's).
pub const MAX_TERM: f64 = 1.386_294_361_119_890_6;

/// The mean latency of each neighbour between two snapshots: `(id, mean
/// ns, completions)` of those present in both whose totals only grew.
pub fn phase_means(start: &[NeighbourTotals], end: &[NeighbourTotals], out: &mut Vec<PhaseMean>) {
    out.clear();
    for e in end {
        let Some(s) = start.iter().find(|s| s.id == e.id) else {
            continue;
        };
        let (Some(n), Some(l)) = (
            e.completions.checked_sub(s.completions),
            e.latency_ns.checked_sub(s.latency_ns),
        ) else {
            continue;
        };
        if n > 0 {
            out.push(PhaseMean {
                id: e.id,
                mean_ns: l as f64 / n as f64,
                completions: n,
            });
        }
    }
}

/// A neighbour's mean latency over one phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseMean {
    /// The neighbour.
    pub id: u64,
    /// Its mean latency over the phase (ns).
    pub mean_ns: f64,
    /// Its completions in the phase.
    pub completions: u64,
}

/// What a probe cost its neighbours: the sum, over every neighbour busy
/// in all three phases, of `ln(probe / mean(before, after))` of its mean
/// latency, each term within `±MAX_TERM`. Positive: they got slower.
pub fn probe_cost(before: &[PhaseMean], probe: &[PhaseMean], after: &[PhaseMean]) -> f64 {
    let find = |v: &[PhaseMean], id| {
        v.iter()
            .find(|m| m.id == id && m.completions >= MIN_COMPLETIONS)
            .map(|m| m.mean_ns)
    };
    before
        .iter()
        .filter(|b| b.completions >= MIN_COMPLETIONS)
        .filter_map(|b| {
            let (p, a) = (find(probe, b.id)?, find(after, b.id)?);
            let cruise = (b.mean_ns + a) / 2.0;
            (cruise > 0.0 && p > 0.0).then(|| (p / cruise).ln().clamp(-MAX_TERM, MAX_TERM))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, completions: u64, latency_ns: u64) -> NeighbourTotals {
        NeighbourTotals {
            id,
            completions,
            latency_ns,
        }
    }

    fn means(start: &[NeighbourTotals], end: &[NeighbourTotals]) -> Vec<PhaseMean> {
        let mut v = Vec::new();
        phase_means(start, end, &mut v);
        v
    }

    #[test]
    fn a_phase_mean_is_the_difference_of_two_snapshots() {
        let m = means(
            &[t(1, 10, 1_000), t(2, 5, 500), t(3, 9, 9)],
            // 1: 20 more in 4,000 ns; 2: gone; 3: totals went back (a
            // restarted neighbour reusing its token): skipped; 4: new.
            &[t(1, 30, 5_000), t(3, 1, 1), t(4, 10, 10)],
        );
        assert_eq!(
            m,
            [PhaseMean {
                id: 1,
                mean_ns: 200.0,
                completions: 20
            }]
        );
    }

    #[test]
    fn the_cost_is_the_log_latency_ratio_over_the_cruise_around_the_probe() {
        let pm = |id, mean_ns, completions| PhaseMean {
            id,
            mean_ns,
            completions,
        };
        // Neighbour 1 went from 100/120 to 165 (1.5x); 2 had too few
        // completions in the probe; 3 was seen only before.
        let before = [pm(1, 100.0, 50), pm(2, 100.0, 50), pm(3, 1.0, 50)];
        let probe = [pm(1, 165.0, 40), pm(2, 1_000.0, 2)];
        let after = [pm(1, 120.0, 50), pm(2, 100.0, 50)];
        assert!((probe_cost(&before, &probe, &after) - 1.5f64.ln()).abs() < 1e-12);
        // A neighbour 100x slower in the probe counts as 4x.
        let probe = [pm(1, 11_000.0, 40)];
        assert!((probe_cost(&before, &probe, &after) - MAX_TERM).abs() < 1e-12);
        assert_eq!(probe_cost(&[], &probe, &after), 0.0);
    }
}
