//! The discrete-event engine: client volumes → (auction) → network and
//! target ports → drives (`qos_core`'s SSD model) → ports → clients, with
//! the arbiter's catalog, view controller and auction in the loop.
//!
//! One event queue ordered by (time, sequence number) drives everything,
//! so a run is a pure function of its [`RunSpec`]. Per I/O:
//!
//! 1. a volume generates it when it has fewer than `queue_depth`
//!    outstanding: a random aligned offset in the volume, read or write by
//!    `read_percent`;
//! 2. its extent is looked up in the volume's map; an unmapped read
//!    completes at once as zeros (counted apart, never measured); an
//!    unmapped write asks the arbiter (one RPC each way) to allocate, and
//!    every I/O to that extent waits for the answer;
//! 3. with the auction on, it waits until its flow's slices have room
//!    (requests and grants cross the RPC delay);
//! 4. it travels to the target (`network_one_way_ns`; a write's payload
//!    queues on the target port's inbound direction), the drive model
//!    announces its completion, a read's payload queues on the port's
//!    outbound direction, and the completion reaches the client after the
//!    network delay;
//! 5. the client's view agent batches the I/O's vector and sends the batch
//!    to the view controller every `agent_flush_ns`.
//!
//! Latency is measured from generation to completion, so it includes the
//! waits of steps 2 and 3. Safety checks run as the simulation goes
//! (outstanding never above the queue depth, time never going backwards,
//! a bound on events, the catalog's invariants at the end); a failing
//! check panics with the run's seed.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use qos_core::sim::metrics::LatencySummary;
use qos_core::sim::rng::{derive_seed, SimRng};
use qos_core::ssd_model::{SsdModel, SsdModelConfig};
use serde::{Deserialize, Serialize};

use crate::auction::{cost_bytes, Admission, Auction, AuctionConfig, ClientSlices};
use crate::extent::{AllocationPlan, ExtentCatalog, ExtentGeometry, LogicalExtent, VolumeSpec};
use crate::ids::{NamespaceId, PortId, SessionId, TargetId, VolumeId};
use crate::placement::PlacementWeights;
use crate::view::{
    IoVector, NamespaceSpec, PortSpec, SessionSpec, TargetSpec, ViewConfig, ViewController,
};
use crate::{IoKind, Nanos};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The hardware: targets with one port each and their drives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Targets.
    pub targets: u32,
    /// Namespaces (one drive each) per target.
    pub namespaces_per_target: u32,
    /// Payload bytes per second of each target's port, per direction.
    pub port_bytes_per_sec: u64,
    /// One-way delay client ↔ target, nanoseconds.
    pub network_one_way_ns: u64,
    /// One-way delay client ↔ arbiter, nanoseconds.
    pub rpc_one_way_ns: u64,
    /// The drive model (its seed is derived per drive from the run's).
    pub ssd: SsdModelConfig,
    /// Capacity of each namespace, bytes.
    pub namespace_capacity_bytes: u64,
    /// The view's profile of each drive: large-read bandwidth.
    pub profile_read_bytes_per_sec: u64,
    /// The view's profile of each drive: small-read IOPS.
    pub profile_read_iops: u64,
}

impl Default for Topology {
    /// Two targets with a 10 GB/s port (a 100 GbE NIC's payload) and four
    /// DCT983-like drives each (3.2 GB/s of 128 KiB reads, ~390k 4 KiB
    /// reads per second, `qos_core::ssd_model`).
    fn default() -> Self {
        Topology {
            targets: 2,
            namespaces_per_target: 4,
            port_bytes_per_sec: 10_000_000_000,
            network_one_way_ns: 10_000,
            rpc_one_way_ns: 20_000,
            ssd: SsdModelConfig::dct983_clean(),
            namespace_capacity_bytes: 64 << 30,
            profile_read_bytes_per_sec: 3_200_000_000,
            profile_read_iops: 390_000,
        }
    }
}

impl Topology {
    /// Namespace `i` of target `t`.
    pub fn namespace(&self, target: u32, i: u32) -> NamespaceId {
        NamespaceId(target * self.namespaces_per_target + i)
    }

