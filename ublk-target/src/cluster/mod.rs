//! Cluster mode: a volume with `[cluster]` in its config is owned by one
//! host at a time, fenced at its targets, and its replicas' health lives
//! in etcd (crate `cluster-store`), so that any host can serve it next.
//!
//! What happens, in order:
//!
//! 1. [`attach`]: a lease, then the attach transaction: a new epoch and
//!    this host as owner, only if nobody else owns the volume (or with
//!    [`AttachMode::Takeover`], whatever the owner). A host that loses
//!    gets an error naming the owner.
//! 2. The replicas are connected and fenced: this host registers the
//!    epoch's reservation key on every replica's namespace and acquires an
//!    Exclusive Access reservation, preempting (and aborting) an older
//!    owner's ([`fence`]). From then on an older owner's writes fail at
//!    the targets with Reservation Conflict.
//! 3. The replication state opens from etcd's health record
//!    ([`cluster_store::start_plan`]), and [`Attachment::start`] writes the
//!    next record (this epoch, not a clean stop) before any I/O, then
//!    hands the store to the agent thread.
//! 4. The agent ([`ClusterLink`]) renews the lease every third of its
//!    TTL, notices a lost ownership (the epoch moved on), and writes health
//!    changes the replication state asks for. Writes that skipped a
//!    replica are acknowledged only once etcd records it out of sync
//!    ([`ClusterLink::covers`]); they wait at most `health_wait`.
//! 5. An orderly stop writes a clean-shutdown record and deletes the owner
//!    key, so the next attach need not wait for the lease.
//!
//! Decisions:
//! - One host, same host NQN, attaching a volume it already owns is an
//!   earlier server of this host that died (the state directory's lock
//!   excludes a live one): it attaches with a new epoch at once.
//! - A lease that expired while this host was paused, with nobody
//!   attached since, is reclaimed under the same epoch (the reservations
//!   at the targets are still this epoch's). If somebody attached, this
//!   host is fenced: every request fails from then on and `status` says
//!   who owns the volume now. It never retries a write elsewhere.
//! - etcd unreachable: nothing on the data path asks etcd unless a
//!   replica's health changes, so I/O goes on; writes that need a change
//!   wait (bounded by `health_wait`, counted in `status`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cluster_store::{
    AttachMode, HealthRecord, LocalLog, OwnerRecord, Store, StoreConfig, StoreError, VolumeKeys,
    VolumeSpec,
};
use serde::{Deserialize, Serialize};

use crate::config::{ClusterConfig, TargetSpec, VolumeConfig};
use crate::error::Error;

pub mod fence;

/// A replica as the cluster records name it: `ADDRESS:PORT SUBNQN nsid N`.
pub fn replica_id(t: &TargetSpec) -> String {
    format!("{}:{} {} nsid {}", t.address, t.port, t.subnqn, t.nsid)
}

/// The spec this config implies.
pub fn spec_of(config: &VolumeConfig) -> VolumeSpec {
    if let Some(e) = &config.evol {
        // An eVol's namespaces are the pool's and change with it: its
        // ownership record names the eVol, not them.
        return VolumeSpec::new(vec![format!("evol {}", e.name)]);
    }
    VolumeSpec::new(config.replicas.iter().map(replica_id).collect())
}

/// What `status` shows of the cluster state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ClusterStatus {
    /// etcd members.
    pub endpoints: String,
    /// This host's NQN (the owner, while it owns the volume).
    pub owner: String,
    /// The attach epoch.
    pub epoch: u64,
    /// Seconds left on the owner lease at the last renewal (-1: unknown).
    pub lease_ttl_left_s: i64,
    /// Whether the last etcd request was answered.
    pub etcd_reachable: bool,
    /// The last etcd error, if the last request failed.
    pub etcd_error: Option<String>,
    /// The health record's generation in etcd (0: not a replicated volume).
    pub health_generation: u64,
    /// A health change waiting to be recorded, if any.
    pub pending_change: Option<String>,
    /// Writes held until etcd records a replica out of sync.
    pub writes_waiting: u64,
    /// Why this host may not write any more, if it may not.
    pub fenced: Option<String>,
}

/// The sidecar file next to the intent log: the health generation this
/// host last wrote (see [`cluster_store::start_plan`]'s rule 2).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
struct Sidecar {
    generation: u64,
    epoch: u64,
}

