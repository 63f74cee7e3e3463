//! A volume: what one `/dev/ublkbN` is served from.
//!
//! Today a volume is one target namespace behind one NVMe/TCP controller.
//! The QoS work turns it into a set of replicas (each a [`Volume`]-like
//! path with its own controller, credits and state); the device side only
//! sees [`Volume::geometry`], the I/O engine and [`Stats`], so that change
//! stays inside this module and the engine.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ioprio_channel::{PriorityChannel, QueueReader, Registration};
use nvmf_initiator::blocking::{ConnectOptions, Controller, HostIdentity};
use nvmf_initiator::Arbitration;
use prom_exposition::LatencyHistogram;
use qos_core::priority::NvmeClass;
use serde::{Deserialize, Serialize};

use crate::cluster::{self, Attachment, ClusterLink};
use crate::config::{TargetSpec, VolumeConfig};
use crate::error::Error;
use crate::io::mapping::Geometry;
use crate::qos::priority::{class_name, PriorityConfig, Source};
use crate::qos::{QosSnapshot, VolumeQos};
use crate::replication::health::{check_same_geometry, ReplicaGeometry};
use crate::replication::intent_log::replica_identity;
use crate::replication::{ReplicaStatus, Replication};
use cluster_store::AttachMode;

/// Counters of a volume (all queues), cheap to update from queue threads.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reads completed.
    pub reads: AtomicU64,
    /// Writes completed.
    pub writes: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// Flushes.
    pub flushes: AtomicU64,
    /// Discards and write-zeroes.
    pub discards: AtomicU64,
    /// Requests failed back to the kernel.
    pub errors: AtomicU64,
    /// Requests in the engine now.
    pub inflight: AtomicU64,
    /// I/O queue connection losses.
    pub reconnects: AtomicU64,
    /// Socket sends (each carries one or more commands).
    pub sends: AtomicU64,
    /// Socket receives that brought bytes: into the queue thread's
    /// buffer, or straight into a read's buffer or pages (`direct_receives`).
    /// Per read request, they say how many ring round trips its data took.
    pub receives: AtomicU64,
    /// Those of `receives` that went straight into a read's data.
    pub direct_receives: AtomicU64,
    /// Those of `direct_receives` that waited in the kernel for their
    /// data (the socket's low-water mark raised to their length first,
    /// `engine::rx_task`). TCP still wakes such a receive early when the
    /// socket's receive memory fills, so one read's data can take more
    /// than one. Zero on kernels that cannot set socket options from
    /// io_uring (before 6.7), where large reads take more receives.
    pub waited_receives: AtomicU64,
    /// Write data bytes sent by reference (spliced from our pages, not
    /// copied by the socket: `engine::SendPlan`), with the copies of their
    /// PDU headers spliced in front of them (`engine::HeadCopies`).
    pub spliced: AtomicU64,
    /// Whether the device runs with ublk's zero copy (set by the queues).
    pub zero_copy: AtomicBool,
    /// Zero copy: writes of at least this many bytes are sent from the
    /// request's pages (`WriteFixed`); smaller ones are `pread` into the
    /// tag's buffer first, and the send splices large pieces of it
    /// (`engine::SendPlan`). A run-time setting (`set NAME
    /// write_pages_min=SIZE`, `max` for never), not a counter: 0 here
    /// means the default, [`crate::io::ublk::WRITE_FIXED_MIN_BYTES`]
    /// (never).
    pub write_pages_min: AtomicU32,
    /// A direct receive of at least this many bytes of read data waits in
    /// the kernel until all of them have arrived (the socket's low-water
    /// mark raised to its length, `engine::rx_task`). A run-time setting
    /// (`set NAME read_wait_min=SIZE`, `max` for never, `default`), not a
    /// counter: 0 here means the default,
    /// [`crate::io::engine::LOWAT_MIN_BYTES`].
    pub read_wait_min: AtomicU32,
    /// A spliced piece of write data of at least this many bytes is sent
    /// with its PDU header in the same splice, from a per-tag copy
    /// (`engine::HeadCopies`); smaller ones, or all with `max`, have
    /// their header sent from the send buffer, a `sendmsg` between two
    /// splices. A run-time setting (`set NAME head_copy_min=SIZE`, `max`
    /// for never, `default`), not a counter: 0 here means the default,
    /// [`crate::io::engine::HEAD_COPY_MIN_BYTES`].
    pub head_copy_min: AtomicU32,
    /// Zero copy: read bytes received straight into the request's pages.
    pub zc_read_direct: AtomicU64,
    /// Zero copy: read bytes copied into the request from our memory
    /// (the part of a read's data that came with its headers).
    pub zc_read_copied: AtomicU64,
    /// Zero copy: write bytes sent from the request's pages, never copied
    /// into our memory.
    pub zc_write_direct: AtomicU64,
    /// Per NVMe class (urgent..low): reads and writes completed.
    pub class_ios: [AtomicU64; 4],
    /// Per NVMe class: bytes read and written.
    pub class_bytes: [AtomicU64; 4],
    /// Per replica (at most 16): reads it served.
    pub replica_reads: [AtomicU64; 16],
    /// Per operation ([`LATENCY_OPS`]): time from a request's arrival at
    /// the server to its answer from the target(s), QoS waits included
    /// (what the block layer sees, less the ublk driver's own hop).
    pub latency: [LatencyHistogram; 4],
}

