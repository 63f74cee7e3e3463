//! Property tests: encode then decode gives back the same value, for every
//! PDU type under random digest/alignment settings, and for SQE/CQE,
//! typed commands, Identify and discovery structures. Case counts are kept
//! small: the whole crate's tests must stay fast on a 2-core CI machine.

use std::borrow::Cow;

use proptest::prelude::*;

use nvmf_proto::command::{
    DatasetManagement, DsmRange, GetFeatures, GetLogPage, Identify, ReadWrite, SetFeatures,
    WriteZeroes,
};
use nvmf_proto::fabrics::{
    Connect, ConnectData, Disconnect, PropertyGet, PropertySet, PropertySize,
};
use nvmf_proto::identify::{
    ActiveNamespaceList, IdentifyController, IdentifyNamespace, LbaFormat, NamespaceIdDescriptor,
};
use nvmf_proto::log_page::{DiscoveryLogEntry, DiscoveryLogPage, ErrorLogEntry, SmartLog};
use nvmf_proto::{
    AdminCommand, C2HData, CapsuleCmd, CapsuleResp, Cqe, Decoded, DecoderConfig, EncodeConfig,
    FabricsCommand, FatalErrorStatus, H2CData, IcReq, IcResp, IoCommand, Pdu, PduDecoder, Role,
    SglDescriptor, Sqe, Status, TermReq, R2T,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    }
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..=max)
}

fn nonempty_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..=max)
}

/// Printable ASCII without spaces: survives space padding and trimming.
fn ascii(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(0x21u8..0x7F, 0..=max).prop_map(|v| String::from_utf8(v).unwrap())
}

pub fn arb_sqe() -> impl Strategy<Value = Sqe> {
    prop::array::uniform32(any::<u8>())
        .prop_flat_map(|a| prop::array::uniform32(any::<u8>()).prop_map(move |b| (a, b)))
        .prop_map(|(a, b)| {
            let mut raw = [0u8; 64];
            raw[..32].copy_from_slice(&a);
            raw[32..].copy_from_slice(&b);
            Sqe::from_bytes(&raw)
        })
}

pub fn arb_cqe() -> impl Strategy<Value = Cqe> {
    prop::array::uniform16(any::<u8>()).prop_map(|b| Cqe::from_bytes(&b))
}

fn arb_term(max: usize) -> impl Strategy<Value = TermReq<'static>> {
    (any::<u16>(), any::<u32>(), bytes(max)).prop_map(|(fes, fei, data)| TermReq {
        fes: FatalErrorStatus(fes),
        fei,
        data: Cow::Owned(data),
    })
}

/// Any PDU a host may send (received by a controller).
pub fn arb_h2c_pdu() -> impl Strategy<Value = Pdu<'static>> {
    prop_oneof![
        (0u8..=31, any::<bool>(), any::<bool>(), any::<u32>()).prop_map(|(hpda, h, d, maxr2t)| {
            Pdu::IcReq(IcReq {
                hpda,
                header_digest: h,
                data_digest: d,
                maxr2t,
            })
        }),
        arb_term(128).prop_map(Pdu::H2CTermReq),
        (arb_sqe(), bytes(300)).prop_map(|(sqe, data)| Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: Cow::Owned(data)
        })),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            nonempty_bytes(300)
        )
            .prop_map(|(cccid, ttag, datao, last, data)| Pdu::H2CData(H2CData {
                cccid,
                ttag,
                datao,
                last,
                data: Cow::Owned(data),
            })),
    ]
}

/// Any PDU a controller may send (received by a host).
pub fn arb_c2h_pdu() -> impl Strategy<Value = Pdu<'static>> {
    prop_oneof![
        (
            0u8..=31,
            any::<bool>(),
            any::<bool>(),
            1024u32..=u32::MAX / 4
        )
            .prop_map(|(cpda, h, d, m)| Pdu::IcResp(IcResp {
                cpda,
                header_digest: h,
                data_digest: d,
                maxh2cdata: m * 4,
            })),
        arb_term(128).prop_map(Pdu::C2HTermReq),
        arb_cqe().prop_map(|cqe| Pdu::CapsuleResp(CapsuleResp { cqe })),
        (
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            any::<bool>(),
            nonempty_bytes(300)
        )
            .prop_map(|(cccid, datao, last, success, data)| Pdu::C2HData(C2HData {
                cccid,
                datao,
                last: last || success,
                success,
                data: Cow::Owned(data),
            })),
        (any::<u16>(), any::<u16>(), any::<u32>(), 1u32..).prop_map(|(cccid, ttag, r2to, r2tl)| {
            Pdu::R2T(R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            })
        }),
    ]
}

