//! Whole DH-HMAC-CHAP transactions between [`HostAuth`] and [`CtrlAuth`],
//! driven the way the integrators drive them (each message through an
//! Authentication Send or Receive SQE), and every way they must fail.

use std::sync::Arc;
use std::time::Instant;

use nvmf_proto::auth::dh;
use nvmf_proto::auth::message::{
    AuthMessage, Challenge, Failure, Negotiate, ProtocolDescriptor, Reply, Success1, Success2,
};
use nvmf_proto::auth::{
    AuthError, Authenticated, CtrlAuth, CtrlAuthConfig, CtrlProgress, DhGroup, DhchapSecret,
    FailureExplanation, HashId, HashValue, HostAuth, HostAuthConfig, HostNext, HostStep,
    RandomError, RandomSource, ReceiveError, HOST_RECEIVE_AL,
};
use nvmf_proto::fabrics::{AuthenticationReceive, AuthenticationSend};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:9a1c7a4e-2f63-4c1b-8d0e-5b3f6a7c8d9e";
const SUBNQN: &str = "nqn.2024-05.io.gimbal:exchange";

/// xorshift64*: deterministic randomness for the state machines.
struct TestRng(u64);

impl RandomSource for TestRng {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), RandomError> {
        for b in buf {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            *b = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
        }
        Ok(())
    }
}

fn secret(seed: u8, hash: Option<HashId>) -> DhchapSecret {
    let len = hash.map_or(32, HashId::output_len);
    let key: Vec<u8> = (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
        .collect();
    DhchapSecret::new(&key, hash).unwrap()
}

fn host(cfg: HostAuthConfig, t_id: u16, seed: u64) -> HostAuth {
    HostAuth::with_random(Arc::new(cfg), 0, t_id, Box::new(TestRng(seed))).unwrap()
}

fn ctrl(cfg: CtrlAuthConfig, seed: u64) -> CtrlAuth {
    CtrlAuth::with_random(Arc::new(cfg), 0, Box::new(TestRng(seed))).unwrap()
}

/// What each side ended with.
#[derive(Debug)]
struct Outcome {
    host: Result<Authenticated, AuthError>,
    ctrl: Option<Result<Authenticated, AuthError>>,
    /// Every message that went over the wire, in order.
    transcript: Vec<AuthMessage>,
}

/// Run a transaction: the host's sends go through an Authentication Send
/// SQE to `CtrlAuth::on_send`, its receives through an Authentication
/// Receive SQE to `CtrlAuth::on_receive`.
fn run(host: &mut HostAuth, ctrl: &mut CtrlAuth) -> Outcome {
    let mut step = host.start();
    let mut ctrl_result = None;
    let mut transcript = Vec::new();
    fn note(p: CtrlProgress, ctrl_result: &mut Option<Result<Authenticated, AuthError>>) {
        match p {
            CtrlProgress::Authenticated(a) => *ctrl_result = Some(Ok(a)),
            CtrlProgress::Failed(e) => *ctrl_result = Some(Err(e)),
            CtrlProgress::InProgress | CtrlProgress::FailureQueued(_) => {}
        }
    }
    for _ in 0..10 {
        if let Some(data) = step.send.take() {
            let sqe = AuthenticationSend::dhchap(data.len() as u32).to_sqe(0x10);
            let cmd = AuthenticationSend::from_sqe(&sqe).unwrap();
            cmd.check_dhchap().unwrap();
            assert_eq!(cmd.tl as usize, data.len());
            transcript.push(AuthMessage::decode(&data).unwrap());
            let p = ctrl.on_send(&data);
            note(p, &mut ctrl_result);
        }
        match step.next {
            HostNext::Receive { al } => {
                let sqe = AuthenticationReceive::dhchap(al).to_sqe(0x11);
                let cmd = AuthenticationReceive::from_sqe(&sqe).unwrap();
                cmd.check_dhchap().unwrap();
                let r = ctrl.on_receive(cmd.al).unwrap();
                assert!(r.data.len() <= al as usize);
                transcript.push(AuthMessage::decode(&r.data).unwrap());
                note(r.progress, &mut ctrl_result);
                step = host.receive(&r.data);
            }
            HostNext::Done(a) => {
                return Outcome {
                    host: Ok(a),
                    ctrl: ctrl_result,
                    transcript,
                }
            }
            HostNext::Failed(e) => {
                return Outcome {
                    host: Err(e),
                    ctrl: ctrl_result,
                    transcript,
                }
            }
        }
    }
    panic!("transaction did not end");
}

fn configs(hash: HashId, group: DhGroup, bidirectional: bool) -> (HostAuthConfig, CtrlAuthConfig) {
    let hs = secret(1, Some(hash));
    let cs = secret(2, None);
    let mut h = HostAuthConfig::new(HOSTNQN, SUBNQN, hs.clone());
    let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, hs)
        .with_ctrl_secret(cs.clone())
        .with_hashes(&[hash])
        .with_dh_groups(&[group]);
    if bidirectional {
        h = h.with_ctrl_secret(cs);
    }
    (h, c)
}

