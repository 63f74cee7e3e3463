//! The arbiter daemon: election, the RPC service and the epoch timer.
//!
//! - **Election** (a thread of its own, blocking etcd calls): while no
//!   leader key exists, grant a lease of `lease_ttl` and campaign
//!   ([`cluster_store::Store::campaign`]); on winning, read the whole pool
//!   ([`cluster_store::Store::read_pool`]) into flint-core's catalog and
//!   only then serve. The leader renews its lease every `lease_ttl / 3`.
//!   It stops serving mutations the moment its lease may have expired
//!   (the last successful renewal plus the TTL it granted is in the
//!   past), when a renewal says the lease is gone, or when a guarded
//!   transaction finds another leader; etcd's guard makes a deposed
//!   leader's writes fail even before it notices.
//! - **RPC**: tonic; every call that mutates or needs the leader's memory
//!   goes through [`Shared::leading`], whose refusal names the leader.
//!   etcd calls run on the blocking pool, each on a [`cluster_store::Store`]
//!   taken from a small pool (the store is a blocking client with its own
//!   runtime), so allocations of distinct extents proceed in parallel.
//! - **Timer**: a task closes the view's and the auction's epochs at their
//!   `poll_timeout`, passing `now` (time since start).
//! - **Zeroing** ([`zeroing`]): a task zeroes the physical extents that
//!   unmaps freed (zeroing records in etcd, Zeroing in the catalog) and
//!   only then frees them, in etcd and in the catalog.

mod core;
mod zeroing;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cluster_store::evol::{
    ChangeOutcome, EvolKeys, EvolSpec, LeaderRecord, Leadership, MapOutcome, NamespaceRecord,
};
use cluster_store::records::SCHEMA;
use cluster_store::{Store, StoreConfig, StoreError};
use flint_core::Nanos;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use self::core::{Core, Planned};
use crate::config::ArbiterConfig;
use crate::limits;
use crate::pb;
use crate::pb::arbiter_server::{Arbiter, ArbiterServer};

/// Attempts of one Allocate against lost races (a physical extent taken
/// by a writer this leader did not know of) before it gives up.
const ALLOCATE_ATTEMPTS: usize = 8;

/// Most etcd clients kept for the RPC handlers.
const STORE_POOL: usize = 16;

/// Who this instance is now.
#[derive(Clone)]
enum Role {
    /// Not leading; the leader if one is known.
    Standby(Option<LeaderRecord>),
    /// Leading with `lead` until `until` unless renewed.
    Leading {
        lead: Leadership,
        until: Instant,
        record: LeaderRecord,
    },
}

/// Counters for status and metrics.
#[derive(Default)]
struct Counters {
    allocations: AtomicU64,
    allocations_new: AtomicU64,
    allocation_retries: AtomicU64,
    refused_not_leader: AtomicU64,
    elections_won: AtomicU64,
    zeroed: AtomicU64,
    zeroing_failures: AtomicU64,
}

/// One lock per logical extent being allocated, by (eVol, index).
type ExtentLocks = HashMap<(String, u64), Arc<tokio::sync::Mutex<()>>>;

/// State shared by the election thread, the RPC handlers and the timer.
pub struct Shared {
    config: ArbiterConfig,
    keys: EvolKeys,
    advertise: String,
    role: RwLock<Role>,
    core: Mutex<Option<Core>>,
    stores: Mutex<Vec<Store>>,
    extent_locks: Mutex<ExtentLocks>,
    admin: tokio::sync::Mutex<()>,
    grants: tokio::sync::Notify,
    zeroers: Mutex<zeroing::Slots>,
    zeroing_wake: tokio::sync::Notify,
    started: Instant,
    counters: Counters,
    stop: AtomicBool,
}

fn store_config(config: &ArbiterConfig) -> StoreConfig {
    StoreConfig {
        endpoints: config.etcd.endpoints.clone(),
        op_timeout: config.etcd.op_timeout,
    }
}

fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("etcd: {e}"))
}

/// Runs the body of an RPC that changes state to its end, in a task of its
/// own. tonic drops a handler's future when its caller goes away (a
/// deadline, a reset stream); dropped between an etcd commit and the
/// catalog's update of it, a body would leave the two apart: an
/// allocation's plan tentative for good (deletes of its eVol then wait for
/// it in vain), a delete's unmapped extents missing from the zeroing queue
/// until the next election. The caller's retry queues on the same locks
/// and finds the work done.
async fn to_the_end<T: Send + 'static>(
    body: impl std::future::Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    tokio::spawn(body)
        .await
        .map_err(|e| Status::internal(format!("handler task: {e}")))?
}

impl Shared {
    fn now(&self) -> Nanos {
        Nanos(self.started.elapsed().as_nanos() as u64)
    }

    /// The leadership if this instance leads now, else the refusal that
    /// names the leader.
    fn leading(&self) -> Result<Leadership, Status> {
        let role = self.role.read().unwrap_or_else(|p| p.into_inner()).clone();
        match role {
            Role::Leading { lead, until, .. } if Instant::now() < until => Ok(lead),
            Role::Leading { .. } => {
                self.counters
                    .refused_not_leader
                    .fetch_add(1, Ordering::Relaxed);
                Err(Status::unavailable(
                    "this arbiter's lease may have expired (etcd unreachable); it no longer serves; retry",
                ))
            }
            Role::Standby(leader) => {
                self.counters
                    .refused_not_leader
                    .fetch_add(1, Ordering::Relaxed);
                Err(not_leader(&self.config.id, leader.as_ref()))
            }
        }
    }

