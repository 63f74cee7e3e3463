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
