//! Flint's client side of an elastic volume (issue 18; the paper's §3.3,
//! §4.5 and §4.6): the view agent, the auction's slices and the eIO
//! scheduler. The arbiter's side is `evol-arbiter`; the policies are
//! `flint_core`'s (pure); this module is the driver around them.
//!
//! # The pieces
//!
//! - [`EvolQos`] (one per volume, shared by the queue threads and the
//!   agent thread): completions are counted into atomic cells per
//!   (member, kind, size class) with three relaxed adds, so the data path
//!   neither locks nor allocates for the view; each member's slices
//!   ([`ClientSlices`]) sit behind a mutex held for a few instructions by
//!   an admission.
//! - [`AgentThread`]: every `report_interval` it drains the cells into
//!   aggregated vectors (ReportIo), asks the view (QueryView) for each
//!   member's write cost, the profile's least cost per I/O and the
//!   bottleneck report's victims, and releases the slices of members idle
//!   for [`IDLE_RELEASE`]; in between, it asks for slices (RequestSlices,
//!   several per round trip) for members that run low or refused an I/O.
//! - [`EvolSched`] (one per ublk queue): one `flint_core`
//!   [`EioScheduler`] per I/O class between the eVol's planning (mapped
//!   pieces) and the QoS stage. A class sends its next I/O to the QoS
//!   stage only when that class has nothing waiting there, so the class
//!   arbiter still decides *between* classes (ionice rules) and eIO
//!   decides the order *within* a class: cheaper I/Os first, order kept
//!   per (queue, extent) stream, aging, victims ranked down. The auction
//!   is eIO's admission test: an I/O leaves eIO only when every member it
//!   touches has a slice with room (the fast path: no network).
//!
//! # Decisions
//!
//! - **Reports are aggregated**, not per I/O: one vector per member, kind
//!   and power-of-two size class per interval sums the I/Os' bytes and
//!   latencies (the view's windows are sums, so nothing is lost but the
//!   per-I/O clipping of the write-cost excess). A busy client sends at
//!   most 16 x 2 x 9 vectors per interval however many IOPS it does; per-I/O
//!   vectors would be tens of MB/s per client (`docs/evol.md`).
//! - **What an I/O costs**: per member it touches, its piece bytes priced
//!   by `flint_core::auction::cost_bytes` with the view's write cost and
//!   the arbiter's least cost per I/O, so the client charges its slices in
//!   the arbiter's currency. A write costs on every copy; a read on the
//!   copy it reads. Flushes, discards and write-zeroes are not charged and
//!   do not wait in eIO (they move no data through the drive's bandwidth
//!   the auction shares; a flush may pass writes not yet sent, which the
//!   block layer allows: it covers completed writes only).
//! - **The auction fails open.** It shares bandwidth; it does not keep
//!   data safe. Until the first answer to RequestSlices, after an error,
//!   and when a member waited [`STARVE_LIMIT`] for a slice while asking,
//!   admissions are not gated (status says so and why) and demand is still
//!   counted, so the next answer sizes the request. An arbiter that is down
//!   or failing over must not stop I/O to mapped extents (the issue's
//!   failure rule), so neither may its auction.
//! - **eIO's bandwidth** per member (the rank's cost time) is what the
//!   auction granted this client there in the last interval, else the
//!   view's headroom; **sessions** are the arbiter's: (client, eVol,
//!   target port), so a victim named `client/evol@address` ranks down the
//!   I/Os to every member at that address.
//! - With `eio = false` every I/O of a class is one stream: eIO keeps
//!   arrival order and only the auction gates.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use evol_arbiter::pb;
use flint_core::auction::{cost_bytes, ClientSlices, Grant};
use flint_core::eio::{EioConfig, EioRequest, EioScheduler, NamespaceCost, StreamId};
use flint_core::{IoKind, NamespaceId, Nanos, SessionId};
use qos_core::priority::NvmeClass;

use crate::evol::MAX_MEMBERS;

/// Power-of-two size classes of the view reports: 4 KiB and less, 8 KiB,
/// ..., 1 MiB and more.
pub const SIZE_CLASSES: usize = 9;

/// Interval between view reports until the view says its epoch (when
/// `report_interval` is not set).
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_millis(100);

/// Bounds on a report interval taken from the view's epoch.
const REPORT_INTERVAL_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(10));

/// How long RequestSlices may wait at the arbiter for grants not
/// available at once (the agent asks again after).
pub const SLICE_WAIT: Duration = Duration::from_millis(20);

/// A member that refused I/Os this long while the agent asked for slices
/// and got none: the auction stops gating until a grant arrives (fail
/// open, see the module docs).
pub const STARVE_LIMIT: Duration = Duration::from_secs(1);

/// A member with slices and no I/O for this long gives them back
/// (ReleaseSlices): its share goes to the others at the next epoch.
pub const IDLE_RELEASE: Duration = Duration::from_secs(1);

/// After a failed RequestSlices the agent waits this long before asking
/// again.
pub const ERROR_BACKOFF: Duration = Duration::from_millis(250);

/// Slice size assumed before the first grant says the arbiter's.
const DEFAULT_SLICE_BYTES: u64 = 256 * 1024;

/// Bandwidth assumed for eIO's rank before the view or the auction says
/// more (1 GB/s, `EioConfig`'s default).
const DEFAULT_BANDWIDTH: f64 = 1e9;

const CLASSES: usize = NvmeClass::ALL.len();

/// The size class of an I/O of `bytes`.
pub fn size_class(bytes: u64) -> usize {
    let log2 = 64 - bytes.max(1).saturating_sub(1).leading_zeros() as usize;
    log2.saturating_sub(12).min(SIZE_CLASSES - 1)
}

#[derive(Default)]
struct Cell {
    count: AtomicU64,
    bytes: AtomicU64,
    latency_ns: AtomicU64,
}

/// One member's slices and what the agent needs to know to ask for more.
struct MemberSlices {
    slices: ClientSlices,
    /// Cost admitted or refused since the last request for slices.
    demand: u64,
    /// An admission was refused since the last grant.
    starved_since: Option<Nanos>,
    /// The last admission.
    last_use: Option<Nanos>,
    /// It holds slices the arbiter counts as an active flow.
    holds: bool,
    /// The last grant's size.
    slice_bytes: u64,
    /// Granted since the last report (eIO's bandwidth estimate).
    granted: u64,
}