    /// Stops leading at once (a guarded write found another leader).
    fn depose(&self, why: &str) {
        let mut role = self.role.write().unwrap_or_else(|p| p.into_inner());
        if matches!(*role, Role::Leading { .. }) {
            log::warn!("no longer leading: {why}");
            *role = Role::Standby(None);
            drop(role);
            *self.core.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// Runs `f` on the core if leading.
    fn with_core<T>(&self, f: impl FnOnce(&mut Core) -> Result<T, Status>) -> Result<T, Status> {
        let lead = self.leading()?;
        let mut guard = self.core.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(c) if c.lead == lead => f(c),
            _ => Err(Status::unavailable("leadership changing; retry")),
        }
    }

    /// Runs a blocking etcd call on a pooled client.
    async fn etcd<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Store, &EvolKeys) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, Status> {
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let store = me.stores.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let store = match store {
                Some(s) => s,
                None => Store::connect(store_config(&me.config)).map_err(unavailable)?,
            };
            let r = f(&store, &me.keys);
            let mut pool = me.stores.lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < STORE_POOL {
                pool.push(store);
            }
            r.map_err(|e| match e {
                StoreError::BadRecord { .. } | StoreError::Mismatch { .. } => {
                    Status::invalid_argument(e.to_string())
                }
                StoreError::Contended { .. } => Status::aborted(e.to_string()),
                e => unavailable(e),
            })
        })
        .await
        .map_err(|e| Status::internal(format!("etcd task: {e}")))?
    }

    fn extent_lock(&self, evol: &str, index: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.extent_locks.lock().unwrap_or_else(|p| p.into_inner());
        // Drop locks nobody holds or waits for, so the table stays the size
        // of the allocations in flight.
        if locks.len() > 1024 {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        Arc::clone(locks.entry((evol.to_owned(), index)).or_default())
    }

    /// The refusal of a guarded change that found `what` not as this
    /// leader holds it (`Changed`: reread the pool, so that the caller's
    /// retry works from etcd's state) or another leader (`NotLeader`:
    /// stop leading).
    async fn stale(self: &Arc<Self>, outcome: ChangeOutcome, what: &str) -> Status {
        if outcome == ChangeOutcome::NotLeader {
            self.depose(&format!("changing {what} found another leader"));
            return self
                .leading()
                .err()
                .unwrap_or_else(|| Status::unavailable("leadership lost; retry"));
        }
        log::warn!("{what} in etcd is not the one this arbiter held; reloading the pool");
        match self.reload().await {
            Ok(()) => Status::aborted(format!(
                "{what} changed in etcd; the pool is read again; retry"
            )),
            Err(e) => e,
        }
    }

    /// Reads the pool again and rebuilds the catalog (after a grow, or a
    /// physical extent taken by a writer this leader did not know of).
    async fn reload(self: &Arc<Self>) -> Result<(), Status> {
        let pool = self.etcd(|s, k| s.read_pool(k)).await?;
        self.with_core(|c| {
            c.rebuild(&pool);
            Ok(())
        })
    }

    /// Allocate: see the RPC's documentation.
    async fn allocate(
        self: &Arc<Self>,
        evol: &str,
        index: u64,
    ) -> Result<pb::AllocateResponse, Status> {
        limits::check_name("evol", evol).map_err(Status::invalid_argument)?;
        self.leading()?;
        let lock = self.extent_lock(evol, index);
        // One request per extent at a time: a second request for the same
        // extent waits, then finds the first one's durable mapping.
        let _held = lock.lock().await;
        self.counters.allocations.fetch_add(1, Ordering::Relaxed);
        for attempt in 0..ALLOCATE_ATTEMPTS {
            if attempt > 0 {
                self.counters
                    .allocation_retries
                    .fetch_add(1, Ordering::Relaxed);
            }
            let (lead, planned) = {
                let lead = self.leading()?;
                let planned = self.with_core(|c| c.plan(evol, index))?;
                (lead, planned)
            };
            let (plan, record) = match planned {
                Planned::Existing(rec) => return Ok(answer(rec, false)),
                Planned::New(plan, record) => (plan, record),
            };
            let (e, i, copies) = (evol.to_owned(), index, record.copies.clone());
            let outcome = self
                .etcd(move |s, k| s.map_extent(k, lead, &e, i, &copies))
                .await;
            // What to do next, decided with the core locked (never held
            // across an await, nor while deposing, which locks it too).
            enum Next {
                Answer(pb::AllocateResponse),
                Deposed,
                Fail(Status),
                Retry,
                Reload,
            }
            let next = {
                let mut guard = self.core.lock().unwrap_or_else(|p| p.into_inner());
                let core = guard.as_mut().filter(|c| c.lead == lead);
                match outcome {
                    Ok(MapOutcome::Mapped(rec)) => {
                        if let Some(c) = core {
                            c.commit(&plan);
                        }
                        self.counters
                            .allocations_new
                            .fetch_add(1, Ordering::Relaxed);
                        Next::Answer(answer(rec, true))
                    }
                    Ok(MapOutcome::AlreadyMapped(rec)) => {
                        if let Some(c) = core {
                            c.rollback(&plan);
                            c.adopt(&rec);
                        }
                        Next::Answer(answer(rec, false))
                    }
                    Ok(MapOutcome::PextTaken(p)) => {
                        if let Some(c) = core {
                            c.rollback(&plan);
                        }
                        log::warn!(
                            "eVol {evol} extent {index}: physical extent {} of {} is taken by a mapping this arbiter did not know of; reloading the pool",
                            p.pext,
                            p.namespace
                        );
                        Next::Reload
                    }
                    Ok(MapOutcome::NotLeader) => {
                        if let Some(c) = core {
                            c.rollback(&plan);
                        }
                        Next::Deposed
                    }
                    Err(e) => {
                        // The transaction may or may not have committed:
                        // the catalog forgets the plan; a retry finds the
                        // mapping (AlreadyMapped) if it did.
                        if let Some(c) = core {
                            c.rollback(&plan);
                        }
                        if e.code() == tonic::Code::Aborted {
                            Next::Retry
                        } else {
                            Next::Fail(e)
                        }
                    }
                }
            };
            match next {
                Next::Answer(a) => return Ok(a),
                Next::Fail(e) => return Err(e),
                Next::Retry => continue,
                Next::Deposed => {
                    self.depose("a guarded extent mapping found another leader");
                    return Err(self
                        .leading()
                        .err()
                        .unwrap_or_else(|| Status::unavailable("leadership lost; retry")));
                }
                Next::Reload => {}
            }
            self.reload().await?;
        }
        Err(Status::aborted(format!(
            "eVol {evol} extent {index}: lost {ALLOCATE_ATTEMPTS} races for physical extents; retry"
        )))
    }
}

