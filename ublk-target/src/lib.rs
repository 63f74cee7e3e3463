//! `ublk-nvmf`: block devices served over NVMe/TCP.
//!
//! - [`config`]: one TOML file per volume; errors name file, line, field.
//! - [`volume`]: the controller and namespace behind a device (grows into a
//!   replica set), its geometry and counters.
//! - [`mapping`]: the pure request handler: ublk (op, offset, length,
//!   flags) → NVMe command, and device parameters from Identify data.
//! - [`engine`]: per ublk queue, one NVMe/TCP I/O queue pumped on the
//!   queue's own io_uring, with reconnect and requeue.
//! - [`ublk`]: the one module that uses `libublk`.
//! - [`state`]: saved device state under `/run/ublk-nvmf/` (for recovery,
//!   `list`, udev) and the control socket (`status`, `del`).
//! - [`notify`]: the systemd readiness protocol.
//! - `bench`, `histogram`: the initiator benchmark.

pub mod bench;
pub mod config;
pub mod engine;
pub mod error;
pub mod fanout;
pub mod histogram;
pub mod intent_log;
pub mod mapping;
pub mod notify;
pub mod priority;
pub mod qos;
pub mod replicas;
pub mod replication;
pub mod requests;
pub mod resync;
pub mod state;
pub mod ublk;
pub mod volume;

pub use error::Error;
