//! A real etcd cluster on loopback for tests: `n` members of Debian's
//! `etcd` (package `etcd-server`, installed by `tests/vm/setup-host.sh`),
//! each with its own data directory and ports, killed and restarted at
//! will. Tests that need etcd fail (never skip) when the binary is
//! missing: the message says what to install.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::store::{Store, StoreConfig};

/// One member.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running cluster; every member is killed when it is dropped.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    binary: PathBuf,
}

/// Where the `etcd` binary is: `$ETCD`, else on `PATH`.
pub fn etcd_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ETCD") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for d in std::env::split_paths(&path) {
        let p = d.join("etcd");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err("etcd is not installed: install Debian's etcd-server (tests/vm/setup-host.sh does), or set $ETCD to its binary".into())
}

fn free_port() -> u16 {
    // Bound and released at once: a small window in which another process
    // could take it, acceptable on a test machine (loopback only).
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster has a leader.
    /// Panics with the reason if it cannot (tests only).
    pub fn start(n: usize) -> Self {
        let binary = etcd_binary().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("etcd-test-")
            .tempdir()
            .expect("a temporary directory");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let mut c = Self {
            dir,
            members,
            binary,
        };
        for i in 0..n {
            c.spawn(i, true);
        }
        c.wait_ready(Duration::from_secs(60));
        c
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize, new: bool) {
        let initial = self.initial_cluster();
        let dir: &Path = self.dir.path();
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", m.name)))
            .expect("the member's log file");
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(dir.join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args([
                "--initial-cluster-state",
                if new { "new" } else { "existing" },
            ])
            .args(["--initial-cluster-token", "ublk-nvmf-test"])
            // Short timers: elections in about a second on a loaded
            // 2-core machine, not the default's several.
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.binary.display()));
        self.members[i].child = Some(child);
    }

    /// Waits until a write goes through (a leader and a quorum).
    pub fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.store(Duration::from_secs(2)).and_then(|s| {
                s.grant_lease(Duration::from_secs(1))
                    .map_err(|e| e.to_string())
            });
            match ok {
                Ok(_) => return,
                Err(e) if Instant::now() > deadline => {
                    panic!(
                        "etcd test cluster not ready after {within:?}: {e}; logs in {}",
                        self.dir.path().display()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// A client of every member.
    pub fn store(&self, op_timeout: Duration) -> Result<Store, String> {
        Store::connect(StoreConfig {
            endpoints: self.endpoints(),
            op_timeout,
        })
        .map_err(|e| e.to_string())
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i, false);
    }

    /// Where the members' data and logs are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