fn answer(rec: cluster_store::evol::ExtentRecord, newly_mapped: bool) -> pb::AllocateResponse {
    pb::AllocateResponse {
        evol: rec.evol,
        index: rec.index,
        copies: rec
            .copies
            .into_iter()
            .map(|c| pb::Copy {
                namespace: c.namespace,
                pext: c.pext,
            })
            .collect(),
        newly_mapped,
    }
}

/// The refusal of an instance that does not lead.
fn not_leader(me: &str, leader: Option<&LeaderRecord>) -> Status {
    match leader {
        Some(l) => {
            let mut s = Status::failed_precondition(format!(
                "arbiter {me} is not the leader; the leader is {} at {}",
                l.id, l.address
            ));
            if let Ok(v) = l.address.parse() {
                s.metadata_mut().insert(crate::LEADER_METADATA, v);
            }
            s
        }
        None => Status::unavailable(format!(
            "arbiter {me} is not the leader and no leader is elected yet; retry"
        )),
    }
}

/// The election loop (runs on a thread of its own until `stop`).
fn elect(shared: &Arc<Shared>) {
    let cfg = &shared.config;
    let ttl = cfg.etcd.lease_ttl;
    let period = ttl / 3;
    let poll = period.min(Duration::from_millis(500));
    let store = loop {
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        match Store::connect(store_config(cfg)) {
            Ok(s) => break s,
            Err(e) => {
                log::warn!("etcd: {e}; retrying");
                std::thread::sleep(poll);
            }
        }
    };
    let mut lease: Option<i64> = None;
    let sleep = |d: Duration| {
        let end = Instant::now() + d;
        while Instant::now() < end && !shared.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20).min(d));
        }
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let role = shared
            .role
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match role {
            Role::Standby(_) => {
                if let Some(l) = lease.take() {
                    // Deposed by a guarded write: give the lease back.
                    let _ = store.revoke(l);
                }
                match store.leader(&shared.keys) {
                    Ok(Some(rec)) => {
                        *shared.role.write().unwrap_or_else(|p| p.into_inner()) =
                            Role::Standby(Some(rec));
                        sleep(poll);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        log::warn!("reading the leader key: {e}");
                        sleep(poll);
                        continue;
                    }
                }
                let granted_at = Instant::now();
                let id = match store.grant_lease(ttl) {
                    Ok(id) => id,
                    Err(e) => {
                        log::warn!("granting a lease: {e}");
                        sleep(poll);
                        continue;
                    }
                };
                let me = LeaderRecord {
                    schema: SCHEMA,
                    id: cfg.id.clone(),
                    address: shared.advertise.clone(),
                    lease: id,
                };
                match store.campaign(&shared.keys, &me) {
                    Ok(Some(lead)) => match store.read_pool(&shared.keys) {
                        Ok(pool) => match Core::new(cfg, lead, &pool, shared.now()) {
                            Ok(core) => {
                                *shared.core.lock().unwrap_or_else(|p| p.into_inner()) = Some(core);
                                *shared.role.write().unwrap_or_else(|p| p.into_inner()) =
                                    Role::Leading {
                                        lead,
                                        until: granted_at + ttl,
                                        record: me,
                                    };
                                lease = Some(id);
                                shared
                                    .counters
                                    .elections_won
                                    .fetch_add(1, Ordering::Relaxed);
                                log::info!(
                                    "leading (leader key revision {}): {} namespaces, {} eVols, {} extents mapped, {} physical extents waiting for zeroing",
                                    lead.revision,
                                    pool.namespaces.len(),
                                    pool.evols.len(),
                                    pool.extents.len(),
                                    pool.zeroing.len()
                                );
                                shared.zeroing_wake.notify_one();
                            }
                            Err(e) => {
                                log::error!("cannot build the catalog: {e}");
                                let _ = store.revoke(id);
                                sleep(poll);
                            }
                        },
                        Err(e) => {
                            log::warn!(
                                "won the election but cannot read the pool: {e}; stepping down"
                            );
                            let _ = store.revoke(id);
                            sleep(poll);
                        }
                    },
                    Ok(None) => {
                        let _ = store.revoke(id);
                    }
                    Err(e) => {
                        log::warn!("campaign: {e}");
                        let _ = store.revoke(id);
                        sleep(poll);
                    }
                }
            }
            Role::Leading { until, .. } => {
                sleep(period);
                if shared.stop.load(Ordering::Relaxed) {
                    break;
                }
                let Some(l) = lease else {
                    shared.depose("no lease");
                    continue;
                };
                let sent = Instant::now();
                match store.keep_alive(l) {
                    Ok(Some(left)) => {
                        let mut role = shared.role.write().unwrap_or_else(|p| p.into_inner());
                        if let Role::Leading { until, .. } = &mut *role {
                            *until = sent + Duration::from_secs(left.max(0) as u64);
                        }
                    }
                    Ok(None) => shared.depose("the lease expired"),
                    Err(e) => {
                        if Instant::now() >= until {
                            shared
                                .depose(&format!("cannot renew the lease before it ran out: {e}"));
                        } else {
                            log::warn!("renewing the lease: {e}");
                        }
                    }
                }
            }
        }
    }
    if let Some(l) = lease {
        // A clean stop hands over at once instead of after the TTL.
        let _ = store.revoke(l);
        log::info!("stopped; leadership released");
    }
}