/// `[evol]` settings of Flint's client side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlintSettings {
    /// Gate I/O by the auction's slices.
    pub auction: bool,
    /// Order I/Os within a class by cost (else arrival order).
    pub eio: bool,
    /// Interval between view reports; `None`: the view's epoch, as
    /// QueryView says (a vector older than two epochs is stale there).
    pub report_interval: Option<Duration>,
}

impl Default for FlintSettings {
    fn default() -> Self {
        FlintSettings {
            auction: true,
            eio: true,
            report_interval: None,
        }
    }
}

/// Counters of the agent and the auction, for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlintStatus {
    /// Admissions are gated by slices now.
    pub auction_enforced: bool,
    /// Why not, when the auction is on and not enforced.
    #[serde(default)]
    pub auction_note: Option<String>,
    /// Slices granted since start.
    pub slices_granted: u64,
    /// Admissions refused for want of a slice (each waited for a grant).
    pub slice_waits: u64,
    /// View reports sent.
    pub reports: u64,
    /// Their vectors the view accepted (known sessions and namespaces,
    /// not stale).
    #[serde(default)]
    pub vectors_accepted: u64,
    /// Calls to the arbiter that failed (reports, queries, slices).
    pub agent_errors: u64,
    /// Members the last bottleneck report named victims.
    #[serde(default)]
    pub victim_members: usize,
}

#[derive(Default)]
struct Counters {
    slices_granted: AtomicU64,
    slice_waits: AtomicU64,
    reports: AtomicU64,
    vectors_accepted: AtomicU64,
    agent_errors: AtomicU64,
}

/// Flint's client side of one eVol (see the module docs).
pub struct EvolQos {
    client: String,
    evol: String,
    settings: FlintSettings,
    /// Member m's pool namespace id.
    members: Vec<String>,
    /// Member m's session: the index of its target address in `addresses`.
    session_of: Vec<u32>,
    addresses: Vec<String>,
    cells: Vec<Cell>,
    slices: Vec<Mutex<MemberSlices>>,
    enforcing: AtomicBool,
    note: Mutex<Option<String>>,
    /// (member m's cost, version).
    costs: RwLock<(Vec<NamespaceCost>, u64)>,
    /// (sessions the last bottleneck report named, version).
    victims: RwLock<(Vec<SessionId>, u64)>,
    wake: (Mutex<bool>, Condvar),
    /// After a failed RequestSlices: not before this (no tight loop of
    /// failing calls while the arbiter is away).
    backoff_until: Mutex<Option<Instant>>,
    /// The last call to the arbiter failed.
    failing: AtomicBool,
    stop: AtomicBool,
    counters: Counters,
    base: Instant,
}

/// The arbiter calls the agent makes (the real one is [`ArbiterLink`];
/// tests give a fake).
pub trait FlintLink: Send {
    /// ReportIo: how many vectors the view accepted.
    fn report_io(
        &mut self,
        client: &str,
        evol: &str,
        vectors: &[pb::IoVector],
    ) -> Result<u32, String>;
    /// RequestSlices: up to `slices` of each of `namespaces`.
    fn request_slices(
        &mut self,
        client: &str,
        evol: &str,
        namespaces: &[String],
        slices: u32,
        wait: Duration,
    ) -> Result<Vec<pb::SliceGrant>, String>;
    /// ReleaseSlices.
    fn release_slices(
        &mut self,
        client: &str,
        evol: &str,
        namespaces: &[String],
    ) -> Result<(), String>;
    /// QueryView of `namespaces`.
    fn query_view(&mut self, namespaces: &[String]) -> Result<pb::QueryViewResponse, String>;
}

/// [`FlintLink`] over gRPC to the leading arbiter, connected on first use.
pub struct ArbiterLink {
    opts: evol_arbiter::client::ClientOptions,
    client: Option<evol_arbiter::client::ArbiterClient>,
}

impl ArbiterLink {
    /// A link that finds the arbiter as `opts` say.
    pub fn new(opts: evol_arbiter::client::ClientOptions) -> Self {
        ArbiterLink { opts, client: None }
    }

    fn client(&mut self) -> Result<&evol_arbiter::client::ArbiterClient, String> {
        if self.client.is_none() {
            let c = evol_arbiter::client::ArbiterClient::connect(self.opts.clone())
                .map_err(|e| format!("arbiter client: {e}"))?;
            self.client = Some(c);
        }
        Ok(self.client.as_ref().expect("set above"))
    }
}

impl FlintLink for ArbiterLink {
    fn report_io(
        &mut self,
        client: &str,
        evol: &str,
        vectors: &[pb::IoVector],
    ) -> Result<u32, String> {
        self.client()?
            .report_io(client, evol, vectors)
            .map(|ack| ack.accepted)
            .map_err(|e| format!("ReportIo: {e}"))
    }

    fn request_slices(
        &mut self,
        client: &str,
        evol: &str,
        namespaces: &[String],
        slices: u32,
        wait: Duration,
    ) -> Result<Vec<pb::SliceGrant>, String> {
        self.client()?
            .request_slices(client, evol, namespaces, slices, wait)
            .map_err(|e| format!("RequestSlices: {e}"))
    }

    fn release_slices(
        &mut self,
        client: &str,
        evol: &str,
        namespaces: &[String],
    ) -> Result<(), String> {
        self.client()?
            .release_slices(client, evol, namespaces)
            .map_err(|e| format!("ReleaseSlices: {e}"))
    }

    fn query_view(&mut self, namespaces: &[String]) -> Result<pb::QueryViewResponse, String> {
        self.client()?
            .query_view(namespaces)
            .map_err(|e| format!("QueryView: {e}"))
    }
}

/// A client name the arbiter accepts (1 to 64 of `[A-Za-z0-9_.-]`) from
/// a host NQN: other characters become `-`, and the end is kept (an NQN's
/// unique part, a UUID or a host name, is at its end).
pub fn client_name(nqn: &str) -> String {
    let s: String = nqn
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let s = &s[s.len().saturating_sub(64)..];
    let s = s.trim_start_matches('.');
    if s.is_empty() {
        "client".to_owned()
    } else {
        s.to_owned()
    }
}