#[test]
fn every_hash_with_null_ffdhe2048_ffdhe3072_both_directions() {
    let started = Instant::now();
    let mut seed = 1;
    for hash in HashId::ALL {
        for group in [DhGroup::Null, DhGroup::Ffdhe2048, DhGroup::Ffdhe3072] {
            for bidirectional in [false, true] {
                seed += 2;
                let (h, c) = configs(hash, group, bidirectional);
                let out = run(&mut host(h, seed as u16, seed), &mut ctrl(c, seed + 1));
                let host_ok = out.host.unwrap_or_else(|e| panic!("{hash} {group}: {e}"));
                let ctrl_ok = out.ctrl.expect("controller finished").unwrap();
                assert_eq!((host_ok.hash, host_ok.dh_group), (hash, group));
                assert_eq!((ctrl_ok.hash, ctrl_ok.dh_group), (hash, group));
                assert_eq!(host_ok.bidirectional, bidirectional);
                assert_eq!(ctrl_ok.bidirectional, bidirectional);
                assert_eq!(host_ok.session_key, ctrl_ok.session_key);
                assert_eq!(host_ok.session_key.is_some(), !group.is_null());
                if let Some(k) = &host_ok.session_key {
                    assert_eq!(k.as_bytes().len(), group.value_len());
                }
                // Negotiate, Challenge, Reply, Success1 (+ Success2).
                let names: Vec<_> = out.transcript.iter().map(AuthMessage::name).collect();
                assert_eq!(names.len(), 4 + bidirectional as usize, "{names:?}");
                assert!(out.transcript.iter().all(|m| m.t_id() == seed as u16));
            }
        }
    }
    eprintln!("18 transactions in {:?}", started.elapsed());
}

#[test]
fn ffdhe4096_6144_8192_once_each() {
    for (hash, group) in [
        (HashId::Sha256, DhGroup::Ffdhe4096),
        (HashId::Sha384, DhGroup::Ffdhe6144),
        (HashId::Sha512, DhGroup::Ffdhe8192),
    ] {
        let (h, c) = configs(hash, group, true);
        let out = run(&mut host(h, 9, 90), &mut ctrl(c, 91));
        let a = out.host.unwrap();
        assert_eq!(a.dh_group, group);
        assert_eq!(out.ctrl.unwrap().unwrap().session_key, a.session_key);
        // The Reply carries a full-size DH value.
        let AuthMessage::Reply(r) = &out.transcript[2] else {
            panic!()
        };
        assert_eq!(r.dh_value.len(), group.value_len());
    }
}

#[test]
fn controller_picks_its_preference_among_the_offer() {
    let hs = secret(3, Some(HashId::Sha384));
    let h = HostAuthConfig::new(HOSTNQN, SUBNQN, hs.clone());
    let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, hs)
        .with_hashes(&[HashId::Sha512, HashId::Sha256])
        .with_dh_groups(&[DhGroup::Ffdhe2048, DhGroup::Null]);
    let out = run(&mut host(h, 1, 5), &mut ctrl(c, 6));
    let a = out.host.unwrap();
    assert_eq!((a.hash, a.dh_group), (HashId::Sha512, DhGroup::Ffdhe2048));
    // The defaults pick what nvmet's defaults pick: SHA-256, null group.
    let hs = secret(3, None);
    let out = run(
        &mut host(HostAuthConfig::new(HOSTNQN, SUBNQN, hs.clone()), 1, 7),
        &mut ctrl(CtrlAuthConfig::new(HOSTNQN, SUBNQN, hs), 8),
    );
    let a = out.host.unwrap();
    assert_eq!((a.hash, a.dh_group), (HashId::Sha256, DhGroup::Null));
}

