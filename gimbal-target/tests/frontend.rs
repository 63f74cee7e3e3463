//! The target from the wire: bring-up, identify, data paths (in-capsule,
//! R2T, MDTS), digests, discovery, keep-alive and persistence.

mod support;

use nvmf_proto::command::{cns, log_id, AdminCommand, DsmRange, GetLogPage, IoCommand};
use nvmf_proto::fabrics::{property, Capabilities, DISCOVERY_NQN};
use nvmf_proto::identify::{ActiveNamespaceList, IdentifyNamespace, NamespaceIdDescriptor};
use nvmf_proto::log_page::DiscoveryLogPage;
use nvmf_proto::{SglDescriptor, Status};
use support::*;

const BS: u32 = 512;

#[test]
fn bring_up_and_identify_match_the_config() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let mut h = TestHost::bring_up(addr, false, false, 4);
    let cap = Capabilities::from_u64(h.property_get(property::CAP));
    assert!(cap.mqes >= 31);
    assert_eq!(cap.css & 1, 1, "NVM command set");
    assert_eq!(h.property_get(property::VS), 0x0001_0400);

    let id = h.identify_controller();
    assert_eq!(id.subnqn, DEMO_NQN);
    assert_eq!(id.model_number, "gimbal-target demo");
    assert_eq!(id.cntlid, h.cntlid);
    assert_eq!(id.mdts, 8, "1 MiB in 4 KiB pages");
    assert_eq!(id.max_in_capsule_data(), 8192);
    assert_eq!(id.nn, 1);
    assert!(id.kas > 0);

    let (cqe, data) = h.identify(cns::NAMESPACE, 1);
    assert!(cqe.status.is_success());
    let ns = IdentifyNamespace::from_bytes(&data).unwrap();
    assert_eq!(ns.nsze, (256 << 20) / BS as u64);
    assert_eq!(ns.block_size(), Some(BS as u64));
    assert_eq!(ns.dlfeat & 0b111, 0b001, "deallocated blocks read zeros");

    let (_, data) = h.identify(cns::ACTIVE_NAMESPACE_LIST, 0);
    assert_eq!(
        ActiveNamespaceList::from_bytes(&data).unwrap().nsids,
        vec![1]
    );
    let (_, data) = h.identify(cns::NAMESPACE_ID_DESCRIPTORS, 1);
    let descs = NamespaceIdDescriptor::decode_list(&data).unwrap();
    assert!(descs
        .iter()
        .any(|d| matches!(d, NamespaceIdDescriptor::Nguid(_))));

    let (cqe, _) = h.identify(cns::NAMESPACE, 9);
    assert_eq!(cqe.status, Status::INVALID_NAMESPACE.with_dnr());
}

fn data_paths(hdgst: bool, ddgst: bool) {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, hdgst, ddgst, 2);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, hdgst, ddgst);
    // In-capsule (4 KiB, 8 KiB), R2T with one and several H2CData PDUs
    // (128 KiB = MAXH2CDATA, 1 MiB = MDTS).
    for (i, len) in [4096usize, 8192, 128 * 1024, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let slba = (i as u64) * 4096;
        let data = pattern(len, i as u32);
        let cqe = io.write(1, slba, &data, BS, 8192);
        assert!(cqe.status.is_success(), "write {len}: {cqe:?}");
        let (cqe, back) = io.read(1, slba, (len / BS as usize) as u32, BS);
        assert!(cqe.status.is_success(), "read {len}: {cqe:?}");
        assert!(back == data, "read back differs for {len} bytes");
    }
    // Past MDTS: refused, not split by the target.
    let cid = io.cid();
    let big = IoCommand::read(1, 0, 4096, 2 << 20).unwrap();
    let (cqe, _) = io.command(big.to_sqe(cid), None);
    assert_eq!(cqe.status, Status::INVALID_FIELD.with_dnr());
    // Past the end of the namespace.
    let last = (256 << 20) / BS as u64;
    let (cqe, _) = io.read(1, last - 1, 2, BS);
    assert_eq!(cqe.status, Status::LBA_OUT_OF_RANGE.with_dnr());
    let (cqe, _) = io.read(7, 0, 1, BS);
    assert_eq!(cqe.status, Status::INVALID_NAMESPACE.with_dnr());
    // Flush, for one namespace and for all.
    for nsid in [1, 0xFFFF_FFFF] {
        let cid = io.cid();
        let (cqe, _) = io.command(IoCommand::Flush { nsid }.to_sqe(cid), None);
        assert!(cqe.status.is_success());
    }
}

#[test]
fn data_paths_without_digests() {
    data_paths(false, false);
}

#[test]
fn data_paths_with_header_and_data_digests() {
    data_paths(true, true);
}

