//! The sans-IO queue core against the scripted fake target, in memory, on a
//! virtual clock: I/O of every transfer shape, malformed and unexpected
//! PDUs, timeouts, and byte streams split everywhere.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_initiator::fake_target::{FakeConfig, FakeConnection, FakeTarget, Fault, Trigger};
use nvmf_initiator::queue::QueueStats;
use nvmf_initiator::{Command, ConnectRefusal, Error, Event, Queue, QueueConfig, Request};
use nvmf_proto::Status;

const HOST: &str = "nqn.2026-01.io.test:host";

struct Pair {
    host: Queue<Vec<u8>>,
    target: FakeConnection,
    now: Instant,
    events: Vec<Event<Vec<u8>>>,
    /// Everything the target sent, for replay.
    from_target: Vec<u8>,
}

impl Pair {
    fn new(target: &Arc<FakeTarget>, cfg: QueueConfig, now: Instant) -> Self {
        Self {
            host: Queue::new(cfg, now),
            target: target.connection(),
            now,
            events: Vec::new(),
            from_target: Vec::new(),
        }
    }

    /// Move bytes both ways until neither side has anything to say.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            let mut buf = Vec::new();
            while self.host.poll_transmit(&mut buf, 64 * 1024) > 0 {}
            if !buf.is_empty() {
                self.target.handle_bytes(&buf);
            }
            let back = self.target.take_output();
            if !back.is_empty() {
                self.from_target.extend_from_slice(&back);
                self.host.handle_bytes(self.now, &back);
            }
            while let Some(e) = self.host.poll_event() {
                self.events.push(e);
            }
            if buf.is_empty() && back.is_empty() {
                return;
            }
        }
        panic!("pump did not settle");
    }

    /// Jump the virtual clock to the next timeout and handle it.
    fn advance(&mut self) -> bool {
        let Some(t) = self.host.poll_timeout() else {
            return false;
        };
        self.now = self.now.max(t);
        self.host.handle_timeout(self.now);
        self.pump();
        true
    }

    fn failed(&self) -> Option<&Error> {
        self.events.iter().find_map(|e| match e {
            Event::Failed(err) => Some(err),
            _ => None,
        })
    }

    fn completions(&mut self) -> Vec<nvmf_initiator::Completion<Vec<u8>>> {
        let mut out = Vec::new();
        let mut rest = Vec::new();
        for e in self.events.drain(..) {
            match e {
                Event::Completed(c) => out.push(c),
                other => rest.push(other),
            }
        }
        self.events = rest;
        out
    }
}

fn admin_cfg(t: &FakeTarget, digests: bool) -> QueueConfig {
    let mut c = QueueConfig::admin(HOST, [7; 16], &t.config().subnqn, 5000);
    c.header_digest = digests;
    c.data_digest = digests;
    c
}

