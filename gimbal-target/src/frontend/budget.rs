//! The memory budget: every byte a host can make the target hold, and the
//! checks that bound it before anything is allocated.
//!
//! A host chooses sizes (SQSIZE, NUMD, SGL lengths, PLEN, how fast it
//! reads its socket); none of them is trusted. Per queue (one TCP
//! connection) the target holds at most:
//!
//! | what | bound | default |
//! |---|---|---|
//! | commands outstanding | the SQ's entries (SQSIZE + 1 from Connect, at most `limits.max_queue_size` = MQES + 1; [`PRE_CONNECT_SQ_ENTRIES`] before Connect). One more is a fatal SQ overrun: the connection closes (see [`sq_overrun`]) | 128 |
//! | read data waiting to be sent plus write data solicited by R2T | `limits.max_queue_data_bytes`, reserved before the buffer exists ([`QueueBudget::try_reserve`]); a command that does not fit waits, unexecuted, until earlier data has gone out | 16 MiB |
//! | one command's data | MDTS (`limits.max_data_transfer_bytes`); larger: Invalid Field in Command | 1 MiB |
//! | R2Ts outstanding | one per write (MAXR2T = 1 per command), and only for writes whose data fits the reservation above: at most `max_queue_data_bytes` solicited and not yet received | 16 per queue at 1 MiB |
//! | in-capsule data of one command | IOCCSZ - 64 (`limits.in_capsule_data_bytes`) on I/O queues, [`ADMIN_IN_CAPSULE_BYTES`] on the admin queue; larger is refused | 8 KiB |
//! | one PDU being received | max(MAXH2CDATA, in-capsule maximum) + header, checked from PLEN before it is buffered | 128 KiB |
//! | the socket's receive buffer (the kernel's memory, charged only for data that has arrived and not been read) | an I/O queue's is grown at its Connect to [`receive_window`]: its data budget above plus a full SQ of command capsules, which the kernel caps at half of `net.ipv4.tcp_rmem`'s maximum; never more than that cap, whatever the host sends | 16 MiB under the 32 MiB `tcp_rmem` maximum of recent kernels (the bench guest's); 3 MiB under the older 6 MiB |
//! | a log page | its real size (Identify: 4 KiB; discovery: 1 KiB per entry); the rest of a longer request is sent from a static page of zeros ([`ZEROS`]) and never allocated; longer than MDTS: Invalid Field in Command | - |
//!
//! Per target: at most `limits.max_connections` connections (more are
//! closed at accept), and at most `limits.max_buffered_bytes` reserved by all
//! queues together (a queue that cannot reserve waits like above). So the
//! target's data buffers stay below `max_buffered_bytes` plus, per
//! connection, one PDU being received and the in-capsule data of its
//! outstanding commands: with the defaults 256 MiB + 1,024 x (128 KiB +
//! 128 x 8 KiB) in the worst case, about 16 MiB + 1.2 MiB for one abusive
//! connection.
//!
//! Time is bounded too ([`crate::config::Timeouts`]): a connection that
//! has not completed ICReq and Connect within `handshake_ms` is closed; a
//! socket send that makes no progress for `send_ms` ends its connection
//! (and so releases what it held); shutdown waits at most `shutdown_ms` for
//! connections before it flushes the backends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::config::Limits;

/// Bytes of a command capsule PDU besides its in-capsule data: the common
/// header (8), the SQE (64) and both digests (4 + 4).
const CAPSULE_OVERHEAD: usize = 8 + 64 + 4 + 4;

/// What an I/O queue of `depth` entries lets its host have in flight
/// towards us at once, so what its socket's receive buffer should hold:
/// the write data its R2Ts solicit (at most `max_queue_data_bytes`) plus
/// a full SQ of command capsules with in-capsule data. A window smaller
/// than that makes the host's writes wait for it to open while the
/// target's budget would have taken them (issue 14).
pub fn receive_window(limits: &Limits, depth: u16) -> usize {
    let capsule = CAPSULE_OVERHEAD + limits.in_capsule_data_bytes as usize;
    (limits.max_queue_data_bytes as usize).saturating_add(usize::from(depth) * capsule)
}

/// Commands a queue may have outstanding before its Connect completes
/// (the Connect itself, and whatever a host pipelines behind it, which is
/// answered with Command Sequence Error): the smallest admin queue NVMe over
/// Fabrics allows.
pub const PRE_CONNECT_SQ_ENTRIES: u16 = 32;

/// The most in-capsule data on the admin queue (and before Connect):
/// NVMe/TCP fixes the admin queue's command capsule at 8 KiB (Linux:
/// `NVME_TCP_ADMIN_CCSZ`), of which the SQE takes 64 bytes.
pub const ADMIN_IN_CAPSULE_BYTES: usize = 8192 - 64;

/// KATO of a discovery controller whose host asked for none: a discovery
/// association nobody uses ends after two minutes (as Linux nvmet's
/// `NVMET_DISC_KATO_MS`), so idle discovery connections do not pile up.
pub const DISCOVERY_DEFAULT_KATO_MS: u32 = 120_000;

