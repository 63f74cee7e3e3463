//! Client-side credit gate (Gimbal §3.6, Algorithm 3), with a fallback that
//! estimates a window from client-observed latency for targets that send no
//! credits (plain NVMe/TCP targets, EBOFs; cf. Flint's shadow view).
//!
//! A request may be sent when the requests in flight are fewer than the
//! current window, and always when nothing is in flight (so a window can
//! never deadlock the volume). The window depends on the [`CreditMode`]:
//!
//! - `target`: the last credit total a Gimbal target reported in
//!   completion dword 1 (bit 31 set); `initial_window` before the first.
//! - `estimate`: Gimbal's congestion control ([`CongestionControl`]) run on
//!   the latencies the client observes, judged against the path's base
//!   latency (below), and turned into a window by Little's law:
//!   `target_rate × base latency / mean I/O size`, clamped to
//!   `[1, max_window]`; 1 while probing for the base.
//! - `auto`: `target` while the latest completion that had a completion
//!   queue entry carried a credit, `estimate` otherwise. The estimator runs
//!   all the time in `auto` so it is warm when needed.
//! - `off`: no limit.
//!
//! # Base latency and queueing delay
//!
//! A client cannot know the latency floor of its path in advance (an SSD
//! behind 100G is ~100 µs, an EBOF or a busy TCP stack more, the TCG test
//! guest milliseconds), and Gimbal's thresholds are absolute SSD values:
//! on a path slower than them every latency reads as congestion and the
//! window collapses to 1. So the estimator separates base latency from
//! queueing delay, as delay-based TCP (Vegas, BBR, Swift) does with the
//! minimum RTT:
//!
//! - The base of each I/O kind is the windowed minimum of its latencies
//!   ([`BaseLatency`]: samples last `base_window_ms` / 2 to
//!   `base_window_ms`; when a major kind has had no sample taken alone in
//!   flight for half a window, the window drops to 1 until one arrives, so
//!   the base is never learnt from the gate's own queueing and follows a
//!   route change within one window).
//! - Congestion is judged on latency scaled by the base: the configured
//!   thresholds apply as they are while the base is at most
//!   `Thresh_min / base_headroom` (125 µs by default: a path as fast as
//!   the paper's gets exactly the paper's controller); above that every
//!   threshold is multiplied by `base × base_headroom / Thresh_min`, i.e.
//!   the monitor sees `latency × Thresh_min / (base × base_headroom)`. So
//!   Thresh_min becomes `base_headroom` × base (queueing as long as the
//!   base itself still counts as under-utilized with the default 2) and
//!   Thresh_max keeps its ratio to Thresh_min (6 by default, the paper's
//!   1500/250). Scaling rather than shifting because latency noise and the
//!   delay one queued request adds both grow with the path's latency: a
//!   fixed 1.25 ms of tolerated queueing would be noise on a 3 ms path and
//!   a deep queue on a 100 µs one.
//! - The window is `rate × base / size`, the requests in flight that carry
//!   `rate` with no queueing, rather than `rate × current latency`: at
//!   saturation the latter has every window as a fixed point (latency
//!   grows with the window), while the former lets the rate set the
//!   queueing delay, which the controller then keeps inside its band. The
//!   base used is an EWMA (weight 1/8) of the bases of completed requests,
//!   the mean no-queueing service time of the current mix.
//!
//! Decisions:
//! - The estimator's latency thresholds are the congestion-control ones of
//!   its own [`GimbalConfig`]: client-observed latency includes the network,
//!   so a deployment may want them higher than the target's.
//! - The mean I/O size is an EWMA (weight 1/8) of completed sizes, starting
//!   at 4 KiB; reads and writes share one window.
//! - A completion without a completion queue entry (C2HData with the
//!   SUCCESS flag) passes `None` for dword 1 and leaves the mode unchanged.

use serde::{Deserialize, Serialize};

use crate::base_latency::BaseLatency;
use crate::config::{check_at_least, check_nonzero, GimbalConfig};
use crate::congestion::CongestionControl;
use crate::credit::decode_credit_dw1;
use crate::error::{QosError, Result};
use crate::time::{Nanos, NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SEC};
use crate::types::IoKind;

