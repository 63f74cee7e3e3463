//! Malformed and out-of-order input: each case ends only the offending
//! connection (with a C2HTermReq carrying the right fatal error status, or
//! an NVMe error status where the specification asks for one), and the
//! target keeps serving a host that was connected all along and a host
//! that connects afterwards. Covers the triggers of known nvmet-tcp CVEs.

mod support;

use std::net::SocketAddr;

use nvmf_proto::fabrics::{Connect, ConnectInvalidParameter, PriorityClass, CNTLID_DYNAMIC};
use nvmf_proto::pdu::{CapsuleCmd, H2CData, IcReq, Pdu};
use nvmf_proto::{FatalErrorStatus as Fes, IoCommand, RawPdu, SglDescriptor, Status};
use support::*;

const BS: u32 = 512;

/// A host connected before the bad input and one connecting after it both
/// still read what they wrote.
fn assert_target_healthy(addr: SocketAddr, bystander: &mut TestHost, round: u32) {
    let data = pattern(16 * 1024, round);
    let slba = 10_000 + round as u64 * 64;
    assert!(bystander
        .write(1, slba, &data, BS, 8192)
        .status
        .is_success());
    let (cqe, back) = bystander.read(1, slba, 32, BS);
    assert!(
        cqe.status.is_success() && back == data,
        "bystander broken after case {round}"
    );
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut fresh = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let (cqe, back) = fresh.read(1, slba, 32, BS);
    assert!(
        cqe.status.is_success() && back == data,
        "new host broken after case {round}"
    );
}

fn io_queue(addr: SocketAddr) -> (TestHost, TestHost) {
    let admin = TestHost::bring_up(addr, false, false, 2);
    let io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    (admin, io)
}

/// A valid Flush capsule from `h`, open to breaking one field.
fn flush_capsule(h: &mut TestHost) -> RawPdu {
    let cid = h.cid();
    let pdu = Pdu::CapsuleCmd(CapsuleCmd::new(IoCommand::Flush { nsid: 1 }.to_sqe(cid)));
    RawPdu::encode(&pdu, &h.enc).unwrap()
}

fn expect_fes(h: &mut TestHost, fes: Fes, case: &str) {
    let term = h.expect_termination();
    let term = term.unwrap_or_else(|| panic!("{case}: closed without a C2HTermReq"));
    assert_eq!(term.fes, fes, "{case}: wrong FES");
}