/// The epoch timer (runs until `stop`).
async fn tick(shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        let next = {
            let guard = shared.core.lock().unwrap_or_else(|p| p.into_inner());
            guard.as_ref().map(|c| c.next_timeout())
        };
        let wait = match next {
            None => Duration::from_millis(100),
            Some(t) => Duration::from_nanos(t.nanos_since(shared.now())),
        };
        tokio::time::sleep(wait.clamp(Duration::from_millis(1), Duration::from_millis(100))).await;
        let now = shared.now();
        let granted = {
            let mut guard = shared.core.lock().unwrap_or_else(|p| p.into_inner());
            guard.as_mut().is_some_and(|c| c.tick(now))
        };
        if granted {
            shared.grants.notify_waiters();
        }
    }
}

/// The gRPC service.
#[derive(Clone)]
struct Service(Arc<Shared>);

type NotificationStream =
    Pin<Box<dyn Stream<Item = Result<pb::ViewNotification, Status>> + Send + 'static>>;

fn check_names(what: &str, names: &[String], max: usize) -> Result<(), Status> {
    if names.len() > max {
        return Err(Status::invalid_argument(format!(
            "{} {what} is over the limit of {max}",
            names.len()
        )));
    }
    for n in names {
        limits::check_name(what, n).map_err(Status::invalid_argument)?;
    }
    Ok(())
}