fn expect_peer_failure(e: &AuthError, explanation: FailureExplanation) {
    match e {
        AuthError::PeerFailure {
            reason_code,
            explanation: got,
        } => {
            assert_eq!(*reason_code, 1);
            assert_eq!(*got, explanation, "{e}");
        }
        other => panic!("expected a peer failure, got {other:?}"),
    }
}

#[test]
fn wrong_host_key_fails_on_the_controller() {
    for group in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let (h, _) = configs(HashId::Sha256, group, false);
        let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, secret(9, Some(HashId::Sha256)))
            .with_dh_groups(&[group]);
        let mut c = ctrl(c, 4);
        let out = run(&mut host(h, 3, 3), &mut c);
        expect_peer_failure(&out.host.unwrap_err(), FailureExplanation::FAILED);
        assert_eq!(
            out.ctrl.unwrap().unwrap_err(),
            AuthError::HostResponseMismatch
        );
        assert!(!c.is_authenticated());
        assert!(matches!(
            out.transcript.last(),
            Some(AuthMessage::Failure1(_))
        ));
    }
}

#[test]
fn wrong_nqn_is_a_wrong_response() {
    let (h, _) = configs(HashId::Sha256, DhGroup::Null, false);
    let c = CtrlAuthConfig::new(
        "nqn.2014-08.org.nvmexpress:uuid:someone-else",
        SUBNQN,
        secret(1, Some(HashId::Sha256)),
    );
    let out = run(&mut host(h, 3, 3), &mut ctrl(c, 4));
    assert_eq!(
        out.ctrl.unwrap().unwrap_err(),
        AuthError::HostResponseMismatch
    );
}

#[test]
fn wrong_controller_key_fails_on_the_host() {
    for group in [DhGroup::Null, DhGroup::Ffdhe3072] {
        let (h, _) = configs(HashId::Sha384, group, true);
        let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, secret(1, Some(HashId::Sha384)))
            .with_ctrl_secret(secret(42, None))
            .with_dh_groups(&[group]);
        let mut c = ctrl(c, 12);
        let out = run(&mut host(h, 5, 11), &mut c);
        assert_eq!(out.host.unwrap_err(), AuthError::ControllerResponseMismatch);
        // The host told the controller with Failure2.
        let Some(AuthMessage::Failure2(f)) = out.transcript.last() else {
            panic!("{:?}", out.transcript.last())
        };
        assert_eq!(f.explanation, FailureExplanation::FAILED);
        expect_peer_failure(&out.ctrl.unwrap().unwrap_err(), FailureExplanation::FAILED);
        assert!(!c.is_authenticated());
    }
}

#[test]
fn controller_without_controller_secret_refuses_bidirectional() {
    let (h, _) = configs(HashId::Sha256, DhGroup::Null, true);
    let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, secret(1, Some(HashId::Sha256)));
    let out = run(&mut host(h, 5, 11), &mut ctrl(c, 12));
    expect_peer_failure(&out.host.unwrap_err(), FailureExplanation::FAILED);
    assert_eq!(
        out.ctrl.unwrap().unwrap_err(),
        AuthError::NoControllerSecret
    );
}

/// Drive a host up to its Reply against a real controller; return both.
fn host_at_success1(bidirectional: bool) -> (HostAuth, CtrlAuth, Vec<u8>) {
    let (h, c) = configs(HashId::Sha256, DhGroup::Null, bidirectional);
    let mut h = host(h, 0x77, 21);
    let mut c = ctrl(c, 22);
    c.on_send(&h.start().send.unwrap());
    let challenge = c.on_receive(HOST_RECEIVE_AL).unwrap().data;
    let reply = h.receive(&challenge).send.unwrap();
    (h, c, reply)
}

#[test]
fn host_insists_on_the_controller_response_it_asked_for() {
    // Linux's host would accept this Success1 (it checks R2 only when
    // RVALID is set); a controller that does not prove itself is refused.
    let (mut h, _, _) = host_at_success1(true);
    let s1 = Success1 {
        t_id: 0x77,
        hash_len: 32,
        response: None,
    };
    let step = h.receive(&s1.encode().unwrap());
    assert!(matches!(
        step.next,
        HostNext::Failed(AuthError::ControllerNotAuthenticated)
    ));
    let f = AuthMessage::decode(&step.send.unwrap()).unwrap();
    assert!(matches!(f, AuthMessage::Failure2(f) if f.explanation == FailureExplanation::FAILED));

    // Unidirectional: an unrequested R2 is ignored.
    let (mut h, _, _) = host_at_success1(false);
    let s1 = Success1 {
        t_id: 0x77,
        hash_len: 32,
        response: Some(HashValue::new(&[9; 32]).unwrap()),
    };
    let step = h.receive(&s1.encode().unwrap());
    assert!(step.send.is_none());
    assert!(matches!(step.next, HostNext::Done(ref a) if !a.bidirectional));
}