/// How the gate chooses its window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CreditMode {
    /// Target credits when the target sends them, else the estimate.
    #[default]
    Auto,
    /// Only target credits.
    Target,
    /// Only the client-side estimate.
    Estimate,
    /// No limit.
    Off,
}

/// Configuration of a credit gate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CreditGateConfig {
    /// Window selection.
    pub mode: CreditMode,
    /// Window before the first credit arrives (target mode). Default 8, the
    /// credit a Gimbal target grants a lone new tenant.
    pub initial_window: u32,
    /// Upper bound of the estimated window. Default 1024.
    pub max_window: u32,
    /// Congestion-control parameters of the estimator.
    pub estimator: GimbalConfig,
    /// Window of the estimator's base-latency minimum, milliseconds: a
    /// sample counts for half to all of it, and a kind with no request
    /// alone in flight for half of it is probed for (window 1 until one
    /// completes). Longer probes less often but follows a path that became
    /// slower later. Default 5000: a probe (one drain, then one request
    /// alone) at most every 2.5 s, about 0.25 % of the time on an unqueued
    /// 3 ms path.
    pub base_window_ms: u64,
    /// How many times its base latency a path may take before the
    /// estimator's thresholds scale with it: thresholds apply as configured
    /// while the base is at most `Thresh_min / base_headroom`, and are
    /// multiplied by `base × base_headroom / Thresh_min` above. At least 1;
    /// default 2 (125 µs with the default thresholds, above a 4 KiB SSD
    /// read over a fast network; on a slower path queueing up to the base
    /// itself counts as under-utilized).
    pub base_headroom: f64,
}

impl Default for CreditGateConfig {
    fn default() -> Self {
        CreditGateConfig {
            mode: CreditMode::Auto,
            initial_window: 8,
            max_window: 1024,
            estimator: GimbalConfig::default(),
            base_window_ms: 5000,
            base_headroom: 2.0,
        }
    }
}

impl CreditGateConfig {
    /// Rejects out-of-range values, naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.initial_window == 0 {
            return Err(QosError::invalid("initial_window", "must be at least 1"));
        }
        if self.max_window == 0 {
            return Err(QosError::invalid("max_window", "must be at least 1"));
        }
        check_nonzero("base_window_ms", self.base_window_ms)?;
        check_at_least("base_headroom", self.base_headroom, 1.0)?;
        self.estimator.validate()
    }
}

/// Where the current window comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowSource {
    /// A credit reported by the target.
    Target,
    /// The initial window, before any credit.
    Initial,
    /// The client-side estimate.
    Estimate,
    /// No limit (mode off).
    Unlimited,
}

/// The credit gate of one target (or one device behind a target).
#[derive(Clone, Debug)]
pub struct CreditGate {
    mode: CreditMode,
    initial_window: u32,
    max_window: u32,
    last_credit: Option<u32>,
    target_sends_credits: bool,
    estimator: CongestionControl,
    base: BaseLatency,
    /// Base latency up to which the thresholds apply unscaled, ns.
    base_reference_ns: f64,
    /// EWMA of the base latency of completed requests, ns.
    mean_base_ns: Option<f64>,
    mean_io_bytes: f64,
    in_flight: u32,
}

impl CreditGate {
    /// A gate with nothing in flight.
    pub fn new(config: &CreditGateConfig) -> Result<Self> {
        config.validate()?;
        Ok(CreditGate {
            mode: config.mode,
            initial_window: config.initial_window,
            max_window: config.max_window,
            last_credit: None,
            target_sends_credits: false,
            estimator: CongestionControl::new(&config.estimator)?,
            base: BaseLatency::new(config.base_window_ms.saturating_mul(NANOS_PER_MILLI)),
            base_reference_ns: config
                .estimator
                .latency_threshold_min_us
                .saturating_mul(NANOS_PER_MICRO) as f64
                / config.base_headroom,
            mean_base_ns: None,
            mean_io_bytes: 4096.0,
            in_flight: 0,
        })
    }

    /// Changes the mode at run time; credits and estimates are kept.
    pub fn set_mode(&mut self, mode: CreditMode) {
        self.mode = mode;
    }

    /// The mode in force.
    pub fn mode(&self) -> CreditMode {
        self.mode
    }

    /// Requests sent and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The last credit total the target reported.
    pub fn last_credit(&self) -> Option<u32> {
        self.last_credit
    }