/// Write data that reaches the target a piece at a time: an H2CData
/// header alone, then its data in uneven pieces, the next PDU's header
/// with the first bytes of its data, and so on. The bytes must land
/// exactly as if each PDU had come whole, with and without digests.
fn h2c_data_in_pieces(hdgst: bool, ddgst: bool) {
    use nvmf_proto::pdu::{CapsuleCmd, H2CData, Pdu};
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, hdgst, ddgst, 2);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, hdgst, ddgst);
    let piece = io.maxh2cdata as usize;
    // Cut points within each PDU's bytes: the header alone, a little of
    // the data, a piece of a receive's size, the rest; and a PDU split
    // once, 3,000 bytes before its end.
    let cuts: [&[usize]; 3] = [&[24, 1000, 40_000], &[60, 70_001], &[piece + 24 - 3000]];
    for (i, len) in [2 * piece, 3 * piece, 64 * 1024].into_iter().enumerate() {
        let slba = (i as u64) * 4096;
        let data = pattern(len, 100 + i as u32);
        let cid = io.cid();
        let w = IoCommand::write(
            1,
            slba,
            (len / BS as usize) as u32,
            SglDescriptor::transport(len as u32),
        )
        .unwrap();
        io.send(&Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(cid))));
        let Pdu::R2T(r2t) = io.recv() else {
            panic!("expected R2T")
        };
        let mut wire = Vec::new();
        let mut starts = Vec::new();
        for off in (0..len).step_by(piece) {
            let n = piece.min(len - off);
            starts.push(wire.len());
            let pdu = Pdu::H2CData(H2CData {
                cccid: cid,
                ttag: r2t.ttag,
                datao: off as u32,
                last: off + n == len,
                data: data[off..off + n].to_vec().into(),
            });
            wire.extend_from_slice(&pdu.to_vec(&io.enc).unwrap());
        }
        // Each PDU sent in the pieces of its cut points (the last piece
        // of one PDU going out with the first of the next).
        let mut sent = 0;
        for (k, &at) in starts.iter().enumerate() {
            for &c in cuts[(i + k) % cuts.len()] {
                let to = (at + c).min(wire.len());
                if to > sent {
                    io.send_raw(&wire[sent..to]);
                    sent = to;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
        io.send_raw(&wire[sent..]);
        let (cqe, _) = io.gather(cid);
        assert!(cqe.status.is_success(), "write {len}: {cqe:?}");
        let (cqe, back) = io.read(1, slba, (len / BS as usize) as u32, BS);
        assert!(cqe.status.is_success(), "read {len}: {cqe:?}");
        assert!(back == data, "read back differs for {len} bytes");
    }
}

#[test]
fn h2c_data_arriving_in_pieces_lands_intact() {
    h2c_data_in_pieces(false, false);
}

#[test]
fn h2c_data_arriving_in_pieces_lands_intact_with_digests() {
    h2c_data_in_pieces(true, false);
    h2c_data_in_pieces(true, true);
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeros() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let data = pattern(64 * 1024, 3);
    assert!(io.write(1, 0, &data, BS, 8192).status.is_success());
    assert!(io.write(1, 1000, &data, BS, 8192).status.is_success());

    let wz = IoCommand::WriteZeroes(nvmf_proto::command::WriteZeroes {
        nsid: 1,
        slba: 8,
        nlb: 7,
        deallocate: false,
        fua: false,
        limited_retry: false,
    });
    let cid = io.cid();
    assert!(io.command(wz.to_sqe(cid), None).0.status.is_success());
    let (_, back) = io.read(1, 0, 128, BS);
    assert_eq!(&back[..4096], &data[..4096]);
    assert!(back[4096..8192].iter().all(|&b| b == 0));
    assert_eq!(&back[8192..], &data[8192..]);

    let ranges = DsmRange::encode_list(&[DsmRange {
        context_attributes: 0,
        block_count: 128,
        slba: 1000,
    }])
    .unwrap();
    let dsm = IoCommand::DatasetManagement(nvmf_proto::command::DatasetManagement {
        nsid: 1,
        nr: 0,
        attributes: nvmf_proto::command::dsm_attr::DEALLOCATE,
        sgl: SglDescriptor::in_capsule(0, ranges.len() as u32),
    });
    let cid = io.cid();
    assert!(io
        .command(dsm.to_sqe(cid), Some(&ranges))
        .0
        .status
        .is_success());
    let (_, back) = io.read(1, 1000, 128, BS);
    assert!(
        back.iter().all(|&b| b == 0),
        "deallocated range reads zeros"
    );
}

#[test]
fn discovery_lists_allowed_subsystems_only() {
    let t = start_target(
        r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:open"
allow_any_host = true
[[subsystem.namespace]]
backend = "null"
size = "1MiB"
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:closed"
allowed_hosts = ["nqn.2026-01.io.gimbal:someone-else"]
[[subsystem.namespace]]
backend = "null"
size = "1MiB"
"#,
    );
    let addr = t.local_addrs()[0];
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let cqe = h.connect_admin_as(DISCOVERY_NQN, HOST_NQN, 0);
    assert!(cqe.status.is_success(), "{cqe:?}");
    // Like any controller, it answers only once enabled.
    let (cqe, _) = h.identify(cns::CONTROLLER, 0);
    assert_eq!(cqe.status, Status::COMMAND_SEQUENCE_ERROR.with_dnr());
    h.enable();
    let id = h.identify_controller();
    assert_eq!(
        id.cntrltype,
        nvmf_proto::identify::controller_type::DISCOVERY
    );
    let cid = h.cid();
    let glp = GetLogPage::new(log_id::DISCOVERY, 0, 4096, 0).unwrap();
    let (cqe, data) = h.command(AdminCommand::GetLogPage(glp).to_sqe(cid), None);
    assert!(cqe.status.is_success());
    let page = DiscoveryLogPage::from_bytes(&data).unwrap();
    assert_eq!(page.entries.len(), 1);
    let e = &page.entries[0];
    assert_eq!(e.subnqn, "nqn.2026-01.io.gimbal:open");
    assert_eq!(e.traddr, "127.0.0.1");
    assert_eq!(e.trsvcid, addr.port().to_string());
    // A discovery controller has no namespaces.
    let (cqe, _) = h.identify(cns::NAMESPACE, 1);
    assert!(!cqe.status.is_success());
}

#[test]
fn silent_host_is_torn_down_after_keep_alive_timeout() {
    let t = start_target(
        r#"
listen = ["127.0.0.1:0"]
[keep_alive]
min_ms = 200
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
backend = "ram"
size = "1MiB"
"#,
    );
    let addr = t.local_addrs()[0];
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    assert!(h
        .connect_admin_as(DEMO_NQN, HOST_NQN, 300)
        .status
        .is_success());
    // Say nothing: the target must close the admin queue on its own (the
    // test host's read timeout, 10 s, bounds the wait).
    assert!(
        h.expect_termination().is_none(),
        "a plain close, no TermReq"
    );
    assert!(t.target().controllers().is_empty());
}

#[test]
fn active_host_with_keep_alives_stays_connected() {
    let t = start_target(
        r#"
listen = ["127.0.0.1:0"]
[keep_alive]
min_ms = 200
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
"#,
    );
    let addr = t.local_addrs()[0];
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    assert!(h
        .connect_admin_as(DEMO_NQN, HOST_NQN, 300)
        .status
        .is_success());
    for _ in 0..8 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let cid = h.cid();
        let (cqe, _) = h.command(AdminCommand::KeepAlive.to_sqe(cid), None);
        assert!(cqe.status.is_success());
    }
    assert_eq!(t.target().controllers().len(), 1);
}