impl Stats {
    /// [`Stats::write_pages_min`] in force: the default until set.
    pub fn write_pages_min(&self) -> u32 {
        match self.write_pages_min.load(Ordering::Relaxed) {
            0 => crate::io::ublk::WRITE_FIXED_MIN_BYTES,
            n => n,
        }
    }

    /// [`Stats::head_copy_min`] in force: the default until set.
    pub fn head_copy_min(&self) -> usize {
        match self.head_copy_min.load(Ordering::Relaxed) {
            0 => crate::io::engine::HEAD_COPY_MIN_BYTES,
            n => n as usize,
        }
    }

    /// [`Stats::read_wait_min`] in force: the default until set.
    pub fn read_wait_min(&self) -> usize {
        match self.read_wait_min.load(Ordering::Relaxed) {
            0 => crate::io::engine::LOWAT_MIN_BYTES,
            n => n as usize,
        }
    }
}

/// The operations of [`Stats::latency`], in index order (`discard`
/// includes write-zeroes, as [`Stats::discards`] does).
pub const LATENCY_OPS: [&str; 4] = ["read", "write", "flush", "discard"];

/// A point-in-time copy of [`Stats`] plus the volume's identity, as
/// `status` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Volume name.
    pub volume: String,
    /// Block device.
    pub device: String,
    /// Target `address:port`.
    pub target: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Whether the controller is connected now.
    pub connected: bool,
    /// Controller resets so far.
    pub controller_resets: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Flushes.
    pub flushes: u64,
    /// Discards and write-zeroes.
    pub discards: u64,
    /// Requests failed back to the kernel.
    pub errors: u64,
    /// Requests in flight.
    pub inflight: u64,
    /// I/O queue connection losses.
    pub queue_failures: u64,
    /// Socket sends.
    pub sends: u64,
    /// Socket receives that brought bytes.
    #[serde(default)]
    pub receives: u64,
    /// Of those, straight into a read's data.
    #[serde(default)]
    pub direct_receives: u64,
    /// Of those, waited in the kernel for their data (the low-water mark).
    #[serde(default)]
    pub waited_receives: u64,
    /// Bytes sent by reference (spliced): write data, and the copies of
    /// its PDU headers that go with it.
    #[serde(default)]
    pub spliced_bytes: u64,
    /// ublk zero copy in use, and read bytes direct / copied under it.
    #[serde(default)]
    pub zero_copy: ZeroCopySnapshot,
    /// Client-side QoS: credits, rate limits, local queue.
    pub qos: QosSnapshot,
    /// Priority classes: where they come from, per-class counters.
    #[serde(default)]
    pub priority: PrioritySnapshot,
    /// Replicated volumes: one entry per replica (empty otherwise).
    #[serde(default)]
    pub replicas: Vec<ReplicaSnapshot>,
    /// Cluster mode: owner, epoch, lease, etcd, health generation.
    #[serde(default)]
    pub cluster: Option<cluster::ClusterStatus>,
    /// Elastic volumes: the map and the writes waiting for it.
    #[serde(default)]
    pub evol: Option<EvolStatus>,
}

/// What `status` shows of ublk's zero copy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ZeroCopySnapshot {
    /// The device runs with it.
    pub on: bool,
    /// Read bytes received straight into the request's pages.
    pub read_direct_bytes: u64,
    /// Read bytes copied into the request from our memory.
    pub read_copied_bytes: u64,
    /// Write bytes sent from the request's pages (not copied to us).
    #[serde(default)]
    pub write_direct_bytes: u64,
}

/// What `status` shows of an eVol.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct EvolStatus {
    /// The eVol's name in etcd.
    pub name: String,
    /// Pool namespaces connected (members).
    pub members: usize,
    /// Extents mapped (in this client's cache).
    pub extents_mapped: usize,
    /// Allocations this client asked for.
    pub allocations: u64,
    /// Writes waiting for an extent's mapping now.
    pub writes_waiting: usize,
    /// How long the oldest of them has waited (ms).
    pub oldest_wait_ms: u64,
    /// Copies that missed a write and serve no reads (marked in etcd).
    pub stale_copies: usize,
    /// Extents with a stale copy.
    #[serde(default)]
    pub stale_extents: usize,
    /// The extent whose stale copy is being repaired now.
    #[serde(default)]
    pub repairing: Option<u64>,
    /// Stale copies repaired since start.
    #[serde(default)]
    pub repaired: u64,
    /// Flint's client side: auction, view reports.
    #[serde(default)]
    pub flint: Option<crate::evol_qos::FlintStatus>,
}

/// What `status` shows of one replica.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ReplicaSnapshot {
    /// `address:port subnqn nsid N`.
    pub target: String,
    /// Whether its controller is connected.
    pub connected: bool,
    /// Reads it served.
    pub reads: u64,
    /// Its credit gate: window, in flight, last credit.
    pub qos: crate::qos::ReplicaQos,
    /// State, intent-log bits, resync progress.
    #[serde(flatten)]
    pub status: ReplicaStatus,
}

