//! Delivery rate of a path in rounds, and its windowed maximum: the
//! bottleneck-bandwidth half of the credit gate's estimate (BBR's
//! `BtlBw`; the other half, the path's unloaded latency, is
//! [`BaseLatency`](crate::base_latency::BaseLatency)).
//!
//! - **Rounds.** A round starts at a completion and ends at the first
//!   completion after as many further completions as were in flight when
//!   it started (at least one), i.e. about one round trip. Its sample is
//!   the bytes completed in the round over the round's duration. Counting
//!   completions rather than tracking each request keeps the gate free of
//!   per-request state; completions out of order only move the end by a
//!   request or two. A round whose completions all carry the start's
//!   timestamp (one batch of completion queue entries) is extended until
//!   time has passed, so a sample never divides by zero.
//! - **Over the longer of two spans**, as BBR's delivery rate samples
//!   are (draft-cheng-iccrg-delivery-rate-estimation: delivered data
//!   over the longer of its send and ACK intervals): the round's
//!   completion span, and the span over which the requests it completed
//!   were sent (from the latest send completed before the round to the
//!   latest completed in it; a completion's send time is its time minus
//!   its latency). Why: completions that arrive in a bunch make a short
//!   round that reads as a burst of bandwidth the path never had, and
//!   the maximum below keeps the highest such reading for ten rounds. In
//!   the TCG guest, whose completions come in bunches, the estimate read
//!   117-960 MiB/s for 128 KiB reads that delivered 108-140
//!   (docs/benchmarks.md, 2026-11-30, seventh), so the window swung with
//!   which bunches were in the last ten rounds, and a writer's window
//!   beside a reader it cannot see was several bandwidth-delay products
//!   wider than its gain says. Requests sent over a longer span than
//!   they completed in were fed no faster than that: their completions
//!   bunched on the way back. A path that really speeds up shows it in
//!   both spans. Tried once before and not kept (docs/benchmarks.md, "A
//!   probe compared at a held window", 2026-11-29): at a gain ceiling of
//!   16 the truer estimate gave the guest's lone 128k reads smaller
//!   windows and a slower climb, since the inflated maxima had been
//!   opening them; that section named a truer bandwidth with a higher
//!   ceiling as the next candidate. Kept now with the ceiling at 64 and a
//!   young gate that survives one unpaid probe (`gain_probe`).
//! - **Window-bound or not.** A round is *bound* if the gate's window was
//!   reached at some point during it ([`DeliveryRate::mark_bound`]); then
//!   its rate is what the path delivered at the window. A round that was
//!   not bound measured the application's demand, not the path: as in BBR
//!   such an *app-limited* sample enters the filter only if it raises the
//!   maximum.
//! - **The maximum** is over the last [`BANDWIDTH_WINDOW_ROUNDS`] rounds
//!   that entered it, and samples expire only when a new one enters: an
//!   idle or app-limited period keeps the last measured bandwidth instead
//!   of forgetting it (a volume going from QD 1 back to QD 128 starts from
//!   what the path carried, not from its QD 1 rate), while ten bound
//!   rounds at a lower rate (a co-tenant arrived, the device slowed) bring
//!   the maximum down.

use std::collections::VecDeque;

use crate::time::{Nanos, NANOS_PER_SEC};

/// Rounds a bandwidth sample stays in the maximum (BBR's 10 round trips:
/// long enough to ride out a round or two of noise, short enough to
/// follow a real drop within a few milliseconds on a fast path).
pub const BANDWIDTH_WINDOW_ROUNDS: u64 = 10;

/// Round bookkeeping and the windowed-maximum delivery rate.
#[derive(Clone, Debug, Default)]
pub struct DeliveryRate {
    /// Completions so far, and their bytes.
    delivered: u64,
    delivered_bytes: u64,
    /// Rounds completed.
    round: u64,
    /// Start of the current round (time, bytes delivered then, the latest
    /// send time of the requests completed by then) and the completion
    /// count that ends it; `None` before the first completion.
    start: Option<(Nanos, u64, Nanos)>,
    round_end: u64,
    /// The instant the current round's count was reached: it closes at the
    /// first completion after that instant, so a batch of completions
    /// handled at one instant is never split between rounds.
    ending: Option<Nanos>,
    /// Whether the window was reached during the current round.
    bound: bool,
    /// The latest send time of the requests completed so far (the round's
    /// send span runs from the one in `start` to this).
    sent_latest: Nanos,
    /// (round, bytes/s), rounds increasing and rates decreasing: the
    /// front is the maximum of the samples still in the window.
    samples: VecDeque<(u64, f64)>,
}

impl DeliveryRate {
    /// No rounds yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes that the gate's window was reached (a request waited, or the
    /// requests in flight reached the window) during the current round.
    pub fn mark_bound(&mut self) {
        self.bound = true;
    }