impl EvolQos {
    /// Flint's client side of eVol `evol` as `client`, over `members`
    /// (pool namespace ids) at `addresses` (each member's target
    /// `HOST:PORT`, as the pool records it).
    pub fn new(
        client: &str,
        evol: &str,
        members: Vec<String>,
        addresses: &[String],
        settings: FlintSettings,
    ) -> Arc<Self> {
        assert_eq!(members.len(), addresses.len());
        assert!(members.len() <= MAX_MEMBERS);
        let mut distinct: Vec<String> = Vec::new();
        let session_of: Vec<u32> = addresses
            .iter()
            .map(|a| match distinct.iter().position(|d| d == a) {
                Some(i) => i as u32,
                None => {
                    distinct.push(a.clone());
                    (distinct.len() - 1) as u32
                }
            })
            .collect();
        let slices = (0..members.len())
            .map(|m| {
                Mutex::new(MemberSlices {
                    slices: ClientSlices::new(
                        SessionId(session_of[m]),
                        NamespaceId(m as u32),
                        DEFAULT_SLICE_BYTES,
                    ),
                    demand: 0,
                    starved_since: None,
                    last_use: None,
                    holds: false,
                    slice_bytes: DEFAULT_SLICE_BYTES,
                    granted: 0,
                })
            })
            .collect();
        let default_cost = NamespaceCost {
            min_cost_bytes: 0,
            write_cost: 1.0,
            bandwidth_bytes_per_sec: DEFAULT_BANDWIDTH,
        };
        let n = members.len();
        Arc::new(EvolQos {
            client: client.to_owned(),
            evol: evol.to_owned(),
            settings,
            session_of,
            addresses: distinct,
            cells: (0..n * 2 * SIZE_CLASSES).map(|_| Cell::default()).collect(),
            slices,
            members,
            enforcing: AtomicBool::new(false),
            note: Mutex::new(settings.auction.then(|| "no slices granted yet".to_owned())),
            costs: RwLock::new((vec![default_cost; n], 0)),
            victims: RwLock::new((Vec::new(), 0)),
            wake: (Mutex::new(false), Condvar::new()),
            backoff_until: Mutex::new(None),
            failing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            base: Instant::now(),
        })
    }

    /// The settings.
    pub fn settings(&self) -> FlintSettings {
        self.settings
    }

    /// Now on the slices' clock.
    fn now(&self) -> Nanos {
        Nanos(self.base.elapsed().as_nanos() as u64)
    }

    fn cell(&self, member: usize, kind: IoKind, class: usize) -> &Cell {
        let k = match kind {
            IoKind::Read => 0,
            IoKind::Write => 1,
        };
        &self.cells[(member * 2 + k) * SIZE_CLASSES + class]
    }

