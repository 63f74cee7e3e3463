//! A bounded, deterministic stand-in for the cargo-fuzz target
//! `nvmf-initiator/fuzz` (`queue`), so CI feeds the sans-IO queue core a
//! hostile target on every run: a fixed set of seeded scripts, each checked
//! for panics, undecodable output, requests that do not come back exactly
//! once, buffers written outside their commands' data, and heap beyond the
//! queue's bounds. The driver lives in `fuzz/fuzz_support.rs`, which the
//! cargo-fuzz target includes too.
//!
//! Reproduce one script: `FUZZ_SEED=0x… cargo test -p nvmf-initiator --test
//! fuzz_queue` (the failure message prints the seed), or replay a libFuzzer
//! artifact with `FUZZ_INPUT=path`. `long_run` (ignored) runs random seeds
//! for `FUZZ_SECS` seconds: `tests/fuzz/run`.

#[path = "../fuzz/fuzz_support.rs"]
mod fuzz_support;

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use fuzz_support::script::{env_u64, seeded_script};
use fuzz_support::CaseStats;

/// Scripts per CI run.
const CASES: u64 = 1000;
const BASE_SEED: u64 = 0x9e0e_0000_0000_0000;

/// The script for `seed`: 16 to 800 bytes.
fn script(seed: u64) -> Vec<u8> {
    seeded_script(seed, 16, 785)
}

/// Runs one script; a violation or a panic fails with the command that
/// reproduces it.
fn run_one(seed: u64, input: &[u8]) -> CaseStats {
    let reproduce = format!("FUZZ_SEED={seed:#x} cargo test -p nvmf-initiator --test fuzz_queue");
    match std::panic::catch_unwind(AssertUnwindSafe(|| fuzz_support::run(input))) {
        Ok(Ok(stats)) => stats,
        Ok(Err(violation)) => panic!("script {seed:#x} ({reproduce}): {violation}"),
        Err(_) => panic!("script {seed:#x} panicked ({reproduce})"),
    }
}

fn report(what: &str, t: &CaseStats, took: Duration) {
    eprintln!(
        "{what}: {} scripts, {} steps, {} requests accepted ({} rejected), {} completed ok, \
         {} with an error status, {} handed back unfinished, {} connected, {} failed, \
         {} capsules, {} H2CData, {} C2HData, {} R2Ts, {} bytes in place, {} bytes through \
         handle_bytes, queue heap at most {} bytes, {:?}",
        t.cases,
        t.ops,
        t.accepted,
        t.rejected,
        t.completed_ok,
        t.completed_err,
        t.unfinished,
        t.connected,
        t.failed,
        t.capsules,
        t.h2c,
        t.c2h,
        t.r2ts,
        t.direct_bytes,
        t.bytes_delivered,
        t.queue_heap_max,
        took
    );
}

#[test]
fn a_thousand_hostile_targets() {
    let started = Instant::now();
    let mut total = CaseStats::default();
    if let Ok(path) = std::env::var("FUZZ_INPUT") {
        let input = std::fs::read(&path).expect("FUZZ_INPUT names a readable file");
        total.add(&run_one(0, &input));
        report(&path, &total, started.elapsed());
        return;
    }
    let seeds: Vec<u64> = match env_u64("FUZZ_SEED") {
        Some(seed) => vec![seed],
        None => (0..CASES).map(|i| BASE_SEED + i).collect(),
    };
    let single = seeds.len() == 1;
    for seed in seeds {
        total.add(&run_one(seed, &script(seed)));
    }
    report("fuzz_queue", &total, started.elapsed());
    if single {
        return;
    }
    // The scripts must reach I/O, not only the handshake.
    assert!(total.connected >= CASES / 2, "{total:?}");
    assert!(total.completed_ok >= CASES / 2, "{total:?}");
    assert!(total.unfinished >= CASES, "{total:?}");
    assert!(total.h2c >= CASES / 4, "{total:?}");
    assert!(total.c2h >= CASES, "{total:?}");
    assert!(total.direct_bytes > 0, "{total:?}");
}

