//! DH-HMAC-CHAP between our initiator and gimbal-target over loopback:
//! both sides of the protocol as the daemons drive them (the exchange
//! itself, byte for byte against independently derived vectors, is
//! tested in nvmf-proto; interoperability with Linux in the VM bench,
//! `tests/vm/scenarios/auth.sh`).

mod support;

use std::time::Duration;

use nvmf_initiator::blocking::{ConnectOptions, Controller, DhchapKeys, HostIdentity};
use nvmf_initiator::{ConnectRefusal, Error};
use nvmf_proto::auth::{AuthError, DhchapSecret};
use nvmf_proto::fabrics::PriorityClass;
use support::{start_target, DEMO_NQN, HOST_NQN};

// Keys from nvme-cli 2.3's `nvme gen-dhchap-key` (nvmf-proto's
// tests/proto/auth_secret.rs).
const HOST_KEY: &str = "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCa:";
const CTRL_KEY: &str = "DHHC-1:01:5NmdC6ei6ufThKzxcNLrVwG7B51dcFJp4loC4hNpFH00R4sa:";
const OTHER_KEY: &str =
    "DHHC-1:02:tGg4ICib06wXO06GouV3F8FBDjT/Dzsk4bEkXkhWG/mIfaRmtgoMusZbBarGLtNSjypqCw==:";
const OPEN_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";

fn config(host_extra: &str, subsystem_extra: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:0\"]\n\
         [[host]]\nnqn = \"{HOST_NQN}\"\ndhchap_secret = \"{HOST_KEY}\"\n{host_extra}\n\
         [[subsystem]]\nnqn = \"{DEMO_NQN}\"\nallow_any_host = true\n{subsystem_extra}\n\
         [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"4MiB\"\n"
    )
}

fn options(
    addr: std::net::SocketAddr,
    host: &str,
    keys: Option<(&str, Option<&str>)>,
) -> ConnectOptions {
    let mut o = ConnectOptions::new(addr, DEMO_NQN);
    o.host = HostIdentity {
        nqn: host.to_string(),
        id: [7; 16],
    };
    o.io_queues = 2;
    o.connect_timeout = Duration::from_secs(5);
    o.dhchap = keys.map(|(s, c)| DhchapKeys {
        secret: DhchapSecret::parse(s).unwrap(),
        ctrl_secret: c.map(|c| DhchapSecret::parse(c).unwrap()),
    });
    o
}

/// Writes on an I/O queue (which authenticates too) and reads back.
fn round_trip(ctrl: &Controller) {
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    ctrl.write(1, 8, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    ctrl.read(1, 8, &mut back).unwrap();
    assert_eq!(back, data);
    let q = ctrl.io_queue(PriorityClass::Medium).unwrap();
    drop(q);
}

#[test]
fn a_host_with_its_key_connects_and_does_io_on_every_queue() {
    let t = start_target(&config("", ""));
    let addr = t.local_addrs()[0];
    let ctrl = Controller::connect(options(addr, HOST_NQN, Some((HOST_KEY, None)))).unwrap();
    round_trip(&ctrl);
    ctrl.disconnect().unwrap();
    // Bidirectional: the target proves it knows the controller key.
    let t2 = start_target(&config(&format!("dhchap_ctrl_secret = \"{CTRL_KEY}\""), ""));
    let addr2 = t2.local_addrs()[0];
    let ctrl =
        Controller::connect(options(addr2, HOST_NQN, Some((HOST_KEY, Some(CTRL_KEY))))).unwrap();
    round_trip(&ctrl);
    ctrl.disconnect().unwrap();
    t.shutdown();
    t2.shutdown();
}

#[test]
fn every_hash_and_a_dh_group_work_end_to_end() {
    for (hash, group) in [
        ("sha256", "ffdhe2048"),
        ("sha384", "null"),
        ("sha512", "ffdhe3072"),
    ] {
        let t = start_target(&config(
            &format!("dhchap_hash = \"{hash}\"\ndhchap_dhgroup = \"{group}\""),
            "",
        ));
        let ctrl = Controller::connect(options(
            t.local_addrs()[0],
            HOST_NQN,
            Some((HOST_KEY, None)),
        ))
        .unwrap_or_else(|e| panic!("{hash}/{group}: {e}"));
        round_trip(&ctrl);
        ctrl.disconnect().unwrap();
        t.shutdown();
    }
}

#[test]
fn no_key_or_a_wrong_key_is_refused_and_the_target_serves_others() {
    let t = start_target(&config(&format!("dhchap_ctrl_secret = \"{CTRL_KEY}\""), ""));
    let addr = t.local_addrs()[0];
    // No key: the target asks (ATR), the host has nothing to answer with.
    let e = Controller::connect(options(addr, HOST_NQN, None))
        .err()
        .unwrap();
    assert!(matches!(e, Error::AuthenticationRequired { qid: 0 }), "{e}");
    assert!(e.to_string().contains("dhchap_secret"), "{e}");
    // A wrong host key: the target answers Failure1.
    let e = Controller::connect(options(addr, HOST_NQN, Some((OTHER_KEY, None))))
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            Error::AuthenticationFailed {
                qid: 0,
                source: AuthError::PeerFailure { .. }
            }
        ),
        "{e:?}"
    );
    assert!(!e.to_string().contains("tGg4ICib"), "{e}");
    // The right host key but a wrong controller key: the host refuses the
    // target's proof.
    let e = Controller::connect(options(addr, HOST_NQN, Some((HOST_KEY, Some(OTHER_KEY)))))
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::AuthenticationFailed { qid: 0, .. }),
        "{e:?}"
    );
    // Meanwhile the target serves the right key, and a host it does not
    // ask to authenticate.
    let ctrl =
        Controller::connect(options(addr, HOST_NQN, Some((HOST_KEY, Some(CTRL_KEY))))).unwrap();
    round_trip(&ctrl);
    ctrl.disconnect().unwrap();
    let ctrl = Controller::connect(options(addr, OPEN_HOST, None)).unwrap();
    round_trip(&ctrl);
    ctrl.disconnect().unwrap();
    t.shutdown();
}

