//! A bounded, deterministic stand-in for the cargo-fuzz target, so CI
//! exercises the decoder with hostile input on every run: 20,000 inputs,
//! random and mutated-valid, through every decoder configuration and every
//! structure parser. Asserts no panic and that `consumed` never exceeds the
//! input. The shared driver lives in `fuzz_support.rs`, which the cargo-fuzz
//! target includes too.

#[path = "../../fuzz/fuzz_support.rs"]
mod fuzz_support;

use std::borrow::Cow;
use std::time::Instant;

use nvmf_proto::{
    C2HData, CapsuleCmd, CapsuleResp, Cqe, EncodeConfig, FatalErrorStatus, H2CData, IcReq, IcResp,
    IoCommand, Pdu, TermReq, R2T,
};

/// xorshift64*: tiny, deterministic, good enough to spray bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Valid PDUs of every type, encoded with several link settings: the seeds
/// that mutation starts from.
fn seeds() -> Vec<Vec<u8>> {
    let pdus: Vec<Pdu<'static>> = vec![
        Pdu::IcReq(IcReq {
            hpda: 1,
            header_digest: true,
            data_digest: true,
            maxr2t: 0,
        }),
        Pdu::IcResp(IcResp {
            cpda: 0,
            header_digest: true,
            data_digest: false,
            maxh2cdata: 0x2_0000,
        }),
        Pdu::H2CTermReq(TermReq {
            fes: FatalErrorStatus::INVALID_HEADER_FIELD,
            fei: 2,
            data: Cow::Owned(vec![4, 0, 71, 0, 72, 0, 0, 0]),
        }),
        Pdu::C2HTermReq(TermReq {
            fes: FatalErrorStatus::DATA_TRANSFER_LIMIT_EXCEEDED,
            fei: 0,
            data: Cow::Borrowed(&[]),
        }),
        Pdu::CapsuleCmd(CapsuleCmd::new(
            IoCommand::read(1, 0, 8, 4096).unwrap().to_sqe(1),
        )),
        Pdu::CapsuleCmd(
            CapsuleCmd::with_data(
                IoCommand::write(1, 0, 1, nvmf_proto::SglDescriptor::transport(0))
                    .unwrap()
                    .to_sqe(2),
                vec![0x11; 64],
            )
            .unwrap(),
        ),
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::success(1),
        }),
        Pdu::H2CData(H2CData {
            cccid: 2,
            ttag: 1,
            datao: 0,
            last: true,
            data: Cow::Owned(vec![0x22; 40]),
        }),
        Pdu::C2HData(C2HData {
            cccid: 1,
            datao: 0,
            last: true,
            success: true,
            data: Cow::Owned(vec![0x33; 40]),
        }),
        Pdu::R2T(R2T {
            cccid: 2,
            ttag: 1,
            r2to: 0,
            r2tl: 4096,
        }),
    ];
    let mut out = Vec::new();
    for (h, d, pda) in [(false, false, 0), (true, true, 0), (true, false, 1)] {
        let enc = EncodeConfig {
            header_digest: h,
            data_digest: d,
            tx_pda: pda,
        };
        for p in &pdus {
            out.push(p.to_vec(&enc).unwrap());
        }
    }
    out
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    // Start from one or two seeds back to back.
    let mut v = seeds[rng.below(seeds.len())].clone();
    if rng.below(3) == 0 {
        v.extend_from_slice(&seeds[rng.below(seeds.len())]);
    }
    for _ in 0..1 + rng.below(4) {
        let len = v.len().max(1);
        match rng.below(7) {
            0 => {
                // Flip a bit, biased towards the 8-byte common header.
                let i = if rng.below(2) == 0 {
                    rng.below(8)
                } else {
                    rng.below(len)
                };
                if let Some(b) = v.get_mut(i) {
                    *b ^= 1 << rng.below(8);
                }
            }
            1 => {
                let i = rng.below(len);
                if let Some(b) = v.get_mut(i) {
                    *b = rng.byte();
                }
            }
            2 => v.truncate(rng.below(len)),
            3 => {
                let i = rng.below(len + 1).min(v.len());
                v.insert(i, rng.byte());
            }
            4 => {
                // Interesting lengths into PLEN.
                let plen = [0u32, 7, 8, 23, 24, 127, 128, 152, 153, 0xFFFF_FFFF][rng.below(10)];
                if v.len() >= 8 {
                    v[4..8].copy_from_slice(&plen.to_le_bytes());
                }
            }
            5 => {
                // Interesting HLEN / PDO.
                if v.len() >= 4 {
                    let i = 2 + rng.below(2);
                    v[i] = [0u8, 8, 24, 28, 72, 76, 128, 255][rng.below(8)];
                }
            }
            _ => {
                // Flags.
                if v.len() >= 2 {
                    v[1] = rng.byte() & 0x1F;
                }
            }
        }
    }
    v
}

#[test]
fn twenty_thousand_hostile_inputs() {
    let started = Instant::now();
    let seeds = seeds();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut pdus_seen = 0usize;
    for i in 0..20_000 {
        let input = if i % 2 == 0 {
            let len = rng.below(400);
            let mut v: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
            // Plausible common headers get past the first checks more often.
            if v.len() >= 4 && rng.below(2) == 0 {
                v[0] = rng.below(10) as u8;
                v[2] = [24u8, 72, 128][rng.below(3)];
            }
            v
        } else {
            mutate(&mut rng, &seeds)
        };
        pdus_seen += fuzz_support::exercise(&input);
    }
    assert!(
        pdus_seen > 1000,
        "mutations should still decode often: {pdus_seen}"
    );
    eprintln!(
        "20000 inputs, {pdus_seen} PDUs decoded, {:?}",
        started.elapsed()
    );
}

/// The authentication half of the fuzz driver, with seeds it can get
/// somewhere from: every message of two real transactions (null group and
/// ffdhe2048), mutated, and controller scripts (Negotiate, Receive, Reply
/// records around mutated bytes). Asserts no panic, that the controller
/// only ever returns well-formed messages within AL, and that the host
/// only ever sends well-formed ones (inside `exercise_auth`).
#[test]
fn five_thousand_hostile_auth_inputs() {
    let started = Instant::now();
    let seeds = fuzz_support::auth_transcripts();
    assert!(seeds.len() >= 10, "two full transactions");
    for s in &seeds {
        assert!(fuzz_support::exercise_auth(s) == 1, "every seed decodes");
    }
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut decoded = 0usize;
    for i in 0..5_000 {
        let input = if i % 2 == 0 {
            mutate(&mut rng, &seeds)
        } else {
            // [group selector] then records [op, len, bytes...].
            let mut v = vec![if rng.below(4) == 0 { 0xD7 } else { 1 }];
            for _ in 0..1 + rng.below(6) {
                let op = rng.below(4) as u8;
                let chunk: Vec<u8> = match op {
                    1 => vec![0x00, [0x10u8, 0x01, 0x00][rng.below(3)]],
                    _ => {
                        let m = mutate(&mut rng, &seeds);
                        m[..m.len().min(255)].to_vec()
                    }
                };
                v.push(op);
                v.push(chunk.len() as u8);
                v.extend(chunk);
            }
            v
        };
        decoded += fuzz_support::exercise_auth(&input);
    }
    assert!(
        decoded > 500,
        "mutations should still decode often: {decoded}"
    );
    eprintln!(
        "5000 auth inputs, {decoded} messages decoded, {:?}",
        started.elapsed()
    );
}