    /// The target of a namespace.
    pub fn target_of(&self, namespace: NamespaceId) -> u32 {
        namespace.0 / self.namespaces_per_target
    }

    /// Every namespace.
    pub fn all_namespaces(&self) -> BTreeSet<NamespaceId> {
        (0..self.targets * self.namespaces_per_target)
            .map(NamespaceId)
            .collect()
    }
}

/// One client volume and its closed-loop workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeWorkload {
    /// A label for the report.
    pub name: String,
    /// The namespaces its extents may use (`None`: all).
    pub namespaces: Option<BTreeSet<NamespaceId>>,
    /// Its size, bytes.
    pub size_bytes: u64,
    /// I/Os outstanding.
    pub queue_depth: u32,
    /// Size of each I/O, bytes (offsets are aligned to it).
    pub io_bytes: u64,
    /// Percent of reads.
    pub read_percent: u32,
    /// Its weight in the auction.
    pub weight: u32,
    /// When it starts, nanoseconds.
    pub start_ns: u64,
    /// Allocate every extent at start (a volume written before the run)
    /// rather than on first write.
    pub prefill: bool,
}

/// Which of Flint's mechanisms run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mechanisms {
    /// The placement score uses the view's busy degree (γ > 0).
    pub placement_uses_view: bool,
    /// The bandwidth auction gates every I/O.
    pub auction: bool,
}

/// Everything a run depends on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The hardware.
    pub topology: Topology,
    /// The volumes.
    pub volumes: Vec<VolumeWorkload>,
    /// The mechanisms on.
    pub mechanisms: Mechanisms,
    /// Placement weights (γ is forced to 0 without `placement_uses_view`).
    pub placement: PlacementWeights,
    /// The view controller.
    pub view: ViewConfig,
    /// The auction.
    pub auction: AuctionConfig,
    /// Fraction of each drive's profiled bandwidth the auction hands out.
    pub auction_budget_fraction: f64,
    /// How often a client's view agent sends its batch, nanoseconds.
    pub agent_flush_ns: u64,
    /// Simulated time, nanoseconds.
    pub duration_ns: u64,
    /// Completions before this are not measured.
    pub warmup_ns: u64,
    /// The one seed every random choice derives from.
    pub seed: u64,
}

impl RunSpec {
    /// A run of `volumes` on the default topology with every default.
    pub fn new(volumes: Vec<VolumeWorkload>, mechanisms: Mechanisms, seed: u64) -> Self {
        RunSpec {
            topology: Topology::default(),
            volumes,
            mechanisms,
            placement: PlacementWeights::default(),
            view: ViewConfig::default(),
            auction: AuctionConfig::default(),
            auction_budget_fraction: 0.95,
            agent_flush_ns: 1_000_000,
            duration_ns: 200_000_000,
            warmup_ns: 50_000_000,
            seed,
        }
    }
}

/// What one volume achieved in the measured window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeOutcome {
    /// Its label.
    pub name: String,
    /// I/Os completed on a drive.
    pub completed_ios: u64,
    /// Bytes per second.
    pub bytes_per_sec: f64,
    /// Cost-weighted bytes per second (the auction's currency).
    pub cost_bytes_per_sec: f64,
    /// Generation → completion.
    pub latency: LatencySummary,
    /// Reads of unmapped extents answered with zeros (whole run).
    pub zero_reads: u64,
    /// Its extents per namespace at the end (copy 0).
    pub extents_per_namespace: BTreeMap<u32, u64>,
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Per volume, in the spec's order.
    pub volumes: Vec<VolumeOutcome>,
    /// Bytes per second each namespace served in the measured window.
    pub namespace_bytes_per_sec: Vec<f64>,
    /// Bytes per second each target port carried (both directions).
    pub port_bytes_per_sec: Vec<f64>,
    /// The view's busy degree per namespace at the end.
    pub busy_degree: Vec<f64>,
    /// Events processed.
    pub events: u64,
}