pub fn arb_link() -> impl Strategy<Value = (bool, bool, u8)> {
    (any::<bool>(), any::<bool>(), 0u8..=31)
}

fn roundtrip(pdu: &Pdu<'_>, receiver: Role, (h, d, pda): (bool, bool, u8)) {
    let enc = EncodeConfig {
        header_digest: h,
        data_digest: d,
        tx_pda: pda,
    };
    let wire = pdu.to_vec(&enc).unwrap();
    let dec = PduDecoder::new(DecoderConfig {
        role: receiver,
        header_digest: h,
        data_digest: d,
        rx_pda: pda,
        max_data_len: 1 << 20,
    });
    match dec.decode(&wire) {
        Ok(Decoded::Pdu {
            pdu: back,
            consumed,
        }) => {
            assert_eq!(consumed, wire.len());
            assert_eq!(&back, pdu);
        }
        other => panic!("{pdu:?} encoded as {wire:02x?} decoded to {other:?}"),
    }
    // Every proper prefix asks for more bytes, never errors.
    for cut in [0, 1, 7, 8, wire.len() / 2, wire.len() - 1] {
        if cut < wire.len() {
            assert!(
                matches!(dec.decode(&wire[..cut]), Ok(Decoded::NeedMore(n)) if n > 0),
                "prefix {cut} of {pdu:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn h2c_pdus_roundtrip(pdu in arb_h2c_pdu(), link in arb_link()) {
        roundtrip(&pdu, Role::Controller, link);
    }

    #[test]
    fn c2h_pdus_roundtrip(pdu in arb_c2h_pdu(), link in arb_link()) {
        roundtrip(&pdu, Role::Host, link);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sqe_bytes_roundtrip(sqe in arb_sqe()) {
        prop_assert_eq!(Sqe::from_bytes(&sqe.to_bytes()), sqe);
    }

    #[test]
    fn cqe_bytes_roundtrip(raw in prop::array::uniform16(any::<u8>())) {
        prop_assert_eq!(Cqe::from_bytes(&raw).to_bytes(), raw);
    }

    #[test]
    fn status_field_roundtrip(field in any::<u16>()) {
        let s = Status::from_field(field);
        prop_assert_eq!(s.to_field(), field & !1);
    }

    #[test]
    fn any_sqe_parses_without_panic(sqe in arb_sqe()) {
        let _ = AdminCommand::parse(&sqe);
        let _ = IoCommand::parse(&sqe);
        let _ = sqe.dptr.kind();
    }

    #[test]
    fn io_commands_roundtrip(
        cid in any::<u16>(), nsid in any::<u32>(), slba in any::<u64>(), nlb in any::<u16>(),
        dtype in 0u8..16, prinfo in 0u8..16, fua in any::<bool>(), lr in any::<bool>(),
        dsm in any::<u8>(), dspec in any::<u16>(), len in any::<u32>(), dealloc in any::<bool>(),
        nr in any::<u8>(), attrs in any::<u32>(), which in 0..5u8,
    ) {
        let rw = ReadWrite {
            nsid, slba, nlb, dtype, prinfo, fua, limited_retry: lr, dsm, dspec,
            sgl: SglDescriptor::transport(len),
        };
        let cmd = match which {
            0 => IoCommand::Read(rw),
            1 => IoCommand::Write(ReadWrite { sgl: SglDescriptor::in_capsule(0, len), ..rw }),
            2 => IoCommand::Flush { nsid },
            3 => IoCommand::WriteZeroes(WriteZeroes {
                nsid, slba, nlb, deallocate: dealloc, fua, limited_retry: lr,
            }),
            _ => IoCommand::DatasetManagement(DatasetManagement {
                nsid, nr, attributes: attrs, sgl: SglDescriptor::transport(len),
            }),
        };
        let sqe = cmd.to_sqe(cid);
        prop_assert_eq!(sqe.cid, cid);
        prop_assert_eq!(IoCommand::parse(&Sqe::from_bytes(&sqe.to_bytes())).unwrap(), cmd);
    }

    #[test]
    fn admin_commands_roundtrip(
        cid in any::<u16>(), nsid in any::<u32>(), b8 in any::<u8>(), w16 in any::<u16>(),
        w32 in any::<u32>(), w64 in any::<u64>(), flag in any::<bool>(), which in 0..10u8,
    ) {
        let cmd = match which {
            0 => AdminCommand::Identify(Identify {
                nsid, cns: b8, cntid: w16, cns_specific_id: w16 ^ 1, csi: b8 ^ 3,
                sgl: SglDescriptor::transport(w32),
            }),
            1 => AdminCommand::GetLogPage(GetLogPage {
                nsid, lid: b8, lsp: b8 & 0x7F, rae: flag, numd: w32, lsi: w16, offset: w64,
                uuid_index: b8 & 0x7F, offset_is_index: !flag, csi: b8 ^ 0x55,
                sgl: SglDescriptor::transport(w32),
            }),
            2 => AdminCommand::SetFeatures(SetFeatures {
                nsid, fid: b8, save: flag, cdw11: w32, cdw12: !w32, sgl: SglDescriptor::null(),
            }),
            3 => AdminCommand::GetFeatures(GetFeatures {
                nsid, fid: b8, select: b8 & 7, cdw11: w32, sgl: SglDescriptor::null(),
            }),
            4 => AdminCommand::KeepAlive,
            5 => AdminCommand::AsyncEventRequest,
            6 => AdminCommand::Fabrics(FabricsCommand::Connect(Connect {
                recfmt: w16 ^ 0xFF, qid: w16, sqsize: w16.rotate_left(3), cattr: b8, kato_ms: w32,
                sgl: SglDescriptor::in_capsule(0, 1024),
            })),
            7 => AdminCommand::Fabrics(FabricsCommand::PropertyGet(PropertyGet {
                size: if flag { PropertySize::Eight } else { PropertySize::Four }, offset: w32,
            })),
            8 => AdminCommand::Fabrics(FabricsCommand::PropertySet(PropertySet {
                size: if flag { PropertySize::Eight } else { PropertySize::Four },
                offset: w32, value: w64,
            })),
            _ => AdminCommand::Fabrics(FabricsCommand::Disconnect(Disconnect { recfmt: w16 })),
        };
        let sqe = Sqe::from_bytes(&cmd.to_sqe(cid).to_bytes());
        prop_assert_eq!(sqe.cid, cid);
        prop_assert_eq!(AdminCommand::parse(&sqe).unwrap(), cmd);
    }

    #[test]
    fn connect_data_roundtrip(
        host_id in prop::array::uniform16(any::<u8>()), cntlid in any::<u16>(),
        subnqn in ascii(255), hostnqn in ascii(255),
    ) {
        let d = ConnectData { host_id, cntlid, subnqn, hostnqn };
        prop_assert_eq!(ConnectData::from_bytes(&d.to_bytes().unwrap()).unwrap(), d);
    }

    #[test]
    fn dsm_ranges_roundtrip(ranges in prop::collection::vec(
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(c, n, s)| DsmRange {
            context_attributes: c, block_count: n, slba: s,
        }), 1..=20)
    ) {
        let b = DsmRange::encode_list(&ranges).unwrap();
        prop_assert_eq!(b.len(), ranges.len() * 16);
        prop_assert_eq!(DsmRange::decode_list(&b, ranges.len()).unwrap(), ranges);
    }

    #[test]
    fn identify_controller_roundtrip(
        sn in ascii(20), mn in ascii(40), fr in ascii(8), subnqn in ascii(200),
        words in prop::array::uniform16(any::<u32>()), vs in bytes(1024),
    ) {
        let mut vs = vs;
        while vs.last() == Some(&0) { vs.pop(); }
        let w = |i: usize| words[i];
        let c = IdentifyController {
            vid: w(0) as u16, ssvid: (w(0) >> 16) as u16,
            serial_number: sn, model_number: mn, firmware_revision: fr,
            rab: w(1) as u8, ieee: [w(1) as u8, (w(1) >> 8) as u8, 3], cmic: 1,
            mdts: (w(1) >> 16) as u8, cntlid: w(2) as u16, ver: w(3), rtd3r: w(4), rtd3e: w(5),
            oaes: w(6), ctratt: w(7), cntrltype: 1, fguid: [w(8) as u8; 16],
            crdt: [w(9) as u16, (w(9) >> 16) as u16, 7], oacs: w(10) as u16,
            acl: 3, aerl: 4, frmw: 5, lpa: 6, elpe: 7, npss: 0, avscc: 1, apsta: 0,
            wctemp: 350, cctemp: 370, kas: w(11) as u16, sqes: 0x66, cqes: 0x44,
            maxcmd: w(12) as u16, nn: w(13), oncs: w(14) as u16, fuses: 0, fna: 0, vwc: 1,
            awun: 1, awupf: 2, nvscc: 1, nwpc: 0, acwu: 0, sgls: w(15), mnan: 0, subnqn,
            ioccsz: w(0), iorcsz: 1, icdoff: 0, fcatt: 0, msdbd: 1, ofcs: 0,
            vendor_specific: vs,
        };
        let b = c.to_bytes().unwrap();
        prop_assert_eq!(IdentifyController::from_bytes(&b[..]).unwrap(), c);
    }

    #[test]
    fn identify_namespace_roundtrip(
        sizes in prop::array::uniform3(any::<u64>()), flbas in 0u8..0x80,
        formats in prop::collection::vec((any::<u16>(), any::<u8>(), 0u8..4), 1..=64),
        nguid in prop::array::uniform16(any::<u8>()), cap in any::<u128>(),
    ) {
        let ns = IdentifyNamespace {
            nsze: sizes[0], ncap: sizes[1], nuse: sizes[2], flbas, nguid, nvmcap: cap,
            lba_formats: formats.into_iter().map(|(m, d, r)| LbaFormat {
                metadata_size: m, lbads: d, relative_performance: r,
            }).collect(),
            anagrpid: 1, nsattr: 0, dlfeat: 1, ..Default::default()
        };
        let b = ns.to_bytes().unwrap();
        prop_assert_eq!(IdentifyNamespace::from_bytes(&b[..]).unwrap(), ns);
    }

    #[test]
    fn namespace_lists_roundtrip(
        ids in prop::collection::vec(1u32.., 0..100),
        descs in prop::collection::vec(prop_oneof![
            any::<[u8; 8]>().prop_map(NamespaceIdDescriptor::Eui64),
            any::<[u8; 16]>().prop_map(NamespaceIdDescriptor::Nguid),
            any::<[u8; 16]>().prop_map(NamespaceIdDescriptor::Uuid),
            any::<u8>().prop_map(NamespaceIdDescriptor::Csi),
            (5u8..=255, nonempty_bytes(40)).prop_map(|(nidt, nid)| {
                NamespaceIdDescriptor::Unknown { nidt, nid }
            }),
        ], 0..10),
    ) {
        let list = ActiveNamespaceList { nsids: ids };
        prop_assert_eq!(ActiveNamespaceList::from_bytes(&list.to_bytes().unwrap()[..]).unwrap(), list);
        let page = NamespaceIdDescriptor::encode_list(&descs).unwrap();
        prop_assert_eq!(NamespaceIdDescriptor::decode_list(&page[..]).unwrap(), descs);
    }

    #[test]
    fn discovery_page_roundtrip(
        genctr in any::<u64>(),
        entries in prop::collection::vec(
            (any::<[u8; 4]>(), any::<[u16; 4]>(), ascii(32), ascii(200), ascii(256), any::<u8>()),
            0..4,
        ),
    ) {
        let page = DiscoveryLogPage {
            genctr,
            recfmt: 0,
            entries: entries.into_iter().map(|(b, w, trsvcid, subnqn, traddr, sec)| {
                DiscoveryLogEntry {
                    trtype: b[0], adrfam: b[1], subtype: b[2], treq: b[3],
                    portid: w[0], cntlid: w[1], asqsz: w[2], eflags: w[3],
                    trsvcid, subnqn, traddr, tcp_sectype: sec,
                }
            }).collect(),
        };
        let b = page.to_bytes().unwrap();
        prop_assert_eq!(DiscoveryLogPage::from_bytes(&b).unwrap(), page);
    }

    #[test]
    fn logs_roundtrip(raw in prop::collection::vec(any::<u8>(), 512)) {
        let e = ErrorLogEntry::from_bytes(&raw).unwrap();
        prop_assert_eq!(ErrorLogEntry::from_bytes(&e.to_bytes()).unwrap(), e);
        let s = SmartLog::from_bytes(&raw).unwrap();
        prop_assert_eq!(SmartLog::from_bytes(&s.to_bytes()).unwrap(), s);
    }
}
