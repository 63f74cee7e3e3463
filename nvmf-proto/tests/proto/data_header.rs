//! `PduDecoder::decode_data_header`: a data PDU's header before its data.
//! A receiver that takes data PDUs by their header and puts the data
//! elsewhere sees the same PDUs as `decode` for any split of the stream,
//! and every bad header gives the error `decode` gives.

use std::borrow::Cow;

use proptest::prelude::*;

use nvmf_proto::pdu::{crc32c_append, pdu_flags, pdu_type};
use nvmf_proto::raw::RawPdu;
use nvmf_proto::{
    C2HData, CapsuleResp, Cqe, DataHeader, DataHeaderDecoded, Decoded, DecoderConfig, EncodeConfig,
    H2CData, Pdu, PduDecoder, ProtoError, Role, R2T,
};

use crate::common::cfg;
use crate::roundtrip::{arb_c2h_pdu, arb_h2c_pdu};
use crate::split::{controller_stream, encode_all, host_stream, links};

/// Where an in-place receiver is between two calls.
enum Rx {
    /// Gathering the next PDU's header (or a whole non-data PDU) in `buf`.
    Head,
    /// Receiving a data PDU's data into its own vector, then its digest.
    Data {
        h: DataHeader,
        data: Vec<u8>,
        crc: u32,
        digest: Vec<u8>,
    },
}

/// Decode `stream`, fed in `chunks` (cycled), as a receiver that puts data
/// in place does: data PDUs by `decode_data_header`, their data appended
/// to a vector of its own (never to the reassembly buffer) and its digest
/// checked with a running CRC; every other PDU by `decode`. The reassembly
/// buffer only ever takes the bytes the decoder asked for.
fn receive_in_place(
    cfg: DecoderConfig,
    stream: &[u8],
    chunks: &[usize],
) -> Result<Vec<Pdu<'static>>, ProtoError> {
    let dec = PduDecoder::new(cfg);
    let mut buf: Vec<u8> = Vec::new();
    let mut rx = Rx::Head;
    let mut out = Vec::new();
    let mut fed = 0;
    let mut sizes = chunks.iter().copied().cycle();
    while fed < stream.len() {
        let n = sizes.next().unwrap_or(1).max(1).min(stream.len() - fed);
        let mut input = &stream[fed..fed + n];
        fed += n;
        loop {
            match &mut rx {
                Rx::Data {
                    h,
                    data,
                    crc,
                    digest,
                } => {
                    let want = h.datal as usize - data.len();
                    let take = want.min(input.len());
                    data.extend_from_slice(&input[..take]);
                    *crc = crc32c_append(*crc, &input[..take]);
                    input = &input[take..];
                    if data.len() < h.datal as usize {
                        break;
                    }
                    let take = (h.trailer_len() - digest.len()).min(input.len());
                    digest.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if digest.len() < h.trailer_len() {
                        break;
                    }
                    if h.data_digest {
                        let received = u32::from_le_bytes(digest[..].try_into().unwrap());
                        h.check_data_digest(*crc, received)?;
                    }
                    out.push(rebuild(h, std::mem::take(data)));
                    rx = Rx::Head;
                }
                Rx::Head => match dec.decode_data_header(&buf)? {
                    DataHeaderDecoded::NeedMore(more) => {
                        assert!(more > 0);
                        if input.is_empty() {
                            break;
                        }
                        let take = more.min(input.len());
                        buf.extend_from_slice(&input[..take]);
                        input = &input[take..];
                    }
                    DataHeaderDecoded::Header(h) => {
                        assert_eq!(buf.len(), h.data_offset, "took more than the header");
                        assert_eq!(h.plen, h.data_offset + h.datal as usize + h.trailer_len());
                        buf.clear();
                        rx = Rx::Data {
                            h,
                            data: Vec::new(),
                            crc: 0,
                            digest: Vec::new(),
                        };
                    }
                    DataHeaderDecoded::NotData => match dec.decode(&buf)? {
                        Decoded::NeedMore(more) => {
                            if input.is_empty() {
                                break;
                            }
                            let take = more.min(input.len());
                            buf.extend_from_slice(&input[..take]);
                            input = &input[take..];
                        }
                        Decoded::Pdu { pdu, consumed } => {
                            assert_eq!(consumed, buf.len());
                            out.push(pdu.into_owned());
                            buf.clear();
                        }
                    },
                },
            }
        }
    }
    assert!(buf.is_empty(), "bytes left over");
    assert!(matches!(rx, Rx::Head), "stream ended inside a data PDU");
    Ok(out)
}

/// The PDU `decode` would have returned for this header and data.
fn rebuild(h: &DataHeader, data: Vec<u8>) -> Pdu<'static> {
    if h.pdu_type == pdu_type::H2C_DATA {
        Pdu::H2CData(H2CData {
            cccid: h.cccid,
            ttag: h.ttag,
            datao: h.datao,
            last: h.last,
            data: Cow::Owned(data),
        })
    } else {
        Pdu::C2HData(C2HData {
            cccid: h.cccid,
            datao: h.datao,
            last: h.last,
            success: h.success,
            data: Cow::Owned(data),
        })
    }
}

