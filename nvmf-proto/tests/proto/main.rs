//! nvmf-proto tests, in one binary so the 2-core CI links once.

mod common;
mod data_header;
mod fuzz_bounded;
mod malformed;
mod roundtrip;
mod split;
mod structures;
mod vectors;
