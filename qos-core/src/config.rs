//! Parameters of the Gimbal switch (§4.2 of the paper) with their defaults
//! and validation.
//!
//! Every field has a default taken from §4.2 where the paper gives one; the
//! fields the paper leaves open (initial, minimum and maximum target rate,
//! completion-rate window, write-cost update period, priority weights) have
//! defaults chosen here and documented on the field. Deserializing fills
//! missing fields with their defaults; always call [`GimbalConfig::validate`]
//! (the switch constructor does) before use.

use serde::{Deserialize, Serialize};

use crate::error::{QosError, Result};

/// One KiB in bytes.
pub const KIB: u64 = 1024;
/// One MiB in bytes.
pub const MIB: u64 = 1024 * KIB;

/// Configuration of one per-device Gimbal switch pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GimbalConfig {
    /// Thresh_min (§3.2, §4.2): the upper bound of "congestion-free"
    /// latency; an EWMA below it means the device is under-utilized.
    /// Default 250 µs.
    pub latency_threshold_min_us: u64,
    /// Thresh_max (§3.2, §4.2): an EWMA at or above it means the device is
    /// overloaded. Default 1500 µs.
    pub latency_threshold_max_us: u64,
    /// α_T (§3.2): how far the dynamic threshold moves toward the latency
    /// EWMA on each completion that is not congested. In (0, 1]; default 1/2.
    pub threshold_alpha: f64,
    /// α_D (§3.2): weight of the newest sample in the latency EWMA.
    /// In (0, 1]; default 1/2.
    pub latency_ewma_alpha: f64,
    /// β (Algorithm 1): the target rate grows by β × completion size per
    /// completion in the under-utilized state. At least 1; default 8.
    pub underutilized_rate_gain: f64,
    /// Size of a virtual slot in cost-weighted bytes (§3.5). Default 128 KiB.
    pub slot_size_bytes: u64,
    /// DRR quantum in cost-weighted bytes added to a tenant's deficit per
    /// round (Appendix C: "the basic quantum for a deficit is 128KB").
    /// Default 128 KiB.
    pub drr_quantum_bytes: u64,
    /// Virtual slots a single contending tenant may hold (§3.5, §4.2); with
    /// n contending tenants each gets max(1, this / n). Default 8.
    pub single_tenant_slots: u32,
    /// write_cost_worst (§3.4, §4.2): the cost of a write relative to a read
    /// of the same size on a fully fragmented device. At least 1; default 9.
    pub write_cost_worst: f64,
    /// δ (§3.4): additive decrease of the write cost per update while writes
    /// are fast. Positive; default 0.5.
    pub write_cost_decrement: f64,
    /// Minimum time between two write-cost updates (§3.4 says
    /// "periodically" without a period). 0 means on every write completion.
    /// Default 10 ms: §4.2 wants the cost lowered "only when writes are
    /// served fast from the SSD (not intermediate low write latency)". In
    /// simulation (`docs/qos-simulation.md`) a 1 ms period let the cost
    /// follow the write buffer's fill level from 9 down to 1 within 16 ms
    /// whenever the buffer had room, which let writers flood the switch
    /// (fragmented 4 KiB writers' p99 latency rose above FIFO's); at 10 ms
    /// the cost stays near the device's true cost under sustained writes
    /// and still reaches 1 within 160 ms for writes the buffer absorbs.
    pub write_cost_update_interval_us: u64,
    /// Capacity of each of the read and write token buckets in bytes
    /// (Appendix C.1). Default 256 KiB.
    pub token_bucket_bytes: u64,
    /// Target rate before the first completion, bytes per second. Not given
    /// by the paper. Default 1 GiB/s: starting high keeps a fresh device
    /// from being throttled by the ramp (under-utilized growth is β × size
    /// per completion, i.e. about e^β per second), and a device that cannot
    /// sustain it is cut to its completion rate by the first overloaded
    /// completion.
    pub initial_target_rate_bps: u64,
    /// Floor of the target rate, bytes per second. The paper has none, but
    /// a rate of zero would stop all dispatch and hence all completions that
    /// could raise it again. Default 1 MiB/s.
    pub min_target_rate_bps: u64,
    /// Ceiling of the target rate, bytes per second. The paper has none; it
    /// keeps a long under-utilized period (β growth per completion) from
    /// ramping the rate without bound. Default 64 GiB/s.
    pub max_target_rate_bps: u64,
    /// Window over which the completion rate used by the overloaded state is
    /// measured (§3.3: "Gimbal periodically measures the completion rate").
    /// Default 5000 µs.
    pub completion_rate_window_us: u64,
    /// Weights of the per-tenant priority queues (§3.5), index = priority
    /// level, level 0 first. A level's queue may send this many requests per
    /// round-robin turn. Default [8, 4, 2, 1] (NVMe urgent/high/medium/low).
    pub priority_weights: Vec<u32>,
}

