//! Client-side QoS of a volume: the rate limiter and the credit gate in
//! front of each ublk queue's NVMe/TCP I/O queue.
//!
//! The policies are `qos-core`'s pure state machines
//! ([`RateLimiter`], [`CreditGate`]); this module is the wiring, still
//! without I/O or a clock (every call takes `now`), so it is tested here
//! on a virtual clock and the engine only pumps it:
//!
//! ```text
//! submit ─► QueueQos::push ─► local FIFO ─► poll_admit(now) ─► NVMe queue
//!                                 ▲   head waits for: the limiter (timer at
//!                                 │   `timer()`), then a credit (the next
//!                                 │   completion)
//! completion ─► on_done(now, ticket, dw1) ────┘
//! ```
//!
//! - **Rate limiter**: one per volume ([`VolumeQos`]), shared by the
//!   volume's queue threads under a mutex held for one `try_acquire`. A
//!   queue whose head is not yet eligible arms a Timeout SQE on its own
//!   ring at the eligible instant (`timer()`), so nothing spins and no
//!   thread hop is needed: every queue times its own retry.
//! - **Credit gate**: one per queue thread (its own NVMe/TCP queue, its
//!   own completions). The credit a Gimbal target reports is the tenant's
//!   total over all its queues, so queue `q` of `n` may use its share,
//!   `credit / n` plus one of the remainder; the shares add up to the
//!   credit. One request is always allowed when the queue has nothing in
//!   flight, so a zero credit (or a share of zero when the credit is below
//!   the number of queues) cannot deadlock; only then can the volume's
//!   in-flight exceed the credit, by at most `n - 1`.
//! - Held requests are released **by NVMe priority class** (issue 8):
//!   they wait in a [`ClassArbiter`] with the volume's weights (commands
//!   under WRR, bytes under DRR, urgent first) and aging, so nothing
//!   starves. The arbiter picks the next request; that one (the *staged*
//!   request) then waits for the limiter and the credit gate. Within a
//!   class the order is FIFO. Reordering across classes is allowed: the
//!   block layer promises no order among requests in flight together (a
//!   file system waits for a write's completion before it issues one
//!   that depends on it). The limiter's token is taken once (`paid`),
//!   even if the credit gate then holds the request.
//! - Flushes, discards and write-zeroes pass the limiter (cgroup's io.max
//!   does not count them either) but take a credit: they occupy the
//!   target like any command.

pub mod neighbours;
pub mod priority;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use qos_core::class_arbiter::{ArbiterConfig, ClassArbiter, QueueId};
use qos_core::credit_gate::{CreditGate, CreditGateConfig, CreditMode, WindowSource};
use qos_core::neighbours::NeighbourTotals;

use neighbours::{NamespaceView, NeighbourSlot};

/// How often a queue's gate reads its namespace's shadow view (ns).
const NEIGHBOURS_READ_NS: u64 = 1_000_000;
use qos_core::priority::NvmeClass;
use qos_core::rate_limiter::{RateLimiter, RateLimits};
use qos_core::replica::{ReplicaPolicy, ReplicaSelector};
use qos_core::replica_set::MAX_REPLICAS;
use qos_core::{IoKind, Nanos, ReplicaSet};
use serde::{Deserialize, Serialize};

/// A volume's QoS settings (`[qos]` in its config).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QosConfig {
    /// Where the credit window comes from.
    pub credits: CreditMode,
    /// Window before any credit or latency was seen.
    pub initial_window: u32,
    /// Upper bound of the estimated window.
    pub max_window: u32,
    /// Rate limits (0 = unlimited).
    pub limits: RateLimits,
    /// The estimated window in bandwidth-delay products (qos-core
    /// `CreditGateConfig::gain`): at a saturated device the gate keeps
    /// `gain − 1` of them queued.
    pub estimate_gain: f64,
    /// The most the estimate's gain may probe up to (qos-core
    /// `CreditGateConfig::gain_max`); equal to `estimate_gain` for a fixed
    /// gain.
    pub estimate_gain_max: f64,
    /// How long a minimum-latency sample counts as the path's base
    /// latency (ms; qos-core `CreditGateConfig::base_window_ms`).
    pub estimate_base_window_ms: u64,
    /// Whether the gates publish to and read the host-local shadow view
    /// of their namespace ([`neighbours`]): a probe then counts what it
    /// cost the other volumes of the namespace on this host. Read when
    /// the volume starts.
    pub estimate_neighbours: bool,
}

impl QosConfig {
    /// Defaults: credits `auto`, no limits.
    pub fn new() -> Self {
        let g = CreditGateConfig::default();
        Self {
            credits: CreditMode::Auto,
            initial_window: g.initial_window,
            max_window: g.max_window,
            limits: RateLimits::default(),
            estimate_gain: g.gain,
            estimate_gain_max: g.gain_max,
            estimate_base_window_ms: g.base_window_ms,
            estimate_neighbours: true,
        }
    }

    fn gate_config(&self) -> CreditGateConfig {
        CreditGateConfig {
            mode: self.credits,
            initial_window: self.initial_window,
            max_window: self.max_window,
            base_window_ms: self.estimate_base_window_ms,
            gain: self.estimate_gain,
            gain_max: self.estimate_gain_max,
        }
    }

    /// Check what `qos-core` would refuse, as a message.
    pub fn validate(&self) -> Result<(), String> {
        self.gate_config().validate().map_err(|e| e.to_string())
    }
}

/// The name of a credit mode as the config and `set` spell it.
pub fn mode_name(m: CreditMode) -> &'static str {
    match m {
        CreditMode::Auto => "auto",
        CreditMode::Target => "target",
        CreditMode::Estimate => "estimate",
        CreditMode::Off => "off",
    }
}

/// Parse a credit mode.
pub fn parse_mode(s: &str) -> Option<CreditMode> {
    Some(match s {
        "auto" => CreditMode::Auto,
        "target" => CreditMode::Target,
        "estimate" => CreditMode::Estimate,
        "off" => CreditMode::Off,
        _ => return None,
    })
}

fn mode_code(m: CreditMode) -> u8 {
    match m {
        CreditMode::Auto => 0,
        CreditMode::Target => 1,
        CreditMode::Estimate => 2,
        CreditMode::Off => 3,
    }
}

fn mode_from_code(c: u8) -> CreditMode {
    match c {
        1 => CreditMode::Target,
        2 => CreditMode::Estimate,
        3 => CreditMode::Off,
        _ => CreditMode::Auto,
    }
}

fn source_name(s: u8) -> &'static str {
    match s {
        1 => "target",
        2 => "initial",
        3 => "estimate",
        4 => "unlimited",
        _ => "none",
    }
}

fn source_code(s: WindowSource) -> u8 {
    match s {
        WindowSource::Target => 1,
        WindowSource::Initial => 2,
        WindowSource::Estimate => 3,
        WindowSource::Unlimited => 4,
    }
}

/// Parse a limit: `max` (= 0, unlimited), or a number in the one size
/// grammar both binaries use ([`config_diag::parse_size`]: binary suffixes
/// `k`, `m`, `g`, `t`, optionally with `iB`, as cgroup tools accept them).
pub fn parse_amount(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "max" {
        return Some(0);
    }
    config_diag::parse_size(s).ok()
}

