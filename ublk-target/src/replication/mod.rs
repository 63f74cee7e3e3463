//! The running side of a replicated volume: the replicas' health
//! ([`crate::replication::health`]), the write-intent log ([`crate::replication::intent_log`]) and
//! the resync of a returning replica ([`crate::replication::resync`]) behind one lock,
//! shared by the volume's queue threads and its manager thread.
//!
//! What the engine does with it, per request:
//!
//! - It reads [`Replication::route`] (lock-free) to know which replicas
//!   take writes and serve reads; the QoS stage picks the replicas of each
//!   request from it.
//! - Before a write, discard or write-zeroes is sent anywhere,
//!   [`Replication::before_write`] records it for every replica it will not
//!   reach (their intent-log bits, durable first: a crash of this host
//!   after the write landed elsewhere must still find the bit), and tells
//!   a running resync that a user write is in flight on those bytes; after
//!   every replica answered, [`Replication::after_write`]. On the healthy
//!   path (every replica writable, no resync) both return without taking
//!   the lock.
//! - When a replica's path fails, [`Replication::path_failed`] says whether
//!   the replica is now out of sync (then its unfinished writes are
//!   recorded with [`Replication::missed`] and completed on the others, and
//!   its reads move to another replica) or was the last in-sync one (then
//!   its I/O is held and redone, as for a one-target volume).
//! - Before (re)connecting a path, [`Replication::may_connect`]: an
//!   out-of-sync replica reconnects only once the manager has moved it to
//!   resyncing, after its fence.
//!
//! The manager thread ([`Replication::run_manager`]) ticks the replicas' health,
//! moves a fenced replica whose controller is live again to resyncing, and
//! copies its dirty regions from an in-sync replica with the blocking
//! controller API, one job at a time at the configured rate, each copy
//! flushed before its bit is cleared; when none is left it records the
//! replica in sync and it serves reads again.
//!
//! Decisions:
//! - The fence's command bound is the volume's `io_timeout` (the bound
//!   this host puts on a command; a target does not report its own):
//!   KATO + io_timeout + 1 s after the last command.
//! - The last in-sync replica is fenced too before its paths reconnect
//!   (the rule of [`ReplicaHealth`]); I/O is held meanwhile.
//! - A log created now (first start of the volume) takes replica 0 as the
//!   source: the other replicas get a full copy, as md's initial resync.

pub mod health;
pub mod intent_log;
pub mod resync;

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nvmf_initiator::blocking::Controller;
use qos_core::{Nanos, ReplicaSet};
use serde::{Deserialize, Serialize};

use crate::cluster::ClusterLink;
use crate::config::VolumeConfig;
use crate::error::Error;
use crate::qos::Route;
use cluster_store::{HealthRecord, ReplicaStart};
use health::{FailOutcome, FenceTimes, ReplicaHealth, ReplicaState};
use intent_log::{IntentLog, Opened, ReplicaSyncState, SyncEpoch};
use resync::{CopyJob, CopyResult, Next, ResyncConfig, ResyncPlanner};

/// Largest resync copy: one command's worth on every target we know
/// (MDTS is at least 128 KiB on gimbal-target and nvmet).
const COPY_BYTES: u64 = 128 * 1024;

struct Resync {
    replica: usize,
    planner: ResyncPlanner,
    /// A region whose copies are done but not yet flushed: its bit is
    /// cleared after the flush (the manager's next step).
    unflushed: Option<u64>,
}

/// What the manager does next.
enum Step {
    /// Nothing for this long.
    Sleep(Duration),
    /// Blocking I/O for replica `replica`'s resync, without the lock.
    Io { replica: usize, io: ResyncIo },
}

/// The blocking I/O of a resync step.
enum ResyncIo {
    /// Copy `job` from `source` (an in-sync replica, if there is one).
    Copy { source: Option<usize>, job: CopyJob },
    /// Flush the replica, then clear `region`'s bit.
    Flush { region: u64 },
}

struct State {
    health: ReplicaHealth,
    log: IntentLog,
    resync: Option<Resync>,
    /// Writes in flight (from `before_write` to `after_write`) that skip a
    /// replica, by byte range: a resync must not copy their bytes while
    /// they are in flight, even when it starts after they were prepared
    /// (a write held for etcd may be sent long after), or the copy could
    /// read the source before the write lands and clear the bit after it.
    skipping: std::collections::BTreeMap<(u64, u64), u32>,
}

