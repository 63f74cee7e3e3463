//! Read data received in place: the same target byte stream fed through
//! `handle_bytes` in every split, and through a driver that receives C2HData
//! data straight into the request's buffer (`rx_direct` / `handle_direct`)
//! whenever it is offered, mixed with `handle_bytes`, gives the same events
//! and the same data; with and without digests, several C2HData PDUs per
//! command, commands interleaved, SUCCESS-flag and CapsuleResp completions,
//! a corrupted data digest, and the queue closing while data is due.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use nvmf_initiator::{Command, Error, Event, Queue, QueueConfig, Request};
use nvmf_proto::raw::RawPdu;
use nvmf_proto::{
    C2HData, CapsuleResp, Cqe, Decoded, DecoderConfig, EncodeConfig, IcResp, Pdu, PduDecoder,
    ProtoError, Role,
};

const BLOCK: usize = 512;
/// Read sizes: one PDU, several PDUs, and (above `MAX_TRANSFER`) several
/// commands per request.
const READS: &[usize] = &[512, 4096, 6144, 20480, 1024];
const MAX_TRANSFER: u32 = 8192;

fn config(digests: bool) -> QueueConfig {
    let admin = QueueConfig::admin("nqn.2026-01.io.test:host", [7; 16], "nqn.test:sub", 0);
    let mut c = QueueConfig::io(&admin, 1, 1, 8);
    c.header_digest = digests;
    c.data_digest = digests;
    c.max_transfer_bytes = MAX_TRANSFER;
    c.command_timeout = Duration::from_secs(30);
    c
}

fn encode_cfg(digests: bool) -> EncodeConfig {
    EncodeConfig {
        header_digest: digests,
        data_digest: digests,
        tx_pda: 0,
    }
}

/// What block `lba` holds: every byte depends on its position.
fn block_data(lba: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (lba as u8).wrapping_mul(13) ^ (i as u8).wrapping_mul(7) ^ (lba >> 8) as u8)
        .collect()
}

/// Commands as the host sent them: (CID, first LBA, bytes), in order.
type Sent = Vec<(u16, u64, usize)>;

/// The commands the host sent since the last call.
fn sent_reads(q: &mut Queue<Vec<u8>>, digests: bool) -> Sent {
    let mut tx = Vec::new();
    while q.poll_transmit(&mut tx, 1 << 20) > 0 {}
    let mut cfg = DecoderConfig::new(Role::Controller);
    cfg.header_digest = digests;
    cfg.data_digest = digests;
    let dec = PduDecoder::new(cfg);
    let mut out = Vec::new();
    let mut rest = &tx[..];
    while !rest.is_empty() {
        let Decoded::Pdu { pdu, consumed } = dec.decode(rest).unwrap() else {
            panic!("partial PDU from the host")
        };
        if let Pdu::CapsuleCmd(c) = pdu {
            let len = (u32::from(c.sqe.cdw12 as u16) + 1) as usize * BLOCK;
            let slba = u64::from(c.sqe.cdw10) | (u64::from(c.sqe.cdw11) << 32);
            out.push((c.sqe.cid, slba, len));
        }
        rest = &rest[consumed..];
    }
    out
}

/// A live I/O queue with the read workload submitted and sent, and the
/// commands it sent. The same every time, so command IDs match the
/// scripted stream.
fn live_queue(digests: bool, now: Instant) -> (Queue<Vec<u8>>, Sent) {
    let mut q: Queue<Vec<u8>> = Queue::new(config(digests), now);
    let mut tx = Vec::new();
    while q.poll_transmit(&mut tx, 1 << 20) > 0 {}
    let ic = IcResp {
        cpda: 0,
        header_digest: digests,
        data_digest: digests,
        maxh2cdata: 8192,
    };
    q.handle_bytes(
        now,
        &Pdu::IcResp(ic).to_vec(&EncodeConfig::default()).unwrap(),
    );
    let connect = sent_reads(&mut q, digests);
    assert_eq!(connect.len(), 1, "the Connect");
    let resp = Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe::success(connect[0].0).with_dw0(1),
    });
    q.handle_bytes(now, &resp.to_vec(&encode_cfg(digests)).unwrap());
    assert!(matches!(q.poll_event(), Some(Event::Connected { .. })));
    let mut slba = 0;
    for (i, &len) in READS.iter().enumerate() {
        q.submit(
            now,
            Request {
                command: Command::Read {
                    nsid: 1,
                    slba,
                    block_size: BLOCK as u32,
                },
                buf: Some(vec![0; len]),
                user_data: i as u64,
            },
        )
        .unwrap();
        slba += (len / BLOCK) as u64 + 3;
    }
    let cmds = sent_reads(&mut q, digests);
    (q, cmds)
}

