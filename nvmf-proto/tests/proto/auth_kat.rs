//! Known-answer tests for DH-HMAC-CHAP, against values derived
//! independently by `tests/auth_vectors.py` (Python's hmac, hashlib and
//! `pow()`; see that script for the formulas and where each follows the
//! Linux kernel). The generated constants are in `auth_kat_data.rs`.
//!
//! The Linux kernel ships no known-answer values for NVMe authentication
//! (none in `drivers/nvme`), so these are the reference.

use std::collections::VecDeque;
use std::sync::Arc;

use nvmf_proto::auth::crypto::{
    augmented_challenge, controller_response, host_response, ResponseInput,
};
use nvmf_proto::auth::dh::{self, DhPrivateKey};
use nvmf_proto::auth::message::{Negotiate, Success2};
use nvmf_proto::auth::{
    CtrlAuth, CtrlAuthConfig, CtrlProgress, DhGroup, DhchapSecret, HashId, HostAuth,
    HostAuthConfig, HostNext, RandomError, RandomSource, HOST_RECEIVE_AL,
};
use sha2::{Digest, Sha256};

use crate::auth_kat_data as kat;
use crate::common::unhex;

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn ffdhe_primes_are_rfc_7919() {
    for (group, digest) in [
        (DhGroup::Ffdhe2048, kat::FFDHE2048_SHA256),
        (DhGroup::Ffdhe3072, kat::FFDHE3072_SHA256),
        (DhGroup::Ffdhe4096, kat::FFDHE4096_SHA256),
        (DhGroup::Ffdhe6144, kat::FFDHE6144_SHA256),
        (DhGroup::Ffdhe8192, kat::FFDHE8192_SHA256),
    ] {
        let p = dh::prime(group).unwrap();
        assert_eq!(p.len(), group.value_len());
        assert_eq!(hex_of(&Sha256::digest(p)), digest, "{group}");
        // RFC 7919's construction: the top and bottom 64 bits are all ones,
        // and e's digits follow the top word (0xADF85458A2BB4A9A...).
        assert!(p[..8].iter().chain(&p[p.len() - 8..]).all(|&b| b == 0xFF));
        assert_eq!(&p[8..16], &unhex("adf85458a2bb4a9a")[..]);
        assert_eq!(p[p.len() - 1] & 7, 7, "p ≡ 7 mod 8: 2 is a square");
    }
    assert!(dh::prime(DhGroup::Null).is_none());
}

/// q = (p − 1) / 2, big-endian.
fn half_p_minus_1(p: &[u8]) -> Vec<u8> {
    let mut q = p.to_vec();
    *q.last_mut().unwrap() -= 1; // p is odd
    let mut carry = 0u8;
    for b in q.iter_mut() {
        let next = *b & 1;
        *b = (*b >> 1) | (carry << 7);
        carry = next;
    }
    q
}

#[test]
fn generator_has_order_q() {
    // For a safe prime p = 2q + 1 with p ≡ 7 (mod 8), 2 generates the
    // subgroup of order q: 2^q ≡ 1 (mod p). A cheap check that the constant
    // has the safe-prime structure (and a base-2 Fermat test of p), one
    // modular exponentiation per group.
    for group in [
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ] {
        let q = half_p_minus_1(dh::prime(group).unwrap());
        let r = DhPrivateKey::from_be_bytes(group, &q)
            .unwrap()
            .public_value();
        let mut one = vec![0u8; group.value_len()];
        *one.last_mut().unwrap() = 1;
        assert_eq!(r, one, "2^q mod p for {group}");
    }
}

#[test]
fn null_group_responses() {
    for (hash, host_key, ctrl_key, c1, c2, r1, r2) in [
        (
            HashId::Sha256,
            kat::NULL_H1_HOST_KEY,
            kat::NULL_H1_CTRL_KEY,
            kat::NULL_H1_C1,
            kat::NULL_H1_C2,
            kat::NULL_H1_R1,
            kat::NULL_H1_R2,
        ),
        (
            HashId::Sha384,
            kat::NULL_H2_HOST_KEY,
            kat::NULL_H2_CTRL_KEY,
            kat::NULL_H2_C1,
            kat::NULL_H2_C2,
            kat::NULL_H2_R1,
            kat::NULL_H2_R2,
        ),
        (
            HashId::Sha512,
            kat::NULL_H3_HOST_KEY,
            kat::NULL_H3_CTRL_KEY,
            kat::NULL_H3_C1,
            kat::NULL_H3_C2,
            kat::NULL_H3_R1,
            kat::NULL_H3_R2,
        ),
    ] {
        // Host secret transformed with its hash, controller secret not.
        let kh = DhchapSecret::new(&unhex(host_key), Some(hash))
            .unwrap()
            .transform(kat::HOSTNQN);
        let kc = DhchapSecret::new(&unhex(ctrl_key), None)
            .unwrap()
            .transform(kat::SUBNQN);
        let (c1, c2) = (unhex(c1), unhex(c2));
        assert_eq!(
            host_response(&kh, &input(hash, &c1, kat::S1)).as_bytes(),
            unhex(r1)
        );
        assert_eq!(
            controller_response(&kc, &input(hash, &c2, kat::S2)).as_bytes(),
            unhex(r2)
        );
    }
}

