//! What the leader holds in memory: flint-core's catalog, view controller
//! and auction, and the names of etcd's records mapped to flint-core's
//! numeric ids. Built from etcd when the instance wins the election and
//! dropped when it stops leading; never read by a standby.
//!
//! Ids are assigned on first sight and never reassigned while this
//! leadership lasts (a catalog rebuilt after a grow keeps them), so
//! sessions and subscriptions stay valid across a rebuild.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cluster_store::evol::{
    EvolSpec, ExtentRecord, Leadership, NamespaceRecord, PextRecord, Placement, PoolView,
};
use cluster_store::records::SCHEMA;
use flint_core::auction::{Auction, Grant, SliceRequest};
use flint_core::extent::{
    AllocationPlan, ExtentCatalog, ExtentGeometry, ExtentMapping, LogicalExtent, PhysicalExtent,
    Placement as FlintPlacement, VolumeSpec,
};
use flint_core::view::{
    BottleneckReport, Condition, IoVector, NamespaceSpec, PortSpec, SessionSpec, SubscriberId,
    SubscriptionId, TargetSpec, ViewController,
};
use flint_core::{FlintError, IoKind, NamespaceId, Nanos, PortId, SessionId, TargetId, VolumeId};
use tonic::Status;

use crate::config::ArbiterConfig;
use crate::limits;
use crate::pb;

/// How long a finished delete's answer is kept for a retry of it: longer
/// than a client's call deadline (15 s by default) with its backoff.
const DELETED_MEMORY: Nanos = Nanos(120_000_000_000);
/// At most this many finished deletes are remembered (the oldest go first).
const DELETED_MAX: usize = 1024;

/// Deletes finished lately, eVol -> (physical extents freed, when): a
/// delete sent again because its answer was lost (the caller's deadline
/// passed while it ran to its end) gets the same answer, not NOT_FOUND.
/// Kept [`DELETED_MEMORY`], at most [`DELETED_MAX`] of them.
#[derive(Default)]
pub(crate) struct FinishedDeletes(BTreeMap<String, (u64, Nanos)>);

impl FinishedDeletes {
    /// The delete of `name` finished at `now`, freeing `freed` physical
    /// extents.
    pub fn remember(&mut self, name: &str, freed: u64, now: Nanos) {
        self.0
            .retain(|_, (_, at)| now.0.saturating_sub(at.0) < DELETED_MEMORY.0);
        while self.0.len() >= DELETED_MAX {
            let oldest = self
                .0
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(n, _)| n.clone());
            match oldest {
                Some(n) => self.0.remove(&n),
                None => break,
            };
        }
        self.0.insert(name.to_owned(), (freed, now));
    }

    /// What the delete of `name` freed, if it finished less than
    /// [`DELETED_MEMORY`] before `now` (and was not forgotten since).
    pub fn get(&self, name: &str, now: Nanos) -> Option<u64> {
        self.0
            .get(name)
            .filter(|(_, at)| now.0.saturating_sub(at.0) < DELETED_MEMORY.0)
            .map(|(freed, _)| *freed)
    }

    /// An eVol named `name` exists again: a delete of it is a new one.
    pub fn forget(&mut self, name: &str) {
        self.0.remove(name);
    }
}

/// A namespace of the pool as the leader knows it.
pub(crate) struct Ns {
    pub id: NamespaceId,
    pub record: NamespaceRecord,
    pub port: PortId,
}

/// A Subscribe stream.
pub(crate) struct Subscriber {
    pub tx: tokio::sync::mpsc::Sender<Result<pb::ViewNotification, Status>>,
    /// The view's subscription id -> index in the request.
    pub subs: BTreeMap<SubscriptionId, u32>,
    pub reports: bool,
}

/// An allocation planned and applied to the catalog but not yet durable
/// (the extent's lock is held by the request that planned it).
pub(crate) struct Tentative {
    pub plan: AllocationPlan,
}