#[tonic::async_trait]
impl Arbiter for Service {
    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::VolumeInfo>, Status> {
        let r = req.into_inner();
        limits::check_name("volume", &r.name).map_err(Status::invalid_argument)?;
        if r.size_bytes == 0 || r.size_bytes > 1 << 60 {
            return Err(Status::invalid_argument("size_bytes must be 1 B..=1 EiB"));
        }
        if r.copies == 0 || r.copies > limits::MAX_COPIES {
            return Err(Status::invalid_argument(format!(
                "copies must be 1..={}",
                limits::MAX_COPIES
            )));
        }
        let s = Arc::clone(&self.0);
        to_the_end(async move {
            let s = &s;
            let _admin = s.admin.lock().await;
            let lead = s.leading()?;
            let eb = s.config.extent_bytes;
            let spec = EvolSpec {
                schema: SCHEMA,
                name: r.name.clone(),
                size_bytes: r.size_bytes.div_ceil(eb) * eb,
                extent_bytes: eb,
                copies: r.copies,
                weight: r.weight.max(1),
            };
            let existing = s.with_core(|c| Ok(c.volumes.get(&r.name).map(|(_, sp)| sp.clone())))?;
            if let Some(old) = existing {
                if old == spec {
                    return s
                        .with_core(|c| Ok(Response::new(c.volume_info(&r.name).expect("exists"))));
                }
                return Err(Status::already_exists(format!(
                    "eVol {} exists with another spec ({} bytes, {} copies, weight {})",
                    r.name, old.size_bytes, old.copies, old.weight
                )));
            }
            s.with_core(|c| c.add_volume(&spec).map(|_| ()))?;
            let sp = spec.clone();
            let written = s.etcd(move |st, k| st.create_evol(k, lead, &sp)).await;
            let undo = |s: &Shared| {
                let _ = s.with_core(|c| {
                    c.remove_volume(&r.name);
                    Ok(())
                });
            };
            match written {
                Ok(Some(stored)) if stored == spec => {
                    log::info!(
                        "eVol {} created ({} bytes, {} copies)",
                        spec.name,
                        spec.size_bytes,
                        spec.copies
                    );
                    s.with_core(|c| Ok(Response::new(c.volume_info(&r.name).expect("exists"))))
                }
                Ok(Some(stored)) => {
                    undo(s);
                    Err(Status::already_exists(format!(
                        "eVol {} exists with another spec ({} bytes, {} copies)",
                        r.name, stored.size_bytes, stored.copies
                    )))
                }
                Ok(None) => {
                    undo(s);
                    s.depose("creating an eVol found another leader");
                    Err(s
                        .leading()
                        .err()
                        .unwrap_or_else(|| Status::unavailable("retry")))
                }
                Err(e) => {
                    undo(s);
                    Err(e)
                }
            }
        })
        .await
    }

    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let r = req.into_inner();
        limits::check_name("volume", &r.name).map_err(Status::invalid_argument)?;
        let s = Arc::clone(&self.0);
        to_the_end(async move {
            let s = &s;
            let _admin = s.admin.lock().await;
            let lead = s.leading()?;
            let now = s.now();
            let done = s.with_core(|c| {
                if c.volumes.contains_key(&r.name) {
                    Ok(None)
                } else if let Some(freed) = c.deleted.get(&r.name, now) {
                    Ok(Some(freed))
                } else {
                    Err(Status::not_found(format!("no eVol named {}", r.name)))
                }
            })?;
            if let Some(freed_extents) = done {
                return Ok(Response::new(pb::DeleteVolumeResponse { freed_extents }));
            }
            // A host serving the eVol would go on writing to its extents after
            // they are freed, zeroed and mapped to another volume.
            let name = r.name.clone();
            let owners = s.etcd(move |st, k| st.evol_owners(k, &name)).await?;
            if let Some((device, owner)) = owners.first() {
                if !r.force {
                    return Err(Status::failed_precondition(format!(
                        "eVol {} is attached by host {} (device {device}); stop it there first (deleting with force lets that host's writes land in extents reused by other volumes)",
                        r.name,
                        owner.describe()
                    )));
                }
                log::warn!(
                    "eVol {}: deleting with force although host {} (device {device}) serves it",
                    r.name,
                    owner.describe()
                );
            }
            let (vid, spec) = s.with_core(|c| {
                let v = c
                    .volumes
                    .get(&r.name)
                    .cloned()
                    .ok_or_else(|| Status::not_found(format!("no eVol named {}", r.name)))?;
                c.deleting.insert(r.name.clone());
                Ok(v)
            })?;
            // Allocations already past the check finish first.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let busy = s.with_core(|c| Ok(c.tentative.keys().any(|(v, _)| *v == vid)))?;
                if !busy {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = s.with_core(|c| Ok(c.deleting.remove(&r.name)));
                    return Err(Status::aborted(
                        "allocations in flight did not finish; retry",
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The mappings in etcd, not the catalog's: an allocation whose
            // answer was lost may have committed a mapping the catalog rolled
            // back; left behind, it would survive the spec and expose its data
            // to the next eVol of this name.
            let name = r.name.clone();
            let records = match s.etcd(move |st, k| st.read_extents(k, &name)).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = s.with_core(|c| Ok(c.deleting.remove(&r.name)));
                    return Err(e);
                }
            };
            // What this delete frees is fixed by its first attempt's read, made
            // with the eVol `deleting` (no new mappings): a retry after an
            // error finds fewer mappings and keeps the first count.
            let total: u64 = records.iter().map(|rec| rec.copies.len() as u64).sum();
            s.with_core(|c| {
                c.delete_freed.entry(r.name.clone()).or_insert(total);
                Ok(())
            })?;
            let mut unknown = false;
            // Every step may be retried after a lost answer (the client sends
            // the delete again; etcd may have committed): AlreadyDone counts
            // as done. After an error the eVol stays `deleting` (some extents
            // may be unmapped already): no allocation until a retry finishes.
            for rec in records {
                let rc = rec.clone();
                let outcome = s.etcd(move |st, k| st.unmap_extent(k, lead, &rc)).await;
                match outcome {
                    Ok(ChangeOutcome::Done | ChangeOutcome::AlreadyDone) => {
                        s.with_core(|c| {
                            unknown |= !c.unmapped(vid, &rec);
                            Ok(())
                        })?;
                        s.zeroing_wake.notify_one();
                    }
                    Ok(other) => {
                        return Err(s
                            .stale(
                                other,
                                &format!("eVol {} extent {}'s mapping", r.name, rec.index),
                            )
                            .await);
                    }
                    Err(e) => return Err(e),
                }
            }
            let sp = spec.clone();
            let outcome = s.etcd(move |st, k| st.delete_evol(k, lead, &sp)).await;
            match outcome? {
                ChangeOutcome::Done | ChangeOutcome::AlreadyDone => {
                    let now = s.now();
                    let freed = s.with_core(|c| {
                        c.remove_volume(&r.name);
                        c.deleting.remove(&r.name);
                        let freed = c.delete_freed.remove(&r.name).unwrap_or(0);
                        c.deleted.remember(&r.name, freed, now);
                        Ok(freed)
                    })?;
                    if unknown {
                        // Mappings the catalog did not hold: their physical
                        // extents wait for zeroing in etcd; read them in.
                        log::warn!(
                            "eVol {}: etcd held mappings this arbiter did not (an allocation's answer was lost); reloading the pool",
                            r.name
                        );
                        s.reload().await?;
                    }
                    log::info!(
                        "eVol {} deleted ({freed} physical extents freed; they are zeroed before reuse)",
                        r.name
                    );
                    Ok(Response::new(pb::DeleteVolumeResponse {
                        freed_extents: freed,
                    }))
                }
                other => Err(s.stale(other, &format!("eVol {}'s spec", r.name)).await),
            }
        })
        .await
    }