#[test]
fn host_rejects_success1_with_another_hash_length() {
    let (mut h, _, _) = host_at_success1(false);
    let s1 = Success1 {
        t_id: 0x77,
        hash_len: 48,
        response: None,
    };
    let step = h.receive(&s1.encode().unwrap());
    let HostNext::Failed(e) = step.next else {
        panic!()
    };
    assert_eq!(e.explanation(), FailureExplanation::HASH_UNUSABLE);
}

#[test]
fn unsupported_hash_and_group() {
    // Controller allows only SHA-512; host offers only SHA-256.
    let hs = secret(1, None);
    let mut hc = HostAuthConfig::new(HOSTNQN, SUBNQN, hs.clone());
    hc.hashes = vec![HashId::Sha256];
    let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, hs.clone()).with_hashes(&[HashId::Sha512]);
    let out = run(&mut host(hc.clone(), 1, 1), &mut ctrl(c, 2));
    expect_peer_failure(&out.host.unwrap_err(), FailureExplanation::HASH_UNUSABLE);
    assert_eq!(out.ctrl.unwrap().unwrap_err(), AuthError::HashUnusable);

    // Controller requires ffdhe4096; host offers null and ffdhe2048.
    hc.dh_groups = vec![DhGroup::Null, DhGroup::Ffdhe2048];
    let c = CtrlAuthConfig::new(HOSTNQN, SUBNQN, hs).with_dh_groups(&[DhGroup::Ffdhe4096]);
    let out = run(&mut host(hc, 1, 1), &mut ctrl(c, 2));
    expect_peer_failure(&out.host.unwrap_err(), FailureExplanation::DHGROUP_UNUSABLE);
    assert_eq!(out.ctrl.unwrap().unwrap_err(), AuthError::DhGroupUnusable);
}

fn challenge_for(t_id: u16, hash: HashId, group: DhGroup, dh_value: Vec<u8>) -> Vec<u8> {
    Challenge {
        t_id,
        hash,
        dh_group: group,
        seq_num: 1,
        challenge: HashValue::new(&vec![0xCC; hash.output_len()]).unwrap(),
        dh_value,
    }
    .encode()
    .unwrap()
}

fn failed_with_failure2(step: HostStep) -> (AuthError, Failure) {
    let HostNext::Failed(e) = step.next else {
        panic!("{:?}", step.next)
    };
    let Ok(AuthMessage::Failure2(f)) = AuthMessage::decode(&step.send.expect("Failure2")) else {
        panic!("not a Failure2")
    };
    assert_eq!(f.explanation, e.explanation());
    (e, f)
}

#[test]
fn host_rejects_a_challenge_it_did_not_ask_for() {
    // nvmet may challenge with a group the host did not offer (its DH
    // group loop is inverted); this host refuses.
    let mut cfg = HostAuthConfig::new(HOSTNQN, SUBNQN, secret(1, None));
    cfg.hashes = vec![HashId::Sha256];
    cfg.dh_groups = vec![DhGroup::Null];
    let mut h = host(cfg.clone(), 4, 1);
    h.start();
    let (e, f) =
        failed_with_failure2(h.receive(&challenge_for(4, HashId::Sha384, DhGroup::Null, vec![])));
    assert_eq!(e, AuthError::HashUnusable);
    assert_eq!(f.t_id, 4);
    let mut h = host(cfg, 4, 1);
    h.start();
    let (e, _) = failed_with_failure2(h.receive(&challenge_for(
        4,
        HashId::Sha256,
        DhGroup::Ffdhe2048,
        vec![2; 256],
    )));
    assert_eq!(e, AuthError::DhGroupUnusable);
}