/// The leader's state.
pub(crate) struct Core {
    pub lead: Leadership,
    pub catalog: ExtentCatalog,
    pub namespaces: BTreeMap<String, Ns>,
    pub ns_names: BTreeMap<NamespaceId, String>,
    targets: BTreeMap<String, TargetId>,
    ports: BTreeMap<String, (PortId, TargetId)>,
    pub port_names: BTreeMap<PortId, String>,
    pub volumes: BTreeMap<String, (VolumeId, EvolSpec)>,
    vol_ids: BTreeMap<String, VolumeId>,
    pub deleting: BTreeSet<String>,
    /// Physical extents a delete in progress frees, per eVol: the copies
    /// mapped when its first attempt read etcd, so a delete retried after
    /// a lost answer or a cancelled attempt reports them all. (A leader
    /// that takes over a half-done delete counts what is left.)
    pub delete_freed: BTreeMap<String, u64>,
    /// Deletes finished lately: a delete sent again because its answer was
    /// lost gets the same answer. Forgotten with the leadership.
    pub deleted: FinishedDeletes,
    pub tentative: BTreeMap<(VolumeId, u64), Tentative>,
    /// Physical extents waiting for zeroing, (namespace, pext) -> their
    /// zeroing record in etcd: read at election, added by unmaps, removed
    /// by the zeroing task once zeroed and freed in etcd. Zeroing in the
    /// catalog (out of reuse), across rebuilds too.
    pub zeroing: BTreeMap<(String, u64), PextRecord>,
    sessions: BTreeMap<(String, String, PortId), SessionId>,
    pub session_names: BTreeMap<SessionId, String>,
    pub view: ViewController,
    pub auction: Auction,
    /// Grants not yet collected, per flow.
    pub grants: BTreeMap<(SessionId, NamespaceId), VecDeque<Grant>>,
    pub subscribers: BTreeMap<SubscriberId, Subscriber>,
    next_subscriber: u64,
    pub last_report: BottleneckReport,
    config: ArbiterConfig,
}

/// The answer an allocation gets from the catalog.
pub(crate) enum Planned {
    /// Mapped already (durably): answer it.
    Existing(ExtentRecord),
    /// A new plan, applied tentatively: make it durable.
    New(Box<AllocationPlan>, ExtentRecord),
}

pub(crate) fn flint_status(e: FlintError) -> Status {
    match e {
        FlintError::OutOfRange { .. } => Status::out_of_range(e.to_string()),
        FlintError::NoRoom(_) => Status::resource_exhausted(e.to_string()),
        FlintError::UnknownVolume(_) | FlintError::UnknownNamespace(_) => {
            Status::not_found(e.to_string())
        }
        FlintError::BatchTooLarge { .. } | FlintError::InvalidConfig { .. } => {
            Status::invalid_argument(e.to_string())
        }
        _ => Status::internal(e.to_string()),
    }
}

impl Core {
    /// The leader's state from the records in etcd.
    pub fn new(
        config: &ArbiterConfig,
        lead: Leadership,
        pool: &PoolView,
        now: Nanos,
    ) -> Result<Self, FlintError> {
        let geometry = ExtentGeometry::new(config.extent_bytes)?;
        let mut c = Core {
            lead,
            catalog: ExtentCatalog::new(geometry),
            namespaces: BTreeMap::new(),
            ns_names: BTreeMap::new(),
            targets: BTreeMap::new(),
            ports: BTreeMap::new(),
            port_names: BTreeMap::new(),
            volumes: BTreeMap::new(),
            vol_ids: BTreeMap::new(),
            deleting: BTreeSet::new(),
            delete_freed: BTreeMap::new(),
            deleted: FinishedDeletes::default(),
            tentative: BTreeMap::new(),
            zeroing: BTreeMap::new(),
            sessions: BTreeMap::new(),
            session_names: BTreeMap::new(),
            view: ViewController::new(config.view.clone(), now)?,
            auction: Auction::new(config.auction.clone(), now)?,
            grants: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            next_subscriber: 1,
            last_report: BottleneckReport::default(),
            config: config.clone(),
        };
        c.rebuild(pool);
        Ok(c)
    }

    fn target_id(&mut self, name: &str) -> TargetId {
        let next = TargetId(self.targets.len() as u32);
        *self.targets.entry(name.to_owned()).or_insert(next)
    }