fn configs(role: Role) -> Vec<(EncodeConfig, DecoderConfig)> {
    links()
        .into_iter()
        .map(|(h, d, pda)| {
            (
                EncodeConfig {
                    header_digest: h,
                    data_digest: d,
                    tx_pda: pda,
                },
                DecoderConfig {
                    role,
                    header_digest: h,
                    data_digest: d,
                    rx_pda: pda,
                    max_data_len: 1 << 16,
                },
            )
        })
        .collect()
}

#[test]
fn every_chunk_size_yields_the_pdus_decode_yields() {
    for (role, pdus) in [
        (Role::Host, host_stream()),
        (Role::Controller, controller_stream()),
    ] {
        for (enc, cfg) in configs(role) {
            let stream = encode_all(&pdus, &enc);
            for size in 1..=stream.len() {
                assert_eq!(
                    receive_in_place(cfg, &stream, &[size]).unwrap(),
                    pdus,
                    "{role:?} {enc:?} chunk {size}"
                );
            }
        }
    }
}

#[test]
fn every_two_piece_split_yields_the_same_pdus() {
    for (role, pdus) in [
        (Role::Host, host_stream()),
        (Role::Controller, controller_stream()),
    ] {
        for (enc, cfg) in configs(role) {
            let stream = encode_all(&pdus, &enc);
            for cut in 1..stream.len() {
                assert_eq!(
                    receive_in_place(cfg, &stream, &[cut, stream.len()]).unwrap(),
                    pdus,
                    "{role:?} {enc:?} cut at {cut}"
                );
            }
        }
    }
}

#[test]
fn header_fields_and_layout_match_the_decoded_pdu() {
    let c2h = Pdu::C2HData(C2HData {
        cccid: 0x1234,
        datao: 4096,
        last: true,
        success: true,
        data: Cow::Owned((0..200u8).collect()),
    });
    let h2c = Pdu::H2CData(H2CData {
        cccid: 0x4321,
        ttag: 7,
        datao: 512,
        last: false,
        data: Cow::Owned(vec![0xA5; 300]),
    });
    for (role, pdu) in [(Role::Host, c2h), (Role::Controller, h2c)] {
        for (enc, cfg) in configs(role) {
            let bytes = pdu.to_vec(&enc).unwrap();
            let dec = PduDecoder::new(cfg);
            let mut header = None;
            // Every prefix: "need exactly n more" until the data starts,
            // then the header, whatever of the data is already there.
            for k in 0..=bytes.len() {
                match dec.decode_data_header(&bytes[..k]).unwrap() {
                    DataHeaderDecoded::NeedMore(n) => {
                        assert!(
                            header.is_none(),
                            "{enc:?}: NeedMore after the header at {k}"
                        );
                        assert!(n > 0);
                        let next = if k < 8 { 8 } else { bytes[3] as usize };
                        assert_eq!(k + n, next, "{enc:?} at {k}");
                    }
                    DataHeaderDecoded::Header(h) => {
                        assert_eq!(k.max(h.data_offset), k, "header before its end");
                        header.get_or_insert(h);
                        assert_eq!(header, Some(h));
                    }
                    DataHeaderDecoded::NotData => panic!("a data PDU"),
                }
            }
            let h = header.expect("header");
            assert_eq!(h.data_offset, bytes[3] as usize, "data starts at PDO");
            assert_eq!(h.plen, bytes.len());
            assert_eq!(h.data_digest, enc.data_digest);
            let data = &bytes[h.data_offset..h.data_offset + h.datal as usize];
            assert_eq!(rebuild(&h, data.to_vec()), pdu);
            if h.data_digest {
                let received = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
                assert_eq!(
                    h.check_data_digest(nvmf_proto::pdu::crc32c(data), received),
                    Ok(())
                );
            }
        }
    }
}

#[test]
fn other_pdu_types_are_not_data() {
    let others = [
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::success(3),
        }),
        Pdu::R2T(R2T {
            cccid: 1,
            ttag: 2,
            r2to: 0,
            r2tl: 512,
        }),
    ];
    for pdu in others {
        for (enc, cfg) in configs(Role::Host) {
            let bytes = pdu.to_vec(&enc).unwrap();
            let dec = PduDecoder::new(cfg);
            assert_eq!(
                dec.decode_data_header(&bytes[..7]).unwrap(),
                DataHeaderDecoded::NeedMore(1)
            );
            for k in 8..=bytes.len() {
                assert_eq!(
                    dec.decode_data_header(&bytes[..k]).unwrap(),
                    DataHeaderDecoded::NotData
                );
            }
        }
    }
}

