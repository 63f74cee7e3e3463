//! The initiator against the real `gimbal-target`, in-process on loopback:
//! discovery, bring-up, Identify, and write/read/verify with sizes that go
//! in-capsule, by R2T in several H2CData PDUs, and split at MDTS; with
//! digests off and on.

use std::path::Path;
use std::time::Duration;

use gimbal_target::config::TargetConfig;
use gimbal_target::server::{spawn, TargetHandle};
use nvmf_initiator::blocking::{discover, ConnectOptions, Controller, HostIdentity};
use nvmf_initiator::{Command, ConnectRefusal, Error, Request};
use nvmf_proto::fabrics::PriorityClass;

const NQN: &str = "nqn.2026-01.io.test:gimbal-it";
const HOST: &str = "nqn.2026-01.io.test:it-host";

fn target(extra_hosts: &str) -> TargetHandle {
    let toml = format!(
        r#"
listen = ["127.0.0.1:0"]

[limits]
max_data_transfer_bytes = 65536
in_capsule_data_bytes = 8192
max_h2c_data_bytes = 16384

[[subsystem]]
nqn = "{NQN}"
{extra_hosts}

[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "16MiB"
block_size = 512
"#
    );
    let cfg = TargetConfig::parse(Path::new("it.toml"), &toml).expect("config");
    spawn(cfg).expect("spawn gimbal-target")
}

fn opts(t: &TargetHandle) -> ConnectOptions {
    let mut o = ConnectOptions::new(t.local_addrs()[0], NQN);
    o.host = HostIdentity {
        nqn: HOST.into(),
        id: [3; 16],
    };
    o.queue_depth = 32;
    o
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[test]
fn discover_identify_and_verified_io_with_and_without_digests() {
    let t = target("allow_any_host = true");
    let entries = discover(
        t.local_addrs()[0],
        &HostIdentity::random(),
        Duration::from_secs(5),
        None,
    )
    .expect("discovery");
    assert!(entries.iter().any(|e| e.subnqn == NQN), "{entries:?}");
    for digests in [false, true] {
        let mut o = opts(&t);
        o.header_digest = digests;
        o.data_digest = digests;
        let c = Controller::connect(o).expect("connect");
        let info = c.info();
        assert_eq!(info.max_transfer_bytes, 65536);
        assert_eq!(info.in_capsule_bytes, 8192);
        assert!(c.active_namespaces().unwrap().contains(&1));
        let ns = c.identify_namespace(1).unwrap();
        assert_eq!((ns.block_size, ns.size_bytes()), (512, 16 << 20));
        // In-capsule, R2T with several H2CData, MDTS split.
        for (i, len) in [512usize, 4096, 8192, 8704, 40960, 65536, 262144]
            .into_iter()
            .enumerate()
        {
            let data = pattern(len, i as u8 ^ digests as u8);
            let slba = 1024 * i as u64;
            c.write(1, slba, &data).unwrap();
            let mut back = vec![0; len];
            c.read(1, slba, &mut back).unwrap();
            assert!(back == data, "size {len} digests {digests}");
        }
        c.flush(1).unwrap();
        // Many in flight on one I/O queue.
        let mut q = c.io_queue(PriorityClass::Medium).unwrap();
        for i in 0..64u64 {
            q.submit(Request {
                command: Command::Write {
                    nsid: 1,
                    slba: 10_000 + i * 32,
                    block_size: 512,
                    fua: false,
                },
                buf: Some(pattern(16384, i as u8)),
                user_data: i,
            });
        }
        for _ in 0..64 {
            q.wait().unwrap().into_result("write").unwrap();
        }
        for i in 0..64u64 {
            q.submit(Request {
                command: Command::Read {
                    nsid: 1,
                    slba: 10_000 + i * 32,
                    block_size: 512,
                },
                buf: Some(vec![0; 16384]),
                user_data: i,
            });
        }
        for _ in 0..64 {
            let done = q.wait().unwrap();
            let seed = done.user_data as u8;
            assert!(done.into_result("read").unwrap().unwrap() == pattern(16384, seed));
        }
        assert_eq!(c.resets(), 0);
        drop(q);
        c.disconnect().unwrap();
    }
    t.shutdown();
}

#[test]
fn refused_host_and_unknown_subsystem() {
    let t = target(r#"allowed_hosts = ["nqn.2026-01.io.test:somebody-else"]"#);
    let e = Controller::connect(opts(&t)).err().expect("refused");
    assert!(
        matches!(e, Error::ConnectRefused(ConnectRefusal::HostNotAllowed)),
        "{e}"
    );
    let mut o = opts(&t);
    o.subnqn = "nqn.2026-01.io.test:no-such".into();
    let e = Controller::connect(o).err().expect("refused");
    assert!(
        matches!(e, Error::ConnectRefused(ConnectRefusal::UnknownSubsystem)),
        "{e}"
    );
    t.shutdown();
}

/// The host asks for the target's DRR (CC.AMS 111b) with weights, or for
/// weighted round robin when offered: the controller reports what runs,
/// and the Arbitration feature the target holds is the one sent.
#[test]
fn arbitration_mechanism_and_weights_are_set() {
    use nvmf_initiator::controller::Arbitration;
    use nvmf_proto::command::GetFeatures;
    use nvmf_proto::features::feature_id;

    let t = target("allow_any_host = true");
    // HPW 3, MPW 1, LPW 0 (weights 4:2:1, 0's based), burst 2^3.
    let dw11 = 3 << 24 | 1 << 16 | 3;
    for (asked, runs) in [
        (Arbitration::VendorSpecific, Arbitration::VendorSpecific),
        (Arbitration::PreferWeighted, Arbitration::WeightedRoundRobin),
    ] {
        let mut o = opts(&t);
        o.arbitration = asked;
        o.arbitration_feature = Some(dw11);
        let ctrl = Controller::connect(o).expect("connect");
        assert_eq!(ctrl.info().arbitration, runs);
        let got = ctrl
            .admin(GetFeatures::new(feature_id::ARBITRATION).to_sqe(0), None)
            .expect("get features");
        let info = got.result.expect("completion");
        assert!(info.status.is_success(), "{:?}", info.status);
        assert_eq!(info.dw0, dw11, "{asked:?}");
        ctrl.disconnect().expect("disconnect");
    }
}