impl State {
    /// A planner for `dirty` that knows of the skipping writes in flight.
    fn planner(&self, config: ResyncConfig, dirty: Vec<u64>, now: Nanos) -> ResyncPlanner {
        let mut p = ResyncPlanner::new(config, dirty, now);
        for (&(a, b), &n) in &self.skipping {
            for _ in 0..n {
                p.on_user_write_start(a..b);
            }
        }
        p
    }
}

/// What `status` shows of one replica.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ReplicaStatus {
    /// in-sync, fencing, failed, resyncing.
    pub state: String,
    /// Regions it misses (intent-log bits).
    pub dirty_regions: u64,
    /// Resync progress: bytes copied so far (while resyncing).
    pub resync_bytes: u64,
    /// Regions left to copy (while resyncing).
    pub resync_regions_left: u64,
    /// Bytes left to copy, at most (while resyncing).
    #[serde(default)]
    pub resync_bytes_left: u64,
    /// Estimated seconds until the resync is done (while resyncing; `None`
    /// until a rate is known: `resync_rate = 0` and nothing copied yet).
    #[serde(default)]
    pub resync_seconds_left: Option<u64>,
}

/// The replication state of a volume; see the module documentation.
pub struct Replication {
    name: String,
    state: Mutex<State>,
    synced: Condvar,
    /// [`Route::writable`] as [`ReplicaSet::bits`].
    writable: AtomicU32,
    /// [`Route::readable`] as [`ReplicaSet::bits`].
    readable: AtomicU32,
    /// Every replica of the volume.
    all: ReplicaSet,
    /// Set while a resync runs (user writes must be reported to it).
    resyncing: AtomicBool,
    epoch: Instant,
    rate_bps: u64,
    geometry: intent_log::Geometry,
    /// Cluster mode: where health changes are recorded (set once the
    /// volume's first record is in etcd).
    cluster: OnceLock<Arc<ClusterLink>>,
}

