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
//!   the latencies the client observes, turned into a window by Little's
//!   law: `target_rate × latency_ewma / mean I/O size`, clamped to
//!   `[1, max_window]`.
//! - `auto`: `target` while the latest completion that had a completion
//!   queue entry carried a credit, `estimate` otherwise. The estimator runs
//!   all the time in `auto` so it is warm when needed.
//! - `off`: no limit.
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

use crate::config::GimbalConfig;
use crate::congestion::CongestionControl;
use crate::credit::decode_credit_dw1;
use crate::error::{QosError, Result};
use crate::time::{Nanos, NANOS_PER_SEC};
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
}

impl Default for CreditGateConfig {
    fn default() -> Self {
        CreditGateConfig {
            mode: CreditMode::Auto,
            initial_window: 8,
            max_window: 1024,
            estimator: GimbalConfig::default(),
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
        let Some(latency_ns) = self
            .estimator
            .monitor(IoKind::Read)
            .latency_ewma_ns()
            .max(self.estimator.monitor(IoKind::Write).latency_ewma_ns())
        else {
            return self.initial_window.min(self.max_window);
        };
        let ios_per_sec = self.estimator.target_rate_bps() / self.mean_io_bytes.max(1.0);
        let window = ios_per_sec * latency_ns as f64 / NANOS_PER_SEC as f64;
        (window.floor() as u64).clamp(1, u64::from(self.max_window)) as u32
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
            self.estimator.on_completion(now, kind, bytes, latency_ns);
        }
    }

    /// The estimator (read-only), for a shadow view of the target.
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
    fn estimate_follows_littles_law() {
        let mut g = gate(CreditMode::Estimate);
        // Latency 1 ms at 4 KiB: congested → the rate falls; window = rate × 1 ms / 4 KiB.
        for i in 0..50 {
            g.on_completion(Nanos(i * 1000), IoKind::Read, 4096, 1_000_000, Some(0));
        }
        let rate = g.estimator().target_rate_bps();
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
    }
}