#[derive(Clone, Debug)]
enum Event {
    Start(usize),
    ArriveTarget(u64),
    DriveDone(u64),
    ArriveClient(u64),
    AllocAtArbiter {
        volume: usize,
        logical: LogicalExtent,
    },
    AllocAtClient {
        volume: usize,
        logical: LogicalExtent,
    },
    RequestAtArbiter {
        session: SessionId,
        namespace: NamespaceId,
    },
    GrantAtClient(crate::auction::Grant),
    BatchAtArbiter(Vec<IoVector>),
    AgentFlush,
    ViewEpoch,
    AuctionEpoch,
}

struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, the earliest goes first.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Clone, Debug)]
struct Io {
    volume: usize,
    kind: IoKind,
    bytes: u64,
    offset: u64,
    namespace: NamespaceId,
    physical_offset: u64,
    session: SessionId,
    created_at: u64,
    sent_at: u64,
    cost: u64,
}

/// A direction of a port: a FIFO link.
#[derive(Clone, Copy, Debug, Default)]
struct Link {
    free_at: u64,
    bytes: u64,
}

impl Link {
    fn reserve(&mut self, at: u64, bytes: u64, bytes_per_sec: u64, measured: bool) -> u64 {
        let start = at.max(self.free_at);
        self.free_at = start + bytes * NANOS_PER_SEC / bytes_per_sec.max(1);
        if measured {
            self.bytes += bytes;
        }
        self.free_at
    }
}

struct VolumeState {
    outstanding: u32,
    rng: SimRng,
    latencies: Vec<u64>,
    bytes: u64,
    cost_bytes: u64,
    zero_reads: u64,
    batch: Vec<IoVector>,
    started: bool,
}

struct Sim<'a> {
    spec: &'a RunSpec,
    now: u64,
    seq: u64,
    events: u64,
    queue: BinaryHeap<Scheduled>,
    drives: Vec<SsdModel>,
    inbound: Vec<Link>,
    outbound: Vec<Link>,
    drive_bytes: Vec<u64>,
    catalog: ExtentCatalog,
    view: ViewController,
    auction: Auction,
    weights: PlacementWeights,
    volumes: Vec<VolumeState>,
    ios: BTreeMap<u64, Io>,
    next_io: u64,
    /// Extents being allocated, with the I/Os waiting for them.
    allocating: BTreeMap<(usize, LogicalExtent), Vec<u64>>,
    slices: BTreeMap<(SessionId, NamespaceId), ClientSlices>,
    /// I/Os waiting for a slice, per flow.
    waiting: BTreeMap<(SessionId, NamespaceId), VecDeque<u64>>,
}

fn session_of(spec: &RunSpec, volume: usize, target: u32) -> SessionId {
    SessionId(volume as u32 * spec.topology.targets + target)
}

/// Runs a simulation to its end.
pub fn run(spec: &RunSpec) -> RunResult {
    let mut sim = Sim::new(spec);
    sim.run();
    sim.result()
}

