//! The view controller of the shadow view (§3.3–3.5): a model of ports,
//! targets and namespaces built from every client's completed I/Os.
//!
//! Call order (sans-IO, like `nvmf-initiator`'s queue):
//! 1. topology: [`ViewController::add_target`], [`add_port`],
//!    [`add_namespace`], [`add_session`] / [`remove_session`] as sessions
//!    come and go;
//! 2. [`ingest`] each batch of per-I/O vectors a client's view agent sends
//!    (the returned [`IngestAck`] carries the recency counters of §3.4);
//! 3. [`handle_timeout`] whenever `now` reaches [`poll_timeout`]: it closes
//!    the epoch (window → rates → EWMAs, write cost), runs the bottleneck
//!    analysis and queues notifications;
//! 4. [`poll_notification`] until `None`, and queries at any time:
//!    [`namespace`], [`port`], [`target`], [`load`], [`last_report`].
//!
//! [`add_port`]: ViewController::add_port
//! [`add_namespace`]: ViewController::add_namespace
//! [`add_session`]: ViewController::add_session
//! [`remove_session`]: ViewController::remove_session
//! [`ingest`]: ViewController::ingest
//! [`handle_timeout`]: ViewController::handle_timeout
//! [`poll_timeout`]: ViewController::poll_timeout
//! [`poll_notification`]: ViewController::poll_notification
//! [`namespace`]: ViewController::namespace
//! [`port`]: ViewController::port
//! [`target`]: ViewController::target
//! [`load`]: ViewController::load
//! [`last_report`]: ViewController::last_report
//!
//! The model (§3.2, Figure 3) maps onto ours as: the paper's Ethernet port
//! and NetPipe are a target's network [port](crate::PortId) (a session is
//! one client's connection through one port), its I/O port and IOPipe
//! belong to the target, and an SSD is a namespace (one mega-volume per
//! drive).
//!
//! Decisions where the paper is vague:
//! - **Windows and epochs.** One window per entity per epoch (default
//!   10 ms); at the epoch's end the window becomes the entity's *current*
//!   rates and is folded into an EWMA (default α = 0.5 for the newest
//!   epoch). A vector counts in the window open when it arrives, unless it
//!   completed more than `stale_after` (default two epochs) before `now`:
//!   then it is dropped and counted as stale. §3.4 places late vectors by
//!   their EBOF timestamp; crediting them on arrival keeps every window's
//!   duration exact and loses nothing from agents that batch for less than
//!   an epoch, which is the rule (their batches are bounded by size and
//!   by time).
//! - **Namespace capacity and busy degree.** §3.3 combines an offline
//!   profile with an online estimate. The profile is the namespace's
//!   read bandwidth and read IOPS ([`NamespaceSpec`]); each I/O is charged
//!   the device time `max(bytes / bandwidth, 1 / IOPS)`, times the write
//!   cost for writes (so sizes and kinds mix). Utilization is that time
//!   per second of window; the **busy degree** is the utilization EWMA
//!   clamped to [0, 1] and the **headroom** is 1 − busy (as a fraction,
//!   or in read-equivalent bytes per second).
//! - **Write cost** (§3.3: "approximated using the dynamic write cost"):
//!   Gimbal's rule (§3.4 of that paper) once per epoch with writes: if the
//!   writes' mean latency beyond their transfer time at the profiled
//!   bandwidth is below `fast_write_latency`, the cost drops by
//!   `write_cost_decrement`, else it moves halfway to `write_cost_worst`.
//!   It starts at the worst case, safe until writes prove cheap.
//! - **Ports**: full duplex, so utilization is the busier direction's
//!   bytes per second over the port's speed. **Targets**: the sum of their
//!   ports' bytes over their own limit if one is configured, else the
//!   busiest port's utilization.
//! - **Bottleneck analysis** (Algorithm 1), on the EWMAs so a single noisy
//!   epoch does not flap: a namespace with headroom ≤ `congested_headroom`
//!   (Algorithm 1's Threshold) is congested; every session that sent it
//!   I/O this epoch is a victim, and its port is affected (the NetPipe of
//!   L6–9); every session active on an affected port is a victim too
//!   (L10–13). Beyond the paper (§3.5 assumes pipes never saturate) a port
//!   whose utilization is ≥ 1 − `congested_headroom` is congested itself
//!   and its active sessions are victims: on our targets a port is a
//!   25–100 GbE NIC that a few drives can fill.
//! - **Notifications** are edge-triggered: a subscription is told when its
//!   condition starts to hold and when it stops, at epoch ends, so a
//!   subscriber is not flooded while a namespace stays busy. At most
//!   `max_notifications` wait; beyond that the oldest are dropped and
//!   counted ([`ViewController::dropped_notifications`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::error::{FlintError, Result};
use crate::ids::{NamespaceId, PortId, SessionId, TargetId, VolumeId};
use crate::placement::NamespaceLoad;
use crate::{IoKind, Nanos};

const NANOS_PER_SEC: f64 = 1e9;

/// Parameters of the view controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViewConfig {
    /// Most vectors one batch may carry. Default 4096.
    pub max_batch: usize,
    /// Length of an epoch (window), nanoseconds. Default 10 ms.
    pub epoch_ns: u64,
    /// Weight of the newest epoch in the EWMAs, in (0, 1]. Default 0.5.
    pub ewma_alpha: f64,
    /// Algorithm 1's threshold: a namespace with at most this headroom
    /// fraction (a port with at least 1 − this utilization) is congested.
    /// Default 0.1.
    pub congested_headroom: f64,
    /// Vectors that completed longer ago than this are dropped as stale,
    /// nanoseconds. Default 20 ms (two epochs).
    pub stale_after_ns: u64,
    /// Most notifications waiting to be polled. Default 1024.
    pub max_notifications: usize,
}