/// What `status` shows of a volume's priority classes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct PrioritySnapshot {
    /// `bpf`, `fixed`, or `fallback: <why>`.
    pub mode: String,
    /// The arbitration mechanism the target runs (CC.AMS).
    pub arbitration: String,
    /// The classes with an I/O queue of their own (per ublk queue).
    pub queues: Vec<String>,
    /// Per class, urgent to low.
    pub classes: Vec<ClassCounters>,
}

/// Counters of one NVMe class.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ClassCounters {
    /// urgent, high, medium, low.
    pub class: String,
    /// Reads and writes completed.
    pub ios: u64,
    /// Bytes read and written.
    pub bytes: u64,
    /// Admitted to the target (every command, incl. flushes).
    pub admitted: u64,
    /// Waiting in the client's local queue now.
    pub queued: u64,
}

/// A volume's priority state: the configuration, the side channel (when
/// it loaded) and the device's registration with it.
pub struct Priority {
    /// `[priority]`.
    pub config: PriorityConfig,
    channel: Option<PriorityChannel>,
    registration: OnceLock<Registration>,
    mode: Mutex<String>,
}

impl Priority {
    /// `channel`: the process's side channel, if it loaded; `mode` what
    /// `status` shows for it.
    pub fn new(config: PriorityConfig, channel: Option<PriorityChannel>, mode: String) -> Self {
        let (channel, mode) = if config.source == Source::Fixed {
            (None, format!("fixed ({})", class_name(config.class)))
        } else {
            (channel, mode)
        };
        Self {
            config,
            channel,
            registration: OnceLock::new(),
            mode: Mutex::new(mode),
        }
    }

    /// Whether per-request priorities may be available.
    pub fn side_channel(&self) -> bool {
        self.channel.is_some()
    }

    /// What `status` shows.
    pub fn mode(&self) -> String {
        self.mode.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Start recording priorities for the live device `/dev/ublkb<dev_id>`
    /// (called once the device is started: before that it has no
    /// `dev_t`). On failure the volume stays on its fallback class and
    /// `status` says why.
    pub fn register(&self, dev_id: u32, queues: u16, depth: u16) {
        let Some(ch) = &self.channel else {
            return;
        };
        let name = format!("ublkb{dev_id}");
        let r =
            ioprio_channel::dev_t_of_name(&name).and_then(|dev| ch.register(dev, queues, depth));
        match r {
            Ok(reg) => {
                let _ = self.registration.set(reg);
            }
            Err(e) => {
                log::warn!("ioprio side channel: {name}: {e}; using the configured class");
                *self.mode.lock().unwrap_or_else(|e| e.into_inner()) = format!("fallback: {e}");
            }
        }
    }

    /// A reader for ublk queue `qid`, once the device is registered.
    pub fn reader(&self, qid: u16) -> Option<QueueReader> {
        let reg = self.registration.get()?;
        (qid < reg.nr_hw_queues()).then(|| reg.queue_reader(qid))
    }
}

/// What a recovering server checks before it reattaches a device: the
/// namespace must be the same one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TargetIdentity {
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller serial number.
    pub serial: String,
    /// Namespace NGUID (hex).
    pub nguid: String,
    /// Geometry.
    pub geometry: Geometry,
}

/// Where one replica of a volume is served: its address, controller and
/// namespace (a plain volume has one).
pub struct ReplicaEndpoint {
    /// Where it is.
    pub spec: TargetSpec,
    /// Resolved address.
    pub addr: SocketAddr,
    /// Its controller (admin queue, keep-alive, reconnect).
    pub ctrl: Arc<Controller>,
    /// Namespace identity.
    pub identity: TargetIdentity,
    /// The classes with an I/O queue of their own on this target, per
    /// ublk queue, most important first.
    pub classes: Vec<NvmeClass>,
    /// Per class (urgent..low): the index in `classes` of its queue.
    pub class_path: [u8; 4],
    /// The arbitration mechanism the target runs.
    pub arbitration: Arbitration,
}

/// The host-local shadow view of each replica's namespace
/// (`crate::qos::neighbours`), where `[qos] estimate_neighbours` asks for
/// it and the volume is not elastic. A view that cannot be opened leaves
/// that replica unseen, with a warning: the volume works without it.
fn neighbour_views(
    config: &VolumeConfig,
    replicas: &[ReplicaEndpoint],
) -> Vec<Option<Arc<crate::qos::neighbours::NamespaceView>>> {
    use crate::qos::neighbours::{file_name, NamespaceView};
    if !config.qos.estimate_neighbours || config.evol.is_some() {
        return Vec::new();
    }
    let dir = crate::control::state::run_dir().join("neighbours");
    replicas
        .iter()
        .map(|t| {
            let name = file_name(&t.addr.to_string(), &t.spec.subnqn, t.spec.nsid);
            NamespaceView::open(&dir, &name)
                .map_err(|e| {
                    log::warn!(
                        "{}: {e}; the gates of {} nsid {} run unseen by this host's other volumes of it",
                        dir.join(&name).display(),
                        t.spec.subnqn,
                        t.spec.nsid
                    )
                })
                .ok()
        })
        .collect()
}