/// Apply `key=value` settings (`riops`, `wiops`, `rbps`, `wbps`, their
/// `_burst`s, `credits`) to `cfg`; the result or a message naming the bad
/// word. Nothing is applied unless every word is good.
pub fn apply_settings(cfg: &QosConfig, words: &[&str]) -> Result<QosConfig, String> {
    let mut c = *cfg;
    if words.is_empty() {
        return Err("nothing to set (give key=value, e.g. riops=2000)".into());
    }
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| format!("{w:?}: expected key=value"))?;
        if k == "credits" {
            c.credits = parse_mode(v)
                .ok_or_else(|| format!("{w:?}: credits is one of auto, target, estimate, off"))?;
            continue;
        }
        let n = parse_amount(v).ok_or_else(|| {
            format!("{w:?}: expected a number (k/m/g suffixes, 0 or max = unlimited)")
        })?;
        let l = &mut c.limits;
        let slot = match k {
            "riops" => &mut l.read_iops,
            "wiops" => &mut l.write_iops,
            "rbps" => &mut l.read_bps,
            "wbps" => &mut l.write_bps,
            "riops_burst" => &mut l.read_iops_burst,
            "wiops_burst" => &mut l.write_iops_burst,
            "rbps_burst" => &mut l.read_bps_burst,
            "wbps_burst" => &mut l.write_bps_burst,
            _ => {
                return Err(format!(
                    "{k:?}: unknown setting (riops, wiops, rbps, wbps, *_burst, credits)"
                ))
            }
        };
        *slot = n;
    }
    Ok(c)
}

/// The QoS state of a volume shared by its queue threads: the rate
/// limiter, the settings that can change at run time, and counters.
#[derive(Debug)]
pub struct VolumeQos {
    epoch: Instant,
    queues: u16,
    limiter: Mutex<RateLimiter>,
    /// Whether any limit is set (skips the lock when not).
    limited: AtomicBool,
    mode: AtomicU8,
    settings: Mutex<QosConfig>,
    /// Bumped on every change, so queues notice with one load.
    version: AtomicU64,
    stats: QosCounters,
    /// Per replica, the host-local shadow view of its namespace (none:
    /// the volume sees no neighbours), and this volume's token in it.
    neighbours: Vec<Option<Arc<NamespaceView>>>,
    group: u64,
}

#[derive(Debug, Default)]
struct QosCounters {
    window: AtomicU32,
    source: AtomicU8,
    /// The estimate's bandwidth (bytes/s) and base latency (ns) on the
    /// queue that last admitted with an estimated window (0: none yet).
    estimate_bps: AtomicU64,
    estimate_base_ns: AtomicU64,
    /// The gain the estimate settled on there, in hundredths.
    estimate_gain_x100: AtomicU64,
    /// Its gain probe's decisions there: up measured, up kept, down
    /// measured, down kept, cruises undecided; and whether it is young.
    estimate_probes: [AtomicU64; 5],
    estimate_young: AtomicBool,
    /// Other volumes of the namespace seen there, and what the last
    /// comparison cost them, in thousandths.
    estimate_neighbours: AtomicU64,
    estimate_cost_x1000: std::sync::atomic::AtomicI64,
    last_credit: AtomicU32,
    credit_seen: AtomicBool,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    over_credit: AtomicU64,
    queued: AtomicU64,
    queued_max: AtomicU64,
    admitted: AtomicU64,
    waited: AtomicU64,
    wait_ns_total: AtomicU64,
    wait_ns_max: AtomicU64,
    limiter_delays: AtomicU64,
    credit_waits: AtomicU64,
    /// Per NVMe class (urgent..low): waiting now, admitted so far.
    class_queued: [AtomicU64; 4],
    class_admitted: [AtomicU64; 4],
    /// Per replica (at most 16): window, parts in flight, last credit
    /// (`u32::MAX`: none seen).
    replica_window: [AtomicU32; 16],
    replica_in_flight: [AtomicU64; 16],
    replica_credit: [AtomicU32; 16],
}

/// The QoS of one replica (target namespace), for `status`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ReplicaQos {
    /// Its window (the last a queue computed).
    pub window: u32,
    /// Requests in flight to it (all queues).
    pub in_flight: u64,
    /// The credit it last reported, if any.
    pub target_credit: Option<u32>,
}

/// What `status` shows of a volume's QoS.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct QosSnapshot {
    /// Credit mode: auto, target, estimate, off.
    pub credits_mode: String,
    /// Current window (all queues) and where it comes from.
    pub window: u32,
    /// target, initial, estimate, unlimited.
    pub window_source: String,
    /// The estimate's bottleneck bandwidth (bytes/s) and base latency (µs)
    /// behind an estimated window (0 before one was computed).
    #[serde(default)]
    pub estimate_bandwidth_bps: u64,
    /// Base latency of the estimate (µs).
    #[serde(default)]
    pub estimate_base_us: u64,
    /// The gain the estimate settled on (its probe finds it), in
    /// hundredths (450: 4.5x the bandwidth-delay product).
    #[serde(default)]
    pub estimate_gain_x100: u64,
    /// The gain probe's decisions (docs/architecture.md, the credit gate):
    /// up probes measured, and how many were kept.
    #[serde(default)]
    pub estimate_probes_up: u64,
    /// Up probes that delivered enough more to be kept.
    #[serde(default)]
    pub estimate_probes_up_kept: u64,
    /// Down probes measured.
    #[serde(default)]
    pub estimate_probes_down: u64,
    /// Down probes kept (they lost too little to matter).
    #[serde(default)]
    pub estimate_probes_down_kept: u64,
    /// Cruises that decided nothing: the application did not fill the
    /// window in all their measured rounds.
    #[serde(default)]
    pub estimate_probes_undecided: u64,
    /// The probe is still young: fewer than two up probes have come out
    /// unpaid, and up probes step 2.25x instead of 1.5x.
    #[serde(default)]
    pub estimate_young: bool,
    /// Other volumes of the same namespace on this host that the gate
    /// sees (the host-local shadow view; docs/architecture.md).
    #[serde(default)]
    pub estimate_neighbours: u64,
    /// What the gain probe's last comparison cost them, in thousandths of
    /// the sum of their log latency ratios (positive: they got slower).
    #[serde(default)]
    pub estimate_neighbour_cost_x1000: i64,
    /// The credit total last reported by the target, if any.
    pub target_credit: Option<u32>,
    /// Admitted and not yet completed (all queues).
    pub in_flight: u64,
    /// The most ever in flight on one queue.
    pub in_flight_max: u64,
    /// Admissions that left a queue above its share of the window (must
    /// stay 0: the gate's invariant, checked independently).
    pub over_credit: u64,
    /// Requests waiting in the local FIFOs now, and the most ever.
    pub queued: u64,
    /// The most ever waiting.
    pub queued_max: u64,
    /// Requests admitted so far.
    pub admitted: u64,
    /// Of those, how many had to wait.
    pub waited: u64,
    /// Mean and longest wait in the local FIFO (µs), over those admitted.
    pub wait_us_mean: u64,
    /// Longest wait (µs).
    pub wait_us_max: u64,
    /// All admitted requests' waits added up (µs): what a per-interval
    /// mean is computed from (two snapshots' difference over their
    /// `waited` difference), which the since-start mean cannot give.
    #[serde(default)]
    pub wait_us_total: u64,
    /// Times a head request waited for the limiter / for a credit.
    pub limiter_delays: u64,
    /// Times a head request waited for a credit.
    pub credit_waits: u64,
    /// Rate limits in force (0 = unlimited).
    pub riops: u64,
    /// Write IOPS limit.
    pub wiops: u64,
    /// Read bytes/s limit.
    pub rbps: u64,
    /// Write bytes/s limit.
    pub wbps: u64,
    /// Per NVMe class, urgent to low: requests waiting in the local queue
    /// now.
    #[serde(default)]
    pub class_queued: [u64; 4],
    /// Per NVMe class: requests admitted to the target so far.
    #[serde(default)]
    pub class_admitted: [u64; 4],
}

impl VolumeQos {
    /// The shared state of a volume with `queues` ublk queues.
    pub fn new(cfg: &QosConfig, queues: u16) -> Self {
        let s = Self {
            epoch: Instant::now(),
            queues: queues.max(1),
            limiter: Mutex::new(RateLimiter::new(cfg.limits)),
            limited: AtomicBool::new(cfg.limits != RateLimits::default()),
            mode: AtomicU8::new(mode_code(cfg.credits)),
            settings: Mutex::new(*cfg),
            version: AtomicU64::new(0),
            stats: QosCounters::default(),
            neighbours: Vec::new(),
            group: neighbours::group_token(),
        };
        for c in &s.stats.replica_credit {
            c.store(u32::MAX, Ordering::Relaxed);
        }
        s
    }

