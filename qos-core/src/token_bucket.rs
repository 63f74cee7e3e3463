//! Dual token bucket rate pacing (Gimbal §3.3, Appendix C.1, Algorithm 4).
//!
//! Tokens are bytes. They are generated at the congestion controller's
//! target rate and split between a read and a write bucket by the write
//! cost: the read bucket gets `write_cost / (write_cost + 1)` of them, the
//! write bucket `1 / (write_cost + 1)`. A bucket that overflows its capacity
//! passes the excess to the other one; what overflows both is dropped. A read
//! consumes its size from the read bucket, a write its (unweighted) size from
//! the write bucket: the split already charges the write cost.
//!
//! Decisions where the paper is vague or wrong:
//! - Algorithm 4 as printed ends with `write_tokens = min(read_tokens,
//!   max_tokens); write_tokens = max_tokens`, which would overwrite the read
//!   bucket's clamp; we implement the evident intent: after passing the write
//!   overflow to reads, clamp *reads* to the capacity and set writes to it.
//! - Both buckets start full, as an ordinary token bucket does.
//! - An I/O larger than the capacity could never be admitted; such an I/O is
//!   admitted once its bucket is full and then drives the bucket negative
//!   (a debt repaid by later refills), so the long-run rate still holds.
//!   In general an I/O is admitted when `tokens >= min(size, capacity)`.
//! - "Discard remaining tokens" (overloaded state) sets positive balances to
//!   zero and keeps any debt.

use crate::time::{Nanos, NANOS_PER_SEC};
use crate::types::IoKind;

/// Slack for float rounding when comparing token balances, in bytes.
const TOKEN_EPSILON: f64 = 1e-6;

/// Read and write token buckets sharing one target rate.
#[derive(Clone, Debug)]
pub struct DualTokenBucket {
    tokens: [f64; 2],
    capacity_bytes: f64,
    last_refill: Option<Nanos>,
    /// The write cost the cached shares were computed for, and the shares
    /// (read, write) it gives: the write cost changes at most every few
    /// milliseconds, so two divisions per refill are saved. The cache holds
    /// exactly what [`share`] returns, so results are bit for bit the same.
    shares_for: f64,
    shares: [f64; 2],
}

/// Equal when balances, capacity and last refill are (the share cache is
/// not state).
impl PartialEq for DualTokenBucket {
    fn eq(&self, other: &Self) -> bool {
        self.tokens == other.tokens
            && self.capacity_bytes == other.capacity_bytes
            && self.last_refill == other.last_refill
    }
}

/// Fraction of generated tokens that goes to `kind`'s bucket.
fn share(kind: IoKind, write_cost: f64) -> f64 {
    let write_cost = write_cost.max(1.0);
    match kind {
        IoKind::Read => write_cost / (write_cost + 1.0),
        IoKind::Write => 1.0 / (write_cost + 1.0),
    }
}

/// Tokens (bytes) generated in `elapsed_ns` at `rate_bps`. Multiplies by
/// 10^-9 instead of dividing by 10^9: the refill runs on every completion,
/// and a division's latency was a third of its cost (the results differ
/// in the last bit at most).
fn generated_bytes(rate_bps: f64, elapsed_ns: u64) -> f64 {
    const SECS_PER_NANO: f64 = 1.0 / NANOS_PER_SEC as f64;
    rate_bps * (elapsed_ns as f64 * SECS_PER_NANO)
}

fn other(kind: IoKind) -> IoKind {
    match kind {
        IoKind::Read => IoKind::Write,
        IoKind::Write => IoKind::Read,
    }
}

impl DualTokenBucket {
    /// Two full buckets of `capacity_bytes` (> 0) each.
    pub fn new(capacity_bytes: u64) -> Self {
        let capacity = capacity_bytes.max(1) as f64;
        DualTokenBucket {
            tokens: [capacity, capacity],
            capacity_bytes: capacity,
            last_refill: None,
            shares_for: 1.0,
            shares: [share(IoKind::Read, 1.0), share(IoKind::Write, 1.0)],
        }
    }

    /// The (read, write) shares of generated tokens at `write_cost`.
    fn shares(&mut self, write_cost: f64) -> [f64; 2] {
        // Bitwise, so that a NaN is recomputed rather than matched.
        if write_cost.to_bits() != self.shares_for.to_bits() {
            self.shares_for = write_cost;
            self.shares = [
                share(IoKind::Read, write_cost),
                share(IoKind::Write, write_cost),
            ];
        }
        self.shares
    }

