//! The NVMe/TCP front end: what a host sees.
//!
//! - [`target`]: the target-wide state built from the configuration:
//!   subsystems, namespaces (each with its pipeline), the table of live
//!   controllers, tenants (one per host NQN).
//! - [`controller`]: one controller per host association: registers,
//!   features, admin commands, Identify and log pages, keep-alive; pure
//!   functions of the controller and target state.
//! - [`connection`]: one TCP connection (one queue of one controller): the
//!   reader decodes, validates and submits to the namespace pipelines; the
//!   writer batches every ready PDU into one socket write.
//! - [`reservation`]: NVMe reservations per namespace (registrants,
//!   holder, the conflict check on every I/O command, preempt and abort,
//!   notifications, persistence through a restart).
//! - [`budget`]: the memory budget every host-sized allocation is checked
//!   against (commands, buffered data, R2Ts, log pages) and its numbers.
//! - [`log_limit`]: rate-limited log lines, so bad input cannot flood the
//!   log.

pub mod budget;
pub mod connection;
pub mod controller;
pub mod log_limit;
pub mod reservation;
pub mod target;