/// A live I/O queue (after an admin Connect created the controller).
fn io_pair(t: &Arc<FakeTarget>, digests: bool, depth: u16) -> Pair {
    let now = Instant::now();
    let mut admin = Pair::new(t, admin_cfg(t, digests), now);
    admin.pump();
    let cntlid = admin.host.cntlid();
    assert!(admin.host.is_live(), "admin events: {:?}", admin.events);
    let cfg = t.config();
    let mut io = QueueConfig::io(&admin_cfg(t, digests), 1, cntlid, depth);
    io.max_transfer_bytes = if cfg.mdts == 0 {
        1 << 20
    } else {
        4096 << cfg.mdts
    };
    io.in_capsule_bytes = cfg.ioccsz * 16 - 64;
    let mut p = Pair::new(t, io, now);
    p.pump();
    assert!(matches!(p.events.remove(0), Event::Connected { .. }));
    p
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn write(slba: u64, data: Vec<u8>, user_data: u64) -> Request<Vec<u8>> {
    Request {
        command: Command::Write {
            nsid: 1,
            slba,
            block_size: 512,
            fua: false,
        },
        buf: Some(data),
        user_data,
    }
}

fn read(slba: u64, len: usize, user_data: u64) -> Request<Vec<u8>> {
    Request {
        command: Command::Read {
            nsid: 1,
            slba,
            block_size: 512,
        },
        buf: Some(vec![0; len]),
        user_data,
    }
}

/// Sizes that exercise in-capsule (≤ 8 KiB), R2T (> 8 KiB), several
/// C2HData and H2CData PDUs (> 8 KiB), and MDTS splitting (> 32 KiB).
const SIZES: &[usize] = &[512, 4096, 8192, 8704, 16384, 32768, 33280, 102400, 1 << 20];

fn roundtrip(cfg: FakeConfig, digests: bool) -> QueueStats {
    let t = FakeTarget::new(FakeConfig {
        blocks: 8192,
        ..cfg
    });
    let mut p = io_pair(&t, digests, 8);
    let mut slba = 0u64;
    let mut expect = Vec::new();
    for (i, &len) in SIZES.iter().enumerate() {
        let data = pattern(len, i as u8);
        p.host
            .submit(p.now, write(slba, data.clone(), i as u64))
            .unwrap();
        expect.push((slba, data));
        slba += (len / 512) as u64;
    }
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), SIZES.len(), "events {:?}", p.events);
    assert!(done.iter().all(|c| c.status.is_success()));
    for (i, (slba, data)) in expect.iter().enumerate() {
        p.host
            .submit(p.now, read(*slba, data.len(), 100 + i as u64))
            .unwrap();
    }
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), SIZES.len());
    for c in done {
        let (_, data) = &expect[(c.user_data - 100) as usize];
        assert!(c.status.is_success());
        assert!(c.buf.as_ref() == Some(data), "read {} differs", c.user_data);
    }
    assert!(p.failed().is_none());
    p.host.stats()
}

#[test]
fn io_of_every_shape_without_digests() {
    let s = roundtrip(FakeConfig::default(), false);
    assert!(s.in_capsule_writes > 0, "{s:?}");
    assert!(s.r2ts > 0, "{s:?}");
    assert!(s.commands > 2 * SIZES.len() as u64, "MDTS split: {s:?}");
}

#[test]
fn io_of_every_shape_with_digests_and_success_flag() {
    let s = roundtrip(
        FakeConfig {
            success_flag: true,
            c2h_chunk: 4096,
            r2t_chunk: 8192,
            maxh2cdata: 4096,
            ..FakeConfig::default()
        },
        true,
    );
    assert!(s.success_shortcuts > 0, "{s:?}");
}

#[test]
fn unlimited_mdts_and_large_in_capsule() {
    roundtrip(
        FakeConfig {
            mdts: 0,
            ioccsz: (65536 + 64) / 16,
            c2h_chunk: 65536,
            r2t_chunk: 1 << 20,
            maxh2cdata: 32768,
            ..FakeConfig::default()
        },
        false,
    );
}

#[test]
fn more_requests_than_slots_wait_their_turn_and_cids_never_repeat_stale() {
    let t = FakeTarget::new(FakeConfig::default());
    let mut p = io_pair(&t, false, 2);
    for i in 0..50u64 {
        p.host
            .submit(p.now, write(i, pattern(512, i as u8), i))
            .unwrap();
    }
    p.pump();
    assert_eq!(p.completions().len(), 50);
    for i in 0..50u64 {
        p.host.submit(p.now, read(i, 512, i)).unwrap();
    }
    p.pump();
    for c in p.completions() {
        assert_eq!(c.buf.unwrap(), pattern(512, c.user_data as u8));
    }
}

#[test]
fn completion_dword1_carries_credits() {
    let t = FakeTarget::new(FakeConfig {
        credit: Some(17),
        ..FakeConfig::default()
    });
    let mut p = io_pair(&t, false, 4);
    p.host.submit(p.now, read(0, 4096, 1)).unwrap();
    p.pump();
    let c = p.completions().pop().unwrap();
    assert_eq!(c.gimbal_credit(), Some(17));
}

#[test]
fn out_of_range_is_a_status_not_an_error() {
    let t = FakeTarget::new(FakeConfig::default());
    let mut p = io_pair(&t, false, 4);
    p.host.submit(p.now, read(8190, 4096, 1)).unwrap();
    p.pump();
    let c = p.completions().pop().unwrap();
    assert!(c.status.same_code(Status::LBA_OUT_OF_RANGE));
    assert!(p.host.is_live());
}