    /// Adds the tokens generated since the previous refill at
    /// `target_rate_bps`, split by `write_cost` (Algorithm 4). The first call
    /// only records `now`.
    pub fn refill(&mut self, now: Nanos, target_rate_bps: f64, write_cost: f64) {
        let elapsed_ns = match self.last_refill {
            None => 0,
            Some(last) => now.nanos_since(last),
        };
        if self.last_refill.is_none_or(|last| now > last) {
            self.last_refill = Some(now);
        }
        if elapsed_ns == 0 || target_rate_bps <= 0.0 {
            return;
        }
        let cap = self.capacity_bytes;
        if self.tokens == [cap, cap] {
            // Both full stay full: whatever arrives overflows both (the
            // arithmetic below would give exactly `cap` twice again, as
            // `cap + x - cap` rounds to at least `cap` for `x >= cap`).
            // The common case in front of a fast device.
            return;
        }
        let generated = generated_bytes(target_rate_bps, elapsed_ns);
        let [read_share, write_share] = self.shares(write_cost);
        let [mut read, mut write] = self.tokens;
        read += generated * read_share;
        write += generated * write_share;
        if read > cap {
            write += read - cap;
            read = cap;
        }
        if write > cap {
            read = (read + write - cap).min(cap);
            write = cap;
        }
        self.tokens = [read, write];
    }

    /// Bytes needed in `kind`'s bucket before an I/O of `bytes` is admitted.
    fn needed(&self, bytes: u64) -> f64 {
        (bytes as f64).min(self.capacity_bytes)
    }

    /// Whether an I/O of `bytes` of `kind` would be admitted now (call
    /// [`refill`](Self::refill) first).
    pub fn can_consume(&self, kind: IoKind, bytes: u64) -> bool {
        self.tokens[kind.index()] + TOKEN_EPSILON >= self.needed(bytes)
    }

    /// Takes `bytes` tokens from `kind`'s bucket if the I/O is admitted.
    pub fn try_consume(&mut self, kind: IoKind, bytes: u64) -> bool {
        if !self.can_consume(kind, bytes) {
            return false;
        }
        self.tokens[kind.index()] -= bytes as f64;
        true
    }

    /// Drops all positive balances (overloaded state); debts are kept.
    pub fn discard(&mut self) {
        for t in &mut self.tokens {
            *t = t.min(0.0);
        }
    }

    /// Tokens in `kind`'s bucket (negative while an oversized I/O is repaid).
    pub fn tokens(&self, kind: IoKind) -> f64 {
        self.tokens[kind.index()]
    }

    /// Capacity of each bucket in bytes.
    pub fn capacity_bytes(&self) -> f64 {
        self.capacity_bytes
    }

