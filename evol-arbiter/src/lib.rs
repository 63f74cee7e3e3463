//! The elastic-volume arbiter (issue 18; Flint, "Building an Elastic Block
//! Storage over EBOFs Using Shadow Views", §3.3–3.5, §4.2, §4.6).
//!
//! One instance leads at a time, elected with an etcd lease
//! ([`server`]); it keeps the pool and every eVol's extent map in
//! `flint-core`'s catalog, loaded from etcd when it wins, and answers:
//!
//! - the volume manager and the pool (create, delete, grow, list; add
//!   namespaces);
//! - `Allocate`: the copies of a logical extent on its first write, placed
//!   by `flint_core::placement`'s score and made durable with
//!   `cluster_store`'s guarded transaction before the answer;
//! - the shadow view (`flint_core::view`) fed by clients' I/O reports, its
//!   queries and notifications;
//! - the bandwidth auction (`flint_core::auction`).
//!
//! [`client::ArbiterClient`] is the blocking client the ublk-nvmf daemon
//! and the `evol-arbiter` admin commands use: it finds the leader in etcd
//! and follows it across failovers.
//!
//! [`nvme`] is the NVMe/TCP connection to a pool namespace that the
//! zeroing task and [`scan`] (`evol-arbiter check --scan-data`: free
//! extents must read all zeros) share.

pub mod client;
pub mod config;
pub mod limits;
pub mod nvme;
pub mod scan;
pub mod server;

/// The generated gRPC types and stubs (`proto/evol_arbiter.proto`).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("evol_arbiter.v1");
}

/// The metadata key carrying the leader's address in a refusal from an
/// instance that does not lead.
pub const LEADER_METADATA: &str = "x-arbiter-leader";
