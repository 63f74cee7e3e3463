//! The memory budget and the time bounds under hosts that abuse them
//! (issue 15, items 1-3): reads and R2T writes wait for the queue's data
//! budget instead of allocating; a host that stops reading is cut off; a
//! keep-alive expiry closes every queue of the controller; connections that
//! never finish their handshake are reaped; connections beyond the limit
//! are refused; shutdown completes whatever a host does.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gimbal_target::server::TargetHandle;
use nvmf_proto::command::AdminCommand;
use nvmf_proto::pdu::{CapsuleCmd, H2CData, IcReq, Pdu};
use nvmf_proto::{IoCommand, SglDescriptor};
use support::*;

const MIB: usize = 1 << 20;

/// The demo subsystem on a 64 MiB RAM namespace, with `tables` (TOML
/// `[limits]`, `[timeouts]`, `[keep_alive]`) in front.
fn target_with(tables: &str) -> TargetHandle {
    start_target(&format!(
        r#"
listen = ["127.0.0.1:0"]
{tables}
[[subsystem]]
nqn = "{DEMO_NQN}"
allow_any_host = true
[[subsystem.namespace]]
backend = "ram"
size = "64MiB"
"#
    ))
}

/// Waits up to 10 s for `cond`.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn reads_wait_for_the_data_budget_instead_of_allocating() {
    let t = target_with("[limits]\nmax_queue_data_bytes = 1048576\n");
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let data: Vec<Vec<u8>> = (0..8).map(|i| pattern(MIB, i)).collect();
    for (i, d) in data.iter().enumerate() {
        assert!(io
            .write(1, i as u64 * 2048, d, 512, 8192)
            .status
            .is_success());
    }
    let mut bytes = Vec::new();
    for i in 0..8u16 {
        let sqe = IoCommand::read(1, u64::from(i) * 2048, 2048, MIB as u32)
            .unwrap()
            .to_sqe(100 + i);
        Pdu::CapsuleCmd(CapsuleCmd::new(sqe))
            .encode(&io.enc, &mut bytes)
            .unwrap();
    }
    std::io::Write::write_all(&mut io.stream, &bytes).unwrap();
    // Not reading: at most one read's data (the queue's budget) is held.
    std::thread::sleep(Duration::from_millis(300));
    assert!(t.target().buffered.used() <= MIB, "the budget holds");
    // Reading: each waits its turn and completes whole, in order.
    for (i, d) in data.iter().enumerate() {
        let (cqe, back) = io.gather(100 + i as u16);
        assert!(cqe.status.is_success());
        assert!(&back == d, "read {i}");
    }
    eventually("the budget is back", || t.target().buffered.used() == 0);
}

#[test]
fn queues_wait_for_the_target_wide_pool_and_get_it_when_others_drain() {
    let t = target_with("[limits]\nmax_queue_data_bytes = 1048576\nmax_buffered_bytes = 1048576\n");
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 2);
    let mut a = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let mut b = TestHost::connect_io(addr, admin.cntlid, 2, false, false);
    // A holds the whole target pool: its 4 MiB of reads are not read yet.
    a.send_reads(1..5, MIB as u32);
    std::thread::sleep(Duration::from_millis(200));
    // B's read waits for the pool ...
    b.send_reads(1..2, 4096);
    assert!(matches!(
        b.recv_within(Duration::from_millis(300)),
        Polled::Nothing
    ));
    // ... and is served once A's data drains.
    for cid in 1..5 {
        assert!(a.gather(cid).0.status.is_success());
    }
    let (cqe, data) = b.gather(1);
    assert!(cqe.status.is_success());
    assert_eq!(data.len(), 4096);
    eventually("the pool is back", || t.target().buffered.used() == 0);
}

