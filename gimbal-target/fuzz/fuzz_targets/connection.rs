//! Fuzz whole gimbal-target connections: each input is a script of host
//! operations against one in-process target (see `fuzz_support.rs`).
//! A violation panics, which libFuzzer reports with the input; a panic on
//! a target thread aborts through libFuzzer's panic hook as well.
#![no_main]

#[path = "../fuzz_support.rs"]
mod fuzz_support;

use std::sync::{Mutex, OnceLock};

static HARNESS: OnceLock<Mutex<fuzz_support::Harness>> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let harness = HARNESS.get_or_init(|| {
        // A Rust `main` ignores SIGPIPE (the target's vectored socket
        // writes rely on it); libFuzzer's C `main` does not.
        // SAFETY: installs the ignore disposition; no handler runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        Mutex::new(fuzz_support::Harness::start())
    });
    let mut harness = harness.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(violation) = harness.run(data) {
        panic!("{violation}");
    }
});
