//! The engine's socket-side helpers (`gather`, `SendPlan`,
//! `direct_place`, `buffered_len`) driving an initiator queue against the
//! fake target in memory, as the engine's tx and rx tasks use them: write
//! data sent from the tag buffers in place, or (zero copy) from the
//! requests' pages while the tag buffers hold garbage, or spliced through
//! a pipe of any size, with chains of sends that stop anywhere; read data received through short buffered
//! receives and straight into the tag buffers; every byte arrives where it
//! belongs.

use std::sync::Arc;
use std::time::Instant;

use nvmf_initiator::fake_target::{FakeConfig, FakeConnection, FakeTarget};
use nvmf_initiator::{Command, Event, Queue, QueueConfig, Request};
use ublk_target::io::engine::{
    buffered_len, direct_place, gather, HeadCopies, Placed, Seg, SendPlan, RX_BYTES,
    RX_SHORT_BYTES, SPLICE_MIN_BYTES,
};
use ublk_target::io::fanout::PartId;
use ublk_target::io::requests::TagBuf;

const HOST: &str = "nqn.2026-01.io.test:engine-io";
const BS: u32 = 512;

fn connect(t: &Arc<FakeTarget>, now: Instant) -> (Queue<TagBuf>, FakeConnection) {
    let acfg = QueueConfig::admin(HOST, [3; 16], &t.config().subnqn, 5000);
    let mut admin: Queue<Vec<u8>> = Queue::new(acfg.clone(), now);
    let mut ac = t.connection();
    for _ in 0..10 {
        let mut out = Vec::new();
        while admin.poll_transmit(&mut out, 1 << 20) > 0 {}
        ac.handle_bytes(&out);
        admin.handle_bytes(now, &ac.take_output());
    }
    assert!(admin.is_live());
    let mut cfg = QueueConfig::io(&acfg, 1, admin.cntlid(), 64);
    cfg.max_transfer_bytes = 1 << 20;
    cfg.in_capsule_bytes = t.config().ioccsz * 16 - 64;
    let mut q: Queue<TagBuf> = Queue::new(cfg, now);
    let mut c = t.connection();
    for _ in 0..10 {
        let mut out = Vec::new();
        while q.poll_transmit(&mut out, 1 << 20) > 0 {}
        c.handle_bytes(&out);
        q.handle_bytes(now, &c.take_output());
    }
    assert!(matches!(q.poll_event(), Some(Event::Connected { .. })));
    (q, c)
}

/// A deterministic sequence of send and receive sizes.
struct Sizes(u64);

impl Sizes {
    fn next(&mut self, max: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        1 + (self.0 >> 33) as usize % max
    }
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(17) ^ (seed as u8) ^ (i >> 12) as u8)
        .collect()
}

/// `(bytes, is_write)` per tag, all in flight at once; returns the tag
/// buffers after every request completed.
/// What the helpers did in a run.
#[derive(Default, Debug)]
struct Seen {
    in_place: usize,
    from_pages: usize,
    direct: usize,
    short: usize,
    spliced: usize,
    head_copies: usize,
}