/// A connected volume.
pub struct Volume {
    /// Its configuration.
    pub config: VolumeConfig,
    /// Who we are to the targets.
    pub host: HostIdentity,
    /// Its replicas' endpoints: one, or the replicas in config order.
    pub replicas: Vec<ReplicaEndpoint>,
    /// Block device geometry (common to every replica).
    pub geometry: Geometry,
    /// Identity of the first target's namespace (what a recovering server
    /// checks).
    pub identity: TargetIdentity,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Rate limiter, run-time QoS settings and QoS counters (all queues).
    pub qos: Arc<VolumeQos>,
    /// Priority classes.
    pub priority: Priority,
    /// Replica set, intent log and resync (replicated volumes only).
    pub replication: Option<Arc<Replication>>,
    /// Cluster mode (`[cluster]`): ownership, fencing, health in etcd.
    pub cluster: Option<Arc<ClusterLink>>,
    /// Elastic volumes (`[evol]`): the extent map and the threads that
    /// keep it current; `replicas` are then the pool's members.
    pub evol: Option<EvolRuntime>,
}

/// An elastic volume's running parts (see [`crate::evol`]).
pub struct EvolRuntime {
    /// The cached extent map, shared by the queue threads.
    pub map: Arc<crate::evol::ExtentMap>,
    /// `[evol] alloc_wait`.
    pub wait: std::time::Duration,
    _watch: cluster_store::watch::ExtentWatch,
    _alloc: crate::evol::AllocatorThread,
    /// Records stale copies in etcd and repairs them.
    _health: crate::evol::HealthThread,
    /// Flint's client side (view agent, auction, eIO), shared by the
    /// queues.
    pub flint: Option<Arc<crate::evol_qos::EvolQos>>,
    /// Reports to the view and asks for slices (stopped on drop, before
    /// the map's threads).
    _agent: Option<crate::evol_qos::AgentThread>,
}

/// The repair's blocking I/O to an eVol's members: each member's
/// controller (its blocking I/O queue, off the io_uring threads).
struct ControllerIo {
    /// Per member: controller, namespace, block size.
    members: Vec<(Arc<Controller>, u32, u64)>,
}

impl crate::evol::MemberIo for ControllerIo {
    fn reachable(&self, m: usize) -> bool {
        self.members.get(m).is_some_and(|(c, _, _)| c.is_live())
    }

    fn max_io(&self, m: usize) -> usize {
        self.members
            .get(m)
            .map_or(4096, |(c, _, _)| c.info().max_transfer_bytes as usize)
    }

    fn read(&self, m: usize, at: u64, buf: &mut [u8]) -> Result<(), String> {
        let (c, nsid, bs) = &self.members[m];
        c.read(*nsid, at / bs, buf).map_err(|e| e.to_string())
    }

    fn write(&self, m: usize, at: u64, data: &[u8]) -> Result<(), String> {
        let (c, nsid, bs) = &self.members[m];
        c.write(*nsid, at / bs, data).map_err(|e| e.to_string())
    }

    fn flush(&self, m: usize) -> Result<(), String> {
        let (c, nsid, _) = &self.members[m];
        c.flush(*nsid).map_err(|e| e.to_string())
    }
}

/// The allocator of an eVol's first writes: the elected `evol-arbiter`,
/// found through etcd's leader key (the `[cluster]` endpoints and prefix),
/// called from the volume's allocator thread only.
///
/// The client connects on the first allocation, not at start: a device
/// whose arbiter is down (or failing over) still serves every mapped
/// extent, and its first writes wait (up to `[evol] alloc_wait`) until a
/// leader answers. `ArbiterClient::allocate` retries across failovers
/// until the deadline and is idempotent per extent, so a retried request
/// gets the mapping the first attempt made.
pub fn evol_allocator(config: &VolumeConfig) -> Arc<dyn crate::evol::ExtentAllocator> {
    struct Arbiter {
        opts: evol_arbiter::client::ClientOptions,
        // `ArbiterClient` is not `Sync`; the allocator thread is its only
        // user, so the lock is never contended.
        client: std::sync::Mutex<Option<evol_arbiter::client::ArbiterClient>>,
    }
    impl crate::evol::ExtentAllocator for Arbiter {
        fn allocate(
            &self,
            evol: &str,
            index: u64,
            deadline: std::time::Instant,
        ) -> Result<cluster_store::evol::ExtentRecord, String> {
            let mut guard = self.client.lock().unwrap_or_else(|e| e.into_inner());
            if guard.is_none() {
                let c = evol_arbiter::client::ArbiterClient::connect(self.opts.clone())
                    .map_err(|e| format!("arbiter client: {e}"))?;
                *guard = Some(c);
            }
            let client = guard.as_ref().expect("set above");
            client
                .allocate(evol, index, deadline)
                .map_err(|e| format!("arbiter: {e}"))
        }
    }
    Arc::new(Arbiter {
        opts: arbiter_options(config),
        client: std::sync::Mutex::new(None),
    })
}

