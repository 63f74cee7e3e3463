//! nvmf-proto tests, in one binary so the 2-core CI links once.

mod auth_exchange;
mod auth_kat;
#[rustfmt::skip]
mod auth_kat_data;
mod auth_messages;
mod auth_secret;
mod common;
mod data_header;
mod fuzz_bounded;
mod malformed;
mod roundtrip;
mod split;
mod structures;
mod vectors;