#[test]
fn bad_dh_values_are_rejected_before_use() {
    let p = dh::prime(DhGroup::Ffdhe2048).unwrap().to_vec();
    let mut p_minus_1 = p.clone();
    *p_minus_1.last_mut().unwrap() -= 1;
    let mut one = vec![0u8; 256];
    one[255] = 1;
    for bad in [vec![0u8; 256], one, p_minus_1, p.clone(), vec![0xFF; 256]] {
        assert!(dh::validate_public_value(DhGroup::Ffdhe2048, &bad).is_err());
        let mut h = host(HostAuthConfig::new(HOSTNQN, SUBNQN, secret(1, None)), 4, 1);
        h.start();
        let (e, _) = failed_with_failure2(h.receive(&challenge_for(
            4,
            HashId::Sha256,
            DhGroup::Ffdhe2048,
            bad.clone(),
        )));
        assert!(matches!(e, AuthError::DhValue(_)), "{e:?}");

        // Same value in a Reply to a controller.
        let (_, c) = configs(HashId::Sha256, DhGroup::Ffdhe2048, false);
        let mut c = ctrl(c, 3);
        c.on_send(&Negotiate::linux_default(4).encode().unwrap());
        c.on_receive(HOST_RECEIVE_AL).unwrap();
        let reply = Reply {
            t_id: 4,
            response: HashValue::new(&[0; 32]).unwrap(),
            ctrl_challenge: None,
            seq_num: 0,
            dh_value: bad,
        };
        let p = c.on_send(&reply.encode().unwrap());
        assert!(
            matches!(p, CtrlProgress::FailureQueued(AuthError::DhValue(_))),
            "{p:?}"
        );
        let r = c.on_receive(HOST_RECEIVE_AL).unwrap();
        let AuthMessage::Failure1(f) = AuthMessage::decode(&r.data).unwrap() else {
            panic!()
        };
        assert_eq!(f.explanation, FailureExplanation::INCORRECT_PAYLOAD);
    }
    // A short (unpadded) but valid value is the same integer.
    assert!(dh::validate_public_value(DhGroup::Ffdhe2048, &[2]).is_ok());
    assert!(dh::validate_public_value(DhGroup::Ffdhe2048, &[]).is_err());
    assert!(dh::validate_public_value(DhGroup::Ffdhe2048, &[1; 257]).is_err());
    assert!(dh::validate_public_value(DhGroup::Null, &[2]).is_err());
}

/// The controller's answer to the next Receive, decoded.
fn next_receive(c: &mut CtrlAuth) -> (AuthMessage, CtrlProgress) {
    let r = c.on_receive(HOST_RECEIVE_AL).unwrap();
    (AuthMessage::decode(&r.data).unwrap(), r.progress)
}

fn expect_failure1(c: &mut CtrlAuth, explanation: FailureExplanation) {
    let (m, p) = next_receive(c);
    let AuthMessage::Failure1(f) = m else {
        panic!("{m:?}")
    };
    assert_eq!(f.explanation, explanation);
    assert!(matches!(p, CtrlProgress::Failed(_)));
    assert!(!c.is_authenticated());
    // Failed for good.
    assert!(matches!(
        c.on_send(&Negotiate::linux_default(1).encode().unwrap()),
        CtrlProgress::Failed(AuthError::Misuse(_))
    ));
}

#[test]
fn out_of_order_messages_on_the_controller() {
    let (h, c) = configs(HashId::Sha256, DhGroup::Null, true);
    // Reply before Negotiate.
    let (_, _, reply) = host_at_success1(true);
    let mut cc = ctrl(c.clone(), 1);
    assert!(matches!(
        cc.on_send(&reply),
        CtrlProgress::FailureQueued(AuthError::UnexpectedMessage { .. })
    ));
    expect_failure1(&mut cc, FailureExplanation::INCORRECT_PROTOCOL_MESSAGE);

    // A Receive before anything was sent.
    let mut cc = ctrl(c.clone(), 1);
    let (m, p) = next_receive(&mut cc);
    assert!(matches!(m, AuthMessage::Failure1(_)));
    assert!(matches!(
        p,
        CtrlProgress::Failed(AuthError::UnexpectedMessage { .. })
    ));

    // A Reply while the Challenge still waits to be received.
    let mut hh = host(h.clone(), 3, 2);
    let mut cc = ctrl(c.clone(), 1);
    cc.on_send(&hh.start().send.unwrap());
    let p = cc.on_send(&reply);
    assert!(matches!(
        p,
        CtrlProgress::FailureQueued(AuthError::UnexpectedMessage { .. })
    ));
    expect_failure1(&mut cc, FailureExplanation::INCORRECT_PROTOCOL_MESSAGE);

    // Success2 instead of a Reply.
    let mut cc = ctrl(c.clone(), 1);
    cc.on_send(&Negotiate::linux_default(3).encode().unwrap());
    next_receive(&mut cc);
    cc.on_send(&Success2 { t_id: 3 }.encode());
    expect_failure1(&mut cc, FailureExplanation::INCORRECT_PROTOCOL_MESSAGE);

    // A Challenge sent to the controller.
    let mut cc = ctrl(c, 1);
    cc.on_send(&challenge_for(0, HashId::Sha256, DhGroup::Null, vec![]));
    expect_failure1(&mut cc, FailureExplanation::INCORRECT_PROTOCOL_MESSAGE);
}

