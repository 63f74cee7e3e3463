//! Virtual time as seen by every policy in this crate.
//!
//! Policies never read a clock: the driver passes `now` into every call. The
//! unit is [`Nanos`], nanoseconds since an arbitrary epoch chosen by the
//! driver (typically `CLOCK_MONOTONIC` at start-up, or zero in a simulation).
//! Only differences between two `Nanos` values carry meaning, and the driver
//! must never let `now` go backwards: every policy treats a `now` earlier
//! than one it has already seen as "no time has passed" rather than failing.

use core::fmt;
use core::ops::{Add, AddAssign};
use std::time::Duration;

/// A point in time: nanoseconds since the driver's arbitrary epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

/// Nanoseconds in one microsecond.
pub const NANOS_PER_MICRO: u64 = 1_000;
/// Nanoseconds in one millisecond.
pub const NANOS_PER_MILLI: u64 = 1_000_000;
/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

impl Nanos {
    /// The epoch itself.
    pub const ZERO: Nanos = Nanos(0);
    /// The latest representable instant; used as "never".
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// The instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Nanos {
        Nanos(micros.saturating_mul(NANOS_PER_MICRO))
    }

    /// The instant `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Nanos {
        Nanos(millis.saturating_mul(NANOS_PER_MILLI))
    }

    /// The instant `secs` seconds after the epoch.
    pub const fn from_secs(secs: u64) -> Nanos {
        Nanos(secs.saturating_mul(NANOS_PER_SEC))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Nanoseconds from `earlier` to `self`, or 0 if `earlier` is later
    /// (time never runs backwards for a policy).
    pub const fn nanos_since(self, earlier: Nanos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `self` plus `nanos`, saturating at [`Nanos::MAX`].
    pub const fn saturating_add_nanos(self, nanos: u64) -> Nanos {
        Nanos(self.0.saturating_add(nanos))
    }

    /// `self` minus `nanos`, saturating at the epoch (a completion's send
    /// time from its latency).
    pub const fn saturating_sub_nanos(self, nanos: u64) -> Nanos {
        Nanos(self.0.saturating_sub(nanos))
    }
}

impl Add<Duration> for Nanos {
    type Output = Nanos;

    fn add(self, rhs: Duration) -> Nanos {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        self.saturating_add_nanos(nanos)
    }
}

impl AddAssign<Duration> for Nanos {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl From<Duration> for Nanos {
    /// The instant `d` after the epoch (saturating).
    fn from(d: Duration) -> Nanos {
        Nanos::ZERO + d
    }
}

impl From<Nanos> for Duration {
    /// The time from the epoch to `n`.
    fn from(n: Nanos) -> Duration {
        Duration::from_nanos(n.0)
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Nanos(5).nanos_since(Nanos(9)), 0);
        assert_eq!(Nanos(9).nanos_since(Nanos(5)), 4);
        assert_eq!(Nanos::MAX.saturating_add_nanos(1), Nanos::MAX);
        assert_eq!(
            Nanos::from_micros(3) + Duration::from_nanos(7),
            Nanos(3_007)
        );
        assert_eq!(
            Duration::from(Nanos::from_millis(2)),
            Duration::from_millis(2)
        );
    }
}
