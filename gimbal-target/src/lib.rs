//! `gimbal-target`: an NVMe/TCP target that is also a multi-tenant storage
//! switch (the Gimbal design, SIGCOMM '21).
//!
//! Layers, from the wire inwards, one module each:
//! - [`frontend`] speaks NVMe/TCP (through `nvmf-proto`): the target's
//!   subsystems, namespaces and tenants ([`frontend::target`]), one
//!   controller per host association with its registers and admin commands
//!   ([`frontend::controller`]), one connection per queue
//!   ([`frontend::connection`]), and the discovery subsystem;
//! - [`pipeline`]: one per namespace (backend device), between the front
//!   end and the backend: with `qos = "none"` it passes requests straight
//!   through, with `qos = "gimbal"` it runs the storage switch from
//!   `qos-core`; class arbitration for controllers that enable it;
//! - [`backend`] keeps the data: `ram`, `null`, `file`, `sim`.
//!
//! Around them: [`config`] reads and checks the TOML configuration (errors
//! name file, line and field, through `config-diag`); [`server`] runs a
//! target: runtime, listeners, status lines and orderly shutdown;
//! [`metrics`] renders the target's state for Prometheus.
//!
//! The paper's experiments in simulation are the `gimbal-sim` crate, so
//! that this runtime does not carry the plotting stack.

pub mod backend;
pub mod config;
pub mod frontend;
pub mod metrics;
pub mod pipeline;
pub mod server;