#[test]
fn invalid_requests_are_handed_back() {
    let t = FakeTarget::new(FakeConfig::default());
    let mut p = io_pair(&t, false, 4);
    let r = p.host.submit(p.now, read(0, 100, 1)).unwrap_err();
    assert!(matches!(r.error, Error::InvalidRequest(_)));
    assert_eq!(r.request.user_data, 1);
}

/// Run I/O into `fault` and check: the queue fails with an error of the
/// expected kind, no read completes with wrong data, and every request
/// that did not complete comes back from `take_unfinished`.
fn fault_case(fault: Fault, digests: bool, check: impl Fn(&Error) -> bool) {
    let t = FakeTarget::new(FakeConfig {
        fault: Some((fault, Trigger::NthIo(3))),
        ..FakeConfig::default()
    });
    let mut p = io_pair(&t, digests, 4);
    // Known content first, so a read completing with anything else is wrong data.
    for i in 0..3u64 {
        p.host
            .submit(p.now, write(i * 64, pattern(32768, i as u8), i))
            .unwrap();
    }
    p.pump();
    assert_eq!(p.completions().len(), 3);
    for i in 0..3u64 {
        p.host.submit(p.now, read(i * 64, 32768, 10 + i)).unwrap();
    }
    p.host
        .submit(p.now, write(1000, pattern(16384, 9), 20))
        .unwrap();
    p.pump();
    let mut guard = 0;
    while p.failed().is_none() && p.advance() {
        guard += 1;
        assert!(guard < 10, "no failure: {:?}", p.events);
    }
    let err = p
        .failed()
        .cloned()
        .unwrap_or_else(|| panic!("{fault:?}: no failure"));
    assert!(check(&err), "{fault:?}: unexpected error {err}");
    assert!(p.host.is_closed());
    let done = p.completions();
    for c in &done {
        if c.user_data >= 10 && c.user_data < 20 {
            assert!(c.status.is_success());
            assert_eq!(
                c.buf.as_deref(),
                Some(&pattern(32768, (c.user_data - 10) as u8)[..])
            );
        }
    }
    let unfinished = p.host.take_unfinished();
    assert_eq!(done.len() + unfinished.len(), 4, "{fault:?}");
    // Closed queues take nothing and say nothing more.
    assert!(p.host.submit(p.now, read(0, 512, 99)).is_err());
    p.host.handle_bytes(p.now, &[0xFF; 64]);
    assert!(p.host.poll_event().is_none());
}

fn protocol(e: &Error) -> bool {
    matches!(e, Error::Protocol(_))
}

#[test]
fn bad_plen_resets() {
    fault_case(Fault::BadPlen, false, protocol);
}

#[test]
fn r2t_for_unknown_cid_resets() {
    fault_case(Fault::R2tUnknownCid, false, protocol);
}

#[test]
fn c2h_data_beyond_the_buffer_resets() {
    fault_case(Fault::C2HBeyondBuffer, false, protocol);
}

#[test]
fn c2h_data_gap_resets() {
    fault_case(Fault::C2HGap, false, protocol);
}

#[test]
fn success_without_data_resets() {
    fault_case(Fault::EarlySuccess, false, protocol);
}

#[test]
fn data_digest_mismatch_resets() {
    fault_case(Fault::DataDigestMismatch, true, protocol);
}

#[test]
fn header_digest_mismatch_resets() {
    fault_case(Fault::HeaderDigestMismatch, true, protocol);
}

#[test]
fn term_req_resets() {
    fault_case(Fault::TermReq, false, |e| {
        matches!(e, Error::TargetTerminated { .. })
    });
}

#[test]
fn stale_completion_resets() {
    fault_case(Fault::StaleCompletion, false, protocol);
}

#[test]
fn silence_times_out() {
    fault_case(Fault::Silence, false, |e| {
        matches!(e, Error::CommandTimeout(_))
    });
}

