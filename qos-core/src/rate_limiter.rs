//! Client-side I/O rate limiter (Gimbal §4.3 "IO rate limiter"; the
//! `riops`/`wiops`/`rbps`/`wbps` knobs of the ublk volume).
//!
//! Four token buckets: read I/Os, read bytes, write I/Os, write bytes. A
//! limit of 0 means unlimited. Each bucket holds at most its burst and
//! starts full. An I/O is admitted when both buckets of its kind allow it;
//! it then takes one I/O token and `bytes` byte tokens.
//!
//! Decisions:
//! - A burst of 0 means the default burst: a tenth of a second of the
//!   limit, at least one I/O (for I/O limits) or 128 KiB (for byte limits).
//! - An I/O larger than the byte burst is admitted once the bucket is full
//!   and drives it negative (a debt), so huge I/Os are never stuck and the
//!   long-run rate still holds.
//! - [`RateLimiter::set_limits`] first settles tokens earned under the old
//!   limits up to `now`, then applies the new ones, clamping balances to the
//!   new bursts; a bucket that becomes unlimited forgets its debt.
//! - [`RateLimiter::next_eligible`] is exact for the current limits, so a
//!   driver can arm one timer instead of polling.

use serde::{Deserialize, Serialize};

use crate::time::{Nanos, NANOS_PER_SEC};
use crate::types::IoKind;

/// Default byte burst floor: one maximum-size NVMe-oF I/O.
const MIN_DEFAULT_BYTE_BURST: f64 = 128.0 * 1024.0;

/// Rate limits of one volume. Zero means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimits {
    /// Read I/Os per second.
    pub read_iops: u64,
    /// Write I/Os per second.
    pub write_iops: u64,
    /// Read bytes per second.
    pub read_bps: u64,
    /// Write bytes per second.
    pub write_bps: u64,
    /// Burst of read I/Os (0: default, see the module docs).
    pub read_iops_burst: u64,
    /// Burst of write I/Os (0: default).
    pub write_iops_burst: u64,
    /// Burst of read bytes (0: default).
    pub read_bps_burst: u64,
    /// Burst of write bytes (0: default).
    pub write_bps_burst: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct Bucket {
    /// Tokens per second; 0 = unlimited.
    rate: f64,
    burst: f64,
    tokens: f64,
}

impl Bucket {
    fn new(rate: u64, burst: u64, min_default_burst: f64) -> Bucket {
        let rate = rate as f64;
        let burst = if burst > 0 {
            burst as f64
        } else {
            (rate / 10.0).max(min_default_burst)
        };
        Bucket {
            rate,
            burst,
            tokens: burst,
        }
    }

    fn unlimited(&self) -> bool {
        self.rate == 0.0
    }

    fn advance(&mut self, elapsed_ns: u64) {
        if self.unlimited() {
            return;
        }
        self.tokens =
            (self.tokens + self.rate * elapsed_ns as f64 / NANOS_PER_SEC as f64).min(self.burst);
    }

    fn needed(&self, cost: f64) -> f64 {
        cost.min(self.burst)
    }

    fn wait_ns(&self, cost: f64) -> u64 {
        if self.unlimited() {
            return 0;
        }
        let missing = self.needed(cost) - self.tokens;
        if missing <= 1e-9 {
            0
        } else {
            (missing * NANOS_PER_SEC as f64 / self.rate).ceil() as u64
        }
    }

    fn take(&mut self, cost: f64) {
        if !self.unlimited() {
            self.tokens -= cost;
        }
    }
}

/// The rate limiter of one volume.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimiter {
    limits: RateLimits,
    /// [read iops, read bytes, write iops, write bytes]
    buckets: [Bucket; 4],
    last: Option<Nanos>,
}

fn buckets_for(limits: &RateLimits) -> [Bucket; 4] {
    [
        Bucket::new(limits.read_iops, limits.read_iops_burst, 1.0),
        Bucket::new(
            limits.read_bps,
            limits.read_bps_burst,
            MIN_DEFAULT_BYTE_BURST,
        ),
        Bucket::new(limits.write_iops, limits.write_iops_burst, 1.0),
        Bucket::new(
            limits.write_bps,
            limits.write_bps_burst,
            MIN_DEFAULT_BYTE_BURST,
        ),
    ]
}

