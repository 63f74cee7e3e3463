//! Target-wide state: subsystems, namespaces, live controllers, tenants.
//!
//! Built once from the configuration and shared (behind `Arc`) by every
//! connection. Mutable parts (the controller table, the tenant table) sit
//! behind their own short-lived locks; nothing here is held across I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::backend::{self, BackendInfo};
use crate::config::{BackendConfig, NamespaceConfig, QosMode, SubsystemConfig, TargetConfig};
use crate::frontend::budget::BytePool;
use crate::frontend::controller::Controller;
use crate::frontend::log_limit::LogLimiter;
use crate::frontend::reservation::{HostId, NamespaceReservations, Sidecar};
use crate::pipeline::Pipeline;

/// One namespace: its geometry, identity and pipeline.
#[derive(Debug)]
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// log2 of the block size (LBADS).
    pub block_shift: u8,
    /// Capacity in logical blocks (NSZE).
    pub size_blocks: u64,
    /// Globally unique ID, stable across restarts (derived from the
    /// subsystem NQN and NSID), so hosts recognize the namespace after a
    /// target restart.
    pub nguid: [u8; 16],
    /// What the backend supports.
    pub info: BackendInfo,
    /// The per-device pipeline every I/O passes through.
    pub pipeline: Pipeline,
    /// The configuration it was built from.
    pub config: NamespaceConfig,
    /// Its reservations, shared by every controller of the subsystem.
    pub reservations: NamespaceReservations,
}

impl Namespace {
    fn open(subnqn: &str, config: &NamespaceConfig) -> anyhow::Result<Self> {
        let backend = backend::open(&config.backend, config.block_size).with_context(|| {
            format!(
                "subsystem {subnqn} namespace {}: opening {} backend",
                config.nsid,
                config.backend.kind()
            )
        })?;
        let info = backend.info();
        let reservations = NamespaceReservations::new(config.nsid, reservation_sidecar(config))
            .with_context(|| {
                format!(
                    "subsystem {subnqn} namespace {}: reading its reservations",
                    config.nsid
                )
            })?;
        let block_shift = config.block_size.trailing_zeros() as u8;
        let mut id = Vec::from(subnqn.as_bytes());
        id.extend_from_slice(&config.nsid.to_le_bytes());
        let h1 = fnv1a(&id, 0xcbf2_9ce4_8422_2325);
        let h2 = fnv1a(&id, 0x6c62_272e_07bb_0142);
        let mut nguid = [0u8; 16];
        nguid[..8].copy_from_slice(&h1.to_be_bytes());
        nguid[8..].copy_from_slice(&h2.to_be_bytes());
        Ok(Namespace {
            nsid: config.nsid,
            block_size: config.block_size,
            block_shift,
            size_blocks: info.size_bytes >> block_shift,
            nguid,
            info,
            pipeline: match config.qos {
                QosMode::None => Pipeline::new(backend),
                QosMode::Gimbal => {
                    Pipeline::with_gimbal(backend, &config.gimbal).with_context(|| {
                        format!(
                            "subsystem {subnqn} namespace {}: gimbal parameters",
                            config.nsid
                        )
                    })?
                }
            },
            config: config.clone(),
            reservations,
        })
    }

    /// The namespace's UUID: its NGUID with the RFC 4122 version (8,
    /// custom) and variant bits set.
    pub fn uuid(&self) -> [u8; 16] {
        let mut u = self.nguid;
        u[6] = (u[6] & 0x0F) | 0x80;
        u[8] = (u[8] & 0x3F) | 0x80;
        u
    }
}

/// Where a namespace's reservations persist (PTPL): beside a `file`
/// backend's regular file, as `PATH.resv`. Memory backends lose their data
/// on a restart, so keeping reservations for them would mean nothing, and a
/// block device has no directory of its own to keep them in: those report
/// PTPL unsupported (Identify Namespace RESCAP bit 0 clear) and keep their
/// reservations for the life of the process.
fn reservation_sidecar(config: &NamespaceConfig) -> Option<Sidecar> {
    use std::os::unix::fs::FileTypeExt;
    let BackendConfig::File { path, .. } = &config.backend else {
        return None;
    };
    let meta = std::fs::metadata(path).ok()?;
    if meta.file_type().is_block_device() || meta.file_type().is_char_device() {
        return None;
    }
    let mut p = path.clone().into_os_string();
    p.push(".resv");
    Some(Sidecar::new(p.into()))
}