    /// With the host-local shadow view of each replica's namespace
    /// (`None`: that replica's gates see no neighbours).
    pub fn with_neighbours(mut self, views: Vec<Option<Arc<NamespaceView>>>) -> Self {
        self.neighbours = views;
        self
    }

    /// Per replica `0..n` (at most 16), for `status`.
    pub fn replica_snapshot(&self, n: usize) -> Vec<ReplicaQos> {
        let s = &self.stats;
        (0..n.min(16))
            .map(|r| ReplicaQos {
                window: s.replica_window[r].load(Ordering::Relaxed),
                in_flight: s.replica_in_flight[r].load(Ordering::Relaxed),
                target_credit: Some(s.replica_credit[r].load(Ordering::Relaxed))
                    .filter(|c| *c != u32::MAX),
            })
            .collect()
    }

    /// `now` on the QoS clock (nanoseconds since the volume started).
    pub fn now(&self, at: Instant) -> Nanos {
        Nanos(at.saturating_duration_since(self.epoch).as_nanos() as u64)
    }

    /// The settings in force.
    pub fn settings(&self) -> QosConfig {
        *self.settings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Change the settings at run time: limits take effect at once (tokens
    /// carried over, capped at the new burst), the credit mode at each
    /// queue's next admission. Nothing queued or in flight is lost.
    pub fn apply(&self, now: Nanos, cfg: &QosConfig) {
        let mut s = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut l = self.limiter.lock().unwrap_or_else(|e| e.into_inner());
            l.set_limits(now, cfg.limits);
            self.limited
                .store(!l.is_unlimited(), std::sync::atomic::Ordering::Release);
        }
        self.mode.store(mode_code(cfg.credits), Ordering::Release);
        *s = *cfg;
        self.version.fetch_add(1, Ordering::Release);
    }

    /// A copy of the counters for `status`.
    pub fn snapshot(&self) -> QosSnapshot {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let cfg = self.settings();
        let admitted = g(&s.admitted);
        QosSnapshot {
            credits_mode: mode_name(cfg.credits).into(),
            window: s.window.load(Ordering::Relaxed),
            window_source: source_name(s.source.load(Ordering::Relaxed)).into(),
            estimate_bandwidth_bps: g(&s.estimate_bps),
            estimate_base_us: g(&s.estimate_base_ns) / 1000,
            estimate_gain_x100: g(&s.estimate_gain_x100),
            estimate_probes_up: g(&s.estimate_probes[0]),
            estimate_probes_up_kept: g(&s.estimate_probes[1]),
            estimate_probes_down: g(&s.estimate_probes[2]),
            estimate_probes_down_kept: g(&s.estimate_probes[3]),
            estimate_probes_undecided: g(&s.estimate_probes[4]),
            estimate_young: s.estimate_young.load(Ordering::Relaxed),
            estimate_neighbours: g(&s.estimate_neighbours),
            estimate_neighbour_cost_x1000: s.estimate_cost_x1000.load(Ordering::Relaxed),
            target_credit: s
                .credit_seen
                .load(Ordering::Relaxed)
                .then(|| s.last_credit.load(Ordering::Relaxed)),
            in_flight: g(&s.in_flight),
            in_flight_max: g(&s.in_flight_max),
            over_credit: g(&s.over_credit),
            queued: g(&s.queued),
            queued_max: g(&s.queued_max),
            admitted,
            waited: g(&s.waited),
            wait_us_mean: g(&s.wait_ns_total).checked_div(admitted).unwrap_or(0) / 1000,
            wait_us_max: g(&s.wait_ns_max) / 1000,
            wait_us_total: g(&s.wait_ns_total) / 1000,
            limiter_delays: g(&s.limiter_delays),
            credit_waits: g(&s.credit_waits),
            riops: cfg.limits.read_iops,
            wiops: cfg.limits.write_iops,
            rbps: cfg.limits.read_bps,
            class_queued: s.class_queued.each_ref().map(g),
            class_admitted: s.class_admitted.each_ref().map(g),
            wbps: cfg.limits.write_bps,
        }
    }
}

/// What a request is to the rate limiter: which budget it is charged to
/// (not its NVMe priority class, [`NvmeClass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// A read of `bytes`.
    Read,
    /// A write of `bytes`.
    Write,
    /// Flush, discard, write-zeroes: not rate-limited, but take a credit.
    Other,
}

impl LimitKind {
    /// What the limiter charges, if anything.
    fn io_kind(self) -> Option<IoKind> {
        match self {
            LimitKind::Read => Some(IoKind::Read),
            LimitKind::Write => Some(IoKind::Write),
            LimitKind::Other => None,
        }
    }
}

/// Why the staged request cannot go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The rate limiter: not before `until`.
    Limiter { until: Nanos },
    /// No room in a gate it needs: wait for a completion.
    Credit,
}

/// Handed out with an admitted request, handed back (per replica) on its
/// completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    sent_at: Nanos,
    kind: IoKind,
    bytes: u64,
    /// Whether it is a read (one replica) or goes to every writable one.
    read: bool,
    /// The replicas it was sent to (and not yet ended on).
    replicas: ReplicaSet,
    /// Those it was sent to without taking their credit (a read moved
    /// there after its first replica failed).
    uncounted: ReplicaSet,
}

impl Ticket {
    /// The replicas it was sent to and whose parts have not ended.
    pub fn replicas(&self) -> ReplicaSet {
        self.replicas
    }

    /// When it was admitted (its parts were sent then).
    pub fn sent_at(&self) -> Nanos {
        self.sent_at
    }

    /// Whether it is a read.
    pub fn is_read(&self) -> bool {
        self.read
    }

    /// Also sent to replica `r`, without its credit (a read retried there
    /// after an error status on another replica).
    pub fn add_uncounted(&mut self, r: usize) {
        self.replicas.insert(r);
        self.uncounted.insert(r);
    }
}

/// Where requests may go: the replicas that take writes and those that
/// serve reads. A one-target volume is [`Route::SINGLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Replicas that take writes, flushes, discards.
    pub writable: ReplicaSet,
    /// Replicas that may serve reads.
    pub readable: ReplicaSet,
}

impl Route {
    /// One replica, healthy.
    pub const SINGLE: Route = Route {
        writable: ReplicaSet::FIRST,
        readable: ReplicaSet::FIRST,
    };
}

struct Waiting<T> {
    item: T,
    kind: LimitKind,
    prio: NvmeClass,
    bytes: u64,
    since: Nanos,
    paid: bool,
}

/// The QoS stage of one ublk queue; see the module documentation.
pub struct QueueQos<T> {
    shared: Arc<VolumeQos>,
    /// One credit gate per replica (per target namespace).
    gates: Vec<CreditGate>,
    /// Per replica, this queue's slot in the namespace's shadow view, and
    /// when the gate last read it.
    slots: Vec<Option<NeighbourSlot>>,
    read_at: Vec<Nanos>,
    /// The neighbours' totals as last read (kept to reuse its memory).
    seen: Vec<NeighbourTotals>,
    /// Chooses the replica of each read.
    selector: ReplicaSelector,
    qid: u16,
    version: u64,
    /// Held requests, released by class.
    waiting: ClassArbiter<Waiting<T>>,
    /// The request the arbiter chose last, waiting for the limiter and the
    /// gate (or just pushed into an empty stage: nothing to arbitrate).
    staged: Option<Waiting<T>>,
    timer: Option<Nanos>,
    /// Whether the head is known to wait for a credit (counted once).
    credit_blocked: bool,
}

