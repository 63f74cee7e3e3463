//! What a simulated tenant does: a closed-loop worker in the manner of a
//! fio job (queue depth, I/O size, read/write mix, random or sequential
//! offsets, an optional rate limit, a start and a stop time).

use serde::{Deserialize, Serialize};

use crate::types::IoKind;

/// How a worker picks offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessPattern {
    /// Uniformly random, aligned to the I/O size, in the worker's region.
    Random,
    /// One after the other, wrapping at the end of the worker's region.
    Sequential,
}

/// Bytes of the device region each worker addresses; workers use disjoint
/// regions, as separate namespaces or files would.
pub const WORKER_REGION_BYTES: u64 = 32 << 30;

/// One closed-loop worker (a tenant of the switch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Group label; workers with the same label are reported together and
    /// share a standalone maximum for f-Util (e.g. `4K-read`).
    pub group: String,
    /// Size of every I/O in bytes.
    pub io_bytes: u64,
    /// Percentage of reads (100 = read only, 0 = write only).
    pub read_pct: u32,
    /// I/Os the worker keeps outstanding (fio `iodepth`).
    pub queue_depth: u32,
    /// Offset pattern.
    pub pattern: AccessPattern,
    /// fio-style rate limit in bytes per second; `None` for unlimited.
    pub rate_limit_bytes_per_sec: Option<u64>,
    /// When the worker starts issuing, in simulated nanoseconds.
    pub start_ns: u64,
    /// When it stops issuing (outstanding I/Os still complete).
    pub stop_ns: Option<u64>,
    /// Sends every I/O at once whatever the scheme's credits or window say,
    /// as the kernel NVMe/TCP host does with a Gimbal target (it ignores
    /// completion dword 1). Off in the paper's experiments, whose clients
    /// honour the credits; on to replay the host and VM benches
    /// (`gimbal-target/examples/fairness_replay.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignores_credits: bool,
}

impl WorkerSpec {
    /// A read-only worker running from time zero.
    pub fn reader(group: &str, io_bytes: u64, queue_depth: u32, pattern: AccessPattern) -> Self {
        WorkerSpec {
            group: group.to_string(),
            io_bytes,
            read_pct: 100,
            queue_depth,
            pattern,
            rate_limit_bytes_per_sec: None,
            start_ns: 0,
            stop_ns: None,
            ignores_credits: false,
        }
    }

    /// A write-only worker running from time zero.
    pub fn writer(group: &str, io_bytes: u64, queue_depth: u32, pattern: AccessPattern) -> Self {
        WorkerSpec {
            read_pct: 0,
            ..WorkerSpec::reader(group, io_bytes, queue_depth, pattern)
        }
    }

    /// The kind of a worker that only reads or only writes; `None` for a
    /// mix.
    pub fn only_kind(&self) -> Option<IoKind> {
        match self.read_pct {
            100 => Some(IoKind::Read),
            0 => Some(IoKind::Write),
            _ => None,
        }
    }

    /// Whether the worker issues new I/O at `now_ns`.
    pub fn is_active(&self, now_ns: u64) -> bool {
        now_ns >= self.start_ns && self.stop_ns.is_none_or(|stop| now_ns < stop)
    }
}