/// With `zero_copy`, every third tag's write has its data only in its
/// "request pages" (the tag buffer holds garbage), as
/// `Engine::data_in_request` marks large writes.
fn run(
    reqs: &[(usize, bool)],
    seed: u64,
    c2h_chunk: u32,
    zero_copy: bool,
    splice_min: usize,
) -> (Vec<Vec<u8>>, Arc<FakeTarget>, Seen) {
    let mut seen = Seen::default();
    let t = FakeTarget::new(FakeConfig {
        blocks: (32 << 20) / u64::from(BS),
        block_size: BS,
        mdts: 8,
        maxh2cdata: 128 * 1024,
        c2h_chunk,
        r2t_chunk: 1 << 20,
        max_queue_depth: 128,
        ..FakeConfig::default()
    });
    let now = Instant::now();
    let (mut q, mut conn) = connect(&t, now);
    // Reads read what an earlier run of writes left: fill the namespace.
    {
        let mut fill = Vec::new();
        let mut at = 0u64;
        for (tag, &(len, _)) in reqs.iter().enumerate() {
            fill.push((at, pattern(len, tag + 100)));
            at += len as u64;
        }
        for (i, (at, d)) in fill.into_iter().enumerate() {
            let mut b = d;
            // SAFETY: `b` lives until its write completed (below).
            let buf = unsafe { TagBuf::exclusive(b.as_mut_ptr(), b.len()) };
            let ok = q.submit(
                now,
                Request {
                    command: Command::Write {
                        nsid: 1,
                        slba: at / u64::from(BS),
                        block_size: BS,
                        fua: false,
                    },
                    buf: Some(buf),
                    user_data: PartId {
                        tag: i as u16,
                        piece: 0,
                        copy: 0,
                    }
                    .user_data(),
                },
            );
            assert!(ok.is_ok());
            for _ in 0..100 {
                let mut out = Vec::new();
                while q.poll_transmit(&mut out, 1 << 20) > 0 {}
                conn.handle_bytes(&out);
                q.handle_bytes(now, &conn.take_output());
                if let Some(Event::Completed(_)) = q.poll_event() {
                    break;
                }
            }
            drop(b);
        }
    }
    let in_request = |tag: usize| zero_copy && reqs[tag].1 && tag % 3 == 0;
    let pages: Vec<Vec<u8>> = reqs
        .iter()
        .enumerate()
        .map(|(tag, &(len, _))| pattern(len, tag))
        .collect();
    let mut bufs: Vec<Vec<u8>> = reqs
        .iter()
        .enumerate()
        .map(|(tag, &(len, write))| {
            if in_request(tag) {
                vec![0xee; len]
            } else if write {
                pattern(len, tag)
            } else {
                vec![0; len]
            }
        })
        .collect();
    let bases: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
    let mut at = 0u64;
    for (tag, &(len, write)) in reqs.iter().enumerate() {
        let b = &mut bufs[tag];
        // SAFETY: the buffers outlive the queue's use of them (the loop
        // below ends when every request completed) and are not touched
        // meanwhile.
        let buf = unsafe { TagBuf::exclusive(b.as_mut_ptr(), b.len()) };
        let slba = at / u64::from(BS);
        at += len as u64;
        let command = if write {
            Command::Write {
                nsid: 1,
                slba,
                block_size: BS,
                fua: false,
            }
        } else {
            Command::Read {
                nsid: 1,
                slba,
                block_size: BS,
            }
        };
        let user_data = PartId {
            tag: tag as u16,
            piece: 0,
            copy: 0,
        }
        .user_data();
        let ok = q.submit(
            now,
            Request {
                command,
                buf: Some(buf),
                user_data,
            },
        );
        assert!(ok.is_ok());
    }
    let mut sizes = Sizes(seed);
    let (mut sbuf, mut placed, mut plan) = (Vec::new(), Vec::<Placed>::new(), SendPlan::default());
    let mut heads = HeadCopies::new(reqs.len() as u16);
    let mut rbuf = vec![0u8; RX_BYTES];
    let mut wire: Vec<u8> = Vec::new();
    let mut pos = 0;
    let mut done = 0;
    let mut rounds = 0;
    while done < reqs.len() {
        rounds += 1;
        assert!(rounds < 100_000, "stuck at {done} of {}", reqs.len());
        // tx: gather, then chains of up to 8 SQEs, each of which takes
        // any number of bytes (a short one cancels the rest of its chain).
        if q.has_transmit() {
            let n = gather(&mut q, &mut sbuf, &mut placed, &|tag| {
                in_request(usize::from(tag)).then(|| bases[usize::from(tag)])
            });
            seen.in_place += placed.len();
            // As `Engine::tx_gather`: the headers of spliced data copied
            // (each tag has one request here, so no reset).
            heads.copy(&sbuf, &mut placed, splice_min);
            seen.head_copies += placed.iter().filter(|d| d.head_copy.is_some()).count();
            plan.build(&sbuf, &placed, splice_min);
            let mut sent = Vec::new();
            // The pipe: what vmsplice put in it, in order, up to a room
            // that changes from chain to chain (1 byte up to 300 KiB).
            let mut pipe: std::collections::VecDeque<u8> = Default::default();
            while !plan.is_done() {
                let mut chain = plan.pending().len().min(sizes.next(8));
                let room = sizes.next(300 * 1024);
                chain = plan
                    .fill_pipe(chain, |iov| {
                        let mut n = 0;
                        for v in iov {
                            let t = v.iov_len.min(room.saturating_sub(pipe.len()));
                            // SAFETY: a piece of a tag buffer or a header
                            // copy, `iov_len` bytes.
                            pipe.extend(unsafe {
                                std::slice::from_raw_parts(v.iov_base as *const u8, t)
                            });
                            n += t;
                        }
                        Ok(n)
                    })
                    .expect("the pipe takes something at the front");
                let mut res = Vec::new();
                let mut broken = false;
                for seg in &plan.pending()[..chain] {
                    if broken {
                        res.push(-libc::ECANCELED);
                        continue;
                    }
                    let len = plan.seg_len(seg);
                    let take = len.min(sizes.next(70_000));
                    match *seg {
                        Seg::Msg { first, count } => {
                            let mut left = take;
                            for v in &plan.iov[first..first + count] {
                                let t = v.iov_len.min(left);
                                // SAFETY: built from `sbuf` and the tag buffers.
                                sent.extend_from_slice(unsafe {
                                    std::slice::from_raw_parts(v.iov_base as *const u8, t)
                                });
                                left -= t;
                            }
                        }
                        Seg::Fixed { tag, offset, .. } => {
                            assert!(in_request(usize::from(tag)), "tag {tag} has its data");
                            let o = offset as usize;
                            sent.extend_from_slice(&pages[usize::from(tag)][o..o + take]);
                            seen.from_pages += take;
                        }
                        Seg::Splice { len, queued, .. } => {
                            assert!(splice_min != usize::MAX && queued > 0 && queued <= len);
                            // The SQE moves at most what is in the pipe.
                            let take = take.min(queued as usize);
                            sent.extend(pipe.drain(..take));
                            seen.spliced += take;
                            res.push(take as i32);
                            broken = take < len as usize;
                            continue;
                        }
                    }
                    res.push(take as i32);
                    broken = take < len;
                }
                plan.complete(&res).unwrap();
            }
            assert!(pipe.is_empty(), "the pipe holds only what is pending");
            assert_eq!(sent.len(), n);
            conn.handle_bytes(&sent);
        }
        wire.extend_from_slice(&conn.take_output());
        // rx: as the rx task, a receive returns a prefix of what it asks.
        while pos < wire.len() {
            let avail = wire.len() - pos;
            match direct_place(&mut q) {
                Some((_, ptr, len)) => {
                    let n = sizes.next(len).min(avail);
                    // SAFETY: the place `rx_direct` offered, `len` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(wire[pos..].as_ptr(), ptr, n) };
                    pos += n;
                    q.handle_direct(now, n);
                    seen.direct += 1;
                }
                None => {
                    let ask = buffered_len(&q);
                    // The full buffer, or while a large read expects
                    // data, 8 KiB or (at a PDU boundary) just the next
                    // headers.
                    assert!(
                        ask == RX_BYTES || ask == RX_SHORT_BYTES || Some(ask) == q.rx_header_len(),
                        "{ask}"
                    );
                    seen.short += usize::from(ask != RX_BYTES);
                    let n = sizes.next(ask).min(avail);
                    rbuf[..n].copy_from_slice(&wire[pos..pos + n]);
                    pos += n;
                    q.handle_bytes(now, &rbuf[..n]);
                }
            }
            while let Some(ev) = q.poll_event() {
                match ev {
                    Event::Completed(c) => {
                        assert!(c.status.is_success());
                        done += 1;
                    }
                    Event::Failed(e) => panic!("queue failed: {e}"),
                    Event::Connected { .. } => panic!("connected twice"),
                }
            }
        }
    }
    (bufs, t, seen)
}