/// Data PDUs broken in one field each, with the configuration they are
/// received under.
fn bad_data_pdus() -> Vec<(&'static str, DecoderConfig, Vec<u8>)> {
    let c2h = |len: usize| {
        Pdu::C2HData(C2HData {
            cccid: 9,
            datao: 0,
            last: true,
            success: false,
            data: Cow::Owned(vec![0x42; len]),
        })
    };
    let h2c = Pdu::H2CData(H2CData {
        cccid: 9,
        ttag: 3,
        datao: 0,
        last: true,
        data: Cow::Owned(vec![0x42; 64]),
    });
    let plain = EncodeConfig::default();
    let digests = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 0,
    };
    let host = cfg(Role::Host, false, false, 0);
    let host_dg = cfg(Role::Host, true, true, 0);
    let raw = |pdu: &Pdu<'_>, enc: &EncodeConfig| RawPdu::encode(pdu, enc).unwrap();
    let mut small = host;
    small.max_data_len = 32;
    vec![
        (
            "unknown type",
            host,
            raw(&c2h(64), &plain).set_pdu_type(0x0F).into_bytes(),
        ),
        ("H2CData to a host", host, raw(&h2c, &plain).into_bytes()),
        (
            "C2HData to a controller",
            cfg(Role::Controller, false, false, 0),
            raw(&c2h(64), &plain).into_bytes(),
        ),
        (
            "undefined flag",
            host,
            raw(&c2h(64), &plain)
                .set_flags(pdu_flags::LAST_PDU | 0x10)
                .into_bytes(),
        ),
        (
            "SUCCESS without LAST_PDU",
            host,
            raw(&c2h(64), &plain)
                .set_flags(pdu_flags::SUCCESS)
                .into_bytes(),
        ),
        (
            "HDGSTF without header digests",
            host_dg,
            raw(&c2h(64), &plain).into_bytes(),
        ),
        (
            "DDGSTF not negotiated",
            host,
            raw(
                &c2h(64),
                &EncodeConfig {
                    data_digest: true,
                    ..plain
                },
            )
            .into_bytes(),
        ),
        (
            "bad HLEN",
            host,
            raw(&c2h(64), &plain).set_hlen(28).into_bytes(),
        ),
        (
            "PDO inside the header",
            host,
            raw(&c2h(64), &plain).set_pdo(16).into_bytes(),
        ),
        (
            "PDO inside the header digest",
            host_dg,
            raw(&c2h(64), &digests)
                .set_pdo(24)
                .refresh_header_digest()
                .into_bytes(),
        ),
        (
            "PDO not aligned",
            cfg(Role::Host, false, false, 3),
            raw(&c2h(64), &plain).into_bytes(),
        ),
        (
            "PLEN below HLEN",
            host,
            raw(&c2h(64), &plain).set_plen(20).into_bytes(),
        ),
        (
            "PLEN without data",
            host,
            raw(&c2h(64), &plain).set_plen(24).into_bytes(),
        ),
        (
            "data over the limit",
            small,
            raw(&c2h(64), &plain).into_bytes(),
        ),
        (
            "DATAL not PLEN - PDO",
            host,
            raw(&c2h(64), &plain).set_u32(16, 63).into_bytes(),
        ),
        (
            "DATAL wrong under a valid header digest",
            host_dg,
            raw(&c2h(64), &digests)
                .set_u32(16, 65)
                .refresh_header_digest()
                .into_bytes(),
        ),
        (
            "header digest corrupted",
            host_dg,
            raw(&c2h(64), &digests).corrupt_header_digest().into_bytes(),
        ),
        (
            "header digest corrupted, DATAL wrong too",
            host_dg,
            raw(&c2h(64), &digests).set_u32(16, 1).into_bytes(),
        ),
    ]
}

#[test]
fn bad_headers_give_the_errors_decode_gives() {
    for (what, cfg, bytes) in bad_data_pdus() {
        let dec = PduDecoder::new(cfg);
        let want = dec.decode(&bytes).expect_err(what);
        assert_eq!(dec.decode_data_header(&bytes).unwrap_err(), want, "{what}");
        // On any prefix: more needed, or already the same error, never
        // another one, and never a header.
        for k in 0..bytes.len() {
            match dec.decode_data_header(&bytes[..k]) {
                Ok(DataHeaderDecoded::NeedMore(_)) => {}
                Err(e) => assert_eq!(e, want, "{what} at {k}"),
                Ok(other) => panic!("{what} at {k}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_corrupted_data_digest_is_the_same_error() {
    let pdu = Pdu::C2HData(C2HData {
        cccid: 0x0203,
        datao: 0,
        last: false,
        success: false,
        data: Cow::Owned(vec![0x11; 100]),
    });
    let enc = EncodeConfig {
        header_digest: false,
        data_digest: true,
        tx_pda: 0,
    };
    let cfg = cfg(Role::Host, false, true, 0);
    let bytes = RawPdu::encode(&pdu, &enc)
        .unwrap()
        .corrupt_data_digest()
        .into_bytes();
    let want = PduDecoder::new(cfg).decode(&bytes).unwrap_err();
    assert!(matches!(want, ProtoError::DataDigestMismatch { .. }));
    for chunk in [1, 7, 24, 50, bytes.len()] {
        assert_eq!(
            receive_in_place(cfg, &bytes, &[chunk]).unwrap_err(),
            want,
            "chunk {chunk}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

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
            prop_assert_eq!(receive_in_place(cfg, &stream, &chunks).unwrap(), pdus);
        }
    }
}
