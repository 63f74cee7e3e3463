//! Write data sent in place (`Queue::poll_transmit_vectored`, and
//! `poll_transmit_placed` with a threshold per request): the bytes a
//! driver sends with each piece of data spliced in at its place are the
//! bytes `poll_transmit` appends, for in-capsule writes and H2CData alike,
//! with and without digests, whatever the send limit and the in-place
//! thresholds, and a request whose threshold is 1 has all its data left in
//! place; `expects_read_data`, which tells a driver when a short
//! receive leaves a read's data for a direct one; and `rx_header_len`,
//! how short that receive can be.

use std::sync::Arc;
use std::time::Instant;

use proptest::prelude::*;

use nvmf_initiator::fake_target::{FakeConfig, FakeConnection, FakeTarget};
use nvmf_initiator::{Command, Event, Queue, QueueConfig, Request};

const HOST: &str = "nqn.2026-01.io.test:host";
const BLOCK: usize = 512;

fn target(digests: bool) -> Arc<FakeTarget> {
    FakeTarget::new(FakeConfig {
        blocks: 4096,
        digests,
        // 64 KiB commands, 8 KiB in-capsule data, H2CData of at most 8 KiB
        // per PDU, 16 KiB per R2T: every write shape.
        mdts: 4,
        maxh2cdata: 8192,
        r2t_chunk: 16384,
        ..FakeConfig::default()
    })
}

/// One piece of data left in place by the last call.
struct InPlace {
    /// Where its PDU's header starts in the send buffer.
    head: usize,
    at: usize,
    data: Vec<u8>,
    user_data: u64,
}

/// What one `poll_transmit_vectored` call (or `poll_transmit_placed`,
/// with `per_request`) hands out, reassembled as the driver's iovecs
/// would send it, and the pieces it left in place.
fn vectored<B: AsRef<[u8]> + AsMut<[u8]>>(
    q: &mut Queue<B>,
    limit: usize,
    min: usize,
    per_request: Option<&dyn Fn(u64) -> usize>,
) -> (usize, Vec<u8>, Vec<InPlace>) {
    let mut buf = Vec::new();
    let mut placed = Vec::new();
    let put = |head: std::ops::Range<usize>, data: &[u8], user_data| {
        placed.push(InPlace {
            head: head.start,
            at: head.end,
            data: data.to_vec(),
            user_data,
        });
    };
    let n = match per_request {
        None => q.poll_transmit_vectored(&mut buf, limit, min, put),
        Some(f) => q.poll_transmit_placed(&mut buf, limit, f, put),
    };
    let mut wire = Vec::new();
    let mut from = 0;
    for p in &placed {
        assert!(p.at >= from && p.at <= buf.len(), "places in order");
        // The header it names is its PDU's: the common header's PDO (byte
        // 3) is where the data starts, and HLEN (byte 2) fits before it.
        assert!(p.head >= from && p.head < p.at, "its header is before it");
        let h = &buf[p.head..p.at];
        assert!(
            h.len() >= 8 && usize::from(h[3]) == h.len(),
            "PDO names the data"
        );
        assert!(usize::from(h[2]) <= h.len(), "HLEN within the header");
        wire.extend_from_slice(&buf[from..p.at]);
        wire.extend_from_slice(&p.data);
        from = p.at;
    }
    wire.extend_from_slice(&buf[from..]);
    assert_eq!(n, wire.len(), "the count includes the data left in place");
    (n, wire, placed)
}

