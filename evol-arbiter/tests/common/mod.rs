//! What the arbiter's integration tests share: arbiters as the real
//! binary against a test etcd (`cluster_store::testing`), the client they
//! talk through, and waits on conditions with a generous deadline (no
//! timing assertions).

#![allow(dead_code)] // each test binary uses a different subset

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster_store::testing::EtcdCluster;
use evol_arbiter::client::{ArbiterClient, ClientOptions};

/// The `evol-arbiter` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_evol-arbiter");
/// The deadline of every wait.
pub const LONG: Duration = Duration::from_secs(90);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An arbiter process; SIGKILLed when dropped.
pub struct Arb {
    pub id: String,
    /// The RPC's `127.0.0.1:PORT`.
    pub addr: String,
    child: Child,
}

impl Arb {
    /// Arbiter `id` on a free loopback port, its config and log
    /// (`ID.toml`, `ID.log`) in `dir`: keys under `prefix`, a 2 s lease
    /// and 200 ms etcd requests, so that a failover is quick.
    pub fn start(dir: &Path, id: &str, etcd: &EtcdCluster, prefix: &str) -> Arb {
        let addr = format!("127.0.0.1:{}", free_port());
        let endpoints: Vec<String> = etcd.endpoints().iter().map(|e| format!("{e:?}")).collect();
        let cfg = format!(
            "id = \"{id}\"\nlisten = \"{addr}\"\n\n[etcd]\nendpoints = [{}]\nprefix = \"{prefix}\"\nlease_ttl = 2\nop_timeout_ms = 200\n",
            endpoints.join(", ")
        );
        let path = dir.join(format!("{id}.toml"));
        std::fs::write(&path, cfg).unwrap();
        let log = std::fs::File::create(dir.join(format!("{id}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting evol-arbiter");
        Arb {
            id: id.to_owned(),
            addr,
            child,
        }
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Arb {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `f`'s first `Some`, polled every 50 ms; fails the test after [`LONG`].
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LONG;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client of the arbiters under `prefix` that follows the leader for
/// up to [`LONG`] per call (3 s per RPC).
pub fn client(etcd: &EtcdCluster, prefix: &str) -> ArbiterClient {
    let mut o = ClientOptions::new(etcd.endpoints(), prefix);
    o.rpc_timeout = Duration::from_secs(3);
    o.call_timeout = LONG;
    ArbiterClient::connect(o).unwrap()
}

/// An in-process gimbal-target on `port` serving subsystem `nqn` with one
/// namespace: a file at `image` of `bytes` (a previous instance's data
/// survives a restart on the same file).
pub fn file_target(
    port: u16,
    nqn: &str,
    image: &Path,
    bytes: u64,
) -> gimbal_target::server::TargetHandle {
    let toml = format!(
        "listen = [\"127.0.0.1:{port}\"]\n[[subsystem]]\nnqn = \"{nqn}\"\nserial = \"EVOLTEST\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"{}\"\nsize = \"{bytes}\"\nblock_size = 512\n",
        image.display(),
    );
    wait_for("the target to start", || {
        gimbal_target::server::spawn(
            gimbal_target::config::TargetConfig::parse(Path::new("t.toml"), &toml)
                .expect("target config"),
        )
        .ok()
    })
}

/// A host's blocking controller of the target on `port`, subsystem `nqn`.
pub fn host(port: u16, nqn: &str) -> nvmf_initiator::blocking::Controller {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    nvmf_initiator::blocking::Controller::connect(nvmf_initiator::blocking::ConnectOptions::new(
        addr, nqn,
    ))
    .expect("connecting to the target")
}

/// Namespace `ns0` (target `t0`, nsid 1 of `nqn` on `port`, `extents`
/// extents) into the pool through `c`.
pub fn add_ns0(c: &ArbiterClient, port: u16, nqn: &str, extents: u64) {
    c.add_namespace(&evol_arbiter::pb::AddNamespaceRequest {
        id: "ns0".into(),
        target: "t0".into(),
        address: format!("127.0.0.1:{port}"),
        subnqn: nqn.into(),
        nsid: 1,
        extents,
        capacity_bytes: 0,
    })
    .unwrap();
}
