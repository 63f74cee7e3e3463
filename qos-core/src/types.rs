//! Small vocabulary types shared by every policy.

use core::fmt;
use serde::{Deserialize, Serialize};

/// Opaque tenant identity. The target maps each host NQN to one of these;
/// the policies only need it to be stable, ordered and cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant#{}", self.0)
    }
}

/// Identity of one request inside a scheduler, assigned by the scheduler at
/// enqueue time, unique and increasing for the scheduler's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req#{}", self.0)
    }
}

/// Direction of a data transfer, which decides the token bucket, the
/// latency monitor and the cost weighting that apply.
///
/// Commands without data (flush, keep-alive) are best sent around the
/// policies; if they are passed through, use [`IoKind::Read`] with zero
/// bytes, which costs nothing and does not feed the latency monitors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoKind {
    /// Device to host.
    Read,
    /// Host to device (write, write zeroes, deallocate).
    Write,
}

impl IoKind {
    /// Both kinds, reads first; handy for iterating per-kind state.
    pub const ALL: [IoKind; 2] = [IoKind::Read, IoKind::Write];

    /// 0 for reads, 1 for writes; index into per-kind arrays.
    pub const fn index(self) -> usize {
        match self {
            IoKind::Read => 0,
            IoKind::Write => 1,
        }
    }
}

/// A map keyed by [`RequestId`] for lookups only (never iterated, so its
/// order cannot leak into decisions). Ids are sequential: a multiplicative
/// hash spreads them at a fraction of SipHash's cost.
pub(crate) type RequestMap<V> =
    std::collections::HashMap<RequestId, V, std::hash::BuildHasherDefault<IdHasher>>;

/// The hasher of [`RequestMap`]: Fibonacci hashing of one `u64`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
