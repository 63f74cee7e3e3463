//! Device state under `/run/ublk-nvmf/` (override with `UBLK_NVMF_RUN_DIR`):
//!
//! - `NAME.json`: the volume's config path, target identity and ublk device
//!   ID, written once the device is live. A restarted server reads it to
//!   recover the same `/dev/ublkbN` instead of creating a new one; `list`
//!   and the udev helper read it to map devices to volumes.
//! - `NAME.sock`: the running server's control socket: one request line
//!   (`status`, `status-json`, `stop`), one reply, then close.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::volume::TargetIdentity;

/// The state directory.
pub fn run_dir() -> PathBuf {
    std::env::var_os("UBLK_NVMF_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/ublk-nvmf"))
}

/// Where host identities are kept (`UBLK_NVMF_LIB_DIR`, default
/// `/var/lib/ublk-nvmf`).
pub fn lib_dir() -> PathBuf {
    std::env::var_os("UBLK_NVMF_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/ublk-nvmf"))
}

/// What is saved per live device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceState {
    /// Volume name.
    pub volume: String,
    /// Config file.
    pub config: PathBuf,
    /// ublk device ID (`/dev/ublkbN`).
    pub dev_id: u32,
    /// Server PID.
    pub pid: u32,
    /// The namespace it serves.
    pub target: TargetIdentity,
}

impl DeviceState {
    /// Block device path.
    pub fn device(&self) -> String {
        format!("/dev/ublkb{}", self.dev_id)
    }
}

/// Path of `name`'s state file.
pub fn state_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}

/// Path of `name`'s control socket.
pub fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

/// Write the state atomically.
pub fn save(dir: &Path, s: &DeviceState) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(dir.display().to_string(), e))?;
    let path = state_path(dir, &s.volume);
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(s).map_err(|e| Error::State(e.to_string()))?;
    std::fs::write(&tmp, text).map_err(|e| Error::Io(tmp.display().to_string(), e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::Io(path.display().to_string(), e))?;
    Ok(())
}

/// Read `name`'s state, if any.
pub fn load(dir: &Path, name: &str) -> Result<Option<DeviceState>, Error> {
    let path = state_path(dir, name);
    match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| Error::State(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Io(path.display().to_string(), e)),
    }
}

/// Remove `name`'s state and socket.
pub fn remove(dir: &Path, name: &str) {
    let _ = std::fs::remove_file(state_path(dir, name));
    let _ = std::fs::remove_file(socket_path(dir, name));
}

/// Every saved device state, sorted by volume name.
pub fn list(dir: &Path) -> Vec<DeviceState> {
    let mut v: Vec<DeviceState> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "json")
                .then(|| std::fs::read_to_string(&p).ok())
                .flatten()
                .and_then(|t| serde_json::from_str(&t).ok())
        })
        .collect();
    v.sort_by(|a: &DeviceState, b| a.volume.cmp(&b.volume));
    v
}

/// The volume a kernel block device name (`ublkb3`, `/dev/ublkb3`,
/// `ublkb3p1` for a partition) belongs to, from the saved states. Used
/// by the udev rule for `/dev/disk/by-id/ublk-nvmf-<volume>`.
pub fn volume_for_kernel_name(states: &[DeviceState], kernel: &str) -> Option<String> {
    let name = kernel.rsplit('/').next()?;
    let digits = name.strip_prefix("ublkb")?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let (id, rest) = digits.split_at(end);
    let id: u32 = id.parse().ok()?;
    let part = match rest {
        "" => String::new(),
        r => {
            let n = r.strip_prefix('p')?;
            if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            format!("-part{n}")
        }
    };
    states
        .iter()
        .find(|s| s.dev_id == id)
        .map(|s| format!("{}{part}", s.volume))
}

/// Send one request line to `name`'s control socket; its reply.
pub fn request(dir: &Path, name: &str, line: &str) -> Result<String, Error> {
    let path = socket_path(dir, name);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        Error::State(format!(
            "volume {name} is not running (no control socket {}: {e})",
            path.display()
        ))
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| Error::Io(path.display().to_string(), e))?;
    writeln!(s, "{line}").map_err(|e| Error::Io(path.display().to_string(), e))?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out)
        .map_err(|e| Error::Io(path.display().to_string(), e))?;
    Ok(out)
}

/// Serve the control socket on a thread: `handler(line)` gives the reply.
pub fn serve_control<F>(dir: &Path, name: &str, handler: F) -> Result<(), Error>
where
    F: Fn(&str) -> String + Send + 'static,
{
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(dir.display().to_string(), e))?;
    let path = socket_path(dir, name);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).map_err(|e| Error::Io(path.display().to_string(), e))?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for s in l.incoming().flatten() {
                let mut line = String::new();
                let mut r = BufReader::new(&s);
                if r.read_line(&mut line).is_ok() {
                    let reply = handler(line.trim());
                    let _ = (&s).write_all(reply.as_bytes());
                }
            }
        })
        .map_err(|e| Error::Io("control thread".into(), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::mapping::Geometry;

    fn st(volume: &str, dev_id: u32) -> DeviceState {
        DeviceState {
            volume: volume.into(),
            config: "/etc/ublk-nvmf/x.toml".into(),
            dev_id,
            pid: 1,
            target: TargetIdentity {
                subnqn: "nqn.x".into(),
                serial: "s".into(),
                nguid: "00".into(),
                geometry: Geometry {
                    nsid: 1,
                    block_size: 512,
                    blocks: 8,
                    max_io_bytes: 4096,
                    volatile_cache: false,
                    discard: false,
                    write_zeroes: false,
                },
            },
        }
    }

    #[test]
    fn kernel_names_map_to_volumes() {
        let s = vec![st("db", 0), st("logs", 12)];
        assert_eq!(volume_for_kernel_name(&s, "ublkb0").as_deref(), Some("db"));
        assert_eq!(
            volume_for_kernel_name(&s, "/dev/ublkb12").as_deref(),
            Some("logs")
        );
        assert_eq!(
            volume_for_kernel_name(&s, "ublkb12p3").as_deref(),
            Some("logs-part3")
        );
        assert_eq!(volume_for_kernel_name(&s, "ublkb1"), None);
        assert_eq!(volume_for_kernel_name(&s, "ublkc0"), None);
        assert_eq!(volume_for_kernel_name(&s, "ublkb0x"), None);
        assert_eq!(volume_for_kernel_name(&s, "sda"), None);
    }

    #[test]
    fn state_round_trips_and_control_socket_answers() {
        let dir = std::env::temp_dir().join(format!("ublk-nvmf-state-{}", std::process::id()));
        save(&dir, &st("db", 3)).unwrap();
        assert_eq!(load(&dir, "db").unwrap(), Some(st("db", 3)));
        assert_eq!(list(&dir).len(), 1);
        assert_eq!(load(&dir, "nope").unwrap(), None);
        serve_control(&dir, "db", |l| format!("got {l}\n")).unwrap();
        assert_eq!(request(&dir, "db", "status").unwrap(), "got status\n");
        remove(&dir, "db");
        assert!(request(&dir, "db", "status")
            .unwrap_err()
            .to_string()
            .contains("not running"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
