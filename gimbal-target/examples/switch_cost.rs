//! CPU cost of the bare `GimbalSwitch` per request (submit, dispatch,
//! complete) on one thread, one tenant, requests kept 32 deep like a fio
//! job: the floor of what the switch costs the target per I/O.
//!
//! The switch runs on a virtual clock that advances `STEP_NS` per loop
//! iteration, so its decisions (and the instruction count under callgrind)
//! do not depend on how fast or how loaded the host is: at that pace the
//! device looks idle and fast, the token buckets always admit the head
//! request, and nothing is ever held back. Wall time is measured apart.
//!
//! Requests go in as the pipeline submits them, with `submit_dispatch`
//! (a request that finds the switch empty leaves without queueing); with
//! `poll` as second argument, with `submit` and then `poll_dispatch`.
//!
//! ```sh
//! cargo run --release -p gimbal-target --example switch_cost [REQUESTS] [poll]
//! valgrind --tool=callgrind target/release/examples/switch_cost 200000
//! ```

use std::collections::VecDeque;
use std::time::Instant;

use qos_core::config::GimbalConfig;
use qos_core::switch::GimbalSwitch;
use qos_core::time::Nanos;
use qos_core::types::{IoKind, TenantId};

/// Virtual time per loop iteration (one completion, one submission).
const STEP_NS: u64 = 100;
/// Requests outstanding (queued or at the device).
const DEPTH: u64 = 32;

fn main() {
    let config = GimbalConfig {
        initial_target_rate_bps: GimbalConfig::default().max_target_rate_bps,
        ..GimbalConfig::default()
    };
    let mut sw: GimbalSwitch<u64> = GimbalSwitch::new(&config).unwrap();
    sw.add_tenant(TenantId(0)).unwrap();
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let poll_only = std::env::args().nth(2).as_deref() == Some("poll");
    let mut in_flight = VecDeque::with_capacity(DEPTH as usize);
    let start = Instant::now();
    let mut now = Nanos(0);
    let mut submitted = 0u64;
    let mut completed = 0u64;
    while completed < n {
        now = now.saturating_add_nanos(STEP_NS);
        while submitted - completed < DEPTH && submitted < n {
            if poll_only {
                sw.submit(now, TenantId(0), IoKind::Read, 4096, 0, submitted)
                    .unwrap();
            } else {
                let (_, d) = sw
                    .submit_dispatch(now, TenantId(0), IoKind::Read, 4096, 0, submitted)
                    .unwrap();
                in_flight.extend(d.map(|d| d.id));
            }
            submitted += 1;
        }
        while let Some(d) = sw.poll_dispatch(now) {
            in_flight.push_back(d.id);
        }
        let Some(id) = in_flight.pop_front() else {
            let v = sw.virtual_view(now);
            panic!(
                "the switch held requests back: queued={} next={:?} tokens={:?}",
                v.queued,
                sw.next_wakeup(now),
                sw.token_buckets()
            );
        };
        sw.complete(now, id).unwrap();
        completed += 1;
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("switch: {ns:.0} ns per request (submit + dispatch + complete)");
}