fn input(hash: HashId, challenge: &[u8], seq_num: u32) -> ResponseInput<'_> {
    ResponseInput {
        hash,
        challenge,
        session_key: None,
        seq_num,
        t_id: kat::T_ID,
        sc_c: 0,
        host_nqn: kat::HOSTNQN,
        subsys_nqn: kat::SUBNQN,
    }
}

struct DhKat {
    hash: HashId,
    group: DhGroup,
    x_host: &'static str,
    x_ctrl: &'static str,
    y_host: &'static str,
    y_ctrl: &'static str,
    shared: &'static str,
    host_key: &'static str,
    ctrl_key: &'static str,
    c1: &'static str,
    c2: &'static str,
    c1_augmented: &'static str,
    r1: &'static str,
    r2: &'static str,
    challenge_msg: &'static str,
    reply_msg: &'static str,
    success1_msg: &'static str,
}

macro_rules! dh_kat {
    ($hash:expr, $group:expr, $p:ident) => {{
        use kat::$p as k;
        DhKat {
            hash: $hash,
            group: $group,
            x_host: k::X_HOST,
            x_ctrl: k::X_CTRL,
            y_host: k::Y_HOST,
            y_ctrl: k::Y_CTRL,
            shared: k::SHARED,
            host_key: k::HOST_KEY,
            ctrl_key: k::CTRL_KEY,
            c1: k::C1,
            c2: k::C2,
            c1_augmented: k::C1_AUGMENTED,
            r1: k::R1,
            r2: k::R2,
            challenge_msg: k::CHALLENGE_MSG,
            reply_msg: k::REPLY_MSG,
            success1_msg: k::SUCCESS1_MSG,
        }
    }};
}

fn dh_kats() -> Vec<DhKat> {
    vec![
        dh_kat!(HashId::Sha256, DhGroup::Ffdhe2048, h1_g1),
        dh_kat!(HashId::Sha384, DhGroup::Ffdhe3072, h2_g2),
        dh_kat!(HashId::Sha512, DhGroup::Ffdhe4096, h3_g3),
    ]
}

#[test]
fn dh_values_shared_secret_and_responses() {
    for k in dh_kats() {
        let xh = DhPrivateKey::from_be_bytes(k.group, &unhex(k.x_host)).unwrap();
        let xc = DhPrivateKey::from_be_bytes(k.group, &unhex(k.x_ctrl)).unwrap();
        assert_eq!(hex_of(&xh.public_value()), k.y_host, "{}", k.group);
        assert_eq!(hex_of(&xc.public_value()), k.y_ctrl, "{}", k.group);
        let s1 = xh.shared_secret(&unhex(k.y_ctrl)).unwrap();
        let s2 = xc.shared_secret(&unhex(k.y_host)).unwrap();
        assert_eq!(hex_of(s1.as_bytes()), k.shared);
        assert_eq!(s1, s2);
        assert_eq!(
            hex_of(augmented_challenge(k.hash, &s1, &unhex(k.c1)).as_bytes()),
            k.c1_augmented
        );
        let kh = DhchapSecret::new(&unhex(k.host_key), Some(k.hash))
            .unwrap()
            .transform(kat::HOSTNQN);
        let kc = DhchapSecret::new(&unhex(k.ctrl_key), Some(k.hash))
            .unwrap()
            .transform(kat::SUBNQN);
        let c1 = unhex(k.c1);
        let c2 = unhex(k.c2);
        let mut input = ResponseInput {
            hash: k.hash,
            challenge: &c1,
            session_key: Some(&s1),
            seq_num: kat::S1,
            t_id: kat::T_ID,
            sc_c: 0,
            host_nqn: kat::HOSTNQN,
            subsys_nqn: kat::SUBNQN,
        };
        assert_eq!(hex_of(host_response(&kh, &input).as_bytes()), k.r1);
        input.challenge = &c2;
        input.seq_num = kat::S2;
        assert_eq!(hex_of(controller_response(&kc, &input).as_bytes()), k.r2);
    }
}