/// Admin then I/O queue 1 against `t` through `poll_transmit`.
fn io_queue(t: &Arc<FakeTarget>, digests: bool) -> (Queue<Vec<u8>>, FakeConnection) {
    let now = Instant::now();
    let mut acfg = QueueConfig::admin(HOST, [7; 16], &t.config().subnqn, 5000);
    acfg.header_digest = digests;
    acfg.data_digest = digests;
    let mut admin: Queue<Vec<u8>> = Queue::new(acfg.clone(), now);
    let mut ac = t.connection();
    settle(&mut admin, &mut ac, now);
    assert!(admin.is_live());
    let mut cfg = QueueConfig::io(&acfg, 1, admin.cntlid(), 32);
    cfg.max_transfer_bytes = 4096 << t.config().mdts;
    cfg.in_capsule_bytes = t.config().ioccsz * 16 - 64;
    let mut q = Queue::new(cfg, now);
    let mut c = t.connection();
    settle(&mut q, &mut c, now);
    assert!(matches!(q.poll_event(), Some(Event::Connected { .. })));
    (q, c)
}

fn settle(q: &mut Queue<Vec<u8>>, c: &mut FakeConnection, now: Instant) {
    for _ in 0..100 {
        let mut out = Vec::new();
        while q.poll_transmit(&mut out, 1 << 20) > 0 {}
        c.handle_bytes(&out);
        let back = c.take_output();
        q.handle_bytes(now, &back);
        if out.is_empty() && back.is_empty() {
            return;
        }
    }
    panic!("did not settle");
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Two identical queues, one sent with `poll_transmit`, the other in
    /// place: the same bytes on the wire at every step, the same answers,
    /// and the targets end up holding the same written data.
    #[test]
    fn in_place_sends_the_bytes_poll_transmit_appends(
        digests in any::<bool>(),
        writes in prop::collection::vec((1usize..=40, any::<u8>()), 1..12),
        limits in prop::collection::vec(1usize..40_000, 1..8),
        min in prop::sample::select(vec![1usize, 512, 4096, 8192, 20_000, usize::MAX]),
        // Bit i set: request i's threshold is 1 (its data is sent from
        // elsewhere, `poll_transmit_placed`); none set: `_vectored`.
        whole in any::<u16>(),
    ) {
        let per_request = |user_data: u64| if whole & (1 << user_data) != 0 { 1 } else { min };
        let per_request: Option<&dyn Fn(u64) -> usize> = (whole != 0).then_some(&per_request);
        let (ta, tb) = (target(digests), target(digests));
        let (mut a, mut ca) = io_queue(&ta, digests);
        let (mut b, mut cb) = io_queue(&tb, digests);
        let now = Instant::now();
        let mut lba = 0u64;
        let mut expect = Vec::new();
        for (i, &(blocks, seed)) in writes.iter().enumerate() {
            let d = data(blocks * BLOCK, seed);
            let cmd = Command::Write { nsid: 1, slba: lba, block_size: BLOCK as u32, fua: false };
            for q in [&mut a, &mut b] {
                q.submit(now, Request { command: cmd, buf: Some(d.clone()), user_data: i as u64 })
                    .unwrap();
            }
            expect.push((lba, d));
            lba += blocks as u64 + 1;
        }
        let mut step = 0;
        let mut done = 0;
        let mut in_place = 0;
        let mut in_place_of = vec![0usize; writes.len()];
        while done < writes.len() {
            step += 1;
            prop_assert!(step < 10_000, "did not finish");
            let limit = limits[step % limits.len()];
            let mut wa = Vec::new();
            let na = a.poll_transmit(&mut wa, limit);
            let (nb, wb, placed) = vectored(&mut b, limit, min, per_request);
            prop_assert_eq!(na, nb);
            prop_assert_eq!(&wa, &wb, "same bytes with the data spliced in");
            if per_request.is_none() {
                prop_assert!(placed.len() <= limit / min.max(1) + 1);
            }
            for p in &placed {
                in_place += p.data.len();
                prop_assert!((p.user_data as usize) < writes.len());
                in_place_of[p.user_data as usize] += p.data.len();
                let want = per_request.map_or(min, |f| f(p.user_data));
                prop_assert!(p.data.len() >= want);
            }
            ca.handle_bytes(&wa);
            cb.handle_bytes(&wb);
            let (ba, bb) = (ca.take_output(), cb.take_output());
            prop_assert_eq!(&ba, &bb);
            a.handle_bytes(now, &ba);
            b.handle_bytes(now, &bb);
            while let Some(ev) = a.poll_event() {
                let other = b.poll_event();
                match (ev, other) {
                    (Event::Completed(x), Some(Event::Completed(y))) => {
                        prop_assert!(x.status.is_success());
                        prop_assert_eq!(x.user_data, y.user_data);
                        done += 1;
                    }
                    (x, y) => prop_assert!(false, "{x:?} vs {y:?}"),
                }
            }
            prop_assert!(b.poll_event().is_none());
        }
        // A write of 16 blocks or more has an 8 KiB in-capsule or H2CData
        // piece: at or above every threshold up to 8 KiB.
        if min <= 8192 && writes.iter().any(|&(blocks, _)| blocks >= 16) {
            prop_assert!(in_place > 0, "nothing was left in place");
        }
        for (i, &(blocks, _)) in writes.iter().enumerate() {
            if whole & (1 << i) != 0 {
                prop_assert_eq!(in_place_of[i], blocks * BLOCK, "request {} copied", i);
            }
        }
        let (da, db) = (ta.data(), tb.data());
        for (lba, d) in &expect {
            let at = *lba as usize * BLOCK;
            prop_assert_eq!(&da[at..at + d.len()], &d[..]);
            prop_assert_eq!(&db[at..at + d.len()], &d[..]);
        }
    }
}