#[test]
fn term_req_is_sent_for_a_violation() {
    let t = FakeTarget::new(FakeConfig {
        fault: Some((Fault::R2tUnknownCid, Trigger::NthIo(0))),
        ..FakeConfig::default()
    });
    let mut p = io_pair(&t, false, 4);
    p.host
        .submit(p.now, write(0, pattern(16384, 1), 1))
        .unwrap();
    let mut buf = Vec::new();
    p.host.poll_transmit(&mut buf, 1 << 20);
    p.target.handle_bytes(&buf);
    let back = p.target.take_output();
    p.host.handle_bytes(p.now, &back);
    buf.clear();
    p.host.poll_transmit(&mut buf, 1 << 20);
    assert_eq!(buf[0], nvmf_proto::pdu::pdu_type::H2C_TERM_REQ);
    assert_eq!(
        u16::from_le_bytes([buf[8], buf[9]]),
        2,
        "FES: PDU sequence error"
    );
}

#[test]
fn keep_alive_is_sent_and_silence_times_out() {
    let t = FakeTarget::new(FakeConfig {
        fault: Some((Fault::Silence, Trigger::KeepAlive)),
        ..FakeConfig::default()
    });
    let now = Instant::now();
    let mut p = Pair::new(&t, admin_cfg(&t, false), now);
    p.pump();
    assert!(p.host.is_live());
    p.host
        .start_keep_alive(p.now, Duration::from_millis(2500), Duration::from_secs(5));
    let mut steps = 0;
    while p.failed().is_none() {
        assert!(p.advance(), "no timeout pending");
        steps += 1;
        assert!(steps < 10);
    }
    assert!(matches!(p.failed(), Some(Error::KeepAliveTimeout(_))));
    assert_eq!(p.host.stats().keep_alives, 1);
}

#[test]
fn keep_alive_keeps_an_idle_queue_up() {
    let t = FakeTarget::new(FakeConfig::default());
    let now = Instant::now();
    let mut p = Pair::new(&t, admin_cfg(&t, false), now);
    p.pump();
    p.host
        .start_keep_alive(p.now, Duration::from_millis(2500), Duration::from_secs(5));
    for _ in 0..20 {
        assert!(p.advance());
    }
    assert!(p.failed().is_none());
    assert!(p.host.stats().keep_alives >= 10);
}

#[test]
fn connect_refusals_say_why() {
    let t = FakeTarget::new(FakeConfig {
        allowed_hosts: Some(vec!["nqn.other".into()]),
        ..FakeConfig::default()
    });
    let mut p = Pair::new(&t, admin_cfg(&t, false), Instant::now());
    p.pump();
    assert!(matches!(
        p.failed(),
        Some(Error::ConnectRefused(ConnectRefusal::HostNotAllowed))
    ));
    let mut cfg = admin_cfg(&t, false);
    cfg.subnqn = "nqn.nope".into();
    let mut p = Pair::new(&t, cfg, Instant::now());
    p.pump();
    assert!(matches!(
        p.failed(),
        Some(Error::ConnectRefused(ConnectRefusal::UnknownSubsystem))
    ));
}

#[test]
fn no_answer_to_icreq_times_out() {
    let t = FakeTarget::new(FakeConfig::default());
    let mut q: Queue<Vec<u8>> = Queue::new(admin_cfg(&t, false), Instant::now());
    let mut buf = Vec::new();
    q.poll_transmit(&mut buf, 4096);
    let t1 = q.poll_timeout().unwrap();
    q.handle_timeout(t1);
    assert!(matches!(
        q.poll_event(),
        Some(Event::Failed(Error::ConnectTimeout(_)))
    ));
}

/// A one-line summary of an event, to compare runs.
fn summary(e: &Event<Vec<u8>>) -> String {
    match e {
        Event::Connected { cntlid } => format!("connected {cntlid}"),
        Event::Completed(c) => format!(
            "done {} {} {:#x} {:#x} {:?}",
            c.user_data,
            c.status,
            c.dw0,
            c.dw1,
            c.buf.as_ref().map(|b| nvmf_proto::pdu::crc32c(b))
        ),
        Event::Failed(err) => format!("failed {err}"),
    }
}

