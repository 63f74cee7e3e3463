//! Cluster mode's state in etcd.
//!
//! A volume served by one host at a time, from any of many hosts, needs
//! state that outlives the host serving it: who owns the volume now (and
//! the epoch that fences everyone else), and which replicas hold its data.
//! That state lives in etcd, an existing replicated store, never in a
//! home-made one. This crate holds:
//!
//! - [`records`]: the keys and records of a volume and the pure rules that
//!   change them (the last in-sync replica is never recorded out of sync;
//!   where a new owner starts from);
//! - [`store`]: a blocking etcd client and the guarded transactions
//!   (attach by compare-and-swap on the epoch, health writes guarded by
//!   the writer's epoch);
//! - [`evol`]: elastic volumes' pool, specs and extent maps, and the
//!   arbiter's leadership (issue 18), with the transactions that keep a
//!   physical extent from being mapped twice;
//! - [`evol_health`]: an eVol's per-extent stale marks, written by its
//!   owner under its attach epoch;
//! - [`testing`]: a real etcd cluster on loopback for tests.
//!
//! The single-host default never touches any of it.

pub mod evol;
pub mod evol_health;
pub mod records;
pub mod store;
pub mod testing;
pub mod watch;

pub use records::{
    reservation_epoch, reservation_key, start_plan, HealthRecord, LocalLog, OwnerRecord,
    ReplicaStart, RuleError, StartPlan, VolumeKeys, VolumeSpec,
};
pub use store::{AttachMode, Attached, Store, StoreConfig, StoreError, VolumeView};