#[test]
fn connect_data_is_never_left_in_place() {
    let t = target(false);
    let now = Instant::now();
    let cfg = QueueConfig::admin(HOST, [7; 16], &t.config().subnqn, 5000);
    let mut q: Queue<Vec<u8>> = Queue::new(cfg, now);
    let mut c = t.connection();
    for _ in 0..10 {
        let (_, wire, placed) = vectored(&mut q, 1 << 20, 1, Some(&|_| 1));
        assert!(placed.is_empty(), "ICReq and Connect are the queue's own");
        c.handle_bytes(&wire);
        q.handle_bytes(now, &c.take_output());
    }
    assert!(q.is_live());
}

#[test]
fn expects_read_data_names_reads_with_that_much_data_still_due() {
    let t = target(false);
    let (mut q, mut c) = io_queue(&t, false);
    let now = Instant::now();
    assert!(!q.expects_read_data(1));
    // A 64 KiB write expects no read data.
    let w = Command::Write {
        nsid: 1,
        slba: 0,
        block_size: BLOCK as u32,
        fua: false,
    };
    q.submit(
        now,
        Request {
            command: w,
            buf: Some(vec![1; 65536]),
            user_data: 1,
        },
    )
    .unwrap();
    assert!(!q.expects_read_data(1));
    settle(&mut q, &mut c, now);
    assert!(matches!(q.poll_event(), Some(Event::Completed(_))));
    // A 40 KiB read does until its data is in.
    let r = Command::Read {
        nsid: 1,
        slba: 0,
        block_size: BLOCK as u32,
    };
    q.submit(
        now,
        Request {
            command: r,
            buf: Some(vec![0; 40960]),
            user_data: 2,
        },
    )
    .unwrap();
    assert!(q.expects_read_data(40960));
    assert!(!q.expects_read_data(40961));
    let mut out = Vec::new();
    while q.poll_transmit(&mut out, 1 << 20) > 0 {}
    c.handle_bytes(&out);
    let back = c.take_output();
    // The first 8 KiB C2HData PDU (24-byte header) is in: 32 KiB still due.
    q.handle_bytes(now, &back[..24 + 8192]);
    assert!(q.expects_read_data(32768));
    assert!(!q.expects_read_data(32769));
    q.handle_bytes(now, &back[24 + 8192..]);
    settle(&mut q, &mut c, now);
    assert!(!q.expects_read_data(1));
    q.close();
    assert!(!q.expects_read_data(1));
}