impl Replication {
    /// Opens (or creates) the volume's intent log for replicas with
    /// `identities` (config order) over `volume_size` bytes.
    ///
    /// `recovering`: this server takes over a live device from a crashed
    /// one (`ublk-nvmf recover`); the kernel reissues every request that
    /// was in flight, to every replica, so replicas that were in sync
    /// converge again. Otherwise, after a run that did not stop cleanly
    /// (the host crashed, or the server died and its device went away),
    /// writes may have been in flight to every replica and landed on some
    /// only: nothing records where, so every in-sync replica but the first
    /// is copied in full from the first (md without a bitmap does the
    /// same). The first is as good a source as any: a write that was not
    /// acknowledged may read as old or new data afterwards.
    ///
    /// `cluster`: in cluster mode, etcd's health record (`Some(None)`: the
    /// volume has none yet). etcd's record, not the local log, then says
    /// which replicas are in sync, and [`cluster_store::start_plan`] says
    /// which are copied from the bitmap and which in full; the local log
    /// is brought in line with it. Without a record in etcd the local log
    /// stands (a single-host volume moving to cluster mode keeps what it
    /// knows), as it does without `[cluster]`.
    pub fn open(
        config: &VolumeConfig,
        identities: &[String],
        volume_size: u64,
        recovering: bool,
        cluster: Option<Option<&HealthRecord>>,
    ) -> Result<Self, Error> {
        let rc = &config.replication;
        let geometry = intent_log::Geometry {
            volume_name: config.name.clone(),
            volume_size,
            region_size: rc.region_size,
        };
        let path = rc.bitmap_path(&config.name);
        let (mut log, opened) = IntentLog::open_or_create(&path, &geometry, identities)
            .map_err(|e| Error::State(e.to_string()))?;
        if cluster.is_none() {
            crate::cluster::forget_sidecar(config);
        }
        if let Some(Some(record)) = cluster {
            let local = match opened {
                Opened::Created => None,
                Opened::Existing { clean_shutdown, .. } => {
                    Some(crate::cluster::local_log(config, clean_shutdown, record))
                }
            };
            let plan = cluster_store::start_plan(record, local, recovering);
            apply_plan(&mut log, &plan.replicas, volume_size).map_err(log_err)?;
            let copies: Vec<String> = plan
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, s)| **s != ReplicaStart::InSync)
                .map(|(i, s)| format!("{i} ({s:?})"))
                .collect();
            if !copies.is_empty() {
                log::warn!(
                    "volume {}: etcd's health record (generation {}{}): source replica {}; to copy: {}",
                    config.name,
                    record.generation,
                    if record.clean_shutdown { "" } else { ", unclean stop" },
                    plan.source,
                    copies.join(", ")
                );
            }
        } else if matches!(
            opened,
            Opened::Existing {
                clean_shutdown: false,
                ..
            }
        ) && !recovering
        {
            let first = log
                .replicas()
                .iter()
                .position(|r| r.state == ReplicaSyncState::InSync);
            let others: Vec<usize> = (0..log.replicas().len())
                .filter(|&r| Some(r) != first)
                .filter(|&r| log.replicas()[r].state == ReplicaSyncState::InSync)
                .collect();
            for &r in &others {
                log.mark(r, 0..volume_size).map_err(log_err)?;
                log.set_state(r, ReplicaSyncState::OutOfSync)
                    .map_err(log_err)?;
            }
            log.sync().map_err(log_err)?;
            if !others.is_empty() {
                log::warn!(
                    "volume {}: the previous run did not stop cleanly; replicas {others:?} will be copied in full from replica {}",
                    config.name,
                    first.unwrap_or(0)
                );
            }
        }
        let in_sync: Vec<bool> = log
            .replicas()
            .iter()
            .map(|r| r.state == ReplicaSyncState::InSync)
            .collect();
        let clean = match opened {
            Opened::Created => true,
            Opened::Existing { clean_shutdown, .. } => clean_shutdown,
        };
        let fence = FenceTimes {
            keep_alive: config.keep_alive,
            target_command_timeout: config.io_timeout,
            slack: Duration::from_secs(1),
        };
        let epoch = Instant::now();
        let health = ReplicaHealth::new(&in_sync, fence, Nanos::ZERO, clean);
        let n = in_sync.len();
        let r = Self {
            name: config.name.clone(),
            state: Mutex::new(State {
                health,
                log,
                resync: None,
                skipping: Default::default(),
            }),
            synced: Condvar::new(),
            writable: AtomicU32::new(0),
            readable: AtomicU32::new(0),
            all: ReplicaSet::first_n(n),
            resyncing: AtomicBool::new(false),
            epoch,
            rate_bps: rc.resync_rate_bps,
            geometry,
            cluster: OnceLock::new(),
        };
        {
            let st = r.lock();
            r.publish(&st);
            for (i, s) in in_sync.iter().enumerate() {
                if !s {
                    log::warn!(
                        "volume {}: replica {i} is out of sync ({} regions to copy)",
                        r.name,
                        st.log.dirty_count(i)
                    );
                }
            }
        }
        Ok(r)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Per replica: in sync in the intent log.
    fn in_sync_of(st: &State) -> Vec<bool> {
        st.log
            .replicas()
            .iter()
            .map(|r| r.state == ReplicaSyncState::InSync)
            .collect()
    }

    /// Per replica: in sync now (what cluster mode records in etcd).
    pub fn in_sync(&self) -> Vec<bool> {
        Self::in_sync_of(&self.lock())
    }

    /// Cluster mode: from now on every change of a replica's sync state is
    /// recorded in etcd through `link`.
    pub fn set_cluster(&self, link: Arc<ClusterLink>) {
        if self.cluster.set(link).is_ok() {
            // A change between the first record and now (read after the
            // link is set: a change from now on tells it itself).
            if let Some(c) = self.cluster.get() {
                c.want(self.in_sync());
            }
        }
    }

    /// Tell the cluster (if any) the replicas' sync states changed.
    fn tell_cluster(&self, st: &State) {
        if let Some(c) = self.cluster.get() {
            c.want(Self::in_sync_of(st));
        }
    }

    /// Now on the replication clock.
    pub fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Recompute the lock-free route after a state change.
    fn publish(&self, st: &State) {
        let replicas = 0..st.health.len();
        let w: ReplicaSet = replicas
            .clone()
            .filter(|&i| st.health.takes_writes(i))
            .collect();
        let mut r: ReplicaSet = replicas
            .clone()
            .filter(|&i| st.health.serves_reads(i))
            .collect();
        if r.is_empty() {
            // The last in-sync replica with its path down: reads wait for
            // it there.
            r = replicas
                .filter(|&i| st.health.state(i) == Ok(ReplicaState::InSync))
                .collect();
        }
        // Resync flag before the route: a request that sees a resyncing
        // replica in its route also sees the flag (see `before_write`).
        self.resyncing.store(st.resync.is_some(), Ordering::Release);
        self.writable.store(w.bits(), Ordering::Release);
        self.readable.store(r.bits(), Ordering::Release);
    }

    /// Where requests may go now.
    pub fn route(&self) -> Route {
        Route {
            writable: ReplicaSet::from_bits(self.writable.load(Ordering::Acquire)),
            readable: ReplicaSet::from_bits(self.readable.load(Ordering::Acquire)),
        }
    }

    /// Wait until the log's sync of `epoch` has finished, doing the sync
    /// if nobody else is (group commit: one fdatasync for every mark made
    /// meanwhile).
    fn make_durable<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        epoch: SyncEpoch,
    ) -> Result<(), Error> {
        loop {
            if st.log.is_durable(epoch) {
                return Ok(());
            }
            if st.log.sync_in_flight() {
                st = self.synced.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let batch = st.log.begin_sync().map_err(log_err)?;
            let Some(batch) = batch else {
                // Nothing left to write, yet not durable: cannot happen
                // (the epoch would be durable); do not spin.
                return Ok(());
            };
            drop(st);
            let result = batch.write();
            st = self.lock();
            let r = st.log.finish_sync(batch, result);
            self.synced.notify_all();
            r.map_err(log_err)?;
        }
    }

    /// A write (or discard, write-zeroes) of bytes `range` is about to be
    /// sent to the replicas `sent_to`: record it, durably, for every
    /// other replica, and tell a running resync. Call
    /// [`Replication::after_write`] with the same arguments once every
    /// replica answered. Blocks only while an intent-log sync it needs is
    /// written.
    pub fn before_write(&self, range: &Range<u64>, sent_to: ReplicaSet) -> Result<(), Error> {
        let resyncing = self.resyncing.load(Ordering::Acquire);
        if self.all.is_subset(sent_to) && !resyncing {
            return Ok(());
        }
        let mut st = self.lock();
        let mut wait = None;
        for r in 0..st.health.len() {
            if !sent_to.contains(r) {
                let out = st.log.mark(r, range.clone()).map_err(log_err)?;
                wait = wait.max(out.wait_for);
            }
        }
        if !self.all.is_subset(sent_to) {
            *st.skipping.entry((range.start, range.end)).or_insert(0) += 1;
        }
        if let Some(rs) = st.resync.as_mut() {
            // Also when the write skips the resyncing replica: its bit is
            // set, and the copy of these bytes must wait for the write to
            // land on the source.
            rs.planner.on_user_write_start(range.clone());
        }
        match wait {
            Some(e) => self.make_durable(st, e),
            None => Ok(()),
        }
    }

    /// The write [`Replication::before_write`] announced has been answered
    /// by every replica it went to.
    pub fn after_write(&self, range: &Range<u64>, sent_to: ReplicaSet) {
        let skipped = !self.all.is_subset(sent_to);
        if !skipped && !self.resyncing.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.lock();
        if skipped {
            let key = (range.start, range.end);
            if let Some(n) = st.skipping.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    st.skipping.remove(&key);
                }
            }
        }
        if let Some(rs) = st.resync.as_mut() {
            rs.planner.on_user_write_done(range.clone());
        }
    }

    /// Replica `r` did not get a write of `range` whose outcome on it is
    /// unknown (its path failed): record it before the write is
    /// acknowledged.
    pub fn missed(&self, r: usize, range: &Range<u64>) -> Result<(), Error> {
        let mut st = self.lock();
        let out = st.log.mark(r, range.clone()).map_err(log_err)?;
        match out.wait_for {
            Some(e) => self.make_durable(st, e),
            None => Ok(()),
        }
    }

    /// Replica `r`'s path failed (any of its connections: a queue error,
    /// a controller reset). Idempotent per failure.
    pub fn path_failed(&self, r: usize) -> Result<FailOutcome, Error> {
        let now = self.now();
        let mut st = self.lock();
        let was = st.health.state(r).ok();
        // The failure is noticed after the last command was sent on the
        // path, so `now` is a safe (late) stand-in for it.
        let out = st
            .health
            .on_path_failed(r, now, Some(now))
            .map_err(|e| Error::State(e.to_string()))?;
        if let FailOutcome::OutOfSync { fence_until } = out {
            if st.resync.as_ref().is_some_and(|rs| rs.replica == r) {
                st.resync = None;
            }
            let m = st
                .log
                .set_state(r, ReplicaSyncState::OutOfSync)
                .map_err(log_err)?;
            self.publish(&st);
            self.tell_cluster(&st);
            if was == Some(ReplicaState::InSync)
                || matches!(was, Some(ReplicaState::Resyncing { .. }))
            {
                log::warn!(
                    "volume {}: replica {r} failed; running degraded (no reconnect for {} ms: fence)",
                    self.name,
                    fence_until.nanos_since(now) / 1_000_000
                );
            }
            if let Some(e) = m.wait_for {
                self.make_durable(st, e)?;
            }
        } else {
            self.publish(&st);
        }
        Ok(out)
    }

    /// Whether replica `r`'s I/O paths may connect now: in sync (after the
    /// fence if its path failed) or resyncing.
    pub fn may_connect(&self, r: usize) -> bool {
        let now = self.now();
        let mut st = self.lock();
        match st.health.state(r) {
            Ok(ReplicaState::Resyncing { .. }) => true,
            Ok(ReplicaState::InSync) => {
                if st.health.reconnect_allowed(r, now).is_err() {
                    return false;
                }
                // The last in-sync replica coming back (a no-op when its
                // path never went down).
                if st.health.on_path_reconnected(r, now).is_ok() {
                    self.publish(&st);
                }
                true
            }
            _ => false,
        }
    }

    /// Whether replica `r` is out of sync (not in sync, not resyncing):
    /// its requests are dropped (writes recorded as missed).
    pub fn is_out(&self, r: usize) -> bool {
        !self.route().writable.contains(r)
    }

    /// Per replica, for `status`.
    pub fn status(&self) -> Vec<ReplicaStatus> {
        let now = self.now();
        let st = self.lock();
        (0..st.health.len())
            .map(|r| {
                let mut s = ReplicaStatus {
                    state: match st.health.state(r) {
                        Ok(ReplicaState::InSync) => "in-sync",
                        Ok(ReplicaState::Fencing { .. }) => "fencing",
                        Ok(ReplicaState::Failed { .. }) => "failed",
                        Ok(ReplicaState::Resyncing { .. }) => "resyncing",
                        Err(_) => "unknown",
                    }
                    .into(),
                    dirty_regions: st.log.dirty_count(r),
                    ..Default::default()
                };
                if let Some(rs) = st.resync.as_ref().filter(|rs| rs.replica == r) {
                    let p = rs.planner.progress();
                    s.resync_bytes = p.bytes_copied;
                    s.resync_regions_left = p.regions_left;
                    s.resync_bytes_left = rs.planner.bytes_left();
                    s.resync_seconds_left = rs.planner.seconds_left(now);
                }
                s
            })
            .collect()
    }

    /// Whether any replica is not in sync.
    pub fn is_degraded(&self) -> bool {
        let route = self.route();
        route.writable != self.all || route.readable != self.all
    }

    /// Record an orderly stop (every request answered) in the log.
    pub fn close_clean(&self) {
        let mut st = self.lock();
        if let Err(e) = st.log.mark_clean_shutdown() {
            log::error!("volume {}: intent log: {e}", self.name);
        }
    }

    /// The manager loop: run until `stop` is set. `replicas[r]` reaches
    /// replica r; `block_size` is the volume's logical block size.
    pub fn run_manager(&self, replicas: &[Copier<'_>], block_size: u32, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let wait = self.manage(replicas, u64::from(block_size));
            std::thread::sleep(wait.min(Duration::from_millis(100)));
        }
    }

    /// One step of the manager; how long it may sleep.
    ///
    /// The lock is dropped once, around the step's blocking I/O (a resync
    /// copy, or the flush that makes copied regions durable): each can take
    /// up to the I/O timeout, and the queue threads take the lock on their
    /// data path (`before_write` while degraded or resyncing, `missed`,
    /// `path_failed`), so holding it would stall user I/O behind a copy.
    /// It is taken before the I/O to choose the step and after it to
    /// record the outcome.
    fn manage(&self, ctrls: &[Copier<'_>], bs: u64) -> Duration {
        let now = self.now();
        let (r, io) = match self.plan(self.lock(), ctrls, now) {
            Step::Sleep(wait) => return wait,
            Step::Io { replica, io } => (replica, io),
        };
        let result = match &io {
            ResyncIo::Copy {
                source: Some(src),
                job,
            } => copy(&ctrls[*src], &ctrls[r], bs, &job.range),
            ResyncIo::Copy { source: None, .. } => {
                Err("no in-sync replica to copy from".to_owned())
            }
            ResyncIo::Flush { .. } => ctrls[r]
                .ctrl
                .flush(ctrls[r].nsid)
                .map_err(|e| format!("flush: {e}")),
        };
        let mut st = self.lock();
        self.record_io(&mut st, r, io, result)
    }

    /// Under the lock: tick the replicas' health, start a resync if a
    /// replica is back, and choose the next step of the running one.
    fn plan(&self, mut st: MutexGuard<'_, State>, ctrls: &[Copier<'_>], now: Nanos) -> Step {
        if self.cluster.get().is_some_and(|c| c.is_fenced()) {
            // Another host owns the volume now: no copy may reach a target.
            return Step::Sleep(Duration::from_millis(100));
        }
        st.health.tick(now);
        if st.resync.is_none() {
            self.start_resync(&mut st, ctrls, now);
        }
        let Some(rs) = st.resync.as_mut() else {
            return Step::Sleep(Duration::from_millis(100));
        };
        let r = rs.replica;
        if let Some(region) = rs.unflushed {
            return Step::Io {
                replica: r,
                io: ResyncIo::Flush { region },
            };
        }
        match rs.planner.next_job(now) {
            Next::Job(job) => {
                let source = (0..st.health.len()).find(|&i| st.health.serves_reads(i));
                Step::Io {
                    replica: r,
                    io: ResyncIo::Copy { source, job },
                }
            }
            Next::WaitUntil(t) => Step::Sleep(Duration::from_nanos(t.nanos_since(now))),
            Next::Wait => Step::Sleep(Duration::from_millis(5)),
            Next::Done => {
                self.finish_resync(st, r, now);
                Step::Sleep(Duration::ZERO)
            }
        }
    }

    /// A fenced replica whose controller is live again starts its resync
    /// (one at a time).
    fn start_resync(&self, st: &mut State, ctrls: &[Copier<'_>], now: Nanos) {
        for r in 0..st.health.len() {
            if matches!(st.health.state(r), Ok(ReplicaState::Failed { .. }))
                && ctrls.get(r).is_some_and(|c| c.ctrl.is_live())
            {
                if let Ok(crate::replication::health::Reconnected::StartResync) =
                    st.health.on_path_reconnected(r, now)
                {
                    let dirty: Vec<u64> = st.log.dirty_regions(r).collect();
                    log::warn!(
                        "volume {}: replica {r} is back; resyncing {} regions",
                        self.name,
                        dirty.len()
                    );
                    let planner = st.planner(self.resync_config(), dirty, now);
                    st.resync = Some(Resync {
                        replica: r,
                        planner,
                        unflushed: None,
                    });
                    self.publish(st);
                    break;
                }
            }
        }
    }

    /// Under the lock again: what replica `r`'s step `io` did.
    fn record_io(
        &self,
        st: &mut State,
        r: usize,
        io: ResyncIo,
        result: Result<(), String>,
    ) -> Duration {
        // The resync may have stopped meanwhile (the replica failed again).
        let Some(rs) = st.resync.as_mut().filter(|rs| rs.replica == r) else {
            return Duration::ZERO;
        };
        match (io, result) {
            (ResyncIo::Copy { job, .. }, Ok(())) => {
                if let Ok(CopyResult::RegionClean(g)) = rs.planner.on_copy_done(job.id) {
                    // The copies must be on stable media before the bit
                    // that says they are needed goes: the next step
                    // flushes, then clears it.
                    rs.unflushed = Some(g);
                }
                Duration::ZERO
            }
            (ResyncIo::Flush { region }, Ok(())) => {
                rs.unflushed = None;
                if let Err(e) = st.log.clear(r, region) {
                    log::error!("volume {}: intent log: {e}", self.name);
                }
                Duration::ZERO
            }
            (ResyncIo::Copy { job, .. }, Err(e)) => {
                let _ = rs.planner.on_copy_failed(job.id);
                log::warn!("volume {}: resync of replica {r}: {e}", self.name);
                Duration::from_millis(500)
            }
            (ResyncIo::Flush { .. }, Err(e)) => {
                rs.unflushed = None;
                log::warn!("volume {}: resync of replica {r}: {e}", self.name);
                // Copy the region again: its bit is still set.
                self.replan(st, r, self.now());
                Duration::from_millis(500)
            }
        }
    }

    /// Every region of replica `r` was copied: record it in sync, unless
    /// bits were set meanwhile.
    fn finish_resync(&self, mut st: MutexGuard<'_, State>, r: usize, now: Nanos) {
        if st.log.dirty_count(r) > 0 {
            // Bits set after the planner started (a write that chose its
            // replicas just before the resync began): copy those too.
            self.replan(&mut st, r, now);
            return;
        }
        let copied = st
            .resync
            .as_ref()
            .map_or(0, |rs| rs.planner.progress().bytes_copied);
        match st.log.set_state(r, ReplicaSyncState::InSync) {
            Ok(m) => {
                let _ = st.health.on_resync_done(r);
                st.resync = None;
                self.publish(&st);
                self.tell_cluster(&st);
                log::warn!(
                    "volume {}: replica {r} resynced ({copied} bytes copied); in sync",
                    self.name
                );
                if let Some(e) = m.wait_for {
                    if let Err(e) = self.make_durable(st, e) {
                        log::error!("volume {}: intent log: {e}", self.name);
                    }
                }
            }
            Err(e) => log::error!("volume {}: intent log: {e}", self.name),
        }
    }

    /// Every replica of the volume.
    pub fn all(&self) -> ReplicaSet {
        self.all
    }

    /// Restart replica `r`'s resync from the bits its log still has set.
    fn replan(&self, st: &mut State, r: usize, now: Nanos) {
        let dirty: Vec<u64> = st.log.dirty_regions(r).collect();
        let planner = st.planner(self.resync_config(), dirty, now);
        if let Some(rs) = st.resync.as_mut().filter(|rs| rs.replica == r) {
            rs.planner = planner;
        }
    }

    fn resync_config(&self) -> ResyncConfig {
        ResyncConfig {
            volume_size: self.geometry.volume_size,
            region_size: self.geometry.region_size,
            max_copy_bytes: COPY_BYTES.min(self.geometry.region_size),
            max_in_flight: 1,
            rate_bps: self.rate_bps,
        }
    }
}

