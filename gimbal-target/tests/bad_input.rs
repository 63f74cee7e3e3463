//! Malformed and out-of-order input: each case ends only the offending
//! connection (with a C2HTermReq carrying the right fatal error status, or
//! an NVMe error status where the specification asks for one), and the
//! target keeps serving a host that was connected all along and a host
//! that connects afterwards. Covers the triggers of known nvmet-tcp CVEs.

mod support;

use std::net::SocketAddr;

use std::time::Duration;

use nvmf_proto::command::{cns, log_id, AdminCommand, GetLogPage, Identify};
use nvmf_proto::fabrics::{
    property, Connect, ConnectInvalidParameter, ControllerConfiguration, ControllerStatus,
    PriorityClass, PropertySet, CNTLID_DYNAMIC, DISCOVERY_NQN,
};
use nvmf_proto::pdu::{CapsuleCmd, H2CData, IcReq, Pdu};
use nvmf_proto::{Cqe, FatalErrorStatus as Fes, IoCommand, RawPdu, SglDescriptor, Sqe, Status};
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

// ---- spec-strict validation (issue 15, item 4) -----------------------------

/// NVMe Base 2.0, Common Completion Queue Entry: SQID names the queue the
/// command came from, on the admin queue and on every I/O queue, from the
/// Connect's own completion on.
#[test]
fn completions_name_their_submission_queue() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let mut admin = TestHost::bring_up(addr, false, false, 2);
    let cid = admin.cid();
    let (cqe, _) = admin.command(AdminCommand::KeepAlive.to_sqe(cid), None);
    assert_eq!(cqe.sqid, 0);
    for qid in [1u16, 2] {
        let (mut io, connect) = TestHost::try_connect_io(addr, admin.cntlid, qid, 32, HOST_ID);
        assert!(connect.status.is_success());
        assert_eq!(connect.sqid, qid, "the Connect's CQE names the new queue");
        let cid = io.cid();
        let (cqe, _) = io.command(IoCommand::Flush { nsid: 1 }.to_sqe(cid), None);
        assert_eq!((cqe.status, cqe.sqid), (Status::SUCCESS, qid));
        let (cqe, _) = io.read(1, 0, 8, BS);
        assert_eq!(cqe.sqid, qid, "a read's CQE too");
        let (cqe, _) = io.read(9, 0, 8, BS);
        assert_eq!(cqe.sqid, qid, "and an error's");
    }
}

/// Fused commands and PSDT other than 01b (SGL) are refused with Invalid
/// Field in Command, as Linux nvmet's `nvmet_req_init`, before anything
/// else is looked at; the queue keeps serving.
#[test]
fn fused_and_prp_commands_are_refused() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let (mut admin, mut io) = io_queue(addr);
    assert!(io
        .write(1, 0, &pattern(4096, 1), BS, 8192)
        .status
        .is_success());
    for flags in [0x41u8, 0x42, 0x43, 0x00, 0x80, 0xC0] {
        let cid = io.cid();
        let mut sqe = IoCommand::read(1, 0, 8, 4096).unwrap().to_sqe(cid);
        sqe.flags = flags;
        let (cqe, data) = io.command(sqe, None);
        assert_eq!(
            cqe.status,
            Status::INVALID_FIELD.with_dnr(),
            "flags {flags:#04x}"
        );
        assert!(data.is_empty(), "flags {flags:#04x}: nothing read");
        // A write with bad flags writes nothing.
        let cid = io.cid();
        let mut sqe = IoCommand::write(1, 0, 8, SglDescriptor::in_capsule(0, 4096))
            .unwrap()
            .to_sqe(cid);
        sqe.flags = flags;
        let (cqe, _) = io.command(sqe, Some(&[0xEE; 4096]));
        assert_eq!(
            cqe.status,
            Status::INVALID_FIELD.with_dnr(),
            "flags {flags:#04x}"
        );
        // On the admin queue too.
        let cid = admin.cid();
        let mut sqe = AdminCommand::Identify(Identify::new(cns::CONTROLLER, 0)).to_sqe(cid);
        sqe.flags = flags;
        let (cqe, data) = admin.command(sqe, None);
        assert_eq!(
            cqe.status,
            Status::INVALID_FIELD.with_dnr(),
            "flags {flags:#04x}"
        );
        assert!(data.is_empty());
    }
    let (cqe, back) = io.read(1, 0, 8, BS);
    assert!(cqe.status.is_success());
    assert_eq!(back, pattern(4096, 1), "the refused writes changed nothing");
    // A Connect with the fused bits set is refused the same way.
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let cid = h.cid();
    let mut sqe = Connect::admin(32, 0).to_sqe(cid);
    sqe.flags |= 0x01;
    let data = h.connect_data(DEMO_NQN, HOST_NQN, CNTLID_DYNAMIC);
    let (cqe, _) = h.command(sqe, Some(&data));
    assert_eq!(cqe.status, Status::INVALID_FIELD.with_dnr());
}

