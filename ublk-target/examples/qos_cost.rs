//! Host-side cost of the QoS stage per request (push, admit, complete),
//! credits off and no limits versus credit gate + limiter on with limits
//! that are never reached. `cargo run --release -p ublk-target --example qos_cost`
use std::sync::Arc;
use std::time::Instant;

use qos_core::credit_gate::CreditMode;
use qos_core::rate_limiter::RateLimits;
use qos_core::Nanos;
use ublk_target::qos::{LimitKind, QosConfig, QueueQos, VolumeQos};

fn run(cfg: QosConfig, n: u64, depth: u64) -> f64 {
    let mut q: QueueQos<u64> = QueueQos::new(
        Arc::new(VolumeQos::new(&cfg, 1)),
        0,
        qos_core::class_arbiter::ArbiterConfig::default(),
    );
    let mut tickets = std::collections::VecDeque::new();
    let start = Instant::now();
    for i in 0..n {
        let now = Nanos(i * 1000);
        q.push(
            now,
            i,
            LimitKind::Read,
            4096,
            qos_core::priority::NvmeClass::Medium,
        );
        while let Some((_, t)) = q.poll_admit(now) {
            tickets.push_back(t);
        }
        if tickets.len() as u64 >= depth {
            let t = tickets.pop_front().expect("non-empty");
            q.on_done(now, t, Some(0));
        }
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let off = QosConfig {
        credits: CreditMode::Off,
        ..QosConfig::new()
    };
    let on = QosConfig {
        credits: CreditMode::Target,
        initial_window: 65535,
        limits: RateLimits {
            read_iops: 1 << 40,
            read_bps: 1 << 50,
            ..RateLimits::default()
        },
        ..QosConfig::new()
    };
    let n = 5_000_000;
    for round in 1..=3 {
        let a = run(off, n, 32);
        let b = run(on, n, 32);
        println!("QOS-COST round={round} off_ns_per_io={a:.1} admit_all_ns_per_io={b:.1}");
    }
}
