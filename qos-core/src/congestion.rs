//! Delay-based SSD congestion control (Gimbal §3.2–§3.3, Algorithm 1).
//!
//! The device is treated as a network path whose queueing delay is visible
//! in the completion latency. Each I/O kind has a [`LatencyMonitor`]: an
//! EWMA of completion latency (weight α_D) and a dynamic threshold that
//! lives between Thresh_min and Thresh_max. Every completion classifies the
//! device into one of four [`CongestionState`]s and moves the shared target
//! submission rate:
//!
//! | state | condition (§3.3) | target rate |
//! |---|---|---|
//! | overloaded | ewma ≥ max | reset to the measured completion rate, then − size; tokens discarded |
//! | congested | thresh ≤ ewma < max | − size |
//! | congestion avoidance | min ≤ ewma < thresh | + size |
//! | under-utilized | ewma < min | + β × size |
//!
//! Decisions where the paper is vague:
//! - The state boundaries use the §3.3 definitions (≥), not the strict `>`
//!   of Algorithm 1; the difference only matters on exact ties.
//! - The dynamic threshold is clamped to [Thresh_min, Thresh_max] (§3.2
//!   "we set up the minimum and maximum threshold"); without the clamp the
//!   α_T decay would pull it below Thresh_min on an idle device. It starts
//!   at Thresh_min, the value it converges to on an idle device.
//! - The first latency sample of a kind initializes its EWMA instead of
//!   being averaged with zero.
//! - The state of a completion is decided by the monitor of its own kind
//!   (Algorithm 1 `update_latency(cpl.io_type, …)`); the rate is shared.
//! - The completion rate ("periodically measured", §3.3) is bytes completed
//!   in the previous full window plus the current partial window, divided by
//!   one window plus the elapsed part. Before the first window has passed the
//!   previous window counts as empty, which errs toward a lower rate.
//! - The target rate is clamped to [min_target_rate, max_target_rate] (see
//!   [`GimbalConfig`]) so it can neither stall dispatch nor grow unbounded.
//! - Zero-byte completions (flush and the like) do not feed the monitors.

use serde::{Deserialize, Serialize};

use crate::config::GimbalConfig;
use crate::error::Result;
use crate::time::{Nanos, NANOS_PER_MICRO, NANOS_PER_SEC};
use crate::types::IoKind;

/// Load state of a device as judged from completion latency (§3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CongestionState {
    /// Latency EWMA below Thresh_min: the device has spare capacity.
    Underutilized,
    /// Latency EWMA between Thresh_min and the dynamic threshold: probing.
    CongestionAvoidance,
    /// Latency EWMA between the dynamic threshold and Thresh_max.
    Congested,
    /// Latency EWMA at or above Thresh_max.
    Overloaded,
}

/// Per-kind latency EWMA and dynamic threshold (Algorithm 1 `update_latency`).
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyMonitor {
    latency_ewma_ns: Option<f64>,
    threshold_ns: f64,
    threshold_min_ns: f64,
    threshold_max_ns: f64,
    ewma_alpha: f64,
    threshold_alpha: f64,
}

impl LatencyMonitor {
    /// A monitor with no samples whose threshold starts at `threshold_min_ns`.
    /// The caller guarantees `0 < min < max` and both alphas in (0, 1]
    /// (checked by [`GimbalConfig::validate`]).
    pub fn new(
        threshold_min_ns: u64,
        threshold_max_ns: u64,
        ewma_alpha: f64,
        threshold_alpha: f64,
    ) -> Self {
        LatencyMonitor {
            latency_ewma_ns: None,
            threshold_ns: threshold_min_ns as f64,
            threshold_min_ns: threshold_min_ns as f64,
            threshold_max_ns: threshold_max_ns as f64,
            ewma_alpha,
            threshold_alpha,
        }
    }

    /// Folds one latency sample in and returns the resulting state.
    pub fn record(&mut self, latency_ns: u64) -> CongestionState {
        let sample = latency_ns as f64;
        let ewma = match self.latency_ewma_ns {
            None => sample,
            Some(old) => (1.0 - self.ewma_alpha) * old + self.ewma_alpha * sample,
        };
        self.latency_ewma_ns = Some(ewma);
        let state = if ewma >= self.threshold_max_ns {
            self.threshold_ns = self.threshold_max_ns;
            CongestionState::Overloaded
        } else if ewma >= self.threshold_ns {
            // Congestion signal: jump halfway to the maximum so the next
            // signal needs a higher latency (Reno-like, §3.2).
            self.threshold_ns = (self.threshold_ns + self.threshold_max_ns) / 2.0;
            CongestionState::Congested
        } else {
            self.threshold_ns -= self.threshold_alpha * (self.threshold_ns - ewma);
            if ewma >= self.threshold_min_ns {
                CongestionState::CongestionAvoidance
            } else {
                CongestionState::Underutilized
            }
        };
        self.threshold_ns = self
            .threshold_ns
            .clamp(self.threshold_min_ns, self.threshold_max_ns);
        state
    }

