//! `ublk-nvmf`: block devices served over NVMe/TCP.
//!
//! The crate is laid out as the server is: a control side that sets a
//! volume up and answers operators, and an I/O side that moves requests.
//! The binary's command line and daemon are in `src/cli/` (not part of the
//! library).
//!
//! - [`config`]: one TOML file per volume; errors name file, line, field
//!   (through `config-diag`); the host identity.
//! - [`volume`]: a connected volume: one [`volume::ReplicaEndpoint`]
//!   (controller, address, namespace identity, classes with a queue) per
//!   replica, its geometry, counters, QoS and replication state.
//! - [`io`]: the data path, per ublk queue thread:
//!   - [`io::ublk`]: the one module that uses `libublk` (device add and
//!     recover, queue threads, per-tag tasks);
//!   - [`io::mapping`]: the pure request handler: ublk (op, offset,
//!     length, flags) → NVMe command, device parameters from Identify;
//!   - [`io::engine`]: the NVMe/TCP paths (one per replica and class) on
//!     the queue's io_uring, with reconnect and requeue;
//!   - [`io::requests`]: a request from admission to completion, without
//!     sockets: QoS stage, fan-out, replication, behind a
//!     [`io::requests::PartSink`];
//!   - [`io::fanout`]: the fan-out of a request to its parts as a sans-IO
//!     state machine.
//! - [`qos`]: the client-side QoS stage (rate limiter, credit gates,
//!   class-ordered release, replica choice) and [`qos::priority`] (ionice
//!   classes, `[priority]`).
//! - [`replication`]: mirrored volumes: the replicas' health
//!   ([`replication::health`]), the write-intent log
//!   ([`replication::intent_log`]), the resync planner
//!   ([`replication::resync`]), and the manager that runs them.
//! - [`control`]: saved device state and the control socket
//!   ([`control::state`]), the systemd readiness protocol
//!   ([`control::notify`]).
//! - [`metrics`]: the volume's counters and latency histograms for
//!   Prometheus (`[metrics] listen`).
//! - [`bench`]: `ublk-nvmf bench`, a fio-like load generator over the
//!   initiator, with its latency histogram.

pub mod bench;
pub mod cluster;
pub mod config;
pub mod control;
pub mod error;
pub mod evol;
pub mod evol_qos;
pub mod io;
pub mod metrics;
pub mod qos;
pub mod replication;
pub mod volume;

pub use error::Error;