    fn volume_id(&mut self, name: &str) -> VolumeId {
        let next = VolumeId(self.vol_ids.len() as u32);
        *self.vol_ids.entry(name.to_owned()).or_insert(next)
    }

    /// Registers a namespace's record (new or updated) everywhere but the
    /// catalog.
    fn register_namespace(&mut self, rec: &NamespaceRecord) -> NamespaceId {
        let target = self.target_id(&rec.target);
        let next_port = PortId(self.ports.len() as u32);
        let (port, _) = *self
            .ports
            .entry(rec.address.clone())
            .or_insert((next_port, target));
        self.port_names.insert(port, rec.address.clone());
        let next_ns = NamespaceId(self.ns_names.len() as u32);
        let id = self.namespaces.get(&rec.id).map_or(next_ns, |n| n.id);
        self.ns_names.insert(id, rec.id.clone());
        self.namespaces.insert(
            rec.id.clone(),
            Ns {
                id,
                record: rec.clone(),
                port,
            },
        );
        let p = &self.config.profile;
        self.view.add_target(target, TargetSpec::default());
        // The port's target is the one it was first seen with.
        let port_target = self.ports[&rec.address].1;
        let _ = self.view.add_port(
            port,
            PortSpec {
                target: port_target,
                bytes_per_sec: p.port_bytes_per_sec,
            },
        );
        let _ = self.view.add_namespace(
            id,
            NamespaceSpec::new(port_target, p.read_bytes_per_sec, p.read_iops),
        );
        self.auction.add_namespace(id, p.read_bytes_per_sec);
        self.auction.add_port(port, p.port_bytes_per_sec);
        id
    }

    /// Rebuilds the catalog from `pool` (the records in etcd), then puts
    /// back the extents waiting for zeroing (etcd's and, if `pool` was
    /// read before an unmap committed, this leader's) and allocations in
    /// flight.
    pub fn rebuild(&mut self, pool: &PoolView) {
        let geometry = self.catalog.geometry();
        self.catalog = ExtentCatalog::new(geometry);
        for rec in pool.namespaces.values() {
            if rec.extent_bytes != geometry.extent_bytes() {
                log::error!(
                    "namespace {}: extent size {} differs from the pool's {}; not used",
                    rec.id,
                    rec.extent_bytes,
                    geometry.extent_bytes()
                );
                continue;
            }
            let id = self.register_namespace(rec);
            let target = self.targets[&rec.target];
            if let Err(e) =
                self.catalog
                    .add_namespace(id, target, rec.extents * geometry.extent_bytes())
            {
                log::error!("namespace {}: {e}", rec.id);
            }
        }
        self.volumes.clear();
        for spec in pool.evols.values() {
            let id = self.volume_id(&spec.name);
            if spec.extent_bytes != geometry.extent_bytes() {
                log::error!(
                    "eVol {}: extent size {} differs from the pool's {}; not served",
                    spec.name,
                    spec.extent_bytes,
                    geometry.extent_bytes()
                );
                continue;
            }
            if let Err(e) = self.catalog.create_volume(id, flint_volume_spec(spec)) {
                log::error!("eVol {}: {e}; not served", spec.name);
                continue;
            }
            self.auction.set_volume_weight(id, spec.weight);
            self.volumes.insert(spec.name.clone(), (id, spec.clone()));
        }
        for rec in &pool.extents {
            match self.plan_of(rec) {
                Some(plan) => {
                    if let Err(e) = self.catalog.apply(&plan) {
                        log::error!("eVol {} extent {}: {e}", rec.evol, rec.index);
                    }
                }
                None => log::error!(
                    "eVol {} extent {}: names an unknown eVol or namespace",
                    rec.evol,
                    rec.index
                ),
            }
        }
        for (k, rec) in &pool.zeroing {
            self.zeroing.entry(k.clone()).or_insert_with(|| rec.clone());
        }
        let zeroing: Vec<(String, u64)> = self.zeroing.keys().cloned().collect();
        for (ns, pext) in zeroing {
            match self.flint_placement(&ns, pext) {
                Some(p) => {
                    if let Err(e) = self.catalog.quarantine(p) {
                        log::error!("namespace {ns} physical extent {pext} waits for zeroing: {e}");
                    }
                }
                None => {
                    log::error!(
                        "namespace {ns} physical extent {pext} waits for zeroing on a namespace not in the pool"
                    );
                }
            }
        }
        for t in self.tentative.values() {
            let _ = self.catalog.apply(&t.plan);
        }
    }

