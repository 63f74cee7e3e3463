//! The NVMe/TCP target `ublk-nvmf demo` serves its device from: the
//! `gimbal-target` binary as a child process with one RAM namespace on a
//! free loopback port. A separate binary, so the client does not link the
//! target (nor its async runtime).
//!
//! The child runs in its own process group, so a Ctrl-C at the terminal
//! reaches only `ublk-nvmf`, which removes the device first and then stops
//! the target (dropping [`DemoTarget`]); it gets SIGTERM if `ublk-nvmf`
//! dies without that (killed, or a Ctrl-C before its handler is set).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The binary's name.
const BINARY: &str = "gimbal-target";
/// How long the target may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of its stderr kept for an error message.
const STDERR_TAIL_LINES: usize = 20;

/// A running `gimbal-target` child; stopped and reaped when dropped.
pub struct DemoTarget {
    child: Child,
    addr: SocketAddr,
    config_path: PathBuf,
    /// The child's last stderr lines (all of them are also copied to ours).
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
}

impl DemoTarget {
    /// Start `gimbal-target` serving subsystem `nqn` (any host) with one
    /// RAM namespace of `size` (4 KiB blocks); return once it accepts
    /// connections.
    pub fn start(nqn: &str, size: &str) -> anyhow::Result<Self> {
        let binary = find_binary()?;
        let addr = free_loopback_addr().context("choosing a loopback port")?;
        let text = format!(
            "listen = [\"{addr}\"]\n[[subsystem]]\nnqn = \"{nqn}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"{size}\"\nblock_size = 4096\n"
        );
        let config_path =
            std::env::temp_dir().join(format!("ublk-nvmf-demo-{}.toml", std::process::id()));
        write_private(&config_path, &text)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let mut cmd = Command::new(&binary);
        cmd.arg("run")
            .arg("--config")
            .arg(&config_path)
            .args(["--status-interval", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if std::env::var_os("RUST_LOG").is_none() {
            // As quiet as ublk-nvmf itself by default.
            cmd.env("RUST_LOG", "warn");
        }
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&config_path);
                return Err(e).with_context(|| format!("starting {}", binary.display()));
            }
        };
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_thread = child.stderr.take().map(|stderr| {
            let tail = Arc::clone(&stderr_tail);
            std::thread::spawn(move || copy_stderr(stderr, &tail))
        });
        let mut target = DemoTarget {
            child,
            addr,
            config_path,
            stderr_tail,
            stderr_thread,
        };
        target.wait_ready(&binary)?;
        // It has read its config.
        let _ = std::fs::remove_file(&target.config_path);
        Ok(target)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait until the target accepts a connection, or fail (with its
    /// stderr) when it exits or takes longer than [`READY_TIMEOUT`].
    fn wait_ready(&mut self, binary: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // Its stderr ends with it: let the copy catch up.
                if let Some(t) = self.stderr_thread.take() {
                    let _ = t.join();
                }
                bail!(
                    "{} exited before accepting connections ({status}){}",
                    binary.display(),
                    self.stderr_text()
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not accept connections on {} within {} s{}",
                    binary.display(),
                    self.addr,
                    READY_TIMEOUT.as_secs(),
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The kept stderr lines, as the tail of an error message.
    fn stderr_text(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
        format!("; its stderr:\n{}", lines.join("\n"))
    }
}

impl Drop for DemoTarget {
    fn drop(&mut self) {
        // Not reaped yet, so the pid is still the child's.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signals our own child process.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        let _ = std::fs::remove_file(&self.config_path);
    }
}

/// Where the `gimbal-target` binary is: `$GIMBAL_TARGET`, else next to
/// this executable (both are built into the same `target/` directory),
/// else on `PATH`.
fn find_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("GIMBAL_TARGET") {
        let p = PathBuf::from(p);
        if !is_executable(&p) {
            bail!("GIMBAL_TARGET={} is not an executable file", p.display());
        }
        return Ok(p);
    }
    let own_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = own_dir
        .iter()
        .cloned()
        .chain(std::env::split_paths(&path))
        .map(|dir| dir.join(BINARY))
        .find(|p| is_executable(p));
    match found {
        Some(p) => Ok(p),
        None => bail!(
            "cannot find the {BINARY} binary (not in $GIMBAL_TARGET, not next to ublk-nvmf{}, not on PATH): \
             build it with `cargo build --release` (builds both ublk-nvmf and {BINARY} into target/release/), \
             or set GIMBAL_TARGET to its path",
            own_dir
                .map(|d| format!(" in {}", d.display()))
                .unwrap_or_default()
        ),
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A loopback address with a port free now. (Another process could take
/// it before the target binds it; the target then exits with an error
/// that names it.)
fn free_loopback_addr() -> std::io::Result<SocketAddr> {
    TcpListener::bind(("127.0.0.1", 0))?.local_addr()
}

/// Write `text` to a new file only we can read (a stale one of ours, or
/// anything else at that path, is replaced rather than followed).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Copy the child's stderr to ours line by line, keeping the last lines.
fn copy_stderr(stderr: std::process::ChildStderr, tail: &Mutex<VecDeque<String>>) {
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        eprintln!("{line}");
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() == STDERR_TAIL_LINES {
            t.pop_front();
        }
        t.push_back(line);
    }
}