impl Default for ViewConfig {
    fn default() -> Self {
        ViewConfig {
            max_batch: 4096,
            epoch_ns: 10_000_000,
            ewma_alpha: 0.5,
            congested_headroom: 0.1,
            stale_after_ns: 20_000_000,
            max_notifications: 1024,
        }
    }
}

impl ViewConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if self.max_batch == 0 {
            return Err(FlintError::invalid("max_batch", "must be at least 1"));
        }
        if self.epoch_ns == 0 {
            return Err(FlintError::invalid("epoch_ns", "must be positive"));
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return Err(FlintError::invalid("ewma_alpha", "must be in (0, 1]"));
        }
        if !(0.0..1.0).contains(&self.congested_headroom) {
            return Err(FlintError::invalid(
                "congested_headroom",
                "must be in [0, 1)",
            ));
        }
        if self.max_notifications == 0 {
            return Err(FlintError::invalid(
                "max_notifications",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A target port (the paper's Ethernet port and NetPipe).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PortSpec {
    /// The target it belongs to.
    pub target: TargetId,
    /// Payload bytes per second it carries in each direction.
    pub bytes_per_sec: u64,
}

/// A target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetSpec {
    /// Payload bytes per second its pipeline handles, both directions
    /// together; `None` when only its ports limit it.
    pub bytes_per_sec: Option<u64>,
}

/// A namespace's offline profile (§3.3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamespaceSpec {
    /// The target it is on.
    pub target: TargetId,
    /// Read bandwidth with large I/Os, bytes per second.
    pub read_bytes_per_sec: u64,
    /// Read IOPS with small I/Os.
    pub read_iops: u64,
    /// Write cost on a fully fragmented drive (≥ 1).
    pub write_cost_worst: f64,
    /// Writes whose mean latency beyond their transfer time is below this
    /// are cheap (Gimbal's Thresh_min), nanoseconds.
    pub fast_write_latency_ns: u64,
    /// How much the write cost drops per epoch of cheap writes.
    pub write_cost_decrement: f64,
}

impl NamespaceSpec {
    /// A profile with Gimbal's write-cost defaults (worst 9, 250 µs, 0.5).
    pub fn new(target: TargetId, read_bytes_per_sec: u64, read_iops: u64) -> Self {
        NamespaceSpec {
            target,
            read_bytes_per_sec,
            read_iops,
            write_cost_worst: 9.0,
            fast_write_latency_ns: 250_000,
            write_cost_decrement: 0.5,
        }
    }

    /// Device time one read of `bytes` takes at the profile, nanoseconds.
    pub fn read_time_ns(&self, bytes: u64) -> f64 {
        let by_bytes = bytes as f64 * NANOS_PER_SEC / self.read_bytes_per_sec.max(1) as f64;
        let by_iops = NANOS_PER_SEC / self.read_iops.max(1) as f64;
        by_bytes.max(by_iops)
    }

    fn validate(&self) -> Result<()> {
        if self.read_bytes_per_sec == 0 || self.read_iops == 0 {
            return Err(FlintError::invalid(
                "read_bytes_per_sec",
                "profile must be positive",
            ));
        }
        if self.write_cost_worst.is_nan() || self.write_cost_worst < 1.0 {
            return Err(FlintError::invalid(
                "write_cost_worst",
                "must be at least 1",
            ));
        }
        if self.write_cost_decrement.is_nan() || self.write_cost_decrement <= 0.0 {
            return Err(FlintError::invalid(
                "write_cost_decrement",
                "must be positive",
            ));
        }
        Ok(())
    }
}

/// A session: one client's connection through one port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionSpec {
    /// The port it goes through.
    pub port: PortId,
    /// The volume it serves.
    pub volume: VolumeId,
}

/// One completed I/O as a client's view agent reports it (§3.3), or
/// `count` completed I/Os of one session, namespace, kind and size class
/// summed (an agent that aggregates per epoch: see `docs/evol.md`, per-I/O
/// vectors stop scaling at tens of busy clients).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoVector {
    /// The session it went through.
    pub session: SessionId,
    /// The namespace it went to.
    pub namespace: NamespaceId,
    /// Read or write.
    pub kind: IoKind,
    /// Bytes transferred (summed over `count`).
    pub bytes: u64,
    /// Submission to completion at the client, nanoseconds (summed over
    /// `count`).
    pub latency_ns: u64,
    /// How many I/Os this vector stands for (0 is taken as 1).
    #[serde(default = "one")]
    pub count: u64,
    /// When it completed (the client's clock, synchronized).
    #[serde(with = "crate::ids::nanos_serde")]
    pub completed_at: Nanos,
}

fn one() -> u64 {
    1
}

/// An entity of the model, for recency counters and notifications.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Entity {
    /// A port.
    Port(PortId),
    /// A target.
    Target(TargetId),
    /// A namespace.
    Namespace(NamespaceId),
}

/// What [`ViewController::ingest`] did with a batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IngestAck {
    /// Vectors counted.
    pub accepted: usize,
    /// Vectors dropped because they completed too long ago.
    pub stale: usize,
    /// Vectors dropped for an unknown session or namespace, or a namespace
    /// not on the session's target.
    pub unknown: usize,
    /// The recency counter of every entity the batch touched, after it
    /// (§3.4: an agent whose counter moved by more than its own vectors
    /// knows other clients share the entity and may pull its view).
    pub counters: Vec<(Entity, u64)>,
}

