//! CPU cost per request of a namespace's whole pipeline on a `null`
//! backend, pass-through (`qos = "none"`) and with the Gimbal switch, on
//! one thread: what the switch adds to the target's work per I/O, without
//! the network. Requests complete inline, so the loop submits one as each
//! completes; the switch starts at its highest rate with latency
//! thresholds out of reach, so pacing never holds one back.
//!
//! With `batch` as third argument, requests go in 32 at a time through
//! `Pipeline::submit_batch`, as a connection hands over what one receive
//! brought (the switch's lock and the clock shared across a batch).
//!
//! ```sh
//! cargo run --release -p gimbal-target --example pipeline_cost [REQUESTS] [none|gimbal|both] [batch]
//! valgrind --tool=callgrind target/release/examples/pipeline_cost 200000 gimbal
//! valgrind --tool=callgrind target/release/examples/pipeline_cost 200000 none
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gimbal_target::backend;
use gimbal_target::config::BackendConfig;
use gimbal_target::pipeline::{ClassTag, Completion, IoOp, Pipeline};
use qos_core::config::GimbalConfig;

/// Requests per `submit_batch` in batch mode.
const BATCH: u64 = 32;

fn drive(pipeline: &Pipeline, n: u64, batch: bool) -> f64 {
    let completed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut offset = 0u64;
    let mut request = || -> (Option<ClassTag>, IoOp, Completion) {
        let c = completed.clone();
        offset = (offset + 7 * 4096) % (256 << 20);
        (
            None,
            IoOp::Read { offset, len: 4096 },
            Completion::callback(move |done| {
                assert!(done.result.is_ok());
                c.fetch_add(1, Ordering::Relaxed);
            }),
        )
    };
    if batch {
        let mut sent = 0;
        while sent < n {
            let k = BATCH.min(n - sent);
            pipeline.submit_batch(0, (0..k).map(|_| request()));
            sent += k;
        }
    } else {
        for _ in 0..n {
            let (class, op, done) = request();
            pipeline.submit(0, class, op, done);
        }
    }
    let done = completed.load(Ordering::Relaxed);
    assert_eq!(
        done,
        n,
        "the switch held requests back: {:?}",
        pipeline.virtual_view()
    );
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let only = args.get(1).map(String::as_str);
    let batch = args.get(2).map(String::as_str) == Some("batch");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    // Highest rate, and latency thresholds no cold start can reach (the
    // first calls of a code path under valgrind take milliseconds, which
    // would look like an overloaded device and pace the run): the same
    // code runs per request, with the device always underutilized.
    let config = GimbalConfig {
        initial_target_rate_bps: GimbalConfig::default().max_target_rate_bps,
        latency_threshold_min_us: 10_000_000,
        latency_threshold_max_us: 20_000_000,
        ..GimbalConfig::default()
    };
    let null = || {
        backend::open(
            &BackendConfig::Null {
                size_bytes: 256 << 20,
            },
            512,
        )
        .unwrap()
    };
    let none = Pipeline::new(null());
    let gimbal = Pipeline::with_gimbal(null(), &config).unwrap();
    if only != Some("gimbal") {
        println!("none:   {:.0} ns per request", drive(&none, n, batch));
    }
    if only != Some("none") {
        println!("gimbal: {:.0} ns per request", drive(&gimbal, n, batch));
    }
}