/// The target's answer: every command's data in C2HData PDUs of varying
/// sizes, commands interleaved round-robin; even commands end with the
/// SUCCESS flag, odd ones with a CapsuleResp.
fn target_stream(digests: bool) -> Vec<u8> {
    let (_, cmds) = live_queue(digests, Instant::now());
    assert_eq!(cmds.len(), 7, "{cmds:?}");
    let enc = encode_cfg(digests);
    let mut sent = vec![0usize; cmds.len()];
    let mut out = Vec::new();
    let chunks = [1000usize, 3000, 512, 4096, 7];
    let mut k = 0;
    while sent.iter().zip(&cmds).any(|(s, c)| *s < c.2) {
        for (i, &(cid, slba, len)) in cmds.iter().enumerate() {
            if sent[i] == len {
                continue;
            }
            let n = chunks[k % chunks.len()].min(len - sent[i]);
            k += 1;
            let data: Vec<u8> = (sent[i]..sent[i] + n)
                .map(|off| block_data(slba + (off / BLOCK) as u64)[off % BLOCK])
                .collect();
            let last = sent[i] + n == len;
            let success = last && i % 2 == 0;
            Pdu::C2HData(C2HData {
                cccid: cid,
                datao: sent[i] as u32,
                last,
                success,
                data: Cow::Owned(data),
            })
            .encode(&enc, &mut out)
            .unwrap();
            sent[i] += n;
            if last && !success {
                Pdu::CapsuleResp(CapsuleResp {
                    cqe: Cqe::success(cid),
                })
                .encode(&enc, &mut out)
                .unwrap();
            }
        }
    }
    out
}

/// One way of feeding the stream, step by step.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// `handle_bytes` with this many bytes.
    Bytes(usize),
    /// If `rx_direct` offers a place, write up to this many bytes into it
    /// and `handle_direct`; otherwise `handle_bytes` with that many.
    Direct(usize),
    /// If `rx_direct` offers a place, fill all of it; otherwise
    /// `handle_bytes` with this many.
    DirectAll(usize),
}

fn summary(e: &Event<Vec<u8>>) -> String {
    match e {
        Event::Connected { cntlid } => format!("connected {cntlid}"),
        Event::Completed(c) => format!(
            "done {} {} {:?}",
            c.user_data,
            c.status,
            c.buf.as_ref().map(|b| nvmf_proto::pdu::crc32c(b))
        ),
        Event::Failed(err) => format!("failed {err}"),
    }
}

/// What feeding a stream gave.
struct Fed {
    /// Event summaries, in order.
    events: Vec<String>,
    /// (user_data, buffer) of every completed read.
    reads: Vec<(u64, Vec<u8>)>,
    /// Bytes that went in place (`handle_direct`).
    direct: usize,
    queue: Queue<Vec<u8>>,
}

/// Feed `stream` to a fresh live queue in the steps `steps` gives (called
/// with the bytes left).
fn feed(digests: bool, stream: &[u8], mut steps: impl FnMut(usize) -> Step) -> Fed {
    let now = Instant::now();
    let (mut q, _) = live_queue(digests, now);
    let mut events = Vec::new();
    let mut reads = Vec::new();
    let mut direct = 0;
    let mut rest = stream;
    let mut sink = Vec::new();
    while !rest.is_empty() {
        let step = steps(rest.len());
        let n = match step {
            Step::Bytes(n) | Step::Direct(n) | Step::DirectAll(n) => n.clamp(1, rest.len()),
        };
        let taken = match (step, q.rx_direct()) {
            (Step::Direct(_) | Step::DirectAll(_), Some(place)) => {
                let n = match step {
                    Step::DirectAll(_) => place.len(),
                    _ => n.min(place.len()),
                };
                place[..n].copy_from_slice(&rest[..n]);
                q.handle_direct(now, n);
                direct += n;
                n
            }
            _ => {
                q.handle_bytes(now, &rest[..n]);
                n
            }
        };
        rest = &rest[taken..];
        sink.clear();
        while q.poll_transmit(&mut sink, 1 << 20) > 0 {}
        while let Some(e) = q.poll_event() {
            events.push(summary(&e));
            if let Event::Completed(c) = e {
                reads.push((c.user_data, c.buf.unwrap()));
            }
        }
    }
    Fed {
        events,
        reads,
        direct,
        queue: q,
    }
}

