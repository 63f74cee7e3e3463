//! The Gimbal switch in the target, seen from the wire: credits in
//! completion dword 1, the virtual view log page, and no SUCCESS shortcut
//! when a credit must travel.

mod support;

use nvmf_proto::command::{log_id, AdminCommand, GetLogPage, IoCommand};
use nvmf_proto::fabrics::connect_attr::DISABLE_SQ_FLOW_CONTROL;
use nvmf_proto::log_page::{GimbalViewPage, GIMBAL_VIEW_LEN};
use nvmf_proto::pdu::{CapsuleCmd, Pdu};
use support::*;

const CONFIG: &str = r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "64MiB"
qos = "gimbal"
[[subsystem.namespace]]
nsid = 2
backend = "ram"
size = "1MiB"
"#;

const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000002";

#[test]
fn completions_carry_credits_and_the_view_is_readable() {
    let t = start_target(CONFIG);
    let addr = t.local_addrs()[0];
    let mut tenants = Vec::new();
    for host in [HOST_NQN, OTHER_HOST] {
        let admin = TestHost::bring_up_as(addr, host, false, false, 1);
        // SQ flow control off: the target could use the SUCCESS shortcut,
        // but must not, since the credit travels in the CQE.
        let io = TestHost::connect_io_as(
            addr,
            host,
            admin.cntlid,
            1,
            false,
            false,
            DISABLE_SQ_FLOW_CONTROL,
        );
        tenants.push((admin, io));
    }
    for (i, (_, io)) in tenants.iter_mut().enumerate() {
        for round in 0..16u32 {
            let data = pattern(64 * 1024, round + 100 * i as u32);
            let slba = (i as u64 * 1000 + round as u64) * 128;
            let cqe = io.write(1, slba, &data, 512, 8192);
            assert!(cqe.status.is_success());
            let credit = cqe
                .gimbal_credit()
                .expect("write completion carries a credit");
            assert!(credit >= 1);
            let cid = io.cid();
            let read = IoCommand::read(1, slba, 128, 64 * 1024).unwrap();
            io.send(&Pdu::CapsuleCmd(CapsuleCmd::new(read.to_sqe(cid))));
            let mut got = Vec::new();
            loop {
                match io.recv() {
                    Pdu::C2HData(d) => {
                        assert!(
                            !d.success,
                            "SUCCESS shortcut used although a credit must be reported"
                        );
                        got.extend_from_slice(&d.data);
                    }
                    Pdu::CapsuleResp(r) => {
                        assert!(r.cqe.status.is_success());
                        assert!(
                            r.cqe.gimbal_credit().is_some(),
                            "read completion carries a credit"
                        );
                        break;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert!(got == data);
        }
        // A namespace without the switch reports no credit.
        let cqe = io.write(2, 0, &pattern(4096, 1), 512, 8192);
        assert!(cqe.status.is_success());
        assert_eq!(cqe.gimbal_credit(), None);
    }
    let (admin, _) = &mut tenants[0];
    let cid = admin.cid();
    let glp = GetLogPage::new(log_id::GIMBAL_VIRTUAL_VIEW, 1, GIMBAL_VIEW_LEN as u32, 0).unwrap();
    let (cqe, page) = admin.command(AdminCommand::GetLogPage(glp).to_sqe(cid), None);
    assert!(cqe.status.is_success());
    let view = GimbalViewPage::from_bytes(&page).unwrap();
    assert!(view.congestion_state <= 3);
    assert!(view.target_rate_bps > 0);
    assert!(view.credit >= 1);
    assert!(view.read_latency_ewma_ns > 0 && view.write_latency_ewma_ns > 0);
    assert_eq!(view.queued, 0);
    let cid = admin.cid();
    let glp = GetLogPage::new(log_id::GIMBAL_VIRTUAL_VIEW, 2, GIMBAL_VIEW_LEN as u32, 0).unwrap();
    let (_, page) = admin.command(AdminCommand::GetLogPage(glp).to_sqe(cid), None);
    assert_eq!(
        GimbalViewPage::from_bytes(&page).unwrap().congestion_state,
        GimbalViewPage::NO_SWITCH
    );
}

#[test]
fn many_outstanding_requests_all_complete_through_the_switch() {
    let t = start_target(CONFIG);
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    // 48 reads in flight at once, more than the switch admits at a time.
    let mut cids = Vec::new();
    for i in 0..48u64 {
        let cid = io.cid();
        let read = IoCommand::read(1, i * 256, 256, 128 * 1024).unwrap();
        io.send(&Pdu::CapsuleCmd(CapsuleCmd::new(read.to_sqe(cid))));
        cids.push(cid);
    }
    let mut done = 0;
    while done < cids.len() {
        if let Pdu::CapsuleResp(r) = io.recv() {
            assert!(r.cqe.status.is_success());
            assert!(r.cqe.gimbal_credit().is_some());
            done += 1;
        }
    }
}

#[test]
fn status_lines_show_each_switch_view_with_tenants() {
    let t = start_target(CONFIG);
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    let cqe = io.write(1, 0, &pattern(4096, 7), 512, 8192);
    assert!(cqe.status.is_success());
    let lines = t.target().gimbal_status_lines();
    // Only namespace 1 runs the switch.
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    for key in [
        "gimbal-view subsystem=nqn.2026-01.io.gimbal:demo nsid=1 ",
        " state=",
        " target_rate_bps=",
        " read_headroom_bps=",
        " write_headroom_bps=",
        " write_cost=",
        " write_latency_ewma_us=",
        " in_flight=0 queued=0",
        &format!(" tenant={HOST_NQN}:"),
    ] {
        assert!(line.contains(key), "{key:?} missing in {line}");
    }
}

#[test]
fn sim_requests_complete_on_a_timer_after_the_model_latency() {
    // Both pipelines (switch and pass-through) book a sim I/O at dispatch
    // and complete it on a timer; data still round-trips.
    let t = start_target(
        r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "sim"
size = "16MiB"
time_scale = 100
qos = "gimbal"
[[subsystem.namespace]]
nsid = 2
backend = "sim"
size = "16MiB"
time_scale = 100
"#,
    );
    let addr = t.local_addrs()[0];
    let admin = TestHost::bring_up(addr, false, false, 1);
    let mut io = TestHost::connect_io(addr, admin.cntlid, 1, false, false);
    for nsid in [1, 2] {
        let data = pattern(4096, nsid);
        assert!(io.write(nsid, 8, &data, 512, 8192).status.is_success());
        let start = std::time::Instant::now();
        let (cqe, back) = io.read(nsid, 8, 8, 512);
        // A 4 KiB read costs ~86 µs in the model: ~8.6 ms at 100x.
        assert!(start.elapsed() >= std::time::Duration::from_millis(4));
        assert!(cqe.status.is_success());
        assert_eq!(back, data);
        assert_eq!(cqe.gimbal_credit().is_some(), nsid == 1);
    }
}