#[test]
fn out_of_order_messages_on_the_host() {
    let (h, _) = configs(HashId::Sha256, DhGroup::Null, false);
    // Success1 while waiting for the Challenge.
    let mut hh = host(h.clone(), 3, 1);
    hh.start();
    let s1 = Success1 {
        t_id: 3,
        hash_len: 32,
        response: None,
    };
    let (e, f) = failed_with_failure2(hh.receive(&s1.encode().unwrap()));
    assert!(matches!(e, AuthError::UnexpectedMessage { .. }));
    assert_eq!(
        f.explanation,
        FailureExplanation::INCORRECT_PROTOCOL_MESSAGE
    );
    // The transaction is over: nothing more is sent.
    let step = hh.receive(&challenge_for(3, HashId::Sha256, DhGroup::Null, vec![]));
    assert!(step.send.is_none());
    assert!(matches!(step.next, HostNext::Failed(AuthError::Misuse(_))));

    // Receive before start, start twice: caller bugs, nothing sent.
    let mut hh = host(h.clone(), 3, 1);
    let step = hh.receive(&s1.encode().unwrap());
    assert!(step.send.is_none() && matches!(step.next, HostNext::Failed(AuthError::Misuse(_))));
    let mut hh = host(h, 3, 1);
    hh.start();
    let step = hh.start();
    assert!(step.send.is_none() && matches!(step.next, HostNext::Failed(AuthError::Misuse(_))));

    // A Failure1 ends the transaction without a Failure2.
    let (mut hh, _, _) = host_at_success1(false);
    let f1 = AuthMessage::Failure1(Failure::new(0x77, FailureExplanation::FAILED));
    let step = hh.receive(&f1.encode().unwrap());
    assert!(step.send.is_none());
    let HostNext::Failed(e) = step.next else {
        panic!()
    };
    expect_peer_failure(&e, FailureExplanation::FAILED);
}

#[test]
fn transaction_ids_must_match() {
    // Host: a Challenge for another transaction.
    let (h, c) = configs(HashId::Sha256, DhGroup::Null, true);
    let mut hh = host(h.clone(), 3, 1);
    hh.start();
    let (e, f) =
        failed_with_failure2(hh.receive(&challenge_for(4, HashId::Sha256, DhGroup::Null, vec![])));
    assert_eq!(
        e,
        AuthError::TransactionId {
            expected: 3,
            got: 4
        }
    );
    assert_eq!(f.explanation, FailureExplanation::INCORRECT_PAYLOAD);
    assert_eq!(f.t_id, 3);

    // Controller: transaction 1 succeeds; its Reply replayed into
    // transaction 2 (new T_ID) is refused for its T_ID ...
    let mut cc = ctrl(c.clone(), 50);
    let mut h1 = host(h.clone(), 1, 60);
    let out = run(&mut h1, &mut cc);
    assert!(out.host.is_ok() && cc.is_authenticated());
    let AuthMessage::Reply(old_reply) = out.transcript[2].clone() else {
        panic!()
    };
    cc.on_send(&Negotiate::linux_default(2).encode().unwrap());
    next_receive(&mut cc);
    assert!(
        cc.is_authenticated(),
        "re-authentication keeps the result until it fails"
    );
    let p = cc.on_send(&AuthMessage::Reply(old_reply.clone()).encode().unwrap());
    assert!(matches!(
        p,
        CtrlProgress::FailureQueued(AuthError::TransactionId {
            expected: 2,
            got: 1
        })
    ));
    expect_failure1(&mut cc, FailureExplanation::INCORRECT_PAYLOAD);

    // ... and into a transaction that reuses T_ID 1, for its response: the
    // controller's new challenge makes the old response worthless.
    let mut cc = ctrl(c, 50);
    run(&mut host(h, 1, 60), &mut cc).host.unwrap();
    cc.on_send(&Negotiate::linux_default(1).encode().unwrap());
    next_receive(&mut cc);
    let p = cc.on_send(&AuthMessage::Reply(old_reply).encode().unwrap());
    assert!(matches!(
        p,
        CtrlProgress::FailureQueued(AuthError::HostResponseMismatch)
    ));
    expect_failure1(&mut cc, FailureExplanation::FAILED);
}