    async fn grow_volume(
        &self,
        req: Request<pb::GrowVolumeRequest>,
    ) -> Result<Response<pb::VolumeInfo>, Status> {
        let r = req.into_inner();
        limits::check_name("volume", &r.name).map_err(Status::invalid_argument)?;
        if r.size_bytes > 1 << 60 {
            return Err(Status::invalid_argument("size_bytes must be at most 1 EiB"));
        }
        let s = Arc::clone(&self.0);
        to_the_end(async move {
            let s = &s;
            let _admin = s.admin.lock().await;
            let lead = s.leading()?;
            let (old, unreserved) = s.with_core(|c| {
                let (_, spec) = c
                    .volumes
                    .get(&r.name)
                    .cloned()
                    .ok_or_else(|| Status::not_found(format!("no eVol named {}", r.name)))?;
                Ok((spec, c.catalog.unreserved_extents()))
            })?;
            let eb = old.extent_bytes;
            let size = r.size_bytes.div_ceil(eb) * eb;
            if size < old.size_bytes {
                return Err(Status::invalid_argument(format!(
                    "eVols never shrink: {} is {} bytes, asked {}",
                    r.name, old.size_bytes, r.size_bytes
                )));
            }
            if size > old.size_bytes {
                let extra = (size - old.size_bytes) / eb * u64::from(old.copies);
                if extra > unreserved {
                    return Err(Status::resource_exhausted(format!(
                        "growing {} needs {extra} more extents, {unreserved} are unreserved",
                        r.name
                    )));
                }
                let new = EvolSpec {
                    size_bytes: size,
                    ..old.clone()
                };
                let (o, n) = (old.clone(), new.clone());
                match s.etcd(move |st, k| st.update_evol(k, lead, &o, &n)).await? {
                    ChangeOutcome::Done | ChangeOutcome::AlreadyDone => {}
                    other => return Err(s.stale(other, &format!("eVol {}'s spec", r.name)).await),
                }
                log::info!("eVol {} grown to {size} bytes", r.name);
                s.reload().await?;
            }
            s.with_core(|c| {
                c.volume_info(&r.name)
                    .map(Response::new)
                    .ok_or_else(|| Status::internal("the grown eVol is not in the catalog"))
            })
        })
        .await
    }

    async fn list_volumes(
        &self,
        _req: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        self.0.with_core(|c| {
            let volumes = c.volumes.keys().filter_map(|n| c.volume_info(n)).collect();
            Ok(Response::new(pb::ListVolumesResponse { volumes }))
        })
    }

    async fn add_namespace(
        &self,
        req: Request<pb::AddNamespaceRequest>,
    ) -> Result<Response<pb::NamespaceInfo>, Status> {
        let r = req.into_inner();
        limits::check_name("namespace", &r.id).map_err(Status::invalid_argument)?;
        limits::check_name("target", &r.target).map_err(Status::invalid_argument)?;
        limits::check_text("address", &r.address).map_err(Status::invalid_argument)?;
        limits::check_text("subnqn", &r.subnqn).map_err(Status::invalid_argument)?;
        if r.nsid == 0 || r.nsid == u32::MAX {
            return Err(Status::invalid_argument("nsid must be 1..=0xfffffffe"));
        }
        let s = Arc::clone(&self.0);
        to_the_end(async move {
            let s = &s;
            let eb = s.config.extent_bytes;
            let extents = if r.extents > 0 {
                r.extents
            } else {
                r.capacity_bytes / eb
            };
            if extents == 0 || extents > 1 << 40 {
                return Err(Status::invalid_argument(format!(
                    "capacity of {extents} extents of {eb} bytes: must be 1..=2^40 (give extents or capacity_bytes)"
                )));
            }
            let _admin = s.admin.lock().await;
            let lead = s.leading()?;
            let rec = NamespaceRecord {
                schema: SCHEMA,
                id: r.id.clone(),
                target: r.target,
                address: r.address,
                subnqn: r.subnqn,
                nsid: r.nsid,
                extents,
                extent_bytes: eb,
            };
            let rc = rec.clone();
            if !s.etcd(move |st, k| st.put_namespace(k, lead, &rc)).await? {
                s.leading()?;
                return Err(Status::aborted(
                    "the namespace's record changed in etcd; retry",
                ));
            }
            log::info!("namespace {} in the pool ({extents} extents)", rec.id);
            let rebuild = s.with_core(|c| Ok(c.namespace_added(&rec)))?;
            if rebuild {
                s.reload().await?;
            }
            s.with_core(|c| Ok(Response::new(c.namespace_info(&c.namespaces[&rec.id]))))
        })
        .await
    }