    /// The latency EWMA in nanoseconds, `None` before the first sample.
    pub fn latency_ewma_ns(&self) -> Option<u64> {
        self.latency_ewma_ns.map(|v| v.round() as u64)
    }

    /// The current dynamic threshold in nanoseconds.
    pub fn threshold_ns(&self) -> u64 {
        self.threshold_ns.round() as u64
    }

    /// The state the current EWMA falls in, without recording a sample
    /// (under-utilized before any sample).
    pub fn current_state(&self) -> CongestionState {
        match self.latency_ewma_ns {
            None => CongestionState::Underutilized,
            Some(e) if e >= self.threshold_max_ns => CongestionState::Overloaded,
            Some(e) if e >= self.threshold_ns => CongestionState::Congested,
            Some(e) if e >= self.threshold_min_ns => CongestionState::CongestionAvoidance,
            Some(_) => CongestionState::Underutilized,
        }
    }
}

/// Completed bytes per second over a sliding pair of fixed windows.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRateMeter {
    window_ns: u64,
    window_start: Option<Nanos>,
    current_bytes: u64,
    previous_bytes: u64,
}

impl CompletionRateMeter {
    /// A meter with windows of `window_ns` (> 0) nanoseconds.
    pub fn new(window_ns: u64) -> Self {
        CompletionRateMeter {
            window_ns: window_ns.max(1),
            window_start: None,
            current_bytes: 0,
            previous_bytes: 0,
        }
    }

    fn roll(&mut self, now: Nanos) {
        let Some(start) = self.window_start else {
            self.window_start = Some(now);
            return;
        };
        let elapsed = now.nanos_since(start);
        if elapsed < self.window_ns {
            return;
        }
        let windows = elapsed / self.window_ns;
        self.previous_bytes = if windows == 1 { self.current_bytes } else { 0 };
        self.current_bytes = 0;
        self.window_start =
            Some(start.saturating_add_nanos(windows.saturating_mul(self.window_ns)));
    }

    /// Counts `bytes` completed at `now`.
    pub fn record(&mut self, now: Nanos, bytes: u64) {
        self.roll(now);
        self.current_bytes = self.current_bytes.saturating_add(bytes);
    }

    /// The completion rate in bytes per second as of `now`.
    pub fn rate_bps(&mut self, now: Nanos) -> f64 {
        self.roll(now);
        let elapsed = self
            .window_start
            .map_or(0, |s| now.nanos_since(s))
            .min(self.window_ns);
        let span_ns = (self.window_ns + elapsed) as f64;
        (self.previous_bytes + self.current_bytes) as f64 * NANOS_PER_SEC as f64 / span_ns
    }
}

/// What a completion did to the congestion controller.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CongestionFeedback {
    /// The state the completion put the device in.
    pub state: CongestionState,
    /// True when the rate pacer must drop its accumulated tokens
    /// (overloaded state, Algorithm 1 line 14).
    pub discard_tokens: bool,
}

/// The congestion controller of one device: two latency monitors, the
/// shared target rate and the completion-rate meters.
#[derive(Clone, Debug)]
pub struct CongestionControl {
    monitors: [LatencyMonitor; 2],
    target_rate_bps: f64,
    min_rate_bps: f64,
    max_rate_bps: f64,
    underutilized_rate_gain: f64,
    total_completions: CompletionRateMeter,
    kind_completions: [CompletionRateMeter; 2],
    state: CongestionState,
}

impl CongestionControl {
    /// A controller configured from the Gimbal parameters.
    pub fn new(config: &GimbalConfig) -> Result<Self> {
        config.validate()?;
        let monitor = LatencyMonitor::new(
            config
                .latency_threshold_min_us
                .saturating_mul(NANOS_PER_MICRO),
            config
                .latency_threshold_max_us
                .saturating_mul(NANOS_PER_MICRO),
            config.latency_ewma_alpha,
            config.threshold_alpha,
        );
        let window_ns = config
            .completion_rate_window_us
            .saturating_mul(NANOS_PER_MICRO);
        Ok(CongestionControl {
            monitors: [monitor.clone(), monitor],
            target_rate_bps: config.initial_target_rate_bps as f64,
            min_rate_bps: config.min_target_rate_bps as f64,
            max_rate_bps: config.max_target_rate_bps as f64,
            underutilized_rate_gain: config.underutilized_rate_gain,
            total_completions: CompletionRateMeter::new(window_ns),
            kind_completions: [
                CompletionRateMeter::new(window_ns),
                CompletionRateMeter::new(window_ns),
            ],
            state: CongestionState::Underutilized,
        })
    }

