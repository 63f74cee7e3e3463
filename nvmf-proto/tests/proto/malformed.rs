//! One test per malformed-input class: each checks the error names the
//! right field and maps to the right TermReq (or none).

use std::borrow::Cow;

use nvmf_proto::pdu::pdu_type;
use nvmf_proto::{
    C2HData, CapsuleCmd, Decoded, EncodeConfig, ErrorAction, FatalErrorStatus, H2CData, IcReq,
    IoCommand, Pdu, PduDecoder, ProtoError, Role, SglDescriptor, TermReq, Termination,
};

use crate::common::{cfg, hex};

fn decode_err(role: Role, bytes: &[u8]) -> ProtoError {
    decode_err_cfg(cfg(role, false, false, 0), bytes)
}

fn decode_err_cfg(c: nvmf_proto::DecoderConfig, bytes: &[u8]) -> ProtoError {
    match PduDecoder::new(c).decode(bytes) {
        Err(e) => e,
        Ok(other) => panic!("expected an error, got {other:?}"),
    }
}

fn assert_header_field(e: &ProtoError, want_field: &str, want_fei: u32) {
    match e {
        ProtoError::InvalidHeaderField { field, fei, .. } => {
            assert_eq!((*field, *fei), (want_field, want_fei), "{e}");
        }
        other => panic!("expected InvalidHeaderField {want_field}, got {other:?}"),
    }
    assert_eq!(
        e.termination(),
        Some(Termination {
            fes: FatalErrorStatus::INVALID_HEADER_FIELD,
            fei: want_fei
        })
    );
}

fn h2c_data(len: usize) -> Vec<u8> {
    Pdu::H2CData(H2CData {
        cccid: 1,
        ttag: 1,
        datao: 0,
        last: true,
        data: Cow::Owned(vec![0x5A; len]),
    })
    .to_vec(&EncodeConfig::default())
    .unwrap()
}

#[test]
fn bad_hlen_for_type() {
    let mut b = h2c_data(8);
    b[2] = 25;
    assert_header_field(&decode_err(Role::Controller, &b), "HLEN", 2);
    // A CapsuleCmd must have HLEN 72.
    let mut c = hex("04 00 47 00 47 00 00 00");
    c.resize(0x47, 0);
    assert_header_field(&decode_err(Role::Controller, &c), "HLEN", 2);
}

#[test]
fn plen_smaller_than_hlen() {
    let b = hex("09 00 18 00 10 00 00 00"); // R2T, HLEN 24, PLEN 16
    assert_header_field(&decode_err(Role::Host, &b), "PLEN", 4);
    let b = hex("05 00 18 00 00 00 00 00"); // CapsuleResp, PLEN 0
    assert_header_field(&decode_err(Role::Host, &b), "PLEN", 4);
}

#[test]
fn plen_over_the_maximum_is_rejected_from_the_common_header() {
    // H2CData claiming 2 MiB of data; only the 8-byte common header is given,
    // so the decoder must decide without waiting for (or buffering) the body.
    let plen: u32 = 24 + (2 << 20);
    let mut b = hex("06 04 18 18");
    b.extend_from_slice(&plen.to_le_bytes());
    let e = decode_err(Role::Controller, &b);
    assert!(matches!(e, ProtoError::DataLimitExceeded { .. }), "{e:?}");
    assert_eq!(
        e.termination(),
        Some(Termination {
            fes: FatalErrorStatus::DATA_TRANSFER_LIMIT_EXCEEDED,
            fei: 0
        })
    );
    // PLEN = u32::MAX on a capsule: same, no overflow.
    let b = hex("04 00 48 48 FF FF FF FF");
    assert!(matches!(
        decode_err(Role::Controller, &b),
        ProtoError::DataLimitExceeded { .. }
    ));
}