    /// A data I/O of `bytes` on `member` completed after `latency_ns`:
    /// counted for the next view report (the data path's whole cost).
    pub fn record(&self, member: usize, kind: IoKind, bytes: u64, latency_ns: u64) {
        if member >= self.members.len() {
            return;
        }
        let c = self.cell(member, kind, size_class(bytes));
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.latency_ns.fetch_add(latency_ns, Ordering::Relaxed);
        c.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The cells since the last drain as ReportIo vectors, `age_ns` each.
    /// (A completion counted between the swaps of one cell's fields may
    /// land half in this interval and half in the next: noise, not loss.)
    fn drain(&self, age_ns: u64) -> Vec<pb::IoVector> {
        let mut out = Vec::new();
        for m in 0..self.members.len() {
            for kind in [IoKind::Read, IoKind::Write] {
                for class in 0..SIZE_CLASSES {
                    let c = self.cell(m, kind, class);
                    let count = c.count.swap(0, Ordering::Relaxed);
                    if count == 0 {
                        continue;
                    }
                    out.push(pb::IoVector {
                        namespace: self.members[m].clone(),
                        kind: match kind {
                            IoKind::Read => pb::IoKind::Read as i32,
                            IoKind::Write => pb::IoKind::Write as i32,
                        },
                        bytes: c.bytes.swap(0, Ordering::Relaxed),
                        latency_ns: c.latency_ns.swap(0, Ordering::Relaxed),
                        age_ns,
                        count,
                    });
                }
            }
        }
        out
    }

    fn lock(&self, member: usize) -> std::sync::MutexGuard<'_, MemberSlices> {
        self.slices[member]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an I/O costing `costs` (per member) may go now: every
    /// member it touches has a slice with room, or the auction does not
    /// gate now (see the module docs). Charges the slices when it goes.
    pub fn try_admit(&self, costs: &MemberCosts) -> bool {
        if !self.settings.auction || costs.is_empty() {
            return true;
        }
        let now = self.now();
        let enforcing = self.enforcing.load(Ordering::Acquire);
        if enforcing {
            let mut refused = false;
            for (m, cost) in costs.iter() {
                let mut g = self.lock(m);
                if g.slices.room(now) == 0 {
                    g.demand = g.demand.saturating_add(cost);
                    g.starved_since.get_or_insert(now);
                    refused = true;
                }
            }
            if refused {
                self.counters.slice_waits.fetch_add(1, Ordering::Relaxed);
                self.notify();
                return false;
            }
        }
        for (m, cost) in costs.iter() {
            let mut g = self.lock(m);
            if enforcing {
                // Room was there a moment ago; if another queue took it
                // since, this I/O passes uncharged (at most one per queue
                // per race: not worth a second lock round).
                let _ = g.slices.try_admit(now, cost);
            }
            g.demand = g.demand.saturating_add(cost);
            g.last_use = Some(now);
        }
        true
    }

    fn notify(&self) {
        let (lock, cv) = &self.wake;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_one();
    }

    /// Member costs of eIO's rank and the slices: (costs, version).
    fn costs(&self) -> (Vec<NamespaceCost>, u64) {
        self.costs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn victims(&self) -> (Vec<SessionId>, u64) {
        self.victims
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What `status` shows.
    pub fn status(&self) -> FlintStatus {
        let c = &self.counters;
        let enforced = self.enforcing.load(Ordering::Acquire);
        FlintStatus {
            auction_enforced: enforced,
            auction_note: if enforced {
                None
            } else if !self.settings.auction {
                Some("off ([evol] auction = false)".to_owned())
            } else {
                self.note.lock().unwrap_or_else(|e| e.into_inner()).clone()
            },
            slices_granted: c.slices_granted.load(Ordering::Relaxed),
            slice_waits: c.slice_waits.load(Ordering::Relaxed),
            reports: c.reports.load(Ordering::Relaxed),
            vectors_accepted: c.vectors_accepted.load(Ordering::Relaxed),
            agent_errors: c.agent_errors.load(Ordering::Relaxed),
            victim_members: {
                let (v, _) = self.victims();
                (0..self.members.len())
                    .filter(|&m| v.contains(&SessionId(self.session_of[m])))
                    .count()
            },
        }
    }

    fn stop_enforcing(&self, why: String) {
        if self.enforcing.swap(false, Ordering::AcqRel) {
            log::warn!(
                "eVol {}: the bandwidth auction stops gating I/O: {why}",
                self.evol
            );
        }
        *self.note.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    fn error(&self, why: String) {
        self.failing.store(true, Ordering::Release);
        self.counters.agent_errors.fetch_add(1, Ordering::Relaxed);
        log::debug!("eVol {}: {why}", self.evol);
    }

    /// One round of asking for slices: for members that refused I/Os or
    /// run low while in use. Whether any was asked.
    fn ask_slices(&self, link: &mut dyn FlintLink) -> bool {
        {
            let mut b = self.backoff_until.lock().unwrap_or_else(|e| e.into_inner());
            match *b {
                Some(t) if Instant::now() < t => return false,
                Some(_) => *b = None,
                None => {}
            }
        }
        let now = self.now();
        let mut ask = Vec::new();
        let mut want = 1u64;
        for m in 0..self.members.len() {
            let mut g = self.lock(m);
            let low = g.slice_bytes;
            let in_use = g
                .last_use
                .is_some_and(|t| now.nanos_since(t) < IDLE_RELEASE.as_nanos() as u64);
            if g.starved_since.is_some() || (in_use && g.demand > 0 && g.slices.room(now) < low) {
                ask.push(m);
                want = want.max(g.demand.div_ceil(g.slice_bytes.max(1)) + 1);
            }
        }
        if ask.is_empty() {
            return false;
        }
        let names: Vec<String> = ask.iter().map(|&m| self.members[m].clone()).collect();
        let want = want.min(u64::from(evol_arbiter::limits::MAX_SLICES_PER_REQUEST)) as u32;
        match link.request_slices(&self.client, &self.evol, &names, want, SLICE_WAIT) {
            Ok(grants) => {
                self.failing.store(false, Ordering::Release);
                let now = self.now();
                for m in &ask {
                    self.lock(*m).demand = 0;
                }
                for g in &grants {
                    let Some(m) = self.members.iter().position(|n| *n == g.namespace) else {
                        continue;
                    };
                    let mut s = self.lock(m);
                    s.slices.on_grant(
                        now,
                        &Grant {
                            session: SessionId(self.session_of[m]),
                            namespace: NamespaceId(m as u32),
                            bytes: g.bytes,
                            epoch: g.epoch,
                            expires_at: Nanos(now.as_nanos().saturating_add(g.valid_for_ns)),
                        },
                    );
                    s.starved_since = None;
                    s.holds = true;
                    s.slice_bytes = g.bytes.max(1);
                    s.granted = s.granted.saturating_add(g.bytes);
                    self.counters.slices_granted.fetch_add(1, Ordering::Relaxed);
                }
                if !grants.is_empty() && !self.enforcing.swap(true, Ordering::AcqRel) {
                    log::info!("eVol {}: the bandwidth auction gates I/O", self.evol);
                }
                // A member that asked and got nothing for STARVE_LIMIT
                // while refusing I/Os: fail open.
                let starved = ask.iter().find(|&&m| {
                    self.lock(m)
                        .starved_since
                        .is_some_and(|t| now.nanos_since(t) > STARVE_LIMIT.as_nanos() as u64)
                });
                if let Some(&m) = starved {
                    self.stop_enforcing(format!(
                        "no slice of {} for {} ms while I/O waited",
                        self.members[m],
                        STARVE_LIMIT.as_millis()
                    ));
                    for m in 0..self.members.len() {
                        self.lock(m).starved_since = None;
                    }
                }
            }
            Err(e) => {
                self.error(e.clone());
                self.stop_enforcing(e);
                *self.backoff_until.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Instant::now() + ERROR_BACKOFF);
                for m in 0..self.members.len() {
                    self.lock(m).starved_since = None;
                }
            }
        }
        true
    }

    /// One report interval: ReportIo, QueryView, idle releases. Returns
    /// the view's epoch, if QueryView answered.
    fn report(&self, link: &mut dyn FlintLink, interval: Duration) -> Option<Duration> {
        let vectors = self.drain(interval.as_nanos() as u64 / 2);
        if !vectors.is_empty() {
            match link.report_io(&self.client, &self.evol, &vectors) {
                Ok(accepted) => {
                    self.counters.reports.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .vectors_accepted
                        .fetch_add(u64::from(accepted), Ordering::Relaxed);
                }
                Err(e) => self.error(e),
            }
        }
        let secs = interval.as_secs_f64().max(1e-3);
        let mut epoch = None;
        match link.query_view(&self.members) {
            Ok(view) => {
                epoch = (view.epoch_ns > 0).then(|| Duration::from_nanos(view.epoch_ns));
                let (mut costs, version) = self.costs();
                for v in &view.namespaces {
                    let Some(m) = self.members.iter().position(|n| *n == v.namespace) else {
                        continue;
                    };
                    let granted = std::mem::take(&mut self.lock(m).granted);
                    let bandwidth = if granted > 0 {
                        granted as f64 / secs
                    } else if v.headroom_bytes_per_sec.is_finite()
                        && v.headroom_bytes_per_sec >= 1.0
                    {
                        v.headroom_bytes_per_sec
                    } else {
                        DEFAULT_BANDWIDTH
                    };
                    costs[m] = NamespaceCost {
                        min_cost_bytes: v.min_cost_bytes,
                        write_cost: if v.write_cost.is_finite() {
                            v.write_cost.max(1.0)
                        } else {
                            1.0
                        },
                        bandwidth_bytes_per_sec: bandwidth,
                    };
                }
                *self.costs.write().unwrap_or_else(|e| e.into_inner()) = (costs, version + 1);
                let prefix = format!("{}/{}@", self.client, self.evol);
                let victims: Vec<SessionId> = view
                    .report
                    .iter()
                    .flat_map(|r| r.victims.iter())
                    .filter_map(|v| v.strip_prefix(&prefix))
                    .filter_map(|a| self.addresses.iter().position(|d| d == a))
                    .map(|i| SessionId(i as u32))
                    .collect();
                let mut g = self.victims.write().unwrap_or_else(|e| e.into_inner());
                if g.0 != victims {
                    *g = (victims, g.1 + 1);
                }
            }
            Err(e) => self.error(e),
        }
        if self.settings.auction {
            let now = self.now();
            let idle: Vec<usize> = (0..self.members.len())
                .filter(|&m| {
                    let g = self.lock(m);
                    g.holds
                        && g.starved_since.is_none()
                        && g.last_use
                            .is_none_or(|t| now.nanos_since(t) >= IDLE_RELEASE.as_nanos() as u64)
                })
                .collect();
            if !idle.is_empty() {
                let names: Vec<String> = idle.iter().map(|&m| self.members[m].clone()).collect();
                match link.release_slices(&self.client, &self.evol, &names) {
                    Ok(()) => {
                        for m in idle {
                            let mut g = self.lock(m);
                            g.slices.release();
                            g.holds = false;
                            g.demand = 0;
                        }
                    }
                    Err(e) => self.error(e),
                }
            }
        }
        epoch
    }

    /// Gives every held slice back (the volume stops), unless the arbiter
    /// is failing: then a call could hold the stop for its whole deadline,
    /// and the arbiter's idle rule frees the flows anyway.
    fn release_all(&self, link: &mut dyn FlintLink) {
        if self.failing.load(Ordering::Acquire) {
            return;
        }
        let held: Vec<usize> = (0..self.members.len())
            .filter(|&m| self.lock(m).holds)
            .collect();
        if held.is_empty() {
            return;
        }
        let names: Vec<String> = held.iter().map(|&m| self.members[m].clone()).collect();
        if let Err(e) = link.release_slices(&self.client, &self.evol, &names) {
            // The arbiter's idle rule frees them after a few epochs.
            self.error(e);
        }
    }
}

/// The agent thread of one eVol (see the module docs); stopped and
/// joined on drop, giving its slices back.
pub struct AgentThread {
    qos: Arc<EvolQos>,
    handle: Option<JoinHandle<()>>,
}

impl AgentThread {
    /// Starts the agent of `qos` over `link`.
    pub fn start(qos: Arc<EvolQos>, mut link: Box<dyn FlintLink>) -> std::io::Result<Self> {
        let q = Arc::clone(&qos);
        let handle = std::thread::Builder::new()
            .name(format!("evol-agent-{}", qos.evol))
            .spawn(move || {
                let mut interval = q
                    .settings
                    .report_interval
                    .unwrap_or(DEFAULT_REPORT_INTERVAL);
                let mut next_report = Instant::now() + interval;
                while !q.stop.load(Ordering::Acquire) {
                    let asked = q.settings.auction && q.ask_slices(link.as_mut());
                    if Instant::now() >= next_report {
                        let epoch = q.report(link.as_mut(), interval);
                        if let (None, Some(e)) = (q.settings.report_interval, epoch) {
                            // Aggregate over the view's epoch.
                            interval = e.clamp(REPORT_INTERVAL_BOUNDS.0, REPORT_INTERVAL_BOUNDS.1);
                        }
                        next_report = (next_report + interval).max(Instant::now());
                    }
                    if asked {
                        // The next round trip follows at once: the
                        // request waited up to SLICE_WAIT at the arbiter.
                        continue;
                    }
                    let (lock, cv) = &q.wake;
                    let mut woken = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let left = next_report.saturating_duration_since(Instant::now());
                    if !*woken && !left.is_zero() {
                        woken = cv
                            .wait_timeout(woken, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    *woken = false;
                }
                q.release_all(link.as_mut());
            })?;
        Ok(AgentThread {
            qos,
            handle: Some(handle),
        })
    }
}

impl Drop for AgentThread {
    fn drop(&mut self) {
        self.qos.stop.store(true, Ordering::Release);
        self.qos.notify();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What one I/O costs per member, in the auction's currency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberCosts {
    cost: [u64; MAX_MEMBERS],
    set: u16,
}

impl MemberCosts {
    /// Adds `cost` on `member`.
    pub fn add(&mut self, member: usize, cost: u64) {
        if member < MAX_MEMBERS {
            self.cost[member] = self.cost[member].saturating_add(cost);
            self.set |= 1 << member;
        }
    }

    /// No member charged (not a data I/O).
    pub fn is_empty(&self) -> bool {
        self.set == 0
    }

    /// (member, cost), members in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..MAX_MEMBERS)
            .filter(|m| self.set & (1 << m) != 0)
            .map(|m| (m, self.cost[m]))
    }

    /// The member charged most (eIO's namespace for the rank).
    fn heaviest(&self) -> usize {
        self.iter().max_by_key(|&(_, c)| c).map_or(0, |(m, _)| m)
    }
}

/// An I/O waiting in eIO.
pub struct Staged<T> {
    item: T,
    costs: MemberCosts,
}

/// The eIO schedulers of one ublk queue (see the module docs).
pub struct EvolSched<T> {
    shared: Arc<EvolQos>,
    classes: Vec<EioScheduler<Staged<T>>>,
    costs: Vec<NamespaceCost>,
    costs_version: u64,
    victims_version: u64,
    /// An admission was refused for want of slices: poll again soon.
    starved: bool,
}

/// How soon a queue whose I/O waits for a slice looks again (grants reach
/// the shared slices from the agent thread; nothing wakes the queue).
pub const SLICE_POLL: Duration = Duration::from_millis(1);

impl<T> EvolSched<T> {
    /// The schedulers of one queue of the eVol `shared` serves.
    pub fn new(shared: Arc<EvolQos>) -> Self {
        let costs = shared.costs().0;
        EvolSched {
            classes: NvmeClass::ALL
                .iter()
                .map(|_| EioScheduler::new(EioConfig::default()).expect("the default is valid"))
                .collect(),
            costs,
            costs_version: 0,
            victims_version: 0,
            starved: false,
            shared,
        }
    }

    /// The eVol's shared side.
    pub fn shared(&self) -> &Arc<EvolQos> {
        &self.shared
    }

    /// I/Os waiting here.
    pub fn len(&self) -> usize {
        self.classes.iter().map(EioScheduler::len).sum()
    }

    /// Nothing waits here.
    pub fn is_empty(&self) -> bool {
        self.classes.iter().all(EioScheduler::is_empty)
    }

    /// Whether nothing of `class` waits here (a new I/O of it may skip
    /// the ranking: there is nothing to rank it against).
    pub fn class_is_empty(&self, class: NvmeClass) -> bool {
        self.classes[class.index()].is_empty()
    }

    /// The cost of `bytes` of `kind` on `member` in the auction's currency.
    pub fn cost(&self, member: usize, kind: IoKind, bytes: u64) -> u64 {
        match self.costs.get(member) {
            Some(c) => cost_bytes(kind, bytes, c.min_cost_bytes, c.write_cost),
            None => bytes,
        }
    }

    /// Takes the agent's new costs and victims, if any (a version check
    /// under a read lock: no copy unless they changed).
    fn refresh(&mut self) {
        {
            let g = self.shared.costs.read().unwrap_or_else(|e| e.into_inner());
            if g.1 != self.costs_version {
                self.costs_version = g.1;
                self.costs.clone_from(&g.0);
                for (m, c) in g.0.iter().enumerate() {
                    for s in &mut self.classes {
                        s.set_namespace_cost(NamespaceId(m as u32), *c);
                    }
                }
            }
        }
        let g = self
            .shared
            .victims
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if g.1 != self.victims_version {
            self.victims_version = g.1;
            for s in &mut self.classes {
                s.on_bottleneck_report(g.0.iter().copied());
            }
        }
    }

    /// Queues `item`, an I/O of `class` and `kind` costing `costs`, in
    /// stream `stream` (the caller's: I/Os of one stream keep their
    /// order); hands it back when the window is full.
    pub fn push(
        &mut self,
        now: Nanos,
        item: T,
        class: NvmeClass,
        kind: IoKind,
        stream: u64,
        costs: MemberCosts,
    ) -> Result<(), T> {
        self.refresh();
        let m = costs.heaviest();
        let bytes = costs.iter().map(|(_, c)| c).max().unwrap_or(0);
        let stream = if self.shared.settings.eio { stream } else { 0 };
        let request = EioRequest {
            stream: StreamId(stream),
            session: SessionId(self.shared.session_of.get(m).copied().unwrap_or(0)),
            namespace: NamespaceId(m as u32),
            kind,
            bytes,
            payload: Staged { item, costs },
        };
        self.classes[class.index()]
            .enqueue(now, request)
            .map_err(|r| r.payload.item)
    }

    /// The next I/O to hand to the QoS stage, of a class for which `free`
    /// says the stage holds nothing, whose slices admit it.
    pub fn pop(&mut self, now: Nanos, free: impl Fn(NvmeClass) -> bool) -> Option<(T, NvmeClass)> {
        self.refresh();
        self.starved = false;
        let shared = Arc::clone(&self.shared);
        for class in NvmeClass::ALL {
            let s = &mut self.classes[class.index()];
            if s.is_empty() || !free(class) {
                continue;
            }
            match s.dequeue(now, |r| shared.try_admit(&r.payload.costs)) {
                Some(d) => return Some((d.request.payload.item, class)),
                None => self.starved = true,
            }
        }
        None
    }

    /// When to call [`EvolSched::pop`] again though nothing completed: an
    /// I/O waits for a slice.
    pub fn timer(&self, now: Nanos) -> Option<Nanos> {
        self.starved
            .then(|| Nanos(now.as_nanos() + SLICE_POLL.as_nanos() as u64))
    }
}

const _: () = assert!(CLASSES == 4);

#[cfg(test)]
mod tests {
    use super::*;

    /// What the fake arbiter was asked, and what it answers.
    #[derive(Default)]
    struct Arb {
        reports: Vec<pb::IoVector>,
        asked: Vec<(Vec<String>, u32)>,
        released: Vec<String>,
        /// Grants per namespace per request (0: none).
        grant: u64,
        fail: Option<String>,
        victims: Vec<String>,
    }

    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<Arb>>);

    impl Fake {
        fn with<R>(&self, f: impl FnOnce(&mut Arb) -> R) -> R {
            f(&mut self.0.lock().unwrap())
        }
    }

    impl FlintLink for Fake {
        fn report_io(&mut self, c: &str, e: &str, v: &[pb::IoVector]) -> Result<u32, String> {
            assert_eq!((c, e), ("host1", "ev"));
            self.with(|a| match &a.fail {
                Some(f) => Err(f.clone()),
                None => {
                    a.reports.extend_from_slice(v);
                    Ok(v.len() as u32)
                }
            })
        }
        fn request_slices(
            &mut self,
            _: &str,
            _: &str,
            ns: &[String],
            slices: u32,
            _: Duration,
        ) -> Result<Vec<pb::SliceGrant>, String> {
            self.with(|a| {
                a.asked.push((ns.to_vec(), slices));
                if let Some(f) = &a.fail {
                    return Err(f.clone());
                }
                Ok(ns
                    .iter()
                    .flat_map(|n| {
                        (0..a.grant.min(u64::from(slices))).map(|_| pb::SliceGrant {
                            namespace: n.clone(),
                            bytes: 64 * 1024,
                            epoch: 1,
                            valid_for_ns: 60_000_000_000,
                        })
                    })
                    .collect())
            })
        }
        fn release_slices(&mut self, _: &str, _: &str, ns: &[String]) -> Result<(), String> {
            self.with(|a| a.released.extend_from_slice(ns));
            Ok(())
        }
        fn query_view(&mut self, ns: &[String]) -> Result<pb::QueryViewResponse, String> {
            self.with(|a| {
                Ok(pb::QueryViewResponse {
                    epoch: 1,
                    namespaces: ns
                        .iter()
                        .map(|n| pb::NamespaceView {
                            namespace: n.clone(),
                            write_cost: 2.0,
                            min_cost_bytes: 8192,
                            headroom_bytes_per_sec: 1e9,
                            ..Default::default()
                        })
                        .collect(),
                    report: Some(pb::BottleneckReport {
                        epoch: 1,
                        victims: a.victims.clone(),
                        ..Default::default()
                    }),
                    epoch_ns: 50_000_000,
                })
            })
        }
    }

    /// Members m0, m1 on target A, m2 on target B.
    fn qos(settings: FlintSettings) -> Arc<EvolQos> {
        EvolQos::new(
            "host1",
            "ev",
            vec!["m0".into(), "m1".into(), "m2".into()],
            &["a:4420".into(), "a:4420".into(), "b:4420".into()],
            settings,
        )
    }

    fn costs(list: &[(usize, u64)]) -> MemberCosts {
        let mut c = MemberCosts::default();
        for &(m, b) in list {
            c.add(m, b);
        }
        c
    }

    #[test]
    fn reports_aggregate_per_member_kind_and_size_class() {
        let q = qos(FlintSettings::default());
        let fake = Fake::default();
        for i in 0..300u64 {
            q.record(0, IoKind::Read, 4096, 50_000 + i);
        }
        for _ in 0..10 {
            q.record(2, IoKind::Write, 128 * 1024, 700_000);
        }
        q.record(2, IoKind::Write, 4096, 90_000);
        q.report(&mut fake.clone(), Duration::from_millis(100));
        let reports = fake.with(|a| a.reports.clone());
        assert_eq!(reports.len(), 3, "{reports:?}");
        let r0 = reports.iter().find(|v| v.namespace == "m0").unwrap();
        assert_eq!(
            (r0.count, r0.bytes, r0.kind),
            (300, 300 * 4096, pb::IoKind::Read as i32)
        );
        assert_eq!(r0.latency_ns, 300 * 50_000 + (0..300).sum::<u64>());
        let big = reports
            .iter()
            .find(|v| v.namespace == "m2" && v.count == 10)
            .unwrap();
        assert_eq!((big.bytes, big.latency_ns), (10 * 128 * 1024, 7_000_000));
        assert!(reports.iter().all(|v| v.age_ns == 50_000_000));
        // Drained: the next interval reports only what is new.
        q.report(&mut fake.clone(), Duration::from_millis(100));
        assert_eq!(fake.with(|a| a.reports.len()), 3);
        assert_eq!((q.status().reports, q.status().vectors_accepted), (1, 3));
    }

    #[test]
    fn the_auction_gates_once_granted_and_asks_for_the_demand() {
        let q = qos(FlintSettings::default());
        let fake = Fake::default();
        // No grant yet: not enforced, I/O goes, demand is counted.
        assert!(q.try_admit(&costs(&[(0, 4096)])));
        assert!(!q.status().auction_enforced);
        assert!(q.status().auction_note.unwrap().contains("no slices"));
        fake.with(|a| a.grant = 2);
        assert!(
            q.ask_slices(&mut fake.clone()),
            "member 0 is in use with no room"
        );
        assert!(q.status().auction_enforced);
        assert_eq!(fake.with(|a| a.asked.clone()), vec![(vec!["m0".into()], 2)]);
        // Two slices of 64 KiB: the fast path admits while there is room
        // (the last admission overdraws), then refuses and asks.
        let mut admitted = 0;
        while q.try_admit(&costs(&[(0, 32 * 1024)])) {
            admitted += 1;
            assert!(admitted < 100);
        }
        assert_eq!(admitted, 4);
        assert_eq!(q.status().slice_waits, 1);
        // A write on two members needs room on both: member 2 has none.
        assert!(!q.try_admit(&costs(&[(0, 1), (2, 1)])));
        fake.with(|a| a.grant = 16);
        assert!(q.ask_slices(&mut fake.clone()));
        let (names, want) = fake.with(|a| a.asked.last().cloned().unwrap());
        assert_eq!(names, vec!["m0".to_owned(), "m2".to_owned()]);
        assert!(want > 1, "the refused demand sizes the request: {want}");
        assert!(q.try_admit(&costs(&[(0, 1), (2, 1)])));
        assert_eq!(q.status().slices_granted, 2 + 2 * u64::from(want.min(16)));
    }

    #[test]
    fn the_auction_fails_open_when_the_arbiter_fails() {
        let q = qos(FlintSettings::default());
        let fake = Fake::default();
        fake.with(|a| a.grant = 1);
        assert!(q.try_admit(&costs(&[(1, 4096)])));
        assert!(q.ask_slices(&mut fake.clone()));
        while q.try_admit(&costs(&[(1, 4096)])) {}
        fake.with(|a| a.fail = Some("arbiter: unavailable".into()));
        assert!(q.ask_slices(&mut fake.clone()));
        let st = q.status();
        assert!(!st.auction_enforced);
        assert_eq!(st.auction_note.as_deref(), Some("arbiter: unavailable"));
        assert_eq!(st.agent_errors, 1);
        // I/O to mapped extents goes on while the arbiter is away.
        for _ in 0..100 {
            assert!(q.try_admit(&costs(&[(1, 1 << 20)])));
        }
        // No tight loop of failing calls: the next ask waits its backoff.
        let asked = fake.with(|a| a.asked.len());
        assert!(!q.ask_slices(&mut fake.clone()));
        assert_eq!(fake.with(|a| a.asked.len()), asked);
        // The next grant gates again.
        fake.with(|a| a.fail = None);
        *q.backoff_until.lock().unwrap() = None;
        assert!(q.ask_slices(&mut fake.clone()));
        assert!(q.status().auction_enforced);
    }

    #[test]
    fn without_the_auction_nothing_is_asked_or_gated() {
        let q = qos(FlintSettings {
            auction: false,
            ..FlintSettings::default()
        });
        for _ in 0..100 {
            assert!(q.try_admit(&costs(&[(0, 1 << 20)])));
        }
        let st = q.status();
        assert!(!st.auction_enforced);
        assert!(st.auction_note.unwrap().contains("auction = false"));
    }

    #[test]
    fn eio_orders_by_cost_within_a_class_and_keeps_streams() {
        let q = qos(FlintSettings {
            auction: false,
            ..FlintSettings::default()
        });
        let mut s: EvolSched<&str> = EvolSched::new(Arc::clone(&q));
        let now = Nanos(1_000);
        let c = NvmeClass::Medium;
        s.push(
            now,
            "big write e1",
            c,
            IoKind::Write,
            1,
            costs(&[(0, 1 << 20)]),
        )
        .unwrap();
        s.push(
            now,
            "small read e2",
            c,
            IoKind::Read,
            2,
            costs(&[(1, 4096)]),
        )
        .unwrap();
        s.push(
            now,
            "small write e1",
            c,
            IoKind::Write,
            1,
            costs(&[(0, 4096)]),
        )
        .unwrap();
        s.push(
            now,
            "urgent read",
            NvmeClass::Urgent,
            IoKind::Read,
            3,
            costs(&[(2, 4096)]),
        )
        .unwrap();
        assert_eq!(s.len(), 4);
        // A class the QoS stage still holds one of sends nothing.
        assert_eq!(s.pop(now, |_| false), None);
        let order: Vec<_> = std::iter::from_fn(|| s.pop(now, |_| true)).collect();
        assert_eq!(
            order,
            vec![
                ("urgent read", NvmeClass::Urgent),
                ("small read e2", c),
                // Cheaper, but behind the big write of its stream.
                ("big write e1", c),
                ("small write e1", c),
            ]
        );
        assert!(s.is_empty());
    }

    #[test]
    fn without_eio_a_class_keeps_arrival_order() {
        let q = qos(FlintSettings {
            auction: false,
            eio: false,
            ..FlintSettings::default()
        });
        let mut s: EvolSched<u32> = EvolSched::new(q);
        let now = Nanos(1_000);
        for (i, b) in [1u64 << 20, 4096, 1 << 19, 512].into_iter().enumerate() {
            s.push(
                now,
                i as u32,
                NvmeClass::Medium,
                IoKind::Read,
                i as u64,
                costs(&[(0, b)]),
            )
            .unwrap();
        }
        let order: Vec<_> = std::iter::from_fn(|| s.pop(now, |_| true).map(|x| x.0)).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_request_waiting_for_a_slice_arms_the_timer_and_goes_once_granted() {
        let q = qos(FlintSettings::default());
        let fake = Fake::default();
        fake.with(|a| a.grant = 1);
        assert!(q.try_admit(&costs(&[(2, 4096)])));
        q.ask_slices(&mut fake.clone());
        while q.try_admit(&costs(&[(2, 4096)])) {}
        let mut s: EvolSched<u32> = EvolSched::new(Arc::clone(&q));
        let now = Nanos(5_000);
        s.push(now, 7, NvmeClass::Low, IoKind::Read, 0, costs(&[(2, 4096)]))
            .unwrap();
        assert_eq!(s.pop(now, |_| true), None);
        assert_eq!(s.timer(now), Some(Nanos(5_000 + 1_000_000)));
        q.ask_slices(&mut fake.clone());
        assert_eq!(s.pop(now, |_| true), Some((7, NvmeClass::Low)));
        assert_eq!(s.timer(now), None);
    }

    #[test]
    fn the_view_sets_costs_and_names_victims_by_target_port() {
        let q = qos(FlintSettings::default());
        let fake = Fake::default();
        fake.with(|a| a.victims = vec!["host1/ev@a:4420".into(), "other/ev@b:4420".into()]);
        let mut s: EvolSched<u32> = EvolSched::new(Arc::clone(&q));
        assert_eq!(s.cost(0, IoKind::Write, 4096), 4096);
        q.report(&mut fake.clone(), Duration::from_millis(100));
        // The view's epoch comes back: the agent aggregates over it.
        assert_eq!(
            q.report(&mut fake.clone(), Duration::from_millis(100)),
            Some(Duration::from_millis(50))
        );
        // Members 0 and 1 share target port a: both victims; m2 not.
        assert_eq!(q.status().victim_members, 2);
        s.refresh();
        // The arbiter's currency: the least cost, the write cost.
        assert_eq!(s.cost(0, IoKind::Read, 4096), 8192);
        assert_eq!(s.cost(0, IoKind::Write, 64 * 1024), 128 * 1024);
    }

    #[test]
    fn idle_members_give_their_slices_back() {
        let q = qos(FlintSettings::default());
        let fake = Fake::default();
        fake.with(|a| a.grant = 1);
        assert!(q.try_admit(&costs(&[(0, 4096)])));
        q.ask_slices(&mut fake.clone());
        q.report(&mut fake.clone(), Duration::from_millis(100));
        assert!(fake.with(|a| a.released.is_empty()), "in use: kept");
        std::thread::sleep(IDLE_RELEASE + Duration::from_millis(100));
        q.report(&mut fake.clone(), Duration::from_millis(100));
        assert_eq!(fake.with(|a| a.released.clone()), vec!["m0".to_owned()]);
    }

    #[test]
    fn the_agent_thread_reports_and_releases_on_stop() {
        let q = qos(FlintSettings {
            report_interval: Some(Duration::from_millis(10)),
            ..FlintSettings::default()
        });
        let fake = Fake::default();
        fake.with(|a| a.grant = 4);
        let agent = AgentThread::start(Arc::clone(&q), Box::new(fake.clone())).unwrap();
        q.record(1, IoKind::Read, 4096, 1_000);
        // Demand wakes the agent: it asks for member 1's slices.
        assert!(q.try_admit(&costs(&[(1, 4096)])));
        let deadline = Instant::now() + Duration::from_secs(30);
        while (q.status().reports == 0 || !q.status().auction_enforced) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            q.status().reports >= 1 && q.status().auction_enforced,
            "{:?}",
            q.status()
        );
        drop(agent);
        assert_eq!(fake.with(|a| a.released.clone()), vec!["m1".to_owned()]);
    }

    #[test]
    fn size_classes_are_powers_of_two_from_4k_to_1m() {
        assert_eq!(size_class(512), 0);
        assert_eq!(size_class(4096), 0);
        assert_eq!(size_class(4097), 1);
        assert_eq!(size_class(8192), 1);
        assert_eq!(size_class(128 * 1024), 5);
        assert_eq!(size_class(1 << 20), 8);
        assert_eq!(size_class(16 << 20), 8);
    }

    #[test]
    fn client_names_are_what_the_arbiter_accepts() {
        let n = client_name("nqn.2014-08.org.nvmexpress:uuid:0c9a5a4e-1b2c-4d3e-8f90-aabbccddeeff");
        assert!(n.len() <= 64 && n.ends_with("aabbccddeeff"), "{n}");
        assert!(
            evol_arbiter::limits::check_name("client", &n).is_ok(),
            "{n}"
        );
        assert_eq!(client_name("host:a"), "host-a");
        assert_eq!(client_name(""), "client");
    }
}
