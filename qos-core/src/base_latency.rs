//! The base latency of a path: the latency an I/O sees when nothing is
//! queued, tracked from completions so a delay-based controller can judge
//! queueing delay instead of absolute latency (the `min RTT` of TCP Vegas,
//! BBR and Swift; the "end-to-end I/O delay as an indicator of queueing
//! delay" of Flint's shadow view, §3).
//!
//! - **What base is**: per I/O kind (read, write), the minimum latency
//!   observed over a sliding window ([`WindowedMin`], two half-windows: a
//!   sample counts for between one half and one whole window while samples
//!   keep arriving). A minimum is never raised by queueing as long as the
//!   window holds one sample that did not queue.
//! - **Why per kind, not per size**: reads and writes have different
//!   unloaded latencies (a write may complete from the device's buffer) and
//!   the congestion monitors are per kind already (Gimbal §3.2). Sizes are
//!   not separated: the minimum over a mix comes from its smallest common
//!   size, which errs toward reading large I/O as slightly queued (smaller
//!   windows), and separate size classes would multiply the filters that
//!   must each be kept fresh by probes.
//! - **How it expires**: a sample leaves the minimum after one to two
//!   half-windows, so a path that became slower (route change, failover)
//!   is learnt within one window; a faster path is learnt at once.
//! - **Not fooled by its own queueing**: a *clean* sample is one whose
//!   request was the only one in flight for its whole life (one in flight
//!   at its completion, and no other completion since it was sent). If a
//!   kind that makes up at least a quarter of recent completions has had no
//!   clean sample for half a window, [`BaseLatency::probing`] turns on and
//!   the caller limits itself to one request in flight until a clean sample
//!   arrives (BBR's ProbeRTT). The window minimum therefore always holds an
//!   unqueued sample of each major kind, and sustained saturation cannot
//!   raise the base. A probe costs one drain and one unloaded round trip
//!   per half window. Minor kinds are not probed for (a probe would wait
//!   for one of their rare requests): their base may include queueing
//!   after a window of saturation, which only affects their few samples.
//! - Zero-byte completions (flush) are not samples, but they do count as
//!   completions for the clean test.

use crate::time::Nanos;
use crate::types::IoKind;

/// Share of recent completions above which a kind's base is kept fresh
/// by probes.
const PROBED_KIND_SHARE: f64 = 0.25;
/// Weight of the newest completion in the per-kind share EWMA.
const SHARE_ALPHA: f64 = 1.0 / 16.0;

/// Minimum of the samples of the last one to two half-windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowedMin {
    half_ns: u64,
    /// Start and minimum of the current half-window.
    current: Option<(Nanos, u64)>,
    /// Minimum of the half-window before it, if it ended less than a
    /// half-window ago.
    previous: Option<u64>,
}

impl WindowedMin {
    /// A filter whose samples last one to two `half_ns` (at least 1 ns).
    pub fn new(half_ns: u64) -> Self {
        WindowedMin {
            half_ns: half_ns.max(1),
            current: None,
            previous: None,
        }
    }

    /// Records a sample taken at `now`.
    pub fn record(&mut self, now: Nanos, value: u64) {
        match self.current {
            Some((start, min)) => {
                let elapsed = now.nanos_since(start);
                if elapsed < self.half_ns {
                    self.current = Some((start, min.min(value)));
                } else {
                    self.previous = (elapsed < 2 * self.half_ns).then_some(min);
                    self.current = Some((now, value));
                }
            }
            None => self.current = Some((now, value)),
        }
    }

    /// The minimum, `None` before the first sample.
    pub fn get(&self) -> Option<u64> {
        let current = self.current.map(|(_, m)| m);
        match (current, self.previous) {
            (Some(c), Some(p)) => Some(c.min(p)),
            (c, p) => c.or(p),
        }
    }
}

/// Base latency per I/O kind, with the clean-sample bookkeeping that
/// decides when to probe.
#[derive(Clone, Debug)]
pub struct BaseLatency {
    half_ns: u64,
    min: [WindowedMin; 2],
    /// When each kind last had a clean sample (its first sample counts, so
    /// a new gate does not probe before half a window has passed).
    last_clean: [Option<Nanos>; 2],
    share: [f64; 2],
    last_completion: Option<Nanos>,
    probing: bool,
}