#[test]
fn success2_with_another_transaction_id() {
    let (h, c) = configs(HashId::Sha256, DhGroup::Null, true);
    let mut hh = host(h, 8, 1);
    let mut cc = ctrl(c, 2);
    cc.on_send(&hh.start().send.unwrap());
    let reply = hh.receive(&cc.on_receive(4096).unwrap().data).send.unwrap();
    cc.on_send(&reply);
    let (m, _) = next_receive(&mut cc);
    assert!(matches!(m, AuthMessage::Success1(ref s) if s.response.is_some()));
    let p = cc.on_send(&Success2 { t_id: 9 }.encode());
    assert!(matches!(
        p,
        CtrlProgress::FailureQueued(AuthError::TransactionId { .. })
    ));
    expect_failure1(&mut cc, FailureExplanation::INCORRECT_PAYLOAD);
}

#[test]
fn truncated_messages() {
    let (h, c) = configs(HashId::Sha512, DhGroup::Ffdhe2048, true);
    // Controller: every truncation of the Negotiate and of the Reply.
    let negotiate = Negotiate::linux_default(5).encode().unwrap();
    for cut in [0, 1, 5, 7, 8, 40, 71] {
        let mut cc = ctrl(c.clone(), 1);
        let p = cc.on_send(&negotiate[..cut]);
        let CtrlProgress::FailureQueued(AuthError::Message(e)) = p else {
            panic!("{p:?}")
        };
        assert_eq!(e.explanation, FailureExplanation::INCORRECT_PAYLOAD, "{e}");
        expect_failure1(&mut cc, FailureExplanation::INCORRECT_PAYLOAD);
    }
    let mut hh = host(h.clone(), 5, 1);
    let mut cc = ctrl(c.clone(), 2);
    cc.on_send(&hh.start().send.unwrap());
    let challenge = cc.on_receive(4096).unwrap().data;
    let reply = hh.receive(&challenge).send.unwrap();
    assert_eq!(reply.len(), 16 + 128 + 256);
    for cut in [15, 16, 79, 143, 144, 399] {
        let mut cc2 = ctrl(c.clone(), 2);
        cc2.on_send(&negotiate);
        cc2.on_receive(4096).unwrap();
        let p = cc2.on_send(&reply[..cut]);
        assert!(
            matches!(p, CtrlProgress::FailureQueued(AuthError::Message(_))),
            "{cut}: {p:?}"
        );
        expect_failure1(&mut cc2, FailureExplanation::INCORRECT_PAYLOAD);
    }
    // Host: the Challenge cut short (inside C1, inside the DH value).
    let n = 16 + 64 + 256;
    for cut in [3, 15, 50, n - 1] {
        let mut hh = host(h.clone(), 5, 1);
        hh.start();
        let (e, f) = failed_with_failure2(hh.receive(&challenge[..cut]));
        assert!(matches!(e, AuthError::Message(_)), "{e:?}");
        assert_eq!(f.explanation, FailureExplanation::INCORRECT_PAYLOAD);
    }
}

#[test]
fn allocation_length_too_small_keeps_the_message() {
    let (_, c) = configs(HashId::Sha256, DhGroup::Ffdhe2048, false);
    let mut cc = ctrl(c, 1);
    cc.on_send(&Negotiate::linux_default(5).encode().unwrap());
    assert_eq!(
        cc.on_receive(100).unwrap_err(),
        ReceiveError::AllocationLength {
            al: 100,
            needed: 16 + 32 + 256
        }
    );
    // Exactly the message's size is enough, and nothing is padded past AL.
    let r = cc.on_receive(304).unwrap();
    assert_eq!(r.data.len(), 304);
    assert!(matches!(
        AuthMessage::decode(&r.data),
        Ok(AuthMessage::Challenge(_))
    ));
}

