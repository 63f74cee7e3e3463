//! Any split of an encoded byte stream into chunks, down to single bytes,
//! yields the same PDUs, with and without digests and padding.

use std::borrow::Cow;

use proptest::prelude::*;

use nvmf_proto::fabrics::{Connect, ConnectData, PriorityClass};
use nvmf_proto::{
    C2HData, CapsuleCmd, CapsuleResp, Cqe, Decoded, DecoderConfig, EncodeConfig, FatalErrorStatus,
    H2CData, IcReq, IcResp, IoCommand, Negotiated, Pdu, PduDecoder, PduReader, Role, SglDescriptor,
    Status, TermReq, R2T,
};

use crate::roundtrip::{arb_c2h_pdu, arb_h2c_pdu};

/// Feed `stream` to a caller-managed buffer in the given chunk sizes and
/// collect every PDU.
fn decode_chunked(cfg: DecoderConfig, stream: &[u8], chunks: &[usize]) -> Vec<Pdu<'static>> {
    let dec = PduDecoder::new(cfg);
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut fed = 0;
    let mut sizes = chunks.iter().copied().cycle();
    while fed < stream.len() {
        let n = sizes.next().unwrap_or(1).max(1).min(stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        loop {
            match dec.decode(&buf).expect("valid stream") {
                Decoded::NeedMore(more) => {
                    assert!(more > 0);
                    break;
                }
                Decoded::Pdu { pdu, consumed } => {
                    assert!(consumed <= buf.len());
                    out.push(pdu.into_owned());
                    buf.drain(..consumed);
                }
            }
        }
    }
    assert!(buf.is_empty(), "bytes left over");
    out
}

pub(crate) fn host_stream() -> Vec<Pdu<'static>> {
    vec![
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::success(1).with_sqhd(2).with_gimbal_credit(1000),
        }),
        Pdu::R2T(R2T {
            cccid: 2,
            ttag: 5,
            r2to: 0,
            r2tl: 8192,
        }),
        Pdu::C2HData(C2HData {
            cccid: 3,
            datao: 0,
            last: false,
            success: false,
            data: Cow::Owned((0..=255).collect()),
        }),
        Pdu::C2HData(C2HData {
            cccid: 3,
            datao: 256,
            last: true,
            success: true,
            data: Cow::Owned(vec![7; 33]),
        }),
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::new(4, Status::INVALID_FIELD.with_dnr()),
        }),
        Pdu::C2HTermReq(TermReq {
            fes: FatalErrorStatus::PDU_SEQUENCE_ERROR,
            fei: 0,
            data: Cow::Owned(vec![6, 0, 24, 24, 28, 0, 0, 0]),
        }),
    ]
}

pub(crate) fn controller_stream() -> Vec<Pdu<'static>> {
    let connect = ConnectData {
        host_id: [1; 16],
        cntlid: 0xFFFF,
        subnqn: "nqn.2024-01.io.example:a".into(),
        hostnqn: "nqn.2024-01.io.example:host".into(),
    };
    vec![
        Pdu::CapsuleCmd(
            CapsuleCmd::with_data(
                Connect::io(1, 32, PriorityClass::High).to_sqe(0),
                connect.to_bytes().unwrap().to_vec(),
            )
            .unwrap(),
        ),
        Pdu::CapsuleCmd(CapsuleCmd::new(
            IoCommand::read(1, 0, 8, 4096).unwrap().to_sqe(1),
        )),
        Pdu::CapsuleCmd(CapsuleCmd::new(
            IoCommand::write(1, 8, 2, SglDescriptor::transport(1024))
                .unwrap()
                .to_sqe(2),
        )),
        Pdu::H2CData(H2CData {
            cccid: 2,
            ttag: 5,
            datao: 0,
            last: true,
            data: Cow::Owned(vec![0xA5; 1024]),
        }),
        Pdu::H2CTermReq(TermReq {
            fes: FatalErrorStatus::HEADER_DIGEST_ERROR,
            fei: 0x1234_5678,
            data: Cow::Borrowed(&[]),
        }),
    ]
}

pub(crate) fn encode_all(pdus: &[Pdu<'_>], enc: &EncodeConfig) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pdus {
        p.encode(enc, &mut out).unwrap();
    }
    out
}