impl<'a> Sim<'a> {
    fn new(spec: &'a RunSpec) -> Self {
        let topo = &spec.topology;
        let now = Nanos::ZERO;
        let mut catalog = ExtentCatalog::new(ExtentGeometry::default());
        let mut view = ViewController::new(spec.view.clone(), now).expect("valid view config");
        let mut auction = Auction::new(spec.auction.clone(), now).expect("valid auction config");
        let mut drives = Vec::new();
        for t in 0..topo.targets {
            view.add_target(TargetId(t), TargetSpec::default());
            view.add_port(
                PortId(t),
                PortSpec {
                    target: TargetId(t),
                    bytes_per_sec: topo.port_bytes_per_sec,
                },
            )
            .expect("target added");
            auction.add_port(PortId(t), topo.port_bytes_per_sec);
            for i in 0..topo.namespaces_per_target {
                let ns = topo.namespace(t, i);
                catalog
                    .add_namespace(ns, TargetId(t), topo.namespace_capacity_bytes)
                    .expect("distinct ids");
                view.add_namespace(
                    ns,
                    NamespaceSpec::new(
                        TargetId(t),
                        topo.profile_read_bytes_per_sec,
                        topo.profile_read_iops,
                    ),
                )
                .expect("target added");
                auction.add_namespace(
                    ns,
                    (topo.profile_read_bytes_per_sec as f64 * spec.auction_budget_fraction) as u64,
                );
                let seed = derive_seed(spec.seed, &format!("drive-{}", ns.0));
                drives.push(SsdModel::new(topo.ssd.clone().with_seed(seed)).expect("valid model"));
            }
        }
        let mut volumes = Vec::new();
        for (v, w) in spec.volumes.iter().enumerate() {
            catalog
                .create_volume(
                    VolumeId(v as u32),
                    VolumeSpec {
                        size_bytes: w.size_bytes,
                        copies: 1,
                        allowed_namespaces: w.namespaces.clone(),
                        preference: BTreeMap::new(),
                    },
                )
                .unwrap_or_else(|e| panic!("seed {}: volume {v}: {e}", spec.seed));
            auction.set_volume_weight(VolumeId(v as u32), w.weight);
            for t in 0..topo.targets {
                let session = session_of(spec, v, t);
                view.add_session(
                    session,
                    SessionSpec {
                        port: PortId(t),
                        volume: VolumeId(v as u32),
                    },
                )
                .expect("port added");
                auction
                    .add_session(session, PortId(t), VolumeId(v as u32))
                    .expect("port added");
            }
            volumes.push(VolumeState {
                outstanding: 0,
                rng: SimRng::derive(spec.seed, &format!("volume-{v}")),
                latencies: Vec::new(),
                bytes: 0,
                cost_bytes: 0,
                zero_reads: 0,
                batch: Vec::new(),
                started: false,
            });
        }
        let weights = if spec.mechanisms.placement_uses_view {
            spec.placement.clone()
        } else {
            PlacementWeights {
                busy: 0.0,
                ..spec.placement.clone()
            }
        };
        let n_ns = (topo.targets * topo.namespaces_per_target) as usize;
        let mut sim = Sim {
            spec,
            now: 0,
            seq: 0,
            events: 0,
            queue: BinaryHeap::new(),
            drives,
            inbound: vec![Link::default(); topo.targets as usize],
            outbound: vec![Link::default(); topo.targets as usize],
            drive_bytes: vec![0; n_ns],
            catalog,
            view,
            auction,
            weights,
            volumes,
            ios: BTreeMap::new(),
            next_io: 0,
            allocating: BTreeMap::new(),
            slices: BTreeMap::new(),
            waiting: BTreeMap::new(),
        };
        for (v, w) in spec.volumes.iter().enumerate() {
            sim.schedule(w.start_ns, Event::Start(v));
        }
        sim.schedule(spec.agent_flush_ns, Event::AgentFlush);
        sim.schedule(sim.view.poll_timeout().as_nanos(), Event::ViewEpoch);
        if spec.mechanisms.auction {
            sim.schedule(sim.auction.poll_timeout().as_nanos(), Event::AuctionEpoch);
        }
        sim
    }