/// How a client finds the leading arbiter: through the volume's etcd.
fn arbiter_options(config: &VolumeConfig) -> evol_arbiter::client::ClientOptions {
    let (endpoints, prefix, op_timeout) = match &config.cluster {
        Some(c) => (c.endpoints.clone(), c.prefix.clone(), c.op_timeout),
        None => (Vec::new(), String::new(), std::time::Duration::from_secs(1)),
    };
    let mut opts = evol_arbiter::client::ClientOptions::new(endpoints, &prefix);
    opts.etcd_timeout = op_timeout;
    opts
}

/// An eVol's spec and pool from etcd: the members (sorted by namespace
/// id) become `config.replicas`.
fn evol_prepare(
    config: &mut VolumeConfig,
) -> Result<(cluster_store::evol::EvolSpec, Vec<String>, Vec<String>), Error> {
    let (Some(ev), Some(cc)) = (&config.evol, &config.cluster) else {
        return Err(Error::Usage("an eVol needs [evol] and [cluster]".into()));
    };
    let store = cluster_store::Store::connect(cluster_store::StoreConfig {
        endpoints: cc.endpoints.clone(),
        op_timeout: cc.op_timeout,
    })
    .map_err(|e| Error::Usage(e.to_string()))?;
    let keys = cluster_store::evol::EvolKeys::new(&cc.prefix);
    let pool = store
        .read_pool(&keys)
        .map_err(|e| Error::Usage(e.to_string()))?;
    let spec = pool.evols.get(&ev.name).cloned().ok_or_else(|| {
        Error::Usage(format!(
            "eVol {}: no spec in etcd under {} (create it with the arbiter first)",
            ev.name, cc.prefix
        ))
    })?;
    let mut members = Vec::new();
    let mut addresses = Vec::new();
    let mut specs = Vec::new();
    for n in pool.namespaces.values() {
        if n.extent_bytes != spec.extent_bytes {
            continue;
        }
        let (host, port) = n.address.rsplit_once(':').ok_or_else(|| {
            Error::Usage(format!(
                "pool namespace {}: address {} is not HOST:PORT",
                n.id, n.address
            ))
        })?;
        specs.push(crate::config::TargetSpec {
            address: host.trim_matches(|c| c == '[' || c == ']').to_owned(),
            port: port
                .parse()
                .map_err(|_| Error::Usage(format!("pool namespace {}: bad port", n.id)))?,
            subnqn: n.subnqn.clone(),
            nsid: n.nsid,
        });
        members.push(n.id.clone());
        addresses.push(n.address.clone());
    }
    if members.len() > crate::evol::MAX_MEMBERS || members.is_empty() {
        return Err(Error::Usage(format!(
            "eVol {}: the pool has {} namespaces of {}-byte extents; a client uses 1 to {} per volume (copies are named in a 16-bit set)",
            ev.name,
            members.len(),
            spec.extent_bytes,
            crate::evol::MAX_MEMBERS
        )));
    }
    config.target = specs[0].clone();
    config.replicas = specs;
    Ok((spec, members, addresses))
}

/// Start an eVol's map: read it with its revision, watch it from there,
/// start the allocator thread.
fn evol_start(
    config: &VolumeConfig,
    spec: &cluster_store::evol::EvolSpec,
    (members, addresses): (Vec<String>, Vec<String>),
    epoch: u64,
    replicas: &[ReplicaEndpoint],
    host_nqn: &str,
) -> Result<EvolRuntime, Error> {
    let (Some(ev), Some(cc)) = (&config.evol, &config.cluster) else {
        return Err(Error::Usage("an eVol needs [evol] and [cluster]".into()));
    };
    let flint = crate::evol_qos::EvolQos::new(
        &crate::evol_qos::client_name(host_nqn),
        &ev.name,
        members.clone(),
        &addresses,
        ev.flint,
    );
    let map = Arc::new(
        crate::evol::ExtentMap::new(&ev.name, spec.size_bytes, spec.extent_bytes, members)
            .map_err(Error::Usage)?,
    );
    let sc = cluster_store::StoreConfig {
        endpoints: cc.endpoints.clone(),
        op_timeout: cc.op_timeout,
    };
    let store =
        cluster_store::Store::connect(sc.clone()).map_err(|e| Error::Usage(e.to_string()))?;
    let keys = cluster_store::evol::EvolKeys::new(&cc.prefix);
    let snap = store
        .read_extents_at(&keys, &ev.name)
        .map_err(|e| Error::Usage(e.to_string()))?;
    for r in &snap.extents {
        map.insert(r).map_err(Error::Usage)?;
    }
    // A previous owner's stale marks: those copies serve no reads until
    // repaired.
    let stale = store
        .read_stale(&keys, &ev.name)
        .map_err(|e| Error::Usage(e.to_string()))?;
    map.load_stale(&stale);
    let stale_store = crate::evol::EtcdStaleStore::new(
        cluster_store::Store::connect(sc.clone()).map_err(|e| Error::Usage(e.to_string()))?,
        cluster_store::VolumeKeys::new(&cc.prefix, &config.name),
        keys.clone(),
        &ev.name,
        epoch,
    );
    let io = ControllerIo {
        members: replicas
            .iter()
            .map(|r| {
                let bs = u64::from(r.identity.geometry.block_size);
                (Arc::clone(&r.ctrl), r.spec.nsid, bs)
            })
            .collect(),
    };
    let health = crate::evol::HealthThread::start(
        Arc::clone(&map),
        Arc::new(stale_store),
        Some(Arc::new(io)),
        config.replication.resync_rate_bps,
    )
    .map_err(|e| Error::State(format!("starting the eVol health threads: {e}")))?;
    let m = Arc::clone(&map);
    let watch =
        cluster_store::watch::ExtentWatch::start(sc, &keys, &ev.name, snap.revision, move |e| {
            use cluster_store::watch::ExtentEvent;
            match e {
                ExtentEvent::Mapped(r) => {
                    if let Err(e) = m.insert(&r) {
                        log::error!("{e}");
                    }
                }
                ExtentEvent::Unmapped(i) => m.remove(i),
                ExtentEvent::Resync(s) => m.replace(&s.extents),
            }
        })
        .map_err(|e| Error::Usage(e.to_string()))?;
    let alloc = crate::evol::AllocatorThread::start(
        Arc::clone(&map),
        evol_allocator(config),
        ev.alloc_wait,
    )
    .map_err(|e| Error::State(format!("starting the allocator thread: {e}")))?;
    let agent = crate::evol_qos::AgentThread::start(
        Arc::clone(&flint),
        Box::new(crate::evol_qos::ArbiterLink::new(arbiter_options(config))),
    )
    .map_err(|e| Error::State(format!("starting the eVol agent thread: {e}")))?;
    Ok(EvolRuntime {
        map,
        wait: ev.alloc_wait,
        _agent: Some(agent),
        flint: Some(flint),
        _watch: watch,
        _alloc: alloc,
        _health: health,
    })
}