/// Rates of one entity over one window, or their EWMA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Bytes read per second.
    pub read_bytes_per_sec: f64,
    /// Bytes written per second.
    pub write_bytes_per_sec: f64,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// Mean read latency, nanoseconds (EWMA: of the epochs with reads).
    pub read_latency_ns: f64,
    /// Mean write latency, nanoseconds.
    pub write_latency_ns: f64,
    /// Fraction of the entity's capacity used (may exceed 1 when the
    /// profile underestimates the device).
    pub utilization: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Window {
    read_bytes: u64,
    write_bytes: u64,
    reads: u64,
    writes: u64,
    read_latency_ns: u128,
    write_latency_ns: u128,
    /// Namespaces: profiled device time of the window's I/Os, nanoseconds.
    device_time_ns: f64,
    /// Namespaces: write latency beyond transfer time, summed.
    write_excess_ns: f64,
}

impl Window {
    /// Counts `v` (its `count` I/Os; sums saturate: a client chooses
    /// them).
    fn add(&mut self, v: &IoVector) {
        let n = v.count.max(1);
        match v.kind {
            IoKind::Read => {
                self.read_bytes = self.read_bytes.saturating_add(v.bytes);
                self.reads = self.reads.saturating_add(n);
                self.read_latency_ns += u128::from(v.latency_ns);
            }
            IoKind::Write => {
                self.write_bytes = self.write_bytes.saturating_add(v.bytes);
                self.writes = self.writes.saturating_add(n);
                self.write_latency_ns += u128::from(v.latency_ns);
            }
        }
    }

    fn rates(&self, duration_ns: u64) -> Rates {
        let secs = duration_ns.max(1) as f64 / NANOS_PER_SEC;
        let mean = |sum: u128, n: u64| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        Rates {
            read_bytes_per_sec: self.read_bytes as f64 / secs,
            write_bytes_per_sec: self.write_bytes as f64 / secs,
            read_iops: self.reads as f64 / secs,
            write_iops: self.writes as f64 / secs,
            read_latency_ns: mean(self.read_latency_ns, self.reads),
            write_latency_ns: mean(self.write_latency_ns, self.writes),
            utilization: 0.0,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Stats {
    window: Window,
    current: Rates,
    ewma: Rates,
    epochs: u64,
    counter: u64,
}

impl Stats {
    /// Closes the window into `current` (with `utilization`) and the EWMA.
    fn close(
        &mut self,
        duration_ns: u64,
        alpha: f64,
        utilization: impl Fn(&Window, &Rates) -> f64,
    ) {
        let mut current = self.window.rates(duration_ns);
        current.utilization = utilization(&self.window, &current);
        let blend = |old: f64, new: f64| alpha * new + (1.0 - alpha) * old;
        let first = self.epochs == 0;
        let e = &mut self.ewma;
        if first {
            *e = current;
        } else {
            e.read_bytes_per_sec = blend(e.read_bytes_per_sec, current.read_bytes_per_sec);
            e.write_bytes_per_sec = blend(e.write_bytes_per_sec, current.write_bytes_per_sec);
            e.read_iops = blend(e.read_iops, current.read_iops);
            e.write_iops = blend(e.write_iops, current.write_iops);
            e.utilization = blend(e.utilization, current.utilization);
            // Latency has no meaning in an epoch without I/O of the kind:
            // keep the last known value rather than decay toward zero.
            if self.window.reads > 0 {
                e.read_latency_ns = if e.read_latency_ns == 0.0 {
                    current.read_latency_ns
                } else {
                    blend(e.read_latency_ns, current.read_latency_ns)
                };
            }
            if self.window.writes > 0 {
                e.write_latency_ns = if e.write_latency_ns == 0.0 {
                    current.write_latency_ns
                } else {
                    blend(e.write_latency_ns, current.write_latency_ns)
                };
            }
        }
        self.current = current;
        self.epochs += 1;
        self.window = Window::default();
    }
}

#[derive(Clone, Debug, PartialEq)]
struct NamespaceState {
    spec: NamespaceSpec,
    stats: Stats,
    write_cost: f64,
}

#[derive(Clone, Debug, PartialEq)]
struct PortState {
    spec: PortSpec,
    stats: Stats,
}

#[derive(Clone, Debug, PartialEq)]
struct TargetState {
    spec: TargetSpec,
    stats: Stats,
}

#[derive(Clone, Debug, PartialEq)]
struct SessionState {
    spec: SessionSpec,
    /// Namespaces it sent I/O to in the open epoch.
    active_on: BTreeSet<NamespaceId>,
}

/// What the view says about a namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamespaceView {
    /// The namespace.
    pub namespace: NamespaceId,
    /// Its target.
    pub target: TargetId,
    /// The last closed window.
    pub current: Rates,
    /// The EWMA over windows.
    pub ewma: Rates,
    /// Busy degree in [0, 1].
    pub busy_degree: f64,
    /// Headroom as a fraction of capacity, in [0, 1].
    pub headroom_fraction: f64,
    /// Headroom in read-equivalent bytes per second.
    pub headroom_bytes_per_sec: f64,
    /// The write cost estimate, in [1, worst].
    pub write_cost: f64,
    /// Recency counter (§3.4).
    pub counter: u64,
}

/// What the view says about a port or a target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkView {
    /// The last closed window.
    pub current: Rates,
    /// The EWMA over windows.
    pub ewma: Rates,
    /// Recency counter (§3.4).
    pub counter: u64,
}

/// Why a session is a victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum VictimCause {
    /// It sends I/O to a congested namespace.
    Namespace(NamespaceId),
    /// It shares a port with such a session, or the port is congested.
    Port(PortId),
}

