//! Flint's policies (Jiang and Liu, "Building an Elastic Block Storage over
//! EBOFs Using Shadow Views", §3–§4) as pure state machines, and their
//! deterministic simulation (§5 claims in shape).
//!
//! Like `qos-core`, nothing here reads a clock, spawns a thread or does I/O:
//! every call that depends on time takes `now` ([`Nanos`]), every container
//! whose iteration order reaches a decision is ordered (`BTreeMap`,
//! `BTreeSet`, `VecDeque`), and every queue and batch has a limit. The
//! arbiter binary (`evol-arbiter`: etcd leadership, RPC, extent maps in
//! etcd) and the client's data path (not built yet) drive these types.
//!
//! Arbiter side:
//! - [`extent`]: extent geometry, a volume's extent map, the per-namespace
//!   allocator, the catalog of all of them with plan/apply allocation (the
//!   plan is made durable by the caller before it is applied), and the
//!   invariant checks a `check` command runs
//! - [`placement`]: the placement score of §4.2 and the choice of K
//!   namespaces (on distinct targets when possible) for K copies
//! - [`view`]: the view controller of the shadow view (§3.3–3.5): batched
//!   per-I/O vectors in, per port/target/namespace windows and EWMAs,
//!   back-propagation bottleneck analysis per epoch, queries, notifications
//! - [`auction`]: the bandwidth auction's arbiter side (§4.6, Algorithm 4):
//!   per-namespace DRR over active sessions, slices per epoch, weights per
//!   volume
//!
//! Client side:
//! - [`auction::ClientSlices`]: the slice a session holds for a namespace
//!   (Algorithm 3); the fast path needs no network
//! - [`eio`]: the eIO scheduler (§4.5, Algorithm 2), which orders I/Os
//!   within one priority class
//!
//! Simulation: [`sim`] (drives, namespaces on targets behind ports, client
//! volumes) and the experiments `gimbal-sim flint` reports in
//! `docs/flint-simulation.md`.
//!
//! Decisions taken where the paper is vague are written in the doc comment
//! of the module that takes them, citing the section.

#![forbid(unsafe_code)]

pub mod auction;
pub mod eio;
pub mod error;
pub mod extent;
pub mod ids;
pub mod placement;
pub mod sim;
pub mod view;

pub use error::{FlintError, Result};
pub use ids::{NamespaceId, PortId, SessionId, TargetId, VolumeId};
pub use qos_core::{IoKind, Nanos};