/// `BITMAP_DIR/NAME.cluster`.
pub fn sidecar_path(config: &VolumeConfig) -> PathBuf {
    config
        .replication
        .bitmap_dir
        .join(format!("{}.cluster", config.name))
}

/// What this host's intent log knows of the volume, against etcd's
/// `record`: the bitmap counts as this host's last word only if the
/// sidecar names the record's generation *and* epoch (a generation alone
/// could repeat after the record was deleted and made again).
pub fn local_log(config: &VolumeConfig, clean_shutdown: bool, record: &HealthRecord) -> LocalLog {
    let generation = read_sidecar(config)
        .filter(|s| s.epoch == record.epoch)
        .map_or(0, |s| s.generation);
    LocalLog {
        generation,
        clean_shutdown,
    }
}

fn read_sidecar(config: &VolumeConfig) -> Option<Sidecar> {
    std::fs::read(sidecar_path(config))
        .ok()
        .and_then(|b| serde_json::from_slice::<Sidecar>(&b).ok())
}

/// The epoch this host last served the volume with, per its sidecar.
pub fn local_epoch(config: &VolumeConfig) -> Option<u64> {
    read_sidecar(config).map(|s| s.epoch)
}

/// The volume is opened without `[cluster]`: its log changes without
/// etcd knowing, so the sidecar must not vouch for it any more.
pub fn forget_sidecar(config: &VolumeConfig) {
    let p = sidecar_path(config);
    if p.exists() {
        if let Err(e) = std::fs::remove_file(&p) {
            log::warn!("{}: {e}", p.display());
        }
    }
}

/// Writes the sidecar atomically (temporary file, fsync, rename, fsync of
/// the directory): a crash leaves the old generation or the new one.
fn write_sidecar(path: &Path, s: Sidecar) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("cluster.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(&s).unwrap_or_default())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A won attach, before the volume starts.
pub struct Attachment {
    store: Store,
    /// The shared state (data path, replication, agent, status).
    pub link: Arc<ClusterLink>,
    /// The health record in etcd and its revision, if there is one.
    pub health: Option<(HealthRecord, i64)>,
    /// Who owned the volume before (a takeover or an earlier server of
    /// this host), if anybody.
    pub previous: Option<OwnerRecord>,
    lease: i64,
}

/// Attach volume `config` for this host (`host_nqn`): see the module
/// documentation, step 1.
pub fn attach(
    config: &VolumeConfig,
    host_nqn: &str,
    mode: AttachMode,
) -> Result<Attachment, Error> {
    let cc = config
        .cluster
        .as_ref()
        .ok_or_else(|| Error::Usage(format!("volume {} has no [cluster] section", config.name)))?;
    let store = Store::connect(StoreConfig {
        endpoints: cc.endpoints.clone(),
        op_timeout: cc.op_timeout,
    })
    .map_err(store_err)?;
    let keys = VolumeKeys::new(&cc.prefix, &config.name);
    let lease = store.grant_lease(cc.lease_ttl).map_err(store_err)?;
    let attached = match store.attach(&keys, &config.name, &spec_of(config), host_nqn, lease, mode)
    {
        Ok(a) => a,
        Err(e) => {
            let _ = store.revoke(lease);
            return Err(store_err(e));
        }
    };
    if let Some(p) = &attached.previous {
        log::warn!(
            "volume {}: took over from {} with epoch {}",
            config.name,
            p.describe(),
            attached.epoch
        );
    } else {
        log::info!("volume {}: attached, epoch {}", config.name, attached.epoch);
    }
    let health = attached
        .view
        .health
        .clone()
        .map(|h| (h, attached.view.health_rev));
    if let Some((h, _)) = &health {
        h.validate(&spec_of(config)).map_err(|e| {
            Error::Usage(format!("volume {}: etcd's health record: {e}", config.name))
        })?;
    }
    let owner = attached.owner.clone();
    let link = Arc::new(ClusterLink {
        name: config.name.clone(),
        cfg: cc.clone(),
        keys,
        epoch: attached.epoch,
        sidecar: sidecar_path(config),
        recorded_out: AtomicU32::new(0),
        fenced: AtomicBool::new(false),
        inner: Mutex::new(Inner {
            endpoints: cc.endpoints.join(","),
            owner,
            committed: None,
            desired: None,
            latest: None,
            reachable: true,
            last_error: None,
            lease_ttl_left: cc.lease_ttl.as_secs() as i64,
            writes_waiting: 0,
            fenced: None,
            stop: None,
        }),
        wake: Condvar::new(),
        agent: Mutex::new(None),
    });
    Ok(Attachment {
        store,
        link,
        health,
        previous: attached.previous,
        lease,
    })
}

/// The replicas `h` records out of sync, as bits.
fn out_bits(h: &HealthRecord) -> u32 {
    h.replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.in_sync)
        .fold(0u32, |b, (i, _)| b | (1 << i))
}