fn expected_reads() -> Vec<(u64, Vec<u8>)> {
    let mut slba = 0;
    let mut out = Vec::new();
    for (i, &len) in READS.iter().enumerate() {
        let data: Vec<u8> = (0..len / BLOCK)
            .flat_map(|b| block_data(slba + b as u64))
            .collect();
        out.push((i as u64, data));
        slba += (len / BLOCK) as u64 + 3;
    }
    out
}

fn whole(digests: bool, stream: &[u8]) -> Vec<String> {
    feed(digests, stream, Step::Bytes).events
}

#[test]
fn the_whole_stream_reads_the_right_data() {
    for digests in [false, true] {
        let stream = target_stream(digests);
        let Fed {
            events,
            mut reads,
            queue: mut q,
            ..
        } = feed(digests, &stream, Step::Bytes);
        assert_eq!(events.len(), READS.len(), "{events:?}");
        reads.sort_by_key(|r| r.0);
        assert_eq!(reads, expected_reads());
        assert!(q.is_live());
        assert_eq!(q.outstanding(), 0);
        assert!(q.rx_direct().is_none());
    }
}

#[test]
fn every_chunk_size_through_handle_bytes_gives_the_same_events() {
    for digests in [false, true] {
        let stream = target_stream(digests);
        let want = whole(digests, &stream);
        // Every size up to a few headers, then sizes that fall everywhere
        // relative to the PDUs (a prime stride).
        for size in (1..=200).chain((201..=stream.len()).step_by(61)) {
            let got = feed(digests, &stream, |_| Step::Bytes(size)).events;
            assert_eq!(got, want, "digests {digests}, chunk {size}");
        }
    }
}

/// Every cut near a PDU boundary (inside each header and digest and a
/// little into the data), and a cut every 31 bytes inside the data.
fn interesting_cuts(digests: bool, stream: &[u8]) -> Vec<usize> {
    let mut cfg = DecoderConfig::new(Role::Host);
    cfg.header_digest = digests;
    cfg.data_digest = digests;
    let dec = PduDecoder::new(cfg);
    let mut cuts = std::collections::BTreeSet::new();
    let mut at = 0;
    while at < stream.len() {
        let Decoded::Pdu { consumed, .. } = dec.decode(&stream[at..]).unwrap() else {
            panic!("stream ends inside a PDU")
        };
        let end = at + consumed;
        cuts.extend(at.saturating_sub(8)..(at + 40).min(end));
        cuts.extend((at..end).step_by(31));
        cuts.extend(end.saturating_sub(8)..end);
        at = end;
    }
    cuts.into_iter()
        .filter(|&c| c > 0 && c < stream.len())
        .collect()
}

#[test]
fn every_two_piece_split_gives_the_same_events() {
    for digests in [false, true] {
        let stream = target_stream(digests);
        let want = whole(digests, &stream);
        for cut in interesting_cuts(digests, &stream) {
            let mut first = true;
            let got = feed(digests, &stream, |n| {
                let s = if first { cut } else { n };
                first = false;
                Step::Bytes(s)
            })
            .events;
            assert_eq!(got, want, "digests {digests}, cut at {cut}");
        }
    }
}

