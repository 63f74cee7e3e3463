//! Arbitration between NVMe priority classes, seen from the wire: CAP.AMS
//! offers weighted round robin with urgent and the vendor-specific DRR,
//! CC.AMS selects one, and each I/O queue's class comes from its Connect
//! CATTR.

mod support;

use nvmf_proto::command::{AdminCommand, SetFeatures};
use nvmf_proto::fabrics::{
    arbitration_mechanism, property, Capabilities, Connect, ControllerConfiguration,
    ControllerStatus, PriorityClass, PropertySet,
};
use nvmf_proto::features::{feature_id, Arbitration, NumberOfQueues};
use support::*;

const CONFIG: &str = r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "16MiB"
"#;

/// Admin connect, CC.EN = 1 with `ams`, and `queues` I/O queues granted.
/// Returns the host and CSTS after the enable.
fn bring_up_with_ams(
    addr: std::net::SocketAddr,
    ams: u8,
    queues: u16,
) -> (TestHost, ControllerStatus) {
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let cqe = h.connect_admin_as(DEMO_NQN, HOST_NQN, 10_000);
    assert!(cqe.status.is_success(), "admin connect: {cqe:?}");
    let mut cc = ControllerConfiguration::from_u32(0);
    cc.enable = true;
    cc.iosqes = 6;
    cc.iocqes = 4;
    cc.ams = ams;
    let cid = h.cid();
    let (cqe, _) = h.command(
        PropertySet::new(property::CC, cc.to_u32() as u64).to_sqe(cid),
        None,
    );
    assert!(cqe.status.is_success());
    let csts = ControllerStatus::from_u32(h.property_get(property::CSTS) as u32);
    if csts.ready {
        let cid = h.cid();
        let sf = SetFeatures::new(
            feature_id::NUMBER_OF_QUEUES,
            NumberOfQueues::with_count(queues).to_dword(),
        );
        let (cqe, _) = h.command(AdminCommand::SetFeatures(sf).to_sqe(cid), None);
        assert!(cqe.status.is_success());
    }
    (h, csts)
}

/// Sets the Arbitration feature (weights 1's based here).
fn set_arbitration(h: &mut TestHost, high: u8, medium: u8, low: u8, burst: u8) {
    let arb = Arbitration {
        burst,
        high_weight: high - 1,
        medium_weight: medium - 1,
        low_weight: low - 1,
    };
    let cid = h.cid();
    let sf = SetFeatures::new(feature_id::ARBITRATION, arb.to_dword());
    let (cqe, _) = h.command(AdminCommand::SetFeatures(sf).to_sqe(cid), None);
    assert!(cqe.status.is_success(), "set arbitration: {cqe:?}");
}

/// An I/O queue of controller `cntlid` in `class`.
fn connect_io_class(
    addr: std::net::SocketAddr,
    cntlid: u16,
    qid: u16,
    class: PriorityClass,
) -> TestHost {
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    let cid = h.cid();
    let sqe = Connect::io(qid, 64, class).to_sqe(cid);
    let data = h.connect_data(DEMO_NQN, HOST_NQN, cntlid);
    let (cqe, _) = h.command(sqe, Some(&data));
    assert!(cqe.status.is_success(), "io connect: {cqe:?}");
    h.cntlid = cntlid;
    h
}

#[test]
fn cap_offers_wrr_with_urgent_and_vendor_specific() {
    let t = start_target(CONFIG);
    let mut h = TestHost::bring_up(t.local_addrs()[0], false, false, 1);
    let cap = Capabilities::from_u64(h.property_get(property::CAP));
    assert_eq!(
        cap.ams,
        arbitration_mechanism::CAP_WRR_URGENT | arbitration_mechanism::CAP_VENDOR_SPECIFIC
    );
}

#[test]
fn cc_ams_wrr_and_vendor_specific_enable_and_reserved_values_do_not() {
    let t = start_target(CONFIG);
    let addr = t.local_addrs()[0];
    for ams in [
        arbitration_mechanism::ROUND_ROBIN,
        arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT,
        arbitration_mechanism::VENDOR_SPECIFIC,
    ] {
        let (_h, csts) = bring_up_with_ams(addr, ams, 1);
        assert!(csts.ready, "CC.AMS {ams:03b} must enable");
        assert!(!csts.fatal);
    }
    for ams in [0b010, 0b011, 0b110] {
        let (_h, csts) = bring_up_with_ams(addr, ams, 1);
        assert!(!csts.ready, "reserved CC.AMS {ams:03b} must not enable");
        assert!(csts.fatal);
    }
}

#[test]
fn io_queues_of_every_class_work_under_wrr_and_drr() {
    let t = start_target(CONFIG);
    let addr = t.local_addrs()[0];
    for ams in [
        arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT,
        arbitration_mechanism::VENDOR_SPECIFIC,
    ] {
        let (mut admin, csts) = bring_up_with_ams(addr, ams, 4);
        assert!(csts.ready);
        set_arbitration(&mut admin, 4, 2, 1, 0b111);
        for (qid, class) in [
            PriorityClass::Urgent,
            PriorityClass::High,
            PriorityClass::Medium,
            PriorityClass::Low,
        ]
        .into_iter()
        .enumerate()
        {
            let mut io = connect_io_class(addr, admin.cntlid, qid as u16 + 1, class);
            let data = pattern(8192, qid as u32);
            let slba = qid as u64 * 16;
            assert!(io.write(1, slba, &data, 512, 8192).status.is_success());
            let (cqe, back) = io.read(1, slba, 16, 512);
            assert!(cqe.status.is_success());
            assert_eq!(back, data, "class {class:?}");
        }
    }
}