/// `FUZZ_SECS` (default 60) of random scripts from seed `FUZZ_SEED`
/// (default: the clock), for `tests/fuzz/run`.
#[test]
#[ignore = "long run: tests/fuzz/run"]
fn long_run() {
    let secs = env_u64("FUZZ_SECS").unwrap_or(60);
    let base = env_u64("FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("fuzz_queue long run: FUZZ_SEED={base:#x} FUZZ_SECS={secs}");
    let started = Instant::now();
    let mut total = CaseStats::default();
    let mut i = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        let seed = base.wrapping_add(i);
        total.add(&run_one(seed, &script(seed)));
        i += 1;
    }
    report("fuzz_queue long run", &total, started.elapsed());
}

/// Found by this fuzzer: a Read/Write split at the transfer limit computed
/// each piece's LBA as `slba + offset / block_size` unchecked, so a range
/// past 2^64 panicked (debug) or wrapped to low LBAs (release). It is
/// refused at submit now.
#[test]
fn a_request_whose_lba_range_wraps_is_refused() {
    use nvmf_initiator::{Command, Error, Queue, QueueConfig, Request};
    let mut cfg = QueueConfig::admin("nqn.2026-01.io.fuzz:host", [9; 16], "nqn.x:s", 0);
    cfg.max_transfer_bytes = 4096;
    let now = Instant::now();
    let mut q: Queue<Vec<u8>> = Queue::new(cfg, now);
    for slba in [u64::MAX - 8, u64::MAX - 15] {
        let r = q
            .submit(
                now,
                Request {
                    command: Command::Read {
                        nsid: 1,
                        slba,
                        block_size: 512,
                    },
                    buf: Some(vec![0; 16 * 512]),
                    user_data: 1,
                },
            )
            .expect_err("a range past 2^64 is refused");
        assert!(matches!(r.error, Error::InvalidRequest(_)), "{:?}", r.error);
    }
    // The last block that exists is still fine.
    let ok = Request {
        command: Command::Write {
            nsid: 1,
            slba: u64::MAX - 16,
            block_size: 512,
            fua: false,
        },
        buf: Some(vec![0; 16 * 512]),
        user_data: 2,
    };
    assert!(q.submit(now, ok).is_ok());
}

/// Found by this fuzzer: with more than 32768 slots the CID has no bit
/// left for the slot generation, and `generation << 16` on a u16
/// overflowed (a panic on the first command in a debug build).
#[test]
fn a_queue_deeper_than_32768_issues_commands() {
    use nvmf_initiator::{Command, Event, Queue, QueueConfig, Request};
    for depth in [32768u16, 32769, 65535] {
        let cfg = QueueConfig::admin("nqn.2026-01.io.fuzz:host", [9; 16], "nqn.x:s", 0);
        let mut cfg = QueueConfig::io(&cfg, 1, 1, depth);
        cfg.depth = depth;
        let now = Instant::now();
        let mut q: Queue<Vec<u8>> = Queue::new(cfg, now);
        let flush = |user_data| Request {
            command: Command::Flush { nsid: 1 },
            buf: None,
            user_data,
        };
        q.submit(now, flush(1)).unwrap();
        // ICResp, then the Connect's completion (its CID is slot 0's).
        let mut wire = nvmf_proto::Pdu::IcResp(nvmf_proto::IcResp {
            cpda: 0,
            header_digest: false,
            data_digest: false,
            maxh2cdata: 8192,
        })
        .to_vec(&Default::default())
        .unwrap();
        q.handle_bytes(now, &wire);
        let mut sent = Vec::new();
        while q.poll_transmit(&mut sent, 1 << 20) > 0 {}
        let connect_cid = u16::from_le_bytes([sent[128 + 10], sent[128 + 11]]);
        wire = nvmf_proto::Pdu::CapsuleResp(nvmf_proto::CapsuleResp {
            cqe: nvmf_proto::Cqe::success(connect_cid).with_dw0(1),
        })
        .to_vec(&Default::default())
        .unwrap();
        q.handle_bytes(now, &wire);
        assert!(q.is_live(), "depth {depth}");
        sent.clear();
        while q.poll_transmit(&mut sent, 1 << 20) > 0 {}
        let flush_cid = u16::from_le_bytes([sent[10], sent[11]]);
        wire = nvmf_proto::Pdu::CapsuleResp(nvmf_proto::CapsuleResp {
            cqe: nvmf_proto::Cqe::success(flush_cid),
        })
        .to_vec(&Default::default())
        .unwrap();
        q.handle_bytes(now, &wire);
        let events: Vec<_> = std::iter::from_fn(|| q.poll_event()).collect();
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::Completed(c) if c.user_data == 1)),
            "depth {depth}: {events:?}"
        );
    }
}