    /// Records a completion of `bytes` at `now` of a request sent at
    /// `sent`; `in_flight` counts the requests still in flight after it.
    /// Returns the sample (bytes per second, and whether the round was
    /// bound) of the round this completion closes, if any.
    pub fn on_completion(
        &mut self,
        now: Nanos,
        bytes: u64,
        in_flight: u32,
        sent: Nanos,
    ) -> Option<(f64, bool)> {
        let mut sample = None;
        if let (Some(end), Some((start, start_bytes, start_sent))) = (self.ending, self.start) {
            if now > end {
                // Every completion of the round's last instant is in; this
                // one opens the next round, which starts at that instant.
                let sent_span = self.sent_latest.nanos_since(start_sent);
                let rate = (self.delivered_bytes - start_bytes) as f64 * NANOS_PER_SEC as f64
                    / end.nanos_since(start).max(sent_span) as f64;
                let bound = self.bound;
                self.round += 1;
                if bound || self.max_bps().is_none_or(|max| rate >= max) {
                    self.insert(rate);
                }
                sample = Some((rate, bound));
                self.start = Some((end, self.delivered_bytes, self.sent_latest));
                self.round_end = self.delivered + u64::from(in_flight) + 1;
                self.ending = None;
                self.bound = false;
            }
        }
        self.delivered += 1;
        self.delivered_bytes += bytes;
        self.sent_latest = self.sent_latest.max(sent);
        match self.start {
            None => {
                self.start = Some((now, self.delivered_bytes, self.sent_latest));
                self.round_end = self.delivered + u64::from(in_flight.max(1));
            }
            // More completions of the start instant: they took no time of
            // this round, so they are not in it.
            Some((start, _, _)) if now == start => {
                self.start = Some((start, self.delivered_bytes, self.sent_latest));
                self.round_end += 1;
            }
            Some(_) => {
                if self.ending.is_none() && self.delivered >= self.round_end {
                    self.ending = Some(now);
                }
            }
        }
        sample
    }

    /// Adds this round's sample; older ones leave the window now.
    fn insert(&mut self, rate: f64) {
        while self.samples.back().is_some_and(|&(_, r)| r <= rate) {
            self.samples.pop_back();
        }
        self.samples.push_back((self.round, rate));
        let oldest = self.round.saturating_sub(BANDWIDTH_WINDOW_ROUNDS);
        while self.samples.front().is_some_and(|&(r, _)| r <= oldest) {
            self.samples.pop_front();
        }
    }

    /// The largest sample of the window (bytes per second), `None` before
    /// the first round ends.
    pub fn max_bps(&self) -> Option<f64> {
        self.samples.front().map(|&(_, r)| r)
    }

    /// Bytes completed so far.
    pub fn delivered_bytes(&self) -> u64 {
        self.delivered_bytes
    }