#[test]
fn pdo_inside_the_header() {
    let mut b = h2c_data(8);
    b[3] = 16;
    assert_header_field(&decode_err(Role::Controller, &b), "PDO", 3);
    // With header digests on, PDO 24 points at the digest.
    let mut c = cfg(Role::Controller, true, false, 0);
    c.header_digest = true;
    let enc = EncodeConfig {
        header_digest: true,
        ..Default::default()
    };
    let mut b = Pdu::H2CData(H2CData {
        cccid: 1,
        ttag: 1,
        datao: 0,
        last: true,
        data: Cow::Owned(vec![1; 8]),
    })
    .to_vec(&enc)
    .unwrap();
    b[3] = 24;
    assert_header_field(&decode_err_cfg(c, &b), "PDO", 3);
}

#[test]
fn pdo_not_aligned_to_our_pda() {
    let b = h2c_data(8); // PDO 24, but we advertised CPDA 1 (8 bytes): 24 is fine
    assert!(PduDecoder::new(cfg(Role::Controller, false, false, 1))
        .decode(&b)
        .is_ok());
    // CPDA 3 asks for 16-byte alignment: 24 is not.
    let e = decode_err_cfg(cfg(Role::Controller, false, false, 3), &b);
    assert_header_field(&e, "PDO", 3);
}

#[test]
fn nonzero_pdo_in_pdu_without_data() {
    let b = hex("09 00 18 18 18 00 00 00 03 00 01 00 00 00 00 00 00 10 00 00 00 00 00 00");
    assert_header_field(&decode_err(Role::Host, &b), "PDO", 3);
}

#[test]
fn header_digest_mismatch() {
    let c = cfg(Role::Host, true, false, 0);
    let enc = EncodeConfig {
        header_digest: true,
        ..Default::default()
    };
    let mut b = Pdu::R2T(nvmf_proto::R2T {
        cccid: 1,
        ttag: 2,
        r2to: 0,
        r2tl: 512,
    })
    .to_vec(&enc)
    .unwrap();
    b[10] ^= 1; // flip a TTAG bit, the digest no longer matches
    let received = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
    let e = decode_err_cfg(c, &b);
    assert!(
        matches!(e, ProtoError::HeaderDigestMismatch { .. }),
        "{e:?}"
    );
    assert_eq!(
        e.termination(),
        Some(Termination {
            fes: FatalErrorStatus::HEADER_DIGEST_ERROR,
            fei: received
        })
    );
}

#[test]
fn data_digest_mismatch_keeps_the_stream_in_sync() {
    let c = cfg(Role::Host, false, true, 0);
    let enc = EncodeConfig {
        data_digest: true,
        ..Default::default()
    };
    let mut b = Pdu::C2HData(C2HData {
        cccid: 0x42,
        datao: 0,
        last: true,
        success: false,
        data: Cow::Owned(vec![9; 64]),
    })
    .to_vec(&enc)
    .unwrap();
    let plen = b.len();
    b[30] ^= 0x80; // corrupt one data byte
    let e = decode_err_cfg(c, &b);
    match e {
        ProtoError::DataDigestMismatch {
            command_id,
            consumed,
            ..
        } => {
            assert_eq!(command_id, 0x42);
            assert_eq!(consumed, plen);
        }
        ref other => panic!("expected DataDigestMismatch, got {other:?}"),
    }
    assert_eq!(
        e.action(),
        ErrorAction::FailCommand {
            command_id: 0x42,
            consumed: plen
        }
    );
    assert!(!e.is_fatal());
}

#[test]
fn unknown_pdu_type() {
    for t in [0x08u8, 0x0A, 0x7F, 0xFF] {
        let b = [t, 0, 24, 0, 24, 0, 0, 0];
        for role in [Role::Host, Role::Controller] {
            let e = decode_err(role, &b);
            assert_header_field(&e, "PDU-Type", 0);
        }
    }
}