    /// Physical extent `pext` of namespace `ns` in the catalog's terms.
    pub fn flint_placement(&self, ns: &str, pext: u64) -> Option<FlintPlacement> {
        self.namespaces.get(ns).map(|n| FlintPlacement {
            namespace: n.id,
            physical: PhysicalExtent(pext),
        })
    }

    /// Physical extent `pext` of `ns` is zeroed and its zeroing record
    /// deleted in etcd: free for allocations.
    pub fn zeroed(&mut self, ns: &str, pext: u64) {
        self.zeroing.remove(&(ns.to_owned(), pext));
        if let Some(p) = self.flint_placement(ns, pext) {
            if let Err(e) = self.catalog.zeroed(p) {
                log::warn!("namespace {ns} physical extent {pext}: {e}");
            }
        }
    }

    /// A stored mapping as a plan the catalog can apply.
    fn plan_of(&self, rec: &ExtentRecord) -> Option<AllocationPlan> {
        let (volume, _) = self.volumes.get(&rec.evol)?;
        let copies = rec
            .copies
            .iter()
            .map(|c| {
                self.namespaces.get(&c.namespace).map(|n| FlintPlacement {
                    namespace: n.id,
                    physical: PhysicalExtent(c.pext),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(AllocationPlan {
            volume: *volume,
            logical: LogicalExtent(rec.index),
            mapping: ExtentMapping { copies },
            scores: Vec::new(),
        })
    }

    fn record_of(&self, evol: &str, index: u64, m: &ExtentMapping) -> ExtentRecord {
        ExtentRecord {
            schema: SCHEMA,
            evol: evol.to_owned(),
            index,
            copies: m
                .copies
                .iter()
                .map(|c| Placement {
                    namespace: self.ns_names[&c.namespace].clone(),
                    pext: c.physical.0,
                })
                .collect(),
        }
    }

    /// The mapping of `evol`'s extent `index`, or a new plan applied
    /// tentatively (the caller holds the extent's lock, makes the plan
    /// durable, then calls [`Core::commit`] or [`Core::rollback`]).
    pub fn plan(&mut self, evol: &str, index: u64) -> Result<Planned, Status> {
        let Some((vid, _)) = self.volumes.get(evol) else {
            return Err(Status::not_found(format!("no eVol named {evol}")));
        };
        let vid = *vid;
        if self.deleting.contains(evol) {
            return Err(Status::failed_precondition(format!(
                "eVol {evol} is being deleted"
            )));
        }
        let (_, map) = self
            .catalog
            .volume(vid)
            .expect("volumes are in the catalog");
        if let Some(m) = map.lookup(LogicalExtent(index)) {
            return Ok(Planned::Existing(self.record_of(evol, index, m)));
        }
        let view = &self.view;
        let plan = self
            .catalog
            .plan_allocation(vid, LogicalExtent(index), &self.config.placement, |ns| {
                view.load(ns)
            })
            .map_err(flint_status)?;
        self.catalog.apply(&plan).map_err(flint_status)?;
        let record = self.record_of(evol, index, &plan.mapping);
        self.tentative
            .insert((vid, index), Tentative { plan: plan.clone() });
        Ok(Planned::New(Box::new(plan), record))
    }

    /// The plan is durable.
    pub fn commit(&mut self, plan: &AllocationPlan) {
        self.tentative.remove(&(plan.volume, plan.logical.0));
        let mapped = self
            .catalog
            .volume(plan.volume)
            .and_then(|(_, m)| m.lookup(plan.logical).cloned());
        if mapped.as_ref() != Some(&plan.mapping) {
            // A rebuild in between read etcd before the commit.
            let _ = self.catalog.apply(plan);
        }
    }

    /// The plan did not become durable: undo it in the catalog. Its
    /// physical extents were never written (nobody was answered), so they
    /// are free at once.
    pub fn rollback(&mut self, plan: &AllocationPlan) {
        self.tentative.remove(&(plan.volume, plan.logical.0));
        let mapped = self
            .catalog
            .volume(plan.volume)
            .and_then(|(_, m)| m.lookup(plan.logical).cloned());
        if mapped.as_ref() == Some(&plan.mapping)
            && self.catalog.unmap(plan.volume, plan.logical).is_ok()
        {
            for c in &plan.mapping.copies {
                let _ = self.catalog.zeroed(*c);
            }
        }
    }

    /// Another request (or leader) mapped the extent: take its mapping.
    pub fn adopt(&mut self, rec: &ExtentRecord) {
        if let Some(plan) = self.plan_of(rec) {
            let _ = self.catalog.apply(&plan);
        }
    }

    /// An eVol's info.
    pub fn volume_info(&self, name: &str) -> Option<pb::VolumeInfo> {
        let (vid, spec) = self.volumes.get(name)?;
        let mapped = self
            .catalog
            .volume(*vid)
            .map_or(0, |(_, m)| m.mapped_extents());
        Some(pb::VolumeInfo {
            name: spec.name.clone(),
            size_bytes: spec.size_bytes,
            extent_bytes: spec.extent_bytes,
            copies: spec.copies,
            weight: spec.weight,
            mapped_extents: mapped,
        })
    }

    /// A namespace's info.
    pub fn namespace_info(&self, ns: &Ns) -> pb::NamespaceInfo {
        let a = self.catalog.namespace(ns.id);
        pb::NamespaceInfo {
            id: ns.record.id.clone(),
            target: ns.record.target.clone(),
            address: ns.record.address.clone(),
            subnqn: ns.record.subnqn.clone(),
            nsid: ns.record.nsid,
            extents: ns.record.extents,
            extent_bytes: ns.record.extent_bytes,
            used_extents: a.map_or(0, |a| a.used_extents()),
            free_extents: a.map_or(0, |a| a.free_extents()),
        }
    }

    /// Creates `spec` in the catalog (capacity reserved) and registers it.
    pub fn add_volume(&mut self, spec: &EvolSpec) -> Result<VolumeId, Status> {
        let id = self.volume_id(&spec.name);
        self.catalog
            .create_volume(id, flint_volume_spec(spec))
            .map_err(flint_status)?;
        self.auction.set_volume_weight(id, spec.weight);
        self.volumes.insert(spec.name.clone(), (id, spec.clone()));
        // A delete of an earlier eVol of this name that never finished.
        self.delete_freed.remove(&spec.name);
        self.deleted.forget(&spec.name);
        Ok(id)
    }

    /// Forgets a volume created by [`Core::add_volume`] (its etcd write
    /// failed) or deleted.
    pub fn remove_volume(&mut self, name: &str) {
        if let Some((id, _)) = self.volumes.remove(name) {
            match self.catalog.delete_volume(id) {
                // Whatever was still mapped stays Zeroing in the catalog
                // (out of reuse) but has no zeroing record in etcd: only a
                // rebuild from etcd sorts it out. Deletes unmap first, so
                // this does not happen.
                Ok(freed) if !freed.is_empty() => log::error!(
                    "eVol {name}: {} physical extents still mapped when it was removed; kept out of reuse until the next election",
                    freed.len()
                ),
                _ => {}
            }
        }
    }

    /// `rec` is unmapped (durably; its `pext` keys are zeroing records):
    /// its physical extents wait for zeroing. Whether the catalog held
    /// the mapping (if not, only a rebuild from etcd knows its extents).
    pub fn unmapped(&mut self, vid: VolumeId, rec: &ExtentRecord) -> bool {
        let held = self.catalog.unmap(vid, LogicalExtent(rec.index)).is_ok();
        if held {
            for c in &rec.copies {
                self.zeroing.insert(
                    (c.namespace.clone(), c.pext),
                    PextRecord::freed_from(&rec.evol, rec.index),
                );
            }
        }
        held
    }

    /// A new namespace record, durable: into the catalog, or a rebuild is
    /// needed (it grew): returns whether one is.
    pub fn namespace_added(&mut self, rec: &NamespaceRecord) -> bool {
        if self.namespaces.contains_key(&rec.id) {
            self.register_namespace(rec);
            return true;
        }
        let id = self.register_namespace(rec);
        let target = self.targets[&rec.target];
        if let Err(e) = self.catalog.add_namespace(
            id,
            target,
            rec.extents * self.catalog.geometry().extent_bytes(),
        ) {
            log::error!("namespace {}: {e}", rec.id);
        }
        false
    }

    /// The session of (`client`, `evol`, the namespace's port), registered
    /// with the view and the auction on first sight.
    pub fn session(
        &mut self,
        client: &str,
        evol: &str,
        namespace: &str,
    ) -> Result<(SessionId, NamespaceId), Status> {
        let Some(ns) = self.namespaces.get(namespace) else {
            return Err(Status::not_found(format!("no namespace named {namespace}")));
        };
        let (ns_id, port) = (ns.id, ns.port);
        let Some((vid, _)) = self.volumes.get(evol) else {
            return Err(Status::not_found(format!("no eVol named {evol}")));
        };
        let vid = *vid;
        let key = (client.to_owned(), evol.to_owned(), port);
        if let Some(s) = self.sessions.get(&key) {
            return Ok((*s, ns_id));
        }
        if self.sessions.len() >= limits::MAX_SESSIONS {
            return Err(Status::resource_exhausted(format!(
                "the arbiter tracks at most {} sessions",
                limits::MAX_SESSIONS
            )));
        }
        let sid = SessionId(self.sessions.len() as u32);
        self.view
            .add_session(sid, SessionSpec { port, volume: vid })
            .map_err(flint_status)?;
        self.auction
            .add_session(sid, port, vid)
            .map_err(flint_status)?;
        self.sessions.insert(key, sid);
        self.session_names
            .insert(sid, format!("{client}/{evol}@{}", self.port_names[&port]));
        Ok((sid, ns_id))
    }

    /// The least an I/O costs in the auction's currency: the profile's
    /// bandwidth over its IOPS (`flint_core::auction::cost_bytes`).
    pub fn min_cost_bytes(&self) -> u64 {
        let p = &self.config.profile;
        p.read_bytes_per_sec / p.read_iops.max(1)
    }

    /// A ReportIo batch into the view.
    pub fn report_io(
        &mut self,
        now: Nanos,
        client: &str,
        evol: &str,
        vectors: &[pb::IoVector],
    ) -> Result<pb::ReportIoResponse, Status> {
        let max = self.view.config().max_batch;
        if vectors.len() > max {
            return Err(Status::invalid_argument(format!(
                "batch of {} I/O vectors is over the limit of {max}",
                vectors.len()
            )));
        }
        let mut batch = Vec::with_capacity(vectors.len());
        let mut unknown = 0;
        for v in vectors {
            if v.count > limits::MAX_VECTOR_COUNT {
                return Err(Status::invalid_argument(format!(
                    "an I/O vector sums {} I/Os; at most {}",
                    v.count,
                    limits::MAX_VECTOR_COUNT
                )));
            }
            let Ok((session, namespace)) = self.session(client, evol, &v.namespace) else {
                unknown += 1;
                continue;
            };
            batch.push(IoVector {
                session,
                namespace,
                kind: if v.kind == pb::IoKind::Write as i32 {
                    IoKind::Write
                } else {
                    IoKind::Read
                },
                bytes: v.bytes,
                latency_ns: v.latency_ns,
                count: v.count.max(1),
                completed_at: Nanos(now.as_nanos().saturating_sub(v.age_ns)),
            });
        }
        let ack = self.view.ingest(now, &batch).map_err(flint_status)?;
        Ok(pb::ReportIoResponse {
            accepted: ack.accepted as u32,
            stale: ack.stale as u32,
            unknown: (ack.unknown + unknown) as u32,
        })
    }

    /// Slice requests into the auction; grants granted at once go to the
    /// flows' mailboxes.
    pub fn request_slices(
        &mut self,
        now: Nanos,
        client: &str,
        evol: &str,
        namespaces: &[String],
        slices: u32,
    ) -> Result<Vec<(SessionId, NamespaceId)>, Status> {
        let mut flows = Vec::new();
        for ns in namespaces {
            let (session, namespace) = self.session(client, evol, ns)?;
            // The auction keeps one request per flow: ask again while each
            // is granted at once (deficit or unclaimed capacity), so one
            // round trip carries up to `slices`; the first refused stays
            // deferred for the next epoch.
            for _ in 0..slices.clamp(1, limits::MAX_SLICES_PER_REQUEST) {
                self.auction
                    .handle_request(now, SliceRequest { session, namespace })
                    .map_err(flint_status)?;
                if self
                    .auction
                    .flow(session, namespace)
                    .is_none_or(|f| f.pending)
                {
                    break;
                }
            }
            flows.push((session, namespace));
        }
        self.collect_grants();
        Ok(flows)
    }

    /// Moves the auction's grants to the flows' mailboxes; whether any.
    pub fn collect_grants(&mut self) -> bool {
        let mut any = false;
        while let Some(g) = self.auction.poll_grant() {
            let q = self.grants.entry((g.session, g.namespace)).or_default();
            if q.len() >= limits::MAX_PENDING_GRANTS {
                q.pop_front();
            }
            q.push_back(g);
            any = true;
        }
        any
    }

    /// Takes the unexpired grants of `flows`.
    pub fn take_grants(
        &mut self,
        now: Nanos,
        flows: &[(SessionId, NamespaceId)],
    ) -> Vec<pb::SliceGrant> {
        let mut out = Vec::new();
        for f in flows {
            if let Some(q) = self.grants.remove(f) {
                for g in q {
                    if g.expires_at > now {
                        out.push(pb::SliceGrant {
                            namespace: self.ns_names[&g.namespace].clone(),
                            bytes: g.bytes,
                            epoch: g.epoch,
                            valid_for_ns: g.expires_at.nanos_since(now),
                        });
                    }
                }
            }
        }
        out
    }

    /// Releases flows.
    pub fn release_slices(
        &mut self,
        client: &str,
        evol: &str,
        namespaces: &[String],
    ) -> Result<(), Status> {
        for ns in namespaces {
            let (session, namespace) = self.session(client, evol, ns)?;
            self.auction.handle_release(session, namespace);
            self.grants.remove(&(session, namespace));
        }
        Ok(())
    }

    /// A new Subscribe stream.
    pub fn subscribe(
        &mut self,
        req: &pb::SubscribeRequest,
        tx: tokio::sync::mpsc::Sender<Result<pb::ViewNotification, Status>>,
    ) -> Result<(), Status> {
        if self.subscribers.len() >= limits::MAX_SUBSCRIBERS {
            return Err(Status::resource_exhausted(format!(
                "at most {} Subscribe streams at once",
                limits::MAX_SUBSCRIBERS
            )));
        }
        let mut conditions = Vec::new();
        for s in &req.subscriptions {
            let c = match &s.condition {
                Some(pb::subscription::Condition::HeadroomBelow(h)) => {
                    let Some(ns) = self.namespaces.get(&h.namespace) else {
                        return Err(Status::not_found(format!(
                            "no namespace named {}",
                            h.namespace
                        )));
                    };
                    Condition::HeadroomBelow {
                        namespace: ns.id,
                        fraction: h.fraction,
                    }
                }
                Some(pb::subscription::Condition::PortUtilizationAbove(p)) => {
                    let Some((port, _)) = self.ports.get(&p.address) else {
                        return Err(Status::not_found(format!(
                            "no target port {} in the pool",
                            p.address
                        )));
                    };
                    Condition::PortUtilizationAbove {
                        port: *port,
                        fraction: p.fraction,
                    }
                }
                None => {
                    return Err(Status::invalid_argument(
                        "a subscription without a condition",
                    ))
                }
            };
            conditions.push(c);
        }
        let id = SubscriberId(self.next_subscriber);
        self.next_subscriber += 1;
        let mut subs = BTreeMap::new();
        for (i, c) in conditions.into_iter().enumerate() {
            subs.insert(self.view.subscribe(id, c), i as u32);
        }
        self.subscribers.insert(
            id,
            Subscriber {
                tx,
                subs,
                reports: req.bottleneck_reports,
            },
        );
        Ok(())
    }

    /// The bottleneck report with names.
    pub fn report(&self, r: &BottleneckReport) -> pb::BottleneckReport {
        pb::BottleneckReport {
            epoch: r.epoch,
            congested_namespaces: r
                .congested_namespaces
                .iter()
                .filter_map(|n| self.ns_names.get(n).cloned())
                .collect(),
            congested_ports: r
                .congested_ports
                .iter()
                .filter_map(|p| self.port_names.get(p).cloned())
                .collect(),
            victims: r
                .victims
                .keys()
                .filter_map(|s| self.session_names.get(s).cloned())
                .collect(),
        }
    }

    /// Epoch ends of the view and the auction; notifications out. Whether
    /// grants arrived.
    pub fn tick(&mut self, now: Nanos) -> bool {
        let closed = self.view.handle_timeout(now);
        self.auction.handle_timeout(now);
        let mut gone = BTreeSet::new();
        while let Some(n) = self.view.poll_notification() {
            let Some(s) = self.subscribers.get(&n.subscriber) else {
                continue;
            };
            let msg = pb::ViewNotification {
                what: Some(pb::view_notification::What::Condition(
                    pb::ConditionChange {
                        subscription: s.subs.get(&n.subscription).copied().unwrap_or(0),
                        holds: n.holds,
                        value: n.value,
                        epoch: n.epoch,
                    },
                )),
            };
            if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) = s.tx.try_send(Ok(msg)) {
                gone.insert(n.subscriber);
            }
        }
        if closed > 0 {
            let r = self.view.last_report().clone();
            let changed = r.congested_namespaces != self.last_report.congested_namespaces
                || r.congested_ports != self.last_report.congested_ports
                || r.victims.keys().ne(self.last_report.victims.keys());
            if changed {
                let msg = self.report(&r);
                for (id, s) in &self.subscribers {
                    if s.reports {
                        let m = pb::ViewNotification {
                            what: Some(pb::view_notification::What::Report(msg.clone())),
                        };
                        if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) =
                            s.tx.try_send(Ok(m))
                        {
                            gone.insert(*id);
                        }
                    }
                }
            }
            self.last_report = r;
        }
        for (id, s) in &self.subscribers {
            if s.tx.is_closed() {
                gone.insert(*id);
            }
        }
        for id in gone {
            self.view.unsubscribe_all(id);
            self.subscribers.remove(&id);
        }
        self.collect_grants()
    }

    /// When the next epoch of the view or the auction ends.
    pub fn next_timeout(&self) -> Nanos {
        self.view.poll_timeout().min(self.auction.poll_timeout())
    }
}

fn flint_volume_spec(spec: &EvolSpec) -> VolumeSpec {
    VolumeSpec {
        size_bytes: spec.size_bytes,
        copies: spec.copies.min(u32::from(u8::MAX)) as u8,
        allowed_namespaces: None,
        preference: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_deletes_are_kept_for_a_while_and_bounded() {
        let at = |s: u64| Nanos(s * 1_000_000_000);
        let mut d = FinishedDeletes::default();
        d.remember("v", 4, at(10));
        assert_eq!(d.get("v", at(10)), Some(4));
        assert_eq!(d.get("v", at(129)), Some(4));
        assert_eq!(d.get("v", at(130)), None, "older than DELETED_MEMORY");
        assert_eq!(d.get("w", at(10)), None);
        d.forget("v");
        assert_eq!(d.get("v", at(11)), None, "created again");
        // The oldest go first once DELETED_MAX are kept.
        for i in 0..DELETED_MAX as u64 + 1 {
            d.remember(&format!("e{i}"), i, Nanos(at(200).0 + i));
        }
        assert_eq!(d.0.len(), DELETED_MAX);
        assert_eq!(d.get("e0", at(201)), None);
        assert_eq!(d.get("e1", at(201)), Some(1));
        // Expired ones are dropped when the next is remembered.
        d.remember("late", 9, at(400));
        assert_eq!(d.0.len(), 1);
    }
}