/// How the manager reaches one replica for resync copies.
pub struct Copier<'a> {
    /// Its controller (the copies use its blocking I/O queue).
    pub ctrl: &'a Controller,
    /// Its namespace.
    pub nsid: u32,
}

/// Copy `range` (volume bytes, block aligned) from `src` to `dst`.
fn copy(src: &Copier<'_>, dst: &Copier<'_>, bs: u64, range: &Range<u64>) -> Result<(), String> {
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    src.ctrl
        .read(src.nsid, range.start / bs, &mut buf)
        .map_err(|e| format!("reading the source: {e}"))?;
    dst.ctrl
        .write(dst.nsid, range.start / bs, &buf)
        .map_err(|e| format!("writing: {e}"))
}

/// Bring the local log in line with a cluster start plan.
fn apply_plan(
    log: &mut IntentLog,
    plan: &[ReplicaStart],
    volume_size: u64,
) -> Result<(), intent_log::IntentLogError> {
    for (r, start) in plan.iter().enumerate() {
        let local_in_sync = log.replicas()[r].state == ReplicaSyncState::InSync;
        match start {
            ReplicaStart::InSync => {
                if !local_in_sync {
                    // Another host resynced it since this log was written.
                    log.clear_all(r)?;
                    log.set_state(r, ReplicaSyncState::InSync)?;
                }
            }
            // This host wrote the record, so its log has the replica out
            // of sync with the bits it misses; if the log says in sync
            // anyway (recreated), its bits mean nothing: copy in full.
            ReplicaStart::FromBitmap if !local_in_sync => {}
            ReplicaStart::FromBitmap | ReplicaStart::FullCopy => {
                log.mark(r, 0..volume_size)?;
                log.set_state(r, ReplicaSyncState::OutOfSync)?;
            }
        }
    }
    log.sync()
}