#[test]
fn every_malformed_input_ends_only_its_connection() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let (_bystander_admin, mut bystander) = io_queue(addr);
    let mut round = 0;
    let mut next = |bystander: &mut TestHost| {
        round += 1;
        assert_target_healthy(addr, bystander, round);
    };

    // A command before ICReq.
    let mut h = TestHost::connect(addr);
    h.send(&Pdu::CapsuleCmd(CapsuleCmd::new(nvmf_proto::Sqe::new(
        0x06, 1,
    ))));
    expect_fes(&mut h, Fes::PDU_SEQUENCE_ERROR, "capsule before ICReq");
    next(&mut bystander);

    // A second ICReq.
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    h.send(&Pdu::IcReq(IcReq::default()));
    expect_fes(&mut h, Fes::PDU_SEQUENCE_ERROR, "second ICReq");
    next(&mut bystander);

    // H2CData before Connect (CVE-2023-6356/6535/6536 class).
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    h.send(&Pdu::H2CData(H2CData {
        cccid: 1,
        ttag: 0,
        datao: 0,
        last: true,
        data: vec![0u8; 512].into(),
    }));
    expect_fes(&mut h, Fes::INVALID_HEADER_FIELD, "H2CData before Connect");
    next(&mut bystander);

    // H2CData for a read.
    let (_a, mut h) = io_queue(addr);
    let cid = h.cid();
    let read = IoCommand::read(1, 0, 8, 4096).unwrap();
    h.send(&Pdu::CapsuleCmd(CapsuleCmd::new(read.to_sqe(cid))));
    h.send(&Pdu::H2CData(H2CData {
        cccid: cid,
        ttag: 0,
        datao: 0,
        last: true,
        data: vec![0u8; 4096].into(),
    }));
    let mut term = None;
    while let Some(p) = h.recv_or_close() {
        match p {
            Pdu::C2HTermReq(t) => term = Some(t.fes),
            Pdu::C2HData(_) | Pdu::CapsuleResp(_) => {} // the read itself may complete first
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(term, Some(Fes::INVALID_HEADER_FIELD), "H2CData for a read");
    next(&mut bystander);

    // H2CData for a command that does not exist.
    let (_a, mut h) = io_queue(addr);
    h.send(&Pdu::H2CData(H2CData {
        cccid: 0x4242,
        ttag: 0,
        datao: 0,
        last: true,
        data: vec![0u8; 512].into(),
    }));
    expect_fes(
        &mut h,
        Fes::INVALID_HEADER_FIELD,
        "H2CData for an unknown command",
    );
    next(&mut bystander);

    // Data beyond the command's buffer: offset past the end, and a PDU
    // longer than what was solicited.
    for (datao, len) in [(16 * 1024u32, 4096usize), (0, 20 * 1024)] {
        let (_a, mut h) = io_queue(addr);
        let cid = h.cid();
        let w = IoCommand::write(1, 0, 32, SglDescriptor::transport(16 * 1024)).unwrap();
        h.send(&Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(cid))));
        let Pdu::R2T(r2t) = h.recv() else {
            panic!("expected R2T")
        };
        h.send(&Pdu::H2CData(H2CData {
            cccid: cid,
            ttag: r2t.ttag,
            datao,
            last: true,
            data: vec![1u8; len].into(),
        }));
        expect_fes(
            &mut h,
            Fes::DATA_TRANSFER_OUT_OF_RANGE,
            "H2CData beyond the buffer",
        );
        next(&mut bystander);
    }

    // A wrong transfer tag.
    let (_a, mut h) = io_queue(addr);
    let cid = h.cid();
    let w = IoCommand::write(1, 0, 32, SglDescriptor::transport(16 * 1024)).unwrap();
    h.send(&Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(cid))));
    let Pdu::R2T(r2t) = h.recv() else {
        panic!("expected R2T")
    };
    h.send(&Pdu::H2CData(H2CData {
        cccid: cid,
        ttag: r2t.ttag.wrapping_add(1),
        datao: 0,
        last: true,
        data: vec![1u8; 16 * 1024].into(),
    }));
    expect_fes(&mut h, Fes::INVALID_HEADER_FIELD, "wrong TTAG");
    next(&mut bystander);

    // H2CData larger than MAXH2CDATA.
    let (_a, mut h) = io_queue(addr);
    let cid = h.cid();
    let len = h.maxh2cdata as usize * 2;
    let w = IoCommand::write(
        1,
        0,
        (len / 512) as u32,
        SglDescriptor::transport(len as u32),
    )
    .unwrap();
    h.send(&Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(cid))));
    let Pdu::R2T(r2t) = h.recv() else {
        panic!("expected R2T")
    };
    h.send(&Pdu::H2CData(H2CData {
        cccid: cid,
        ttag: r2t.ttag,
        datao: 0,
        last: true,
        data: vec![1u8; len].into(),
    }));
    expect_fes(
        &mut h,
        Fes::DATA_TRANSFER_LIMIT_EXCEEDED,
        "H2CData above MAXH2CDATA",
    );
    next(&mut bystander);

    // A header length that disagrees with the PDU type.
    let (_a, mut h) = io_queue(addr);
    let bytes = flush_capsule(&mut h).set_hlen(0x50).into_bytes();
    h.send_raw(&bytes);
    expect_fes(&mut h, Fes::INVALID_HEADER_FIELD, "wrong HLEN");
    next(&mut bystander);

    // PLEN smaller than HLEN.
    let (_a, mut h) = io_queue(addr);
    let bytes = flush_capsule(&mut h).set_plen(16).into_bytes();
    h.send_raw(&bytes);
    expect_fes(&mut h, Fes::INVALID_HEADER_FIELD, "PLEN < HLEN");
    next(&mut bystander);

    // A PLEN announcing gigabytes: refused before anything is buffered.
    let (_a, mut h) = io_queue(addr);
    let h2c = Pdu::H2CData(H2CData {
        cccid: 1,
        ttag: 0,
        datao: 0,
        last: true,
        data: vec![0u8; 512].into(),
    });
    let bytes = RawPdu::encode(&h2c, &h.enc)
        .unwrap()
        .set_plen(0x7FFF_FFFF)
        .into_bytes();
    h.send_raw(&bytes[..64]);
    expect_fes(&mut h, Fes::DATA_TRANSFER_LIMIT_EXCEEDED, "huge PLEN");
    next(&mut bystander);

    // A header digest mismatch.
    let admin = TestHost::bring_up(addr, true, false, 2);
    let mut h = TestHost::connect_io(addr, admin.cntlid, 1, true, false);
    let bytes = flush_capsule(&mut h).corrupt_header_digest().into_bytes();
    h.send_raw(&bytes);
    expect_fes(&mut h, Fes::HEADER_DIGEST_ERROR, "header digest");
    drop(admin);
    next(&mut bystander);

    // An unknown PDU type.
    let (_a, mut h) = io_queue(addr);
    h.send_raw(&[0x0F, 0, 8, 0, 8, 0, 0, 0]);
    let term = h.expect_termination().expect("TermReq");
    assert!(
        term.fes == Fes::INVALID_HEADER_FIELD,
        "unknown type: {:?}",
        term.fes
    );
    next(&mut bystander);

    // Noise after ICReq.
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    h.send_raw(&pattern(4096, 77));
    let _ = h.expect_termination();
    next(&mut bystander);
}

