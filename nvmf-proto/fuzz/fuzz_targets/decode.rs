//! Fuzz the PDU decoder and every structure parser with arbitrary bytes.
#![no_main]

#[path = "../fuzz_support.rs"]
mod fuzz_support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fuzz_support::exercise(data);
});