impl Volume {
    /// Connect every target's controller and identify its namespace. The
    /// first connection is not retried: an unreachable target, a wrong NQN
    /// or a refused host is reported at once, naming the replica.
    ///
    /// `priority` decides which classes get an I/O queue: the classes in
    /// use when the side channel is there, else only the fallback class;
    /// and only one queue on a target that runs round robin (classes mean
    /// nothing to it). Replicas must have the same size and block size.
    ///
    /// `recovering`: the device is taken over from a crashed server (see
    /// [`Replication::open`]).
    ///
    /// In cluster mode (`[cluster]`) the volume is attached in etcd first
    /// (`takeover`: even if another host owns it), then connected, fenced
    /// at its targets, and its replication state opened from etcd's record
    /// (see [`crate::cluster`]); any failure after the attach gives the
    /// volume up again.
    pub fn connect(
        mut config: VolumeConfig,
        host: HostIdentity,
        priority: Priority,
        recovering: bool,
        takeover: bool,
    ) -> Result<Self, Error> {
        // An eVol's members come from etcd's pool, before anything else.
        let evol = match &config.evol {
            Some(_) => Some(evol_prepare(&mut config)?),
            None => None,
        };
        let attachment = match &config.cluster {
            None => None,
            Some(_) => {
                let mode = if takeover {
                    AttachMode::Takeover
                } else {
                    AttachMode::Attach
                };
                let a = cluster::attach(&config, &host.nqn, mode)?;
                // `recover` replays the crashed server's in-flight
                // requests: only safe if nobody owned the volume since
                // (else they would overwrite the newer owner's writes).
                let last = cluster::local_epoch(&config);
                if recovering && last != Some(a.epoch() - 1) {
                    let epoch = a.epoch();
                    a.abandon();
                    return Err(Error::Usage(format!(
                        "volume {}: cannot recover the device: another host owned the volume since this server crashed (epoch {} now, this host's last {}); its held requests must not be replayed: remove the device (ublk-nvmf del {}) and add the volume again",
                        config.name,
                        epoch - 1,
                        last.map_or_else(|| "unknown".to_owned(), |e| e.to_string()),
                        config.name
                    )));
                }
                Some(a)
            }
        };
        let host_nqn = host.nqn.clone();
        match Self::connect_attached(config, host, priority, recovering, attachment.as_ref()) {
            Ok(mut v) => {
                if let Some((spec, members, addresses)) = evol {
                    let epoch = attachment.as_ref().map_or(0, |a| a.epoch());
                    match evol_start(
                        &v.config,
                        &spec,
                        (members, addresses),
                        epoch,
                        &v.replicas,
                        &host_nqn,
                    ) {
                        Ok(rt) => {
                            // The device is the eVol's size; a request
                            // spans at most MAX_PIECES extents.
                            let bs = u64::from(v.geometry.block_size);
                            v.geometry.blocks = spec.size_bytes / bs;
                            let cap = (crate::io::fanout::MAX_PIECES as u64 - 1)
                                .saturating_mul(spec.extent_bytes)
                                .min(u64::from(u32::MAX));
                            v.geometry.max_io_bytes =
                                v.geometry.max_io_bytes.min((cap / bs * bs).max(bs) as u32);
                            v.identity.geometry = v.geometry;
                            v.evol = Some(rt);
                        }
                        Err(e) => {
                            if let Some(a) = attachment {
                                a.abandon();
                            }
                            return Err(e);
                        }
                    }
                }
                if let Some(a) = attachment {
                    let spec = cluster::spec_of(&v.config);
                    let in_sync = v.replication.as_ref().map(|r| r.in_sync());
                    let link = a.start(in_sync, &spec)?;
                    if let Some(rep) = &v.replication {
                        rep.set_cluster(Arc::clone(&link));
                    }
                    v.cluster = Some(link);
                }
                Ok(v)
            }
            Err(e) => {
                if let Some(a) = attachment {
                    a.abandon();
                }
                Err(e)
            }
        }
    }