fn store_err(e: StoreError) -> Error {
    Error::Usage(e.to_string())
}

impl Attachment {
    /// The volume is connected, fenced and its replication state open:
    /// record `in_sync` (None for a one-target volume) as this epoch's
    /// first health record, then start the agent. Fails, giving the
    /// volume up, if etcd does not take the record.
    pub fn start(
        self,
        in_sync: Option<Vec<bool>>,
        spec: &VolumeSpec,
    ) -> Result<Arc<ClusterLink>, Error> {
        let link = self.link.clone();
        if let Some(in_sync) = in_sync {
            let (base, rev) = match self.health {
                Some((h, rev)) => (h, rev),
                // A volume new to etcd: generation 0 so that the first
                // record written is generation 1.
                None => {
                    let mut h = HealthRecord::initial(spec, link.epoch);
                    h.generation = 0;
                    (h, 0)
                }
            };
            let next = base
                .next(link.epoch, &in_sync, false)
                .map_err(|e| Error::Usage(format!("volume {}: {e}", link.name)))?;
            let written = self
                .store
                .put_health(&link.keys, &link.name, link.epoch, rev, &next)
                .map_err(|e| {
                    let _ = self.store.release(&link.keys, link.epoch);
                    let _ = self.store.revoke(self.lease);
                    store_err(e)
                })?;
            link.committed(&next, written);
        }
        if let Err(e) = write_sidecar(
            &link.sidecar,
            Sidecar {
                generation: link
                    .lock()
                    .committed
                    .as_ref()
                    .map_or(0, |(h, _)| h.generation),
                epoch: link.epoch,
            },
        ) {
            // `recover` on this host then refuses (it cannot tell that
            // nobody owned the volume since); nothing else depends on it.
            log::warn!("volume {}: {}: {e}", link.name, link.sidecar.display());
        }
        let store = self.store;
        let l = link.clone();
        let h = std::thread::Builder::new()
            .name(format!("cluster-{}", link.name))
            .spawn(move || l.run_agent(store))
            .map_err(|e| Error::State(format!("starting the cluster agent: {e}")))?;
        *link.agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        Ok(link)
    }

    /// Gives the volume up (the volume failed to start after the attach).
    pub fn abandon(self) {
        let _ = self.store.release(&self.link.keys, self.link.epoch);
        let _ = self.store.revoke(self.lease);
    }

    /// The epoch this host attached with.
    pub fn epoch(&self) -> u64 {
        self.link.epoch
    }

    /// This epoch's reservation key.
    pub fn reservation_key(&self) -> u64 {
        cluster_store::reservation_key(&self.link.name, self.link.epoch)
    }

    /// Fence every replica (step 2 of the module documentation), unless
    /// `[cluster] fencing = "none"`.
    pub fn fence_replicas(&self, replicas: &[crate::volume::ReplicaEndpoint]) -> Result<(), Error> {
        if self.link.cfg.fencing == crate::config::Fencing::None {
            log::warn!(
                "volume {}: [cluster] fencing = \"none\": an older owner that still runs could write",
                self.link.name
            );
            return Ok(());
        }
        let key = self.reservation_key();
        for (i, t) in replicas.iter().enumerate() {
            let what = format!(
                "replica {i} ({}:{} {})",
                t.spec.address, t.spec.port, t.spec.subnqn
            );
            match fence::fence(
                &t.ctrl,
                t.spec.nsid,
                &self.link.name,
                self.link.epoch,
                &what,
            )? {
                fence::Fenced::Preempted { previous_key } => log::warn!(
                    "volume {}: {what}: preempted the reservation of key {previous_key:#x}{}",
                    self.link.name,
                    cluster_store::reservation_epoch(&self.link.name, previous_key)
                        .map(|e| format!(" (epoch {e})"))
                        .unwrap_or_default()
                ),
                f => log::info!("volume {}: {what}: {f:?}, key {key:#x}", self.link.name),
            }
        }
        Ok(())
    }
}

