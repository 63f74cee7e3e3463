//! Pure QoS policies for the NVMe-over-TCP storage stack.
//!
//! Every policy here is a deterministic state machine: it takes `now` (a
//! [`Nanos`]) as an argument and never reads a clock, spawns a thread or
//! does I/O. Where iteration order matters, containers are ordered
//! (`BTreeMap`, `VecDeque`) so a run is reproducible from its inputs.
//!
//! Target side (Gimbal, SIGCOMM '21):
//! - [`congestion`]: delay-based SSD congestion control (§3.2–3.3, Alg. 1)
//! - [`token_bucket`]: dual read/write token bucket (§3.3, App. C.1, Alg. 4)
//! - [`write_cost`]: write-cost estimator (§3.4)
//! - [`scheduler`]: virtual-slot DRR with per-tenant priority queues (§3.5, Alg. 2)
//! - [`credit`]: end-to-end credits and their completion-dword encoding (§3.6)
//! - [`switch`]: the per-device pipeline that wires them together, and the
//!   virtual view (§3.7)
//!
//! Client side (the ublk server):
//! - [`credit_gate`]: in-flight limit from target credits or, for targets
//!   that send none, a bandwidth × base-latency estimate (§3.6, Algorithm 3)
//! - [`base_latency`], [`delivery_rate`]: the estimate's two measurements;
//!   [`gain_probe`]: its gain, found by probing; [`neighbours`]: what a
//!   probe cost the other volumes of its namespace on the host
//! - [`rate_limiter`]: IOPS/bandwidth limits with bursts (§4.3)
//! - [`replica`]: read replica selection (§4.3)
//! - [`replica_set`]: the set-of-replicas type the client's fan-out uses
//!
//! Priority classes:
//! - [`priority`]: NVMe classes and the ionice → class mapping
//! - [`class_arbiter`]: WRR (commands) and DRR (bytes) class arbitration
//!   with urgent-first and aging
//! - [`class_model`]: the queueing model of the ionice paper (Equations 1–3)
//!
//! Simulation:
//! - [`ssd_model`]: a deterministic SSD model calibrated to the paper's
//!   device, for simulations and the target's simulated backend
//! - [`sim`]: a discrete-event simulation of tenants, the compared schemes
//!   (FIFO, ReFlex, Parda, FlashFQ, Gimbal) and the paper's experiments
//!
//! Shared vocabulary: [`time`], [`types`], [`config`], [`error`].
//!
//! Decisions taken where the papers are vague are written in the doc
//! comment of the module that makes them, citing the section.

#![forbid(unsafe_code)]

pub mod base_latency;
pub mod class_arbiter;
pub mod class_model;
pub mod config;
pub mod congestion;
pub mod credit;
pub mod credit_gate;
pub mod delivery_rate;
pub mod error;
pub mod gain_probe;
pub mod neighbours;
pub mod priority;
pub mod rate_limiter;
pub mod replica;
pub mod replica_set;
pub mod scheduler;
pub mod sim;
pub mod ssd_model;
pub mod switch;
pub mod time;
pub mod token_bucket;
pub mod types;
pub mod write_cost;

pub use config::GimbalConfig;
pub use error::{QosError, Result};
pub use replica_set::ReplicaSet;
pub use time::Nanos;
pub use types::{IoKind, RequestId, TenantId};