    fn fail(&self, what: &str) -> ! {
        panic!("seed {}: at {} ns: {what}", self.spec.seed, self.now)
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    fn measured(&self) -> bool {
        self.now >= self.spec.warmup_ns
    }

    fn run(&mut self) {
        // Every I/O costs a handful of events; a run of seconds at tens of
        // GB/s stays far below this.
        const MAX_EVENTS: u64 = 50_000_000;
        while let Some(next) = self.queue.pop() {
            if next.at > self.spec.duration_ns {
                break;
            }
            if next.at < self.now {
                self.fail("time went backwards");
            }
            self.now = next.at;
            self.events += 1;
            if self.events > MAX_EVENTS {
                self.fail("event bound exceeded");
            }
            self.handle(next.event);
        }
        let violations = self.catalog.check();
        if !violations.is_empty() {
            self.fail(&format!("catalog invariants: {violations:?}"));
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Start(v) => {
                if self.spec.volumes[v].prefill {
                    self.prefill(v);
                }
                self.volumes[v].started = true;
                self.fill(v);
            }
            Event::ArriveTarget(id) => {
                let io = &self.ios[&id];
                let ns = io.namespace.0 as usize;
                let done =
                    self.drives[ns].submit(Nanos(self.now), io.kind, io.physical_offset, io.bytes);
                if self.now >= self.spec.warmup_ns {
                    self.drive_bytes[ns] += io.bytes;
                }
                self.schedule(done.as_nanos().max(self.now), Event::DriveDone(id));
            }
            Event::DriveDone(id) => {
                let io = &self.ios[&id];
                let target = self.spec.topology.target_of(io.namespace) as usize;
                let back = match io.kind {
                    IoKind::Read => {
                        let (bytes, measured) = (io.bytes, self.measured());
                        self.outbound[target].reserve(
                            self.now,
                            bytes,
                            self.spec.topology.port_bytes_per_sec,
                            measured,
                        )
                    }
                    IoKind::Write => self.now,
                };
                let at = back + self.spec.topology.network_one_way_ns;
                self.schedule(at, Event::ArriveClient(id));
            }
            Event::ArriveClient(id) => self.complete(id),
            Event::AllocAtArbiter { volume, logical } => {
                let view = &self.view;
                let plan: AllocationPlan = self
                    .catalog
                    .plan_allocation(VolumeId(volume as u32), logical, &self.weights, |ns| {
                        view.load(ns)
                    })
                    .unwrap_or_else(|e| self.fail(&format!("allocation: {e}")));
                // The arbiter would make the plan durable in etcd here.
                self.catalog
                    .apply(&plan)
                    .unwrap_or_else(|e| self.fail(&format!("apply: {e}")));
                let at = self.now + self.spec.topology.rpc_one_way_ns;
                self.schedule(at, Event::AllocAtClient { volume, logical });
            }
            Event::AllocAtClient { volume, logical } => {
                let waiting = self
                    .allocating
                    .remove(&(volume, logical))
                    .unwrap_or_default();
                for id in waiting {
                    self.route(id);
                }
            }
            Event::RequestAtArbiter { session, namespace } => {
                self.auction
                    .handle_request(
                        Nanos(self.now),
                        crate::auction::SliceRequest { session, namespace },
                    )
                    .unwrap_or_else(|e| self.fail(&format!("slice request: {e}")));
                self.send_grants();
            }
            Event::GrantAtClient(grant) => {
                let key = (grant.session, grant.namespace);
                let now = Nanos(self.now);
                if let Some(s) = self.slices.get_mut(&key) {
                    s.on_grant(now, &grant);
                }
                self.drain_waiting(key);
            }
            Event::BatchAtArbiter(batch) => {
                let max = self.spec.view.max_batch.max(1);
                for chunk in batch.chunks(max) {
                    self.view
                        .ingest(Nanos(self.now), chunk)
                        .unwrap_or_else(|e| self.fail(&format!("ingest: {e}")));
                }
            }
            Event::AgentFlush => {
                let at = self.now + self.spec.topology.rpc_one_way_ns;
                for v in 0..self.volumes.len() {
                    let batch = std::mem::take(&mut self.volumes[v].batch);
                    if !batch.is_empty() {
                        self.schedule(at, Event::BatchAtArbiter(batch));
                    }
                }
                self.schedule(self.now + self.spec.agent_flush_ns, Event::AgentFlush);
            }
            Event::ViewEpoch => {
                self.view.handle_timeout(Nanos(self.now));
                while self.view.poll_notification().is_some() {}
                self.schedule(self.view.poll_timeout().as_nanos(), Event::ViewEpoch);
            }
            Event::AuctionEpoch => {
                self.auction.handle_timeout(Nanos(self.now));
                self.send_grants();
                self.schedule(self.auction.poll_timeout().as_nanos(), Event::AuctionEpoch);
            }
        }
    }

    fn send_grants(&mut self) {
        let at = self.now + self.spec.topology.rpc_one_way_ns;
        while let Some(g) = self.auction.poll_grant() {
            self.schedule(at, Event::GrantAtClient(g));
        }
    }

    /// Allocates every extent of volume `v` now (a volume written before
    /// the measured run), with the view as it stands.
    fn prefill(&mut self, v: usize) {
        let volume = VolumeId(v as u32);
        let extents = self
            .catalog
            .volume(volume)
            .map(|(_, m)| m.size_extents())
            .unwrap_or(0);
        for l in 0..extents {
            let logical = LogicalExtent(l);
            if self
                .catalog
                .volume(volume)
                .and_then(|(_, m)| m.lookup(logical))
                .is_some()
            {
                continue;
            }
            let view = &self.view;
            let plan = self
                .catalog
                .plan_allocation(volume, logical, &self.weights, |ns| view.load(ns))
                .unwrap_or_else(|e| self.fail(&format!("prefill: {e}")));
            self.catalog
                .apply(&plan)
                .unwrap_or_else(|e| self.fail(&format!("prefill apply: {e}")));
        }
    }

    /// Generates I/Os until volume `v` has its queue depth outstanding.
    fn fill(&mut self, v: usize) {
        let w = &self.spec.volumes[v];
        while self.volumes[v].outstanding < w.queue_depth {
            self.volumes[v].outstanding += 1;
            let rng = &mut self.volumes[v].rng;
            let slots = (w.size_bytes / w.io_bytes).max(1);
            let offset = rng.below(slots) * w.io_bytes;
            let kind = if rng.percent(w.read_percent) {
                IoKind::Read
            } else {
                IoKind::Write
            };
            let id = self.next_io;
            self.next_io += 1;
            self.ios.insert(
                id,
                Io {
                    volume: v,
                    kind,
                    bytes: w.io_bytes,
                    offset,
                    namespace: NamespaceId(0),
                    physical_offset: 0,
                    session: SessionId(0),
                    created_at: self.now,
                    sent_at: 0,
                    cost: 0,
                },
            );
            self.route(id);
        }
    }

    /// Finds the I/O's extent: sends it on, waits for an allocation, or
    /// answers an unmapped read with zeros.
    fn route(&mut self, id: u64) {
        let io = &self.ios[&id];
        let (v, kind) = (io.volume, io.kind);
        let geometry = self.catalog.geometry();
        let logical = geometry.extent_of(io.offset);
        let offset_in_extent = io.offset % geometry.extent_bytes();
        if let Some(waiters) = self.allocating.get_mut(&(v, logical)) {
            waiters.push(id);
            return;
        }
        let mapping = self
            .catalog
            .volume(VolumeId(v as u32))
            .and_then(|(_, m)| m.lookup(logical))
            .cloned();
        match (mapping, kind) {
            (Some(mapping), _) => {
                let placement = mapping.copies[0];
                let target = self.spec.topology.target_of(placement.namespace);
                let ns_spec = self
                    .view
                    .namespace_spec(placement.namespace)
                    .expect("known");
                let min_cost = ns_spec.read_bytes_per_sec / ns_spec.read_iops.max(1);
                let write_cost = self
                    .view
                    .namespace(placement.namespace)
                    .map(|n| n.write_cost)
                    .unwrap_or(1.0);
                let session = session_of(self.spec, v, target);
                let io = self.ios.get_mut(&id).expect("exists");
                io.namespace = placement.namespace;
                io.physical_offset =
                    geometry.physical_offset(placement.physical) + offset_in_extent;
                io.session = session;
                io.cost = cost_bytes(io.kind, io.bytes, min_cost, write_cost);
                if self.spec.mechanisms.auction {
                    let key = (session, placement.namespace);
                    self.waiting.entry(key).or_default().push_back(id);
                    self.drain_waiting(key);
                } else {
                    self.send(id);
                }
            }
            (None, IoKind::Read) => {
                // Zeros, from nobody: completes now, not measured.
                self.volumes[v].zero_reads += 1;
                self.ios.remove(&id);
                self.finish_slot(v);
            }
            (None, IoKind::Write) => {
                self.allocating.insert((v, logical), vec![id]);
                let at = self.now + self.spec.topology.rpc_one_way_ns;
                self.schedule(at, Event::AllocAtArbiter { volume: v, logical });
            }
        }
    }

    /// Admits the flow's waiting I/Os while its slices have room, and asks
    /// for the next slice when they run low.
    fn drain_waiting(&mut self, key: (SessionId, NamespaceId)) {
        let now = Nanos(self.now);
        let slice = self.spec.auction.slice_bytes;
        let slices = self
            .slices
            .entry(key)
            .or_insert_with(|| ClientSlices::new(key.0, key.1, slice));
        let mut admitted = Vec::new();
        if let Some(queue) = self.waiting.get_mut(&key) {
            while let Some(&id) = queue.front() {
                let cost = self.ios[&id].cost;
                if slices.try_admit(now, cost) == Admission::Admitted {
                    queue.pop_front();
                    admitted.push(id);
                } else {
                    break;
                }
            }
        }
        let request = slices.poll_request(now);
        for id in admitted {
            self.send(id);
        }
        if let Some(r) = request {
            let at = self.now + self.spec.topology.rpc_one_way_ns;
            self.schedule(
                at,
                Event::RequestAtArbiter {
                    session: r.session,
                    namespace: r.namespace,
                },
            );
        }
    }

    fn send(&mut self, id: u64) {
        let measured = self.measured();
        let io = self.ios.get_mut(&id).expect("exists");
        io.sent_at = self.now;
        let target = self.spec.topology.target_of(io.namespace) as usize;
        let depart = self.now + self.spec.topology.network_one_way_ns;
        let arrive = match io.kind {
            IoKind::Read => depart,
            IoKind::Write => self.inbound[target].reserve(
                depart,
                io.bytes,
                self.spec.topology.port_bytes_per_sec,
                measured,
            ),
        };
        self.schedule(arrive, Event::ArriveTarget(id));
    }

    fn complete(&mut self, id: u64) {
        let io = self.ios.remove(&id).expect("in flight");
        let v = io.volume;
        let measured = self.measured();
        let state = &mut self.volumes[v];
        state.batch.push(IoVector {
            session: io.session,
            namespace: io.namespace,
            kind: io.kind,
            bytes: io.bytes,
            latency_ns: self.now - io.sent_at,
            count: 1,
            completed_at: Nanos(self.now),
        });
        if measured {
            state.latencies.push(self.now - io.created_at);
            state.bytes += io.bytes;
            state.cost_bytes += io.cost;
        }
        self.finish_slot(v);
    }

    fn finish_slot(&mut self, v: usize) {
        let state = &mut self.volumes[v];
        if state.outstanding == 0 {
            self.fail("outstanding went below zero");
        }
        state.outstanding -= 1;
        if state.started {
            self.fill(v);
        }
    }

    fn result(mut self) -> RunResult {
        let secs = (self.spec.duration_ns.saturating_sub(self.spec.warmup_ns)).max(1) as f64
            / NANOS_PER_SEC as f64;
        let mut volumes = Vec::new();
        for (v, w) in self.spec.volumes.iter().enumerate() {
            let state = &mut self.volumes[v];
            let latency = LatencySummary::from_nanos(&mut state.latencies);
            let mut extents_per_namespace = BTreeMap::new();
            if let Some((_, map)) = self.catalog.volume(VolumeId(v as u32)) {
                for (_, m) in map.iter() {
                    *extents_per_namespace
                        .entry(m.copies[0].namespace.0)
                        .or_insert(0) += 1;
                }
            }
            volumes.push(VolumeOutcome {
                name: w.name.clone(),
                completed_ios: latency.count,
                bytes_per_sec: state.bytes as f64 / secs,
                cost_bytes_per_sec: state.cost_bytes as f64 / secs,
                latency,
                zero_reads: state.zero_reads,
                extents_per_namespace,
            });
        }
        let namespaces = self.spec.topology.all_namespaces();
        RunResult {
            volumes,
            namespace_bytes_per_sec: self.drive_bytes.iter().map(|b| *b as f64 / secs).collect(),
            port_bytes_per_sec: self
                .inbound
                .iter()
                .zip(&self.outbound)
                .map(|(i, o)| (i.bytes + o.bytes) as f64 / secs)
                .collect(),
            busy_degree: namespaces
                .iter()
                .map(|ns| self.view.load(*ns).busy_degree)
                .collect(),
            events: self.events,
        }
    }
}