/// Found by this fuzzer: H2CData queued for an R2T named its command by
/// slot only. When the target completed that command (say with an error)
/// in the same receive as the R2T, the slot went to the next request
/// before the H2CData was sent, which then went out with the new command's
/// CID and data, or, for a command without data, panicked slicing an empty
/// buffer. Data queued for a command that has completed is dropped now,
/// also when the slot's new command has the same CID (no generation bits
/// left above 32768 slots).
#[test]
fn data_solicited_for_a_command_that_completed_is_not_sent() {
    use nvmf_initiator::{Command, Event, Queue, QueueConfig, Request};
    use nvmf_proto::{
        CapsuleResp, Cqe, Decoded, DecoderConfig, Pdu, PduDecoder, Role, Status, R2T,
    };
    for (depth, next_has_data) in [(1, false), (1, true), (40000, false), (40000, true)] {
        let cfg = QueueConfig::admin("nqn.2026-01.io.fuzz:host", [9; 16], "nqn.x:s", 0);
        let mut cfg = QueueConfig::io(&cfg, 1, 1, depth);
        cfg.in_capsule_bytes = 0;
        let now = Instant::now();
        let mut q: Queue<Vec<u8>> = Queue::new(cfg, now);
        let write = |user_data, fill| Request {
            command: Command::Write {
                nsid: 1,
                slba: 0,
                block_size: 512,
                fua: false,
            },
            buf: Some(vec![fill; 8192]),
            user_data,
        };
        q.submit(now, write(1, 0x11)).unwrap();
        let second = if next_has_data {
            write(2, 0x22)
        } else {
            Request {
                command: Command::Flush { nsid: 1 },
                buf: None,
                user_data: 2,
            }
        };
        // One slot: the second request waits for it. Many: it takes the
        // slot the first one frees, after the R2T and completion below.
        let mut second = Some(second);
        if depth == 1 {
            q.submit(now, second.take().unwrap()).unwrap();
        }
        let dec = PduDecoder::new(DecoderConfig::new(Role::Controller));
        let mut sent = Vec::new();
        let mut take_capsule_cid = |q: &mut Queue<Vec<u8>>| {
            let mut out = Vec::new();
            while q.poll_transmit(&mut out, 1 << 20) > 0 {}
            sent.extend_from_slice(&out);
            let mut cids = Vec::new();
            let mut pos = 0;
            while let Ok(Decoded::Pdu { pdu, consumed }) = dec.decode(&sent[pos..]) {
                match pdu {
                    Pdu::CapsuleCmd(c) => cids.push((c.sqe.cid, None)),
                    Pdu::H2CData(d) => cids.push((d.cccid, Some(d.data.into_owned()))),
                    _ => {}
                }
                pos += consumed;
            }
            sent.drain(..pos);
            cids
        };
        take_capsule_cid(&mut q); // ICReq
        let target = nvmf_proto::EncodeConfig::default();
        let resp = Pdu::IcResp(nvmf_proto::IcResp {
            cpda: 0,
            header_digest: false,
            data_digest: false,
            maxh2cdata: 4096,
        });
        q.handle_bytes(now, &resp.to_vec(&target).unwrap());
        let connect = take_capsule_cid(&mut q)[0].0;
        let ok = Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::success(connect).with_dw0(1),
        });
        q.handle_bytes(now, &ok.to_vec(&target).unwrap());
        let first = take_capsule_cid(&mut q)[0].0;
        // R2T and an error completion for the first write, in one receive.
        let mut wire = Pdu::R2T(R2T {
            cccid: first,
            ttag: 9,
            r2to: 0,
            r2tl: 8192,
        })
        .to_vec(&target)
        .unwrap();
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::new(first, Status::INTERNAL_ERROR),
        })
        .encode(&target, &mut wire)
        .unwrap();
        q.handle_bytes(now, &wire);
        if let Some(second) = second {
            q.submit(now, second).unwrap();
        }
        let out = take_capsule_cid(&mut q);
        assert!(
            out.iter().all(|(_, data)| data.is_none()),
            "H2CData sent after its command completed: {out:?}"
        );
        assert_eq!(out.len(), 1, "the second request's capsule: {out:?}");
        let done: Vec<_> = std::iter::from_fn(|| q.poll_event())
            .filter_map(|e| match e {
                Event::Completed(c) => Some((c.user_data, c.status.is_success())),
                Event::Failed(e) => panic!("the queue failed: {e}"),
                Event::Connected { .. } => None,
            })
            .collect();
        assert_eq!(done, [(1, false)]);
    }
}