#[test]
fn direct_receives_of_every_size_give_the_same_events_and_data() {
    for digests in [false, true] {
        let stream = target_stream(digests);
        let want = whole(digests, &stream);
        let total_data: usize = READS.iter().sum();
        for size in (1..=24).chain([31, 47, 64, 100, 511, 512, 1000, 4096, 8192, stream.len()]) {
            // Direct whenever offered, the rest in chunks of `size`.
            let Fed {
                events: got,
                mut reads,
                direct,
                ..
            } = feed(digests, &stream, |_| Step::Direct(size));
            assert_eq!(got, want, "digests {digests}, size {size}");
            reads.sort_by_key(|r| r.0);
            assert_eq!(reads, expected_reads());
            if size < stream.len() {
                assert!(direct > 0, "size {size}: nothing went in place");
            }
            assert!(direct <= total_data);
            // Alternating: direct, then bytes (which then carry data too).
            let mut k = 0;
            let got = feed(digests, &stream, |_| {
                k += 1;
                if k % 2 == 0 {
                    Step::Direct(size)
                } else {
                    Step::Bytes(size)
                }
            })
            .events;
            assert_eq!(got, want, "digests {digests}, alternating {size}");
        }
        // Everything else one byte at a time: all data goes in place, only
        // headers, digests and CapsuleResps through handle_bytes.
        let fed = feed(digests, &stream, |_| Step::DirectAll(1));
        assert_eq!(fed.events, want);
        assert_eq!(fed.direct, total_data);
    }
}

/// The offset in `stream` just after the `nth` C2HData PDU's header.
fn nth_data_start(digests: bool, stream: &[u8], nth: usize) -> (usize, usize) {
    let mut cfg = DecoderConfig::new(Role::Host);
    cfg.header_digest = digests;
    cfg.data_digest = digests;
    let dec = PduDecoder::new(cfg);
    let mut at = 0;
    let mut seen = 0;
    loop {
        let Decoded::Pdu { pdu, consumed } = dec.decode(&stream[at..]).unwrap() else {
            panic!("stream ends")
        };
        if let Pdu::C2HData(d) = &pdu {
            if seen == nth {
                return (at, consumed - d.data.len() - if digests { 4 } else { 0 });
            }
            seen += 1;
        }
        at += consumed;
    }
}

#[test]
fn a_corrupted_data_digest_fails_as_before_whatever_the_path() {
    let stream = target_stream(true);
    let (at, head) = nth_data_start(true, &stream, 4);
    let plen = u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
    let bad_pdu = RawPdu::from_bytes(stream[at..at + plen].to_vec())
        .corrupt_data_digest()
        .into_bytes();
    let mut bad = stream.clone();
    bad[at..at + plen].copy_from_slice(&bad_pdu);
    // The error the decoder gives for that PDU, whole.
    let mut cfg = DecoderConfig::new(Role::Host);
    cfg.header_digest = true;
    cfg.data_digest = true;
    let want_err = PduDecoder::new(cfg).decode(&bad_pdu).unwrap_err();
    assert!(matches!(want_err, ProtoError::DataDigestMismatch { .. }));

    let want = whole(true, &bad);
    assert_eq!(
        want.last().unwrap(),
        &format!("failed {}", Error::Protocol(want_err)),
        "{want:?}"
    );
    let plans: Vec<Box<dyn FnMut(usize) -> Step>> = vec![
        Box::new(|_| Step::Bytes(1)),
        Box::new(|_| Step::Bytes(777)),
        Box::new(|_| Step::Direct(1)),
        Box::new(|_| Step::Direct(100)),
        Box::new(|_| Step::DirectAll(1)),
        Box::new(|_| Step::DirectAll(usize::MAX)),
    ];
    for (i, plan) in plans.into_iter().enumerate() {
        let Fed {
            events: got,
            queue: mut q,
            ..
        } = feed(true, &bad, plan);
        // Bytes after the failure are ignored, so the events are the same.
        assert_eq!(got, want, "plan {i}");
        assert!(q.is_closed());
        assert!(q.rx_direct().is_none());
        let unfinished = q.take_unfinished();
        let done = got.iter().filter(|e| e.starts_with("done")).count();
        assert_eq!(done + unfinished.len(), READS.len(), "plan {i}");
    }
    // The header of that PDU was fine: its data was going in place.
    let now = Instant::now();
    let (mut q, _) = live_queue(true, now);
    q.handle_bytes(now, &bad[..at + head]);
    assert!(q.rx_direct().is_some());
}