#[test]
fn pdu_type_not_allowed_in_this_direction() {
    // A controller never receives C2HData, R2T, CapsuleResp or ICResp.
    let c2h = Pdu::C2HData(C2HData {
        cccid: 1,
        datao: 0,
        last: true,
        success: false,
        data: Cow::Owned(vec![1; 4]),
    })
    .to_vec(&EncodeConfig::default())
    .unwrap();
    assert_header_field(&decode_err(Role::Controller, &c2h), "PDU-Type", 0);
    // A host never receives CapsuleCmd or ICReq.
    let cmd = Pdu::CapsuleCmd(CapsuleCmd::new(IoCommand::Flush { nsid: 1 }.to_sqe(1)))
        .to_vec(&EncodeConfig::default())
        .unwrap();
    assert_header_field(&decode_err(Role::Host, &cmd), "PDU-Type", 0);
    let icreq = Pdu::IcReq(IcReq::default())
        .to_vec(&EncodeConfig::default())
        .unwrap();
    assert_header_field(&decode_err(Role::Host, &icreq), "PDU-Type", 0);
}

#[test]
fn flags_not_defined_for_the_type() {
    // LAST_PDU on a CapsuleCmd.
    let mut b = Pdu::CapsuleCmd(CapsuleCmd::new(IoCommand::Flush { nsid: 1 }.to_sqe(1)))
        .to_vec(&EncodeConfig::default())
        .unwrap();
    b[1] = 0x04;
    assert_header_field(&decode_err(Role::Controller, &b), "FLAGS", 1);
    // SUCCESS without LAST_PDU on C2HData.
    let mut b = Pdu::C2HData(C2HData {
        cccid: 1,
        datao: 0,
        last: true,
        success: true,
        data: Cow::Owned(vec![1; 4]),
    })
    .to_vec(&EncodeConfig::default())
    .unwrap();
    b[1] = 0x08;
    assert_header_field(&decode_err(Role::Host, &b), "FLAGS", 1);
    // SUCCESS on H2CData.
    let mut b = h2c_data(4);
    b[1] |= 0x08;
    assert_header_field(&decode_err(Role::Controller, &b), "FLAGS", 1);
}

#[test]
fn digest_flags_must_match_negotiation() {
    // Header digests negotiated but HDGSTF clear.
    let b = h2c_data(4);
    let e = decode_err_cfg(cfg(Role::Controller, true, false, 0), &b);
    assert_header_field(&e, "FLAGS", 1);
    // Data digests negotiated but DDGSTF clear on a PDU with data.
    let e = decode_err_cfg(cfg(Role::Controller, false, true, 0), &b);
    assert_header_field(&e, "FLAGS", 1);
    // HDGSTF set without negotiation.
    let mut b2 = b.clone();
    b2[1] |= 0x01;
    assert_header_field(&decode_err(Role::Controller, &b2), "FLAGS", 1);
    // DDGSTF on a PDU without data (data digests negotiated).
    let mut cmd = Pdu::CapsuleCmd(CapsuleCmd::new(IoCommand::Flush { nsid: 1 }.to_sqe(1)))
        .to_vec(&EncodeConfig::default())
        .unwrap();
    cmd[1] = 0x02;
    let e = decode_err_cfg(cfg(Role::Controller, false, true, 0), &cmd);
    assert_header_field(&e, "FLAGS", 1);
}

#[test]
fn datal_must_match_plen() {
    let mut b = h2c_data(8);
    b[16] = 7;
    assert_header_field(&decode_err(Role::Controller, &b), "DATAL", 16);
}

#[test]
fn data_pdu_without_data() {
    let b = hex("06 04 18 00 18 00 00 00 01 00 01 00 00 00 00 00 00 00 00 00 00 00 00 00");
    assert_header_field(&decode_err(Role::Controller, &b), "PLEN", 4);
}