#[test]
fn r2t_writes_are_solicited_only_within_the_data_budget() {
    let t = target_with("[limits]\nmax_queue_data_bytes = 2097152\n");
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let data: Vec<Vec<u8>> = (0..6).map(|i| pattern(MIB, 50 + i)).collect();
    for i in 0..6u16 {
        let w = IoCommand::write(
            1,
            u64::from(i) * 2048,
            2048,
            SglDescriptor::transport(MIB as u32),
        )
        .unwrap();
        io.send(&Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(200 + i))));
    }
    let mut r2ts = std::collections::VecDeque::new();
    // Exactly two R2Ts (2 MiB) until data flows.
    while let Polled::Pdu(p) = io.recv_within(Duration::from_millis(500)) {
        match p {
            Pdu::R2T(r) => r2ts.push_back(r),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(r2ts.len(), 2, "R2Ts only for what the budget holds");
    for _ in 0..6 {
        let r2t = match r2ts.pop_front() {
            Some(r) => r,
            None => match io.recv() {
                Pdu::R2T(r) => r,
                other => panic!("expected an R2T, got {other:?}"),
            },
        };
        let i = usize::from(r2t.cccid - 200);
        let piece = io.maxh2cdata as usize;
        for off in (0..MIB).step_by(piece) {
            io.send(&Pdu::H2CData(H2CData {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                datao: off as u32,
                last: off + piece >= MIB,
                data: data[i][off..(off + piece).min(MIB)].to_vec().into(),
            }));
        }
        // Its completion; the R2T of a waiting write may come before it.
        loop {
            match io.recv() {
                Pdu::R2T(r) => r2ts.push_back(r),
                Pdu::CapsuleResp(c) => {
                    assert_eq!(c.cqe.cid, r2t.cccid);
                    assert!(c.cqe.status.is_success());
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
            assert!(r2ts.len() <= 2, "never more solicited than the budget");
        }
    }
    for (i, d) in data.iter().enumerate() {
        let (cqe, back) = io.read(1, i as u64 * 2048, 2048, 512);
        assert!(cqe.status.is_success());
        assert!(&back == d, "write {i} landed");
    }
}

#[test]
fn a_host_that_stops_reading_is_cut_off_after_the_send_timeout() {
    let t = target_with("[timeouts]\nsend_ms = 500\n");
    let addr = t.local_addrs()[0];
    let mut admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    io.send_reads(1..64, MIB as u32);
    // The I/O queue's sends stall; the connection ends and the controller
    // with it: the admin queue closes too, and every buffer is released.
    assert!(admin.expect_termination().is_none());
    eventually("controller gone", || t.target().controllers().is_empty());
    eventually("buffers released", || t.target().buffered.used() == 0);
    io.drain_until_closed(Duration::from_secs(10));
}

#[test]
fn keep_alive_expiry_closes_every_queue_of_the_controller() {
    let t = target_with("[keep_alive]\nmin_ms = 200\n");
    let addr = t.local_addrs()[0];
    let mut admin = TestHost::bring_up_with_kato(addr, 300, 2);
    let mut q1 = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let mut q2 = TestHost::connect_io(addr, admin.cntlid, 2, false, false);
    // Queue 1 is stuck sending to a host that does not read; queue 2 idles.
    q1.send_reads(1..64, MIB as u32);
    assert!(admin.expect_termination().is_none(), "admin queue closed");
    assert!(q2.expect_termination().is_none(), "idle I/O queue closed");
    q1.drain_until_closed(Duration::from_secs(10));
    assert!(t.target().controllers().is_empty());
    eventually("buffers released", || t.target().buffered.used() == 0);
}

#[test]
fn connections_that_never_finish_their_handshake_are_reaped() {
    let t = target_with("[timeouts]\nhandshake_ms = 300\n");
    let addr = t.local_addrs()[0];
    // Silent from the start.
    let start = Instant::now();
    let mut silent = TestHost::connect(addr);
    silent.drain_until_closed(Duration::from_secs(10));
    assert!(start.elapsed() >= Duration::from_millis(250));
    // ICReq, then nothing.
    let mut no_connect = TestHost::connect(addr);
    no_connect.icreq(false, false);
    assert!(matches!(
        no_connect.recv_within(Duration::from_secs(10)),
        Polled::Closed
    ));
    // A Connect refused, then nothing: still not associated.
    let mut refused = TestHost::connect(addr);
    refused.icreq(false, false);
    let cqe = refused.connect_admin_as("nqn.2026-01.io.gimbal:nonexistent", HOST_NQN, 0);
    assert!(!cqe.status.is_success());
    assert!(matches!(
        refused.recv_within(Duration::from_secs(10)),
        Polled::Closed
    ));
    // A connected host is never reaped by it.
    let mut admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    std::thread::sleep(Duration::from_millis(600));
    assert!(io.read(1, 0, 8, 512).0.status.is_success());
    let cid = admin.cid();
    let (cqe, _) = admin.command(AdminCommand::KeepAlive.to_sqe(cid), None);
    assert!(cqe.status.is_success());
}

#[test]
fn connections_beyond_the_limit_are_refused() {
    let t = target_with("[limits]\nmax_connections = 3\n");
    let addr = t.local_addrs()[0];
    let mut held: Vec<TestHost> = (0..3)
        .map(|_| {
            let mut h = TestHost::connect(addr);
            h.icreq(false, false);
            h
        })
        .collect();
    let mut extra = TestHost::connect(addr);
    extra.send(&Pdu::IcReq(IcReq::default()));
    assert!(matches!(
        extra.recv_within(Duration::from_secs(10)),
        Polled::Closed
    ));
    drop(held.pop());
    eventually("a slot frees", || {
        t.target().connections_live.load(Ordering::Acquire) < 3
    });
    let mut again = TestHost::connect(addr);
    again.icreq(false, false);
}

#[test]
fn shutdown_completes_while_a_host_holds_256_reads_and_never_reads() {
    let t = target_with("[limits]\nmax_queue_size = 256\n[timeouts]\nshutdown_ms = 2000\n");
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let (mut io, cqe) = TestHost::try_connect_io(addr, admin.cntlid, 1, 256, HOST_ID);
    assert!(cqe.status.is_success());
    io.send_reads(1..256, MIB as u32);
    io.send_reads(256..257, MIB as u32);
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        t.shutdown();
        let _ = done_tx.send(());
    });
    // The failure line is generous: the bound is shutdown_ms (2 s) plus the
    // flush and a second for the runtime; timing is not what is tested.
    assert!(
        done_rx.recv_timeout(Duration::from_secs(30)).is_ok(),
        "shutdown did not complete in 30 s with a host that never reads"
    );
    eprintln!("shutdown took {:?}", start.elapsed());
    drop((admin, io));
}

/// The receive buffer (`SO_RCVBUF`) of the target's end of the loopback
/// connection whose host end is `host`: this process holds both ends, so
/// the target's is the socket in `/proc/self/fd` whose inode
/// `/proc/net/tcp` lists with the two addresses swapped.
fn target_end_rcvbuf(host: &std::net::TcpStream) -> usize {
    use std::net::SocketAddr;
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(_) => panic!("the tests listen on 127.0.0.1"),
    };
    let (local, remote) = (
        hex(host.peer_addr().unwrap()),
        hex(host.local_addr().unwrap()),
    );
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let inode = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 9 && f[1] == local && f[2] == remote)
        .map(|f| f[9].to_string())
        .expect("the target's end in /proc/net/tcp");
    let link = format!("socket:[{inode}]");
    let fd = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|p| p.to_str() == Some(link.as_str())))
        .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .expect("the target's end among this process's descriptors");
    sock_tune::socket_int(fd, libc::SO_RCVBUF).unwrap() as usize
}

/// An I/O queue's socket on the target's end can hold what the queue may
/// solicit before the target reads it (issue 14: left to autotuning, one
/// connection's settled at a quarter of its R2T data and kept its host's
/// writes waiting for the window), up to the kernel's cap; the admin
/// queue's keeps the kernel's default.
#[test]
fn an_io_queues_receive_buffer_holds_what_its_r2ts_solicit() {
    let t = target_with("");
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let rmem_max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse::<usize>().ok())
        .expect("net.ipv4.tcp_rmem");
    // `connect_io` asks for 64 entries.
    let window = gimbal_target::frontend::budget::receive_window(&Default::default(), 64);
    let want = window.min(rmem_max / 2);
    let (admin_buf, io_buf) = (
        target_end_rcvbuf(&admin.stream),
        target_end_rcvbuf(&io.stream),
    );
    assert!(
        io_buf >= want && io_buf > admin_buf,
        "I/O queue's receive buffer {io_buf} (admin queue's {admin_buf}), want at least {want}"
    );
}
