//! Fuzz only the authentication half of the driver: every DH-HMAC-CHAP
//! message decoder, the DHHC-1 secret parser, and the host and controller
//! state machines (`cargo +nightly fuzz run auth`). The `decode` target
//! covers the same code among everything else.
#![no_main]

// The PDU half of the driver is unused here.
#[allow(dead_code)]
#[path = "../fuzz_support.rs"]
mod fuzz_support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fuzz_support::exercise_auth(data);
});
