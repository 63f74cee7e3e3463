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

/// A slow simulated device taking one request at a time, no aging: the
/// order in which waiting requests reach it is the arbiter's alone.
const SLOW_ONE_AT_A_TIME: &str = r#"
listen = ["127.0.0.1:0"]
[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:demo"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "sim"
size = "16MiB"
time_scale = 500
device_queue_depth = 1
class_aging_us = 0
"#;

/// The order the device served two queues in, read from the data: the
/// high queue writes `high_n` blocks of `high_len` bytes to LBA 0, each
/// filled with its 1-based index; the low queue reads `low_len` bytes at
/// LBA 0 `low_n` times. Everything is sent before anything completes but
/// the first high write (the device is slow), so each low read returns
/// the index of the last high write served before it. Returns those.
///
/// Which queue's first command reaches the device first is up to the two
/// connections' tasks (it goes at once: nothing waits yet); everything
/// after it waits, so the steps between low reads are exact.
fn served_before_each_low_read(
    ams: u8,
    (high_n, high_len): (usize, usize),
    (low_n, low_len): (usize, usize),
) -> Vec<u8> {
    use nvmf_proto::command::IoCommand;
    use nvmf_proto::pdu::{CapsuleCmd, Pdu};
    use nvmf_proto::SglDescriptor;

    let t = start_target(SLOW_ONE_AT_A_TIME);
    let addr = t.local_addrs()[0];
    let (mut admin, csts) = bring_up_with_ams(addr, ams, 2);
    assert!(csts.ready);
    set_arbitration(&mut admin, 4, 2, 1, 0b111);
    let mut high = connect_io_class(addr, admin.cntlid, 1, PriorityClass::High);
    let mut low = connect_io_class(addr, admin.cntlid, 2, PriorityClass::Low);
    let mut high_cids = Vec::new();
    for i in 0..high_n {
        let cid = high.cid();
        let blocks = (high_len / 512) as u32;
        let cmd =
            IoCommand::write(1, 0, blocks, SglDescriptor::in_capsule(0, high_len as u32)).unwrap();
        let data = vec![i as u8 + 1; high_len];
        high.send(&Pdu::CapsuleCmd(
            CapsuleCmd::with_data(cmd.to_sqe(cid), data).unwrap(),
        ));
        high_cids.push(cid);
    }
    let mut low_cids = Vec::new();
    for _ in 0..low_n {
        let cid = low.cid();
        let blocks = (low_len / 512) as u32;
        let cmd = IoCommand::read(1, 0, blocks, low_len as u32).unwrap();
        low.send(&Pdu::CapsuleCmd(CapsuleCmd::new(cmd.to_sqe(cid))));
        low_cids.push(cid);
    }
    // One queue's requests are served in order (FIFO within a queue).
    for cid in high_cids {
        assert!(high.gather(cid).0.status.is_success());
    }
    low_cids
        .into_iter()
        .map(|cid| {
            let (cqe, data) = low.gather(cid);
            assert!(cqe.status.is_success());
            data[0]
        })
        .collect()
}

/// High writes served before each low read go up by exactly `step`; the
/// first low read saw none (it reached the idle device first) or `step`.
fn assert_steps(seen: &[u8], step: u8) {
    assert!(seen[0] == 0 || seen[0] == step, "{seen:?}");
    for w in seen.windows(2) {
        assert_eq!(w[1] - w[0], step, "{seen:?}");
    }
}

#[test]
fn wrr_on_the_wire_serves_four_high_commands_per_low_one() {
    // 8 KiB writes against 32 KiB reads: WRR counts commands, so low gets
    // one command per four high ones and four times their bytes each.
    let seen = served_before_each_low_read(
        arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT,
        (40, 8192),
        (6, 32 * 1024),
    );
    assert_steps(&seen, 4);
}

#[test]
fn drr_on_the_wire_serves_four_high_bytes_per_low_byte() {
    // Vendor-specific DRR, quantum = weight x 32 KiB: a round gives high
    // 128 KiB (16 writes of 8 KiB) and low 32 KiB (one read). Bytes 4:1.
    let seen = served_before_each_low_read(
        arbitration_mechanism::VENDOR_SPECIFIC,
        (60, 8192),
        (3, 32 * 1024),
    );
    assert_steps(&seen, 16);
}

/// Class arbitration inside the pipeline, driven by a backend whose
/// completions the test releases one at a time: the order in which the
/// device serves the two classes is exact, with no timing involved.
mod pipeline_order {
    use std::borrow::Cow;
    use std::io;
    use std::sync::{Arc, Mutex};

    use gimbal_target::backend::{Backend, BackendInfo, UringDone, UringOp};
    use gimbal_target::pipeline::{ClassTag, Completion, IoOp, Pipeline};
    use qos_core::class_arbiter::{ArbiterConfig, ArbitrationMode};
    use qos_core::config::GimbalConfig;
    use qos_core::priority::NvmeClass;

    /// A device that takes requests and completes them only when told.
    #[derive(Default)]
    struct Gated {
        held: Mutex<Vec<(u64, UringDone)>>,
    }

    impl Gated {
        /// Completes the oldest request the device holds; false if none.
        fn complete_one(&self) -> bool {
            let next = {
                let mut h = self.held.lock().unwrap();
                if h.is_empty() {
                    return false;
                }
                h.remove(0)
            };
            (next.1)(Ok(Cow::Owned(vec![0u8; next.0 as usize])));
            true
        }

        fn held(&self) -> usize {
            self.held.lock().unwrap().len()
        }
    }

    impl Backend for Gated {
        fn info(&self) -> BackendInfo {
            BackendInfo {
                size_bytes: 1 << 30,
                discard: false,
                discard_zeroes: false,
                volatile_write_cache: false,
                keeps_data: false,
            }
        }
        fn read(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<()> {
            unreachable!("reads go through submit_async")
        }
        fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn write_zeroes(&self, _offset: u64, _len: u64) -> io::Result<()> {
            Ok(())
        }
        fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
            Ok(())
        }
        fn may_block(&self) -> bool {
            true
        }
        fn submit_async(&self, op: UringOp, done: UringDone) -> Result<(), (UringOp, UringDone)> {
            match op {
                UringOp::Read { len, .. } => {
                    self.held.lock().unwrap().push((len as u64, done));
                    Ok(())
                }
                other => Err((other, done)),
            }
        }
    }

    /// Weights high:low = 4:1 (medium 2), unlimited burst, no aging (the
    /// test is about the weights; aging is qos-core's tested concern).
    fn arbiter(mode: ArbitrationMode) -> ArbiterConfig {
        let mut c = ArbiterConfig {
            mode,
            aging_threshold_us: 0,
            ..ArbiterConfig::default()
        }
        .with_arbitration_feature(3 << 24 | 1 << 16 | 0b111);
        let unit = qos_core::class_arbiter::DRR_QUANTUM_UNIT_BYTES;
        c.high_quantum_bytes = u64::from(c.high_weight) * unit;
        c.medium_quantum_bytes = u64::from(c.medium_weight) * unit;
        c.low_quantum_bytes = u64::from(c.low_weight) * unit;
        c
    }

    type Log = Arc<Mutex<Vec<(NvmeClass, u64)>>>;

    /// Submits `n` reads of `bytes` on queue `qid` in `class`.
    fn fill(
        p: &Pipeline,
        log: &Log,
        config: ArbiterConfig,
        (qid, class, bytes): (u16, NvmeClass, usize),
        n: usize,
    ) {
        for i in 0..n {
            let log = log.clone();
            p.submit(
                0,
                Some(ClassTag {
                    arbiter: config,
                    class,
                    queue: ClassTag::queue_id(1, qid),
                    device_queue_depth: Some(1),
                }),
                IoOp::Read {
                    offset: (i * bytes) as u64,
                    len: bytes,
                },
                Completion::callback(move |d| {
                    assert!(d.result.is_ok());
                    log.lock()
                        .unwrap()
                        .push((class, d.result.unwrap().len() as u64));
                }),
            );
        }
    }

    /// Both classes kept backlogged (more queued than served) with a
    /// device that takes one request at a time; returns, per class, the
    /// commands and bytes among the first `served` completions after the
    /// first (which went to the device before anything waited).
    fn serve(
        gimbal: bool,
        mode: ArbitrationMode,
        high_bytes: usize,
        low_bytes: usize,
        served: usize,
    ) -> [(u64, u64); 2] {
        let dev = Arc::new(Gated::default());
        let p = if gimbal {
            Pipeline::with_gimbal(dev.clone(), &GimbalConfig::default()).unwrap()
        } else {
            Pipeline::new(dev.clone())
        };
        let log: Log = Arc::default();
        let config = arbiter(mode);
        let backlog = served + 8;
        // Low first: arrival order must not decide the shares.
        fill(&p, &log, config, (2, NvmeClass::Low, low_bytes), backlog);
        fill(&p, &log, config, (1, NvmeClass::High, high_bytes), backlog);
        // The switch may hold a released request back for its token
        // bucket (its pacing thread sends it later): wait for the device to
        // have it. The order is still the arbiter's: one is out at a time.
        let wait_held = || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while dev.held() == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "nothing reached the device"
                );
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        };
        wait_held();
        assert_eq!(dev.held(), 1, "device_queue_depth 1");
        for _ in 0..=served {
            wait_held();
            assert!(dev.complete_one());
            assert!(dev.held() <= 1);
        }
        let log = log.lock().unwrap();
        let mut out = [(0, 0); 2];
        for (class, bytes) in &log[1..=served] {
            let i = usize::from(*class == NvmeClass::Low);
            out[i].0 += 1;
            out[i].1 += bytes;
        }
        out
    }

    #[test]
    fn wrr_serves_high_four_commands_for_each_low_one() {
        for gimbal in [false, true] {
            let [high, low] = serve(gimbal, ArbitrationMode::Wrr, 4096, 4096, 100);
            assert_eq!((high.0, low.0), (80, 20), "gimbal {gimbal}");
        }
    }

    #[test]
    fn wrr_counts_commands_so_large_low_requests_take_more_bytes() {
        let [high, low] = serve(false, ArbitrationMode::Wrr, 4096, 64 * 1024, 100);
        assert_eq!((high.0, low.0), (80, 20));
        // 80 x 4 KiB against 20 x 64 KiB: low moves four times the bytes.
        assert_eq!(low.1, 4 * high.1);
    }

    #[test]
    fn drr_serves_high_four_bytes_for_each_low_byte_whatever_the_sizes() {
        for gimbal in [false, true] {
            // One DRR round: high 128 KiB (32 x 4 KiB), low 32 KiB, so a
            // 64 KiB low request goes every second round.
            let [high, low] = serve(gimbal, ArbitrationMode::Drr, 4096, 64 * 1024, 130);
            let ratio = high.1 as f64 / low.1 as f64;
            assert!(
                (3.5..=4.5).contains(&ratio),
                "gimbal {gimbal}: {high:?} {low:?}"
            );
        }
    }

    #[test]
    fn urgent_goes_before_everything() {
        let dev = Arc::new(Gated::default());
        let p = Pipeline::new(dev.clone());
        let log: Log = Arc::default();
        let config = arbiter(ArbitrationMode::Wrr);
        fill(&p, &log, config, (1, NvmeClass::High, 4096), 10);
        fill(&p, &log, config, (3, NvmeClass::Urgent, 4096), 5);
        while dev.complete_one() {}
        let order: Vec<_> = log.lock().unwrap().iter().map(|e| e.0).collect();
        assert_eq!(order.len(), 15);
        // The first high went before the urgent ones arrived.
        assert!(
            order[1..6].iter().all(|c| *c == NvmeClass::Urgent),
            "{order:?}"
        );
    }

    #[test]
    fn without_a_device_queue_depth_nothing_waits() {
        let dev = Arc::new(Gated::default());
        let p = Pipeline::new(dev.clone());
        let config = arbiter(ArbitrationMode::Wrr);
        for i in 0..10u64 {
            p.submit(
                0,
                Some(ClassTag {
                    arbiter: config,
                    class: NvmeClass::Low,
                    queue: ClassTag::queue_id(1, 1),
                    device_queue_depth: None,
                }),
                IoOp::Read {
                    offset: i * 4096,
                    len: 4096,
                },
                Completion::callback(|_| {}),
            );
        }
        assert_eq!(dev.held(), 10);
        assert_eq!(p.class_waiting(), [0; 4]);
    }
}