/// Submit a fixed workload up front, so command IDs are the same in every
/// run; then feed `stream` (the target's bytes) in pieces from `split`.
fn replay(
    t: &Arc<FakeTarget>,
    digests: bool,
    stream: &[u8],
    mut split: impl FnMut(usize) -> usize,
) -> Vec<String> {
    let now = Instant::now();
    let mut cfg = admin_cfg(t, digests);
    cfg.max_transfer_bytes = 32768;
    cfg.in_capsule_bytes = 8192;
    let mut q: Queue<Vec<u8>> = Queue::new(cfg, now);
    workload(&mut q, now);
    let mut events = Vec::new();
    let mut sink = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let n = split(rest.len()).clamp(1, rest.len());
        q.handle_bytes(now, &rest[..n]);
        rest = &rest[n..];
        sink.clear();
        while q.poll_transmit(&mut sink, 1 << 20) > 0 {}
        while let Some(e) = q.poll_event() {
            events.push(summary(&e));
        }
    }
    events
}

fn workload(q: &mut Queue<Vec<u8>>, now: Instant) {
    // The admin queue accepts I/O commands in this fake target only through
    // Raw; use admin commands with data in both directions instead.
    use nvmf_proto::command::{cns, Identify};
    for (i, c) in [cns::CONTROLLER, cns::NAMESPACE, cns::ACTIVE_NAMESPACE_LIST]
        .into_iter()
        .enumerate()
    {
        let nsid = if c == cns::NAMESPACE { 1 } else { 0 };
        q.submit(
            now,
            Request {
                command: Command::Raw(Identify::new(c, nsid).to_sqe(0)),
                buf: Some(vec![0; 4096]),
                user_data: i as u64,
            },
        )
        .unwrap();
    }
    let glp = nvmf_proto::command::GetLogPage::new(0x70, 0, 3072, 0).unwrap();
    q.submit(
        now,
        Request {
            command: Command::Raw(glp.to_sqe(0)),
            buf: Some(vec![0; 3072]),
            user_data: 9,
        },
    )
    .unwrap();
}

fn capture(t: &Arc<FakeTarget>, digests: bool) -> Vec<u8> {
    let now = Instant::now();
    let mut cfg = admin_cfg(t, digests);
    cfg.max_transfer_bytes = 32768;
    cfg.in_capsule_bytes = 8192;
    let mut p = Pair::new(t, cfg, now);
    workload(&mut p.host, now);
    p.pump();
    assert_eq!(p.completions().len(), 4, "{:?}", p.events);
    p.from_target
}

#[test]
fn every_split_of_the_byte_stream_gives_the_same_events() {
    for digests in [false, true] {
        let t = FakeTarget::new(FakeConfig {
            c2h_chunk: 1024,
            ..FakeConfig::default()
        });
        let stream = capture(&t, digests);
        let whole = replay(&t, digests, &stream, |n| n);
        assert_eq!(whole.len(), 5, "{whole:?}");
        for size in [
            1usize, 2, 3, 7, 8, 9, 23, 24, 25, 64, 100, 1023, 1024, 1025, 4099,
        ] {
            assert_eq!(
                replay(&t, digests, &stream, |_| size),
                whole,
                "chunk {size}"
            );
        }
        // Pseudo-random splits (fixed seed; xorshift, no dependency).
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20 {
            let got = replay(&t, digests, &stream, |_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 300) as usize + 1
            });
            assert_eq!(got, whole);
        }
    }
}

#[test]
fn every_split_of_a_malformed_stream_gives_the_same_failure() {
    // The captured stream with one byte of the last PDU's header changed:
    // whatever the split, the same error and the same events before it.
    let t = FakeTarget::new(FakeConfig::default());
    let mut stream = capture(&t, false);
    let n = stream.len();
    stream[n - 24 + 2] = 0x77; // HLEN of the final CapsuleResp (24 bytes)
    let whole = replay(&t, false, &stream, |n| n);
    assert!(whole.last().unwrap().starts_with("failed"), "{whole:?}");
    for size in 1..=40 {
        assert_eq!(replay(&t, false, &stream, |_| size), whole, "chunk {size}");
    }
}