/// Live controllers of `subsystem` whose host is `host`.
pub fn controllers_of_host(
    target: &Target,
    subsystem: &Arc<Subsystem>,
    host: &HostId,
) -> Vec<Arc<Controller>> {
    target
        .controllers()
        .into_iter()
        .filter(|c| {
            &c.host_id == host
                && c.subsystem
                    .as_ref()
                    .is_some_and(|s| Arc::ptr_eq(s, subsystem))
        })
        .collect()
}

fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One NVM subsystem with its open namespaces.
#[derive(Debug)]
pub struct Subsystem {
    /// Its configuration.
    pub config: SubsystemConfig,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
}

impl Subsystem {
    /// The NQN.
    pub fn nqn(&self) -> &str {
        &self.config.nqn
    }

    /// The largest NSID (NN in Identify Controller).
    pub fn max_nsid(&self) -> u32 {
        self.namespaces.keys().next_back().copied().unwrap_or(0)
    }
}

/// Everything a connection needs to serve hosts.
#[derive(Debug)]
pub struct Target {
    /// The configuration.
    pub config: TargetConfig,
    /// NVM subsystems by NQN.
    pub subsystems: BTreeMap<String, Arc<Subsystem>>,
    /// Addresses actually bound (ports resolved), for the discovery log.
    pub listen_addrs: Mutex<Vec<SocketAddr>>,
    controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    tenants: Mutex<BTreeMap<String, u32>>,
    started: Instant,
    /// Commands received but not yet completed, target-wide (shutdown waits
    /// for this to reach zero).
    pub inflight: AtomicUsize,
    /// Cancelled when the target shuts down.
    pub shutdown: CancellationToken,
    /// Connections accepted so far (for status and tests).
    pub connections_accepted: AtomicU64,
    /// Connections being served now (at most `limits.max_connections`).
    pub connections_live: AtomicUsize,
    /// Bytes all queues together may hold buffered
    /// (`limits.max_buffered_bytes`; see `frontend::budget`).
    pub buffered: Arc<BytePool>,
    /// Rate limits for log lines a host can provoke.
    pub log_limiter: LogLimiter,
    /// Hosts whose last authentication failed, so that a host retrying
    /// with a wrong key is logged once, not on every queue and reconnect.
    /// Only `[[host]]` NQNs ever authenticate, so the config bounds it.
    auth_failed: Mutex<BTreeSet<String>>,
}

impl Target {
    /// Opens every namespace backend. Fails, naming the namespace, when a
    /// backend cannot be opened.
    pub fn new(config: TargetConfig) -> anyhow::Result<Self> {
        let mut subsystems = BTreeMap::new();
        for s in &config.subsystems {
            let mut namespaces = BTreeMap::new();
            for n in &s.namespaces {
                namespaces.insert(n.nsid, Arc::new(Namespace::open(&s.nqn, n)?));
            }
            subsystems.insert(
                s.nqn.clone(),
                Arc::new(Subsystem {
                    config: s.clone(),
                    namespaces,
                }),
            );
        }
        let buffered = Arc::new(BytePool::new(
            usize::try_from(config.limits.max_buffered_bytes).unwrap_or(usize::MAX),
        ));
        Ok(Target {
            config,
            subsystems,
            listen_addrs: Mutex::new(Vec::new()),
            controllers: Mutex::new(BTreeMap::new()),
            next_cntlid: Mutex::new(1),
            tenants: Mutex::new(BTreeMap::new()),
            started: Instant::now(),
            inflight: AtomicUsize::new(0),
            shutdown: CancellationToken::new(),
            connections_accepted: AtomicU64::new(0),
            connections_live: AtomicUsize::new(0),
            buffered,
            log_limiter: LogLimiter::default(),
            auth_failed: Mutex::new(BTreeSet::new()),
        })
    }

