//! Byte-level checks of NVMe and NVMe-oF structures against the offsets in
//! the specifications (Connect, Property Get/Set, Identify, logs).

use nvmf_proto::command::{cns, log_id, GetLogPage, Identify};
use nvmf_proto::fabrics::{
    connect_data_offset, property, Capabilities, Connect, ConnectData, ConnectInvalidParameter,
    ControllerConfiguration, PriorityClass, PropertyGet, PropertySet, Version, CNTLID_DYNAMIC,
};
use nvmf_proto::features::{Arbitration, AsyncEvent, KeepAliveTimer, NumberOfQueues};
use nvmf_proto::identify::{
    ActiveNamespaceList, IdentifyController, IdentifyNamespace, LbaFormat, NamespaceIdDescriptor,
};
use nvmf_proto::log_page::{
    copy_window, trtype, DiscoveryLogEntry, DiscoveryLogHeader, DiscoveryLogPage, ErrorLogEntry,
    SmartLog, VendorLogPage,
};
use nvmf_proto::{AdminCommand, FabricsCommand, ProtoError, Sqe, Status};

use crate::common::hex;

#[test]
fn connect_sqe_layout() {
    let mut connect = Connect::io(3, 128, PriorityClass::Medium);
    connect.cattr |= nvmf_proto::fabrics::connect_attr::DISABLE_SQ_FLOW_CONTROL;
    let bytes = connect.to_sqe(0x0A0B).to_bytes();
    let expected = hex("
        7F          // OPC: Fabrics
        40          // PSDT 01b
        0B 0A       // CID
        01          // FCTYPE: Connect
        00*19       // reserved
        00*8        // SGL1 address: offset 0
        00 04 00 00 // SGL1 length: 1024
        00 00 00    // reserved
        01          // SGL1: in-capsule (Data Block, Offset)
        00 00       // RECFMT: 0
        03 00       // QID: 3
        7F 00       // SQSIZE: 127 (0's based: 128 entries)
        06          // CATTR: priority class 10b (medium) | bit 2 disable SQ flow control
        00          // reserved
        00 00 00 00 // KATO: 0 on I/O queues
        00*12       // reserved
    ");
    assert_eq!(bytes.to_vec(), expected);
    let back = Connect::from_sqe(&Sqe::from_bytes(&bytes)).unwrap();
    assert_eq!(back.priority_class(), PriorityClass::Medium);
    assert!(back.sq_flow_control_disabled());
    assert_eq!(back.queue_depth(), 128);
}

#[test]
fn connect_data_layout_and_missing_nul() {
    let data = ConnectData {
        host_id: [0x11; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: "nqn.2024-01.io.example:sub".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
    };
    let b = data.to_bytes().unwrap();
    assert_eq!(&b[0..16], &[0x11; 16]);
    assert_eq!(&b[16..18], &[0xFF, 0xFF]);
    assert!(b[18..256].iter().all(|&x| x == 0));
    assert_eq!(&b[256..256 + 26], b"nqn.2024-01.io.example:sub");
    assert_eq!(b[256 + 26], 0);
    assert_eq!(&b[512..512 + 33], b"nqn.2014-08.org.nvmexpress:uuid:1");
    assert_eq!(ConnectData::from_bytes(&b).unwrap(), data);

    // HOSTNQN filling its whole field leaves no room for the NUL.
    let mut bad = b;
    bad[512..768].fill(b'a');
    match ConnectData::from_bytes(&bad) {
        Err(ProtoError::InvalidField { field, offset, .. }) => {
            assert_eq!(field, "HOSTNQN");
            assert_eq!(offset, connect_data_offset::HOSTNQN as usize);
        }
        other => panic!("expected InvalidField, got {other:?}"),
    }
    // Same for SUBNQN.
    let mut bad = b;
    bad[256..512].fill(b'n');
    assert!(matches!(
        ConnectData::from_bytes(&bad),
        Err(ProtoError::InvalidField { offset: 256, .. })
    ));
    // Too long to encode.
    let long = ConnectData {
        subnqn: "x".repeat(256),
        ..data
    };
    assert!(long.to_bytes().is_err());
    assert!(matches!(
        ConnectData::from_bytes(&b[..1000]),
        Err(ProtoError::Truncated { .. })
    ));
}

#[test]
fn connect_response_dw0() {
    assert_eq!(ConnectInvalidParameter::Data(512).to_dw0(), 0x0001_0200);
    assert_eq!(ConnectInvalidParameter::Command(44).to_dw0(), 44);
    assert_eq!(
        ConnectInvalidParameter::from_dw0(0x0001_0100),
        ConnectInvalidParameter::Data(256)
    );
    assert_eq!(nvmf_proto::fabrics::connect_success_dw0(5, 0), 5);
}

#[test]
fn property_get_and_set_layout() {
    let get = PropertyGet::new(property::CAP).to_sqe(2).to_bytes();
    assert_eq!(get[0], 0x7F);
    assert_eq!(get[4], 0x04, "FCTYPE Property Get");
    assert_eq!(get[40], 0x01, "ATTRIB: 8-byte access for CAP");
    assert_eq!(&get[44..48], &[0, 0, 0, 0], "OFST: CAP");

    let set = PropertySet::new(property::CC, 0x0046_0001)
        .to_sqe(3)
        .to_bytes();
    assert_eq!(set[4], 0x00, "FCTYPE Property Set");
    assert_eq!(set[40], 0x00, "ATTRIB: 4-byte access for CC");
    assert_eq!(&set[44..48], &[0x14, 0, 0, 0], "OFST: CC");
    assert_eq!(&set[48..56], &[0x01, 0, 0x46, 0, 0, 0, 0, 0], "VALUE");

    // ATTRIB size 2 is invalid.
    let mut bad = Sqe::from_bytes(&get);
    bad.cdw10 = 2;
    assert!(matches!(
        FabricsCommand::parse(&bad),
        Err(ProtoError::InvalidField { offset: 40, .. })
    ));
    assert!(matches!(
        AdminCommand::parse(&Sqe::from_bytes(&set)).unwrap(),
        AdminCommand::Fabrics(FabricsCommand::PropertySet(p)) if p.value == 0x0046_0001
    ));
}

#[test]
fn controller_registers() {
    let cc = ControllerConfiguration {
        enable: true,
        iosqes: 6,
        iocqes: 4,
        ams: 1,
        ..Default::default()
    };
    assert_eq!(cc.to_u32(), 0x0046_0801);
    assert_eq!(ControllerConfiguration::from_u32(0x0046_0801), cc);
    assert_eq!(Version::V1_3.to_u32(), 0x0001_0300);
    let cap = Capabilities {
        mqes: 127,
        cqr: true,
        ams: 1,
        timeout_500ms: 30,
        css: 1,
        ..Default::default()
    };
    // MQES 0x7F | CQR bit 16 | AMS bit 17 | TO 30 << 24 | CSS bit 37.
    assert_eq!(cap.to_u64(), 0x7F | 1 << 16 | 1 << 17 | 30 << 24 | 1 << 37);
    assert_eq!(Capabilities::from_u64(cap.to_u64()), cap);
}

#[test]
fn feature_dwords() {
    assert_eq!(NumberOfQueues::with_count(4).to_dword(), 0x0003_0003);
    let arb = Arbitration {
        burst: 3,
        low_weight: 1,
        medium_weight: 3,
        high_weight: 7,
    };
    assert_eq!(arb.to_dword(), 0x0703_0103);
    assert_eq!(KeepAliveTimer::from_dword(5000).kato_ms, 5000);
    let ev = AsyncEvent {
        event_type: 2,
        event_info: 0xF0,
        log_page_id: 0x70,
    };
    assert_eq!(ev.to_dw0(), 0x0070_F002);
}

#[test]
fn identify_and_get_log_page_sqe_layout() {
    let id = Identify::new(cns::CONTROLLER, 0).to_sqe(9).to_bytes();
    assert_eq!(id[0], 0x06);
    assert_eq!(id[40], 0x01, "CNS");
    assert_eq!(&id[32..36], &[0x00, 0x10, 0, 0], "SGL length 4096");
    assert_eq!(id[39], 0x5A);

    let glp = GetLogPage::new(log_id::DISCOVERY, 0, 4096, 1024).unwrap();
    let b = glp.to_sqe(1).to_bytes();
    assert_eq!(b[0], 0x02);
    assert_eq!(b[40], 0x70, "LID");
    // NUMDL: 4096 / 4 - 1 = 1023 in CDW10 bits 31:16.
    assert_eq!(&b[42..44], &[0xFF, 0x03]);
    assert_eq!(&b[48..52], &[0x00, 0x04, 0, 0], "LPOL: 1024");
    assert_eq!(GetLogPage::from_sqe(&Sqe::from_bytes(&b)).unwrap(), glp);
    assert_eq!(glp.data_len(), 4096);
}

#[test]
fn identify_controller_offsets() {
    let ctrl = IdentifyController {
        vid: 0x1B36,
        serial_number: "SN1".into(),
        model_number: "gimbal".into(),
        firmware_revision: "0.1".into(),
        mdts: 5,
        cntlid: 0x21,
        ver: Version::V1_4.to_u32(),
        sqes: 0x66,
        cqes: 0x44,
        maxcmd: 128,
        nn: 4,
        oncs: nvmf_proto::identify::oncs::DATASET_MANAGEMENT
            | nvmf_proto::identify::oncs::WRITE_ZEROES,
        vwc: 1,
        sgls: 1 | 1 << 20,
        subnqn: "nqn.2024-01.io.example:sub".into(),
        ioccsz: 4 + 512,
        iorcsz: 1,
        vendor_specific: vec![0xAB, 0xCD],
        ..Default::default()
    };
    let b = ctrl.to_bytes().unwrap();
    assert_eq!(&b[0..2], &[0x36, 0x1B], "VID");
    assert_eq!(&b[4..24], b"SN1                 ", "SN, space padded");
    assert_eq!(b[77], 5, "MDTS");
    assert_eq!(&b[78..80], &[0x21, 0], "CNTLID");
    assert_eq!(&b[80..84], &[0, 4, 1, 0], "VER 1.4.0");
    assert_eq!(b[512], 0x66, "SQES");
    assert_eq!(b[513], 0x44, "CQES");
    assert_eq!(&b[516..520], &[4, 0, 0, 0], "NN");
    assert_eq!(&b[520..522], &[0x0C, 0], "ONCS: DSM | Write Zeroes");
    assert_eq!(b[525], 1, "VWC");
    assert_eq!(&b[536..540], &[1, 0, 0x10, 0], "SGLS");
    assert_eq!(&b[768..772], b"nqn.", "SUBNQN");
    assert_eq!(&b[1792..1796], &[0x04, 0x02, 0, 0], "IOCCSZ 516");
    assert_eq!(&b[1796..1800], &[1, 0, 0, 0], "IORCSZ");
    assert_eq!(&b[3072..3074], &[0xAB, 0xCD], "vendor specific");
    assert_eq!(IdentifyController::from_bytes(&b[..]).unwrap(), ctrl);
    assert_eq!(ctrl.max_in_capsule_data(), 8192);
}

#[test]
fn identify_namespace_offsets() {
    let ns = IdentifyNamespace {
        nsze: 0x1_0000,
        ncap: 0x1_0000,
        nuse: 0x10,
        flbas: 1,
        nguid: [7; 16],
        eui64: [9; 8],
        lba_formats: vec![
            LbaFormat::with_block_shift(9),
            LbaFormat::with_block_shift(12),
        ],
        ..Default::default()
    };
    let b = ns.to_bytes().unwrap();
    assert_eq!(&b[0..8], &[0, 0, 1, 0, 0, 0, 0, 0], "NSZE");
    assert_eq!(b[25], 1, "NLBAF: 2 formats, 0's based");
    assert_eq!(b[26], 1, "FLBAS");
    assert_eq!(&b[104..120], &[7; 16], "NGUID");
    assert_eq!(&b[120..128], &[9; 8], "EUI64");
    assert_eq!(&b[128..136], &[0, 0, 9, 0, 0, 0, 12, 0], "LBAF0, LBAF1");
    let back = IdentifyNamespace::from_bytes(&b[..]).unwrap();
    assert_eq!(back, ns);
    assert_eq!(back.block_size(), Some(4096));
}

#[test]
fn namespace_lists() {
    let list = ActiveNamespaceList {
        nsids: vec![1, 2, 10],
    };
    let b = list.to_bytes().unwrap();
    assert_eq!(&b[0..12], &[1, 0, 0, 0, 2, 0, 0, 0, 10, 0, 0, 0]);
    assert_eq!(ActiveNamespaceList::from_bytes(&b[..]).unwrap(), list);

    let descs = vec![
        NamespaceIdDescriptor::Nguid([3; 16]),
        NamespaceIdDescriptor::Csi(0),
    ];
    let b = NamespaceIdDescriptor::encode_list(&descs).unwrap();
    assert_eq!(&b[0..4], &[0x02, 16, 0, 0], "NIDT NGUID, NIDL 16");
    assert_eq!(&b[20..25], &[0x04, 1, 0, 0, 0], "NIDT CSI, NIDL 1, CSI NVM");
    assert_eq!(NamespaceIdDescriptor::decode_list(&b[..]).unwrap(), descs);

    // A UUID descriptor with the wrong length is rejected.
    let mut bad = b;
    bad[0] = 0x03;
    bad[1] = 8;
    assert!(NamespaceIdDescriptor::decode_list(&bad[..]).is_err());
}

#[test]
fn discovery_log_layout() {
    let entry = DiscoveryLogEntry {
        trtype: trtype::TCP,
        adrfam: 1,
        subtype: 2,
        treq: 0,
        portid: 1,
        cntlid: 0xFFFF,
        asqsz: 32,
        eflags: 0,
        trsvcid: "4420".into(),
        subnqn: "nqn.2024-01.io.example:sub".into(),
        traddr: "127.0.0.1".into(),
        tcp_sectype: 0,
    };
    let page = DiscoveryLogPage {
        genctr: 7,
        recfmt: 0,
        entries: vec![entry.clone()],
    };
    let b = page.to_bytes().unwrap();
    assert_eq!(b.len(), 2048);
    assert_eq!(&b[0..8], &[7, 0, 0, 0, 0, 0, 0, 0], "GENCTR");
    assert_eq!(&b[8..16], &[1, 0, 0, 0, 0, 0, 0, 0], "NUMREC");
    let e = &b[1024..];
    assert_eq!(
        &e[0..4],
        &[3, 1, 2, 0],
        "TRTYPE TCP, ADRFAM IPv4, SUBTYPE NVMe, TREQ"
    );
    assert_eq!(
        &e[4..10],
        &[1, 0, 0xFF, 0xFF, 32, 0],
        "PORTID, CNTLID, ASQSZ"
    );
    assert_eq!(&e[32..38], b"4420  ", "TRSVCID, space padded");
    assert_eq!(&e[256..260], b"nqn.", "SUBNQN");
    assert_eq!(&e[512..522], b"127.0.0.1 ", "TRADDR, space padded");
    assert_eq!(DiscoveryLogPage::from_bytes(&b).unwrap(), page);

    // NUL padding (Linux nvmet) reads the same.
    let mut nul_padded = b.clone();
    nul_padded[1024 + 36..1024 + 64].fill(0);
    nul_padded[1024 + 521..1024 + 768].fill(0);
    assert_eq!(DiscoveryLogPage::from_bytes(&nul_padded).unwrap(), page);

    // NUMREC larger than the buffer is an error, not an allocation.
    let mut lying = b.clone();
    lying[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        DiscoveryLogPage::from_bytes(&lying),
        Err(ProtoError::Truncated { .. })
    ));
    let header = DiscoveryLogHeader::from_bytes(&b[..18]).unwrap();
    assert_eq!(header.numrec, 1);
    assert_eq!(header.page_len(), Some(2048));
}

#[test]
fn error_and_smart_logs() {
    let e = ErrorLogEntry {
        error_count: 1,
        sqid: 2,
        cid: 3,
        status: Status::INVALID_FIELD.with_dnr(),
        parameter_error_location: 40,
        ..Default::default()
    };
    let b = e.to_bytes();
    assert_eq!(&b[12..14], &[0x04, 0x80], "status field: SC 02h << 1, DNR");
    assert_eq!(ErrorLogEntry::from_bytes(&b).unwrap(), e);
    let s = SmartLog {
        composite_temperature: 300,
        data_units_read: 5,
        ..Default::default()
    };
    let b = s.to_bytes();
    assert_eq!(&b[1..3], &[0x2C, 0x01]);
    assert_eq!(b[32], 5);
    assert_eq!(SmartLog::from_bytes(&b).unwrap(), s);
}

#[test]
fn log_windows_and_vendor_page() {
    let page = VendorLogPage::new(log_id::GIMBAL_VIRTUAL_VIEW, vec![1, 2, 3, 4, 5]).unwrap();
    let mut out = [0xEE; 4];
    page.read(3, &mut out);
    assert_eq!(out, [4, 5, 0, 0]);
    copy_window(&[1, 2], u64::MAX, &mut out);
    assert_eq!(out, [0; 4]);
    assert!(VendorLogPage::new(0x02, vec![]).is_err());
}