impl<T> QueueQos<T> {
    /// The stage of queue `qid` of a one-target volume; held requests are
    /// released by class as `arbiter` says (an invalid one falls back to
    /// the default: configs are validated before).
    ///
    /// Its gate sees no neighbours: an elastic volume's one gate spans
    /// the extents of many namespaces (`Requests::set_evol`).
    pub fn new(shared: Arc<VolumeQos>, qid: u16, arbiter: ArbiterConfig) -> Self {
        let mut q = Self::replicated(shared, qid, arbiter, 1, ReplicaPolicy::Primary);
        q.slots = vec![None];
        q
    }

    /// The stage of queue `qid` of a volume of `replicas` replicas (at
    /// most [`MAX_REPLICAS`]), reads chosen by `policy`.
    pub fn replicated(
        shared: Arc<VolumeQos>,
        qid: u16,
        arbiter: ArbiterConfig,
        replicas: usize,
        policy: ReplicaPolicy,
    ) -> Self {
        let cfg = shared.settings();
        let gate = || {
            CreditGate::new(&cfg.gate_config()).unwrap_or_else(|_| {
                CreditGate::new(&CreditGateConfig::default()).expect("default config is valid")
            })
        };
        let replicas = replicas.clamp(1, MAX_REPLICAS);
        let version = shared.version.load(Ordering::Acquire);
        let slots = (0..replicas)
            .map(|r| {
                let view = shared.neighbours.get(r)?.as_ref()?;
                view.claim(shared.group).or_else(|| {
                    log::warn!(
                        "{}: all {} slots held; queue {qid} runs unseen by the other volumes of its namespace",
                        view.path().display(),
                        neighbours::SLOTS
                    );
                    None
                })
            })
            .collect();
        Self {
            shared,
            gates: (0..replicas).map(|_| gate()).collect(),
            slots,
            read_at: vec![Nanos(0); replicas],
            seen: Vec::new(),
            selector: ReplicaSelector::new(policy, replicas),
            qid,
            version,
            waiting: ClassArbiter::new(arbiter).unwrap_or_else(|_| {
                ClassArbiter::new(ArbiterConfig::default()).expect("default config is valid")
            }),
            staged: None,
            timer: None,
            credit_blocked: false,
        }
    }

    /// The shared state.
    pub fn shared(&self) -> &Arc<VolumeQos> {
        &self.shared
    }

    /// This queue's share of a window `w` from `source`. A target's
    /// credit (and the initial window) is the tenant's total over all its
    /// queues, so it is split; an estimated window is this queue's own
    /// (its gate sees only its own completions), so it is not.
    fn share(&self, (w, source): (u32, WindowSource)) -> u32 {
        let n = u32::from(self.shared.queues);
        if w == u32::MAX || source == WindowSource::Estimate {
            return w;
        }
        w / n + u32::from(u32::from(self.qid) < w % n)
    }

    /// Requests waiting here.
    pub fn queued(&self) -> usize {
        self.waiting.len() + usize::from(self.staged.is_some())
    }

    /// Requests of class `class` waiting here.
    pub fn waiting_in(&self, class: NvmeClass) -> usize {
        self.waiting.waiting(class)
            + usize::from(self.staged.as_ref().is_some_and(|w| w.prio == class))
    }

    /// Requests admitted and not completed, summed over the replicas (a
    /// mirrored write counts once per replica).
    pub fn in_flight(&self) -> u32 {
        self.gates.iter().map(CreditGate::in_flight).sum()
    }

    /// Whether replica `r`'s gate lets one more request go now.
    fn has_room(&self, r: usize) -> bool {
        let g = &self.gates[r];
        let share = self.share(g.window());
        g.in_flight() == 0 || g.in_flight() < share
    }

    /// The replica for the next read among `readable`: the selector's
    /// choice among those with room (least-loaded also weighs headroom).
    fn pick_read(&mut self, readable: ReplicaSet) -> Option<usize> {
        if self.gates.len() == 1 {
            return self.has_room(0).then_some(0);
        }
        for r in 0..self.gates.len() {
            let ok = readable.contains(r) && self.has_room(r);
            let _ = self.selector.set_in_sync(r, ok);
            let g = &self.gates[r];
            let _ = self.selector.set_window(r, self.share(g.window()));
        }
        self.selector.select_read()
    }

    /// When the head becomes eligible at the limiter, if it waits for it:
    /// the caller arms a timer and calls [`QueueQos::poll_admit`] then.
    pub fn timer(&self) -> Option<Nanos> {
        self.timer
    }

    /// Queue a request of NVMe class `prio`, charged to the limiter as
    /// `kind`.
    pub fn push(&mut self, now: Nanos, item: T, kind: LimitKind, bytes: u64, prio: NvmeClass) {
        let w = Waiting {
            item,
            kind,
            prio,
            bytes,
            since: now,
            paid: false,
        };
        if self.staged.is_none() && self.waiting.is_empty() {
            self.staged = Some(w);
        } else {
            // Queue 0 of each class: one ublk queue has one queue per class.
            self.waiting.enqueue(now, QueueId(0), prio, bytes, w);
        }
        let s = &self.shared.stats;
        s.class_queued[prio.index()].fetch_add(1, Ordering::Relaxed);
        let q = s.queued.fetch_add(1, Ordering::Relaxed) + 1;
        s.queued_max.fetch_max(q, Ordering::Relaxed);
    }

    /// The next request allowed to go now, if any, on a one-target
    /// volume. Call until `None` after a push, a completion and a timer.
    pub fn poll_admit(&mut self, now: Nanos) -> Option<(T, Ticket)> {
        self.poll_admit_routed(now, Route::SINGLE)
    }

    /// The next request allowed to go now and the replicas it goes to
    /// ([`Ticket::replicas`]): a read to one readable replica with room in
    /// its gate (the selector's choice), anything else to every writable
    /// replica once each has room. With no readable replica a read goes
    /// to a writable one (held there until its path returns).
    pub fn poll_admit_routed(&mut self, now: Nanos, route: Route) -> Option<(T, Ticket)> {
        self.timer = None;
        self.follow_mode_change();
        if self.staged.is_none() {
            self.staged = self.waiting.dequeue(now).map(|a| a.payload);
        }
        let mut w = self.staged.take()?;
        let targets = match self.decide(&mut w, now, route) {
            Ok(targets) => targets,
            Err(held) => {
                self.staged = Some(w);
                if let Held::Limiter { until } = held {
                    self.timer = Some(until);
                }
                self.record_held(held);
                return None;
            }
        };
        self.credit_blocked = false;
        let read = w.kind == LimitKind::Read;
        for r in targets {
            let acquired = self.gates[r].try_acquire();
            // Cannot fail: `decide` chose only replicas whose gate has
            // room (`has_room`: nothing in flight, or fewer than this
            // queue's share of the window; a read's replica comes from the
            // selector, which picks only among those marked with room),
            // the share never exceeds the window `try_acquire` checks, and
            // no gate has changed since (each replica is once in the set).
            debug_assert!(acquired, "replica {r}: gate full after has_room");
            if read {
                let _ = self.selector.on_dispatch(r);
            }
        }
        self.record_admission(now, &w, targets);
        let kind = w.kind.io_kind();
        Some((
            w.item,
            Ticket {
                sent_at: now,
                kind: kind.unwrap_or(IoKind::Write),
                bytes: if kind.is_some() { w.bytes } else { 0 },
                read,
                replicas: targets,
                uncounted: ReplicaSet::EMPTY,
            },
        ))
    }

    /// A `set` or `reload` changed the credit mode: apply it to the gates.
    fn follow_mode_change(&mut self) {
        let version = self.shared.version.load(Ordering::Acquire);
        if version != self.version {
            self.version = version;
            let mode = mode_from_code(self.shared.mode.load(Ordering::Acquire));
            for g in &mut self.gates {
                g.set_mode(mode);
            }
        }
    }