    /// Records that `host` failed to authenticate; true the first time
    /// since its last success (the failure worth a warning).
    pub fn note_auth_failure(&self, host: &str) -> bool {
        let mut f = self.auth_failed.lock().unwrap_or_else(|e| e.into_inner());
        f.insert(host.to_string())
    }

    /// Records that `host` authenticated: its next failure is news again.
    pub fn note_auth_success(&self, host: &str) {
        let mut f = self.auth_failed.lock().unwrap_or_else(|e| e.into_inner());
        f.remove(host);
    }

    /// Milliseconds since the target started (the clock for keep-alive).
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The tenant index of a host NQN (stable for the life of the process).
    pub fn tenant_of(&self, host_nqn: &str) -> u32 {
        let mut t = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let next = t.len() as u32;
        *t.entry(host_nqn.to_string()).or_insert(next)
    }

    /// The host NQN of a tenant index, if one was assigned.
    pub fn tenant_nqn(&self, tenant: u32) -> Option<String> {
        let t = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().find(|(_, &i)| i == tenant).map(|(n, _)| n.clone())
    }

    /// The virtual view (§3.7) of every namespace that runs the Gimbal
    /// switch, one structured `key=value` line each, in subsystem and NSID
    /// order: what `gimbal-target run` logs periodically as its status.
    /// Tenants appear as `tenant=<host NQN>:credit/queued/in_flight`.
    pub fn gimbal_status_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for s in self.subsystems.values() {
            for n in s.namespaces.values() {
                let Some(v) = n.pipeline.virtual_view() else {
                    continue;
                };
                let us = |ns: Option<u64>| ns.map_or("-".to_string(), |ns| (ns / 1000).to_string());
                let mut line = format!(
                    "gimbal-view subsystem={} nsid={} state={:?} target_rate_bps={} \
                     read_headroom_bps={} write_headroom_bps={} write_cost={:.2} \
                     read_latency_ewma_us={} write_latency_ewma_us={} allotted_slots={} \
                     in_flight={} queued={}",
                    s.nqn(),
                    n.nsid,
                    v.congestion_state,
                    v.target_rate_bps,
                    v.read_headroom_bps,
                    v.write_headroom_bps,
                    v.write_cost,
                    us(v.read_latency_ewma_ns),
                    us(v.write_latency_ewma_ns),
                    v.allotted_slots,
                    v.in_flight,
                    v.queued
                );
                for t in &v.tenants {
                    let name = self
                        .tenant_nqn(t.tenant.0)
                        .unwrap_or_else(|| t.tenant.to_string());
                    line.push_str(&format!(
                        " tenant={name}:{}/{}/{}",
                        t.credit, t.queued, t.in_flight
                    ));
                }
                lines.push(line);
            }
        }
        lines
    }

    /// Allocates a controller ID (1..=0xFFEF, the dynamic range) not in use.
    pub fn register_controller(
        &self,
        make: impl FnOnce(u16) -> Arc<Controller>,
    ) -> Option<Arc<Controller>> {
        let mut ctrls = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = self.next_cntlid.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..0xFFEF {
            let id = *next;
            *next = if id >= 0xFFEF { 1 } else { id + 1 };
            if let std::collections::btree_map::Entry::Vacant(v) = ctrls.entry(id) {
                let c = make(id);
                v.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    /// The live controller with this ID.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        let ctrls = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        ctrls.get(&cntlid).cloned()
    }

    /// Removes a controller (after teardown).
    pub fn unregister_controller(&self, cntlid: u16) {
        let mut ctrls = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        ctrls.remove(&cntlid);
    }

    /// Snapshot of live controllers.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        let ctrls = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        ctrls.values().cloned().collect()
    }

    /// Flushes every namespace's backend (shutdown). Returns the first
    /// error, after trying all.
    pub fn flush_all(&self) -> std::io::Result<()> {
        let mut first = Ok(());
        for s in self.subsystems.values() {
            for n in s.namespaces.values() {
                if let Err(e) = n.pipeline.flush_blocking() {
                    log::error!("flushing {} namespace {}: {e}", s.nqn(), n.nsid);
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        first
    }
}
