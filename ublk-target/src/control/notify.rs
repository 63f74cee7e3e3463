//! The systemd notify protocol (`sd_notify(3)`): one datagram to the Unix
//! socket named by `$NOTIFY_SOCKET` (a path, or `@name` for the abstract
//! namespace). Without the variable (not under systemd) nothing is sent.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Send `state` (e.g. `READY=1\nSTATUS=...`) to the service manager, if
/// there is one. Returns whether a message was sent.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(&path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_reaches_the_socket() {
        let dir = std::env::temp_dir().join(format!("ublk-nvmf-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(notify("READY=1\nSTATUS=live").unwrap());
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=live");
        assert!(!notify("READY=1").unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