    /// Whether the staged request `head` may go now, and to which
    /// replicas: its limiter token (taken once, then `paid`), then room in
    /// the gate of one readable replica (a read; a writable one when none
    /// is readable) or of every writable one (anything else).
    fn decide(
        &mut self,
        head: &mut Waiting<T>,
        now: Nanos,
        route: Route,
    ) -> Result<ReplicaSet, Held> {
        if !head.paid {
            let kind = head.kind.io_kind();
            if let Some(kind) = kind.filter(|_| self.shared.limited.load(Ordering::Acquire)) {
                self.shared
                    .limiter
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .try_acquire(now, kind, head.bytes)
                    .map_err(|until| Held::Limiter { until })?;
            }
            head.paid = true;
        }
        let all = ReplicaSet::first_n(self.gates.len());
        let targets = if head.kind == LimitKind::Read {
            let mut readable = route.readable.intersection(all);
            if readable.is_empty() {
                readable = route.writable.intersection(all);
            }
            self.pick_read(readable).map(ReplicaSet::one)
        } else {
            let w = route.writable.intersection(all);
            w.iter().all(|r| self.has_room(r)).then_some(w)
        };
        targets.filter(|t| !t.is_empty()).ok_or(Held::Credit)
    }

    /// Counts a staged request held back.
    fn record_held(&mut self, held: Held) {
        let s = &self.shared.stats;
        match held {
            Held::Limiter { .. } => {
                s.limiter_delays.fetch_add(1, Ordering::Relaxed);
            }
            // Counted once per wait, not once per poll.
            Held::Credit if !self.credit_blocked => {
                self.credit_blocked = true;
                s.credit_waits.fetch_add(1, Ordering::Relaxed);
            }
            Held::Credit => {}
        }
    }