    fn connect_attached(
        config: VolumeConfig,
        host: HostIdentity,
        priority: Priority,
        recovering: bool,
        attachment: Option<&Attachment>,
    ) -> Result<Self, Error> {
        // An eVol's members are not replicas of each other: no replica
        // set, no common size.
        let replicated = config.replicas.len() > 1 && config.evol.is_none();
        let mut replicas = Vec::new();
        let mut geos = Vec::new();
        for (i, spec) in config.replicas.iter().enumerate() {
            let what = if replicated {
                format!(
                    "replica {i} ({}:{} {})",
                    spec.address, spec.port, spec.subnqn
                )
            } else {
                format!("{}:{} {}", spec.address, spec.port, spec.subnqn)
            };
            let (t, g) = connect_replica(&config, &host, &priority, spec)
                .map_err(|e| Error::Usage(format!("{what}: {e}")))?;
            replicas.push(t);
            geos.push((what, g));
        }
        if replicated {
            let rg: Vec<ReplicaGeometry> = geos
                .iter()
                .map(|(name, g)| ReplicaGeometry {
                    name: name.clone(),
                    size_bytes: g.size_bytes(),
                    block_size: g.block_size,
                })
                .collect();
            check_same_geometry(&rg).map_err(|e| Error::Usage(e.to_string()))?;
        }
        let mut geometry = geos[0].1;
        if config.evol.is_some() {
            if let Some((what, g)) = geos
                .iter()
                .find(|(_, g)| g.block_size != geometry.block_size)
            {
                return Err(Error::Usage(format!(
                    "{what}: block size {} differs from the pool's {}",
                    g.block_size, geometry.block_size
                )));
            }
        }
        for (_, g) in &geos[1..] {
            geometry.max_io_bytes = geometry.max_io_bytes.min(g.max_io_bytes);
            geometry.volatile_cache |= g.volatile_cache;
            geometry.discard &= g.discard;
            geometry.write_zeroes &= g.write_zeroes;
        }
        if let Some(a) = attachment {
            a.fence_replicas(&replicas)?;
        }
        let replication = if replicated {
            let ids: Vec<String> = replicas
                .iter()
                .map(|t| replica_identity(&t.spec.subnqn, t.spec.nsid, &t.identity.serial))
                .collect();
            Some(Arc::new(Replication::open(
                &config,
                &ids,
                geometry.size_bytes(),
                recovering,
                attachment.map(|a| a.health.as_ref().map(|(h, _)| h)),
            )?))
        } else {
            None
        };
        let identity = replicas[0].identity.clone();
        let qos = VolumeQos::new(&config.qos, config.queues)
            .with_neighbours(neighbour_views(&config, &replicas));
        Ok(Self {
            host,
            replicas,
            geometry,
            identity,
            stats: Arc::new(Stats::default()),
            qos: Arc::new(qos),
            priority,
            replication,
            cluster: None,
            evol: None,
            config,
        })
    }

    fn priority_snapshot(&self, qos: &QosSnapshot) -> PrioritySnapshot {
        let s = &self.stats;
        PrioritySnapshot {
            mode: self.priority.mode(),
            arbitration: match self.replicas[0].arbitration {
                Arbitration::RoundRobin => "round robin",
                Arbitration::WeightedRoundRobin | Arbitration::PreferWeighted => {
                    "weighted round robin"
                }
                Arbitration::VendorSpecific => "drr (vendor specific)",
            }
            .into(),
            queues: self.replicas[0]
                .classes
                .iter()
                .map(|c| class_name(*c).into())
                .collect(),
            classes: NvmeClass::ALL
                .iter()
                .map(|c| ClassCounters {
                    class: class_name(*c).into(),
                    ios: s.class_ios[c.index()].load(Ordering::Relaxed),
                    bytes: s.class_bytes[c.index()].load(Ordering::Relaxed),
                    admitted: qos.class_admitted[c.index()],
                    queued: qos.class_queued[c.index()],
                })
                .collect(),
        }
    }

    fn replica_snapshot(&self) -> Vec<ReplicaSnapshot> {
        let Some(rep) = &self.replication else {
            return Vec::new();
        };
        let qos = self.qos.replica_snapshot(self.replicas.len());
        rep.status()
            .into_iter()
            .zip(&self.replicas)
            .enumerate()
            .map(|(i, (status, t))| ReplicaSnapshot {
                target: format!("{} {} nsid {}", t.addr, t.spec.subnqn, t.spec.nsid),
                connected: t.ctrl.is_live(),
                reads: self
                    .stats
                    .replica_reads
                    .get(i)
                    .map_or(0, |a| a.load(Ordering::Relaxed)),
                qos: qos.get(i).copied().unwrap_or_default(),
                status,
            })
            .collect()
    }