    /// Feeds one completion (Algorithm 1 `COMPLETION`): `latency_ns` is the
    /// time from submission to the device until its completion.
    pub fn on_completion(
        &mut self,
        now: Nanos,
        kind: IoKind,
        bytes: u64,
        latency_ns: u64,
    ) -> CongestionFeedback {
        self.total_completions.record(now, bytes);
        self.kind_completions[kind.index()].record(now, bytes);
        if bytes == 0 {
            return CongestionFeedback {
                state: self.state,
                discard_tokens: false,
            };
        }
        let state = self.monitors[kind.index()].record(latency_ns);
        let size = bytes as f64;
        let mut rate = self.target_rate_bps;
        match state {
            CongestionState::Overloaded => {
                rate = self.total_completions.rate_bps(now) - size;
            }
            CongestionState::Congested => rate -= size,
            CongestionState::CongestionAvoidance => rate += size,
            CongestionState::Underutilized => rate += self.underutilized_rate_gain * size,
        }
        self.target_rate_bps = rate.clamp(self.min_rate_bps, self.max_rate_bps);
        self.state = state;
        CongestionFeedback {
            state,
            discard_tokens: state == CongestionState::Overloaded,
        }
    }

    /// The target submission rate in bytes per second (reads + writes).
    pub fn target_rate_bps(&self) -> f64 {
        self.target_rate_bps
    }

    /// The state decided by the latest data completion (under-utilized
    /// before the first one).
    pub fn state(&self) -> CongestionState {
        self.state
    }

    /// The latency monitor of one kind.
    pub fn monitor(&self, kind: IoKind) -> &LatencyMonitor {
        &self.monitors[kind.index()]
    }