/// In-capsule data beyond IOCCSZ (8 KiB here) on an I/O queue, or beyond
/// the 8 KiB admin capsule, is refused (SGL Offset Invalid, as nvmet-tcp),
/// whether the SGL or the PDU says so; nothing is written.
#[test]
fn in_capsule_data_beyond_the_capsule_size_is_refused() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let (mut admin, mut io) = io_queue(addr);
    let id = admin.identify_controller();
    assert_eq!(id.max_in_capsule_data(), 8192);
    let big = pattern(16 * 1024, 3);
    let cid = io.cid();
    let w = IoCommand::write(1, 64, 32, SglDescriptor::in_capsule(0, 16 * 1024)).unwrap();
    let (cqe, _) = io.command(w.to_sqe(cid), Some(&big));
    assert_eq!(cqe.status, Status::SGL_OFFSET_INVALID.with_dnr());
    let (_, back) = io.read(1, 64, 32, BS);
    assert!(back.iter().all(|&b| b == 0), "nothing was written");
    // Exactly IOCCSZ still goes in-capsule.
    assert!(io.write(1, 64, &big[..8192], BS, 8192).status.is_success());
    // The admin queue's capsule is 8 KiB: 8 KiB of data does not fit.
    let cid = admin.cid();
    let sqe = AdminCommand::KeepAlive.to_sqe(cid);
    let (cqe, _) = admin.command(sqe, Some(&pattern(8192, 4)));
    assert_eq!(cqe.status, Status::SGL_OFFSET_INVALID.with_dnr());
    let cid = admin.cid();
    let (cqe, _) = admin.command(AdminCommand::KeepAlive.to_sqe(cid), None);
    assert!(cqe.status.is_success(), "the admin queue still serves");
}

fn identify_with(h: &mut TestHost, sgl: SglDescriptor) -> (Cqe, Vec<u8>) {
    let cid = h.cid();
    let mut sqe = AdminCommand::Identify(Identify::new(cns::CONTROLLER, 0)).to_sqe(cid);
    sqe.dptr = sgl;
    h.command(sqe, None)
}

/// Identify transfers exactly 4 KiB: a zero-length or short data pointer is
/// Data SGL Length Invalid (nvmet's `nvmet_check_transfer_len`), and no
/// data is sent.
#[test]
fn identify_needs_a_4k_data_pointer() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let mut h = TestHost::bring_up(addr, false, false, 1);
    for len in [0u32, 4, 512, 4092, 8192] {
        let (cqe, data) = identify_with(&mut h, SglDescriptor::transport(len));
        assert_eq!(
            cqe.status,
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
            "SGL of {len} bytes"
        );
        assert!(data.is_empty());
    }
    let (cqe, data) = identify_with(&mut h, SglDescriptor::null());
    assert_eq!(cqe.status, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    assert!(data.is_empty());
    let (cqe, data) = identify_with(&mut h, SglDescriptor::in_capsule(0, 4096));
    assert_eq!(
        cqe.status,
        Status::INVALID_FIELD.with_dnr(),
        "no data to the host in a capsule"
    );
    assert!(data.is_empty());
    let (cqe, data) = identify_with(&mut h, SglDescriptor::transport(4096));
    assert!(cqe.status.is_success());
    assert_eq!(data.len(), 4096);
}

fn get_log_page(
    h: &mut TestHost,
    lid: u8,
    numd_bytes: u64,
    sgl_len: u32,
    offset: u64,
) -> (Cqe, Vec<u8>) {
    let mut glp = GetLogPage::new(lid, 0xFFFF_FFFF, 4, offset).unwrap();
    glp.numd = (numd_bytes / 4 - 1) as u32;
    glp.sgl = SglDescriptor::transport(sgl_len);
    let cid = h.cid();
    h.command(AdminCommand::GetLogPage(glp).to_sqe(cid), None)
}