#[test]
fn a_controller_key_with_a_target_that_does_not_ask_is_refused() {
    // OPEN_HOST has no [[host]] table: the target does not authenticate it,
    // so it cannot prove the controller key the host insists on.
    let t = start_target(&config("", ""));
    let e = Controller::connect(options(
        t.local_addrs()[0],
        OPEN_HOST,
        Some((HOST_KEY, Some(CTRL_KEY))),
    ))
    .err()
    .unwrap();
    assert!(
        matches!(e, Error::ControllerNotAuthenticated { qid: 0 }),
        "{e}"
    );
    t.shutdown();
}

#[test]
fn require_auth_refuses_a_host_without_a_secret() {
    let t = start_target(&config("", "require_auth = true"));
    let e = Controller::connect(options(t.local_addrs()[0], OPEN_HOST, None))
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::ConnectRefused(ConnectRefusal::HostNotAllowed)),
        "{e:?}"
    );
    let ctrl = Controller::connect(options(
        t.local_addrs()[0],
        HOST_NQN,
        Some((HOST_KEY, None)),
    ))
    .unwrap();
    round_trip(&ctrl);
    ctrl.disconnect().unwrap();
    t.shutdown();
}

#[test]
fn the_host_authenticates_again_after_the_target_drops_the_controller() {
    let t = start_target(&config(&format!("dhchap_ctrl_secret = \"{CTRL_KEY}\""), ""));
    let mut o = options(
        t.local_addrs()[0],
        HOST_NQN,
        Some((HOST_KEY, Some(CTRL_KEY))),
    );
    o.reconnect.reconnect_delay = Duration::from_millis(50);
    let ctrl = Controller::connect(o).unwrap();
    round_trip(&ctrl);
    let cntlid = ctrl.info().cntlid;
    t.target().controller(cntlid).unwrap().teardown.cancel();
    // The next command finds the connection gone; the controller
    // reconnects (authenticating again) and the command is retried.
    round_trip(&ctrl);
    // The target asks every new queue to authenticate: the reconnect (a
    // new admin queue and I/O queues) proved both keys again.
    assert!(
        ctrl.resets() >= 1 && ctrl.epoch() >= 1,
        "a reconnect happened"
    );
    ctrl.disconnect().unwrap();
    t.shutdown();
}

// ---- on the wire: what the target enforces per queue ----------------------

use nvmf_proto::auth::{HostAuth, HostAuthConfig, HostNext};
use nvmf_proto::fabrics::{property, AuthReq, AuthenticationReceive, AuthenticationSend};
use nvmf_proto::Status;
use support::TestHost;