impl Default for GimbalConfig {
    fn default() -> Self {
        GimbalConfig {
            latency_threshold_min_us: 250,
            latency_threshold_max_us: 1500,
            threshold_alpha: 0.5,
            latency_ewma_alpha: 0.5,
            underutilized_rate_gain: 8.0,
            slot_size_bytes: 128 * KIB,
            drr_quantum_bytes: 128 * KIB,
            single_tenant_slots: 8,
            write_cost_worst: 9.0,
            write_cost_decrement: 0.5,
            write_cost_update_interval_us: 10_000,
            token_bucket_bytes: 256 * KIB,
            initial_target_rate_bps: 1024 * MIB,
            min_target_rate_bps: MIB,
            max_target_rate_bps: 64 * 1024 * MIB,
            completion_rate_window_us: 5000,
            priority_weights: vec![8, 4, 2, 1],
        }
    }
}

/// Checks that `value` lies in (0, 1].
pub(crate) fn check_unit_fraction(field: &'static str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(QosError::invalid(
            field,
            format!("must be in (0, 1], got {value}"),
        ))
    }
}

/// Checks that `value` is finite and at least `min`.
pub(crate) fn check_at_least(field: &'static str, value: f64, min: f64) -> Result<()> {
    if value.is_finite() && value >= min {
        Ok(())
    } else {
        Err(QosError::invalid(
            field,
            format!("must be a finite number >= {min}, got {value}"),
        ))
    }
}

/// Checks that an integer field is non-zero.
pub(crate) fn check_nonzero(field: &'static str, value: u64) -> Result<()> {
    if value == 0 {
        Err(QosError::invalid(field, "must be greater than 0"))
    } else {
        Ok(())
    }
}