    /// Counts `w` admitted to `targets` (its credits already taken).
    fn record_admission(&self, now: Nanos, w: &Waiting<T>, targets: ReplicaSet) {
        let s = &self.shared.stats;
        for r in targets {
            if let Some(c) = s.replica_in_flight.get(r) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        s.class_queued[w.prio.index()].fetch_sub(1, Ordering::Relaxed);
        s.class_admitted[w.prio.index()].fetch_add(1, Ordering::Relaxed);
        s.queued.fetch_sub(1, Ordering::Relaxed);
        s.in_flight.fetch_add(1, Ordering::Relaxed);
        s.admitted.fetch_add(1, Ordering::Relaxed);
        // The gate's invariant, checked independently of `has_room`: the
        // first replica's in flight stays within this queue's share.
        let first = targets.first().unwrap_or(0);
        let (window, source) = self.gates[first].window();
        let share = self.share((window, source));
        let after = u64::from(self.gates[first].in_flight());
        if after > u64::from(share.max(1)) {
            s.over_credit.fetch_add(1, Ordering::Relaxed);
        }
        s.in_flight_max.fetch_max(after, Ordering::Relaxed);
        let waited = now.nanos_since(w.since);
        if waited > 0 {
            s.waited.fetch_add(1, Ordering::Relaxed);
            s.wait_ns_total.fetch_add(waited, Ordering::Relaxed);
            s.wait_ns_max.fetch_max(waited, Ordering::Relaxed);
        }
        s.window.store(window, Ordering::Relaxed);
        s.source.store(source_code(source), Ordering::Relaxed);
        if source == WindowSource::Estimate {
            let g = &self.gates[first];
            if let (Some(bw), Some(base)) = (g.bandwidth_bps(), g.mean_base_ns()) {
                s.estimate_bps.store(bw as u64, Ordering::Relaxed);
                s.estimate_base_ns.store(base, Ordering::Relaxed);
                s.estimate_gain_x100
                    .store((g.gain() * 100.0).round() as u64, Ordering::Relaxed);
                let (c, young) = g.gain_probes();
                for (a, v) in s.estimate_probes.iter().zip([
                    c.up,
                    c.up_kept,
                    c.down,
                    c.down_kept,
                    c.undecided,
                ]) {
                    a.store(v, Ordering::Relaxed);
                }
                s.estimate_young.store(young, Ordering::Relaxed);
            }
        }
    }

    /// Replica `from`'s path failed under a read: move it to replica `to`
    /// (its credit on `from` is given back; on `to` it is sent without
    /// one, since it must not wait behind newer requests).
    pub fn reroute(&mut self, ticket: &mut Ticket, from: usize, to: usize) {
        self.release(ticket, from);
        ticket.add_uncounted(to);
    }

    /// Replica `r`'s part of `ticket` ended without a completion (its path
    /// failed, the part is dropped): give its credit back.
    pub fn release(&mut self, ticket: &mut Ticket, r: usize) {
        if !ticket.replicas.remove(r) {
            return;
        }
        if ticket.uncounted.remove(r) {
            return;
        }
        if let Some(c) = self.shared.stats.replica_in_flight.get(r) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(g) = self.gates.get_mut(r) {
            g.cancel();
        }
        if ticket.read {
            let _ = self.selector.on_completion(r, None);
        }
    }

    /// Replica `r`'s part of `ticket` completed with dword 1 `dw1`.
    /// Returns whether parts remain outstanding on other replicas.
    pub fn on_part_done(&mut self, now: Nanos, ticket: &mut Ticket, r: usize, dw1: u32) -> bool {
        if !ticket.replicas.remove(r) {
            return !ticket.replicas.is_empty();
        }
        // A part sent without a credit gives none back and says nothing
        // of the replica's load.
        let counted = !ticket.uncounted.remove(r);
        if let Some(g) = self.gates.get_mut(r).filter(|_| counted) {
            let latency = now.nanos_since(ticket.sent_at);
            let compared = log::log_enabled!(log::Level::Debug).then(|| {
                let (c, _) = g.gain_probes();
                c.up + c.down
            });
            if let Some(Some(slot)) = self.slots.get(r) {
                slot.publish(latency);
                // Fresh against a probe phase's length (tens of rounds),
                // at most a thousand reads of 64 slots a second.
                if now.nanos_since(self.read_at[r]) >= NEIGHBOURS_READ_NS {
                    self.read_at[r] = now;
                    slot.read(&mut self.seen);
                    g.set_neighbours(&self.seen);
                    let s = &self.shared.stats;
                    s.estimate_neighbours
                        .store(self.seen.len() as u64, Ordering::Relaxed);
                    s.estimate_cost_x1000.store(
                        (g.neighbour_cost() * 1000.0).round() as i64,
                        Ordering::Relaxed,
                    );
                }
            }
            g.on_completion(now, ticket.kind, ticket.bytes, latency, Some(dw1));
            if let (Some(n), Some(c)) = (compared, g.last_comparison()) {
                let (counts, young) = g.gain_probes();
                if counts.up + counts.down != n {
                    log::debug!(
                        "queue {} replica {r}: probe {} from gain {:.2}: own {:+.1} %, neighbours' latency {:+.1} %; gain now {:.2}{} (kept up {}/{}, down {}/{})",
                        self.qid,
                        if c.up { "up" } else { "down" },
                        c.gain,
                        (c.own - 1.0) * 100.0,
                        (c.cost.exp() - 1.0) * 100.0,
                        g.gain(),
                        if young { ", young" } else { "" },
                        counts.up_kept,
                        counts.up,
                        counts.down_kept,
                        counts.down
                    );
                }
            }
            if ticket.read {
                let _ = self.selector.on_completion(r, Some(latency));
            }
            let s = &self.shared.stats;
            if let Some(c) = qos_core::credit::decode_credit_dw1(dw1) {
                s.last_credit.store(c, Ordering::Relaxed);
                s.credit_seen.store(true, Ordering::Relaxed);
                if let Some(rc) = s.replica_credit.get(r) {
                    rc.store(c, Ordering::Relaxed);
                }
            }
            if let Some(c) = s.replica_in_flight.get(r) {
                c.fetch_sub(1, Ordering::Relaxed);
            }
            let (window, source) = g.window();
            if let Some(w) = s.replica_window.get(r) {
                w.store(window, Ordering::Relaxed);
            }
            s.window.store(window, Ordering::Relaxed);
            s.source.store(source_code(source), Ordering::Relaxed);
        }
        !ticket.replicas.is_empty()
    }

    /// Every part of `ticket` has ended: the request leaves the stage.
    pub fn on_request_done(&mut self) {
        self.shared.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// An admitted request finished: with its completion's dword 1, or
    /// `None` when it failed without one (never sent, connection lost and
    /// given up).
    ///
    /// (One-target volumes; a replicated request reports each replica's
    /// part with [`QueueQos::on_part_done`] / [`QueueQos::release`], then
    /// [`QueueQos::on_request_done`].)
    pub fn on_done(&mut self, now: Nanos, mut ticket: Ticket, dw1: Option<u32>) {
        for r in ticket.replicas {
            match dw1 {
                Some(dw1) => {
                    self.on_part_done(now, &mut ticket, r, dw1);
                }
                None => self.release(&mut ticket, r),
            }
        }
        self.on_request_done();
    }
}

impl<T> Drop for QueueQos<T> {
    fn drop(&mut self) {
        let s = &self.shared.stats;
        s.queued.fetch_sub(self.queued() as u64, Ordering::Relaxed);
        while let Some(w) = self
            .staged
            .take()
            .or_else(|| self.waiting.dequeue(Nanos(u64::MAX / 2)).map(|a| a.payload))
        {
            s.class_queued[w.prio.index()].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_core::credit::encode_credit_dw1;
    use std::collections::VecDeque;

    #[test]
    fn limits_use_the_shared_size_grammar() {
        assert_eq!(parse_amount("max"), Some(0));
        assert_eq!(parse_amount("2000"), Some(2000));
        assert_eq!(parse_amount("100m"), Some(100 << 20));
        assert_eq!(parse_amount("1G"), Some(1 << 30));
        assert_eq!(parse_amount("64KiB"), Some(64 << 10));
        assert_eq!(parse_amount("fast"), None);
        assert_eq!(parse_amount("99999999999999g"), None);
    }

    fn stage(cfg: QosConfig, queues: u16, qid: u16) -> QueueQos<u32> {
        QueueQos::new(
            Arc::new(VolumeQos::new(&cfg, queues)),
            qid,
            ArbiterConfig::default(),
        )
    }

    fn drain(q: &mut QueueQos<u32>, now: Nanos) -> Vec<(u32, Ticket)> {
        std::iter::from_fn(|| q.poll_admit(now)).collect()
    }

    #[test]
    fn credits_bound_in_flight_and_completions_release_in_order() {
        let cfg = QosConfig {
            credits: CreditMode::Target,
            ..QosConfig::new()
        };
        let mut q = stage(cfg, 1, 0);
        let now = Nanos(1_000);
        for i in 0..20 {
            q.push(now, i, LimitKind::Read, 4096, NvmeClass::Medium);
        }
        // Initial window (8) until the target reports.
        let first = drain(&mut q, now);
        assert_eq!(
            first.iter().map(|x| x.0).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        // The target grants 2: nothing goes until in flight < 2.
        let mut tickets: VecDeque<Ticket> = first.into_iter().map(|x| x.1).collect();
        q.on_done(
            Nanos(2_000),
            tickets.pop_front().unwrap(),
            Some(encode_credit_dw1(2)),
        );
        assert!(q.poll_admit(Nanos(2_000)).is_none());
        while q.in_flight() > 1 {
            q.on_done(
                Nanos(3_000),
                tickets.pop_front().unwrap(),
                Some(encode_credit_dw1(2)),
            );
        }
        let next = drain(&mut q, Nanos(3_000));
        assert_eq!(next.iter().map(|x| x.0).collect::<Vec<_>>(), vec![8]);
        let snap = q.shared().snapshot();
        assert_eq!(snap.over_credit, 0);
        assert_eq!(snap.window_source, "target");
        assert_eq!(snap.target_credit, Some(2));
        assert_eq!(snap.queued, 11);
        assert_eq!(snap.in_flight, 2);
    }

    /// The wait counters add up what the local queue held: `status` and
    /// the metrics give the total, from which a bench takes one run's mean
    /// wait as the difference of two snapshots (the since-start mean,
    /// rounded to a microsecond over every admitted request, cannot give
    /// it).
    #[test]
    fn wait_totals_add_up_the_held_requests() {
        let cfg = QosConfig {
            credits: CreditMode::Target,
            ..QosConfig::new()
        };
        let mut q = QueueQos::new(
            Arc::new(VolumeQos::new(&cfg, 1)),
            0,
            ArbiterConfig::default(),
        );
        let dw1 = encode_credit_dw1(1);
        for i in 0..3u32 {
            q.push(Nanos(0), i, LimitKind::Read, 4096, NvmeClass::High);
        }
        // The accounting, not the gate's decision: the first is admitted
        // at once, the others when the test polls them, 2.5 ms and 4 ms
        // after they came (their completions report credit 1, so each is
        // polled only once the one before it is done).
        let (_, t) = q.poll_admit(Nanos(0)).unwrap();
        q.on_done(Nanos(2_500_000), t, Some(dw1));
        let (_, t) = q.poll_admit(Nanos(2_500_000)).unwrap();
        assert!(q.poll_admit(Nanos(2_500_000)).is_none());
        q.on_done(Nanos(4_000_000), t, Some(dw1));
        let (_, t) = q.poll_admit(Nanos(4_000_000)).unwrap();
        q.on_done(Nanos(4_100_000), t, Some(dw1));
        let snap = q.shared().snapshot();
        assert_eq!((snap.admitted, snap.waited), (3, 2));
        assert_eq!(snap.wait_us_total, 6_500);
        assert_eq!(snap.wait_us_max, 4_000);
        assert_eq!(snap.wait_us_mean, 6_500 / 3);
    }

    /// `status` shows what the gain probe decided, so that an operator can
    /// tell a gain held low by a full path (unpaid up probes) from one no
    /// workload ever tested (undecided cruises): the snapshot carries the
    /// estimating gate's counts. Driven here by a closed loop of 256
    /// requests on a path whose batch of `b` takes 2 ms + 0.2 ms x b.
    #[test]
    fn status_carries_the_gain_probes_decisions() {
        let cfg = QosConfig {
            credits: CreditMode::Estimate,
            ..QosConfig::new()
        };
        let mut q = QueueQos::new(
            Arc::new(VolumeQos::new(&cfg, 1)),
            0,
            ArbiterConfig::default(),
        );
        for i in 0..256u32 {
            q.push(Nanos(0), i, LimitKind::Read, 4096, NvmeClass::High);
        }
        let mut now = 0u64;
        while now < 20_000_000_000 {
            let mut batch = Vec::new();
            while let Some((tag, t)) = q.poll_admit(Nanos(now)) {
                batch.push((tag, t));
            }
            now += 2_000_000 + 200_000 * batch.len() as u64;
            for (tag, t) in batch {
                // DW1 0: a completion of a target that sends no credits.
                q.on_done(Nanos(now), t, Some(0));
                q.push(Nanos(now), tag, LimitKind::Read, 4096, NvmeClass::High);
            }
        }
        let snap = q.shared().snapshot();
        let (c, young) = q.gates[0].gain_probes();
        assert!(c.up >= 1, "{c:?}");
        assert_eq!(
            (
                snap.estimate_probes_up,
                snap.estimate_probes_up_kept,
                snap.estimate_probes_down,
                snap.estimate_probes_down_kept,
                snap.estimate_probes_undecided,
                snap.estimate_young,
            ),
            (c.up, c.up_kept, c.down, c.down_kept, c.undecided, young)
        );
        assert_eq!(
            snap.estimate_gain_x100,
            (q.gates[0].gain() * 100.0).round() as u64
        );
    }

    /// Requests held for credits leave by class: under DRR 4:1 by bytes
    /// a high backlog of 4 KiB and a low backlog of 64 KiB get bytes in
    /// about the weights' ratio, where plain FIFO would alternate
    /// requests and give the large ones 16x the bytes; aging lets a low
    /// request out after its threshold even under a high flood.
    #[test]
    fn held_requests_are_released_by_class_weights_and_aging() {
        use qos_core::class_arbiter::ArbitrationMode;
        let cfg = QosConfig {
            credits: CreditMode::Target,
            ..QosConfig::new()
        };
        let arb = ArbiterConfig {
            mode: ArbitrationMode::Drr,
            high_weight: 4,
            medium_weight: 2,
            low_weight: 1,
            high_quantum_bytes: 4 * 32 * 1024,
            medium_quantum_bytes: 2 * 32 * 1024,
            low_quantum_bytes: 32 * 1024,
            aging_threshold_us: 0,
            ..ArbiterConfig::default()
        };
        let mut q = QueueQos::new(Arc::new(VolumeQos::new(&cfg, 1)), 0, arb);
        // Credit 1: one in flight at a time, everything else is held.
        let dw1 = encode_credit_dw1(1);
        for i in 0..400u32 {
            let (c, b, p) = if i % 2 == 0 {
                (LimitKind::Read, 4096, NvmeClass::High)
            } else {
                (LimitKind::Read, 65536, NvmeClass::Low)
            };
            q.push(Nanos(0), i, c, b, p);
        }
        let (mut high, mut low) = (0u64, 0u64);
        let mut now = Nanos(1);
        // The first admission (nothing in flight) reports the credit.
        let (_, t) = q.poll_admit(now).expect("idle queue admits one");
        q.on_done(now, t, Some(dw1));
        for _ in 0..150 {
            now = Nanos(now.0 + 1000);
            let (i, t) = q.poll_admit(now).expect("a credit is free");
            assert!(q.poll_admit(now).is_none(), "credit 1 admits one");
            if i % 2 == 0 {
                high += 4096;
            } else {
                low += 65536;
            }
            q.on_done(now, t, Some(dw1));
        }
        let ratio = high as f64 / low as f64;
        assert!((3.0..=5.5).contains(&ratio), "high/low bytes {ratio}");
        let snap = q.shared().snapshot();
        assert_eq!(snap.class_admitted.iter().sum::<u64>(), 151);
        assert_eq!(
            snap.class_queued.iter().sum::<u64>(),
            q.queued() as u64,
            "{snap:?}"
        );

        // Aging: a low request older than the threshold beats a flood.
        let arb = ArbiterConfig {
            aging_threshold_us: 1000,
            ..ArbiterConfig::default()
        };
        let mut q = QueueQos::new(Arc::new(VolumeQos::new(&cfg, 1)), 0, arb);
        q.push(Nanos(0), 0, LimitKind::Read, 4096, NvmeClass::High);
        q.push(Nanos(0), 1, LimitKind::Read, 4096, NvmeClass::Low);
        for i in 2..100 {
            q.push(Nanos(0), i, LimitKind::Read, 4096, NvmeClass::High);
        }
        let (first, t) = q.poll_admit(Nanos(1)).unwrap();
        assert_eq!(first, 0);
        q.on_done(Nanos(1), t, Some(dw1));
        // 2 ms later the low request has aged past 1 ms.
        let (next, _) = q.poll_admit(Nanos(2_000_000)).unwrap();
        assert_eq!(next, 1, "aged low request goes first");
    }

    /// Replicated volumes: a read goes to one readable replica, a write to
    /// every writable one and only when each has room in its gate; a
    /// replica's dropped part gives its credit back; a read moved to
    /// another replica takes no credit there.
    #[test]
    fn replicated_routing_follows_the_routes_and_the_gates() {
        let cfg = QosConfig {
            credits: CreditMode::Target,
            initial_window: 1,
            ..QosConfig::new()
        };
        let mut q: QueueQos<u32> = QueueQos::replicated(
            Arc::new(VolumeQos::new(&cfg, 1)),
            0,
            ArbiterConfig::default(),
            2,
            ReplicaPolicy::RoundRobin,
        );
        let both = Route {
            writable: ReplicaSet::first_n(2),
            readable: ReplicaSet::first_n(2),
        };
        let now = Nanos(1);
        q.push(now, 1, LimitKind::Read, 4096, NvmeClass::Medium);
        q.push(now, 2, LimitKind::Read, 4096, NvmeClass::Medium);
        let (a, ta) = q.poll_admit_routed(now, both).unwrap();
        let (b, tb) = q.poll_admit_routed(now, both).unwrap();
        assert_eq!((a, b), (1, 2));
        assert!(ta.is_read() && tb.is_read());
        assert_eq!(ta.replicas().len(), 1);
        assert_eq!(
            ta.replicas().union(tb.replicas()),
            ReplicaSet::first_n(2),
            "round robin spreads reads"
        );
        // Window 1 on each replica, both busy: a write must wait for both.
        q.push(now, 3, LimitKind::Write, 4096, NvmeClass::Medium);
        assert!(q.poll_admit_routed(now, both).is_none());
        let mut ta = ta;
        let ra = ta.replicas().first().unwrap();
        q.on_part_done(now, &mut ta, ra, 0);
        assert!(
            q.poll_admit_routed(now, both).is_none(),
            "one replica is still full"
        );
        let mut tb = tb;
        let rb = tb.replicas().first().unwrap();
        // The other replica's path failed: its part is dropped, its credit
        // comes back.
        q.release(&mut tb, rb);
        assert_eq!(tb.replicas(), ReplicaSet::EMPTY);
        let (w, mut tw) = q.poll_admit_routed(now, both).unwrap();
        assert_eq!(w, 3);
        assert_eq!(
            tw.replicas(),
            ReplicaSet::first_n(2),
            "writes go to every writable replica"
        );
        assert!(q.on_part_done(now, &mut tw, 0, 0), "replica 1 still out");
        assert!(!q.on_part_done(now, &mut tw, 1, 0));
        // Degraded: replica 1 out; reads and writes only to replica 0.
        let degraded = Route {
            writable: ReplicaSet::one(0),
            readable: ReplicaSet::one(0),
        };
        q.push(now, 4, LimitKind::Write, 4096, NvmeClass::Medium);
        let (_, t4) = q.poll_admit_routed(now, degraded).unwrap();
        assert_eq!(t4.replicas(), ReplicaSet::one(0));
        // A read whose replica failed moves without taking a credit.
        q.push(now, 5, LimitKind::Read, 4096, NvmeClass::Medium);
        let mut t4 = t4;
        q.on_part_done(now, &mut t4, 0, 0);
        let (_, mut t5) = q.poll_admit_routed(now, both).unwrap();
        let from = t5.replicas().first().unwrap();
        q.reroute(&mut t5, from, 1 - from);
        assert_eq!(t5.replicas(), ReplicaSet::one(1 - from));
        assert!(!q.on_part_done(now, &mut t5, 1 - from, 0));
        assert_eq!(q.in_flight(), 0, "every credit came back");
    }

    #[test]
    fn zero_credit_still_lets_one_request_through() {
        let cfg = QosConfig {
            credits: CreditMode::Target,
            ..QosConfig::new()
        };
        let mut q = stage(cfg, 1, 0);
        q.push(Nanos(0), 1, LimitKind::Write, 4096, NvmeClass::Medium);
        let (_, t) = q.poll_admit(Nanos(0)).unwrap();
        q.on_done(Nanos(10), t, Some(encode_credit_dw1(0)));
        q.push(Nanos(10), 2, LimitKind::Write, 4096, NvmeClass::Medium);
        q.push(Nanos(10), 3, LimitKind::Write, 4096, NvmeClass::Medium);
        let (i, t) = q.poll_admit(Nanos(10)).unwrap();
        assert_eq!(i, 2);
        assert!(q.poll_admit(Nanos(10)).is_none());
        q.on_done(Nanos(20), t, Some(encode_credit_dw1(0)));
        assert_eq!(q.poll_admit(Nanos(20)).unwrap().0, 3);
    }

    #[test]
    fn shares_of_a_credit_add_up_to_it() {
        let shared = Arc::new(VolumeQos::new(&QosConfig::new(), 3));
        let qs: Vec<QueueQos<u32>> = (0..3)
            .map(|i| QueueQos::new(Arc::clone(&shared), i, ArbiterConfig::default()))
            .collect();
        for w in [0u32, 1, 2, 3, 7, 64, 1000] {
            let t = (w, WindowSource::Target);
            assert_eq!(qs.iter().map(|q| q.share(t)).sum::<u32>(), w);
            // An estimate is each queue's own, not split.
            assert_eq!(qs[1].share((w, WindowSource::Estimate)), w);
        }
        assert_eq!(qs[0].share((u32::MAX, WindowSource::Target)), u32::MAX);
    }

    #[test]
    fn nvmet_completions_switch_auto_to_estimate() {
        let mut q = stage(QosConfig::new(), 1, 0);
        for i in 0..100u64 {
            q.push(
                Nanos(i * 1000),
                i as u32,
                LimitKind::Read,
                4096,
                NvmeClass::Medium,
            );
            let (_, t) = q.poll_admit(Nanos(i * 1000)).unwrap();
            q.on_done(Nanos(i * 1000 + 500), t, Some(0));
        }
        let s = q.shared().snapshot();
        assert_eq!(
            (s.credits_mode.as_str(), s.window_source.as_str()),
            ("auto", "estimate")
        );
        assert!(s.target_credit.is_none());
    }

    #[test]
    fn limiter_paces_with_a_timer_and_never_spins() {
        let cfg = QosConfig {
            credits: CreditMode::Off,
            limits: RateLimits {
                read_iops: 1000,
                read_iops_burst: 1,
                ..RateLimits::default()
            },
            ..QosConfig::new()
        };
        let mut q = stage(cfg, 1, 0);
        for i in 0..10 {
            q.push(Nanos(0), i, LimitKind::Read, 4096, NvmeClass::Medium);
        }
        // Flushes queued behind are not overtaking reads.
        q.push(Nanos(0), 99, LimitKind::Other, 0, NvmeClass::Medium);
        let mut now = Nanos(0);
        let mut got = Vec::new();
        let mut wakeups = 0;
        while got.len() < 11 {
            while let Some((i, t)) = q.poll_admit(now) {
                got.push((i, now));
                q.on_done(now, t, Some(0));
            }
            if let Some(t) = q.timer() {
                assert!(t > now, "a timer in the past would spin");
                now = t;
                wakeups += 1;
            }
            assert!(wakeups < 100);
        }
        assert_eq!(got.last().unwrap().0, 99);
        // 10 reads at 1000/s, burst 1: the 10th at 9 ms.
        assert_eq!(got[9].1, Nanos::from_millis(9));
        assert_eq!(q.shared().snapshot().limiter_delays, 9);
    }

    #[test]
    fn rate_change_at_run_time_keeps_queued_requests() {
        let cfg = QosConfig {
            credits: CreditMode::Off,
            limits: RateLimits {
                read_iops: 10,
                read_iops_burst: 1,
                ..RateLimits::default()
            },
            ..QosConfig::new()
        };
        let mut q = stage(cfg, 1, 0);
        for i in 0..5 {
            q.push(Nanos(0), i, LimitKind::Read, 4096, NvmeClass::Medium);
        }
        assert_eq!(drain(&mut q, Nanos(0)).len(), 1);
        assert_eq!(q.timer(), Some(Nanos::from_millis(100)));
        let new = apply_settings(&q.shared().settings(), &["riops=0"]).unwrap();
        q.shared().apply(Nanos(1), &new);
        assert_eq!(drain(&mut q, Nanos(1)).len(), 4);
        assert!(q.timer().is_none());
        assert_eq!(q.shared().snapshot().riops, 0);
    }

    #[test]
    fn mode_change_applies_to_running_queues() {
        let mut q = stage(QosConfig::new(), 1, 0);
        let off = apply_settings(&q.shared().settings(), &["credits=off"]).unwrap();
        q.shared().apply(Nanos(0), &off);
        for i in 0..2000 {
            q.push(Nanos(0), i, LimitKind::Read, 4096, NvmeClass::Medium);
        }
        assert_eq!(drain(&mut q, Nanos(0)).len(), 2000);
        assert_eq!(q.shared().snapshot().window_source, "unlimited");
    }

    #[test]
    fn settings_parse_like_io_max() {
        let c = apply_settings(
            &QosConfig::new(),
            &[
                "riops=2000",
                "wbps=10m",
                "rbps=max",
                "riops_burst=50",
                "credits=estimate",
            ],
        )
        .unwrap();
        assert_eq!(c.limits.read_iops, 2000);
        assert_eq!(c.limits.write_bps, 10 << 20);
        assert_eq!(c.limits.read_bps, 0);
        assert_eq!(c.limits.read_iops_burst, 50);
        assert_eq!(c.credits, CreditMode::Estimate);
        for bad in [
            "riops",
            "riops=x",
            "iops=5",
            "credits=some",
            "riops=99999999999999g",
        ] {
            assert!(apply_settings(&QosConfig::new(), &[bad]).is_err(), "{bad}");
        }
        assert!(apply_settings(&QosConfig::new(), &[]).is_err());
    }

    /// Two volumes on one namespace see each other through the shadow
    /// view, a volume's own queues do not count as neighbours, and an
    /// elastic volume's stage (`QueueQos::new`) takes no slot.
    #[test]
    fn volumes_of_one_namespace_see_each_other_and_not_their_own_queues() {
        let dir = tempfile::tempdir().unwrap();
        let volume = || {
            let view = NamespaceView::open(dir.path(), "ns").unwrap();
            Arc::new(VolumeQos::new(&QosConfig::new(), 2).with_neighbours(vec![Some(view)]))
        };
        let (a, b) = (volume(), volume());
        let arb = ArbiterConfig::default();
        let stage = |v: &Arc<VolumeQos>, qid| {
            QueueQos::replicated(Arc::clone(v), qid, arb, 1, ReplicaPolicy::Primary)
        };
        let (mut a0, mut a1) = (stage(&a, 0), stage(&a, 1));
        let unseen: QueueQos<u32> = QueueQos::new(Arc::clone(&b), 1, arb);
        assert!(unseen.slots.iter().all(Option::is_none));
        // Every completion publishes; a gate reads the view at most once
        // a millisecond.
        let run = |q: &mut QueueQos<u32>, at_ms: u64| {
            let t = Nanos(at_ms * 1_000_000);
            q.push(t, 0, LimitKind::Read, 4096, NvmeClass::Medium);
            let (_, ticket) = q.poll_admit(t).unwrap();
            q.on_done(t.saturating_add_nanos(50_000), ticket, Some(0));
        };
        run(&mut a0, 1);
        run(&mut a1, 2);
        assert_eq!(a.snapshot().estimate_neighbours, 0, "its own queues");
        let mut b0 = stage(&b, 0);
        run(&mut b0, 3);
        assert_eq!(b.snapshot().estimate_neighbours, 2, "a's two queues");
        run(&mut a0, 4);
        assert_eq!(a.snapshot().estimate_neighbours, 1, "b's queue");
        let mut seen = Vec::new();
        a0.slots[0].as_ref().unwrap().read(&mut seen);
        assert_eq!((seen[0].completions, seen[0].latency_ns), (1, 50_000));
        // A dropped stage leaves the view.
        drop(b0);
        run(&mut a0, 6);
        assert_eq!(a.snapshot().estimate_neighbours, 0);
    }
}