/// Zeros sent for the part of a log page request beyond the page: static,
/// so a long request costs no allocation, only PDUs of this size.
pub static ZEROS: [u8; ZEROS_LEN] = [0; ZEROS_LEN];

/// Size of [`ZEROS`], the largest zero-filled C2HData PDU.
pub const ZEROS_LEN: usize = 64 * 1024;

/// Why a queue is closed when its host overruns the SQ: what a host must not
/// do (NVMe over Fabrics 1.1, "Submission Queue flow control": a host never
/// has more commands outstanding than the SQ has entries) has no status to
/// answer with, and Linux nvmet ends the connection when its command pool
/// (sized from SQSIZE) runs out. We count a command outstanding from its
/// capsule until its completion is handed to the socket writer, which is
/// never later than the host can know of it, so a host that keeps to its SQ
/// size is never closed.
pub fn sq_overrun(outstanding: usize, entries: u16) -> bool {
    outstanding >= usize::from(entries)
}

/// A pool of bytes (one queue's, or the whole target's).
#[derive(Debug)]
pub struct BytePool {
    limit: usize,
    used: AtomicUsize,
    /// Woken (all waiters) when bytes come back.
    pub freed: Notify,
}

impl BytePool {
    /// An empty pool of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        BytePool {
            limit,
            used: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// Takes `bytes` if they fit; never over-commits.
    fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The pool's size.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// One queue's data budget: its own pool and the target's.
#[derive(Debug)]
pub struct QueueBudget {
    queue: BytePool,
    /// The target-wide pool.
    pub target: Arc<BytePool>,
    /// Woken when this queue's bytes come back (a deferred command may
    /// now fit); keeps the wake-up if nobody waits yet.
    pub freed: Notify,
}

/// Which pool a reservation did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// The queue's own: it frees as this queue's data goes out.
    Queue,
    /// The target's: it frees as any queue's data goes out.
    Target,
}

impl QueueBudget {
    /// A queue budget of `limit` bytes drawing also on `target`.
    pub fn new(limit: usize, target: Arc<BytePool>) -> Arc<Self> {
        Arc::new(QueueBudget {
            queue: BytePool::new(limit),
            target,
            freed: Notify::new(),
        })
    }

    /// Reserves `bytes` from both pools, or nothing (saying which pool is
    /// short).
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, Short> {
        if !self.queue.try_take(bytes) {
            return Err(Short::Queue);
        }
        if !self.target.try_take(bytes) {
            self.queue.give_back(bytes);
            return Err(Short::Target);
        }
        Ok(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    /// Takes back ownership of `bytes` reserved earlier and carried as a
    /// number (in a completion tag) since: they are released when the
    /// returned reservation drops.
    pub fn adopt(self: &Arc<Self>, bytes: usize) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes,
        }
    }

    /// Bytes this queue holds reserved.
    pub fn used(&self) -> usize {
        self.queue.used()
    }
}

/// Bytes held against a [`QueueBudget`]; released on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<QueueBudget>,
    bytes: usize,
}

impl Reservation {
    /// The bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Gives up ownership without releasing: the caller carries the number
    /// (see [`QueueBudget::adopt`]).
    pub fn into_raw(self) -> usize {
        let bytes = self.bytes;
        std::mem::forget(self);
        bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.queue.give_back(self.bytes);
            self.budget.target.give_back(self.bytes);
            self.budget.freed.notify_one();
            self.budget.target.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_window_is_the_data_budget_and_a_full_sq_of_capsules() {
        let limits = Limits::default();
        // 16 MiB solicited by R2T plus 128 capsules of 80 + 8 KiB.
        assert_eq!(receive_window(&limits, 128), (16 << 20) + 128 * (80 + 8192));
        let tight = Limits {
            max_queue_data_bytes: 1 << 20,
            in_capsule_data_bytes: 0,
            ..limits
        };
        assert_eq!(receive_window(&tight, 2), (1 << 20) + 2 * 80);
    }

    #[test]
    fn reservations_never_exceed_either_pool_and_come_back_on_drop() {
        let target = Arc::new(BytePool::new(3 << 20));
        let a = QueueBudget::new(2 << 20, target.clone());
        let b = QueueBudget::new(2 << 20, target.clone());
        let a1 = a.try_reserve(1 << 20).unwrap();
        let a2 = a.try_reserve(1 << 20).unwrap();
        assert_eq!(a.try_reserve(1).unwrap_err(), Short::Queue);
        let b1 = b.try_reserve(1 << 20).unwrap();
        assert_eq!(b.try_reserve(1 << 20).unwrap_err(), Short::Target);
        assert_eq!(b.used(), 1 << 20, "a failed reservation takes nothing");
        assert_eq!(target.used(), 3 << 20);
        drop(a1);
        let b2 = b.try_reserve(1 << 20).unwrap();
        let raw = a2.into_raw();
        assert_eq!(a.used(), 1 << 20, "carried as a number, still held");
        drop(a.adopt(raw));
        drop((b1, b2));
        assert_eq!((a.used(), b.used(), target.used()), (0, 0, 0));
    }

    #[test]
    fn overrun_is_one_command_beyond_the_entries() {
        assert!(!sq_overrun(127, 128));
        assert!(sq_overrun(128, 128));
    }
}
