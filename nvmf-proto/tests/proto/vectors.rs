//! Known-good byte vectors for each PDU type, written by hand from the
//! NVMe/TCP 1.0 and NVMe base specifications. Each vector is checked both
//! ways: the typed PDU encodes to exactly these bytes, and these bytes
//! decode to the typed PDU. Digests are computed with the test's own
//! bit-by-bit CRC32C.

use std::borrow::Cow;

use nvmf_proto::pdu::pdu_type;
use nvmf_proto::status::Status;
use nvmf_proto::{
    C2HData, CapsuleCmd, CapsuleResp, Cqe, EncodeConfig, FatalErrorStatus, H2CData, IcReq, IcResp,
    IoCommand, Pdu, Role, SglDescriptor, TermReq, R2T,
};

use crate::common::{cfg, decode_one, hex, reference_crc32c};

fn check(pdu: &Pdu<'_>, enc: EncodeConfig, receiver: Role, bytes: &[u8]) {
    assert_eq!(pdu.to_vec(&enc).unwrap(), bytes, "encoding of {pdu:?}");
    let dec = cfg(receiver, enc.header_digest, enc.data_digest, enc.tx_pda);
    assert_eq!(&decode_one(dec, bytes).unwrap(), pdu, "decoding");
}

const PLAIN: EncodeConfig = EncodeConfig {
    header_digest: false,
    data_digest: false,
    tx_pda: 0,
};

#[test]
fn icreq() {
    let bytes = hex("
        00          // PDU-Type: ICReq
        00          // FLAGS: none defined
        80          // HLEN: 128
        00          // PDO: 0 (no data)
        80 00 00 00 // PLEN: 128
        00 00       // PFV: 0 (NVMe/TCP 1.0)
        00          // HPDA: 0 (no alignment)
        03          // DGST: header (bit 0) and data (bit 1) digests requested
        03 00 00 00 // MAXR2T: 3 (0's based: 4 outstanding R2Ts)
        00*112      // reserved
    ");
    let pdu = Pdu::IcReq(IcReq {
        hpda: 0,
        header_digest: true,
        data_digest: true,
        maxr2t: 3,
    });
    // ICReq never carries digests, whatever the settings say.
    let with_digests = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 0,
    };
    assert_eq!(pdu.to_vec(&with_digests).unwrap(), bytes);
    check(&pdu, PLAIN, Role::Controller, &bytes);
}