#[test]
fn data_digest_error_fails_the_command_and_keeps_the_connection() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, true, true, 1);
    let mut h = TestHost::connect_io(addr, admin.cntlid, 1, true, true);
    let len = h.maxh2cdata as usize * 2;
    let data = pattern(len, 5);
    let cid = h.cid();
    let w = IoCommand::write(
        1,
        0,
        (len / 512) as u32,
        SglDescriptor::transport(len as u32),
    )
    .unwrap();
    h.send(&Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(cid))));
    let Pdu::R2T(r2t) = h.recv() else {
        panic!("expected R2T")
    };
    let half = len / 2;
    // The first (non-final) H2CData arrives damaged.
    let first = Pdu::H2CData(H2CData {
        cccid: cid,
        ttag: r2t.ttag,
        datao: 0,
        last: false,
        data: data[..half].to_vec().into(),
    });
    h.send_raw(
        &RawPdu::encode(&first, &h.enc)
            .unwrap()
            .corrupt_data_digest()
            .into_bytes(),
    );
    h.send(&Pdu::H2CData(H2CData {
        cccid: cid,
        ttag: r2t.ttag,
        datao: half as u32,
        last: true,
        data: data[half..].to_vec().into(),
    }));
    let (cqe, _) = h.gather(cid);
    assert_eq!(cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
    // Nothing of the damaged write landed, and the queue still works.
    let (cqe, back) = h.read(1, 0, (len / 512) as u32, 512);
    assert!(cqe.status.is_success());
    assert!(back.iter().all(|&b| b == 0), "a failed write must not land");
    assert!(h.write(1, 0, &data, 512, 8192).status.is_success());
    let (_, back) = h.read(1, 0, (len / 512) as u32, 512);
    assert!(back == data);
}

#[test]
fn connect_errors_carry_the_right_status() {
    let t = start_target(
        r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
backend = "ram"
size = "1MiB"
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:private"
allowed_hosts = ["nqn.2026-01.io.gimbal:trusted"]
"#,
    );
    let addr = t.local_addrs()[0];

    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let cqe = h.connect_admin_as("nqn.2026-01.io.gimbal:nonexistent", HOST_NQN, 0);
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Data(256)
    );

    let cqe = h.connect_admin_as("nqn.2026-01.io.gimbal:private", HOST_NQN, 0);
    assert_eq!(cqe.status, Status::CONNECT_INVALID_HOST.with_dnr());
    let cqe = h.connect_admin_as(
        "nqn.2026-01.io.gimbal:private",
        "nqn.2026-01.io.gimbal:trusted",
        0,
    );
    assert!(cqe.status.is_success(), "{cqe:?}");

    // An NQN with no terminating NUL (CVE-2023-5178-style overread).
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let mut data = h.connect_data(DEMO_NQN, HOST_NQN, CNTLID_DYNAMIC);
    data[256..512].fill(b'a');
    let cid = h.cid();
    let (cqe, _) = h.command(Connect::admin(32, 0).to_sqe(cid), Some(&data));
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Data(256)
    );
    let mut data = h.connect_data(DEMO_NQN, HOST_NQN, CNTLID_DYNAMIC);
    data[512..768].fill(b'h');
    let cid = h.cid();
    let (cqe, _) = h.command(Connect::admin(32, 0).to_sqe(cid), Some(&data));
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Data(512)
    );

    // I/O queue for a controller that does not exist, and beyond the
    // granted queue count.
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let cid = h.cid();
    let data = h.connect_data(DEMO_NQN, HOST_NQN, 0x1234);
    let (cqe, _) = h.command(
        Connect::io(1, 32, PriorityClass::Medium).to_sqe(cid),
        Some(&data),
    );
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Data(16)
    );
    let admin = TestHost::bring_up(addr, false, false, 1);
    let cid = h.cid();
    let data = h.connect_data(DEMO_NQN, HOST_NQN, admin.cntlid);
    let (cqe, _) = h.command(
        Connect::io(2, 32, PriorityClass::Medium).to_sqe(cid),
        Some(&data),
    );
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Command(42)
    );
    // A queue size beyond MQES.
    let cid = h.cid();
    let (cqe, _) = h.command(
        Connect::io(1, 4000, PriorityClass::Medium).to_sqe(cid),
        Some(&data),
    );
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Command(44)
    );
    // I/O before any Connect: refused, connection stays.
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let (cqe, _) = h.read(1, 0, 1, 512);
    assert_eq!(cqe.status, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
}