/// Runs one whole transaction on `h`'s admin queue with `secret`;
/// returns how it ended.
fn authenticate(h: &mut TestHost, secret: &str, tid: u16) -> Result<(), String> {
    let cfg = HostAuthConfig::new(HOST_NQN, DEMO_NQN, DhchapSecret::parse(secret).unwrap());
    let mut auth = HostAuth::new(std::sync::Arc::new(cfg), 0, tid).unwrap();
    let mut step = auth.start();
    loop {
        if let Some(msg) = step.send.take() {
            let cid = h.cid();
            let sqe = AuthenticationSend::dhchap(msg.len() as u32).to_sqe(cid);
            let (cqe, _) = h.command(sqe, Some(&msg));
            assert!(cqe.status.is_success(), "Authentication Send: {cqe:?}");
        }
        match step.next {
            HostNext::Receive { al } => {
                let cid = h.cid();
                let (cqe, data) = h.command(AuthenticationReceive::dhchap(al).to_sqe(cid), None);
                assert!(cqe.status.is_success(), "Authentication Receive: {cqe:?}");
                assert_eq!(data.len(), al as usize, "the reply fills AL, zero-padded");
                step = auth.receive(&data);
            }
            HostNext::Done(_) => return Ok(()),
            HostNext::Failed(e) => return Err(e.to_string()),
        }
    }
}

fn property_status(h: &mut TestHost) -> Status {
    let cid = h.cid();
    let (cqe, _) = h.command(
        nvmf_proto::fabrics::PropertyGet::new(property::VS).to_sqe(cid),
        None,
    );
    cqe.status
}

#[test]
fn the_target_gates_each_queue_until_it_authenticates_and_allows_reauthentication() {
    let t = start_target(&config("", ""));
    let mut h = TestHost::connect(t.local_addrs()[0]);
    h.icreq(false, false);
    let cqe = h.connect_admin_as(DEMO_NQN, HOST_NQN, 0);
    assert!(cqe.status.is_success());
    assert!(
        AuthReq::from_connect_dw0(cqe.dw0).transaction_required(),
        "ATR set"
    );
    // Before authentication everything else fails with Authentication
    // Required (DNR).
    let s = property_status(&mut h);
    assert!(s.same_code(Status::AUTHENTICATION_REQUIRED), "{s:?}");
    assert!(s.dnr);
    // Field checks: a wrong SECP, an empty Send, a Receive with AL 0 or
    // beyond MDTS.
    let cid = h.cid();
    let mut bad = AuthenticationSend::dhchap(8);
    bad.secp = 0xEA;
    let (cqe, _) = h.command(bad.to_sqe(cid), Some(&[0; 8]));
    assert!(cqe.status.same_code(Status::INVALID_FIELD), "{cqe:?}");
    let cid = h.cid();
    let (cqe, _) = h.command(AuthenticationReceive::dhchap(0).to_sqe(cid), None);
    assert!(cqe.status.same_code(Status::INVALID_FIELD), "{cqe:?}");
    let cid = h.cid();
    let (cqe, data) = h.command(AuthenticationReceive::dhchap(64 << 20).to_sqe(cid), None);
    assert!(cqe.status.same_code(Status::INVALID_FIELD), "{cqe:?}");
    assert!(data.is_empty(), "nothing sent for a refused AL");
    authenticate(&mut h, HOST_KEY, 1).unwrap();
    assert!(property_status(&mut h).is_success());
    // Re-authentication on the live queue: commands keep working during
    // and after it.
    authenticate(&mut h, HOST_KEY, 2).unwrap();
    assert!(property_status(&mut h).is_success());
    // A failed re-authentication closes the queue to everything else.
    assert!(authenticate(&mut h, OTHER_KEY, 3).is_err());
    assert!(property_status(&mut h).same_code(Status::AUTHENTICATION_REQUIRED));
    // A new transaction with the right key opens it again.
    authenticate(&mut h, HOST_KEY, 4).unwrap();
    assert!(property_status(&mut h).is_success());
    t.shutdown();
}

#[test]
fn an_unauthenticated_queue_gets_three_attempts() {
    let t = start_target(&config("", ""));
    let mut h = TestHost::connect(t.local_addrs()[0]);
    h.icreq(false, false);
    assert!(h
        .connect_admin_as(DEMO_NQN, HOST_NQN, 0)
        .status
        .is_success());
    for tid in 1..=3 {
        assert!(authenticate(&mut h, OTHER_KEY, tid).is_err());
    }
    // The fourth Negotiate ends the connection (each may cost the target
    // a modular exponentiation).
    let cfg = HostAuthConfig::new(HOST_NQN, DEMO_NQN, DhchapSecret::parse(HOST_KEY).unwrap());
    let msg = HostAuth::new(std::sync::Arc::new(cfg), 0, 4)
        .unwrap()
        .start()
        .send
        .unwrap();
    let cid = h.cid();
    let capsule = nvmf_proto::pdu::CapsuleCmd::with_data(
        AuthenticationSend::dhchap(msg.len() as u32).to_sqe(cid),
        msg,
    )
    .unwrap();
    h.send(&nvmf_proto::pdu::Pdu::CapsuleCmd(capsule));
    h.drain_until_closed(Duration::from_secs(5));
    t.shutdown();
}
