//! The queueing model of weighted class arbitration (ionice paper §IV-A,
//! Equations 1–3): per-class throughput and worst-case latency predicted
//! from the class weights and loads, for provisioning and for checking an
//! arbiter against.
//!
//! Symbols (paper Table I): weights h/m/l, arrival rate λ, device
//! throughput γ, utilization ρ, parallelism p, queue depth q, average
//! request latency a. For WRR, rates are in commands per second and weights
//! in commands; for DRR, rates are in bytes per second and weights in bytes
//! ("replacing γ with the average SSD bandwidth should suffice").
//!
//! Decisions where the paper is vague:
//! - The paper writes the equations for the high class; by symmetry, for
//!   any class c: γ_c = min(λ_c, w_c / (w_c + Σ_{o≠c} ρ_o w_o) × γ) and
//!   t_max,c = (q / w_c) × (w_c + Σ_{o≠c} ρ_o w_o) / p × a.
//! - ρ = λ / γ (the paper's "utilization of each class can be computed as
//!   λ/γ"), clamped to [0, 1]: a class cannot use more than its whole
//!   weight in a round.
//! - Urgent is outside the model (strict priority); pass only h/m/l.

use serde::{Deserialize, Serialize};

/// Index of each weighted class in the arrays of this module.
pub const HIGH: usize = 0;
/// See [`HIGH`].
pub const MEDIUM: usize = 1;
/// See [`HIGH`].
pub const LOW: usize = 2;

/// Inputs of the model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassLoad {
    /// Weights of high, medium and low (commands for WRR, bytes for DRR).
    pub weights: [f64; 3],
    /// Arrival rates λ of high, medium and low.
    pub arrival_rates: [f64; 3],
    /// Device throughput γ in the same unit as the arrival rates.
    pub device_throughput: f64,
}

impl ClassLoad {
    /// ρ of each class: λ / γ clamped to [0, 1].
    pub fn utilizations(&self) -> [f64; 3] {
        self.arrival_rates.map(|lambda| {
            if self.device_throughput > 0.0 {
                (lambda / self.device_throughput).clamp(0.0, 1.0)
            } else {
                0.0
            }
        })
    }

    /// w_c + Σ_{o≠c} ρ_o w_o: the weight competing in one round.
    fn round_weight(&self, class: usize, utilizations: [f64; 3]) -> f64 {
        (0..3)
            .map(|o| {
                if o == class {
                    self.weights[o]
                } else {
                    utilizations[o] * self.weights[o]
                }
            })
            .sum()
    }

    /// Equation 1: the throughput a backlogged class gets at least,
    /// w_c / (h + m + l) × γ.
    pub fn min_throughput(&self, class: usize) -> f64 {
        let total: f64 = self.weights.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        self.weights[class] / total * self.device_throughput
    }

    /// Equation 2: the expected throughput of a class,
    /// min(λ_c, w_c / (w_c + Σ ρ_o w_o) × γ).
    pub fn throughput(&self, class: usize) -> f64 {
        let round = self.round_weight(class, self.utilizations());
        let share = if round > 0.0 {
            self.weights[class] / round * self.device_throughput
        } else {
            self.device_throughput
        };
        self.arrival_rates[class].min(share)
    }

    /// Equation 2 for all three classes.
    pub fn throughputs(&self) -> [f64; 3] {
        [
            self.throughput(HIGH),
            self.throughput(MEDIUM),
            self.throughput(LOW),
        ]
    }