    fn estimated_window(&self) -> u32 {
        if self.base.probing() {
            return 1;
        }
        let Some(base_ns) = self.mean_base_ns else {
            return self.initial_window.min(self.max_window);
        };
        let ios_per_sec = self.estimator.target_rate_bps() / self.mean_io_bytes.max(1.0);
        let window = ios_per_sec * base_ns / NANOS_PER_SEC as f64;
        (window.floor() as u64).clamp(1, u64::from(self.max_window)) as u32
    }

    /// The estimator's base latency of `kind` in nanoseconds (windowed
    /// minimum), `None` before its first sample.
    pub fn base_latency_ns(&self, kind: IoKind) -> Option<u64> {
        self.base.base_ns(kind)
    }

    /// True while the estimator holds the window at 1 to measure the base
    /// latency with a request alone in flight.
    pub fn probing(&self) -> bool {
        self.base.probing()
    }

    /// Feeds the estimator: the base first, then the congestion control
    /// with the latency scaled down by how much the base exceeds the
    /// reference (see the module doc).
    fn estimate(&mut self, now: Nanos, kind: IoKind, bytes: u64, latency_ns: u64, in_flight: u32) {
        let Some(base_ns) = self.base.record(now, kind, bytes, latency_ns, in_flight) else {
            self.estimator.on_completion(now, kind, bytes, latency_ns);
            return;
        };
        let base_ns = base_ns as f64;
        let scaled = if base_ns > self.base_reference_ns {
            (latency_ns as f64 * self.base_reference_ns / base_ns).round() as u64
        } else {
            latency_ns
        };
        self.estimator.on_completion(now, kind, bytes, scaled);
        let mean = self.mean_base_ns.get_or_insert(base_ns);
        *mean += (base_ns - *mean) / 8.0;
    }

    /// The current window and where it comes from (`u32::MAX` when off).
    pub fn window(&self) -> (u32, WindowSource) {
        let target = || match self.last_credit {
            Some(c) => (c, WindowSource::Target),
            None => (self.initial_window, WindowSource::Initial),
        };
        match self.mode {
            CreditMode::Off => (u32::MAX, WindowSource::Unlimited),
            CreditMode::Target => target(),
            CreditMode::Estimate => (self.estimated_window(), WindowSource::Estimate),
            CreditMode::Auto if self.target_sends_credits => target(),
            CreditMode::Auto => (self.estimated_window(), WindowSource::Estimate),
        }
    }

    /// Whether a request may be sent now: fewer in flight than the window,
    /// or nothing in flight at all.
    pub fn may_send(&self) -> bool {
        self.in_flight == 0 || self.in_flight < self.window().0
    }

    /// Takes a credit for a request about to be sent; false means "device
    /// busy": queue it and retry after a completion.
    pub fn try_acquire(&mut self) -> bool {
        if !self.may_send() {
            return false;
        }
        self.in_flight += 1;
        true
    }

