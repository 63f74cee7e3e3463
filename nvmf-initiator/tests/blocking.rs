//! The blocking driver over real loopback TCP against the scripted fake
//! target: bring-up, I/O, discovery, refusals, and resets with reconnect,
//! fast_io_fail and ctrl_loss_tmo.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use nvmf_initiator::blocking::{discover, ConnectOptions, Controller, HostIdentity, IoQueue};
use nvmf_initiator::fake_target::{FakeConfig, FakeServer, FakeTarget, Fault, Trigger};
use nvmf_initiator::{Command, ConnectRefusal, Error, ReconnectPolicy, Request};
use nvmf_proto::fabrics::PriorityClass;

fn opts(addr: SocketAddr, t: &FakeTarget) -> ConnectOptions {
    let mut o = ConnectOptions::new(addr, &t.config().subnqn);
    o.host = HostIdentity {
        nqn: "nqn.2026-01.io.test:host".into(),
        id: [1; 16],
    };
    o.queue_depth = 16;
    o.reconnect = ReconnectPolicy {
        reconnect_delay: Duration::from_millis(20),
        ctrl_loss_tmo: Some(Duration::from_secs(30)),
        fast_io_fail_tmo: None,
        requeue: true,
    };
    o.command_timeout = Duration::from_secs(10);
    o
}

fn start(cfg: FakeConfig) -> (Arc<FakeTarget>, FakeServer) {
    let t = FakeTarget::new(cfg);
    let s = t.serve();
    (t, s)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn connect_identify_write_read_flush_disconnect() {
    for digests in [false, true] {
        let (t, s) = start(FakeConfig::default());
        let mut o = opts(s.addr(), &t);
        o.header_digest = digests;
        o.data_digest = digests;
        let c = Controller::connect(o).unwrap();
        let info = c.info();
        assert_eq!(info.max_transfer_bytes, 32768);
        assert_eq!(info.identify.vendor_specific, b"gimbal-fake");
        assert_eq!(c.active_namespaces().unwrap(), vec![1]);
        let ns = c.identify_namespace(1).unwrap();
        assert_eq!((ns.blocks, ns.block_size), (8192, 512));
        for (i, len) in [512usize, 8192, 8704, 65536, 1 << 20]
            .into_iter()
            .enumerate()
        {
            let data = pattern(len, i as u8);
            c.write(1, 100 * i as u64, &data).unwrap();
            let mut back = vec![0; len];
            c.read(1, 100 * i as u64, &mut back).unwrap();
            assert!(back == data, "size {len}");
        }
        c.flush(1).unwrap();
        assert!(matches!(
            c.read(1, 8191, &mut [0; 1024]),
            Err(Error::CommandFailed { .. })
        ));
        assert_eq!(c.resets(), 0);
        c.disconnect().unwrap();
    }
}

#[test]
fn discovery_lists_the_subsystem() {
    let (t, s) = start(FakeConfig::default());
    let entries = discover(
        s.addr(),
        &HostIdentity::random(),
        Duration::from_secs(5),
        None,
    )
    .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].subnqn, t.config().subnqn);
}

