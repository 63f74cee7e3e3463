//! A bounded, deterministic stand-in for the cargo-fuzz target
//! `gimbal-target/fuzz` (`connection`), so CI drives whole connections
//! with hostile scripts on every run: a fixed set of seeded scripts, each
//! checked for panics on the target's threads, undecodable output, leaked
//! controllers and in-flight counts, heap growth, and a healthy target
//! afterwards. The driver lives in `fuzz/fuzz_support.rs`, which the
//! cargo-fuzz target includes too.
//!
//! Reproduce one script: `FUZZ_SEED=0x… cargo test -p gimbal-target --test
//! fuzz_connection` (the failure message prints the seed), or replay a
//! libFuzzer artifact with `FUZZ_INPUT=path`. `long_run` (ignored) runs
//! random seeds for `FUZZ_SECS` seconds: `tests/fuzz/run`.

#[path = "../fuzz/fuzz_support.rs"]
mod fuzz_support;

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use fuzz_support::script::{env_u64, seeded_script};
use fuzz_support::{CaseStats, Harness};

/// Scripts per CI run.
const CASES: u64 = 300;
const BASE_SEED: u64 = 0x6a17_ba15_0000_0000;

/// The script for `seed`: 64 to 1,000 bytes.
fn script(seed: u64) -> Vec<u8> {
    seeded_script(seed, 64, 937)
}

/// Runs one script; a violation or a panic in the harness fails with the
/// command that reproduces it.
fn run_one(h: &mut Harness, seed: u64, input: &[u8]) -> CaseStats {
    let reproduce =
        format!("FUZZ_SEED={seed:#x} cargo test -p gimbal-target --test fuzz_connection");
    match std::panic::catch_unwind(AssertUnwindSafe(|| h.run(input))) {
        Ok(Ok(stats)) => stats,
        Ok(Err(violation)) => {
            panic!("script {seed:#x} broke the target ({reproduce}):\n{violation}")
        }
        Err(_) => panic!("script {seed:#x} panicked in the harness ({reproduce})"),
    }
}

fn report(what: &str, t: &CaseStats, took: Duration) {
    eprintln!(
        "{what}: {} scripts, {} ops, {} connections, {} commands ({} ok, {} errors), \
         {} connects ok ({} I/O), {} R2Ts, {} H2CData sent, {} C2HTermReqs, \
         {} C2H bytes, {} answer timeouts, {} ms waiting for answers, peak heap growth {} KiB, \
         {:?}",
        t.cases,
        t.ops,
        t.connections,
        t.commands,
        t.successes,
        t.errors,
        t.connects_ok,
        t.io_connects_ok,
        t.r2ts,
        t.h2c_pdus,
        t.term_reqs,
        t.c2h_bytes,
        t.answer_timeouts,
        t.waited_us / 1000,
        t.peak_growth_bytes / 1024,
        took
    );
}

#[test]
fn three_hundred_hostile_scripts() {
    let _ = env_logger::builder().is_test(true).try_init();
    let started = Instant::now();
    let mut h = Harness::start();
    let mut total = CaseStats::default();
    if let Ok(path) = std::env::var("FUZZ_INPUT") {
        let input = std::fs::read(&path).expect("FUZZ_INPUT names a readable file");
        total.add(&run_one(&mut h, 0, &input));
        report(&path, &total, started.elapsed());
        return;
    }
    let seeds: Vec<u64> = match env_u64("FUZZ_SEED") {
        Some(seed) => vec![seed],
        None => (0..CASES).map(|i| BASE_SEED + i).collect(),
    };
    let single = seeds.len() == 1;
    for seed in seeds {
        total.add(&run_one(&mut h, seed, &script(seed)));
    }
    report("fuzz_connection", &total, started.elapsed());
    if single {
        return;
    }
    // The scripts must get past the first checks: controllers come up,
    // I/O queues connect, data moves both ways, and faults are answered.
    assert!(total.io_connects_ok >= CASES / 4, "{total:?}");
    assert!(total.successes >= CASES * 5, "{total:?}");
    assert!(total.r2ts >= CASES / 3, "{total:?}");
    assert!(total.h2c_pdus >= CASES / 3, "{total:?}");
    assert!(total.c2h_bytes >= 1 << 20, "{total:?}");
    assert!(total.term_reqs >= CASES / 4, "{total:?}");
}

/// `FUZZ_SECS` (default 60) of random scripts from seed `FUZZ_SEED`
/// (default: the clock), for `tests/fuzz/run`.
#[test]
#[ignore = "long run: tests/fuzz/run"]
fn long_run() {
    let secs = env_u64("FUZZ_SECS").unwrap_or(60);
    let base = env_u64("FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("fuzz_connection long run: FUZZ_SEED={base:#x} FUZZ_SECS={secs}");
    let started = Instant::now();
    let mut h = Harness::start();
    let mut total = CaseStats::default();
    let mut i = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        let seed = base.wrapping_add(i);
        total.add(&run_one(&mut h, seed, &script(seed)));
        i += 1;
    }
    report("fuzz_connection long run", &total, started.elapsed());
}