    /// Gives back a credit taken by [`try_acquire`](Self::try_acquire) for
    /// a request that was never sent.
    pub fn cancel(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Records a completion: `latency_ns` as seen by the client, and
    /// completion dword 1 if the completion had a queue entry.
    pub fn on_completion(
        &mut self,
        now: Nanos,
        kind: IoKind,
        bytes: u64,
        latency_ns: u64,
        dw1: Option<u32>,
    ) {
        let in_flight = self.in_flight;
        self.in_flight = self.in_flight.saturating_sub(1);
        match dw1.map(decode_credit_dw1) {
            Some(Some(credit)) => {
                self.last_credit = Some(credit);
                self.target_sends_credits = true;
            }
            Some(None) => self.target_sends_credits = false,
            None => {}
        }
        if bytes > 0 {
            self.mean_io_bytes += (bytes as f64 - self.mean_io_bytes) / 8.0;
        }
        if matches!(self.mode, CreditMode::Auto | CreditMode::Estimate) {
            self.estimate(now, kind, bytes, latency_ns, in_flight);
        }
    }

    /// The estimator (read-only), for a shadow view of the target. Its
    /// latency monitors see latencies scaled by the base (see the module
    /// doc), not the raw ones, once the base exceeds the reference.
    pub fn estimator(&self) -> &CongestionControl {
        &self.estimator
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::encode_credit_dw1;
    use proptest::prelude::*;

    fn gate(mode: CreditMode) -> CreditGate {
        CreditGate::new(&CreditGateConfig {
            mode,
            ..CreditGateConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn target_mode_follows_reported_credits() {
        let mut g = gate(CreditMode::Target);
        assert_eq!(g.window(), (8, WindowSource::Initial));
        for _ in 0..8 {
            assert!(g.try_acquire());
        }
        assert!(!g.try_acquire());
        g.on_completion(
            Nanos(1),
            IoKind::Read,
            4096,
            100_000,
            Some(encode_credit_dw1(2)),
        );
        assert_eq!(g.window(), (2, WindowSource::Target));
        assert_eq!(g.in_flight(), 7);
        assert!(!g.try_acquire());
        // A completion without a CQE keeps the credit.
        g.on_completion(Nanos(2), IoKind::Read, 4096, 100_000, None);
        assert_eq!(g.last_credit(), Some(2));
    }

    #[test]
    fn one_request_always_allowed_when_idle() {
        let mut g = gate(CreditMode::Target);
        g.on_completion(Nanos(1), IoKind::Read, 4096, 1, Some(encode_credit_dw1(0)));
        assert_eq!(g.window().0, 0);
        assert!(g.try_acquire());
        assert!(!g.try_acquire());
    }

    #[test]
    fn auto_switches_on_credit_presence() {
        let mut g = gate(CreditMode::Auto);
        assert_eq!(g.window().1, WindowSource::Estimate);
        g.on_completion(
            Nanos(1),
            IoKind::Read,
            4096,
            100_000,
            Some(encode_credit_dw1(64)),
        );
        assert_eq!(g.window(), (64, WindowSource::Target));
        g.on_completion(Nanos(2), IoKind::Read, 4096, 100_000, Some(0));
        assert_eq!(g.window().1, WindowSource::Estimate);
    }

    #[test]
    fn estimate_follows_littles_law_on_the_base() {
        let mut g = gate(CreditMode::Estimate);
        // A constant 1 ms is the path's base, not congestion (it read as
        // congestion before the base was tracked): the scaled latency is
        // the reference, under-utilized, and the rate grows. The window is
        // rate × base / 4 KiB.
        let r0 = g.estimator().target_rate_bps();
        for i in 0..50 {
            g.on_completion(Nanos(i * 1000), IoKind::Read, 4096, 1_000_000, Some(0));
        }
        let rate = g.estimator().target_rate_bps();
        assert!(rate > r0);
        assert_eq!(g.base_latency_ns(IoKind::Read), Some(1_000_000));
        let expected = (rate * 0.001 / 4096.0).floor().clamp(1.0, 1024.0) as u32;
        assert_eq!(g.window(), (expected, WindowSource::Estimate));
    }

    #[test]
    fn off_never_limits() {
        let mut g = gate(CreditMode::Off);
        for _ in 0..100_000 {
            assert!(g.try_acquire());
        }
    }

    #[test]
    fn invalid_config_names_the_field() {
        let cfg = CreditGateConfig {
            max_window: 0,
            ..CreditGateConfig::default()
        };
        assert!(matches!(
            CreditGate::new(&cfg),
            Err(QosError::InvalidConfig {
                field: "max_window",
                ..
            })
        ));
    }

    /// A path for closed-loop runs on the virtual clock: every request
    /// takes at least `base_ns`, and one FIFO server completes at most one
    /// request per `service_ns` (0: no limit), so the path carries
    /// `base_ns / service_ns` requests without queueing (Little's law) and
    /// queues the rest.
    struct Path {
        base_ns: u64,
        service_ns: u64,
        last_done: u64,
        in_flight: std::collections::VecDeque<(u64, u64)>,
    }

    /// What a closed-loop run saw, per completion.
    #[derive(Debug, Default)]
    struct RunStats {
        completions: u64,
        latency_sum_ns: u64,
        in_flight_sum: u64,
        window_max: u32,
        probe_completions: u64,
    }

    impl RunStats {
        fn mean_latency_ns(&self) -> u64 {
            self.latency_sum_ns / self.completions.max(1)
        }
        fn mean_in_flight(&self) -> f64 {
            self.in_flight_sum as f64 / self.completions.max(1) as f64
        }
    }

    impl Path {
        fn new(base_ns: u64, service_ns: u64) -> Self {
            Path {
                base_ns,
                service_ns,
                last_done: 0,
                in_flight: Default::default(),
            }
        }

        /// Keeps `offered` 4 KiB reads outstanding (each resubmitted when
        /// it completes) through `g` from `*now` until `until`.
        fn run(&mut self, g: &mut CreditGate, offered: u32, now: &mut u64, until: u64) -> RunStats {
            let mut st = RunStats::default();
            while *now < until {
                while (self.in_flight.len() as u32) < offered && g.try_acquire() {
                    // Completions are FIFO: sends and service are in order.
                    let done = (*now + self.base_ns).max(self.last_done + self.service_ns);
                    self.last_done = done;
                    self.in_flight.push_back((*now, done));
                }
                let (sent, done) = self.in_flight.pop_front().expect("an idle gate admits");
                st.in_flight_sum += u64::from(g.in_flight());
                *now = done;
                g.on_completion(Nanos(done), IoKind::Read, 4096, done - sent, Some(0));
                st.completions += 1;
                st.latency_sum_ns += done - sent;
                if g.probing() {
                    st.probe_completions += 1;
                } else {
                    st.window_max = st.window_max.max(g.window().0);
                }
            }
            st
        }
    }

    const MS: u64 = 1_000_000;

    /// (2) A slow path without queueing: 3 ms is the base, not congestion,
    /// and the window covers the offered load instead of collapsing to 1.
    #[test]
    fn slow_path_without_queueing_covers_the_offered_load() {
        let mut g = gate(CreditMode::Estimate);
        let mut p = Path::new(3 * MS, 0);
        let mut now = 0;
        p.run(&mut g, 64, &mut now, NANOS_PER_SEC);
        let st = p.run(&mut g, 64, &mut now, 2 * NANOS_PER_SEC);
        assert_eq!(g.base_latency_ns(IoKind::Read), Some(3 * MS));
        assert!(st.mean_in_flight() > 63.0, "{st:?}");
        assert!(g.window().0 >= 64, "{:?}", g.window());
    }

    /// (3) The same path saturated (4 requests fit in its base latency):
    /// latency rising above the base shrinks the window far below the
    /// 256 requests offered, queues stay within the controller's band
    /// (Thresh_max = 12 × base here) and the path stays busy.
    #[test]
    fn saturation_on_a_slow_path_keeps_queues_short() {
        let mut g = gate(CreditMode::Estimate);
        let (base, service) = (3 * MS, 750_000);
        let mut p = Path::new(base, service);
        let mut now = 0;
        p.run(&mut g, 256, &mut now, 10 * NANOS_PER_SEC);
        let st = p.run(&mut g, 256, &mut now, 30 * NANOS_PER_SEC);
        let bdp = base / service;
        assert!(st.window_max <= 16 * bdp as u32, "{st:?}");
        assert!(st.mean_in_flight() <= 12.0 * bdp as f64, "{st:?}");
        assert!(st.mean_latency_ns() <= 10 * base, "{st:?}");
        let capacity = 20 * NANOS_PER_SEC / service;
        assert!(st.completions * 100 >= capacity * 95, "{st:?}");
    }

    /// Closed loop: a path of fixed service rate and base latency L (16
    /// requests fit in L). The window settles within the controller's band
    /// around rate × L, for an SSD-like and a slow path alike.
    #[test]
    fn closed_loop_window_converges_near_the_bandwidth_delay_product() {
        for (base, service) in [(100_000, 6_250), (5 * MS, 312_500)] {
            let mut g = gate(CreditMode::Estimate);
            let mut p = Path::new(base, service);
            let mut now = 0;
            p.run(&mut g, 512, &mut now, 10 * NANOS_PER_SEC);
            let st = p.run(&mut g, 512, &mut now, 30 * NANOS_PER_SEC);
            let bdp = (base / service) as f64;
            let w = st.mean_in_flight();
            assert!(w >= bdp && w <= 12.0 * bdp, "L {base}: {st:?}");
            let capacity = 20 * NANOS_PER_SEC / service;
            assert!(st.completions * 100 >= capacity * 95, "L {base}: {st:?}");
        }
    }

    /// (4) The base follows route changes: a slower path is learnt within
    /// one base window, a faster one at once.
    #[test]
    fn base_follows_a_route_change() {
        let mut g = gate(CreditMode::Estimate);
        let mut p = Path::new(100_000, 0);
        let mut now = 0;
        p.run(&mut g, 16, &mut now, 2 * NANOS_PER_SEC);
        assert_eq!(g.base_latency_ns(IoKind::Read), Some(100_000));
        p.base_ns = 3 * MS;
        p.run(&mut g, 16, &mut now, 8 * NANOS_PER_SEC);
        assert_eq!(g.base_latency_ns(IoKind::Read), Some(3 * MS));
        let st = p.run(&mut g, 16, &mut now, 10 * NANOS_PER_SEC);
        assert!(st.mean_in_flight() > 15.0, "{st:?}");
        p.base_ns = 100_000;
        // The requests in flight still take 3 ms; the first new one sets
        // the base.
        let until = now + 4 * MS;
        p.run(&mut g, 16, &mut now, until);
        assert_eq!(g.base_latency_ns(IoKind::Read), Some(100_000));
        let st = p.run(&mut g, 16, &mut now, 11 * NANOS_PER_SEC);
        assert!(st.mean_in_flight() > 15.0, "{st:?}");
    }

    /// (4) Saturation for many base windows does not raise the base: every
    /// sample but the probes' queues, and the probes keep the minimum at
    /// the unloaded latency.
    #[test]
    fn base_is_not_raised_by_own_queueing() {
        let mut g = gate(CreditMode::Estimate);
        let mut p = Path::new(3 * MS, 750_000);
        let mut now = 0;
        let st = p.run(&mut g, 256, &mut now, 60 * NANOS_PER_SEC);
        assert!(st.mean_latency_ns() > 2 * 3 * MS, "{st:?}");
        assert!(st.probe_completions > 0, "{st:?}");
        assert_eq!(g.base_latency_ns(IoKind::Read), Some(3 * MS));
    }

    /// While probing the window is 1, and the probe ends with the first
    /// request that was alone in flight.
    #[test]
    fn probe_holds_one_request_until_a_clean_sample() {
        let mut g = gate(CreditMode::Estimate);
        let mut now = 0;
        for _ in 0..8 {
            assert!(g.try_acquire());
        }
        // Completions overlapping each other: no clean sample, and half a
        // base window (2.5 s) later a probe.
        while !g.probing() {
            now += 100_000;
            g.on_completion(Nanos(now), IoKind::Read, 4096, 400_000, Some(0));
            if !g.probing() {
                assert!(g.try_acquire());
            }
        }
        assert_eq!(now, 2_500_100_000);
        assert_eq!(g.window(), (1, WindowSource::Estimate));
        while g.in_flight() > 0 {
            now += 100_000;
            g.on_completion(Nanos(now), IoKind::Read, 4096, 400_000, Some(0));
        }
        assert!(g.try_acquire());
        assert!(!g.try_acquire());
        now += 100_000;
        g.on_completion(Nanos(now), IoKind::Read, 4096, 100_000, Some(0));
        assert!(!g.probing());
        assert!(g.window().0 > 1);
    }

    /// Out-of-range knobs are refused by name.
    #[test]
    fn base_knobs_are_validated() {
        let cfg = CreditGateConfig {
            base_window_ms: 0,
            ..CreditGateConfig::default()
        };
        assert!(matches!(
            cfg.validate(),
            Err(QosError::InvalidConfig {
                field: "base_window_ms",
                ..
            })
        ));
        let cfg = CreditGateConfig {
            base_headroom: 0.5,
            ..CreditGateConfig::default()
        };
        assert!(matches!(
            cfg.validate(),
            Err(QosError::InvalidConfig {
                field: "base_headroom",
                ..
            })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the credits and latencies, in-flight never exceeds
        /// max(window, 1) at the moment of a send, and the gate always
        /// admits a request when nothing is in flight.
        #[test]
        fn in_flight_bounded_by_window(
            mode in prop_oneof![Just(CreditMode::Auto), Just(CreditMode::Target), Just(CreditMode::Estimate)],
            events in proptest::collection::vec((any::<bool>(), 0u32..64, 1u64..5_000_000, any::<bool>()), 1..300),
        ) {
            let mut g = gate(mode);
            let mut now = Nanos(0);
            for (send, credit, latency, with_credit) in events {
                now = now.saturating_add_nanos(10_000);
                if send || g.in_flight() == 0 {
                    let window = g.window().0;
                    let before = g.in_flight();
                    let ok = g.try_acquire();
                    prop_assert_eq!(ok, before == 0 || before < window);
                    if ok {
                        prop_assert!(g.in_flight() <= window.max(1));
                    }
                } else {
                    let dw1 = if with_credit { encode_credit_dw1(credit) } else { 0 };
                    g.on_completion(now, IoKind::Read, 4096, latency, Some(dw1));
                }
            }
        }

        /// (1) With a base at or below Thresh_min / base_headroom the
        /// estimator is the paper's controller: the same states and rate as
        /// Gimbal's congestion control fed the raw latencies.
        #[test]
        fn fast_path_is_the_papers_controller(
            events in proptest::collection::vec((1u64..5_000_000, any::<bool>(), 1u64..200_000), 1..400),
        ) {
            let mut g = gate(CreditMode::Estimate);
            let mut cc = CongestionControl::new(&GimbalConfig::default()).unwrap();
            let mut now = Nanos(0);
            for (i, (latency, write, step)) in events.into_iter().enumerate() {
                // A fast sample of each kind now and then keeps the base
                // at or below 125 µs however long the run.
                let latency = if i % 8 < 2 { 100_000 } else { latency };
                let kind = match i % 8 {
                    0 => IoKind::Read,
                    1 => IoKind::Write,
                    _ if write => IoKind::Write,
                    _ => IoKind::Read,
                };
                now = now.saturating_add_nanos(step);
                g.try_acquire();
                g.on_completion(now, kind, 4096, latency, Some(0));
                let fb = cc.on_completion(now, kind, 4096, latency);
                prop_assert_eq!(g.estimator().state(), fb.state);
                prop_assert_eq!(g.estimator().target_rate_bps(), cc.target_rate_bps());
            }
        }

        /// Whatever the completions, the estimated window stays within
        /// [1, max_window] and an idle gate admits a request.
        #[test]
        fn estimated_window_is_bounded_and_never_deadlocks(
            max_window in 1u32..2048,
            events in proptest::collection::vec((0u32..8, 0u64..50_000_000, 0u64..1_000_000, any::<bool>(), 0u64..3), 1..300),
        ) {
            let mut g = CreditGate::new(&CreditGateConfig {
                mode: CreditMode::Estimate,
                max_window,
                base_window_ms: 50,
                ..CreditGateConfig::default()
            }).unwrap();
            let mut now = Nanos(0);
            for (sends, latency, step, write, size) in events {
                for _ in 0..sends {
                    g.try_acquire();
                }
                let (w, source) = g.window();
                prop_assert_eq!(source, WindowSource::Estimate);
                prop_assert!((1..=max_window).contains(&w), "window {}", w);
                now = now.saturating_add_nanos(step);
                if g.in_flight() > 0 {
                    let kind = if write { IoKind::Write } else { IoKind::Read };
                    g.on_completion(now, kind, [0, 4096, 131_072][size as usize], latency, Some(0));
                }
                if g.in_flight() == 0 {
                    prop_assert!(g.try_acquire());
                    g.cancel();
                }
            }
        }

        /// Under a constant latency with no queueing, of any magnitude from
        /// 50 µs to 20 ms, the window grows to cover the offered load, even
        /// after a phase of much higher latencies drove the rate down.
        #[test]
        fn window_grows_under_any_constant_uncongested_latency(
            base in 50_000u64..20_000_000,
            before in proptest::collection::vec((1u64..50, 1u32..32), 0..40),
        ) {
            let mut g = gate(CreditMode::Estimate);
            let mut now = 0;
            for (factor, burst) in before {
                let n = (0..burst).filter(|_| g.try_acquire()).count();
                for _ in 0..n {
                    now += base;
                    g.on_completion(Nanos(now), IoKind::Read, 4096, base * factor, Some(0));
                }
            }
            let mut p = Path::new(base, 0);
            let mut grew = false;
            for _ in 0..400 {
                let until = now + 100 * base;
                p.run(&mut g, 64, &mut now, until);
                if g.window().0 >= 64 && !g.probing() {
                    grew = true;
                    break;
                }
            }
            prop_assert!(grew, "window {:?} base {:?}", g.window(), g.base_latency_ns(IoKind::Read));
        }
    }
}