/// The result of one epoch's bottleneck analysis (Algorithm 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BottleneckReport {
    /// The epoch it closed (counting from 1).
    pub epoch: u64,
    /// When the epoch ended.
    #[serde(with = "crate::ids::nanos_serde")]
    pub at: Nanos,
    /// Namespaces with headroom at or below the threshold.
    pub congested_namespaces: BTreeSet<NamespaceId>,
    /// Ports at or above 1 − threshold utilization.
    pub congested_ports: BTreeSet<PortId>,
    /// Ports carrying a session to a congested namespace (the NetPipes of
    /// Algorithm 1, L8).
    pub affected_ports: BTreeSet<PortId>,
    /// Victim sessions, each with its first cause.
    pub victims: BTreeMap<SessionId, VictimCause>,
}

/// Identity of a subscriber (an RPC client of the arbiter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SubscriberId(pub u64);

/// Identity of one subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SubscriptionId(pub u64);

/// A condition a subscriber wants to hear about.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Condition {
    /// The namespace's headroom fraction fell below `fraction`.
    HeadroomBelow {
        /// The namespace.
        namespace: NamespaceId,
        /// The threshold in [0, 1].
        fraction: f64,
    },
    /// The port's utilization rose above `fraction`.
    PortUtilizationAbove {
        /// The port.
        port: PortId,
        /// The threshold.
        fraction: f64,
    },
    /// The session became a victim of a bottleneck.
    Victim {
        /// The session.
        session: SessionId,
    },
}

/// A condition started or stopped holding.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Who subscribed.
    pub subscriber: SubscriberId,
    /// Which subscription.
    pub subscription: SubscriptionId,
    /// The condition.
    pub condition: Condition,
    /// True when it started to hold, false when it stopped.
    pub holds: bool,
    /// The value that decided (headroom, utilization; 1/0 for victims).
    pub value: f64,
    /// The epoch at whose end it was decided.
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct Subscription {
    subscriber: SubscriberId,
    condition: Condition,
    holds: bool,
}

/// The view controller.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewController {
    config: ViewConfig,
    targets: BTreeMap<TargetId, TargetState>,
    ports: BTreeMap<PortId, PortState>,
    namespaces: BTreeMap<NamespaceId, NamespaceState>,
    sessions: BTreeMap<SessionId, SessionState>,
    subscriptions: BTreeMap<SubscriptionId, Subscription>,
    next_subscription: u64,
    notifications: VecDeque<Notification>,
    dropped_notifications: u64,
    epoch: u64,
    epoch_start: Nanos,
    report: BottleneckReport,
}