#[test]
fn icresp() {
    let bytes = hex("
        01          // PDU-Type: ICResp
        00          // FLAGS
        80          // HLEN: 128
        00          // PDO
        80 00 00 00 // PLEN: 128
        00 00       // PFV: 0
        01          // CPDA: 1 (8-byte alignment of H2C data)
        01          // DGST: header digest enabled, data digest off
        00 00 02 00 // MAXH2CDATA: 0x20000 = 128 KiB
        00*112      // reserved
    ");
    let pdu = Pdu::IcResp(IcResp {
        cpda: 1,
        header_digest: true,
        data_digest: false,
        maxh2cdata: 0x20000,
    });
    check(&pdu, PLAIN, Role::Host, &bytes);
}

#[test]
fn capsule_cmd_read_with_transport_sgl() {
    let bytes = hex("
        04          // PDU-Type: CapsuleCmd
        00          // FLAGS: no digests
        48          // HLEN: 72 (8 + 64-byte SQE)
        00          // PDO: 0, no in-capsule data
        48 00 00 00 // PLEN: 72
        // SQE
        02          // OPC: Read
        40          // FUSE 00b, PSDT 01b (SGL)
        34 12       // CID: 0x1234
        01 00 00 00 // NSID: 1
        00*8        // CDW2, CDW3
        00*8        // MPTR
        00*8        // SGL1 address: 0
        00 10 00 00 // SGL1 length: 4096
        00 00 00    // SGL1 reserved
        5A          // SGL1 identifier: Transport SGL Data Block (5h), subtype Ah
        10 00 00 00 // CDW10: SLBA low = 0x10
        00 00 00 00 // CDW11: SLBA high
        07 00 00 00 // CDW12: NLB = 7 (8 blocks)
        00*12       // CDW13..CDW15
    ");
    let sqe = IoCommand::read(1, 0x10, 8, 4096).unwrap().to_sqe(0x1234);
    check(
        &Pdu::CapsuleCmd(CapsuleCmd::new(sqe)),
        PLAIN,
        Role::Controller,
        &bytes,
    );
}

#[test]
fn capsule_cmd_write_in_capsule_with_both_digests() {
    let header = hex("
        04          // PDU-Type: CapsuleCmd
        03          // FLAGS: HDGSTF | DDGSTF
        48          // HLEN: 72
        4C          // PDO: 76 = HLEN + header digest (CPDA 0: no padding)
        58 00 00 00 // PLEN: 88 = 76 + 8 data + 4 data digest
        // SQE
        01          // OPC: Write
        40          // PSDT 01b
        07 00       // CID: 7
        01 00 00 00 // NSID: 1
        00*16       // CDW2, CDW3, MPTR
        00*8        // SGL1 address: offset 0 into the in-capsule data
        08 00 00 00 // SGL1 length: 8
        00 00 00    // reserved
        01          // SGL1 identifier: Data Block (0h), subtype Offset (1h)
        00 00 00 00 // CDW10: SLBA 0
        00 00 00 00 // CDW11
        00 00 00 00 // CDW12: NLB 0 (1 block)
        00*12       // CDW13..CDW15
    ");
    let data = hex("01 02 03 04 05 06 07 08");
    let mut bytes = header.clone();
    bytes.extend_from_slice(&reference_crc32c(&header).to_le_bytes()); // HDGST
    bytes.extend_from_slice(&data);
    bytes.extend_from_slice(&reference_crc32c(&data).to_le_bytes()); // DDGST
    let sqe = IoCommand::write(1, 0, 1, SglDescriptor::transport(0))
        .unwrap()
        .to_sqe(7);
    let pdu = Pdu::CapsuleCmd(CapsuleCmd::with_data(sqe, data).unwrap());
    let enc = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 0,
    };
    check(&pdu, enc, Role::Controller, &bytes);
}

#[test]
fn capsule_resp() {
    let bytes = hex("
        05          // PDU-Type: CapsuleResp
        00          // FLAGS
        18          // HLEN: 24 (8 + 16-byte CQE)
        00          // PDO
        18 00 00 00 // PLEN: 24
        // CQE
        00 00 00 00 // DW0
        00 00 00 00 // DW1
        05 00       // SQHD: 5
        00 00       // SQID: 0
        34 12       // CID: 0x1234
        00 81       // status: SC 80h (LBA Out of Range) << 1, SCT 0, DNR (bit 15)
    ");
    let cqe = Cqe::new(0x1234, Status::LBA_OUT_OF_RANGE.with_dnr()).with_sqhd(5);
    check(
        &Pdu::CapsuleResp(CapsuleResp { cqe }),
        PLAIN,
        Role::Host,
        &bytes,
    );
}

#[test]
fn capsule_resp_connect_invalid_host() {
    let bytes = hex("
        05 00 18 00 18 00 00 00 // CapsuleResp, HLEN 24, PLEN 24
        00 00 00 00             // DW0
        00 00 00 00             // DW1
        00 00 00 00             // SQHD, SQID
        01 00                   // CID: 1
        08 83                   // status: SC 84h << 1 = 0x108, SCT 1 << 9 = 0x200, DNR 0x8000: 0x8308
    ");
    let cqe = Cqe::new(1, Status::CONNECT_INVALID_HOST.with_dnr());
    check(
        &Pdu::CapsuleResp(CapsuleResp { cqe }),
        PLAIN,
        Role::Host,
        &bytes,
    );
}

#[test]
fn h2c_data() {
    let bytes = hex("
        06          // PDU-Type: H2CData
        04          // FLAGS: LAST_PDU
        18          // HLEN: 24
        18          // PDO: 24
        1C 00 00 00 // PLEN: 28
        01 00       // CCCID: 1
        02 00       // TTAG: 2
        00 10 00 00 // DATAO: 4096
        04 00 00 00 // DATAL: 4
        00*4        // reserved
        DE AD BE EF // data
    ");
    let pdu = Pdu::H2CData(H2CData {
        cccid: 1,
        ttag: 2,
        datao: 4096,
        last: true,
        data: Cow::Owned(vec![0xDE, 0xAD, 0xBE, 0xEF]),
    });
    check(&pdu, PLAIN, Role::Controller, &bytes);
}

#[test]
fn c2h_data_success_with_header_digest_and_hpda_padding() {
    let header = hex("
        07          // PDU-Type: C2HData
        0D          // FLAGS: HDGSTF | LAST_PDU | SUCCESS
        18          // HLEN: 24
        20          // PDO: 32 = 24 + 4 (HDGST) rounded up to 8 (HPDA 1)
        24 00 00 00 // PLEN: 36
        07 00       // CCCID: 7
        00 00       // reserved
        00 00 00 00 // DATAO: 0
        04 00 00 00 // DATAL: 4
        00*4        // reserved
    ");
    let mut bytes = header.clone();
    bytes.extend_from_slice(&reference_crc32c(&header).to_le_bytes()); // HDGST
    bytes.extend_from_slice(&hex("00 00 00 00")); // PAD to PDO
    bytes.extend_from_slice(&hex("01 02 03 04")); // data
    let pdu = Pdu::C2HData(C2HData {
        cccid: 7,
        datao: 0,
        last: true,
        success: true,
        data: Cow::Owned(vec![1, 2, 3, 4]),
    });
    let enc = EncodeConfig {
        header_digest: true,
        data_digest: false,
        tx_pda: 1,
    };
    check(&pdu, enc, Role::Host, &bytes);
}

#[test]
fn r2t() {
    let bytes = hex("
        09          // PDU-Type: R2T
        00          // FLAGS
        18          // HLEN: 24
        00          // PDO: 0 (R2T has no data)
        18 00 00 00 // PLEN: 24
        03 00       // CCCID: 3
        09 00       // TTAG: 9
        00 00 00 00 // R2TO: 0
        00 20 00 00 // R2TL: 8192
        00*4        // reserved
    ");
    let pdu = Pdu::R2T(R2T {
        cccid: 3,
        ttag: 9,
        r2to: 0,
        r2tl: 8192,
    });
    check(&pdu, PLAIN, Role::Host, &bytes);
}

#[test]
fn c2h_term_req_with_offending_header() {
    let offending = hex("06 00 19 00 18 00 00 00"); // an H2CData with HLEN 25
    let mut bytes = hex("
        03          // PDU-Type: C2HTermReq
        00          // FLAGS
        18          // HLEN: 24
        00          // PDO: reserved (0)
        20 00 00 00 // PLEN: 32 = 24 + 8 bytes of offending header
        01 00       // FES: 01h Invalid PDU Header Field
        02 00 00 00 // FEI: 2 (byte offset of HLEN)
        00*10       // reserved
    ");
    bytes.extend_from_slice(&offending);
    let pdu = Pdu::C2HTermReq(TermReq {
        fes: FatalErrorStatus::INVALID_HEADER_FIELD,
        fei: 2,
        data: Cow::Owned(offending),
    });
    // TermReqs never carry digests, even when they were negotiated.
    let enc = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 3,
    };
    assert_eq!(pdu.to_vec(&enc).unwrap(), bytes);
    check(&pdu, PLAIN, Role::Host, &bytes);
}

#[test]
fn h2c_term_req_header_digest_error() {
    let bytes = hex("
        02          // PDU-Type: H2CTermReq
        00 18 00    // FLAGS, HLEN 24, PDO
        18 00 00 00 // PLEN: 24 (no data)
        03 00       // FES: 03h Header Digest Error
        DD CC BB AA // FEI: the received digest, 0xAABBCCDD
        00*10       // reserved
    ");
    let pdu = Pdu::H2CTermReq(TermReq {
        fes: FatalErrorStatus::HEADER_DIGEST_ERROR,
        fei: 0xAABB_CCDD,
        data: Cow::Borrowed(&[]),
    });
    check(&pdu, PLAIN, Role::Controller, &bytes);
    assert_eq!(bytes[0], pdu_type::H2C_TERM_REQ);
}

#[test]
fn encode_head_plus_data_plus_digest_equals_encode() {
    let pdu = Pdu::C2HData(C2HData {
        cccid: 1,
        datao: 8,
        last: false,
        success: false,
        data: Cow::Owned((0..100u8).collect()),
    });
    let enc = EncodeConfig {
        header_digest: true,
        data_digest: true,
        tx_pda: 7,
    };
    let mut parts = Vec::new();
    let ddgst = pdu.encode_head(&enc, &mut parts).unwrap();
    parts.extend_from_slice(pdu.data());
    parts.extend_from_slice(&ddgst.expect("data digest"));
    assert_eq!(parts, pdu.to_vec(&enc).unwrap());
    assert_eq!(parts[3], 32, "PDO: 28 rounded up to 32-byte alignment");
    assert_eq!(parts.len(), pdu.encoded_len(&enc).unwrap());
}