struct Inner {
    endpoints: String,
    owner: OwnerRecord,
    /// The record in etcd (as this host last wrote it) and its revision.
    committed: Option<(HealthRecord, i64)>,
    /// The replicas in sync as the replication state has them now, if that
    /// differs from `committed`.
    desired: Option<Vec<bool>>,
    /// The replicas in sync as the replication state last said (whether
    /// or not recorded): what `desired` is recomputed from after each
    /// write, so that a change made while another was being written is
    /// not lost.
    latest: Option<Vec<bool>>,
    reachable: bool,
    last_error: Option<String>,
    lease_ttl_left: i64,
    writes_waiting: u64,
    fenced: Option<String>,
    /// Set by [`ClusterLink::stop`]: Some(clean).
    stop: Option<bool>,
}

/// The running cluster state of one volume; see the module documentation.
pub struct ClusterLink {
    name: String,
    cfg: ClusterConfig,
    keys: VolumeKeys,
    epoch: u64,
    sidecar: PathBuf,
    /// The replicas etcd records out of sync, as bits (read lock-free on
    /// the data path).
    recorded_out: AtomicU32,
    /// Set once this host may not write any more.
    fenced: AtomicBool,
    inner: Mutex<Inner>,
    wake: Condvar,
    agent: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl ClusterLink {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The attach epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The volume name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long a write waits for a health change to be recorded.
    pub fn health_wait(&self) -> Duration {
        self.cfg.health_wait
    }

    fn committed(&self, h: &HealthRecord, rev: i64) {
        self.recorded_out.store(out_bits(h), Ordering::Release);
        let mut g = self.lock();
        g.committed = Some((h.clone(), rev));
        // What the replication state wants now, compared with what etcd
        // has now: a change it asked for while this record was being
        // written (e.g. a replica that failed again right after its
        // resync was recorded) is still to be written.
        let now = h.in_sync_set();
        g.desired = g.latest.clone().filter(|l| *l != now);
        drop(g);
        if let Err(e) = write_sidecar(
            &self.sidecar,
            Sidecar {
                generation: h.generation,
                epoch: self.epoch,
            },
        ) {
            // Only costs a full copy instead of a bitmap copy if this host
            // serves the volume next; never a reason to stop.
            log::warn!(
                "volume {}: {}: {e}; a later start on this host will copy out-of-sync replicas in full",
                self.name,
                self.sidecar.display()
            );
        }
    }

    /// Whether etcd records every replica outside `sent_to` (bits) out of
    /// sync: a write that skipped them may be acknowledged.
    pub fn covers(&self, sent_to: u32, all: u32) -> bool {
        let skipped = all & !sent_to;
        skipped & !self.recorded_out.load(Ordering::Acquire) == 0
    }

    /// The replication state's replicas in sync changed to `in_sync`:
    /// record it (the agent writes it).
    pub fn want(&self, in_sync: Vec<bool>) {
        let mut g = self.lock();
        // Nothing to write only if etcd has this set *and* the lock-free
        // bits say so: a record putting a replica back in sync may have
        // been sent (its bit cleared first) and its outcome be unknown;
        // then the same set is written again, which settles both.
        let same = g.committed.as_ref().is_some_and(|(h, _)| {
            h.in_sync_set() == in_sync && out_bits(h) == self.recorded_out.load(Ordering::Acquire)
        });
        g.desired = if same { None } else { Some(in_sync.clone()) };
        g.latest = Some(in_sync);
        drop(g);
        self.wake.notify_all();
    }

    /// `n` writes started (or stopped, negative) waiting for a record.
    pub fn writes_waiting(&self, delta: i64) {
        let mut g = self.lock();
        g.writes_waiting = g.writes_waiting.saturating_add_signed(delta);
    }

    /// Whether this host may not write any more.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// This host may not write any more: `why`. Logged once.
    pub fn fence_self(&self, why: String) {
        if self.fenced.swap(true, Ordering::AcqRel) {
            return;
        }
        log::error!(
            "volume {}: {why}; this host stops serving it (every request fails from now on)",
            self.name
        );
        self.lock().fenced = Some(why);
        self.wake.notify_all();
    }

    /// For `status`.
    pub fn status(&self) -> ClusterStatus {
        let g = self.lock();
        ClusterStatus {
            endpoints: g.endpoints.clone(),
            owner: g.owner.host_nqn.clone(),
            epoch: self.epoch,
            lease_ttl_left_s: g.lease_ttl_left,
            etcd_reachable: g.reachable,
            etcd_error: g.last_error.clone(),
            health_generation: g.committed.as_ref().map_or(0, |(h, _)| h.generation),
            pending_change: g.desired.as_ref().map(|d| {
                let out: Vec<String> = d
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !**s)
                    .map(|(i, _)| i.to_string())
                    .collect();
                format!(
                    "record replicas [{}] out of sync (waiting for etcd{})",
                    out.join(", "),
                    g.last_error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )
            }),
            writes_waiting: g.writes_waiting,
            fenced: g.fenced.clone(),
        }
    }