impl ViewController {
    /// A controller with no entities whose first epoch starts at `now`.
    pub fn new(config: ViewConfig, now: Nanos) -> Result<Self> {
        config.validate()?;
        Ok(ViewController {
            config,
            targets: BTreeMap::new(),
            ports: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            sessions: BTreeMap::new(),
            subscriptions: BTreeMap::new(),
            next_subscription: 1,
            notifications: VecDeque::new(),
            dropped_notifications: 0,
            epoch: 0,
            epoch_start: now,
            report: BottleneckReport::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ViewConfig {
        &self.config
    }

    /// Adds (or respecifies) a target.
    pub fn add_target(&mut self, target: TargetId, spec: TargetSpec) {
        self.targets
            .entry(target)
            .and_modify(|t| t.spec = spec.clone())
            .or_insert(TargetState {
                spec,
                stats: Stats::default(),
            });
    }

    /// Adds (or respecifies) a port of a known target.
    pub fn add_port(&mut self, port: PortId, spec: PortSpec) -> Result<()> {
        if !self.targets.contains_key(&spec.target) {
            return Err(FlintError::UnknownTarget(spec.target));
        }
        if spec.bytes_per_sec == 0 {
            return Err(FlintError::invalid(
                "bytes_per_sec",
                "port speed must be positive",
            ));
        }
        self.ports
            .entry(port)
            .and_modify(|p| p.spec = spec.clone())
            .or_insert(PortState {
                spec,
                stats: Stats::default(),
            });
        Ok(())
    }

    /// Adds (or reprofiles) a namespace of a known target.
    pub fn add_namespace(&mut self, namespace: NamespaceId, spec: NamespaceSpec) -> Result<()> {
        if !self.targets.contains_key(&spec.target) {
            return Err(FlintError::UnknownTarget(spec.target));
        }
        spec.validate()?;
        let worst = spec.write_cost_worst;
        self.namespaces
            .entry(namespace)
            .and_modify(|n| {
                n.write_cost = n.write_cost.min(worst);
                n.spec = spec.clone();
            })
            .or_insert(NamespaceState {
                spec,
                stats: Stats::default(),
                write_cost: worst,
            });
        Ok(())
    }

    /// Adds (or moves) a session through a known port.
    pub fn add_session(&mut self, session: SessionId, spec: SessionSpec) -> Result<()> {
        if !self.ports.contains_key(&spec.port) {
            return Err(FlintError::UnknownPort(spec.port));
        }
        self.sessions.insert(
            session,
            SessionState {
                spec,
                active_on: BTreeSet::new(),
            },
        );
        Ok(())
    }

    /// Forgets a session (its later vectors count as unknown).
    pub fn remove_session(&mut self, session: SessionId) -> Result<()> {
        self.sessions
            .remove(&session)
            .map(|_| ())
            .ok_or(FlintError::UnknownSession(session))
    }

    /// Counts a batch of vectors (at most `max_batch`) into the open
    /// epoch's windows of the session's port and target and of the
    /// namespace.
    pub fn ingest(&mut self, now: Nanos, batch: &[IoVector]) -> Result<IngestAck> {
        if batch.len() > self.config.max_batch {
            return Err(FlintError::BatchTooLarge {
                len: batch.len(),
                max: self.config.max_batch,
            });
        }
        let mut ack = IngestAck::default();
        let mut touched = BTreeSet::new();
        for v in batch {
            if now.nanos_since(v.completed_at) > self.config.stale_after_ns {
                ack.stale += 1;
                continue;
            }
            let Some(session) = self.sessions.get_mut(&v.session) else {
                ack.unknown += 1;
                continue;
            };
            let port = session.spec.port;
            let port_target = self.ports[&port].spec.target;
            let Some(ns) = self.namespaces.get_mut(&v.namespace) else {
                ack.unknown += 1;
                continue;
            };
            if ns.spec.target != port_target {
                ack.unknown += 1;
                continue;
            }
            session.active_on.insert(v.namespace);
            // An aggregate of n I/Os of one size class: n times the time
            // of their mean size (exact for one I/O).
            let n = v.count.max(1);
            let device_time = n as f64
                * ns.spec.read_time_ns(v.bytes / n)
                * match v.kind {
                    IoKind::Read => 1.0,
                    IoKind::Write => ns.write_cost,
                };
            ns.stats.window.add(v);
            ns.stats.window.device_time_ns += device_time;
            if v.kind == IoKind::Write {
                let transfer = v.bytes as f64 * NANOS_PER_SEC / ns.spec.read_bytes_per_sec as f64;
                ns.stats.window.write_excess_ns += (v.latency_ns as f64 - transfer).max(0.0);
            }
            ns.stats.counter += 1;
            let p = self
                .ports
                .get_mut(&port)
                .expect("sessions name known ports");
            p.stats.window.add(v);
            p.stats.counter += 1;
            let t = self
                .targets
                .get_mut(&port_target)
                .expect("ports name known targets");
            t.stats.window.add(v);
            t.stats.counter += 1;
            touched.insert(Entity::Namespace(v.namespace));
            touched.insert(Entity::Port(port));
            touched.insert(Entity::Target(port_target));
            ack.accepted += 1;
        }
        ack.counters = touched
            .into_iter()
            .map(|e| (e, self.counter(e).unwrap_or(0)))
            .collect();
        Ok(ack)
    }

    /// When the open epoch ends: call [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Nanos {
        self.epoch_start.saturating_add_nanos(self.config.epoch_ns)
    }

    /// Closes every epoch that ended by `now`. Returns how many closed.
    pub fn handle_timeout(&mut self, now: Nanos) -> u64 {
        let mut closed = 0;
        // An idle controller that was not called for a long time closes one
        // epoch with the data it has, then jumps: empty epochs carry no
        // evidence, and the loop stays bounded.
        let behind = now.nanos_since(self.epoch_start) / self.config.epoch_ns;
        if behind > 8 {
            self.close_epoch();
            closed += 1;
            self.epoch_start =
                Nanos(self.epoch_start.as_nanos() + (behind - 1) * self.config.epoch_ns);
        }
        while now >= self.poll_timeout() {
            self.close_epoch();
            closed += 1;
        }
        closed
    }

    fn close_epoch(&mut self) {
        let duration = self.config.epoch_ns;
        let alpha = self.config.ewma_alpha;
        let end = self.poll_timeout();
        self.epoch += 1;
        for ns in self.namespaces.values_mut() {
            let window = &ns.stats.window;
            if window.writes > 0 {
                let excess = window.write_excess_ns / window.writes as f64;
                ns.write_cost = if excess < ns.spec.fast_write_latency_ns as f64 {
                    (ns.write_cost - ns.spec.write_cost_decrement).max(1.0)
                } else {
                    (ns.write_cost + ns.spec.write_cost_worst) / 2.0
                };
            }
            ns.stats
                .close(duration, alpha, |w, _| w.device_time_ns / duration as f64);
        }
        let mut port_util: BTreeMap<TargetId, f64> = BTreeMap::new();
        for p in self.ports.values_mut() {
            let speed = p.spec.bytes_per_sec as f64;
            p.stats.close(duration, alpha, |_, r| {
                r.read_bytes_per_sec.max(r.write_bytes_per_sec) / speed
            });
            let u = port_util.entry(p.spec.target).or_insert(0.0);
            *u = u.max(p.stats.current.utilization);
        }
        for (id, t) in self.targets.iter_mut() {
            let limit = t.spec.bytes_per_sec;
            let busiest_port = port_util.get(id).copied().unwrap_or(0.0);
            t.stats.close(duration, alpha, |_, r| match limit {
                Some(l) => (r.read_bytes_per_sec + r.write_bytes_per_sec) / l.max(1) as f64,
                None => busiest_port,
            });
        }
        self.report = self.analyze(end);
        for s in self.sessions.values_mut() {
            s.active_on.clear();
        }
        self.epoch_start = end;
        self.notify();
    }

    /// Algorithm 1, on the EWMAs (see the module docs).
    fn analyze(&self, at: Nanos) -> BottleneckReport {
        let threshold = self.config.congested_headroom;
        let congested_namespaces: BTreeSet<NamespaceId> = self
            .namespaces
            .iter()
            .filter(|(_, n)| 1.0 - n.stats.ewma.utilization.clamp(0.0, 1.0) <= threshold)
            .map(|(id, _)| *id)
            .collect();
        let congested_ports: BTreeSet<PortId> = self
            .ports
            .iter()
            .filter(|(_, p)| p.stats.ewma.utilization >= 1.0 - threshold)
            .map(|(id, _)| *id)
            .collect();
        let mut victims = BTreeMap::new();
        let mut affected_ports = BTreeSet::new();
        for (id, s) in &self.sessions {
            if let Some(ns) = s.active_on.intersection(&congested_namespaces).next() {
                victims.insert(*id, VictimCause::Namespace(*ns));
                affected_ports.insert(s.spec.port);
            }
        }
        for (id, s) in &self.sessions {
            let port = s.spec.port;
            if !s.active_on.is_empty()
                && (affected_ports.contains(&port) || congested_ports.contains(&port))
            {
                victims.entry(*id).or_insert(VictimCause::Port(port));
            }
        }
        BottleneckReport {
            epoch: self.epoch,
            at,
            congested_namespaces,
            congested_ports,
            affected_ports,
            victims,
        }
    }

    fn notify(&mut self) {
        let mut out = Vec::new();
        for (id, sub) in self.subscriptions.iter_mut() {
            let (holds, value) = match sub.condition {
                Condition::HeadroomBelow {
                    namespace,
                    fraction,
                } => match self.namespaces.get(&namespace) {
                    Some(n) => {
                        let headroom = 1.0 - n.stats.ewma.utilization.clamp(0.0, 1.0);
                        (headroom < fraction, headroom)
                    }
                    None => (false, 0.0),
                },
                Condition::PortUtilizationAbove { port, fraction } => match self.ports.get(&port) {
                    Some(p) => (
                        p.stats.ewma.utilization > fraction,
                        p.stats.ewma.utilization,
                    ),
                    None => (false, 0.0),
                },
                Condition::Victim { session } => {
                    let v = self.report.victims.contains_key(&session);
                    (v, if v { 1.0 } else { 0.0 })
                }
            };
            if holds != sub.holds {
                sub.holds = holds;
                out.push(Notification {
                    subscriber: sub.subscriber,
                    subscription: *id,
                    condition: sub.condition,
                    holds,
                    value,
                    epoch: self.epoch,
                });
            }
        }
        for n in out {
            if self.notifications.len() == self.config.max_notifications {
                self.notifications.pop_front();
                self.dropped_notifications += 1;
            }
            self.notifications.push_back(n);
        }
    }

    /// Subscribes `subscriber` to `condition` (told at the next epoch end
    /// if it already holds).
    pub fn subscribe(&mut self, subscriber: SubscriberId, condition: Condition) -> SubscriptionId {
        let id = SubscriptionId(self.next_subscription);
        self.next_subscription += 1;
        self.subscriptions.insert(
            id,
            Subscription {
                subscriber,
                condition,
                holds: false,
            },
        );
        id
    }

    /// Ends a subscription.
    pub fn unsubscribe(&mut self, subscription: SubscriptionId) -> bool {
        self.subscriptions.remove(&subscription).is_some()
    }

    /// Ends every subscription of `subscriber` (it went away).
    pub fn unsubscribe_all(&mut self, subscriber: SubscriberId) {
        self.subscriptions.retain(|_, s| s.subscriber != subscriber);
    }

    /// The next notification to deliver.
    pub fn poll_notification(&mut self) -> Option<Notification> {
        self.notifications.pop_front()
    }

    /// Notifications dropped because too many waited.
    pub fn dropped_notifications(&self) -> u64 {
        self.dropped_notifications
    }

    /// Epochs closed so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The latest epoch's bottleneck report.
    pub fn last_report(&self) -> &BottleneckReport {
        &self.report
    }

    /// The recency counter of `entity`.
    pub fn counter(&self, entity: Entity) -> Option<u64> {
        match entity {
            Entity::Port(p) => self.ports.get(&p).map(|p| p.stats.counter),
            Entity::Target(t) => self.targets.get(&t).map(|t| t.stats.counter),
            Entity::Namespace(n) => self.namespaces.get(&n).map(|n| n.stats.counter),
        }
    }

    /// The view of a namespace.
    pub fn namespace(&self, namespace: NamespaceId) -> Option<NamespaceView> {
        let n = self.namespaces.get(&namespace)?;
        let busy_degree = n.stats.ewma.utilization.clamp(0.0, 1.0);
        Some(NamespaceView {
            namespace,
            target: n.spec.target,
            current: n.stats.current,
            ewma: n.stats.ewma,
            busy_degree,
            headroom_fraction: 1.0 - busy_degree,
            headroom_bytes_per_sec: (1.0 - busy_degree) * n.spec.read_bytes_per_sec as f64,
            write_cost: n.write_cost,
            counter: n.stats.counter,
        })
    }

    /// The offline profile of a namespace.
    pub fn namespace_spec(&self, namespace: NamespaceId) -> Option<&NamespaceSpec> {
        self.namespaces.get(&namespace).map(|n| &n.spec)
    }

    /// The view of a port.
    pub fn port(&self, port: PortId) -> Option<LinkView> {
        self.ports.get(&port).map(|p| LinkView {
            current: p.stats.current,
            ewma: p.stats.ewma,
            counter: p.stats.counter,
        })
    }

    /// The view of a target.
    pub fn target(&self, target: TargetId) -> Option<LinkView> {
        self.targets.get(&target).map(|t| LinkView {
            current: t.stats.current,
            ewma: t.stats.ewma,
            counter: t.stats.counter,
        })
    }

    /// What placement needs of a namespace; an unknown one is idle.
    pub fn load(&self, namespace: NamespaceId) -> NamespaceLoad {
        match self.namespaces.get(&namespace) {
            Some(n) => NamespaceLoad {
                busy_degree: n.stats.ewma.utilization.clamp(0.0, 1.0),
                write_cost_degree: if n.spec.write_cost_worst > 1.0 {
                    (n.write_cost - 1.0) / (n.spec.write_cost_worst - 1.0)
                } else {
                    0.0
                },
            },
            None => NamespaceLoad::default(),
        }
    }

    /// The session's spec.
    pub fn session(&self, session: SessionId) -> Option<&SessionSpec> {
        self.sessions.get(&session).map(|s| &s.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Two targets, one port each (10 GB/s), two namespaces each
    /// (3.2 GB/s, 400k IOPS), sessions 0..4: s0, s1 on port 0, s2, s3 on
    /// port 1.
    fn controller() -> ViewController {
        let mut v = ViewController::new(ViewConfig::default(), Nanos::ZERO).unwrap();
        for t in 0..2 {
            v.add_target(TargetId(t), TargetSpec::default());
            v.add_port(
                PortId(t),
                PortSpec {
                    target: TargetId(t),
                    bytes_per_sec: 10_000_000_000,
                },
            )
            .unwrap();
            for n in 0..2 {
                v.add_namespace(
                    NamespaceId(t * 2 + n),
                    NamespaceSpec::new(TargetId(t), 3_200_000_000, 400_000),
                )
                .unwrap();
            }
        }
        for s in 0..4 {
            v.add_session(
                SessionId(s),
                SessionSpec {
                    port: PortId(s / 2),
                    volume: VolumeId(s),
                },
            )
            .unwrap();
        }
        v
    }

    fn vector(session: u32, namespace: u32, kind: IoKind, bytes: u64, at: Nanos) -> IoVector {
        IoVector {
            session: SessionId(session),
            namespace: NamespaceId(namespace),
            kind,
            bytes,
            latency_ns: 100_000,
            count: 1,
            completed_at: at,
        }
    }

    /// `bytes_per_epoch` of 128 KiB reads from `session` to `namespace`
    /// during the epoch ending at `end`.
    fn load(
        v: &mut ViewController,
        session: u32,
        namespace: u32,
        bytes_per_epoch: u64,
        end: Nanos,
    ) {
        let n = bytes_per_epoch / (128 * 1024);
        let batch: Vec<_> = (0..n)
            .map(|_| vector(session, namespace, IoKind::Read, 128 * 1024, end))
            .collect();
        for chunk in batch.chunks(1000) {
            v.ingest(end, chunk).unwrap();
        }
    }

    /// An agent that aggregates per size class reports what per-I/O
    /// vectors would: same rates, latencies, busy degree and write cost.
    #[test]
    fn an_aggregated_vector_counts_as_its_ios() {
        let end = Nanos(10 * MS);
        let mut each = controller();
        let mut summed = controller();
        for (kind, bytes, latency, n) in [
            (IoKind::Read, 4096u64, 80_000u64, 300u64),
            (IoKind::Write, 131_072, 400_000, 120),
        ] {
            let one = IoVector {
                latency_ns: latency,
                ..vector(0, 1, kind, bytes, end)
            };
            let batch = vec![one; n as usize];
            assert_eq!(each.ingest(end, &batch).unwrap().accepted, n as usize);
            let agg = IoVector {
                bytes: bytes * n,
                latency_ns: latency * n,
                count: n,
                ..one
            };
            assert_eq!(summed.ingest(end, &[agg]).unwrap().accepted, 1);
        }
        each.handle_timeout(end);
        summed.handle_timeout(end);
        let (a, b) = (
            each.namespace(NamespaceId(1)).unwrap(),
            summed.namespace(NamespaceId(1)).unwrap(),
        );
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(1.0);
        assert!(a.current.read_iops > 0.0 && a.current.write_iops > 0.0);
        for (x, y) in [
            (a.current.read_iops, b.current.read_iops),
            (a.current.write_iops, b.current.write_iops),
            (a.current.read_bytes_per_sec, b.current.read_bytes_per_sec),
            (a.current.write_bytes_per_sec, b.current.write_bytes_per_sec),
            (a.current.read_latency_ns, b.current.read_latency_ns),
            (a.current.write_latency_ns, b.current.write_latency_ns),
            (a.busy_degree, b.busy_degree),
            (a.write_cost, b.write_cost),
        ] {
            assert!(close(x, y), "{x} vs {y}: {a:?} / {b:?}");
        }
    }

    #[test]
    fn batches_are_bounded_and_bad_vectors_counted() {
        let mut v = controller();
        let too_many = vec![vector(0, 0, IoKind::Read, 4096, Nanos::ZERO); 4097];
        assert!(matches!(
            v.ingest(Nanos::ZERO, &too_many),
            Err(FlintError::BatchTooLarge {
                len: 4097,
                max: 4096
            })
        ));
        let now = Nanos(50 * MS);
        let ack = v
            .ingest(
                now,
                &[
                    vector(0, 0, IoKind::Read, 4096, now),
                    vector(0, 2, IoKind::Read, 4096, now), // ns2 is on target 1
                    vector(9, 0, IoKind::Read, 4096, now),
                    vector(0, 0, IoKind::Read, 4096, Nanos(10 * MS)),
                ],
            )
            .unwrap();
        assert_eq!((ack.accepted, ack.unknown, ack.stale), (1, 2, 1));
        assert_eq!(
            ack.counters,
            vec![
                (Entity::Port(PortId(0)), 1),
                (Entity::Target(TargetId(0)), 1),
                (Entity::Namespace(NamespaceId(0)), 1)
            ]
        );
    }

    #[test]
    fn rates_utilization_and_ewma_follow_the_windows() {
        let mut v = controller();
        // 32 MB in 10 ms = 3.2 GB/s on ns0: utilization 1.
        load(
            &mut v,
            0,
            0,
            32_000_000 / (128 * 1024) * 128 * 1024,
            Nanos(5 * MS),
        );
        assert_eq!(v.handle_timeout(Nanos(10 * MS)), 1);
        let ns = v.namespace(NamespaceId(0)).unwrap();
        assert!((ns.current.utilization - 1.0).abs() < 0.01, "{ns:?}");
        assert!(ns.busy_degree > 0.99 && ns.headroom_fraction < 0.01);
        assert!((ns.current.read_bytes_per_sec - 3.2e9).abs() < 0.01e9);
        // An idle epoch halves the EWMA.
        v.handle_timeout(Nanos(20 * MS));
        let ns = v.namespace(NamespaceId(0)).unwrap();
        assert_eq!(ns.current.utilization, 0.0);
        assert!((ns.busy_degree - 0.5).abs() < 0.01, "{ns:?}");
        assert!(
            (ns.ewma.read_latency_ns - 100_000.0).abs() < 1.0,
            "kept while idle"
        );
        let port = v.port(PortId(0)).unwrap();
        assert!((port.current.utilization).abs() < 1e-9);
        assert!((port.ewma.utilization - 0.16).abs() < 0.01, "{port:?}");
        // Small reads are charged by IOPS: 4 KiB counts as 1/400k s.
        let batch = vec![vector(1, 1, IoKind::Read, 4096, Nanos(25 * MS)); 2000];
        v.ingest(Nanos(25 * MS), &batch).unwrap();
        v.handle_timeout(Nanos(30 * MS));
        let ns1 = v.namespace(NamespaceId(1)).unwrap();
        assert!((ns1.current.utilization - 0.5).abs() < 0.01, "{ns1:?}");
    }

    #[test]
    fn bottleneck_analysis_back_propagates_to_sessions_sharing_the_port() {
        let mut v = controller();
        let sub_victim = v.subscribe(
            SubscriberId(7),
            Condition::Victim {
                session: SessionId(1),
            },
        );
        let sub_headroom = v.subscribe(
            SubscriberId(7),
            Condition::HeadroomBelow {
                namespace: NamespaceId(0),
                fraction: 0.2,
            },
        );
        for e in 1..=3 {
            let end = Nanos(e * 10 * MS);
            // s0 saturates ns0; s1 (same port) reads a little from ns1;
            // s2 (other port) reads a little from ns2.
            load(&mut v, 0, 0, 33_000_000, Nanos(end.as_nanos() - MS));
            load(&mut v, 1, 1, 1_000_000, Nanos(end.as_nanos() - MS));
            load(&mut v, 2, 2, 1_000_000, Nanos(end.as_nanos() - MS));
            v.handle_timeout(end);
        }
        let r = v.last_report();
        assert_eq!(r.epoch, 3);
        assert_eq!(r.congested_namespaces, BTreeSet::from([NamespaceId(0)]));
        assert_eq!(r.affected_ports, BTreeSet::from([PortId(0)]));
        assert!(r.congested_ports.is_empty());
        assert_eq!(
            r.victims,
            BTreeMap::from([
                (SessionId(0), VictimCause::Namespace(NamespaceId(0))),
                (SessionId(1), VictimCause::Port(PortId(0))),
            ])
        );
        // Edge-triggered: each condition notified once, at epoch 1.
        let notes: Vec<_> = std::iter::from_fn(|| v.poll_notification()).collect();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes.iter().all(|n| n.holds && n.epoch == 1));
        assert_eq!(notes[0].subscription, sub_victim);
        assert_eq!(notes[1].subscription, sub_headroom);
        // The load stops: the EWMA decays and the conditions clear.
        for e in 4..=8 {
            v.handle_timeout(Nanos(e * 10 * MS));
        }
        let notes: Vec<_> = std::iter::from_fn(|| v.poll_notification()).collect();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes.iter().all(|n| !n.holds));
        assert!(v.last_report().victims.is_empty());
        assert_eq!(
            v.load(NamespaceId(0)).busy_degree,
            v.namespace(NamespaceId(0)).unwrap().busy_degree
        );
    }

    #[test]
    fn a_saturated_port_makes_its_sessions_victims() {
        let mut v = controller();
        for e in 1..=2 {
            let end = Nanos(e * 10 * MS);
            // 3.2 GB/s from each namespace of target 1 exceeds nothing;
            // add a third stream so the port carries 9.6 GB/s ≥ 90 %.
            load(&mut v, 2, 2, 32_000_000, end);
            load(&mut v, 3, 3, 32_000_000, end);
            load(&mut v, 3, 2, 32_000_000, end);
            v.handle_timeout(end);
        }
        let r = v.last_report();
        assert!(r.congested_ports.contains(&PortId(1)), "{r:?}");
        assert!(r.victims.contains_key(&SessionId(2)) && r.victims.contains_key(&SessionId(3)));
        assert!(!r.victims.contains_key(&SessionId(0)));
    }

    #[test]
    fn write_cost_falls_while_writes_are_fast_and_rises_when_slow() {
        let mut v = controller();
        assert_eq!(v.namespace(NamespaceId(0)).unwrap().write_cost, 9.0);
        assert_eq!(v.load(NamespaceId(0)).write_cost_degree, 1.0);
        for e in 1..=16 {
            let end = Nanos(e * 10 * MS);
            v.ingest(end, &[vector(0, 0, IoKind::Write, 4096, end)])
                .unwrap();
            v.handle_timeout(end);
        }
        assert_eq!(v.namespace(NamespaceId(0)).unwrap().write_cost, 1.0);
        let mut slow = vector(0, 0, IoKind::Write, 4096, Nanos(170 * MS));
        slow.latency_ns = 2_000_000;
        v.ingest(Nanos(170 * MS), &[slow]).unwrap();
        v.handle_timeout(Nanos(170 * MS));
        assert_eq!(v.namespace(NamespaceId(0)).unwrap().write_cost, 5.0);
    }

    #[test]
    fn a_long_silence_closes_a_bounded_number_of_epochs() {
        let mut v = controller();
        let closed = v.handle_timeout(Nanos(3_600_000 * MS));
        assert!(closed <= 3, "{closed}");
        assert!(v.poll_timeout() > Nanos(3_600_000 * MS));
    }
}