/// Issue 15, item 1: Get Log Page never allocates what NUMD asks for. 16
/// GiB with a 4 KiB SGL is Data SGL Length Invalid (the SGL must match
/// NUMD, as nvmet); 256 MiB with a matching SGL is beyond MDTS (Invalid
/// Field in Command), never a 256 MiB C2HData; a request up to MDTS for a
/// small page gets the page and zeros; an unaligned offset is Invalid
/// Field. The same on the discovery controller.
#[test]
fn get_log_page_is_bounded_by_the_page_and_mdts() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let mut io_ctrl = TestHost::bring_up(addr, false, false, 1);
    let mut disc = TestHost::connect(addr);
    disc.icreq(false, false);
    assert!(disc
        .connect_admin_as(DISCOVERY_NQN, HOST_NQN, 0)
        .status
        .is_success());
    disc.enable();
    for (on_disc, lid) in [
        (false, log_id::SMART_HEALTH),
        (false, log_id::ERROR_INFORMATION),
        (true, log_id::DISCOVERY),
    ] {
        let h = if on_disc { &mut disc } else { &mut io_ctrl };
        let (cqe, data) = get_log_page(h, lid, 16 << 30, 4096, 0);
        assert_eq!(
            cqe.status,
            Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
            "lid {lid:#x}"
        );
        assert!(data.is_empty());
        let (cqe, data) = get_log_page(h, lid, 256 << 20, 256 << 20, 0);
        assert_eq!(
            cqe.status,
            Status::INVALID_FIELD.with_dnr(),
            "lid {lid:#x}: beyond MDTS"
        );
        assert!(data.is_empty());
        let (cqe, data) = get_log_page(h, lid, 4096, 4096, 2);
        assert_eq!(
            cqe.status,
            Status::INVALID_FIELD.with_dnr(),
            "lid {lid:#x}: LPO not dword aligned"
        );
        assert!(data.is_empty());
        // MDTS (1 MiB) of a page of at most a few KiB: the page, then zeros.
        let (cqe, data) = get_log_page(h, lid, 1 << 20, 1 << 20, 0);
        assert!(cqe.status.is_success(), "lid {lid:#x}: {cqe:?}");
        assert_eq!(data.len(), 1 << 20);
        assert!(data[64 * 1024..].iter().all(|&b| b == 0));
        let (_, small) = get_log_page(h, lid, 512, 512, 0);
        assert_eq!(
            &data[..512],
            &small[..],
            "lid {lid:#x}: same bytes either way"
        );
    }
    // The discovery log's header is still readable piecewise.
    let (cqe, data) = get_log_page(&mut disc, log_id::DISCOVERY, 1024, 1024, 0);
    assert!(cqe.status.is_success());
    assert_eq!(
        u64::from_le_bytes(data[8..16].try_into().unwrap()),
        1,
        "one record"
    );
}

fn set_cc(h: &mut TestHost, cc: ControllerConfiguration) {
    let cid = h.cid();
    let (cqe, _) = h.command(
        PropertySet::new(property::CC, cc.to_u32() as u64).to_sqe(cid),
        None,
    );
    assert!(cqe.status.is_success());
}

fn csts(h: &mut TestHost) -> ControllerStatus {
    ControllerStatus::from_u32(h.property_get(property::CSTS) as u32)
}

/// NVMe Base 2.0, Controller Level Reset: CC.EN 1 -> 0 deletes the I/O
/// queues, so their connections close and serve nothing more; the admin
/// queue stays, and after enabling again the host connects new ones (the
/// same QIDs included).
#[test]
fn disabling_the_controller_closes_its_io_queues() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let (_bystander_admin, mut bystander) = io_queue(addr);
    let mut admin = TestHost::bring_up(addr, false, false, 2);
    let mut q1 = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let mut q2 = TestHost::connect_io(addr, admin.cntlid, 2, false, false);
    assert!(q1
        .write(1, 0, &pattern(4096, 8), BS, 8192)
        .status
        .is_success());
    let mut cc = ControllerConfiguration::from_u32(admin.property_get(property::CC) as u32);
    cc.enable = false;
    set_cc(&mut admin, cc);
    assert!(!csts(&mut admin).ready);
    for q in [&mut q1, &mut q2] {
        assert!(q.expect_termination().is_none(), "closed without a TermReq");
    }
    // Nothing else was affected.
    assert_target_healthy(addr, &mut bystander, 100);
    // Enable again: the admin queue still works, and queues reconnect.
    admin.enable();
    let mut q1 = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let (cqe, back) = q1.read(1, 0, 8, BS);
    assert!(cqe.status.is_success());
    assert_eq!(back, pattern(4096, 8));
}