impl GimbalConfig {
    /// Rejects out-of-range or contradictory values, naming the field.
    pub fn validate(&self) -> Result<()> {
        check_nonzero("latency_threshold_min_us", self.latency_threshold_min_us)?;
        if self.latency_threshold_min_us >= self.latency_threshold_max_us {
            return Err(QosError::invalid(
                "latency_threshold_min_us",
                format!(
                    "must be less than latency_threshold_max_us ({} >= {})",
                    self.latency_threshold_min_us, self.latency_threshold_max_us
                ),
            ));
        }
        check_unit_fraction("threshold_alpha", self.threshold_alpha)?;
        check_unit_fraction("latency_ewma_alpha", self.latency_ewma_alpha)?;
        check_at_least("underutilized_rate_gain", self.underutilized_rate_gain, 1.0)?;
        check_nonzero("slot_size_bytes", self.slot_size_bytes)?;
        check_nonzero("drr_quantum_bytes", self.drr_quantum_bytes)?;
        check_nonzero("single_tenant_slots", u64::from(self.single_tenant_slots))?;
        check_at_least("write_cost_worst", self.write_cost_worst, 1.0)?;
        if !(self.write_cost_decrement.is_finite() && self.write_cost_decrement > 0.0) {
            return Err(QosError::invalid(
                "write_cost_decrement",
                format!(
                    "must be a finite number > 0, got {}",
                    self.write_cost_decrement
                ),
            ));
        }
        check_nonzero("token_bucket_bytes", self.token_bucket_bytes)?;
        check_nonzero("min_target_rate_bps", self.min_target_rate_bps)?;
        if self.min_target_rate_bps > self.max_target_rate_bps {
            return Err(QosError::invalid(
                "min_target_rate_bps",
                format!(
                    "must not exceed max_target_rate_bps ({} > {})",
                    self.min_target_rate_bps, self.max_target_rate_bps
                ),
            ));
        }
        if self.initial_target_rate_bps < self.min_target_rate_bps
            || self.initial_target_rate_bps > self.max_target_rate_bps
        {
            return Err(QosError::invalid(
                "initial_target_rate_bps",
                format!(
                    "must lie in [min_target_rate_bps, max_target_rate_bps] = [{}, {}], got {}",
                    self.min_target_rate_bps,
                    self.max_target_rate_bps,
                    self.initial_target_rate_bps
                ),
            ));
        }
        check_nonzero("completion_rate_window_us", self.completion_rate_window_us)?;
        if self.priority_weights.is_empty() {
            return Err(QosError::invalid(
                "priority_weights",
                "must name at least one level",
            ));
        }
        if self.priority_weights.len() > usize::from(u8::MAX) + 1 {
            return Err(QosError::invalid("priority_weights", "at most 256 levels"));
        }
        if self.priority_weights.contains(&0) {
            return Err(QosError::invalid(
                "priority_weights",
                "every weight must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_paper() {
        let c = GimbalConfig::default();
        c.validate().unwrap();
        assert_eq!(c.latency_threshold_min_us, 250);
        assert_eq!(c.latency_threshold_max_us, 1500);
        assert_eq!(c.threshold_alpha, 0.5);
        assert_eq!(c.latency_ewma_alpha, 0.5);
        assert_eq!(c.underutilized_rate_gain, 8.0);
        assert_eq!(c.slot_size_bytes, 131072);
        assert_eq!(c.single_tenant_slots, 8);
        assert_eq!(c.write_cost_worst, 9.0);
        assert_eq!(c.write_cost_decrement, 0.5);
        assert_eq!(c.token_bucket_bytes, 262144);
    }

    fn field_of(c: &GimbalConfig) -> &'static str {
        match c.validate() {
            Err(QosError::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn contradictions_name_the_field() {
        let mut c = GimbalConfig {
            latency_threshold_min_us: 1500,
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "latency_threshold_min_us");
        c = GimbalConfig {
            threshold_alpha: 0.0,
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "threshold_alpha");
        c = GimbalConfig {
            latency_ewma_alpha: 1.5,
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "latency_ewma_alpha");
        c = GimbalConfig {
            latency_ewma_alpha: f64::NAN,
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "latency_ewma_alpha");
        c = GimbalConfig {
            write_cost_worst: 0.5,
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "write_cost_worst");
        c = GimbalConfig {
            min_target_rate_bps: 10,
            max_target_rate_bps: 5,
            initial_target_rate_bps: 5,
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "min_target_rate_bps");
        c = GimbalConfig {
            priority_weights: vec![1, 0],
            ..GimbalConfig::default()
        };
        assert_eq!(field_of(&c), "priority_weights");
        let msg = GimbalConfig {
            threshold_alpha: 2.0,
            ..GimbalConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(msg.contains("threshold_alpha"), "{msg}");
    }

    #[test]
    fn alpha_of_one_is_allowed() {
        let c = GimbalConfig {
            threshold_alpha: 1.0,
            latency_ewma_alpha: 1.0,
            ..GimbalConfig::default()
        };
        c.validate().unwrap();
    }
}