    /// Nanoseconds from the last refill until an I/O of `bytes` of `kind`
    /// would be admitted if the rate and write cost stay as given; `None`
    /// when it never would (rate zero). Accounts for the overflow from the
    /// other bucket once that one is full, so it is exact, not a bound.
    pub fn nanos_until_admitted(
        &self,
        kind: IoKind,
        bytes: u64,
        target_rate_bps: f64,
        write_cost: f64,
    ) -> Option<u64> {
        let missing = self.needed(bytes) - self.tokens[kind.index()];
        if missing <= TOKEN_EPSILON {
            return Some(0);
        }
        if target_rate_bps <= 0.0 || !target_rate_bps.is_finite() {
            return None;
        }
        let rate_per_ns = target_rate_bps / NANOS_PER_SEC as f64;
        let own_rate = rate_per_ns * share(kind, write_cost);
        let other_rate = rate_per_ns * share(other(kind), write_cost);
        let other_room = (self.capacity_bytes - self.tokens[other(kind).index()]).max(0.0);
        // Phase 1: the other bucket fills; only our share arrives.
        let other_full_ns = if other_rate > 0.0 {
            other_room / other_rate
        } else {
            f64::INFINITY
        };
        let ns = if own_rate > 0.0 && missing <= own_rate * other_full_ns {
            missing / own_rate
        } else {
            // Phase 2: the other bucket overflows into ours; the full rate arrives.
            other_full_ns + (missing - own_rate * other_full_ns) / rate_per_ns
        };
        if !ns.is_finite() {
            return None;
        }
        Some(ns.ceil().min(u64::MAX as f64) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CAP: u64 = 256 * 1024;

    fn empty() -> DualTokenBucket {
        let mut b = DualTokenBucket::new(CAP);
        b.refill(Nanos(0), 1.0, 1.0);
        b.discard();
        b
    }

    #[test]
    fn tokens_split_by_write_cost() {
        let mut b = empty();
        // 1 GB/s for 100 µs = 100_000 bytes, write cost 9 → 90% / 10%.
        b.refill(Nanos(100_000), 1e9, 9.0);
        assert!((b.tokens(IoKind::Read) - 90_000.0).abs() < 1e-6);
        assert!((b.tokens(IoKind::Write) - 10_000.0).abs() < 1e-6);
    }

    #[test]
    fn read_overflow_passes_to_writes() {
        let mut b = empty();
        b.refill(Nanos(1_000_000), 1e9, 9.0); // 1 MB generated
        assert_eq!(b.tokens(IoKind::Read), CAP as f64);
        assert_eq!(b.tokens(IoKind::Write), CAP as f64);
        // Writes drain; reads stay full; the write bucket gets everything.
        assert!(b.try_consume(IoKind::Write, CAP));
        b.refill(Nanos(1_100_000), 1e9, 9.0); // 100 KB more
        assert!((b.tokens(IoKind::Write) - 100_000.0).abs() < 1e-6);
    }

    #[test]
    fn write_overflow_passes_to_reads() {
        let mut b = empty();
        assert!(b.tokens(IoKind::Read) == 0.0);
        // Fill writes first with write cost 1 (50/50).
        b.refill(Nanos(600_000), 1e9, 1.0); // 600 KB: 300 K each, both overflow
        assert_eq!(b.tokens(IoKind::Read), CAP as f64);
        assert_eq!(b.tokens(IoKind::Write), CAP as f64);
    }

    #[test]
    fn oversized_io_admitted_when_full_and_goes_into_debt() {
        let mut b = DualTokenBucket::new(CAP);
        assert!(b.try_consume(IoKind::Read, 1024 * 1024));
        assert_eq!(b.tokens(IoKind::Read), CAP as f64 - 1024.0 * 1024.0);
        assert!(!b.can_consume(IoKind::Read, 4096));
        b.discard();
        assert!(b.tokens(IoKind::Read) < 0.0, "debt survives a discard");
        assert_eq!(b.tokens(IoKind::Write), 0.0);
    }

    #[test]
    fn wait_time_accounts_for_overflow() {
        let mut b = empty();
        // Reads full, writes empty: a write gets the full rate.
        b.tokens = [CAP as f64, 0.0];
        let ns = b
            .nanos_until_admitted(IoKind::Write, 100_000, 1e9, 9.0)
            .unwrap();
        assert_eq!(ns, 100_000);
        // Both empty: writes get 10% until reads fill (at 0.9 GB/s).
        b.tokens = [0.0, 0.0];
        let ns = b
            .nanos_until_admitted(IoKind::Write, 10_000, 1e9, 9.0)
            .unwrap();
        assert_eq!(ns, 100_000);
        assert_eq!(
            b.nanos_until_admitted(IoKind::Write, 10_000, 0.0, 9.0),
            None
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Refilling two full buckets skips the arithmetic; the
        /// arithmetic (Algorithm 4 as `refill` does it) gives exactly
        /// two full buckets too, bit for bit, whatever the rate, the
        /// time and the write cost.
        #[test]
        fn full_buckets_stay_exactly_full(
            cap in 1u64..(1 << 40),
            rate in prop_oneof![1e-3f64..1.0, 1.0f64..1e6, 1e6f64..1e15],
            elapsed_ns in prop_oneof![1u64..1_000, 1u64..u64::MAX / 2],
            write_cost in 1.0f64..64.0,
        ) {
            let c = cap as f64;
            let generated = generated_bytes(rate, elapsed_ns);
            let (mut read, mut write) = (c, c);
            read += generated * share(IoKind::Read, write_cost);
            write += generated * share(IoKind::Write, write_cost);
            if read > c {
                write += read - c;
                read = c;
            }
            if write > c {
                read = (read + write - c).min(c);
                write = c;
            }
            prop_assert_eq!(read.to_bits(), c.to_bits());
            prop_assert_eq!(write.to_bits(), c.to_bits());
            let mut b = DualTokenBucket::new(cap);
            b.refill(Nanos(1), rate, write_cost);
            b.refill(Nanos(1).saturating_add_nanos(elapsed_ns), rate, write_cost);
            prop_assert_eq!(b.tokens, [c, c]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Tokens never exceed the bucket capacity, and the wait time it
        /// predicts is exactly when the I/O becomes admissible.
        #[test]
        fn tokens_bounded_and_wait_time_exact(
            ops in proptest::collection::vec((0u64..2_000_000, 0u64..600_000, any::<bool>(), 1.0f64..9.0), 1..60),
            rate in 1e6f64..4e9,
        ) {
            let mut b = DualTokenBucket::new(CAP);
            let mut now = Nanos(0);
            for (dt, bytes, is_write, wc) in ops {
                now = now.saturating_add_nanos(dt);
                b.refill(now, rate, wc);
                prop_assert!(b.tokens(IoKind::Read) <= CAP as f64 + TOKEN_EPSILON);
                prop_assert!(b.tokens(IoKind::Write) <= CAP as f64 + TOKEN_EPSILON);
                let kind = if is_write { IoKind::Write } else { IoKind::Read };
                if !b.try_consume(kind, bytes) {
                    let wait = b.nanos_until_admitted(kind, bytes, rate, wc).unwrap();
                    prop_assert!(wait > 0);
                    let mut later = b.clone();
                    later.refill(now.saturating_add_nanos(wait), rate, wc);
                    prop_assert!(later.can_consume(kind, bytes));
                    if wait > 1 {
                        let mut earlier = b.clone();
                        earlier.refill(now.saturating_add_nanos(wait - 2), rate, wc);
                        // Two nanoseconds early is too early unless float
                        // slack says otherwise at the margin.
                        let gap = earlier.needed(bytes) - earlier.tokens(kind);
                        prop_assert!(gap > -(rate / 1e9) * 3.0);
                    }
                }
            }
        }
    }
}
