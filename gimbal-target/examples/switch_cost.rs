//! Nanoseconds per request of the bare `GimbalSwitch` (submit, dispatch,
//! complete) on one thread, with requests kept 32 deep like a fio job:
//! the floor of what the switch costs the target per I/O.
//!
//! ```sh
//! cargo run --release -p gimbal-target --example switch_cost
//! ```

use std::time::Instant;

use qos_core::config::GimbalConfig;
use qos_core::switch::GimbalSwitch;
use qos_core::time::Nanos;
use qos_core::types::{IoKind, TenantId};

fn main() {
    // Start at the highest rate so that pacing never holds a request back:
    // this measures CPU per request, not the token bucket's schedule.
    let config = GimbalConfig {
        initial_target_rate_bps: GimbalConfig::default().max_target_rate_bps,
        ..GimbalConfig::default()
    };
    let mut sw: GimbalSwitch<u64> = GimbalSwitch::new(&config).unwrap();
    sw.add_tenant(TenantId(0)).unwrap();
    let epoch = Instant::now();
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let mut in_flight = std::collections::VecDeque::new();
    let start = Instant::now();
    let mut submitted = 0u64;
    let mut completed = 0u64;
    while completed < n {
        let now = Nanos(epoch.elapsed().as_nanos() as u64);
        while submitted - completed < 32 && submitted < n {
            sw.submit(now, TenantId(0), IoKind::Read, 4096, 0, submitted)
                .unwrap();
            submitted += 1;
        }
        while let Some(d) = sw.poll_dispatch(now) {
            in_flight.push_back(d.id);
        }
        if let Some(id) = in_flight.pop_front() {
            let now = Nanos(epoch.elapsed().as_nanos() as u64);
            sw.complete(now, id).unwrap();
            completed += 1;
        } else {
            if std::env::var_os("SWITCH_COST_TRACE").is_some() && submitted > 1000 {
                let v = sw.virtual_view(now);
                eprintln!(
                    "stalled: queued={} in_flight={} slots={} tenants={:?} next={:?} tokens={:?}",
                    v.queued,
                    v.in_flight,
                    v.allotted_slots,
                    v.tenants,
                    sw.next_wakeup(now),
                    sw.token_buckets()
                );
                std::process::exit(0);
            }
            std::hint::spin_loop();
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("switch: {ns:.0} ns per request (submit + dispatch + complete)");
}