    /// Bytes per second completed recently, of one kind or (`None`) both.
    pub fn completion_rate_bps(&mut self, now: Nanos, kind: Option<IoKind>) -> f64 {
        match kind {
            None => self.total_completions.rate_bps(now),
            Some(k) => self.kind_completions[k.index()].rate_bps(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 250_000;
    const MAX: u64 = 1_500_000;

    fn monitor() -> LatencyMonitor {
        LatencyMonitor::new(MIN, MAX, 0.5, 0.5)
    }

    #[test]
    fn first_sample_initializes_the_ewma() {
        let mut m = monitor();
        assert_eq!(m.latency_ewma_ns(), None);
        assert_eq!(m.record(100_000), CongestionState::Underutilized);
        assert_eq!(m.latency_ewma_ns(), Some(100_000));
        m.record(200_000);
        assert_eq!(m.latency_ewma_ns(), Some(150_000));
    }

    #[test]
    fn underutilized_keeps_threshold_at_min() {
        let mut m = monitor();
        for _ in 0..10 {
            assert_eq!(m.record(50_000), CongestionState::Underutilized);
        }
        assert_eq!(m.threshold_ns(), MIN);
    }

    #[test]
    fn congested_jumps_threshold_to_midpoint() {
        let mut m = monitor();
        // Threshold starts at min: any EWMA at or above it is congestion.
        assert_eq!(m.record(400_000), CongestionState::Congested);
        assert_eq!(m.threshold_ns(), (MIN + MAX) / 2);
    }

    #[test]
    fn congestion_avoidance_decays_threshold_toward_ewma() {
        let mut m = monitor();
        m.record(400_000); // congested, threshold 875 µs
        assert_eq!(m.record(400_000), CongestionState::CongestionAvoidance);
        // 875 - 0.5 * (875 - 400) = 637.5 µs
        assert_eq!(m.threshold_ns(), 637_500);
    }

    #[test]
    fn overloaded_pins_threshold_at_max() {
        let mut m = monitor();
        assert_eq!(m.record(2_000_000), CongestionState::Overloaded);
        assert_eq!(m.threshold_ns(), MAX);
        assert_eq!(m.current_state(), CongestionState::Overloaded);
        // The EWMA falls to 1.1 ms: below max but above thresh (max) no more.
        assert_eq!(m.record(200_000), CongestionState::CongestionAvoidance);
    }

    #[test]
    fn boundaries_follow_section_3_3() {
        let mut m = LatencyMonitor::new(MIN, MAX, 1.0, 0.5);
        assert_eq!(m.record(MAX), CongestionState::Overloaded);
        let mut m = LatencyMonitor::new(MIN, MAX, 1.0, 0.5);
        assert_eq!(m.record(MIN), CongestionState::Congested);
        let mut m = LatencyMonitor::new(MIN, MAX, 1.0, 0.5);
        assert_eq!(m.record(MIN - 1), CongestionState::Underutilized);
    }

    fn controller() -> CongestionControl {
        CongestionControl::new(&GimbalConfig::default()).unwrap()
    }

    #[test]
    fn underutilized_grows_rate_by_beta_times_size() {
        let mut cc = controller();
        let before = cc.target_rate_bps();
        let fb = cc.on_completion(Nanos(1), IoKind::Read, 4096, 100_000);
        assert_eq!(fb.state, CongestionState::Underutilized);
        assert!(!fb.discard_tokens);
        assert_eq!(cc.target_rate_bps(), before + 8.0 * 4096.0);
    }

    #[test]
    fn avoidance_grows_and_congestion_shrinks_by_size() {
        let mut cc = controller();
        let r0 = cc.target_rate_bps();
        assert_eq!(
            cc.on_completion(Nanos(1), IoKind::Read, 4096, 400_000)
                .state,
            CongestionState::Congested
        );
        assert_eq!(cc.target_rate_bps(), r0 - 4096.0);
        assert_eq!(
            cc.on_completion(Nanos(2), IoKind::Read, 4096, 400_000)
                .state,
            CongestionState::CongestionAvoidance
        );
        assert_eq!(cc.target_rate_bps(), r0);
    }

    #[test]
    fn overloaded_resets_to_completion_rate_and_discards_tokens() {
        let mut cc = controller();
        // 10 × 128 KiB completions spread over the first 5 ms window.
        for i in 0..10u64 {
            cc.on_completion(Nanos::from_micros(i * 500), IoKind::Read, 131072, 100_000);
        }
        let now = Nanos::from_micros(5_000);
        let fb = cc.on_completion(now, IoKind::Write, 131072, 3_000_000);
        assert_eq!(fb.state, CongestionState::Overloaded);
        assert!(fb.discard_tokens);
        // 11 × 128 KiB over one 5 ms window (previous) + 0 elapsed.
        let expected = 11.0 * 131072.0 / 0.005 - 131072.0;
        assert!(
            (cc.target_rate_bps() - expected).abs() < 1.0,
            "{}",
            cc.target_rate_bps()
        );
        // The read monitor is unaffected by the write sample.
        assert_eq!(cc.monitor(IoKind::Read).latency_ewma_ns(), Some(100_000));
    }

    #[test]
    fn rate_is_clamped_to_floor_and_ceiling() {
        let cfg = GimbalConfig {
            min_target_rate_bps: 1_000_000,
            initial_target_rate_bps: 1_000_000,
            max_target_rate_bps: 2_000_000,
            ..GimbalConfig::default()
        };
        let mut cc = CongestionControl::new(&cfg).unwrap();
        cc.on_completion(Nanos(1), IoKind::Read, 4096, 5_000_000);
        assert_eq!(cc.target_rate_bps(), 1_000_000.0);
        let mut cc = CongestionControl::new(&cfg).unwrap();
        for i in 0..100 {
            cc.on_completion(Nanos(i), IoKind::Read, 131072, 10_000);
        }
        assert_eq!(cc.target_rate_bps(), 2_000_000.0);
    }

    #[test]
    fn zero_byte_completions_are_ignored() {
        let mut cc = controller();
        let r0 = cc.target_rate_bps();
        cc.on_completion(Nanos(1), IoKind::Read, 0, 9_000_000);
        assert_eq!(cc.target_rate_bps(), r0);
        assert_eq!(cc.monitor(IoKind::Read).latency_ewma_ns(), None);
    }

    #[test]
    fn meter_forgets_old_windows() {
        let mut m = CompletionRateMeter::new(1_000_000);
        m.record(Nanos(0), 1000);
        assert_eq!(m.rate_bps(Nanos(0)), 1000.0 * 1e9 / 1e6);
        // One window later the bytes are in the previous window.
        assert_eq!(m.rate_bps(Nanos(1_000_000)), 1000.0 * 1e9 / 1e6);
        // Two windows later they are gone.
        assert_eq!(m.rate_bps(Nanos(2_500_000)), 0.0);
    }
}