fn log_err(e: intent_log::IntentLogError) -> Error {
    Error::State(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(dir: &Path) -> VolumeConfig {
        let toml = format!(
            r#"
name = "rv"
[[replica]]
address = "127.0.0.1"
subnqn = "nqn.2026-01.io.test:a"
[[replica]]
address = "127.0.0.1"
port = 4421
subnqn = "nqn.2026-01.io.test:b"
[replication]
region_size = "1m"
bitmap_dir = "{}"
"#,
            dir.display()
        );
        VolumeConfig::parse(Path::new("rv.toml"), &toml).expect("config")
    }

    const SIZE: u64 = 16 << 20;

    fn ids() -> Vec<String> {
        vec!["a nsid 1 serial A".into(), "b nsid 1 serial B".into()]
    }

    /// A log whose replicas were all in sync, left without a clean stop.
    fn unclean_all_in_sync(cfg: &VolumeConfig) {
        let geo = intent_log::Geometry {
            volume_name: cfg.name.clone(),
            volume_size: SIZE,
            region_size: 1 << 20,
        };
        let path = cfg.replication.bitmap_path(&cfg.name);
        let (mut log, _) = IntentLog::open_or_create(&path, &geo, &ids()).unwrap();
        log.clear_all(1).unwrap();
        log.set_state(1, ReplicaSyncState::InSync).unwrap();
        log.sync().unwrap();
    }

    #[test]
    fn a_new_volume_copies_replica_0_to_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let r = Replication::open(&cfg, &ids(), SIZE, false, None).unwrap();
        let st = r.status();
        assert_eq!(st[0].state, "in-sync");
        assert_ne!(st[1].state, "in-sync");
        assert_eq!(st[1].dirty_regions, 16);
        assert_eq!(r.route().readable, ReplicaSet::one(0));
        assert_eq!(
            r.route().writable,
            ReplicaSet::one(0),
            "not before the resync starts"
        );
    }

    #[test]
    fn an_unclean_stop_resyncs_in_full_unless_the_kernel_reissues() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        unclean_all_in_sync(&cfg);
        {
            // Taking over a live device: the reissued requests make the
            // replicas converge; nothing to copy.
            let r = Replication::open(&cfg, &ids(), SIZE, true, None).unwrap();
            assert!(r.status().iter().all(|s| s.state == "in-sync"));
            assert_eq!(r.route().readable, ReplicaSet::first_n(2));
        }
        // That open did not stop cleanly either: a fresh start now copies
        // replica 1 in full from replica 0.
        let r = Replication::open(&cfg, &ids(), SIZE, false, None).unwrap();
        let st = r.status();
        assert_eq!(st[0].state, "in-sync");
        assert_eq!(st[1].state, "fencing");
        assert_eq!(st[1].dirty_regions, 16);
        assert_eq!(r.route().readable, ReplicaSet::one(0));
        drop(r);
        // A clean stop is remembered: the next start copies nothing new.
        let r = Replication::open(&cfg, &ids(), SIZE, false, None).unwrap();
        assert_eq!(r.status()[1].dirty_regions, 16, "still owed from before");
        r.close_clean();
    }

    #[test]
    fn writes_that_miss_a_replica_are_durable_marks() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        unclean_all_in_sync(&cfg);
        let r = Replication::open(&cfg, &ids(), SIZE, true, None).unwrap();
        // Healthy: nothing recorded.
        r.before_write(&(0..4096), r.all()).unwrap();
        r.after_write(&(0..4096), r.all());
        assert!(r.status().iter().all(|s| s.dirty_regions == 0));
        // Replica 1 fails: out of sync, its writes are recorded.
        assert!(matches!(
            r.path_failed(1).unwrap(),
            FailOutcome::OutOfSync { .. }
        ));
        assert_eq!(r.route().writable, ReplicaSet::one(0));
        assert_eq!(r.route().readable, ReplicaSet::one(0));
        r.before_write(&((3 << 20)..(3 << 20) + 8192), r.route().writable)
            .unwrap();
        r.missed(1, &((5 << 20)..(6 << 20) + 1)).unwrap();
        assert_eq!(r.status()[1].dirty_regions, 3);
        // The last in-sync replica does not go out of sync.
        assert!(matches!(
            r.path_failed(0).unwrap(),
            FailOutcome::LastInSync { .. }
        ));
        assert_eq!(r.route().writable, ReplicaSet::one(0));
        drop(r);
        // The marks survived (durable before the writes were sent).
        let geo = intent_log::Geometry {
            volume_name: "rv".into(),
            volume_size: SIZE,
            region_size: 1 << 20,
        };
        let (log, _) =
            IntentLog::open_or_create(&cfg.replication.bitmap_path("rv"), &geo, &ids()).unwrap();
        let dirty: Vec<u64> = log.dirty_regions(1).collect();
        assert_eq!(dirty, vec![3, 5, 6]);
    }
}
