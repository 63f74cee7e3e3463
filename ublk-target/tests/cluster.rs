//! Cluster mode's attach and fencing against real targets and a real etcd:
//! two in-process gimbal-targets (reservations) hold a mirrored volume's
//! replicas, a three-member etcd on loopback holds its owner, epoch and
//! health. No ublk device: `Volume::connect` is the part under test (the
//! device path is the VM scenario `cluster`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_store::testing::EtcdCluster;
use gimbal_target::config::TargetConfig;
use gimbal_target::server::{spawn, TargetHandle};
use nvmf_initiator::blocking::HostIdentity;
use nvmf_initiator::fake_target::{FakeConfig, FakeTarget};
use ublk_target::config::VolumeConfig;
use ublk_target::volume::{Priority, Volume};

const NQN: &str = "nqn.2026-01.io.test:cluster";

/// One test at a time: see tests/fanout.rs, `SERIAL` (etcd children and
/// intent-log locks).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn target(serial: &str) -> TargetHandle {
    let toml = format!(
        "listen = [\"127.0.0.1:0\"]\n[[subsystem]]\nnqn = \"{NQN}\"\nserial = \"{serial}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"8MiB\"\nblock_size = 512\n"
    );
    spawn(TargetConfig::parse(Path::new("t.toml"), &toml).expect("target config")).expect("target")
}

/// Host `n`'s volume file: replicas on `ports`, its own state directory.
fn config(ports: &[u16], etcd: &EtcdCluster, dir: &Path, extra: &str) -> VolumeConfig {
    let mut t = String::from("name = \"cv\"\n");
    for p in ports {
        t += &format!("[[replica]]\naddress = \"127.0.0.1\"\nport = {p}\nsubnqn = \"{NQN}\"\n");
    }
    let eps: Vec<String> = etcd.endpoints().iter().map(|e| format!("{e:?}")).collect();
    t += &format!(
        "[priority]\nsource = \"fixed\"\n[replication]\nregion_size = \"1m\"\nbitmap_dir = \"{}\"\n\
         [cluster]\nendpoints = [{}]\nprefix = \"/ct\"\nlease_ttl = 3\nop_timeout_ms = 300\n{extra}",
        dir.display(),
        eps.join(", ")
    );
    VolumeConfig::parse(Path::new("cv.toml"), &t).expect("volume config")
}

fn connect(c: VolumeConfig, host: u8, takeover: bool) -> Result<Arc<Volume>, String> {
    let priority = Priority::new(c.priority, None, String::new());
    let id = HostIdentity {
        nqn: format!("nqn.2026-01.io.test:host{host}"),
        id: [host; 16],
    };
    Volume::connect(c, id, priority, false, takeover)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

#[test]
fn a_takeover_fences_the_old_owner_at_every_replica() {
    let _serial = serial();
    let etcd = EtcdCluster::start(3);
    let (t1, t2) = (target("CLUSTER1"), target("CLUSTER2"));
    let ports = [t1.local_addrs()[0].port(), t2.local_addrs()[0].port()];
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = connect(config(&ports, &etcd, da.path(), ""), 1, false).unwrap();
    let a_link = a.cluster.clone().expect("cluster mode");
    assert_eq!(a_link.epoch(), 1);
    let block = vec![0xa5u8; 512];
    for r in &a.replicas {
        r.ctrl.write(1, 0, &block).expect("the owner writes");
        let s = r.ctrl.reservation_report(1).unwrap();
        let holder = s.registrants.iter().find(|x| x.holds).expect("a holder");
        assert_eq!(holder.rkey, cluster_store::reservation_key("cv", 1));
        assert_eq!(s.rtype, 2, "Exclusive Access");
    }

    // Host 2 is told who owns the volume, then takes it over.
    let e = connect(config(&ports, &etcd, db.path(), ""), 2, false)
        .err()
        .expect("host 1 owns it");
    assert!(e.contains("owned by nqn.2026-01.io.test:host1"), "{e}");
    let b = connect(config(&ports, &etcd, db.path(), ""), 2, true).unwrap();
    assert_eq!(b.cluster.as_ref().unwrap().epoch(), 2);
    for (i, r) in a.replicas.iter().enumerate() {
        let w = r.ctrl.write(1, 0, &block).unwrap_err();
        assert!(w.is_reservation_conflict(), "replica {i}: {w}");
        let mut buf = vec![0u8; 512];
        let rd = r.ctrl.read(1, 0, &mut buf).unwrap_err();
        assert!(
            rd.is_reservation_conflict(),
            "reads too (Exclusive Access): {rd}"
        );
    }
    for r in &b.replicas {
        r.ctrl.write(1, 8, &block).expect("the new owner writes");
    }
    // The old owner's agent sees the epoch move on and fences itself.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !a_link.is_fenced() {
        assert!(Instant::now() < deadline, "{:?}", a_link.status());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        a_link.status().fenced.unwrap().contains("epoch 2"),
        "{:?}",
        a_link.status()
    );
    // Cluster state in /metrics, in Prometheus' own parser's eyes.
    let page = ublk_target::metrics::render(&a, "");
    prom_exposition::check::promtool_check(&page).unwrap();
    assert!(
        page.contains("ublk_nvmf_cluster_fenced{volume=\"cv\"} 1"),
        "{page}"
    );
    let page = ublk_target::metrics::render(&b, "");
    assert!(
        page.contains("ublk_nvmf_cluster_epoch{volume=\"cv\"} 2"),
        "{page}"
    );
    b.cluster.as_ref().unwrap().stop_and_wait(true);
    // Released: the next attach needs no takeover.
    drop(a);
    let a2 = connect(config(&ports, &etcd, da.path(), ""), 1, false).unwrap();
    assert_eq!(a2.cluster.as_ref().unwrap().epoch(), 3);
    a2.cluster.as_ref().unwrap().stop_and_wait(true);
}

#[test]
fn a_target_without_reservations_is_refused_unless_fencing_is_off() {
    let _serial = serial();
    let etcd = EtcdCluster::start(3);
    let t = FakeTarget::new(FakeConfig {
        subnqn: NQN.into(),
        ..FakeConfig::default()
    });
    let s = t.serve();
    let dir = tempfile::tempdir().unwrap();
    let port = [s.addr().port()];
    let e = connect(config(&port, &etcd, dir.path(), ""), 1, false)
        .err()
        .expect("refused");
    assert!(e.contains("does not support reservations"), "{e}");
    // Given up again: nobody owns the volume after the failed start.
    let v = connect(
        config(&port, &etcd, dir.path(), "fencing = \"none\"\n"),
        2,
        false,
    )
    .unwrap();
    assert_eq!(v.cluster.as_ref().unwrap().epoch(), 2);
    v.cluster.as_ref().unwrap().stop_and_wait(true);
}