/// A driver that asks for `rx_header_len` bytes at every PDU boundary
/// gets each C2HData PDU's header without any of its data, and all of
/// that data offered for a direct receive, with and without digests; the
/// read's data still comes out right, and a header split across receives
/// falls back to `None`.
#[test]
fn rx_header_len_leaves_all_of_a_pdus_data_for_a_direct_receive() {
    for digests in [false, true] {
        let t = target(digests);
        let (mut q, mut c) = io_queue(&t, digests);
        let now = Instant::now();
        let written = data(65536, 3);
        let w = Command::Write {
            nsid: 1,
            slba: 0,
            block_size: BLOCK as u32,
            fua: false,
        };
        let r = Command::Read {
            nsid: 1,
            slba: 0,
            block_size: BLOCK as u32,
        };
        q.submit(
            now,
            Request {
                command: w,
                buf: Some(written.clone()),
                user_data: 1,
            },
        )
        .unwrap();
        settle(&mut q, &mut c, now);
        assert!(matches!(q.poll_event(), Some(Event::Completed(_))));
        let hlen = 24 + if digests { 4 } else { 0 };
        assert_eq!(q.rx_header_len(), Some(hlen), "digests {digests}");
        let back = answer_to(&mut q, &mut c, now, r, 65536, 2);
        let mut at = 0;
        let mut headers = 0;
        let mut direct = 0;
        while at < back.len() {
            if let Some(place) = q.rx_direct() {
                let n = place.len().min(back.len() - at);
                place[..n].copy_from_slice(&back[at..at + n]);
                q.handle_direct(now, n);
                direct += n;
                at += n;
            } else if let Some(n) = q.rx_header_len() {
                // One header, or two right after the read's last data
                // (its CapsuleResp comes next, unless the data carried
                // the SUCCESS flag).
                assert!(n == hlen || n == 2 * hlen, "{n}");
                let n = n.min(back.len() - at);
                let before = direct;
                q.handle_bytes(now, &back[at..at + n]);
                at += n;
                headers += 1;
                // Nothing of the PDU's data came with its header.
                assert_eq!(direct, before);
            } else {
                // A data digest: the bytes after a PDU's data.
                q.handle_bytes(now, &back[at..at + 1]);
                at += 1;
            }
        }
        assert_eq!(
            direct, 65536,
            "every data byte went direct (digests {digests})"
        );
        // The C2HData PDUs and the response (the fake target may fold the
        // status into the last data PDU).
        assert!(headers >= 2, "{headers} headers");
        match q.poll_event() {
            Some(Event::Completed(done)) => {
                assert_eq!(done.user_data, 2);
                assert_eq!(done.buf.as_deref(), Some(&written[..]));
            }
            e => panic!("expected the read's completion, got {e:?}"),
        }
        // Part of a header held back: the driver receives as usual.
        let back = answer_to(&mut q, &mut c, now, r, 4096, 3);
        q.handle_bytes(now, &back[..10]);
        assert_eq!(q.rx_header_len(), None);
        q.handle_bytes(now, &back[10..]);
        assert_eq!(q.rx_header_len(), Some(hlen));
        q.close();
        assert_eq!(q.rx_header_len(), None);
    }
}

/// Submit `command` with a buffer of `len` bytes and return the target's
/// answer, not yet handed to the queue.
fn answer_to(
    q: &mut Queue<Vec<u8>>,
    c: &mut FakeConnection,
    now: Instant,
    command: Command,
    len: usize,
    user_data: u64,
) -> Vec<u8> {
    q.submit(
        now,
        Request {
            command,
            buf: Some(vec![0; len]),
            user_data,
        },
    )
    .unwrap();
    let mut out = Vec::new();
    while q.poll_transmit(&mut out, 1 << 20) > 0 {}
    c.handle_bytes(&out);
    c.take_output()
}
