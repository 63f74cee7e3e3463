//! Fuzz the initiator's queue core with a hostile target: each input is a
//! script of requests and target bytes (see `fuzz_support.rs`). A
//! violation panics, which libFuzzer reports with the input.
#![no_main]

#[path = "../fuzz_support.rs"]
mod fuzz_support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(violation) = fuzz_support::run(data) {
        panic!("{violation}");
    }
});