#[test]
fn writes_in_place_and_reads_direct_carry_every_byte() {
    // Mixed sizes: in-capsule (4 KiB), copied (1 KiB), R2T writes of one
    // and of several H2CData PDUs, reads below and above the short-receive
    // threshold, one C2HData per read or several.
    let sizes = [
        4096, 1024, 131072, 524288, 8192, 65536, 262144, 4096, 1048576, 512,
    ];
    // Splicing: never, at the engine's threshold, and from 4 KiB (every
    // piece left in place).
    let off = usize::MAX;
    for (seed, c2h_chunk, zero_copy, splice_min) in [
        (1u64, 1 << 20, false, off),
        (2, 32768, false, off),
        (3, 1 << 20, false, SPLICE_MIN_BYTES),
        (4, 1 << 20, true, off),
        (5, 32768, true, SPLICE_MIN_BYTES),
        (6, 32768, false, 4096),
        (7, 1 << 20, true, 4096),
    ] {
        let reqs: Vec<(usize, bool)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| (len, (i + seed as usize) % 2 == 0))
            .collect();
        let (bufs, t, seen) = run(&reqs, seed, c2h_chunk, zero_copy, splice_min);
        assert!(
            seen.in_place > 0 && seen.direct > 0 && seen.short > 0,
            "{seen:?}"
        );
        assert_eq!(seen.from_pages > 0, zero_copy, "{seen:?}");
        assert_eq!(seen.spliced > 0, splice_min != off, "{seen:?}");
        assert_eq!(seen.head_copies > 0, splice_min != off, "{seen:?}");
        let data = t.data();
        let mut at = 0;
        for (tag, &(len, write)) in reqs.iter().enumerate() {
            let want = if write {
                pattern(len, tag)
            } else {
                pattern(len, tag + 100)
            };
            assert_eq!(&data[at..at + len], &want[..], "target, tag {tag}");
            if !(zero_copy && write && tag % 3 == 0) {
                assert_eq!(bufs[tag], want, "tag buffer {tag}");
            }
            at += len;
        }
    }
}