    async fn list_namespaces(
        &self,
        _req: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        self.0.with_core(|c| {
            let namespaces = c.namespaces.values().map(|n| c.namespace_info(n)).collect();
            Ok(Response::new(pb::ListNamespacesResponse { namespaces }))
        })
    }

    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let r = req.into_inner();
        let s = Arc::clone(&self.0);
        to_the_end(async move { s.allocate(&r.evol, r.index).await })
            .await
            .map(Response::new)
    }

    async fn report_io(
        &self,
        req: Request<pb::ReportIoRequest>,
    ) -> Result<Response<pb::ReportIoResponse>, Status> {
        let r = req.into_inner();
        limits::check_name("client", &r.client).map_err(Status::invalid_argument)?;
        limits::check_name("evol", &r.evol).map_err(Status::invalid_argument)?;
        if r.vectors.len() > limits::MAX_REPORT_BATCH {
            return Err(Status::invalid_argument(format!(
                "batch of {} I/O vectors is over the limit of {}",
                r.vectors.len(),
                limits::MAX_REPORT_BATCH
            )));
        }
        let now = self.0.now();
        self.0
            .with_core(|c| c.report_io(now, &r.client, &r.evol, &r.vectors))
            .map(Response::new)
    }

    async fn query_view(
        &self,
        req: Request<pb::QueryViewRequest>,
    ) -> Result<Response<pb::QueryViewResponse>, Status> {
        let r = req.into_inner();
        check_names("namespaces", &r.namespaces, limits::MAX_REPORT_BATCH)?;
        self.0.with_core(|c| {
            let names: Vec<String> = if r.namespaces.is_empty() {
                c.namespaces.keys().cloned().collect()
            } else {
                r.namespaces.clone()
            };
            let mut out = Vec::new();
            for n in names {
                let ns = c
                    .namespaces
                    .get(&n)
                    .ok_or_else(|| Status::not_found(format!("no namespace named {n}")))?;
                if let Some(v) = c.view.namespace(ns.id) {
                    out.push(pb::NamespaceView {
                        namespace: n.clone(),
                        busy_degree: v.busy_degree,
                        headroom_fraction: v.headroom_fraction,
                        headroom_bytes_per_sec: v.headroom_bytes_per_sec,
                        write_cost: v.write_cost,
                        read_bytes_per_sec: v.ewma.read_bytes_per_sec,
                        write_bytes_per_sec: v.ewma.write_bytes_per_sec,
                        min_cost_bytes: c.min_cost_bytes(),
                    });
                }
            }
            Ok(Response::new(pb::QueryViewResponse {
                epoch: c.view.epoch(),
                namespaces: out,
                report: Some(c.report(c.view.last_report())),
                epoch_ns: c.view.config().epoch_ns,
            }))
        })
    }

    type SubscribeStream = NotificationStream;

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let r = req.into_inner();
        if r.subscriptions.len() > limits::MAX_SUBSCRIPTIONS {
            return Err(Status::invalid_argument(format!(
                "{} subscriptions is over the limit of {}",
                r.subscriptions.len(),
                limits::MAX_SUBSCRIPTIONS
            )));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        self.0.with_core(|c| c.subscribe(&r, tx))?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn request_slices(
        &self,
        req: Request<pb::RequestSlicesRequest>,
    ) -> Result<Response<pb::RequestSlicesResponse>, Status> {
        let r = req.into_inner();
        limits::check_name("client", &r.client).map_err(Status::invalid_argument)?;
        limits::check_name("evol", &r.evol).map_err(Status::invalid_argument)?;
        check_names("namespaces", &r.namespaces, limits::MAX_SLICE_NAMESPACES)?;
        if r.slices > limits::MAX_SLICES_PER_REQUEST {
            return Err(Status::invalid_argument(format!(
                "{} slices asked per namespace; at most {}",
                r.slices,
                limits::MAX_SLICES_PER_REQUEST
            )));
        }
        if r.wait_ms > limits::MAX_SLICE_WAIT_MS {
            return Err(Status::invalid_argument(format!(
                "wait_ms {} is over the limit of {}",
                r.wait_ms,
                limits::MAX_SLICE_WAIT_MS
            )));
        }
        let s = &self.0;
        let now = s.now();
        let flows =
            s.with_core(|c| c.request_slices(now, &r.client, &r.evol, &r.namespaces, r.slices))?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(r.wait_ms));
        let mut grants = Vec::new();
        loop {
            let notified = s.grants.notified();
            let now = s.now();
            grants.extend(s.with_core(|c| Ok(c.take_grants(now, &flows)))?);
            let left = deadline.saturating_duration_since(Instant::now());
            if !grants.is_empty() || left.is_zero() {
                break;
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(5)), notified).await;
        }
        Ok(Response::new(pb::RequestSlicesResponse { grants }))
    }

    async fn release_slices(
        &self,
        req: Request<pb::ReleaseSlicesRequest>,
    ) -> Result<Response<pb::ReleaseSlicesResponse>, Status> {
        let r = req.into_inner();
        limits::check_name("client", &r.client).map_err(Status::invalid_argument)?;
        limits::check_name("evol", &r.evol).map_err(Status::invalid_argument)?;
        check_names("namespaces", &r.namespaces, limits::MAX_SLICE_NAMESPACES)?;
        self.0
            .with_core(|c| c.release_slices(&r.client, &r.evol, &r.namespaces))?;
        Ok(Response::new(pb::ReleaseSlicesResponse {}))
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(self.0.status()))
    }
}

impl Shared {
    fn status(&self) -> pb::StatusResponse {
        let role = self.role.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut st = pb::StatusResponse {
            id: self.config.id.clone(),
            allocations: self.counters.allocations.load(Ordering::Relaxed),
            zeroed_extents: self.counters.zeroed.load(Ordering::Relaxed),
            zeroing_failures: self.counters.zeroing_failures.load(Ordering::Relaxed),
            ..Default::default()
        };
        match role {
            Role::Leading {
                lead,
                until,
                record,
            } => {
                st.leading = Instant::now() < until;
                st.leader_id = record.id;
                st.leader_address = record.address;
                st.leadership_revision = lead.revision;
            }
            Role::Standby(Some(l)) => {
                st.leader_id = l.id;
                st.leader_address = l.address;
            }
            Role::Standby(None) => {}
        }
        let guard = self.core.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = guard.as_ref() {
            st.namespaces = c.namespaces.len() as u64;
            st.volumes = c.volumes.len() as u64;
            st.mapped_extents = c.catalog.volume_maps().map(|m| m.mapped_extents()).sum();
            st.free_extents = c.catalog.namespaces().map(|a| a.free_extents()).sum();
            st.zeroing_extents = c.zeroing.len() as u64;
            st.view_epoch = c.view.epoch();
            st.auction_epoch = c.auction.epoch();
        }
        st
    }