    /// A snapshot of the counters.
    pub fn snapshot(&self, device: &str) -> StatsSnapshot {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let qos = self.qos.snapshot();
        StatsSnapshot {
            volume: self.config.name.clone(),
            device: device.to_owned(),
            target: self.replicas[0].addr.to_string(),
            subnqn: self.config.target.subnqn.clone(),
            connected: self.replicas.iter().any(|t| t.ctrl.is_live()),
            controller_resets: self.replicas.iter().map(|t| t.ctrl.resets()).sum(),
            replicas: self.replica_snapshot(),
            reads: g(&s.reads),
            writes: g(&s.writes),
            read_bytes: g(&s.read_bytes),
            write_bytes: g(&s.write_bytes),
            flushes: g(&s.flushes),
            discards: g(&s.discards),
            errors: g(&s.errors),
            inflight: g(&s.inflight),
            queue_failures: g(&s.reconnects),
            sends: g(&s.sends),
            receives: g(&s.receives),
            direct_receives: g(&s.direct_receives),
            waited_receives: g(&s.waited_receives),
            spliced_bytes: g(&s.spliced),
            zero_copy: ZeroCopySnapshot {
                on: s.zero_copy.load(Ordering::Relaxed),
                read_direct_bytes: g(&s.zc_read_direct),
                read_copied_bytes: g(&s.zc_read_copied),
                write_direct_bytes: g(&s.zc_write_direct),
            },
            priority: self.priority_snapshot(&qos),
            cluster: self.cluster.as_ref().map(|c| c.status()),
            evol: self.evol.as_ref().map(|e| {
                let (n, oldest) = e.map.waiting(std::time::Instant::now());
                EvolStatus {
                    name: e.map.name().to_owned(),
                    members: e.map.members().len(),
                    extents_mapped: e.map.mapped(),
                    allocations: e.map.allocations(),
                    writes_waiting: n,
                    oldest_wait_ms: oldest.as_millis() as u64,
                    stale_copies: e.map.stale_copies(),
                    stale_extents: e.map.stale_extents(),
                    repairing: e.map.repairing().map(|(i, _)| i),
                    repaired: e.map.repaired(),
                    flint: e.flint.as_ref().map(|f| f.status()),
                }
            }),
            qos,
        }
    }
}

/// Connect one replica of a volume.
fn connect_replica(
    config: &VolumeConfig,
    host: &HostIdentity,
    priority: &Priority,
    spec: &TargetSpec,
) -> Result<(ReplicaEndpoint, Geometry), Error> {
    let addr = spec
        .socket_addr()
        .map_err(|e| Error::Usage(format!("{}: {e}", spec.address)))?;
    let mut opts = ConnectOptions::new(addr, &spec.subnqn);
    opts.host = host.clone();
    opts.dhchap = config.dhchap.clone();
    let pc = priority.config;
    let mut classes = pc.classes_in_use(priority.side_channel());
    // One queue per class per ublk queue, and one for the blocking API
    // (resync copies of replicated volumes, reservations in cluster mode).
    opts.io_queues = config
        .queues
        .saturating_mul(classes.len() as u16)
        .saturating_add(u16::from(
            config.replicas.len() > 1 || config.cluster.is_some(),
        ));
    opts.queue_depth = config.queue_depth;
    opts.command_timeout = config.io_timeout;
    opts.header_digest = config.header_digest;
    opts.data_digest = config.data_digest;
    opts.kato = config.keep_alive;
    opts.reconnect = config.reconnect;
    opts.arbitration = pc.arbitration();
    opts.arbitration_feature = Some(pc.arbitration_feature());
    let want = opts.io_queues;
    let ctrl = Controller::connect(opts)?;
    let info = ctrl.info();
    if info.io_queues < want {
        return Err(Error::Usage(format!(
            "the target grants {} I/O queues, the volume needs {want} (io.queues {} x {} priority classes)",
            info.io_queues,
            config.queues,
            classes.len()
        )));
    }
    if !info.arbitration.uses_classes() && classes.len() > 1 {
        log::warn!(
            "{}: {}:{} offers only round robin arbitration: one I/O queue per ublk queue; classes order only the client's held requests",
            config.name,
            spec.address,
            spec.port
        );
        classes = vec![pc.class];
    }
    let mut class_path = [0u8; 4];
    for c in NvmeClass::ALL {
        // A class without a queue of its own uses the fallback class's.
        let own = classes.iter().position(|x| *x == c);
        let fallback = classes.iter().position(|x| *x == pc.class).unwrap_or(0);
        class_path[c.index()] = own.unwrap_or(fallback) as u8;
    }
    let ns = ctrl.identify_namespace(spec.nsid)?;
    let geometry = Geometry::new(&info, &ns);
    let identity = TargetIdentity {
        subnqn: spec.subnqn.clone(),
        serial: info.identify.serial_number.trim().to_owned(),
        nguid: ns
            .identify
            .nguid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        geometry,
    };
    Ok((
        ReplicaEndpoint {
            spec: spec.clone(),
            addr,
            ctrl: Arc::new(ctrl),
            identity,
            classes,
            class_path,
            arbitration: info.arbitration,
        },
        geometry,
    ))
}