    /// Equation 3: the worst-case latency of a class with `queue_depth`
    /// outstanding commands on a device of `parallelism` serving a command
    /// in `mean_latency` (any time unit; the result is in the same unit):
    /// (q / w_c) × (w_c + Σ ρ_o w_o) / p × a.
    pub fn max_latency(
        &self,
        class: usize,
        queue_depth: f64,
        parallelism: f64,
        mean_latency: f64,
    ) -> f64 {
        if self.weights[class] <= 0.0 || parallelism <= 0.0 {
            return f64::INFINITY;
        }
        let round = self.round_weight(class, self.utilizations());
        queue_depth / self.weights[class] * round / parallelism * mean_latency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(lambdas: [f64; 3]) -> ClassLoad {
        ClassLoad {
            weights: [4.0, 2.0, 1.0],
            arrival_rates: lambdas,
            device_throughput: 240_000.0,
        }
    }

    #[test]
    fn equation_1_is_the_weight_share() {
        let l = load([1e9; 3]);
        assert!((l.min_throughput(HIGH) - 240_000.0 * 4.0 / 7.0).abs() < 1e-6);
        assert!((l.min_throughput(LOW) - 240_000.0 / 7.0).abs() < 1e-6);
    }

    #[test]
    fn equation_2_alone_gets_the_device() {
        // Nothing in medium and low: ρ = 0, high gets all of γ.
        let l = load([1e9, 0.0, 0.0]);
        assert_eq!(l.throughput(HIGH), 240_000.0);
        // All backlogged: back to Equation 1.
        let l = load([1e9; 3]);
        assert!((l.throughput(HIGH) - l.min_throughput(HIGH)).abs() < 1e-6);
        // A light class gets its arrival rate.
        let l = load([1e9, 1e9, 1000.0]);
        assert_eq!(l.throughput(LOW), 1000.0);
    }

    #[test]
    fn equation_2_grows_as_the_low_class_idles() {
        // The paper's Figure 7 setting: ρ_h = ρ_m = 1, vary ρ_l.
        let mut last = 0.0;
        for lambda_low in [240_000.0, 120_000.0, 60_000.0, 0.0] {
            let t = load([240_000.0, 240_000.0, lambda_low]).throughput(HIGH);
            assert!(t > last);
            last = t;
        }
        assert!((last - 240_000.0 * 4.0 / 6.0).abs() < 1e-6);
    }

    #[test]
    fn equation_3_latency() {
        // q = 32, p = 1, a = 81 µs / p as in the paper's validation.
        let l = load([240_000.0; 3]);
        let t = l.max_latency(HIGH, 32.0, 1.0, 81.0);
        assert!((t - 32.0 / 4.0 * 7.0 * 81.0).abs() < 1e-9);
        assert!(l.max_latency(LOW, 32.0, 1.0, 81.0) > t);
        assert_eq!(l.max_latency(HIGH, 32.0, 0.0, 81.0), f64::INFINITY);
    }
}

#[cfg(test)]
mod arbiter_agreement {
    use super::*;
    use crate::class_arbiter::{ArbiterConfig, ClassArbiter, QueueId};
    use crate::priority::NvmeClass;
    use crate::time::Nanos;

    /// Runs the WRR arbiter against a device that executes one command per
    /// tick, with deterministic arrivals (fractions of a command per tick)
    /// and submission queues capped at `queue_depth` (a full queue rejects
    /// arrivals, as the model assumes). Returns the served fraction of each
    /// weighted class.
    fn simulate(weights: [u32; 3], arrivals: [f64; 3], ticks: u32) -> [f64; 3] {
        let queue_depth = 64;
        let mut a = ClassArbiter::new(ArbiterConfig {
            high_weight: weights[0],
            medium_weight: weights[1],
            low_weight: weights[2],
            aging_threshold_us: 0,
            ..ArbiterConfig::default()
        })
        .unwrap();
        let classes = [NvmeClass::High, NvmeClass::Medium, NvmeClass::Low];
        let mut credit = [0.0f64; 3];
        let mut served = [0u32; 3];
        for tick in 0..ticks {
            for c in 0..3 {
                credit[c] += arrivals[c];
                while credit[c] >= 1.0 {
                    credit[c] -= 1.0;
                    if a.waiting(classes[c]) < queue_depth {
                        a.enqueue(
                            Nanos(u64::from(tick)),
                            QueueId(c as u32),
                            classes[c],
                            4096,
                            (),
                        );
                    }
                }
            }
            if let Some(d) = a.dequeue(Nanos(u64::from(tick))) {
                served[d.class.index() - 1] += 1;
            }
        }
        served.map(|s| f64::from(s) / f64::from(ticks))
    }

    #[test]
    fn equation_2_predicts_the_wrr_arbiter() {
        for (weights, arrivals) in [
            ([4, 2, 1], [1.0, 1.0, 1.0]),
            ([4, 2, 1], [1.0, 1.0, 0.05]),
            ([8, 4, 1], [0.2, 1.0, 1.0]),
            ([1, 1, 1], [1.0, 0.0, 1.0]),
        ] {
            let model = ClassLoad {
                weights: weights.map(f64::from),
                arrival_rates: arrivals,
                device_throughput: 1.0,
            };
            let measured = simulate(weights, arrivals, 20_000);
            for c in 0..3 {
                let predicted = model.throughput(c);
                assert!(
                    (measured[c] - predicted).abs() <= 0.1 * predicted.max(0.01),
                    "weights {weights:?} arrivals {arrivals:?} class {c}: measured {measured:?}, predicted {:?}",
                    model.throughputs()
                );
            }
        }
    }
}