    /// Rounds completed so far.
    pub fn rounds(&self) -> u64 {
        self.round
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    /// Completes `n` requests of 4 KiB, one every `gap_ns`, with
    /// `in_flight` after each; returns the samples of the rounds that
    /// ended.
    fn feed(
        d: &mut DeliveryRate,
        now: &mut u64,
        n: u32,
        gap_ns: u64,
        in_flight: u32,
        bound: bool,
    ) -> Vec<(f64, bool)> {
        let mut out = Vec::new();
        for _ in 0..n {
            if bound {
                d.mark_bound();
            }
            *now += gap_ns;
            out.extend(d.on_completion(Nanos(*now), 4096, in_flight, Nanos(0)));
        }
        out
    }

    #[test]
    fn a_round_is_as_many_completions_as_were_in_flight() {
        let mut d = DeliveryRate::new();
        let mut now = 0;
        // 8 in flight: the first completion starts a round, the 9th ends
        // it, and the next one (at a later instant) closes it.
        let s = feed(&mut d, &mut now, 9, 10 * US, 8, true);
        assert!(s.is_empty());
        let s = feed(&mut d, &mut now, 1, 10 * US, 8, true);
        assert_eq!(s.len(), 1);
        // 8 × 4 KiB in 80 µs.
        assert!((s[0].0 - 8.0 * 4096.0 / 80e-6).abs() < 1.0, "{s:?}");
        assert!(s[0].1);
        assert_eq!(d.rounds(), 1);
        assert_eq!(d.max_bps(), Some(s[0].0));
    }

    #[test]
    fn batches_at_one_instant_stay_in_one_round() {
        let mut d = DeliveryRate::new();
        // A batch of 4 at t = 1 µs, 4 more in flight after it: the first
        // starts the round, the others took no time of it.
        for left in (0..4).rev() {
            assert_eq!(d.on_completion(Nanos(1000), 4096, left + 4, Nanos(0)), None);
        }
        // Then a batch of 4 every 10 µs, 4 more sent after each (8 in
        // flight): every round is two whole batches over 20 µs, never a
        // split one.
        let mut samples = Vec::new();
        for k in 1..=7u64 {
            for left in (0..4).rev() {
                samples.extend(d.on_completion(Nanos(1000 + k * 10_000), 4096, left + 4, Nanos(0)));
            }
        }
        assert!(samples.len() >= 2, "{samples:?}");
        for (rate, _) in samples {
            assert!((rate - 4.0 * 4096.0 / 10e-6).abs() < 1.0, "{rate}");
        }
    }

    /// Requests sent one every 10 µs, completing in bunches of four
    /// within 1 µs every 40 µs (the same rate, delivered in bursts): over
    /// their completion spans alone some rounds read several times the
    /// rate; over the longer of the two spans none reads more than it.
    #[test]
    fn bunched_completions_do_not_read_as_more_bandwidth_than_was_sent() {
        let rate = 4096.0 / 10e-6;
        let run = |with_sends: bool| {
            let mut d = DeliveryRate::new();
            let mut samples = Vec::new();
            for i in 0..400u64 {
                let (bunch, k) = (i / 4, i % 4);
                let now = 100 * US + bunch * 40 * US + k * 250;
                let sent = if with_sends { i * 10 * US } else { 0 };
                d.mark_bound();
                // Two in flight: a round is two completions, within a
                // bunch or across two.
                samples.extend(d.on_completion(Nanos(now), 4096, 1, Nanos(sent)));
            }
            (samples, d.max_bps().unwrap())
        };
        let (acks_only, max) = run(false);
        assert!(max > 2.0 * rate, "{max} against {rate}: {acks_only:?}");
        let (both, max) = run(true);
        assert!(both.len() > 50);
        for (r, _) in &both {
            assert!(*r <= rate * 1.0001, "{r} against {rate}");
        }
        assert!(max > rate * 0.97, "{max} against {rate}");
    }

    /// A round that starts with a batch of completions at one instant
    /// (one pass over the completion queue) counts its send span from the
    /// latest send of that batch, as its completion span starts at the
    /// batch's instant: batches of four sent 10 µs apart, each completing
    /// at one instant 40 µs after the last, read as exactly that rate.
    #[test]
    fn a_batch_at_the_start_of_a_round_starts_its_send_span_too() {
        let mut d = DeliveryRate::new();
        let mut samples = Vec::new();
        for i in 0..200u64 {
            let (batch, k) = (i / 4, i % 4);
            d.mark_bound();
            samples.extend(d.on_completion(
                Nanos(1_000 * US + batch * 40 * US),
                4096,
                7 - k as u32,
                Nanos(i * 10 * US),
            ));
        }
        assert!(samples.len() > 10);
        let rate = 4096.0 / 10e-6;
        for (r, _) in &samples {
            assert!((r - rate).abs() < rate * 1e-9, "{r} against {rate}");
        }
    }

    #[test]
    fn app_limited_rounds_only_raise_the_maximum() {
        let mut d = DeliveryRate::new();
        let mut now = 0;
        feed(&mut d, &mut now, 100, 10 * US, 4, true);
        let high = d.max_bps().unwrap();
        // A long stretch at a tenth of the rate, never reaching the window:
        // the maximum stays.
        feed(&mut d, &mut now, 1000, 100 * US, 1, false);
        assert_eq!(d.max_bps(), Some(high));
        // Faster app-limited rounds count.
        feed(&mut d, &mut now, 10, 5 * US, 1, false);
        assert!(d.max_bps().unwrap() > high * 1.9);
    }

    #[test]
    fn bound_rounds_at_a_lower_rate_bring_the_maximum_down_in_ten_rounds() {
        let mut d = DeliveryRate::new();
        let mut now = 0;
        feed(&mut d, &mut now, 100, 10 * US, 4, true);
        let high = d.max_bps().unwrap();
        // Rate halves; 4 in flight after each completion, so 5 per round
        // (the closing one, and the 4 in flight after it). The round in
        // progress at the change ends first (a mixed sample), then ten
        // rounds at half the rate push every faster sample out.
        let mut rounds = 0;
        while d.max_bps().unwrap() > high * 0.51 {
            feed(&mut d, &mut now, 4, 20 * US, 4, true);
            rounds += 1;
            assert!(
                rounds * 4 <= (BANDWIDTH_WINDOW_ROUNDS + 2) * 5,
                "still {:?}",
                d.max_bps()
            );
        }
        assert!((d.max_bps().unwrap() - high / 2.0).abs() < high * 0.01);
    }
}
