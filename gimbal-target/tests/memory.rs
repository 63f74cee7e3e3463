//! The target's resident memory under abusive hosts stays within its
//! budget (issue 15, items 1 and 3): a 16 GiB and a 256 MiB Get Log Page,
//! 1,024 x 1 MiB reads on a 128-entry SQ from a host that never reads, and
//! 2,048 R2T writes whose data never comes, on a 1,024-entry SQ.
//!
//! Its own test binary, so nothing else runs in the process while it
//! measures. The peak RSS (VmHWM) is reset before the abuse where the
//! kernel allows it (`/proc/self/clear_refs`). Prints the numbers that
//! docs/testing.md records:
//! `cargo test -p gimbal-target --release --test memory -- --nocapture`.

mod support;

use std::time::{Duration, Instant};

use nvmf_proto::command::{log_id, AdminCommand, GetLogPage};
use nvmf_proto::pdu::{CapsuleCmd, Pdu};
use nvmf_proto::{IoCommand, SglDescriptor, Status};
use support::*;

const MIB: u64 = 1 << 20;

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn get_log_page(h: &mut TestHost, numd_bytes: u64, sgl_len: u32) -> Status {
    let mut glp = GetLogPage::new(log_id::SMART_HEALTH, 0xFFFF_FFFF, 4, 0).unwrap();
    glp.numd = (numd_bytes / 4 - 1) as u32;
    glp.sgl = SglDescriptor::transport(sgl_len);
    let cid = h.cid();
    let (cqe, data) = h.command(AdminCommand::GetLogPage(glp).to_sqe(cid), None);
    assert!(data.is_empty());
    cqe.status
}

#[test]
fn abusive_hosts_stay_within_the_memory_budget() {
    let t = start_target(&format!(
        r#"
listen = ["127.0.0.1:0"]
[limits]
max_queue_size = 1024
[[subsystem]]
nqn = "{DEMO_NQN}"
allow_any_host = true
[[subsystem.namespace]]
backend = "ram"
size = "64MiB"
"#
    ));
    let addr = t.local_addrs()[0];
    let mut admin = TestHost::bring_up(addr, false, false, 4);
    // Warm up every path once (ram chunks, buffers) before measuring.
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    assert!(io.read(1, 0, 2048, 512).0.status.is_success());
    drop(io);
    let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let base = status_kib("VmRSS:");
    let start = Instant::now();

    // 1. Get Log Page: 16 GiB on a 4 KiB SGL, 256 MiB on a matching one.
    for _ in 0..100 {
        assert_eq!(
            get_log_page(&mut admin, 16 << 30, 4096),
            Status::DATA_SGL_LENGTH_INVALID.with_dnr()
        );
        assert_eq!(
            get_log_page(&mut admin, 256 * MIB, 256 << 20),
            Status::INVALID_FIELD.with_dnr()
        );
    }
    let after_log = status_kib("VmHWM:");

    // 2. 1,024 x 1 MiB reads on a 128-entry SQ, never read. The overrun
    // ends the association (as in Linux nvmet), so each abuse below has a
    // controller of its own.
    let admin2 = TestHost::bring_up(addr, false, false, 1);
    let (mut reader, cqe) = TestHost::try_connect_io(addr, admin2.cntlid, 1, 128, HOST_ID);
    assert!(cqe.status.is_success());
    reader.send_reads(1..1025, MIB as u32);
    std::thread::sleep(Duration::from_millis(1500));
    let after_reads = status_kib("VmHWM:");
    drop(reader);

    // 3. 2,048 writes by R2T on a 1,024-entry SQ, no data ever sent.
    let admin3 = TestHost::bring_up(addr, false, false, 1);
    let (mut writer, cqe) = TestHost::try_connect_io(addr, admin3.cntlid, 1, 1024, HOST_ID);
    assert!(cqe.status.is_success());
    let mut bytes = Vec::new();
    for cid in 1..=2048u16 {
        let w = IoCommand::write(1, 0, 2048, SglDescriptor::transport(MIB as u32)).unwrap();
        Pdu::CapsuleCmd(CapsuleCmd::new(w.to_sqe(cid)))
            .encode(&writer.enc, &mut bytes)
            .unwrap();
    }
    let _ = std::io::Write::write_all(&mut writer.stream, &bytes);
    let mut r2ts = 0;
    while let Polled::Pdu(p) = writer.recv_within(Duration::from_millis(1500)) {
        if matches!(p, Pdu::R2T(_)) {
            r2ts += 1;
        }
    }
    let after_writes = status_kib("VmHWM:");
    drop((writer, admin2, admin3));

    let peak = after_log.max(after_reads).max(after_writes);
    eprintln!(
        "RSS before {base} KiB; peak after log pages {after_log} KiB, after 1,024 reads \
         {after_reads} KiB, after 2,048 R2T writes {after_writes} KiB ({r2ts} R2Ts); \
         peak growth {} KiB; {:?}; peak reset: {hwm_reset}",
        peak.saturating_sub(base),
        start.elapsed()
    );
    assert!(r2ts <= 16, "R2Ts beyond the 16 MiB queue budget: {r2ts}");
    assert!(
        t.target().buffered.used() <= 16 << 20,
        "a closed queue's budget is back, an open one holds at most its own"
    );
    if hwm_reset {
        // The budget is 16 MiB per queue; allow generously for the
        // allocator, socket buffers seen as RSS and the test host itself.
        assert!(
            peak.saturating_sub(base) < 160 * 1024,
            "peak RSS grew by {} KiB",
            peak - base
        );
    }
}