/// Hands out exactly the scripted bytes, in order.
struct Scripted(VecDeque<u8>);

impl Scripted {
    fn new(parts: &[&[u8]]) -> Box<Self> {
        Box::new(Self(parts.iter().flat_map(|p| p.iter().copied()).collect()))
    }
}

impl RandomSource for Scripted {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), RandomError> {
        for b in buf {
            *b = self.0.pop_front().expect("script has enough random bytes");
        }
        Ok(())
    }
}

/// The state machines, fed the scripted randomness, produce byte for byte
/// the messages the Python script lays out as Linux does.
#[test]
fn state_machines_reproduce_the_wire_transcript() {
    for k in dh_kats() {
        let host_secret = DhchapSecret::new(&unhex(k.host_key), Some(k.hash)).unwrap();
        let ctrl_secret = DhchapSecret::new(&unhex(k.ctrl_key), Some(k.hash)).unwrap();

        // Host: random bytes are the DH key, then C2, then S2.
        let cfg = HostAuthConfig::new(kat::HOSTNQN, kat::SUBNQN, host_secret.clone())
            .with_ctrl_secret(ctrl_secret.clone());
        let rng = Scripted::new(&[&unhex(k.x_host), &unhex(k.c2), &kat::S2.to_le_bytes()]);
        let mut host = HostAuth::with_random(Arc::new(cfg), 0, kat::T_ID, rng).unwrap();
        let start = host.start();
        assert_eq!(
            start.send.unwrap(),
            Negotiate::linux_default(kat::T_ID).encode().unwrap()
        );
        let mut challenge = unhex(k.challenge_msg);
        challenge.resize(HOST_RECEIVE_AL as usize, 0);
        let step = host.receive(&challenge);
        assert!(matches!(step.next, HostNext::Receive { al: 4096 }));
        assert_eq!(hex_of(&step.send.unwrap()), k.reply_msg, "{}", k.group);
        let step = host.receive(&unhex(k.success1_msg));
        assert_eq!(step.send.unwrap(), Success2 { t_id: kat::T_ID }.encode());
        let HostNext::Done(done) = step.next else {
            panic!("{:?}", step.next)
        };
        assert!(done.bidirectional);
        assert_eq!((done.hash, done.dh_group), (k.hash, k.group));
        assert_eq!(hex_of(done.session_key.unwrap().as_bytes()), k.shared);

        // Controller: random bytes are C1, then S1, then the DH key.
        let cfg = CtrlAuthConfig::new(kat::HOSTNQN, kat::SUBNQN, host_secret)
            .with_ctrl_secret(ctrl_secret)
            .with_hashes(&[k.hash])
            .with_dh_groups(&[k.group]);
        let rng = Scripted::new(&[&unhex(k.c1), &kat::S1.to_le_bytes(), &unhex(k.x_ctrl)]);
        let mut ctrl = CtrlAuth::with_random(Arc::new(cfg), 0, rng).unwrap();
        let negotiate = Negotiate::linux_default(kat::T_ID).encode().unwrap();
        assert!(matches!(ctrl.on_send(&negotiate), CtrlProgress::InProgress));
        let got = ctrl.on_receive(HOST_RECEIVE_AL).unwrap();
        let n = k.challenge_msg.len() / 2;
        assert_eq!(got.data.len(), 4096, "padded to AL like nvmet");
        assert_eq!(hex_of(&got.data[..n]), k.challenge_msg);
        assert!(got.data[n..].iter().all(|&b| b == 0));
        assert!(matches!(
            ctrl.on_send(&unhex(k.reply_msg)),
            CtrlProgress::InProgress
        ));
        let got = ctrl.on_receive(HOST_RECEIVE_AL).unwrap();
        assert_eq!(
            hex_of(&got.data[..k.success1_msg.len() / 2]),
            k.success1_msg
        );
        assert!(matches!(got.progress, CtrlProgress::InProgress));
        assert!(!ctrl.is_authenticated());
        let CtrlProgress::Authenticated(done) =
            ctrl.on_send(&Success2 { t_id: kat::T_ID }.encode())
        else {
            panic!("success2 must authenticate")
        };
        assert!(done.bidirectional && ctrl.is_authenticated());
        assert_eq!(hex_of(done.session_key.unwrap().as_bytes()), k.shared);
    }
}