#[test]
fn r2t_for_zero_bytes() {
    let b = hex("09 00 18 00 18 00 00 00 01 00 01 00 00 00 00 00 00 00 00 00 00 00 00 00");
    assert_header_field(&decode_err(Role::Host, &b), "R2TL", 16);
}

#[test]
fn icreq_unsupported_version_and_bad_fields() {
    let good = Pdu::IcReq(IcReq::default())
        .to_vec(&EncodeConfig::default())
        .unwrap();
    let mut b = good.clone();
    b[8] = 1; // PFV 1
    let e = decode_err(Role::Controller, &b);
    assert!(
        matches!(e, ProtoError::UnsupportedParameter { fei: 8, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.termination().unwrap().fes,
        FatalErrorStatus::UNSUPPORTED_PARAMETER
    );
    let mut b = good.clone();
    b[10] = 32; // HPDA above 31
    assert_header_field(&decode_err(Role::Controller, &b), "HPDA", 10);
    let mut b = good.clone();
    b[11] = 0x04; // reserved digest bit
    assert_header_field(&decode_err(Role::Controller, &b), "DGST", 11);
    let mut b = good.clone();
    b[4] = 0x81; // PLEN 129
    b.push(0);
    assert_header_field(&decode_err(Role::Controller, &b), "PLEN", 4);
    // ICResp with MAXH2CDATA below 4096.
    let mut r = hex("01 00 80 00 80 00 00 00 00 00 00 00 00 08 00 00");
    r.resize(128, 0);
    assert_header_field(&decode_err(Role::Host, &r), "MAXH2CDATA", 12);
}

#[test]
fn malformed_term_req_closes_without_answer() {
    let mut b = hex("03 00 18 00 99 00 00 00"); // C2HTermReq, PLEN 153 > 152
    b.resize(153, 0);
    let e = decode_err(Role::Host, &b);
    assert!(matches!(e, ProtoError::InvalidTermReq { .. }), "{e:?}");
    assert_eq!(e.action(), ErrorAction::Close);
    let b = hex("02 00 18 00 10 00 00 00"); // H2CTermReq, PLEN 16 < 24
    assert_eq!(
        decode_err(Role::Controller, &b).action(),
        ErrorAction::Close
    );
}

#[test]
fn connect_data_without_nul_is_an_invalid_field() {
    let mut data = [0u8; 1024];
    data[256..512].fill(b'q');
    let e = nvmf_proto::fabrics::ConnectData::from_bytes(&data).unwrap_err();
    assert!(
        matches!(
            e,
            ProtoError::InvalidField {
                field: "SUBNQN",
                offset: 256,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.action(), ErrorAction::CommandStatus);
}

#[test]
fn term_req_for_error_carries_the_offending_header() {
    let mut b = h2c_data(8);
    b[2] = 25; // bad HLEN
    let e = decode_err(Role::Controller, &b);
    let term = TermReq::for_error(e.termination().unwrap(), &b);
    assert_eq!(term.fes, FatalErrorStatus::INVALID_HEADER_FIELD);
    assert_eq!(term.fei, 2);
    assert_eq!(&term.data[..], &b[..25]);
    let pdu = Pdu::term_req(Role::Controller, term);
    assert_eq!(pdu.pdu_type(), pdu_type::C2H_TERM_REQ);
    let wire = pdu.to_vec(&EncodeConfig::default()).unwrap();
    assert_eq!(wire.len(), 24 + 25);
}

#[test]
fn short_input_asks_for_more() {
    let b = h2c_data(100);
    let dec = PduDecoder::new(cfg(Role::Controller, false, false, 0));
    assert_eq!(dec.decode(&b[..3]).unwrap(), Decoded::NeedMore(5));
    assert_eq!(
        dec.decode(&b[..30]).unwrap(),
        Decoded::NeedMore(b.len() - 30)
    );
    // Encoding refuses what the wire cannot express.
    let sqe = IoCommand::write(1, 0, 1, SglDescriptor::transport(0))
        .unwrap()
        .to_sqe(1);
    let too_long = Pdu::C2HTermReq(TermReq {
        fes: FatalErrorStatus::PDU_SEQUENCE_ERROR,
        fei: 0,
        data: Cow::Owned(vec![0; 129]),
    });
    assert!(too_long.to_vec(&EncodeConfig::default()).is_err());
    assert!(CapsuleCmd::with_data(sqe, vec![0u8; 16]).is_ok());
}

#[test]
fn header_digest_is_checked_before_waiting_for_the_body() {
    let enc = EncodeConfig {
        header_digest: true,
        ..Default::default()
    };
    let pdu = Pdu::H2CData(H2CData {
        cccid: 1,
        ttag: 1,
        datao: 0,
        last: true,
        data: Cow::Owned(vec![0; 4000]),
    });
    let bad = nvmf_proto::raw::RawPdu::encode(&pdu, &enc)
        .unwrap()
        .corrupt_header_digest()
        .into_bytes();
    // Only the header and its digest have arrived.
    let e = decode_err_cfg(cfg(Role::Controller, true, false, 0), &bad[..28]);
    assert!(
        matches!(e, ProtoError::HeaderDigestMismatch { .. }),
        "{e:?}"
    );
}

#[test]
fn raw_pdu_breaks_one_field_at_a_time() {
    use nvmf_proto::raw::RawPdu;
    let enc = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 0,
    };
    let c = cfg(Role::Host, true, true, 0);
    let pdu = Pdu::C2HData(C2HData {
        cccid: 3,
        datao: 0,
        last: true,
        success: false,
        data: Cow::Owned(vec![1; 16]),
    });
    let raw = RawPdu::encode(&pdu, &enc).unwrap();
    // A lying DATAL with a fresh header digest: the DATAL check must fire.
    let b = raw
        .clone()
        .set_u32(16, 15)
        .refresh_header_digest()
        .into_bytes();
    assert_header_field(&decode_err_cfg(c, &b), "DATAL", 16);
    // A stale header digest after the same edit: the digest check fires.
    let b = raw.clone().set_u32(16, 15).into_bytes();
    assert!(matches!(
        decode_err_cfg(c, &b),
        ProtoError::HeaderDigestMismatch { .. }
    ));
    let b = raw.clone().corrupt_data_digest().into_bytes();
    assert!(matches!(
        decode_err_cfg(c, &b),
        ProtoError::DataDigestMismatch { command_id: 3, .. }
    ));
    let short = raw.truncate(30);
    assert!(matches!(
        PduDecoder::new(c).decode(short.as_bytes()),
        Ok(Decoded::NeedMore(_))
    ));
}

#[test]
fn in_capsule_data_follows_the_sgl() {
    use nvmf_proto::Status;
    let sqe = IoCommand::write(1, 0, 1, SglDescriptor::transport(0))
        .unwrap()
        .to_sqe(1);
    let cap = CapsuleCmd::with_data(sqe, vec![1, 2, 3, 4]).unwrap();
    assert_eq!(cap.in_capsule_data(), Ok(Some(&[1u8, 2, 3, 4][..])));
    let mut beyond = cap.clone();
    beyond.sqe.dptr = SglDescriptor::in_capsule(2, 4);
    assert_eq!(
        beyond.in_capsule_data(),
        Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr())
    );
    beyond.sqe.dptr = SglDescriptor::in_capsule(9, 0);
    assert_eq!(
        beyond.in_capsule_data(),
        Err(Status::SGL_OFFSET_INVALID.with_dnr())
    );
    let read = CapsuleCmd::new(IoCommand::read(1, 0, 1, 512).unwrap().to_sqe(2));
    assert_eq!(read.in_capsule_data(), Ok(None));
    let mut keyed = read.clone();
    keyed.sqe.dptr.id = 0x40;
    assert_eq!(
        keyed.in_capsule_data(),
        Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr())
    );
}