#[test]
fn file_backend_data_survives_target_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
backend = "file"
path = "{}"
size = "8MiB"
block_size = 4096
"#,
        dir.path().join("ns.img").display()
    );
    let data = pattern(256 * 1024, 9);
    {
        let t = start_target(&cfg);
        let addr = t.local_addrs()[0];
        let admin = TestHost::bring_up(addr, false, false, 1);
        let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
        assert!(io.write(1, 16, &data, 4096, 8192).status.is_success());
        // No flush from the host: the target's shutdown flushes.
        t.shutdown();
    }
    let t = start_target(&cfg);
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let (cqe, back) = io.read(1, 16, 64, 4096);
    assert!(cqe.status.is_success());
    assert!(back == data);
}

#[test]
fn many_queues_and_hosts_at_once() {
    let t = demo_target();
    let addr = t.local_addrs()[0];
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            std::thread::spawn(move || {
                let admin = TestHost::bring_up(addr, i % 2 == 0, false, 2);
                let mut q1 = TestHost::connect_io(addr, admin.cntlid, 1, i % 2 == 0, false);
                let mut q2 = TestHost::connect_io(addr, admin.cntlid, 2, i % 2 == 0, false);
                for round in 0..20u32 {
                    let slba = (i as u64 * 100 + round as u64) * 64;
                    let data = pattern(32 * 1024, i * 1000 + round);
                    let q = if round % 2 == 0 { &mut q1 } else { &mut q2 };
                    assert!(q.write(1, slba, &data, BS, 8192).status.is_success());
                    let (_, back) = q.read(1, slba, 64, BS);
                    assert!(back == data);
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
}