impl RateLimiter {
    /// A limiter with full buckets.
    pub fn new(limits: RateLimits) -> RateLimiter {
        RateLimiter {
            buckets: buckets_for(&limits),
            limits,
            last: None,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> RateLimits {
        self.limits
    }

    /// Whether every limit is 0 (the limiter admits everything).
    pub fn is_unlimited(&self) -> bool {
        self.buckets.iter().all(Bucket::unlimited)
    }

    fn advance(&mut self, now: Nanos) {
        let elapsed = self.last.map_or(0, |last| now.nanos_since(last));
        if self.last.is_none_or(|last| now > last) {
            self.last = Some(now);
        }
        if elapsed > 0 {
            for b in &mut self.buckets {
                b.advance(elapsed);
            }
        }
    }

    /// Replaces the limits at run time (see the module docs).
    pub fn set_limits(&mut self, now: Nanos, limits: RateLimits) {
        self.advance(now);
        let mut fresh = buckets_for(&limits);
        for (new, old) in fresh.iter_mut().zip(&self.buckets) {
            if !new.unlimited() && !old.unlimited() {
                new.tokens = old.tokens.min(new.burst);
            }
        }
        self.buckets = fresh;
        self.limits = limits;
    }

    fn pair(kind: IoKind) -> (usize, usize) {
        match kind {
            IoKind::Read => (0, 1),
            IoKind::Write => (2, 3),
        }
    }

    /// The earliest instant at or after `now` when an I/O of `kind` and
    /// `bytes` would be admitted, if nothing else is admitted meanwhile.
    pub fn next_eligible(&mut self, now: Nanos, kind: IoKind, bytes: u64) -> Nanos {
        self.advance(now);
        let (iops, bps) = Self::pair(kind);
        let wait = self.buckets[iops]
            .wait_ns(1.0)
            .max(self.buckets[bps].wait_ns(bytes as f64));
        now.saturating_add_nanos(wait)
    }

    /// Admits an I/O if the limits allow it now, taking its tokens;
    /// otherwise returns the instant it would become eligible.
    pub fn try_acquire(&mut self, now: Nanos, kind: IoKind, bytes: u64) -> Result<(), Nanos> {
        let eligible = self.next_eligible(now, kind, bytes);
        if eligible > now {
            return Err(eligible);
        }
        let (iops, bps) = Self::pair(kind);
        self.buckets[iops].take(1.0);
        self.buckets[bps].take(bytes as f64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_means_unlimited() {
        let mut r = RateLimiter::new(RateLimits::default());
        assert!(r.is_unlimited());
        for _ in 0..10_000 {
            assert_eq!(r.try_acquire(Nanos(0), IoKind::Write, 1 << 20), Ok(()));
        }
    }

    #[test]
    fn iops_limit_paces_after_the_burst() {
        let mut r = RateLimiter::new(RateLimits {
            read_iops: 1000,
            read_iops_burst: 2,
            ..RateLimits::default()
        });
        assert!(r.try_acquire(Nanos(0), IoKind::Read, 4096).is_ok());
        assert!(r.try_acquire(Nanos(0), IoKind::Read, 4096).is_ok());
        assert_eq!(
            r.try_acquire(Nanos(0), IoKind::Read, 4096),
            Err(Nanos::from_millis(1))
        );
        // Writes are not limited.
        assert!(r.try_acquire(Nanos(0), IoKind::Write, 4096).is_ok());
        assert!(r
            .try_acquire(Nanos::from_millis(1), IoKind::Read, 4096)
            .is_ok());
    }

    #[test]
    fn oversized_io_waits_for_a_full_bucket_then_borrows() {
        let mut r = RateLimiter::new(RateLimits {
            write_bps: 1_000_000,
            write_bps_burst: 100_000,
            ..RateLimits::default()
        });
        assert!(r.try_acquire(Nanos(0), IoKind::Write, 1_000_000).is_ok());
        // 900 KB of debt + 1 byte at 1 MB/s: 0.900001 s.
        assert_eq!(
            r.next_eligible(Nanos(0), IoKind::Write, 1),
            Nanos(900_001_000)
        );
    }

    #[test]
    fn limits_change_at_run_time() {
        let mut r = RateLimiter::new(RateLimits {
            read_iops: 10,
            read_iops_burst: 1,
            ..RateLimits::default()
        });
        assert!(r.try_acquire(Nanos(0), IoKind::Read, 1).is_ok());
        assert_eq!(
            r.next_eligible(Nanos(0), IoKind::Read, 1),
            Nanos::from_millis(100)
        );
        r.set_limits(
            Nanos::from_millis(50),
            RateLimits {
                read_iops: 100,
                read_iops_burst: 1,
                ..RateLimits::default()
            },
        );
        // Half a token earned at the old rate; the other half at 100/s.
        assert_eq!(
            r.next_eligible(Nanos::from_millis(50), IoKind::Read, 1),
            Nanos::from_millis(55)
        );
        r.set_limits(Nanos::from_millis(50), RateLimits::default());
        assert!(r
            .try_acquire(Nanos::from_millis(50), IoKind::Read, 1)
            .is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// On a virtual clock, admitted I/Os and bytes never exceed burst +
        /// rate × elapsed (plus one oversized I/O's debt), and an I/O asked
        /// for at its eligible time is admitted.
        #[test]
        fn never_exceeds_the_limits(
            iops in 1u64..10_000,
            bps in 4096u64..100_000_000,
            steps in proptest::collection::vec((0u64..2_000_000, 1u64..256), 1..200),
        ) {
            let limits = RateLimits { read_iops: iops, read_bps: bps, ..RateLimits::default() };
            let mut r = RateLimiter::new(limits);
            let iops_burst = (iops as f64 / 10.0).max(1.0);
            let bps_burst = (bps as f64 / 10.0).max(MIN_DEFAULT_BYTE_BURST);
            let mut now = Nanos(0);
            let (mut ios, mut bytes, mut largest) = (0f64, 0f64, 0f64);
            for (dt, pages) in steps {
                now = now.saturating_add_nanos(dt);
                let size = pages * 4096;
                match r.try_acquire(now, IoKind::Read, size) {
                    Ok(()) => {
                        ios += 1.0;
                        bytes += size as f64;
                        largest = f64::max(largest, size as f64);
                    }
                    Err(at) => {
                        prop_assert!(at > now);
                        prop_assert!(r.try_acquire(at, IoKind::Read, size).is_ok());
                        now = at;
                        ios += 1.0;
                        bytes += size as f64;
                        largest = f64::max(largest, size as f64);
                    }
                }
                let secs = now.as_nanos() as f64 / 1e9;
                prop_assert!(ios <= iops_burst + iops as f64 * secs + 1.0 + 1e-6);
                prop_assert!(bytes <= bps_burst + bps as f64 * secs + largest + 1e-3);
            }
        }
    }
}
