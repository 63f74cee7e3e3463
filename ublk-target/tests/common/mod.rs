//! The fake NVMe/TCP targets that the request-core tests (`fanout.rs`:
//! a mirrored volume's replicas; `evol.rs`: an eVol's pool members) run
//! [`Requests`](ublk_target::io::requests::Requests) against, in memory:
//! one namespace per target, an initiator queue core per connection, and
//! the bytes moved between the two by hand, so a test decides when
//! anything arrives.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Instant;

use nvmf_initiator::fake_target::{FakeConfig, FakeConnection, FakeTarget, Fault, Trigger};
use nvmf_initiator::{Event, Queue, QueueConfig};

/// The block size of every fake namespace (and of the tests' LBAs).
pub const BS: u32 = 512;

/// A target with subsystem `subnqn` and one namespace of `bytes`,
/// injecting `fault` if any.
pub fn fake_target(subnqn: String, bytes: u64, fault: Option<(Fault, Trigger)>) -> Arc<FakeTarget> {
    FakeTarget::new(FakeConfig {
        subnqn,
        blocks: bytes / u64::from(BS),
        block_size: BS,
        fault,
        ..FakeConfig::default()
    })
}

/// Admin Connect as `host`, then I/O queue 1 of `depth` entries (1 MiB
/// transfers, in-capsule data as the target offers), against `t`.
pub fn connect<B: AsRef<[u8]> + AsMut<[u8]>>(
    t: &Arc<FakeTarget>,
    host: &str,
    depth: u16,
    now: Instant,
) -> (Queue<B>, FakeConnection) {
    let admin_cfg = QueueConfig::admin(host, [9; 16], &t.config().subnqn, 5000);
    let mut admin: Queue<Vec<u8>> = Queue::new(admin_cfg.clone(), now);
    let mut ac = t.connection();
    exchange(&mut admin, &mut ac, now);
    assert!(admin.is_live(), "admin queue up");
    let mut io = QueueConfig::io(&admin_cfg, 1, admin.cntlid(), depth);
    io.max_transfer_bytes = 1 << 20;
    io.in_capsule_bytes = t.config().ioccsz * 16 - 64;
    let mut q: Queue<B> = Queue::new(io, now);
    let mut c = t.connection();
    exchange(&mut q, &mut c, now);
    assert!(
        matches!(q.poll_event(), Some(Event::Connected { .. })),
        "I/O queue up"
    );
    (q, c)
}

/// Move bytes both ways until both sides are quiet.
pub fn exchange<B: AsRef<[u8]> + AsMut<[u8]>>(
    q: &mut Queue<B>,
    c: &mut FakeConnection,
    now: Instant,
) {
    for _ in 0..1000 {
        if !transfer(q, c, now) {
            return;
        }
    }
    panic!("exchange did not settle");
}

/// One round trip: what `q` has to send goes to the target, what the
/// target has answered goes to `q`. True if any byte moved.
pub fn transfer<B: AsRef<[u8]> + AsMut<[u8]>>(
    q: &mut Queue<B>,
    c: &mut FakeConnection,
    now: Instant,
) -> bool {
    let mut out = Vec::new();
    while q.poll_transmit(&mut out, 64 * 1024) > 0 {}
    if !out.is_empty() {
        c.handle_bytes(&out);
    }
    let back = c.take_output();
    if !back.is_empty() {
        q.handle_bytes(now, &back);
    }
    !out.is_empty() || !back.is_empty()
}

/// The events `q` has ready, in order.
pub fn events<B: AsRef<[u8]> + AsMut<[u8]>>(q: &mut Queue<B>) -> Vec<Event<B>> {
    let mut events = Vec::new();
    while let Some(e) = q.poll_event() {
        events.push(e);
    }
    events
}