    /// Stops the agent and waits for it; `clean`: every request was
    /// answered, record a clean shutdown. Either way the volume is given
    /// up in etcd (owner key deleted, lease revoked).
    pub fn stop_and_wait(&self, clean: bool) {
        self.lock().stop = Some(clean);
        self.wake.notify_all();
        let h = self.agent.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Stops the agent without giving the volume up, as if this process
    /// had died: the owner key stays until its lease runs out. For tests of
    /// what the next owner finds.
    pub fn halt(&self) {
        self.fence_self("halted".into());
        self.stop_and_wait(false);
    }

    /// The agent loop: keep-alives, ownership checks, health writes.
    fn run_agent(&self, store: Store) {
        let period = self.cfg.lease_ttl / 3;
        let mut next_keepalive = Instant::now() + period;
        loop {
            let (desired, stop) = {
                let g = self.lock();
                (g.desired.clone(), g.stop)
            };
            if let Some(clean) = stop {
                self.finish(&store, clean);
                return;
            }
            let mut failed = false;
            if let Some(d) = desired.filter(|_| !self.is_fenced()) {
                failed |= !self.write_health(&store, &d, false);
            }
            if Instant::now() >= next_keepalive {
                failed |= !self.keep_alive(&store);
                next_keepalive = Instant::now() + period;
            }
            let g = self.lock();
            let wait = if failed {
                // Retry soon: a write may be waiting on this record.
                Duration::from_millis(500)
            } else if g.desired.is_some() && !self.is_fenced() {
                Duration::ZERO
            } else {
                next_keepalive.saturating_duration_since(Instant::now())
            };
            if g.stop.is_none() && !wait.is_zero() {
                let _ = self.wake.wait_timeout(g, wait);
            }
        }
    }

    fn note(&self, r: Result<(), String>) -> bool {
        let mut g = self.lock();
        match r {
            Ok(()) => {
                g.reachable = true;
                g.last_error = None;
                true
            }
            Err(e) => {
                g.reachable = false;
                g.last_error = Some(e);
                false
            }
        }
    }

    /// Writes the record of `in_sync`; whether it was written.
    fn write_health(&self, store: &Store, in_sync: &[bool], clean: bool) -> bool {
        let Some((base, rev)) = self.lock().committed.clone() else {
            return true;
        };
        let next = match base.next(self.epoch, in_sync, clean) {
            Ok(n) => n,
            Err(e) => {
                // The local rules never ask for this; refuse loudly.
                log::error!("volume {}: health record refused: {e}", self.name);
                let mut g = self.lock();
                g.desired = None;
                g.latest = None;
                return true;
            }
        };
        // A replica about to be recorded in sync stops covering writes that
        // skip it now, before the put: from the moment etcd may say "in
        // sync", a write that skips it must wait for a later record saying
        // "out" (set only once that record is committed).
        let going_in = next
            .replicas
            .iter()
            .enumerate()
            .filter(|(i, r)| r.in_sync && !base.in_sync(*i))
            .fold(0u32, |b, (i, _)| b | (1 << i));
        if going_in != 0 {
            self.recorded_out.fetch_and(!going_in, Ordering::AcqRel);
        }
        match store.put_health(&self.keys, &self.name, self.epoch, rev, &next) {
            Ok(written) => {
                self.committed(&next, written);
                self.note(Ok(()))
            }
            Err(e @ StoreError::NotOwner { .. }) => {
                self.fence_self(e.to_string());
                self.note(Ok(()))
            }
            Err(e @ StoreError::Contended { .. }) => {
                // Still our epoch, another record: only this epoch's owner
                // writes it, so it is an earlier write of ours that
                // committed with its answer lost. Take it as committed;
                // the next pass writes what is still wanted on top.
                match store.read(&self.keys, &self.name) {
                    Ok(v) if v.epoch == self.epoch && v.health.is_some() => {
                        let h = v.health.expect("checked");
                        log::info!(
                            "volume {}: health record generation {} found in etcd (an earlier write's answer was lost); continuing from it",
                            self.name,
                            h.generation
                        );
                        self.committed(&h, v.health_rev);
                        self.note(Ok(()))
                    }
                    _ => self.note(Err(e.to_string())),
                }
            }
            Err(e) => self.note(Err(e.to_string())),
        }
    }

    /// Renews the lease (reclaiming the volume if it expired while nobody
    /// took it); whether etcd answered.
    fn keep_alive(&self, store: &Store) -> bool {
        let lease = self.lock().owner.lease;
        let r = match store.keep_alive(lease) {
            Ok(Some(ttl)) => {
                self.lock().lease_ttl_left = ttl;
                self.check_owner(store)
            }
            Ok(None) => self.reclaim(store),
            Err(e) => Err(e.to_string()),
        };
        self.note(r)
    }

    fn check_owner(&self, store: &Store) -> Result<(), String> {
        let view = store
            .read(&self.keys, &self.name)
            .map_err(|e| e.to_string())?;
        if view.epoch != self.epoch {
            let owner = view
                .owner
                .map(|o| o.describe())
                .unwrap_or_else(|| "nobody".into());
            self.fence_self(format!(
                "lost the volume: epoch {} in etcd (ours {}), owner {owner}",
                view.epoch, self.epoch
            ));
        }
        Ok(())
    }

    fn reclaim(&self, store: &Store) -> Result<(), String> {
        if self.is_fenced() {
            return Ok(());
        }
        let lease = store
            .grant_lease(self.cfg.lease_ttl)
            .map_err(|e| e.to_string())?;
        let mut owner = self.lock().owner.clone();
        owner.lease = lease;
        match store.reclaim(&self.keys, &self.name, &owner) {
            Ok(held) => {
                log::warn!(
                    "volume {}: the owner lease expired (this host was paused or cut off) and nobody attached meanwhile; reclaimed under epoch {}",
                    self.name,
                    self.epoch
                );
                if held.lease != lease {
                    // An earlier reclaim's lease holds the key: keep that
                    // one alive.
                    let _ = store.revoke(lease);
                }
                self.lock().owner = held;
                Ok(())
            }
            Err(e @ StoreError::NotOwner { .. }) => {
                let _ = store.revoke(lease);
                self.fence_self(e.to_string());
                Ok(())
            }
            // Not revoked: the reclaim may have committed under it (the
            // next one then finds and adopts it); if not, it holds no
            // key and lapses.
            Err(e) => Err(e.to_string()),
        }
    }

    fn finish(&self, store: &Store, clean: bool) {
        if self.is_fenced() {
            return;
        }
        let committed = self.lock().committed.clone();
        if clean {
            if let Some((h, _)) = committed {
                // The replication state's own last word, not what was
                // pending or recorded.
                let in_sync = self
                    .lock()
                    .latest
                    .clone()
                    .unwrap_or_else(|| h.in_sync_set());
                if !self.write_health(store, &in_sync, true) {
                    log::warn!(
                        "volume {}: could not record the clean stop in etcd; the next owner copies in full",
                        self.name
                    );
                }
            }
        }
        let lease = self.lock().owner.lease;
        match store.release(&self.keys, self.epoch) {
            Ok(_) => {
                let _ = store.revoke(lease);
            }
            Err(e) => log::warn!(
                "volume {}: giving the volume up in etcd: {e}; it frees itself when the lease expires",
                self.name
            ),
        }
    }
}
