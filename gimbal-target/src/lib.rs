//! `gimbal-target`: an NVMe/TCP target that is also a multi-tenant storage
//! switch (the Gimbal design, SIGCOMM '21).
//!
//! Layers, from the wire inwards:
//! - the front end speaks NVMe/TCP (through `nvmf-proto`), one controller
//!   per host association, admin and I/O queues, the discovery subsystem;
//! - one pipeline per namespace (backend device) sits between the front end
//!   and the backend: with `qos = "none"` it passes requests straight
//!   through, with `qos = "gimbal"` it runs the storage switch from
//!   `qos-core`;
//! - backends keep the data: `ram`, `null`, `file`.

pub mod backend;
pub mod clock;
pub mod config;
pub mod config_error;
pub mod connection;
pub mod controller;
pub mod pipeline;
pub mod server;
pub mod simulate;
pub mod target;
