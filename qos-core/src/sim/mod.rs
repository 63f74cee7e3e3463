//! A deterministic discrete-event simulation of tenants sharing one SSD
//! through a multi-tenancy scheme, and the Gimbal paper's experiments
//! (§5.2–§5.5) built on it.
//!
//! Pure like the rest of the crate: no I/O, no clock, no threads. One seed
//! derives every random choice (offsets, read/write draws, device jitter),
//! so a run is a function of its [`engine::RunSpec`]; a failing check
//! prints the seed that reproduces it.
//!
//! - [`workload`]: closed-loop workers (queue depth, size, mix, pattern,
//!   rate limit, start/stop)
//! - [`schedulers`]: FIFO, ReFlex-, Parda-, FlashFQ-like schemes and
//!   Gimbal (the [`crate::switch::GimbalSwitch`] with client credits)
//! - [`engine`]: the event loop: clients → network → scheduler →
//!   [`crate::ssd_model::SsdModel`] → network → clients
//! - [`metrics`]: latency percentiles, f-Util
//! - [`experiments`]: utilization, fairness, latency and dynamic-workload
//!   experiments with serializable results, and the paper's bar
//! - [`rng`]: the seeded generator

pub mod engine;
pub mod experiments;
pub mod metrics;
pub mod rng;
pub mod schedulers;
pub mod workload;

#[cfg(test)]
mod tests;
