//! Socket options both ends of our NVMe/TCP connections set.
//!
//! A queue's TCP receive buffer must hold the data its peer may send
//! before we read it: for the host, the read data of every outstanding
//! read; for the target, the write data it solicited by R2T. Left to the
//! kernel's autotuning, a connection's buffer can settle well below that
//! and stay there (issue 14: a target-side buffer of 0.92 MB against 4 MiB
//! solicited kept one volume's writes receive-window-limited for 17 % of
//! their time), so each end grows its own with [`grow_receive_buffer`].

use std::os::fd::RawFd;

/// Let the socket `fd` hold at least `bytes` of received data unread
/// (the kernel caps it at half of `net.ipv4.tcp_rmem`'s maximum);
/// returns the socket's receive buffer (`SO_RCVBUF`, bookkeeping
/// included) after.
///
/// Raising the low-water mark to `bytes` makes TCP grow the buffer to
/// hold that much (`tcp_set_rcvlowat`, Linux 4.18+); lowering it again
/// leaves the buffer as it is, and TCP never shrinks it. Setting
/// `SO_RCVBUF` instead would turn the kernel's autotuning off for the
/// socket and is capped by `net.core.rmem_max` (208 KiB by default)
/// unless the process has `CAP_NET_ADMIN`. The buffer is a limit, not an
/// allocation: memory is charged only for data that has arrived and not
/// been read, under the kernel's global `tcp_mem`. The mark is back at
/// one byte when this returns, whatever failed, so that a plain receive
/// never waits for more than has arrived.
pub fn grow_receive_buffer(fd: RawFd, bytes: usize) -> std::io::Result<usize> {
    let raised = set_int(
        fd,
        libc::SO_RCVLOWAT,
        bytes.min(libc::c_int::MAX as usize) as libc::c_int,
    );
    set_int(fd, libc::SO_RCVLOWAT, 1)?;
    raised?;
    Ok(socket_int(fd, libc::SO_RCVBUF)?.max(0) as usize)
}

/// The `SOL_SOCKET` option `opt` of socket `fd`, an int.
pub fn socket_int(fd: RawFd, opt: libc::c_int) -> std::io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v`/`len` describe a c_int; a bad fd is an error.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Set the `SOL_SOCKET` option `opt` of socket `fd` to the int `v`.
fn set_int(fd: RawFd, opt: libc::c_int, v: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a c_int option value of its size; a bad fd is an error.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    const FOUR_MIB: usize = 4 << 20;

    #[test]
    fn a_connected_socket_can_hold_the_window_asked_and_reads_at_one_byte() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (sock, _) = l.accept().unwrap();
        let fd = sock.as_raw_fd();
        let lowat = || socket_int(fd, libc::SO_RCVLOWAT).unwrap();
        let before = grow_receive_buffer(fd, 0).unwrap();
        let after = grow_receive_buffer(fd, FOUR_MIB).unwrap();
        // The kernel caps the mark (so the growth) at half of tcp_rmem's
        // maximum; the buffer counts bookkeeping too, so it is at least
        // the data it must hold.
        let max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
            .ok()
            .and_then(|s| s.split_whitespace().nth(2)?.parse::<usize>().ok())
            .unwrap_or(usize::MAX);
        let want = FOUR_MIB.min(max / 2);
        assert!(
            after >= want && after > before,
            "receive buffer {before} -> {after}, want at least {want}"
        );
        // A plain receive must never wait for more than has arrived.
        assert_eq!(lowat(), 1);
        // Never shrunk by a smaller request.
        assert!(grow_receive_buffer(fd, 4096).unwrap() >= after);
        assert_eq!(lowat(), 1);
    }

    #[test]
    fn a_closed_descriptor_is_an_error_not_a_panic() {
        assert!(grow_receive_buffer(-1, FOUR_MIB).is_err());
        assert!(socket_int(-1, libc::SO_RCVBUF).is_err());
    }
}