#[test]
fn refusals_and_unreachable_targets_are_clear_errors() {
    let (t, s) = start(FakeConfig {
        allowed_hosts: Some(vec!["nqn.someone-else".into()]),
        ..FakeConfig::default()
    });
    let e = Controller::connect(opts(s.addr(), &t)).err().unwrap();
    assert!(
        matches!(e, Error::ConnectRefused(ConnectRefusal::HostNotAllowed)),
        "{e}"
    );
    let mut o = opts(s.addr(), &t);
    o.subnqn = "nqn.2026-01.io.test:nope".into();
    let e = Controller::connect(o).err().unwrap();
    assert!(
        matches!(e, Error::ConnectRefused(ConnectRefusal::UnknownSubsystem)),
        "{e}"
    );
    // A port nobody listens on.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = Controller::connect(opts(addr, &t)).err().unwrap();
    assert!(matches!(e, Error::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains(&addr.to_string()));
}

fn fill(q: &mut IoQueue, n: u64, len: usize) {
    for i in 0..n {
        q.submit(Request {
            command: Command::Write {
                nsid: 1,
                slba: i * (len / 512) as u64,
                block_size: 512,
                fua: false,
            },
            buf: Some(pattern(len, i as u8)),
            user_data: i,
        });
    }
}

fn read_all(q: &mut IoQueue, n: u64, len: usize) {
    for i in 0..n {
        q.submit(Request {
            command: Command::Read {
                nsid: 1,
                slba: i * (len / 512) as u64,
                block_size: 512,
            },
            buf: Some(vec![0; len]),
            user_data: i,
        });
    }
}

/// Wait for `n` completions; all must succeed (and reads match).
fn expect_ok(q: &mut IoQueue, n: u64, len: usize, reads: bool) {
    for _ in 0..n {
        let c = q.wait().expect("outstanding");
        let seed = c.user_data as u8;
        let buf = c.into_result("io").unwrap();
        if reads {
            assert!(buf.unwrap() == pattern(len, seed));
        }
    }
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn many_outstanding_on_an_io_queue() {
    let (t, s) = start(FakeConfig::default());
    let c = Controller::connect(opts(s.addr(), &t)).unwrap();
    let mut q = c.io_queue(PriorityClass::High).unwrap();
    fill(&mut q, 64, 16384);
    expect_ok(&mut q, 64, 16384, false);
    read_all(&mut q, 64, 16384);
    expect_ok(&mut q, 64, 16384, true);
}

#[test]
fn a_protocol_violation_resets_reconnects_and_requeues() {
    let (t, s) = start(FakeConfig {
        fault: Some((Fault::BadPlen, Trigger::NthIo(70))),
        ..FakeConfig::default()
    });
    let c = Controller::connect(opts(s.addr(), &t)).unwrap();
    let mut q = c.io_queue(PriorityClass::Medium).unwrap();
    fill(&mut q, 64, 8192);
    expect_ok(&mut q, 64, 8192, false);
    read_all(&mut q, 64, 8192);
    expect_ok(&mut q, 64, 8192, true);
    assert_eq!(c.resets(), 1);
    assert!(c.info().cntlid > 1, "a new controller after the reset");
}

#[test]
fn target_dropping_connections_mid_run_is_survived() {
    let (t, s) = start(FakeConfig::default());
    let c = Controller::connect(opts(s.addr(), &t)).unwrap();
    let mut q = c.io_queue(PriorityClass::Medium).unwrap();
    fill(&mut q, 32, 32768);
    s.kill_connections();
    expect_ok(&mut q, 32, 32768, false);
    read_all(&mut q, 32, 32768);
    expect_ok(&mut q, 32, 32768, true);
    assert!(c.resets() >= 1);
}

#[test]
fn ctrl_loss_tmo_fails_pending_io_instead_of_hanging() {
    let (t, s) = start(FakeConfig::default());
    let mut o = opts(s.addr(), &t);
    o.reconnect.ctrl_loss_tmo = Some(Duration::from_millis(200));
    let c = Controller::connect(o).unwrap();
    let mut q = c.io_queue(PriorityClass::Medium).unwrap();
    s.refuse(true);
    s.kill_connections();
    fill(&mut q, 4, 4096);
    for _ in 0..4 {
        let r = q.wait().unwrap().result;
        assert!(matches!(r, Err(Error::ControllerLost(_))), "{r:?}");
    }
    // New I/O fails at once too.
    fill(&mut q, 1, 4096);
    assert!(q.wait().unwrap().result.is_err());
    assert!(!c.is_live());
}

#[test]
fn fast_io_fail_fails_io_while_reconnect_goes_on() {
    let (t, s) = start(FakeConfig::default());
    let mut o = opts(s.addr(), &t);
    o.reconnect.fast_io_fail_tmo = Some(Duration::from_millis(100));
    o.reconnect.ctrl_loss_tmo = None;
    let c = Controller::connect(o).unwrap();
    let mut q = c.io_queue(PriorityClass::Medium).unwrap();
    s.refuse(true);
    s.kill_connections();
    fill(&mut q, 2, 4096);
    for _ in 0..2 {
        let r = q.wait().unwrap().result;
        assert!(matches!(r, Err(Error::FastIoFail(_))), "{r:?}");
    }
    s.refuse(false);
    // Reconnect goes on: I/O works again once it succeeds.
    let mut ok = false;
    for _ in 0..500 {
        if c.is_live() {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ok, "reconnected");
    fill(&mut q, 2, 4096);
    expect_ok(&mut q, 2, 4096, false);
}

#[test]
fn idle_controller_stays_up_beyond_three_kato() {
    let (t, s) = start(FakeConfig::default());
    let mut o = opts(s.addr(), &t);
    o.kato = Duration::from_millis(100);
    let c = Controller::connect(o).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.resets(), 0);
    c.identify_controller().unwrap();
}

#[test]
fn keep_alive_silence_resets_the_controller() {
    let (t, s) = start(FakeConfig {
        fault: Some((Fault::Silence, Trigger::KeepAlive)),
        ..FakeConfig::default()
    });
    let mut o = opts(s.addr(), &t);
    o.kato = Duration::from_millis(100);
    let c = Controller::connect(o).unwrap();
    let mut reset = false;
    for _ in 0..500 {
        if c.resets() > 0 {
            reset = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(reset, "keep-alive timeout must reset");
    // And it comes back (the fault fires once).
    let mut data = vec![0u8; 512];
    c.read(1, 0, &mut data).unwrap();
}

#[test]
fn hooks_for_an_external_pump_follow_resets() {
    let (t, s) = start(FakeConfig::default());
    let c = Controller::connect(opts(s.addr(), &t)).unwrap();
    let (epoch, cfg) = c.io_queue_config(PriorityClass::High).unwrap();
    assert_eq!(epoch, 0);
    assert_eq!(cfg.cntlid, c.info().cntlid);
    assert_eq!(cfg.priority, PriorityClass::High);
    assert!(cfg.qid >= 1);
    assert!(c.disposition().is_ok());
    c.report_failure(epoch, &Error::ConnectionClosed);
    let new_epoch = c.wait_until_live(Duration::from_secs(10)).unwrap();
    assert_eq!(new_epoch, 1);
    let (e2, cfg2) = c.io_queue_reconnect_config(cfg.qid, PriorityClass::High);
    assert_eq!(e2, 1);
    assert_ne!(cfg2.cntlid, cfg.cntlid, "a new controller after the reset");
    c.release_qid(cfg.qid);
}

/// A target that offers only round robin and refuses the Arbitration
/// feature (as Linux nvmet does): asking for weighted arbitration "if
/// offered" with weights still connects, on round robin, without sending
/// the weights; asking for WRR outright is a clear error.
#[test]
fn round_robin_only_targets_get_no_weights() {
    use nvmf_initiator::controller::Arbitration;
    let (t, srv) = start(FakeConfig {
        round_robin_only: true,
        ..FakeConfig::default()
    });
    let mut o = opts(srv.addr(), &t);
    o.arbitration = Arbitration::PreferWeighted;
    o.arbitration_feature = Some(3 << 24 | 1 << 16 | 3);
    let c = Controller::connect(o.clone()).expect("connects on round robin");
    assert_eq!(c.info().arbitration, Arbitration::RoundRobin);
    c.disconnect().expect("disconnect");
    o.arbitration = Arbitration::WeightedRoundRobin;
    let e = Controller::connect(o).err().expect("WRR is not offered");
    assert!(e.to_string().contains("CAP.AMS"), "{e}");
}