/// CC.EN = 1 with I/O queue entry sizes other than 64/16 bytes (or a page
/// size or command set the controller does not offer) leaves the
/// controller not ready with CSTS.CFS set, as nvmet's `nvmet_start_ctrl`;
/// a correct enable after a disable works. A discovery controller has no
/// I/O queues and is not held to the entry sizes.
#[test]
fn enable_with_a_configuration_the_controller_cannot_run_fails() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let good = {
        let mut cc = ControllerConfiguration::from_u32(0);
        cc.enable = true;
        cc.iosqes = 6;
        cc.iocqes = 4;
        cc
    };
    let bad = [
        ControllerConfiguration { iosqes: 0, ..good },
        ControllerConfiguration { iocqes: 0, ..good },
        ControllerConfiguration { iosqes: 7, ..good },
        ControllerConfiguration { mps: 1, ..good },
        ControllerConfiguration { css: 7, ..good },
    ];
    for cc in bad {
        let mut h = TestHost::connect(addr);
        h.icreq(false, false);
        assert!(h
            .connect_admin_as(DEMO_NQN, HOST_NQN, 0)
            .status
            .is_success());
        set_cc(&mut h, cc);
        let s = csts(&mut h);
        assert!(!s.ready && s.fatal, "{cc:?}: {s:?}");
        let (cqe, _) = h.identify(cns::CONTROLLER, 0);
        assert_eq!(cqe.status, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
        // An I/O queue cannot join it.
        let (_, cqe) = TestHost::try_connect_io(addr, h.cntlid, 1, 32, HOST_ID);
        assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
        set_cc(&mut h, ControllerConfiguration::from_u32(0));
        set_cc(&mut h, good);
        let s = csts(&mut h);
        assert!(s.ready && !s.fatal, "a good enable after reset: {s:?}");
    }
    let mut d = TestHost::connect(addr);
    d.icreq(false, false);
    assert!(d
        .connect_admin_as(DISCOVERY_NQN, HOST_NQN, 0)
        .status
        .is_success());
    set_cc(
        &mut d,
        ControllerConfiguration {
            iosqes: 0,
            iocqes: 0,
            ..good
        },
    );
    assert!(
        csts(&mut d).ready,
        "a discovery controller ignores IOSQES/IOCQES"
    );
}

/// Connect data naming nobody: an empty HOSTNQN is Connect Invalid
/// Parameters pointing at HOSTNQN (byte 512), on an open subsystem and on
/// the discovery subsystem.
#[test]
fn connect_with_an_empty_host_nqn_is_refused() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    for subnqn in [DEMO_NQN, DISCOVERY_NQN] {
        let mut h = TestHost::connect(addr);
        h.icreq(false, false);
        let cqe = h.connect_admin_as(subnqn, "", 0);
        assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
        assert_eq!(
            ConnectInvalidParameter::from_dw0(cqe.dw0),
            ConnectInvalidParameter::Data(512)
        );
    }
    assert!(t.target().controllers().is_empty());
}

/// An I/O queue joins only the host that made the controller: the same
/// NQN with another host identifier is refused (Connect Invalid
/// Parameters, pointing at HOSTID), and the controller is not affected.
#[test]
fn io_connect_with_another_host_id_is_refused() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 2);
    let mut other = HOST_ID;
    other[15] ^= 1;
    let (_, cqe) = TestHost::try_connect_io(addr, admin.cntlid, 1, 32, other);
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS.with_dnr());
    assert_eq!(
        ConnectInvalidParameter::from_dw0(cqe.dw0),
        ConnectInvalidParameter::Data(0)
    );
    let (mut io, cqe) = TestHost::try_connect_io(addr, admin.cntlid, 1, 32, HOST_ID);
    assert!(
        cqe.status.is_success(),
        "the right host still joins queue 1"
    );
    assert!(io.read(1, 0, 1, BS).0.status.is_success());
}

/// A host that overruns its submission queue (more commands outstanding
/// than SQSIZE + 1) while not reading is closed, as Linux nvmet closes a
/// queue whose command pool runs out; other hosts are not affected.
#[test]
fn overrunning_the_submission_queue_closes_the_connection() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let (_bystander_admin, mut bystander) = io_queue(addr);
    let admin = TestHost::bring_up(addr, false, false, 1);
    let (mut h, cqe) = TestHost::try_connect_io(addr, admin.cntlid, 1, 2, HOST_ID);
    assert!(cqe.status.is_success());
    // 256 x 1 MiB reads on a 2-entry SQ, none of their data read: socket
    // buffers hold a few MiB, then completions stay outstanding.
    let mut bytes = Vec::new();
    for i in 0..256u16 {
        let sqe: Sqe = IoCommand::read(1, 0, 2048, 1 << 20).unwrap().to_sqe(i + 1);
        Pdu::CapsuleCmd(CapsuleCmd::new(sqe))
            .encode(&h.enc, &mut bytes)
            .unwrap();
    }
    // The target may close before all of it is sent.
    let _ = std::io::Write::write_all(&mut h.stream, &bytes);
    h.drain_until_closed(Duration::from_secs(20));
    assert_target_healthy(addr, &mut bystander, 200);
}
