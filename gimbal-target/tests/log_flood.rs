//! A flood of rejected input writes a bounded number of log lines (issue
//! 15, item 4): lines a host can provoke are rate-limited per kind
//! (`frontend::log_limit`), whatever the rate of the input.
//!
//! Its own test binary: it installs a counting logger for the process.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gimbal_target::frontend::log_limit::LogLimiter;
use support::*;

static WARN_LINES: AtomicUsize = AtomicUsize::new(0);
static INFO_LINES: AtomicUsize = AtomicUsize::new(0);

struct CountingLogger;

impl log::Log for CountingLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record<'_>) {
        if !r.target().starts_with("gimbal_target") {
            return;
        }
        match r.level() {
            log::Level::Error | log::Level::Warn => WARN_LINES.fetch_add(1, Ordering::Relaxed),
            _ => INFO_LINES.fetch_add(1, Ordering::Relaxed),
        };
    }

    fn flush(&self) {}
}

static LOGGER: CountingLogger = CountingLogger;

#[test]
fn two_thousand_rejected_inputs_write_a_bounded_number_of_lines() {
    log::set_logger(&LOGGER).expect("first logger");
    log::set_max_level(log::LevelFilter::Info);
    let t = demo_target();
    let addr = t.local_addrs()[0];
    // 1,000 Connects to a subsystem that does not exist, on one connection
    // (a refused Connect leaves the queue waiting for another).
    let mut h = TestHost::connect(addr);
    h.icreq(false, false);
    for _ in 0..1000 {
        let cqe = h.connect_admin_as("nqn.2026-01.io.gimbal:nonexistent", HOST_NQN, 0);
        assert!(!cqe.status.is_success());
    }
    // 500 connections that send noise after ICReq (a fatal protocol error
    // and an abnormal end each), and 500 that connect and leave.
    for i in 0..500 {
        let mut h = TestHost::connect(addr);
        h.icreq(false, false);
        h.send_raw(&pattern(256, i));
        let _ = h.expect_termination();
        let mut h = TestHost::bring_up(addr, false, false, 1);
        let _ = h.property_get(nvmf_proto::fabrics::property::CSTS);
    }
    std::thread::sleep(Duration::from_millis(200));
    let warn = WARN_LINES.load(Ordering::Relaxed);
    let info = INFO_LINES.load(Ordering::Relaxed);
    let limiter = &t.target().log_limiter;
    eprintln!(
        "warn lines {warn}, info lines {info}, admitted {}, suppressed {}",
        limiter.lines_written(),
        limiter.lines_suppressed()
    );
    // Kinds provoked: connect-refused, protocol-error, connection-ended,
    // controller-created, controller-torn-down; the test runs within one
    // or two windows.
    let bound = 5 * 2 * LogLimiter::BURST as usize;
    assert!(
        warn + info <= bound,
        "{warn} + {info} lines for 2,000 inputs"
    );
    assert!(limiter.lines_suppressed() >= 1900, "the rest were counted");
}
