//! The data path of a ublk queue thread: ublk request → NVMe command →
//! QoS stage → fan-out to replicas → NVMe/TCP paths, and back.
//!
//! ```text
//! ublk (libublk adapter) ─► mapping (pure) ─► Engine::submit
//!                                              │
//!                 requests: QueueQos ─► FanOut ─► PartSink::send
//!                                              │
//!                 engine: one Queue per (replica, class), Recv/Send SQEs
//! ```
//!
//! Only [`ublk`] and [`engine`] do I/O; [`mapping`], [`fanout`] and
//! [`requests`] are tested in process (`requests` over fake targets in
//! `tests/fanout.rs`).

pub mod engine;
pub mod fanout;
pub mod mapping;
pub mod requests;
pub mod ublk;