#[test]
fn closing_while_data_is_due_ends_as_before() {
    for digests in [false, true] {
        let stream = target_stream(digests);
        let (at, head) = nth_data_start(digests, &stream, 6);
        let cut = at + head + 10;
        type End = fn(&mut Queue<Vec<u8>>, Instant) -> Option<&'static str>;
        let ends: [End; 4] = [
            |q, now| {
                q.handle_timeout(now + Duration::from_secs(31));
                Some("timed out")
            },
            |q, _| {
                q.handle_closed();
                Some("closed")
            },
            |q, _| {
                q.handle_io_error(std::io::Error::from_raw_os_error(libc::ECONNRESET));
                Some("")
            },
            |q, _| {
                q.close();
                None
            },
        ];
        for (i, end) in ends.into_iter().enumerate() {
            let now = Instant::now();
            let (mut q, _) = live_queue(digests, now);
            q.handle_bytes(now, &stream[..cut]);
            let mut done = 0;
            while let Some(e) = q.poll_event() {
                assert!(matches!(e, Event::Completed(_)));
                done += 1;
            }
            let left = q.rx_direct().map(|p| p.len()).expect("data due");
            assert!(left > 0);
            let owner = q.rx_direct_user_data().expect("owner");
            let expect_event = end(&mut q, now);
            assert!(q.is_closed());
            match (q.poll_event(), expect_event) {
                (Some(Event::Failed(e)), Some(what)) => {
                    assert!(e.to_string().contains(what), "{e}")
                }
                (None, None) => {}
                (e, want) => panic!("end {i}: {e:?}, wanted {want:?}"),
            }
            // Late data is dropped: nothing is due, nothing happens.
            assert!(q.rx_direct().is_none());
            assert!(q.rx_direct_user_data().is_none());
            q.handle_direct(now, 5);
            q.handle_bytes(now, &stream[cut..]);
            assert!(q.poll_event().is_none());
            let unfinished = q.take_unfinished();
            assert_eq!(done + unfinished.len(), READS.len(), "end {i}");
            assert!(unfinished.iter().any(|r| r.user_data == owner));
            for r in &unfinished {
                assert_eq!(
                    r.buf.as_ref().map(Vec::len),
                    Some(READS[r.user_data as usize])
                );
            }
        }
    }
}

#[test]
fn the_direct_place_is_the_requests_own_buffer_at_the_pdus_offset() {
    let digests = false;
    let stream = target_stream(digests);
    let now = Instant::now();
    let (mut q, _) = live_queue(digests, now);
    // The first PDU: command 0 (512 bytes, one PDU with SUCCESS).
    let (at, head) = nth_data_start(digests, &stream, 0);
    assert_eq!(at, 0);
    q.handle_bytes(now, &stream[..head + 100]);
    assert_eq!(q.rx_direct_user_data(), Some(0));
    let place = q.rx_direct().unwrap();
    assert_eq!(place.len(), 412);
    place.copy_from_slice(&stream[head + 100..head + 512]);
    q.handle_direct(now, 412);
    assert!(q.rx_direct().is_none(), "no digest, nothing more due");
    match q.poll_event() {
        Some(Event::Completed(c)) => {
            assert_eq!(c.user_data, 0);
            assert_eq!(c.buf.unwrap(), expected_reads()[0].1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
#[should_panic(expected = "handle_direct")]
fn reporting_more_than_was_offered_is_a_driver_bug() {
    let stream = target_stream(false);
    let now = Instant::now();
    let (mut q, _) = live_queue(false, now);
    let (_, head) = nth_data_start(false, &stream, 0);
    q.handle_bytes(now, &stream[..head]);
    let n = q.rx_direct().unwrap().len();
    q.handle_direct(now, n + 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_splits_and_random_paths(
        digests in any::<bool>(),
        plan in prop::collection::vec((any::<bool>(), 1usize..3000), 1..40),
    ) {
        let stream = target_stream(digests);
        let want = whole(digests, &stream);
        let mut i = 0;
        let Fed { events: got, mut reads, .. } = feed(digests, &stream, |_| {
            let (direct, n) = plan[i % plan.len()];
            i += 1;
            if direct { Step::Direct(n) } else { Step::Bytes(n) }
        });
        prop_assert_eq!(got, want);
        reads.sort_by_key(|r| r.0);
        prop_assert_eq!(reads, expected_reads());
    }
}