impl BaseLatency {
    /// A tracker whose window is `window_ns` long.
    pub fn new(window_ns: u64) -> Self {
        let half_ns = (window_ns / 2).max(1);
        BaseLatency {
            half_ns,
            min: [WindowedMin::new(half_ns), WindowedMin::new(half_ns)],
            last_clean: [None, None],
            share: [0.0, 0.0],
            last_completion: None,
            probing: false,
        }
    }

    /// Records a completion at `now` of `latency_ns`; `in_flight` counts
    /// the requests in flight just before it, itself included. `bytes == 0`
    /// (flush and the like) only counts as a completion. Returns the base
    /// of `kind` including this sample (`None` for zero-byte completions).
    pub fn record(
        &mut self,
        now: Nanos,
        kind: IoKind,
        bytes: u64,
        latency_ns: u64,
        in_flight: u32,
    ) -> Option<u64> {
        let sent_at = now.saturating_sub_nanos(latency_ns);
        let clean = in_flight == 1 && self.last_completion.is_none_or(|t| t <= sent_at);
        self.last_completion = Some(now);
        if bytes == 0 {
            return None;
        }
        let k = kind.index();
        for (i, share) in self.share.iter_mut().enumerate() {
            let hit = if i == k { 1.0 } else { 0.0 };
            *share += (hit - *share) * SHARE_ALPHA;
        }
        self.min[k].record(now, latency_ns);
        if clean || self.last_clean[k].is_none() {
            self.last_clean[k] = Some(now);
        }
        self.probing = (0..2).any(|i| {
            self.share[i] >= PROBED_KIND_SHARE
                && self.last_clean[i].is_some_and(|t| now.nanos_since(t) >= self.half_ns)
        });
        self.min[k].get()
    }

    /// The base latency of `kind` in nanoseconds, `None` before its first
    /// sample.
    pub fn base_ns(&self, kind: IoKind) -> Option<u64> {
        self.min[kind.index()].get()
    }

    /// True while a major kind lacks a recent clean sample: the caller
    /// should keep at most one request in flight until one arrives.
    pub fn probing(&self) -> bool {
        self.probing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn windowed_min_expires_after_one_to_two_half_windows() {
        let mut m = WindowedMin::new(10 * MS);
        assert_eq!(m.get(), None);
        m.record(Nanos(0), 5);
        m.record(Nanos(MS), 9);
        assert_eq!(m.get(), Some(5));
        // A new half-window: the old minimum is still remembered.
        m.record(Nanos(12 * MS), 9);
        assert_eq!(m.get(), Some(5));
        // The half-window after that forgets it.
        m.record(Nanos(23 * MS), 8);
        assert_eq!(m.get(), Some(8));
        // A long silence forgets everything but the new sample.
        m.record(Nanos(100 * MS), 20);
        assert_eq!(m.get(), Some(20));
        // A lower sample counts at once.
        m.record(Nanos(101 * MS), 3);
        assert_eq!(m.get(), Some(3));
    }

    #[test]
    fn a_lone_request_is_clean_and_an_overlapping_one_is_not() {
        let mut b = BaseLatency::new(10 * MS);
        // First sample: counts as clean (grace period).
        b.record(Nanos(MS), IoKind::Read, 4096, MS, 4);
        assert!(!b.probing());
        // Completions at high in-flight for half a window: probe.
        let mut now = MS;
        while now < 7 * MS {
            now += 100_000;
            b.record(Nanos(now), IoKind::Read, 4096, MS, 4);
        }
        assert!(b.probing());
        // Alone at completion, but another completion happened while it
        // was in flight: not clean.
        now += 100_000;
        b.record(Nanos(now), IoKind::Read, 4096, MS, 1);
        assert!(b.probing());
        // Sent after the last completion and alone: clean.
        now += 2 * MS;
        b.record(Nanos(now), IoKind::Read, 4096, MS, 1);
        assert!(!b.probing());
    }

    #[test]
    fn minor_kinds_do_not_hold_a_probe() {
        let mut b = BaseLatency::new(10 * MS);
        let mut now = 0;
        for i in 0..200u64 {
            now += 100_000;
            let kind = if i % 20 == 0 {
                IoKind::Write
            } else {
                IoKind::Read
            };
            // Reads alone, writes always overlapping another request.
            let in_flight = if kind == IoKind::Write { 2 } else { 1 };
            b.record(Nanos(now), kind, 4096, 50_000, in_flight);
        }
        // Writes (5 %) have had no clean sample for 20 ms, but they are
        // too rare to probe for.
        assert!(!b.probing());
        assert_eq!(b.base_ns(IoKind::Write), Some(50_000));
    }
}