#[test]
fn unusable_negotiations() {
    let (_, c) = configs(HashId::Sha256, DhGroup::Null, false);
    // Secure channel concatenation requested.
    let mut n = Negotiate::linux_default(1);
    n.sc_c = 1;
    let mut cc = ctrl(c.clone(), 1);
    assert!(matches!(
        cc.on_send(&n.encode().unwrap()),
        CtrlProgress::FailureQueued(AuthError::SecureChannel(1))
    ));
    expect_failure1(&mut cc, FailureExplanation::SECURE_CHANNEL_MISMATCH);
    // No DH-HMAC-CHAP descriptor.
    let mut n = Negotiate::linux_default(1);
    n.descriptors = vec![ProtocolDescriptor {
        auth_id: 7,
        ..ProtocolDescriptor::dhchap(&[], &[]).unwrap()
    }];
    let mut cc = ctrl(c.clone(), 1);
    cc.on_send(&n.encode().unwrap());
    expect_failure1(&mut cc, FailureExplanation::PROTOCOL_NOT_USABLE);
    // Only unknown hash identifiers.
    let mut n = Negotiate::linux_default(1);
    n.descriptors[0].hash_ids = nvmf_proto::auth::message::IdList::new(&[0, 4, 0xFF]).unwrap();
    let mut cc = ctrl(c, 1);
    cc.on_send(&n.encode().unwrap());
    expect_failure1(&mut cc, FailureExplanation::HASH_UNUSABLE);
}

#[test]
fn failure2_from_the_host_ends_it() {
    let (_, c) = configs(HashId::Sha256, DhGroup::Null, false);
    let mut cc = ctrl(c, 1);
    cc.on_send(&Negotiate::linux_default(1).encode().unwrap());
    next_receive(&mut cc);
    let f2 = AuthMessage::Failure2(Failure::new(1, FailureExplanation::HASH_UNUSABLE));
    let p = cc.on_send(&f2.encode().unwrap());
    let CtrlProgress::Failed(e) = p else { panic!() };
    expect_peer_failure(&e, FailureExplanation::HASH_UNUSABLE);
    assert!(!cc.is_authenticated());
}

#[test]
fn reauthentication_on_the_same_queue() {
    let (h, c) = configs(HashId::Sha384, DhGroup::Ffdhe2048, true);
    let mut cc = ctrl(c, 1);
    for t_id in 1..=3 {
        let out = run(&mut host(h.clone(), t_id, t_id as u64 * 7), &mut cc);
        out.host.unwrap();
        out.ctrl.unwrap().unwrap();
        assert!(cc.is_authenticated());
    }
}

#[test]
fn configuration_is_checked() {
    let s = secret(1, None);
    for (host_nqn, subnqn) in [
        ("", SUBNQN),
        (HOSTNQN, ""),
        (&"n".repeat(224)[..], SUBNQN),
        ("a\0b", SUBNQN),
    ] {
        let cfg = HostAuthConfig::new(host_nqn, subnqn, s.clone());
        assert!(matches!(
            HostAuth::new(Arc::new(cfg), 0, 0),
            Err(AuthError::Config(_))
        ));
        let cfg = CtrlAuthConfig::new(host_nqn, subnqn, s.clone());
        assert!(matches!(
            CtrlAuth::new(Arc::new(cfg), 0),
            Err(AuthError::Config(_))
        ));
    }
    let cfg = CtrlAuthConfig::new(HOSTNQN, SUBNQN, s.clone()).with_hashes(&[]);
    assert!(CtrlAuth::new(Arc::new(cfg), 0).is_err());
    let mut cfg = HostAuthConfig::new(HOSTNQN, SUBNQN, s);
    cfg.dh_groups.clear();
    assert!(HostAuth::new(Arc::new(cfg), 0, 0).is_err());
    // 223 bytes is the limit, inclusive.
    let long = "n".repeat(223);
    let cfg = HostAuthConfig::new(long, SUBNQN, secret(1, None));
    assert!(HostAuth::new(Arc::new(cfg), 0, 0).is_ok());
}

#[test]
fn os_randomness_works_end_to_end() {
    let (h, c) = configs(HashId::Sha256, DhGroup::Ffdhe2048, true);
    let mut hh = HostAuth::new(Arc::new(h), 1, 1).unwrap();
    let mut cc = CtrlAuth::new(Arc::new(c), 1).unwrap();
    let out = run(&mut hh, &mut cc);
    assert_eq!(
        out.host.unwrap().session_key,
        out.ctrl.unwrap().unwrap().session_key
    );
}

#[test]
fn debug_output_hides_secrets() {
    let (h, c) = configs(HashId::Sha256, DhGroup::Ffdhe2048, true);
    let out = run(&mut host(h.clone(), 1, 1), &mut ctrl(c.clone(), 2));
    let a = out.host.unwrap();
    let shown = format!("{a:?} {h:?} {c:?}");
    assert!(shown.contains("redacted"));
    let key_hex: String = a.session_key.as_ref().unwrap().as_bytes()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(!shown.contains(&key_hex));
}
