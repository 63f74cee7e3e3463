//! DH-HMAC-CHAP message and command layouts: exact bytes against the
//! layouts Linux uses (`include/linux/nvme.h`), round trips, and rejections
//! naming the field and the failure explanation.

use nvmf_proto::auth::message::{
    auth_id, AuthMessage, Challenge, Failure, IdList, Negotiate, ProtocolDescriptor, Reply,
    Success1, Success2, MAX_DH_VALUE_LEN,
};
use nvmf_proto::auth::{DhGroup, FailureExplanation, HashId, HashValue};
use nvmf_proto::fabrics::{
    connect_cntlid, connect_success_dw0, AuthReq, AuthenticationReceive, AuthenticationSend,
    FabricsCommand,
};
use nvmf_proto::{ProtoError, Sqe};
use proptest::prelude::*;

use crate::common::hex;

fn hv(b: &[u8]) -> HashValue {
    HashValue::new(b).unwrap()
}

#[test]
fn negotiate_as_linux_sends_it() {
    let bytes = Negotiate::linux_default(0x0102).encode().unwrap();
    let expected = hex("
        00 00       // AUTH_TYPE common, AUTH_ID negotiate
        00 00       // reserved
        02 01       // T_ID
        00          // SC_C: no secure channel
        01          // NAPD
        01 00 03 06 // AUTHID DH-HMAC-CHAP, reserved, HALEN 3, DHLEN 6
        01 02 03    // SHA-256, SHA-384, SHA-512
        00*27
        00 01 02 03 04 05 // null, ffdhe2048 .. ffdhe8192 (idlist[30..36])
        00*24
    ");
    assert_eq!(bytes, expected);
    assert_eq!(bytes.len(), 72, "Linux's TL for Negotiate");
    let back = Negotiate::decode(&bytes).unwrap();
    assert_eq!(back, Negotiate::linux_default(0x0102));
    let d = back.dhchap().unwrap();
    assert_eq!(d.hash_ids.as_slice(), &[1, 2, 3]);
    assert_eq!(d.dh_group_ids.as_slice(), &[0, 1, 2, 3, 4, 5]);
}

#[test]
fn challenge_reply_success_failure_layouts() {
    let c = Challenge {
        t_id: 0x0304,
        hash: HashId::Sha256,
        dh_group: DhGroup::Null,
        seq_num: 0x0A0B_0C0D,
        challenge: hv(&[0xC1; 32]),
        dh_value: vec![],
    };
    assert_eq!(
        c.encode().unwrap(),
        hex("
            01 01 00 00 04 03 // DH-HMAC-CHAP challenge, T_ID
            20 00             // HL 32, reserved
            01 00             // HASHID SHA-256, DHGID null
            00 00             // DHVLEN
            0D 0C 0B 0A       // SEQNUM
            C1*32             // C1
        ")
    );

    let r = Reply {
        t_id: 0x0304,
        response: hv(&[0x52; 48]),
        ctrl_challenge: Some(hv(&[0xC2; 48])),
        seq_num: 7,
        dh_value: vec![0xDD; 3],
    };
    assert_eq!(
        r.encode().unwrap(),
        hex("
            01 02 00 00 04 03 // reply, T_ID
            30 00             // HL 48
            01 00             // CVALID, reserved
            03 00             // DHVLEN 3
            07 00 00 00       // SEQNUM S2
            52*48 C2*48 DD DD DD
        ")
    );
    // Without C2 the field is still there, zeroed, as Linux sends it.
    let r1 = Reply {
        ctrl_challenge: None,
        seq_num: 0,
        ..r.clone()
    };
    let b = r1.encode().unwrap();
    assert_eq!(b.len(), 16 + 96 + 3);
    assert_eq!(b[8], 0);
    assert!(b[16 + 48..16 + 96].iter().all(|&x| x == 0));

    let s1 = Success1 {
        t_id: 0x0304,
        hash_len: 64,
        response: Some(hv(&[0x5A; 64])),
    };
    assert_eq!(
        s1.encode().unwrap(),
        hex("01 03 00 00 04 03  40 00  01  00*7  5A*64")
    );
    let s1_uni = Success1 {
        response: None,
        ..s1.clone()
    };
    assert_eq!(
        s1_uni.encode().unwrap(),
        hex("01 03 00 00 04 03  40 00  00  00*7  00*64")
    );

    assert_eq!(
        Success2 { t_id: 0x0304 }.encode(),
        hex("01 04 00 00 04 03 00*10")
    );
    let f = Failure::new(0x0304, FailureExplanation::HASH_UNUSABLE);
    assert_eq!(
        AuthMessage::Failure1(f).encode().unwrap(),
        hex("00 F1 00 00 04 03 01 04")
    );
    assert_eq!(
        AuthMessage::Failure2(f).encode().unwrap(),
        hex("00 F0 00 00 04 03 01 04")
    );
}

#[test]
fn trailing_bytes_are_ignored() {
    // nvmet answers a Receive with the whole AL-sized buffer, zero-padded.
    let mut b = Success2 { t_id: 9 }.encode();
    b.resize(4096, 0);
    assert_eq!(
        AuthMessage::decode(&b).unwrap(),
        AuthMessage::Success2(Success2 { t_id: 9 })
    );
}

#[test]
fn short_success1_without_response_is_accepted() {
    let b = hex("01 03 00 00 01 00  20 00  00  00*7");
    let m = Success1::decode(&b).unwrap();
    assert_eq!(m.response, None);
    assert_eq!(m.hash_len, 32);
}

/// (bytes, field, explanation) rejections.
#[test]
fn rejections_name_the_field_and_the_explanation() {
    let ch = |hl: u8, hashid: u8, dhgid: u8, dhvlen: u16, extra: usize| {
        let mut b = vec![1, 1, 0, 0, 5, 0, hl, 0, hashid, dhgid];
        b.extend_from_slice(&dhvlen.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend(std::iter::repeat_n(0x77, extra));
        b
    };
    let cases: Vec<(Vec<u8>, &str, FailureExplanation)> = vec![
        (vec![], "T_ID", FailureExplanation::INCORRECT_PAYLOAD),
        (
            hex("07 00 00 00 00 00 00 00"),
            "AUTH_TYPE",
            FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
        ),
        (
            hex("01 09 00 00 00 00 00 00"),
            "AUTH_ID",
            FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
        ),
        // Negotiate: NAPD 0, NAPD too large, descriptors missing, HALEN/DHLEN > 30.
        (
            hex("00 00 00 00 01 00 00 00"),
            "NAPD",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("00 00 00 00 01 00 00 11"),
            "NAPD",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("00 00 00 00 01 00 00 02 01 00 01 01 01 00*59"),
            "protocol descriptor",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("00 00 00 00 01 00 00 01 01 00 1F 01 00*60"),
            "HALEN",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("00 00 00 00 01 00 00 01 01 00 01 FF 00*60"),
            "DHLEN",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        // Challenge: unknown hash, HL not the hash's size, unknown group,
        // DH value with null, none with ffdhe, too long, truncated C1 / DHV.
        (
            ch(32, 9, 0, 0, 32),
            "HASHID",
            FailureExplanation::HASH_UNUSABLE,
        ),
        (ch(48, 1, 0, 0, 48), "HL", FailureExplanation::HASH_UNUSABLE),
        (
            ch(32, 1, 6, 0, 32),
            "DHGID",
            FailureExplanation::DHGROUP_UNUSABLE,
        ),
        (
            ch(32, 1, 0, 4, 36),
            "DHVLEN",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            ch(32, 1, 1, 0, 32),
            "DHVLEN",
            FailureExplanation::DHGROUP_UNUSABLE,
        ),
        (
            ch(32, 1, 1, 257, 289),
            "DHVLEN",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            ch(32, 1, 5, 1025, 2000),
            "DHVLEN",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            ch(32, 1, 0, 0, 31),
            "C1",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            ch(32, 1, 1, 256, 287),
            "DHV",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            ch(32, 1, 0, 0, 0)[..12].to_vec(),
            "SEQNUM",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        // Reply: HL, CVALID, DHVLEN budget, truncations.
        (
            hex("01 02 00 00 00 00 21 00 00 00 00 00 00 00 00 00 00*66"),
            "HL",
            FailureExplanation::HASH_UNUSABLE,
        ),
        (
            hex("01 02 00 00 00 00 20 00 02 00 00 00 00 00 00 00 00*64"),
            "CVALID",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("01 02 00 00 00 00 20 00 00 00 01 04 00 00 00 00 00*64"),
            "DHVLEN",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("01 02 00 00 00 00 20 00 00 00 00 00 00 00 00 00 00*20"),
            "RVAL",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("01 02 00 00 00 00 20 00 01 00 00 00 00 00 00 00 00*40"),
            "CVAL",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("01 02 00 00 00 00 20 00 01 00 10 00 00 00 00 00 00*70"),
            "DHV",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        // Success1: HL, RVALID, R2 missing.
        (
            hex("01 03 00 00 00 00 00 00 00 00*7"),
            "HL",
            FailureExplanation::HASH_UNUSABLE,
        ),
        (
            hex("01 03 00 00 00 00 20 00 03 00*7"),
            "RVALID",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("01 03 00 00 00 00 20 00 01 00*7 00*31"),
            "RVAL",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        // Success2 and Failure truncated.
        (
            hex("01 04 00 00 00 00 00 00"),
            "reserved",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
        (
            hex("00 F1 00 00 00 00 01"),
            "REASON CODE EXPLANATION",
            FailureExplanation::INCORRECT_PAYLOAD,
        ),
    ];
    for (bytes, field, explanation) in cases {
        let e = AuthMessage::decode(&bytes).expect_err(&format!("{bytes:02x?} must be rejected"));
        assert_eq!(e.field, field, "{e}");
        assert_eq!(e.explanation, explanation, "{e}");
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn unknown_protocol_descriptors_are_kept_but_not_read() {
    let mut b = hex("00 00 00 00 07 00 00 02");
    b.extend(hex("02 00 FF FF 00*60")); // AUTHID 02h: undefined, contents ignored
    b.extend(
        Negotiate::linux_default(7).encode().unwrap()[8..]
            .iter()
            .copied(),
    );
    let n = Negotiate::decode(&b).unwrap();
    assert_eq!(n.descriptors.len(), 2);
    assert_eq!(n.descriptors[0].auth_id, 2);
    assert!(n.descriptors[0].hash_ids.is_empty());
    assert_eq!(n.dhchap().unwrap().hash_ids.as_slice(), &[1, 2, 3]);
}

#[test]
fn encode_refuses_what_the_layout_cannot_hold() {
    let no_desc = Negotiate {
        t_id: 0,
        sc_c: 0,
        descriptors: vec![],
    };
    assert!(matches!(
        no_desc.encode(),
        Err(ProtoError::Unencodable { .. })
    ));
    let c = Challenge {
        t_id: 0,
        hash: HashId::Sha256,
        dh_group: DhGroup::Ffdhe2048,
        seq_num: 1,
        challenge: hv(&[0; 32]),
        dh_value: vec![1; 257],
    };
    assert!(c.encode().is_err());
    let c = Challenge {
        dh_value: vec![],
        ..c
    };
    assert!(c.encode().is_err(), "ffdhe2048 without a DH value");
    let r = Reply {
        t_id: 0,
        response: hv(&[0; 20]),
        ctrl_challenge: None,
        seq_num: 0,
        dh_value: vec![],
    };
    assert!(r.encode().is_err(), "HL 20 is no hash");
    let r = Reply {
        response: hv(&[0; 32]),
        dh_value: vec![0; MAX_DH_VALUE_LEN + 1],
        ..r
    };
    assert!(r.encode().is_err());
}

fn arb_hash() -> impl Strategy<Value = HashId> {
    prop::sample::select(HashId::ALL.to_vec())
}

fn arb_group() -> impl Strategy<Value = DhGroup> {
    prop::sample::select(DhGroup::ALL.to_vec())
}

fn arb_message() -> impl Strategy<Value = AuthMessage> {
    let negotiate = (
        any::<u16>(),
        prop::collection::vec(
            (
                prop::collection::vec(any::<u8>(), 0..=30),
                prop::collection::vec(any::<u8>(), 0..=30),
            ),
            1..=4,
        ),
    )
        .prop_map(|(t_id, ds)| {
            AuthMessage::Negotiate(Negotiate {
                t_id,
                sc_c: 0,
                descriptors: ds
                    .iter()
                    .map(|(h, g)| ProtocolDescriptor {
                        auth_id: 1,
                        hash_ids: IdList::new(h).unwrap(),
                        dh_group_ids: IdList::new(g).unwrap(),
                    })
                    .collect(),
            })
        });
    let challenge = (
        arb_hash(),
        arb_group(),
        any::<u16>(),
        any::<u32>(),
        any::<u8>(),
    )
        .prop_flat_map(|(hash, group, t_id, seq, fill)| {
            let max = group.value_len();
            let dh = if max == 0 {
                Just(vec![]).boxed()
            } else {
                prop::collection::vec(any::<u8>(), 1..=max).boxed()
            };
            dh.prop_map(move |dh_value| {
                AuthMessage::Challenge(Challenge {
                    t_id,
                    hash,
                    dh_group: group,
                    seq_num: seq,
                    challenge: HashValue::new(&vec![fill; hash.output_len()]).unwrap(),
                    dh_value,
                })
            })
        });
    let reply = (
        arb_hash(),
        any::<u16>(),
        any::<u32>(),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..=300),
    )
        .prop_map(|(hash, t_id, seq, cvalid, dh_value)| {
            let n = hash.output_len();
            AuthMessage::Reply(Reply {
                t_id,
                response: HashValue::new(&vec![0x11; n]).unwrap(),
                ctrl_challenge: cvalid.then(|| HashValue::new(&vec![0x22; n]).unwrap()),
                seq_num: seq,
                dh_value,
            })
        });
    let success1 = (arb_hash(), any::<u16>(), any::<bool>()).prop_map(|(hash, t_id, rvalid)| {
        let n = hash.output_len();
        AuthMessage::Success1(Success1 {
            t_id,
            hash_len: n as u8,
            response: rvalid.then(|| HashValue::new(&vec![0x33; n]).unwrap()),
        })
    });
    let success2 = any::<u16>().prop_map(|t_id| AuthMessage::Success2(Success2 { t_id }));
    let failure = (any::<u16>(), any::<u8>(), any::<u8>(), any::<bool>()).prop_map(
        |(t_id, reason_code, e, one)| {
            let f = Failure {
                t_id,
                reason_code,
                explanation: FailureExplanation(e),
            };
            if one {
                AuthMessage::Failure1(f)
            } else {
                AuthMessage::Failure2(f)
            }
        },
    );
    prop_oneof![negotiate, challenge, reply, success1, success2, failure]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn messages_round_trip(m in arb_message()) {
        let bytes = m.encode().unwrap();
        prop_assert_eq!(AuthMessage::decode(&bytes).unwrap(), m.clone());
        // Every strict prefix that cuts into the message is rejected, except
        // a Success1 cut right after its 16-byte header when RVALID is 0.
        for cut in 0..bytes.len() {
            let r = AuthMessage::decode(&bytes[..cut]);
            let short_success1 = matches!(&m, AuthMessage::Success1(s) if s.response.is_none() && cut >= 16);
            prop_assert!(r.is_err() || short_success1, "prefix {} of {} decoded", cut, m.name());
        }
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..1400)) {
        if let Ok(m) = AuthMessage::decode(&bytes) {
            // Whatever decodes re-encodes to a prefix-compatible message.
            let again = m.encode().unwrap();
            prop_assert!(again.len() <= bytes.len() || matches!(m, AuthMessage::Success1(_)));
        }
    }

    #[test]
    fn decode_never_panics_on_plausible_headers(
        ty in 0u8..2, id in prop::sample::select(vec![0u8, 1, 2, 3, 4, 0xF0, 0xF1]),
        rest in prop::collection::vec(any::<u8>(), 0..1200),
    ) {
        let mut b = vec![ty, id];
        b.extend(rest);
        let _ = AuthMessage::decode(&b);
    }
}

#[test]
fn authentication_send_and_receive_sqes() {
    let send = AuthenticationSend::dhchap(72).to_sqe(0x1234);
    assert_eq!(
        send.to_bytes().to_vec(),
        hex("
            7F 40 34 12 // Fabrics, SGL, CID
            05          // FCTYPE Authentication Send
            00*19
            00*8 48 00 00 00 00 00 00 01 // SGL: 72 bytes in-capsule
            00          // reserved (NSSF of Security Send)
            01 01       // SPSP0, SPSP1
            E9          // SECP: DH-HMAC-CHAP
            48 00 00 00 // TL = 72
            00*16
        ")
    );
    let back = AuthenticationSend::from_sqe(&send).unwrap();
    assert_eq!(back, AuthenticationSend::dhchap(72));
    back.check_dhchap().unwrap();

    let recv = AuthenticationReceive::dhchap(4096).to_sqe(7);
    let b = recv.to_bytes();
    assert_eq!(b[4], 0x06);
    assert_eq!(&b[40..48], &hex("00 01 01 E9 00 10 00 00")[..]);
    assert_eq!(b[39], 0x5A, "C2HData transport SGL");
    let back = AuthenticationReceive::from_sqe(&recv).unwrap();
    assert_eq!(back, AuthenticationReceive::dhchap(4096));
    back.check_dhchap().unwrap();

    // Parsed as Fabrics commands they stay in `Other`, untouched.
    assert!(matches!(FabricsCommand::parse(&send), Ok(FabricsCommand::Other(s)) if s == send));
    assert!(
        AuthenticationSend::from_sqe(&recv).is_err(),
        "FCTYPE 06h is not a Send"
    );

    // What nvmet checks, with the offsets it reports.
    let field = |r: Result<(), ProtoError>| match r {
        Err(ProtoError::InvalidField { field, offset, .. }) => (field, offset),
        other => panic!("{other:?}"),
    };
    let mut s = AuthenticationSend::dhchap(72);
    s.secp = 0xEA;
    assert_eq!(field(s.check_dhchap()), ("SECP", 43));
    let mut s = AuthenticationSend::dhchap(72);
    s.spsp0 = 0;
    assert_eq!(field(s.check_dhchap()), ("SPSP0", 41));
    let mut s = AuthenticationSend::dhchap(72);
    s.spsp1 = 2;
    assert_eq!(field(s.check_dhchap()), ("SPSP1", 42));
    assert_eq!(
        field(AuthenticationSend::dhchap(0).check_dhchap()),
        ("TL", 44)
    );
    assert_eq!(
        field(AuthenticationSend::dhchap(4097).check_dhchap()),
        ("TL", 44)
    );
    assert_eq!(
        field(AuthenticationReceive::dhchap(0).check_dhchap()),
        ("AL", 44)
    );
    AuthenticationReceive::dhchap(u32::MAX)
        .check_dhchap()
        .unwrap();
}

proptest! {
    #[test]
    fn auth_sqes_round_trip(cid: u16, secp: u8, spsp0: u8, spsp1: u8, len: u32, send: bool) {
        if send {
            let c = AuthenticationSend { secp, spsp0, spsp1, tl: len, ..AuthenticationSend::dhchap(len) };
            let sqe = Sqe::from_bytes(&c.to_sqe(cid).to_bytes());
            prop_assert_eq!(AuthenticationSend::from_sqe(&sqe).unwrap(), c);
        } else {
            let c = AuthenticationReceive { secp, spsp0, spsp1, al: len, ..AuthenticationReceive::dhchap(len) };
            let sqe = Sqe::from_bytes(&c.to_sqe(cid).to_bytes());
            prop_assert_eq!(AuthenticationReceive::from_sqe(&sqe).unwrap(), c);
        }
    }
}

#[test]
fn connect_response_authreq() {
    // nvmet: CNTLID | NVME_CONNECT_AUTHREQ_ATR (1 << 17).
    let dw0 = connect_success_dw0(0x0042, AuthReq::ATR.0);
    assert_eq!(dw0, 0x0002_0042);
    let req = AuthReq::from_connect_dw0(dw0);
    assert!(req.transaction_required());
    assert!(!req.secure_channel_required());
    assert_eq!(connect_cntlid(dw0), 0x42);
    let ascr = connect_success_dw0(1, AuthReq::ASCR.0);
    assert_eq!(ascr, 1 << 18 | 1);
    assert!(AuthReq::from_connect_dw0(ascr).secure_channel_required());
    assert_eq!(AuthReq::from_connect_dw0(5), AuthReq::NONE);
}

#[test]
fn failure_ids_match_linux() {
    assert_eq!(auth_id::FAILURE1, 0xF1);
    assert_eq!(auth_id::FAILURE2, 0xF0);
    assert_eq!(
        FailureExplanation::INCORRECT_PROTOCOL_MESSAGE.to_string(),
        "incorrect protocol message"
    );
    assert_eq!(FailureExplanation(0x42).to_string(), "explanation 0x42");
}