    fn metrics(&self) -> String {
        let st = self.status();
        let mut e = prom_exposition::Exposition::new();
        let c = &self.counters;
        e.gauge(
            "evol_arbiter_leading",
            "1 while this instance leads.",
            &[],
            if st.leading { 1.0 } else { 0.0 },
        );
        e.counter(
            "evol_arbiter_allocations_total",
            "Allocate requests served (mapped already or new).",
            &[],
            c.allocations.load(Ordering::Relaxed),
        );
        e.counter(
            "evol_arbiter_allocations_new_total",
            "Extents newly mapped.",
            &[],
            c.allocations_new.load(Ordering::Relaxed),
        );
        e.counter(
            "evol_arbiter_allocation_retries_total",
            "Allocation attempts repeated after a lost race.",
            &[],
            c.allocation_retries.load(Ordering::Relaxed),
        );
        e.counter(
            "evol_arbiter_refused_not_leader_total",
            "Requests refused because this instance does not lead.",
            &[],
            c.refused_not_leader.load(Ordering::Relaxed),
        );
        e.counter(
            "evol_arbiter_elections_won_total",
            "Elections this instance won.",
            &[],
            c.elections_won.load(Ordering::Relaxed),
        );
        e.gauge(
            "evol_arbiter_mapped_extents",
            "Logical extents mapped (leader only).",
            &[],
            st.mapped_extents as f64,
        );
        e.gauge(
            "evol_arbiter_free_extents",
            "Free physical extents in the pool (leader only).",
            &[],
            st.free_extents as f64,
        );
        e.gauge(
            "evol_arbiter_zeroing_extents",
            "Freed physical extents waiting for zeroing, out of reuse (leader only).",
            &[],
            st.zeroing_extents as f64,
        );
        e.counter(
            "evol_arbiter_zeroed_extents_total",
            "Physical extents zeroed and freed.",
            &[],
            st.zeroed_extents,
        );
        e.counter(
            "evol_arbiter_zeroing_failures_total",
            "Zeroing attempts that failed (retried after a backoff).",
            &[],
            st.zeroing_failures,
        );
        e.finish()
    }
}

/// A running arbiter; [`Running::stop`] ends it cleanly (the lease is
/// revoked, so a standby takes over at once).
pub struct Running {
    shared: Arc<Shared>,
    addr: SocketAddr,
    election: Option<std::thread::JoinHandle<()>>,
    server: tokio::task::JoinHandle<()>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    _metrics: Option<prom_exposition::MetricsServer>,
}

impl Running {
    /// Where the RPC listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether this instance leads now.
    pub fn is_leading(&self) -> bool {
        self.shared.leading().is_ok()
    }

    /// Stops serving, releases the leadership and waits for both.
    pub async fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.server).await;
        if let Some(t) = self.election.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Starts the arbiter on the current (multi-threaded) tokio runtime:
/// binds the RPC, starts the election thread, the timer and the metrics.
pub async fn start(config: ArbiterConfig) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("binding {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    let advertise = config.advertise.clone().unwrap_or_else(|| addr.to_string());
    let shared = Arc::new(Shared {
        keys: EvolKeys::new(&config.etcd.prefix),
        advertise,
        role: RwLock::new(Role::Standby(None)),
        core: Mutex::new(None),
        stores: Mutex::new(Vec::new()),
        extent_locks: Mutex::new(HashMap::new()),
        admin: tokio::sync::Mutex::new(()),
        grants: tokio::sync::Notify::new(),
        zeroers: Mutex::new(HashMap::new()),
        zeroing_wake: tokio::sync::Notify::new(),
        started: Instant::now(),
        counters: Counters::default(),
        stop: AtomicBool::new(false),
        config,
    });
    let metrics = match shared.config.metrics_listen {
        None => None,
        Some(a) => {
            let s = Arc::clone(&shared);
            let m =
                prom_exposition::MetricsServer::start(a, "arbiter-metrics", move || s.metrics())
                    .map_err(|e| anyhow::anyhow!("metrics on {a}: {e}"))?;
            log::info!("metrics at http://{}/metrics", m.local_addr());
            Some(m)
        }
    };
    let s = Arc::clone(&shared);
    let election = std::thread::Builder::new()
        .name("arbiter-election".into())
        .spawn(move || elect(&s))?;
    tokio::spawn(tick(Arc::clone(&shared)));
    tokio::spawn(zeroing::run(Arc::clone(&shared)));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let svc = ArbiterServer::new(Service(Arc::clone(&shared)))
        .max_decoding_message_size(limits::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(limits::MAX_MESSAGE_BYTES);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = r {
            log::error!("RPC server: {e}");
        }
    });
    log::info!(
        "arbiter {} listening on {addr} (advertised as {})",
        shared.config.id,
        shared.advertise
    );
    Ok(Running {
        shared,
        addr,
        election: Some(election),
        server,
        shutdown: Some(tx),
        _metrics: metrics,
    })
}