pub(crate) fn links() -> Vec<(bool, bool, u8)> {
    vec![
        (false, false, 0),
        (true, true, 0),
        (true, false, 3),
        (false, true, 31),
    ]
}

#[test]
fn every_uniform_chunk_size_yields_the_same_pdus() {
    for (role, pdus) in [
        (Role::Host, host_stream()),
        (Role::Controller, controller_stream()),
    ] {
        for (h, d, pda) in links() {
            let enc = EncodeConfig {
                header_digest: h,
                data_digest: d,
                tx_pda: pda,
            };
            let cfg = DecoderConfig {
                role,
                header_digest: h,
                data_digest: d,
                rx_pda: pda,
                max_data_len: 1 << 16,
            };
            let stream = encode_all(&pdus, &enc);
            for size in 1..=stream.len().min(300) {
                assert_eq!(decode_chunked(cfg, &stream, &[size]), pdus, "chunk {size}");
            }
            assert_eq!(decode_chunked(cfg, &stream, &[stream.len()]), pdus);
        }
    }
}

#[test]
fn every_two_piece_split_yields_the_same_pdus() {
    let pdus = host_stream();
    let enc = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 1,
    };
    let cfg = DecoderConfig {
        role: Role::Host,
        header_digest: true,
        data_digest: true,
        rx_pda: 1,
        max_data_len: 1 << 16,
    };
    let stream = encode_all(&pdus, &enc);
    for cut in 0..=stream.len() {
        let got = decode_chunked(cfg, &stream, &[cut.max(1), stream.len()]);
        assert_eq!(got, pdus, "cut at {cut}");
    }
}

#[test]
fn reader_switches_digests_on_after_the_ic_exchange() {
    // The host's ICReq and its first capsule arrive in one buffer; the
    // capsule already carries digests. One byte at a time.
    let req = IcReq {
        hpda: 0,
        header_digest: true,
        data_digest: true,
        maxr2t: 0,
    };
    let resp = IcResp {
        cpda: 2,
        header_digest: true,
        data_digest: true,
        maxh2cdata: 8192,
    };
    let link = Negotiated::new(&req, &resp).unwrap();
    let capsule = Pdu::CapsuleCmd(
        CapsuleCmd::with_data(
            IoCommand::write(1, 0, 1, SglDescriptor::transport(0))
                .unwrap()
                .to_sqe(9),
            vec![0x3C; 512],
        )
        .unwrap(),
    );
    let mut stream = Pdu::IcReq(req).to_vec(&EncodeConfig::default()).unwrap();
    capsule
        .encode(&link.encode_config(Role::Host), &mut stream)
        .unwrap();
    assert_eq!(
        stream[128 + 3],
        84,
        "PDO: 76 rounded up to CPDA 2 (12-byte units)"
    );

    let mut reader = PduReader::new(DecoderConfig::new(Role::Controller));
    let mut got = Vec::new();
    for b in &stream {
        reader.push_bytes(std::slice::from_ref(b));
        while let Some(pdu) = reader.next_pdu().unwrap() {
            let pdu = pdu.into_owned();
            if let Pdu::IcReq(r) = &pdu {
                let n = Negotiated::new(r, &resp).unwrap();
                reader
                    .decoder_mut()
                    .set_config(n.decoder_config(Role::Controller, 1 << 16));
            }
            got.push(pdu);
        }
    }
    assert_eq!(got, vec![Pdu::IcReq(req), capsule]);
    assert!(reader.buffered().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_and_random_chunking(
        host in prop::collection::vec(arb_c2h_pdu(), 1..6),
        ctrl in prop::collection::vec(arb_h2c_pdu(), 1..6),
        chunks in prop::collection::vec(1usize..64, 1..8),
        (h, d, pda) in (any::<bool>(), any::<bool>(), 0u8..=31),
    ) {
        let enc = EncodeConfig { header_digest: h, data_digest: d, tx_pda: pda };
        for (role, pdus) in [(Role::Host, host), (Role::Controller, ctrl)] {
            let cfg = DecoderConfig {
                role, header_digest: h, data_digest: d, rx_pda: pda, max_data_len: 1 << 16,
            };
            let stream = encode_all(&pdus, &enc);
            prop_assert_eq!(decode_chunked(cfg, &stream, &chunks), pdus);
        }
    }
}
