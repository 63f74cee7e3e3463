//! A volume's configuration: one TOML file per volume.
//!
//! ```toml
//! name = "vol0"
//! [target]                # one target namespace; or, for a mirrored
//! address = "127.0.0.1"   # volume, one [[replica]] table per copy
//! port = 4420             # (same keys) instead of [target]
//! subnqn = "nqn.2026-01.io.gimbal:demo"
//! nsid = 1
//! [host]                  # optional: generated and persisted once if absent
//! nqn = "nqn.2014-08.org.nvmexpress:uuid:..."
//! id = "0f1e..."
//! dhchap_secret = "DHHC-1:01:...:"        # DH-HMAC-CHAP (nvme-cli --dhchap-secret),
//! dhchap_ctrl_secret = "DHHC-1:01:...:"   # --dhchap-ctrl-secret; or *_file = "PATH"
//! [io]
//! queues = 2
//! queue_depth = 64
//! io_timeout = 30         # seconds
//! header_digest = false   # NVMe/TCP digests (nvme-cli --hdr-digest, --data-digest)
//! data_digest = false
//! zero_copy = "auto"      # auto: ublk zero copy where the kernel has it (6.16+) | off
//! [reconnect]
//! reconnect_delay = 2     # seconds
//! ctrl_loss_tmo = 600     # seconds, -1: forever
//! fast_io_fail_tmo = -1   # seconds, -1: never
//! keep_alive_tmo = 5      # seconds
//! [qos]                   # see crate::qos
//! credits = "auto"        # auto | target | estimate | off
//! estimate_neighbours = true  # count what a probe costs this host's other volumes of the namespace
//! riops = 2000            # io.max names: riops wiops rbps wbps, *_burst
//! [priority]              # see crate::qos::priority
//! source = "ionice"       # ionice | fixed
//! arbitration = "drr"     # auto | wrr | drr
//! high_weight = 4
//! [replication]           # only with [[replica]]; every key optional
//! read_policy = "least-loaded"  # least-loaded | round-robin | primary
//! resync_rate = "64m"     # bytes/s of background resync (k/m/g; 0: unlimited)
//! region_size = "1m"      # bytes per write-intent bit (power of two)
//! bitmap_dir = "/var/lib/ublk-nvmf"  # NAME.bitmap lives here
//! [cluster]               # optional: cluster mode (crate::cluster); without
//! endpoints = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]  # it no etcd
//! prefix = "/ublk-nvmf"   # keys live under PREFIX/volumes/NAME/
//! lease_ttl = 10          # seconds: how long a silent owner keeps the volume
//! op_timeout_ms = 1000    # bound on one etcd request (x endpoints < lease_ttl / 3)
//! health_wait = 60        # seconds a write that needs a health change waits for etcd
//! fencing = "reservations"  # reservations | none
//! [metrics]               # Prometheus: GET http://LISTEN/metrics; off if absent
//! listen = "127.0.0.1:9750"  # one port per volume (each volume is a process)
//! ```
//!
//! An elastic volume (issue 18; see [`crate::evol`]): no `[target]` nor
//! `[[replica]]`: its namespaces are the pool's in etcd, read at start.
//!
//! ```toml
//! name = "ev0"            # the device's name, and its owner key in etcd
//! [evol]
//! name = "ev0"            # the eVol in etcd (PREFIX/evols/NAME); default: name
//! alloc_wait = 30         # seconds a first write waits for its extent's mapping
//! auction = true          # gate I/O by the arbiter's bandwidth slices (fails open)
//!                         # ([qos] credits defaults to "off" for an eVol: one gate
//!                         # cannot estimate a window for many members)
//! eio = true              # order I/Os within a class by cost (false: arrival order)
//! report_interval_ms = 100  # view reports and queries; default: the view's epoch
//! [cluster]               # required: the map, the pool and ownership live in etcd
//! endpoints = ["10.0.0.1:2379"]
//! fencing = "none"        # the default for eVols; "reservations" is refused
//! ```
//!
//! A replicated volume:
//!
//! ```toml
//! name = "mirror0"
//! [[replica]]             # replica 0: the primary
//! address = "10.0.0.1"
//! subnqn = "nqn.2026-01.io.gimbal:a"
//! [[replica]]             # replica 1
//! address = "10.0.0.2"
//! subnqn = "nqn.2026-01.io.gimbal:b"
//! ```
//!
//! Unknown keys are errors (a typo must not silently do nothing).
//! Every error names the file, the line and the field
//! ([`config_diag::ConfigError`]); a field of a replica is
//! named `replica[i].key`, `i` counting from 0 in file order (the index
//! `status` and the replica selector use).

mod one_liner;

pub use one_liner::ConnectArgs;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use config_diag::{ConfigError, Ctx};
use nvmf_initiator::blocking::{DhchapKeys, HostIdentity};
use nvmf_initiator::ReconnectPolicy;
use nvmf_proto::auth::DhchapSecret;
use nvmf_proto::uuid::{format_uuid, parse_uuid};
use serde::Deserialize;
use toml::Spanned;

use qos_core::replica::ReplicaPolicy;

use crate::qos::priority::{parse_class, Mechanism, PriorityConfig, Source};
use crate::qos::{parse_amount, parse_mode, QosConfig};

/// A parsed, checked volume configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeConfig {
    /// Where it was read from.
    pub path: PathBuf,
    /// Volume name: `[A-Za-z0-9_.-]`, at most 64 characters (used in file
    /// names, the systemd instance and the udev symlink).
    pub name: String,
    /// The target namespace; for a replicated volume the first replica
    /// (`replicas[0]`, the primary), so that single-target code paths keep
    /// working unchanged.
    pub target: TargetSpec,
    /// Every replica in file order, the first included; one element (equal
    /// to `target`) for a volume given with `[target]`.
    pub replicas: Vec<TargetSpec>,
    /// `[replication]`: read policy, resync rate, write-intent bitmap.
    /// Defaults when absent (and for single-target volumes, which ignore it).
    pub replication: ReplicationConfig,
    /// Host identity from the file, if given.
    pub host: Option<HostIdentity>,
    /// DH-HMAC-CHAP keys (`[host] dhchap_secret`, `dhchap_ctrl_secret`, or
    /// their `*_file` forms), used with every replica on every queue the
    /// target asks to authenticate.
    pub dhchap: Option<DhchapKeys>,
    /// ublk queues, each with its own thread and NVMe/TCP I/O queue.
    pub queues: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Bound on each NVMe command.
    pub io_timeout: Duration,
    /// Ask for NVMe/TCP header digests (`[io] header_digest`; nvme-cli's
    /// `--hdr-digest`).
    pub header_digest: bool,
    /// Ask for NVMe/TCP data digests (`[io] data_digest`; `--data-digest`).
    pub data_digest: bool,
    /// Use ublk's zero copy where the driver offers it (`[io] zero_copy`,
    /// see [`crate::io::ublk`]).
    pub zero_copy: ZeroCopy,
    /// Reconnect behaviour.
    pub reconnect: ReconnectPolicy,
    /// Keep Alive timeout proposed to the target.
    pub keep_alive: Duration,
    /// Client-side QoS (`[qos]`): credit mode and rate limits.
    pub qos: QosConfig,
    /// I/O priority classes (`[priority]`).
    pub priority: PriorityConfig,
    /// Cluster mode (`[cluster]`): ownership, fencing and replica health
    /// in etcd. `None`: the single-host default, no etcd.
    pub cluster: Option<ClusterConfig>,
    /// `[evol]`: an elastic volume; `target` and `replicas` are then empty
    /// placeholders until [`crate::volume::Volume::connect`] fills them
    /// with the pool's namespaces read from etcd.
    pub evol: Option<EvolConfig>,
    /// `[metrics] listen`: where this volume's server answers Prometheus'
    /// `GET /metrics`; `None` (the default): no listener. Each volume is
    /// its own process, so each needs its own port; loopback or a
    /// management network only.
    pub metrics_listen: Option<SocketAddr>,
}

/// `[evol]`: an elastic volume (see [`crate::evol`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvolConfig {
    /// The eVol's name in etcd.
    pub name: String,
    /// Bound on a first write's wait for its extent's mapping (then it
    /// fails with EIO, never acknowledged).
    pub alloc_wait: Duration,
    /// Flint's client side: auction, eIO, view reports (see
    /// [`crate::evol_qos`]).
    pub flint: crate::evol_qos::FlintSettings,
}

/// `[cluster]`: where the volume's cluster state lives (see
/// [`crate::cluster`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// etcd members, `http://host:port`.
    pub endpoints: Vec<String>,
    /// Key prefix.
    pub prefix: String,
    /// The owner's lease: how long after this host goes silent another
    /// host may attach the volume without a takeover.
    pub lease_ttl: Duration,
    /// Bound on one etcd request.
    pub op_timeout: Duration,
    /// How long a write that needs a replica health change recorded in
    /// etcd waits for it before it fails.
    pub health_wait: Duration,
    /// How older owners are kept off the targets.
    pub fencing: Fencing,
}

/// `[io] zero_copy`: whether the device asks ublk for zero copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroCopy {
    /// Where the driver offers automatic buffer registration (Linux 6.16+)
    /// and the volume does not ask for data digests (which need the data
    /// in our memory): large reads go from the socket straight into the
    /// request's pages.
    Auto,
    /// Always the copy through the per-tag buffers.
    Off,
}

/// `[cluster] fencing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// An Exclusive Access NVMe reservation per replica namespace, keyed by
    /// the attach epoch (the default; every target must support
    /// reservations).
    Reservations,
    /// None: an older owner that still runs (paused, cut off) could write.
    /// Only for targets without reservations, with another fence (e.g.
    /// the old host powered off) in place.
    None,
}

impl ClusterConfig {
    /// Default lease: 10 s. A takeover without `takeover` waits this long
    /// after a host dies; keep-alives go every third of it, so two lost
    /// in a row are survived.
    pub const DEFAULT_LEASE_TTL_S: i64 = 10;
    /// Default key prefix.
    pub const DEFAULT_PREFIX: &'static str = "/ublk-nvmf";
}

/// Most replicas a volume may have: a write goes to every one of them, and
/// the write-intent log keeps one bitmap and one header entry per replica.
pub const MAX_REPLICAS: usize = 16;

/// `[replication]`: how a volume with several `[[replica]]` tables uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// How reads pick a replica (`read_policy`).
    pub read_policy: ReplicaPolicy,
    /// Bytes per second of background resync (`resync_rate`); 0: unlimited.
    pub resync_rate_bps: u64,
    /// Bytes of the volume covered by one write-intent bit (`region_size`).
    pub region_size: u64,
    /// Directory of the write-intent bitmap file `NAME.bitmap`
    /// (`bitmap_dir`).
    pub bitmap_dir: PathBuf,
}

impl ReplicationConfig {
    /// Default resync rate: 64 MiB/s. A resync copies (reads one replica,
    /// writes another) in the background while the volume serves its users;
    /// 64 MiB/s is a few per cent of a data-centre NVMe SSD (2 to 7 GB/s)
    /// and of a 10 to 25 Gbit/s link, so users hardly notice it, yet the few
    /// regions a short outage dirties (seconds of writes) are copied in
    /// seconds and a full copy of 1 TiB takes under 5 hours. Raise it for a
    /// fast rejoin, lower it on a shared 1 Gbit/s link.
    pub const DEFAULT_RESYNC_RATE_BPS: u64 = 64 << 20;
    /// Default region: 1 MiB, md's common bitmap chunk order of magnitude: a
    /// 1 TiB volume needs 128 KiB of bitmap per replica, and a short outage
    /// dirties few enough regions that resync copies little beyond what was
    /// written.
    pub const DEFAULT_REGION_SIZE: u64 = 1 << 20;
    /// Smallest region: 64 KiB (below it the bitmap of a large volume grows
    /// past what is sensible to keep in memory and rewrite).
    pub const MIN_REGION_SIZE: u64 = 64 << 10;
    /// Largest region: 64 MiB (above it one small write costs a large copy).
    pub const MAX_REGION_SIZE: u64 = 64 << 20;
    /// Default directory of the bitmap files.
    pub const DEFAULT_BITMAP_DIR: &'static str = "/var/lib/ublk-nvmf";

    /// The write-intent bitmap file of volume `name`.
    pub fn bitmap_path(&self, name: &str) -> PathBuf {
        self.bitmap_dir.join(format!("{name}.bitmap"))
    }
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            read_policy: ReplicaPolicy::LeastLoaded,
            resync_rate_bps: Self::DEFAULT_RESYNC_RATE_BPS,
            region_size: Self::DEFAULT_REGION_SIZE,
            bitmap_dir: PathBuf::from(Self::DEFAULT_BITMAP_DIR),
        }
    }
}

/// The name of a read policy in the config (`least-loaded`, ...).
pub fn read_policy_name(p: ReplicaPolicy) -> &'static str {
    match p {
        ReplicaPolicy::LeastLoaded => "least-loaded",
        ReplicaPolicy::RoundRobin => "round-robin",
        ReplicaPolicy::Primary => "primary",
    }
}

/// One target namespace: the target of a single-target volume, or one
/// replica of a replicated volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    /// Host name or IP.
    pub address: String,
    /// TCP port.
    pub port: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace ID.
    pub nsid: u32,
}

impl TargetSpec {
    /// Resolve the address.
    pub fn socket_addr(&self) -> std::io::Result<SocketAddr> {
        (self.address.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{}: no address", self.address)))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: Spanned<String>,
    target: Option<RawTarget>,
    replica: Option<Vec<RawTarget>>,
    replication: Option<RawReplication>,
    host: Option<RawHost>,
    #[serde(default)]
    io: RawIo,
    #[serde(default)]
    reconnect: RawReconnect,
    #[serde(default)]
    qos: RawQos,
    #[serde(default)]
    priority: RawPriority,
    cluster: Option<RawCluster>,
    evol: Option<RawEvol>,
    #[serde(default)]
    metrics: RawMetrics,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvol {
    name: Option<Spanned<String>>,
    alloc_wait: Option<Spanned<i64>>,
    auction: Option<Spanned<bool>>,
    eio: Option<Spanned<bool>>,
    report_interval_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    endpoints: Spanned<Vec<String>>,
    prefix: Option<Spanned<String>>,
    lease_ttl: Option<Spanned<i64>>,
    op_timeout_ms: Option<Spanned<i64>>,
    health_wait: Option<Spanned<i64>>,
    fencing: Option<Spanned<String>>,
}

/// `[metrics]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPriority {
    source: Option<Spanned<String>>,
    class: Option<Spanned<String>>,
    realtime: Option<Spanned<String>>,
    best_effort: Option<Spanned<String>>,
    none: Option<Spanned<String>>,
    idle: Option<Spanned<String>>,
    urgent_realtime_levels: Option<Spanned<i64>>,
    arbitration: Option<Spanned<String>>,
    high_weight: Option<Spanned<i64>>,
    medium_weight: Option<Spanned<i64>>,
    low_weight: Option<Spanned<i64>>,
    burst: Option<Spanned<i64>>,
    aging_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawQos {
    credits: Option<Spanned<String>>,
    initial_window: Option<Spanned<i64>>,
    max_window: Option<Spanned<i64>>,
    riops: Option<Spanned<i64>>,
    wiops: Option<Spanned<i64>>,
    rbps: Option<Spanned<i64>>,
    wbps: Option<Spanned<i64>>,
    riops_burst: Option<Spanned<i64>>,
    wiops_burst: Option<Spanned<i64>>,
    rbps_burst: Option<Spanned<i64>>,
    wbps_burst: Option<Spanned<i64>>,
    /// Removed (issue 14); kept to say so instead of "unknown field".
    estimate_latency_min_us: Option<Spanned<toml::Value>>,
    /// Removed (issue 14), as above.
    estimate_latency_max_us: Option<Spanned<toml::Value>>,
    estimate_gain: Option<Spanned<Number>>,
    estimate_gain_max: Option<Spanned<Number>>,
    estimate_base_window_ms: Option<Spanned<i64>>,
    estimate_neighbours: Option<Spanned<bool>>,
}

/// A number written as an integer or a float (`2` or `2.5`).
#[derive(Deserialize, Clone, Copy)]
#[serde(untagged)]
enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    fn get(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplication {
    read_policy: Option<Spanned<String>>,
    resync_rate: Option<Spanned<Amount>>,
    region_size: Option<Spanned<Amount>>,
    bitmap_dir: Option<Spanned<String>>,
}

/// A byte count or rate written as a number or as a string with a k/m/g
/// suffix (`"64m"`), as in `ublk-nvmf set`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Amount {
    Number(i64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    address: Spanned<String>,
    #[serde(default = "default_port")]
    port: Spanned<u32>,
    subnqn: Spanned<String>,
    #[serde(default = "default_nsid")]
    nsid: Spanned<u32>,
}

fn default_port() -> Spanned<u32> {
    Spanned::new(0..0, 4420)
}
fn default_nsid() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    nqn: Option<Spanned<String>>,
    id: Option<Spanned<String>>,
    dhchap_secret: Option<Spanned<String>>,
    dhchap_ctrl_secret: Option<Spanned<String>>,
    dhchap_secret_file: Option<Spanned<String>>,
    dhchap_ctrl_secret_file: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawIo {
    queues: Option<Spanned<i64>>,
    queue_depth: Option<Spanned<i64>>,
    io_timeout: Option<Spanned<i64>>,
    #[serde(default)]
    header_digest: bool,
    #[serde(default)]
    data_digest: bool,
    zero_copy: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawReconnect {
    reconnect_delay: Option<Spanned<i64>>,
    ctrl_loss_tmo: Option<Spanned<i64>>,
    fast_io_fail_tmo: Option<Spanned<i64>>,
    keep_alive_tmo: Option<Spanned<i64>>,
}

/// Whether `name` is a usable volume name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !name.starts_with('.')
}

impl VolumeConfig {
    /// Whether the volume has more than one replica (`[[replica]]` tables).
    pub fn is_replicated(&self) -> bool {
        self.replicas.len() > 1
    }

    /// Read and check `path`. A file that holds a DH-HMAC-CHAP secret
    /// itself (not in a `*_file`) is refused when every user may read it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        let raw = read_raw(path, &text)?;
        let inline_secrets = raw
            .host
            .as_ref()
            .is_some_and(|h| h.dhchap_secret.is_some() || h.dhchap_ctrl_secret.is_some());
        let config = Self::from_raw(path, &text, raw)?;
        if inline_secrets {
            config_diag::refuse_world_readable(path, "holds DH-HMAC-CHAP secrets ([host])")?;
        }
        Ok(config)
    }

    /// Parse and check `source` (read from `path`, for messages).
    pub fn parse(path: &Path, source: &str) -> Result<Self, ConfigError> {
        Self::from_raw(path, source, read_raw(path, source)?)
    }

    /// Check the as-written form `raw` of `source`.
    fn from_raw(path: &Path, source: &str, raw: Raw) -> Result<Self, ConfigError> {
        let cx = Ctx { file: path, source };
        if !valid_name(raw.name.get_ref()) {
            return Err(cx.err(
                &raw.name,
                "name",
                "a volume name is 1 to 64 of [A-Za-z0-9_.-], not starting with a dot",
            ));
        }
        let evol = match &raw.evol {
            Some(e) => Some(parse_evol(&cx, &raw, e)?),
            None => None,
        };
        let replicas = if evol.is_some() {
            Vec::new()
        } else {
            parse_targets(&cx, &raw)?
        };
        let replication = parse_replication(&cx, &raw)?;
        let host = match &raw.host {
            None => None,
            Some(h) => parse_host_identity(&cx, h)?,
        };
        let dhchap = match &raw.host {
            None => None,
            Some(h) => parse_dhchap(&cx, h)?,
        };
        let queues = cx.int(&raw.io.queues, "io.queues", 1, 1..=64)? as u16;
        let queue_depth = cx.int(&raw.io.queue_depth, "io.queue_depth", 64, 2..=1024)? as u16;
        let io_timeout = cx.int(&raw.io.io_timeout, "io.io_timeout", 30, 1..=3600)? as u64;
        let zero_copy = match &raw.io.zero_copy {
            None => ZeroCopy::Auto,
            Some(s) => match s.get_ref().as_str() {
                "auto" => ZeroCopy::Auto,
                "off" => ZeroCopy::Off,
                _ => return Err(cx.err(s, "io.zero_copy", "one of \"auto\", \"off\"")),
            },
        };
        let r = &raw.reconnect;
        let delay = cx.int(&r.reconnect_delay, "reconnect.reconnect_delay", 2, 1..=3600)?;
        let loss = cx.int(
            &r.ctrl_loss_tmo,
            "reconnect.ctrl_loss_tmo",
            600,
            -1..=86400 * 365,
        )?;
        let fast = cx.int(
            &r.fast_io_fail_tmo,
            "reconnect.fast_io_fail_tmo",
            -1,
            -1..=86400,
        )?;
        let kato = cx.int(&r.keep_alive_tmo, "reconnect.keep_alive_tmo", 5, 1..=3600)?;
        if loss >= 0 && loss < delay {
            let s = r.ctrl_loss_tmo.as_ref().expect("set when >= 0 and < delay");
            return Err(cx.err(
                s,
                "reconnect.ctrl_loss_tmo",
                "must be at least reconnect_delay (or -1: keep trying forever)",
            ));
        }
        let mut qos = parse_qos(&cx, &raw.qos)?;
        if evol.is_some() && raw.qos.credits.is_none() {
            // An eVol's one credit gate would estimate a single window
            // from all its members' latencies mixed, which caps the
            // requests in flight far below what K drives take (measured:
            // docs/benchmarks.md, eVol scaling); Flint's auction is the
            // eVol's admission control. An explicit setting still wins.
            qos.credits = qos_core::credit_gate::CreditMode::Off;
        }
        let priority = parse_priority(&cx, &raw.priority)?;
        let mut cluster = match &raw.cluster {
            Some(c) => Some(parse_cluster(&cx, c)?),
            None => None,
        };
        if let (Some(_), Some(c)) = (&evol, cluster.as_mut()) {
            // The pool's namespaces are shared by every eVol (and host):
            // an Exclusive Access reservation per namespace would fence
            // the other volumes' owners out. Ownership in etcd still
            // keeps a second host from attaching the eVol.
            c.fencing = Fencing::None;
        }
        let metrics_listen = cx.listen_addr(&raw.metrics.listen, "metrics.listen")?;
        Ok(Self {
            metrics_listen,
            path: path.to_path_buf(),
            name: raw.name.get_ref().clone(),
            target: replicas.first().cloned().unwrap_or(TargetSpec {
                address: String::new(),
                port: 0,
                subnqn: String::new(),
                nsid: 0,
            }),
            evol,
            replicas,
            replication,
            host,
            dhchap,
            queues,
            queue_depth,
            io_timeout: Duration::from_secs(io_timeout),
            header_digest: raw.io.header_digest,
            data_digest: raw.io.data_digest,
            zero_copy,
            reconnect: ReconnectPolicy {
                reconnect_delay: Duration::from_secs(delay as u64),
                ctrl_loss_tmo: ReconnectPolicy::secs_or_never(loss),
                fast_io_fail_tmo: ReconnectPolicy::secs_or_never(fast),
                requeue: true,
            },
            keep_alive: Duration::from_secs(kato as u64),
            qos,
            priority,
            cluster,
        })
    }
}

/// `[evol]`, checked with what it excludes and needs.
fn parse_evol(cx: &Ctx<'_>, raw: &Raw, e: &RawEvol) -> Result<EvolConfig, ConfigError> {
    let here = |field: &str, msg: &str| {
        let mut x = match &e.name {
            Some(n) => cx.err(n, field, msg),
            None => ConfigError::whole_file(cx.file, msg),
        };
        x.field = field.into();
        x
    };
    if let Some(t) = &raw.target {
        let mut x = cx.err(
            &t.address,
            "target",
            "an eVol's namespaces are its pool's in etcd: remove [target]",
        );
        x.field = "target".into();
        return Err(x);
    }
    if let Some(r) = raw.replica.as_deref().and_then(|l| l.first()) {
        let mut x = cx.err(
            &r.address,
            "replica",
            "an eVol's namespaces are its pool's in etcd, and its copies per extent its spec's: remove the [[replica]] tables",
        );
        x.field = "replica".into();
        return Err(x);
    }
    if raw.replication.is_some() {
        return Err(here(
            "replication",
            "[replication] is for [[replica]] volumes; an eVol's copies are per extent",
        ));
    }
    match &raw.cluster {
        None => {
            return Err(here(
                "cluster",
                "an eVol needs [cluster]: its pool, extent map and owner live in etcd",
            ))
        }
        Some(c) => {
            if let Some(f) = c.fencing.as_ref().filter(|f| f.get_ref() == "reservations") {
                return Err(cx.err(
                    f,
                    "cluster.fencing",
                    "an eVol's namespaces are shared with other volumes: reservations would fence them out; use \"none\" (ownership in etcd still excludes a second host)",
                ));
            }
        }
    }
    let name = match &e.name {
        None => raw.name.get_ref().clone(),
        Some(n) if valid_name(n.get_ref()) => n.get_ref().clone(),
        Some(n) => {
            return Err(cx.err(
                n,
                "evol.name",
                "an eVol name is 1 to 64 of [A-Za-z0-9_.-], not starting with a dot",
            ))
        }
    };
    let wait = cx.int(
        &e.alloc_wait,
        "evol.alloc_wait",
        crate::evol::DEFAULT_ALLOC_WAIT.as_secs() as i64,
        1..=3600,
    )?;
    let interval = match &e.report_interval_ms {
        None => None,
        Some(_) => Some(cx.int(
            &e.report_interval_ms,
            "evol.report_interval_ms",
            0,
            10..=60_000,
        )?),
    };
    Ok(EvolConfig {
        name,
        alloc_wait: Duration::from_secs(wait as u64),
        flint: crate::evol_qos::FlintSettings {
            auction: e.auction.as_ref().is_none_or(|b| *b.get_ref()),
            eio: e.eio.as_ref().is_none_or(|b| *b.get_ref()),
            report_interval: interval.map(|ms| Duration::from_millis(ms as u64)),
        },
    })
}

fn parse_cluster(cx: &Ctx<'_>, c: &RawCluster) -> Result<ClusterConfig, ConfigError> {
    if c.endpoints.get_ref().is_empty() {
        return Err(cx.err(
            &c.endpoints,
            "cluster.endpoints",
            "at least one etcd member, e.g. [\"10.0.0.1:2379\"]",
        ));
    }
    let mut endpoints = Vec::new();
    for e in c.endpoints.get_ref() {
        let url = if e.starts_with("http://") {
            e.clone()
        } else if e.starts_with("https://") {
            return Err(cx.err(
                &c.endpoints,
                "cluster.endpoints",
                format!("{e}: TLS to etcd is not supported yet; use http:// on a management network or loopback"),
            ));
        } else {
            format!("http://{e}")
        };
        let hostport = &url["http://".len()..];
        let ok = hostport
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok {
            return Err(cx.err(
                &c.endpoints,
                "cluster.endpoints",
                format!("{e}: an etcd member is HOST:PORT (http:// optional)"),
            ));
        }
        endpoints.push(url);
    }
    let prefix = match &c.prefix {
        None => ClusterConfig::DEFAULT_PREFIX.to_owned(),
        Some(p) => {
            let v = p.get_ref();
            if !v.starts_with('/') || v.len() > 128 || v.chars().any(char::is_whitespace) {
                return Err(cx.err(
                    p,
                    "cluster.prefix",
                    "a key prefix starting with '/', at most 128 characters, no spaces",
                ));
            }
            v.trim_end_matches('/').to_owned()
        }
    };
    let ttl = cx.int(
        &c.lease_ttl,
        "cluster.lease_ttl",
        ClusterConfig::DEFAULT_LEASE_TTL_S,
        2..=300,
    )?;
    // Default: 1 s, less where the members tried in turn would not fit
    // between two keep-alives.
    let default_op = (ttl * 1000 / 3 - 1) / (endpoints.len() as i64);
    let op = cx.int(
        &c.op_timeout_ms,
        "cluster.op_timeout_ms",
        default_op.clamp(100, 1000),
        100..=60_000,
    )?;
    let wait = cx.int(&c.health_wait, "cluster.health_wait", 60, 1..=3600)?;
    // A request may be tried on every member in turn before it fails:
    // that must still fit between two keep-alives.
    if op * (endpoints.len() as i64) >= ttl * 1000 / 3 {
        let s = c
            .op_timeout_ms
            .as_ref()
            .map(|s| s.span())
            .or_else(|| c.lease_ttl.as_ref().map(|s| s.span()))
            .unwrap_or(c.endpoints.span());
        let mut e = ConfigError::at_span(
            cx.file,
            cx.source,
            s,
            None,
            "cluster.op_timeout_ms times the number of endpoints must be under a third of lease_ttl (a request may try every member in turn; keep-alives go every third of the lease)",
        );
        e.field = "cluster.op_timeout_ms".into();
        return Err(e);
    }
    let fencing = match &c.fencing {
        None => Fencing::Reservations,
        Some(f) => match f.get_ref().as_str() {
            "reservations" => Fencing::Reservations,
            "none" => Fencing::None,
            _ => return Err(cx.err(f, "cluster.fencing", "one of \"reservations\", \"none\"")),
        },
    };
    Ok(ClusterConfig {
        fencing,
        endpoints,
        prefix,
        lease_ttl: Duration::from_secs(ttl as u64),
        op_timeout: Duration::from_millis(op as u64),
        health_wait: Duration::from_secs(wait as u64),
    })
}

/// The as-written form of a volume file.
fn read_raw(path: &Path, source: &str) -> Result<Raw, ConfigError> {
    toml::from_str(source).map_err(|e| ConfigError::from_toml(path, source, &e))
}

/// `[host] nqn` and `id`: `None` when the table gives only secrets (the
/// persisted identity is used then).
fn parse_host_identity(cx: &Ctx, h: &RawHost) -> Result<Option<HostIdentity>, ConfigError> {
    let Some(nqn) = &h.nqn else {
        if let Some(id) = &h.id {
            return Err(cx.err(id, "host.id", "give `nqn` with `id`"));
        }
        return Ok(None);
    };
    if !nqn.get_ref().starts_with("nqn.") {
        return Err(cx.err(nqn, "host.nqn", "an NQN starts with `nqn.`"));
    }
    let id = match &h.id {
        Some(s) => parse_uuid(s.get_ref())
            .ok_or_else(|| cx.err(s, "host.id", "a host ID is a UUID (32 hex digits)"))?,
        None => nqn
            .get_ref()
            .rsplit(':')
            .next()
            .and_then(parse_uuid)
            .ok_or_else(|| {
                cx.err(
                    nqn,
                    "host.id",
                    "give `id` (a UUID) unless the NQN ends in one",
                )
            })?,
    };
    Ok(Some(HostIdentity {
        nqn: nqn.get_ref().clone(),
        id,
    }))
}

/// `[host]`'s DH-HMAC-CHAP keys: each given inline or as a file (one of
/// the two); a file is refused when every user may read it; a controller
/// key needs a host key and must differ from it. Errors never quote a
/// key.
fn parse_dhchap(cx: &Ctx, h: &RawHost) -> Result<Option<DhchapKeys>, ConfigError> {
    let secret = |inline: &Option<Spanned<String>>,
                  file: &Option<Spanned<String>>,
                  field: &str|
     -> Result<Option<DhchapSecret>, ConfigError> {
        match (inline, file) {
            (Some(_), Some(f)) => Err(cx.err(
                f,
                &format!("host.{field}_file"),
                format!("give {field} or {field}_file, not both"),
            )),
            (Some(v), None) => DhchapSecret::parse(v.get_ref())
                .map(Some)
                .map_err(|e| cx.err(v, &format!("host.{field}"), e.to_string())),
            (None, Some(f)) => {
                let field = format!("host.{field}_file");
                // Relative to the volume file, so a volume directory can
                // carry its keys.
                let path = cx.file.parent().unwrap_or(Path::new(".")).join(f.get_ref());
                config_diag::refuse_world_readable(&path, "holds a DH-HMAC-CHAP secret")
                    .map_err(|e| cx.err(f, &field, e.to_string()))?;
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    cx.err(f, &field, format!("cannot read {}: {e}", path.display()))
                })?;
                DhchapSecret::parse(&text)
                    .map(Some)
                    .map_err(|e| cx.err(f, &field, format!("{}: {e}", path.display())))
            }
            (None, None) => Ok(None),
        }
    };
    let host = secret(&h.dhchap_secret, &h.dhchap_secret_file, "dhchap_secret")?;
    let ctrl = secret(
        &h.dhchap_ctrl_secret,
        &h.dhchap_ctrl_secret_file,
        "dhchap_ctrl_secret",
    )?;
    let ctrl_span = h
        .dhchap_ctrl_secret
        .as_ref()
        .or(h.dhchap_ctrl_secret_file.as_ref());
    match (host, ctrl) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(cx.err(
            ctrl_span.expect("a controller secret was given"),
            "host.dhchap_ctrl_secret",
            "needs dhchap_secret too (the host authenticates first)",
        )),
        (Some(secret), ctrl) => {
            if ctrl.as_ref() == Some(&secret) {
                return Err(cx.err(
                    ctrl_span.expect("a controller secret was given"),
                    "host.dhchap_ctrl_secret",
                    "is the same key as dhchap_secret; use a key of its own",
                ));
            }
            Ok(Some(DhchapKeys {
                secret,
                ctrl_secret: ctrl,
            }))
        }
    }
}

/// `[target]` or the `[[replica]]` tables, checked: exactly one of the two
/// forms, at most [`MAX_REPLICAS`], no namespace twice.
fn parse_targets(cx: &Ctx<'_>, raw: &Raw) -> Result<Vec<TargetSpec>, ConfigError> {
    let list = raw.replica.as_deref().unwrap_or(&[]);
    match (&raw.target, list.first()) {
        (Some(_), Some(first)) => {
            let mut e = cx.err(
                &first.address,
                "replica",
                "give either [target] (one target) or [[replica]] tables (a replicated \
                 volume), not both; to replicate the target, list it as the first [[replica]]",
            );
            e.field = "replica".into();
            Err(e)
        }
        (Some(t), None) => Ok(vec![check_target(cx, t, "target")?]),
        (None, None) => Err(ConfigError::whole_file(
            cx.file,
            "no target: give [target] (one target namespace) or one or more [[replica]] \
             tables (a replicated volume)",
        )),
        (None, Some(_)) => {
            if let Some(extra) = list.get(MAX_REPLICAS) {
                let mut e = cx.err(
                    &extra.address,
                    "replica",
                    format!("at most {MAX_REPLICAS} replicas"),
                );
                e.field = "replica".into();
                return Err(e);
            }
            let mut out: Vec<TargetSpec> = Vec::with_capacity(list.len());
            for (i, t) in list.iter().enumerate() {
                let spec = check_target(cx, t, &format!("replica[{i}]"))?;
                if let Some(j) = out.iter().position(|o| same_namespace(o, &spec)) {
                    let mut e = cx.err(
                        &t.subnqn,
                        "subnqn",
                        format!(
                            "replica {i} is the same namespace as replica {j} ({}:{} {} nsid {}): \
                             a mirror needs distinct namespaces",
                            spec.address, spec.port, spec.subnqn, spec.nsid
                        ),
                    );
                    e.field = format!("replica[{i}]");
                    return Err(e);
                }
                out.push(spec);
            }
            Ok(out)
        }
    }
}

fn same_namespace(a: &TargetSpec, b: &TargetSpec) -> bool {
    a.address.eq_ignore_ascii_case(&b.address)
        && a.port == b.port
        && a.subnqn == b.subnqn
        && a.nsid == b.nsid
}

/// One `[target]` or `[[replica]]` table; errors name `prefix.key`.
fn check_target(cx: &Ctx<'_>, t: &RawTarget, prefix: &str) -> Result<TargetSpec, ConfigError> {
    // The index of a replica is not in the source text, from which
    // `ConfigError::at_span` derives field names: set the name here.
    let err = |e: ConfigError, key: &str| {
        let mut e = e;
        e.field = format!("{prefix}.{key}");
        e
    };
    if t.address.get_ref().trim().is_empty() {
        return Err(err(
            cx.err(&t.address, "address", "must not be empty"),
            "address",
        ));
    }
    let port = *t.port.get_ref();
    if port == 0 || port > 65535 {
        return Err(err(
            cx.err(&t.port, "port", "a TCP port is 1..=65535"),
            "port",
        ));
    }
    let nqn = t.subnqn.get_ref();
    if !nqn.starts_with("nqn.") || nqn.len() > 223 {
        let msg = "an NQN starts with `nqn.` and has at most 223 bytes";
        return Err(err(cx.err(&t.subnqn, "subnqn", msg), "subnqn"));
    }
    let nsid = *t.nsid.get_ref();
    if nsid == 0 || nsid == u32::MAX {
        let msg = "a namespace ID is 1..=FFFFFFFEh";
        return Err(err(cx.err(&t.nsid, "nsid", msg), "nsid"));
    }
    Ok(TargetSpec {
        address: t.address.get_ref().clone(),
        port: port as u16,
        subnqn: nqn.clone(),
        nsid,
    })
}

/// `[replication]`, checked; defaults when absent. Refused with `[target]`
/// (one target has nothing to replicate: a key there would silently do
/// nothing).
fn parse_replication(cx: &Ctx<'_>, raw: &Raw) -> Result<ReplicationConfig, ConfigError> {
    let mut c = ReplicationConfig::default();
    let Some(r) = &raw.replication else {
        return Ok(c);
    };
    let amount = |v: &Spanned<Amount>, field: &str, what: &str| -> Result<u64, ConfigError> {
        let n = match v.get_ref() {
            Amount::Number(n) => u64::try_from(*n).ok(),
            Amount::Text(t) => parse_amount(t),
        };
        n.ok_or_else(|| {
            cx.err(
                v,
                field,
                format!("{what}: a number of bytes, k/m/g suffixes"),
            )
        })
    };
    if raw.target.is_some() {
        let first = [
            r.read_policy.as_ref().map(|s| s.span()),
            r.resync_rate.as_ref().map(|s| s.span()),
            r.region_size.as_ref().map(|s| s.span()),
            r.bitmap_dir.as_ref().map(|s| s.span()),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|s| s.start);
        let msg = "[replication] applies to [[replica]] tables; a volume with \
                   [target] has one copy (remove the section, or list the target as \
                   the first [[replica]])";
        return Err(match first {
            Some(span) => {
                let mut e = ConfigError::at_span(cx.file, cx.source, span, None, msg);
                e.field = "replication".into();
                e
            }
            None => {
                let mut e = ConfigError::whole_file(cx.file, msg);
                e.field = "replication".into();
                e
            }
        });
    }
    if let Some(p) = &r.read_policy {
        c.read_policy = match p.get_ref().as_str() {
            "least-loaded" => ReplicaPolicy::LeastLoaded,
            "round-robin" => ReplicaPolicy::RoundRobin,
            "primary" => ReplicaPolicy::Primary,
            _ => {
                return Err(cx.err(
                    p,
                    "replication.read_policy",
                    "one of \"least-loaded\", \"round-robin\", \"primary\"",
                ))
            }
        };
    }
    if let Some(v) = &r.resync_rate {
        c.resync_rate_bps = amount(
            v,
            "replication.resync_rate",
            "bytes per second (0: unlimited)",
        )?;
    }
    if let Some(v) = &r.region_size {
        let n = amount(v, "replication.region_size", "bytes")?;
        if !n.is_power_of_two()
            || !(ReplicationConfig::MIN_REGION_SIZE..=ReplicationConfig::MAX_REGION_SIZE)
                .contains(&n)
        {
            return Err(cx.err(
                v,
                "replication.region_size",
                format!(
                    "{n} bytes: a region is a power of two from 64k to 64m \
                     (default 1m)"
                ),
            ));
        }
        c.region_size = n;
    }
    if let Some(d) = &r.bitmap_dir {
        let p = Path::new(d.get_ref());
        if !p.is_absolute() {
            return Err(cx.err(
                d,
                "replication.bitmap_dir",
                "an absolute path (the server's working directory is not fixed); \
                 keep it off the volume itself",
            ));
        }
        c.bitmap_dir = p.to_path_buf();
    }
    Ok(c)
}

fn parse_qos(cx: &Ctx<'_>, q: &RawQos) -> Result<QosConfig, ConfigError> {
    let mut c = QosConfig::new();
    if let Some(m) = &q.credits {
        c.credits = parse_mode(m.get_ref()).ok_or_else(|| {
            cx.err(
                m,
                "qos.credits",
                "one of \"auto\", \"target\", \"estimate\", \"off\"",
            )
        })?;
    }
    let w = |v: &Option<Spanned<i64>>, f: &str, d: u32| {
        cx.int(v, f, i64::from(d), 1..=65535).map(|x| x as u32)
    };
    c.initial_window = w(&q.initial_window, "qos.initial_window", c.initial_window)?;
    c.max_window = w(&q.max_window, "qos.max_window", c.max_window)?;
    const MAX: i64 = 1 << 50;
    let n = |v: &Option<Spanned<i64>>, f: &str| cx.int(v, f, 0, 0..=MAX).map(|x| x as u64);
    let l = &mut c.limits;
    l.read_iops = n(&q.riops, "qos.riops")?;
    l.write_iops = n(&q.wiops, "qos.wiops")?;
    l.read_bps = n(&q.rbps, "qos.rbps")?;
    l.write_bps = n(&q.wbps, "qos.wbps")?;
    l.read_iops_burst = n(&q.riops_burst, "qos.riops_burst")?;
    l.write_iops_burst = n(&q.wiops_burst, "qos.wiops_burst")?;
    l.read_bps_burst = n(&q.rbps_burst, "qos.rbps_burst")?;
    l.write_bps_burst = n(&q.wbps_burst, "qos.wbps_burst")?;
    for (old, name) in [
        (&q.estimate_latency_min_us, "qos.estimate_latency_min_us"),
        (&q.estimate_latency_max_us, "qos.estimate_latency_max_us"),
    ] {
        if let Some(s) = old {
            return Err(cx.err(
                s,
                name,
                "no longer used: the estimate has no latency thresholds since it \
                 measures bandwidth × base latency; remove it (qos.estimate_gain \
                 sets how much queueing the estimate allows)",
            ));
        }
    }
    if let Some(g) = &q.estimate_gain {
        let v = g.get_ref().get();
        if !(1.0..=64.0).contains(&v) {
            return Err(cx.err(
                g,
                "qos.estimate_gain",
                format!("{v} is out of range (1..=64)"),
            ));
        }
        c.estimate_gain = v;
        // A gain above the default ceiling raises the ceiling with it.
        c.estimate_gain_max = c.estimate_gain_max.max(v);
    }
    if let Some(g) = &q.estimate_gain_max {
        let v = g.get_ref().get();
        if !(c.estimate_gain..=64.0).contains(&v) {
            return Err(cx.err(
                g,
                "qos.estimate_gain_max",
                format!(
                    "{v} is out of range ({}..=64, at least estimate_gain)",
                    c.estimate_gain
                ),
            ));
        }
        c.estimate_gain_max = v;
    }
    c.estimate_base_window_ms = cx.int(
        &q.estimate_base_window_ms,
        "qos.estimate_base_window_ms",
        c.estimate_base_window_ms as i64,
        1..=3_600_000,
    )? as u64;
    if let Some(b) = &q.estimate_neighbours {
        c.estimate_neighbours = *b.get_ref();
    }
    if let Err(e) = c.validate() {
        return Err(ConfigError::whole_file(cx.file, e));
    }
    Ok(c)
}

fn parse_priority(cx: &Ctx<'_>, p: &RawPriority) -> Result<PriorityConfig, ConfigError> {
    let mut c = PriorityConfig::default();
    if let Some(s) = &p.source {
        c.source = match s.get_ref().as_str() {
            "ionice" => Source::Ionice,
            "fixed" => Source::Fixed,
            _ => return Err(cx.err(s, "priority.source", "one of \"ionice\", \"fixed\"")),
        };
    }
    let class = |v: &Option<Spanned<String>>, f: &str, d| match v {
        None => Ok(d),
        Some(s) => parse_class(s.get_ref())
            .ok_or_else(|| cx.err(s, f, "one of \"urgent\", \"high\", \"medium\", \"low\"")),
    };
    c.class = class(&p.class, "priority.class", c.class)?;
    let m = &mut c.map;
    m.realtime = class(&p.realtime, "priority.realtime", m.realtime)?;
    m.best_effort = class(&p.best_effort, "priority.best_effort", m.best_effort)?;
    m.none = class(&p.none, "priority.none", m.none)?;
    m.idle = class(&p.idle, "priority.idle", m.idle)?;
    m.urgent_realtime_levels = cx.int(
        &p.urgent_realtime_levels,
        "priority.urgent_realtime_levels",
        0,
        0..=8,
    )? as u8;
    if let Some(s) = &p.arbitration {
        c.mechanism = match s.get_ref().as_str() {
            "auto" => Mechanism::Auto,
            "wrr" => Mechanism::Wrr,
            "drr" => Mechanism::Drr,
            _ => {
                return Err(cx.err(
                    s,
                    "priority.arbitration",
                    "one of \"auto\", \"wrr\", \"drr\"",
                ))
            }
        };
    }
    // NVMe weights are 8-bit, 0's based: 1..=256.
    let w = |v: &Option<Spanned<i64>>, f: &str, d: u32| {
        cx.int(v, f, i64::from(d), 1..=256).map(|x| x as u32)
    };
    c.high_weight = w(&p.high_weight, "priority.high_weight", c.high_weight)?;
    c.medium_weight = w(&p.medium_weight, "priority.medium_weight", c.medium_weight)?;
    c.low_weight = w(&p.low_weight, "priority.low_weight", c.low_weight)?;
    c.burst = cx.int(&p.burst, "priority.burst", i64::from(c.burst), 0..=64)? as u32;
    c.aging_ms = cx.int(
        &p.aging_ms,
        "priority.aging_ms",
        c.aging_ms as i64,
        0..=60_000,
    )? as u64;
    Ok(c)
}

/// The host identity for a volume without `[host]`: the one persisted in
/// `dir/hostnqn` + `dir/hostid` (written on first use), so a host keeps its
/// NQN (its tenant identity and allow-list entry at the target) across
/// restarts.
pub fn persistent_host_identity(dir: &Path) -> std::io::Result<HostIdentity> {
    let nqn_path = dir.join("hostnqn");
    let id_path = dir.join("hostid");
    if let (Ok(nqn), Ok(id)) = (
        std::fs::read_to_string(&nqn_path),
        std::fs::read_to_string(&id_path),
    ) {
        if let Some(id) = parse_uuid(&id) {
            return Ok(HostIdentity {
                nqn: nqn.trim().to_owned(),
                id,
            });
        }
    }
    let h = HostIdentity::random();
    std::fs::create_dir_all(dir)?;
    std::fs::write(&nqn_path, format!("{}\n", h.nqn))?;
    std::fs::write(&id_path, format!("{}\n", format_uuid(&h.id)))?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "vol0"
[target]
address = "127.0.0.1"
subnqn = "nqn.2026-01.io.gimbal:demo"
[io]
queues = 2
"#;

    fn parse(s: &str) -> Result<VolumeConfig, ConfigError> {
        VolumeConfig::parse(Path::new("/etc/ublk-nvmf/vol0.toml"), s)
    }

    #[test]
    fn defaults_fill_in() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.name, "vol0");
        assert_eq!(c.target.port, 4420);
        assert_eq!(c.target.nsid, 1);
        assert_eq!(c.queues, 2);
        assert_eq!(c.queue_depth, 64);
        assert_eq!(c.reconnect.ctrl_loss_tmo, Some(Duration::from_secs(600)));
        assert_eq!(c.reconnect.fast_io_fail_tmo, None);
        assert!(c.host.is_none());
    }

    const EVOL: &str = r#"
name = "ev0"
[evol]
name = "pool-ev0"
alloc_wait = 5
[cluster]
endpoints = ["127.0.0.1:2379"]
"#;

    #[test]
    fn an_evol_needs_cluster_and_no_targets_and_fences_by_ownership_only() {
        let c = parse(EVOL).unwrap();
        let e = c.evol.as_ref().unwrap();
        assert_eq!(
            (e.name.as_str(), e.alloc_wait),
            ("pool-ev0", Duration::from_secs(5))
        );
        assert!(c.replicas.is_empty());
        assert_eq!(c.cluster.as_ref().unwrap().fencing, Fencing::None);
        let d = parse(&EVOL.replace("name = \"pool-ev0\"\n", "")).unwrap();
        assert_eq!(d.evol.unwrap().name, "ev0");
        let e = parse(&EVOL.replace("alloc_wait = 5", "alloc_wait = 0")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (5, "evol.alloc_wait"), "{e}");
        assert_eq!(
            c.evol.as_ref().unwrap().flint,
            crate::evol_qos::FlintSettings::default()
        );
        // An eVol's credit gate is off unless the config says otherwise.
        assert_eq!(c.qos.credits, qos_core::credit_gate::CreditMode::Off);
        let q = parse(&format!("{EVOL}[qos]\ncredits = \"estimate\"\n")).unwrap();
        assert_eq!(q.qos.credits, qos_core::credit_gate::CreditMode::Estimate);
        let f = parse(&EVOL.replace(
            "alloc_wait = 5",
            "alloc_wait = 5\nauction = false\neio = false\nreport_interval_ms = 500",
        ))
        .unwrap()
        .evol
        .unwrap()
        .flint;
        assert_eq!(
            (f.auction, f.eio, f.report_interval),
            (false, false, Some(Duration::from_millis(500)))
        );
        let e = parse(&EVOL.replace("alloc_wait = 5", "alloc_wait = 5\nreport_interval_ms = 1"))
            .unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (6, "evol.report_interval_ms"),
            "{e}"
        );
        let e =
            parse(&EVOL.replace("[cluster]\nendpoints = [\"127.0.0.1:2379\"]\n", "")).unwrap_err();
        assert_eq!(e.field, "cluster", "{e}");
        assert!(e.to_string().contains("needs [cluster]"), "{e}");
        let e = parse(&format!(
            "{EVOL}[target]\naddress = \"127.0.0.1\"\nsubnqn = \"nqn.x:y\"\n"
        ))
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (9, "target"), "{e}");
        let e = parse(&format!("{EVOL}fencing = \"reservations\"\n")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (8, "cluster.fencing"), "{e}");
        let e = parse(&EVOL.replace("pool-ev0", "bad/name")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (4, "evol.name"), "{e}");
        assert!(e.to_string().contains("vol0.toml"), "names the file: {e}");
    }

    #[test]
    fn zero_copy_is_auto_unless_turned_off() {
        assert_eq!(parse(GOOD).unwrap().zero_copy, ZeroCopy::Auto);
        let c = parse(&GOOD.replace("queues = 2", "queues = 2\nzero_copy = \"off\"")).unwrap();
        assert_eq!(c.zero_copy, ZeroCopy::Off);
        let e = parse(&GOOD.replace("queues = 2", "queues = 2\nzero_copy = \"yes\"")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (8, "io.zero_copy"), "{e}");
        assert!(e.to_string().contains("\"auto\", \"off\""), "{e}");
    }

    #[test]
    fn the_shipped_example_parses() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/volume.toml");
        let c = VolumeConfig::load(&p).unwrap();
        assert_eq!(c.name, "vol0");
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse(&GOOD.replace("queues = 2", "queues = 0")).unwrap_err();
        assert_eq!(e.line, 7);
        assert_eq!(e.field, "io.queues");
        let s = e.to_string();
        assert!(s.starts_with("/etc/ublk-nvmf/vol0.toml:7:"), "{s}");

        let e = parse(&GOOD.replace("subnqn = \"nqn.", "subnqn = \"x.")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (5, "target.subnqn"));

        let e = parse(&GOOD.replace("queues = 2", "queus = 2")).unwrap_err();
        assert_eq!(e.line, 7);
        assert!(e.field.contains("queus"), "{e}");

        let e = parse(&GOOD.replace("address = \"127.0.0.1\"\n", "")).unwrap_err();
        assert!(e.field.contains("address"), "{e}");

        let e = parse(&GOOD.replace("vol0", "a/b")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "name"));

        let e = parse(&format!(
            "{GOOD}[reconnect]\nreconnect_delay = 10\nctrl_loss_tmo = 5\n"
        ))
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (10, "reconnect.ctrl_loss_tmo"));

        let e = parse(&format!("{GOOD}[host]\nnqn = \"nqn.x\"\nid = \"zz\"\n")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (10, "host.id"));

        let e = parse(&format!("{GOOD}[metrics]\nlisten = \"localhost\"\n")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (9, "metrics.listen"));
        assert!(e.to_string().contains("not an IP:port"), "{e}");
    }

    #[test]
    fn metrics_are_off_unless_a_listen_address_is_given() {
        assert_eq!(parse(GOOD).unwrap().metrics_listen, None);
        let c = parse(&format!("{GOOD}[metrics]\nlisten = \"[::1]:9751\"\n")).unwrap();
        assert_eq!(c.metrics_listen, Some("[::1]:9751".parse().unwrap()));
    }

    #[test]
    fn qos_section_parses_and_names_bad_fields() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.qos, QosConfig::new());
        let c = parse(&format!(
            "{GOOD}[qos]\ncredits = \"estimate\"\nriops = 2000\nriops_burst = 20\nwbps = 1048576\n"
        ))
        .unwrap();
        assert_eq!(c.qos.credits, qos_core::credit_gate::CreditMode::Estimate);
        assert_eq!(c.qos.limits.read_iops, 2000);
        assert_eq!(c.qos.limits.read_iops_burst, 20);
        assert_eq!(c.qos.limits.write_bps, 1 << 20);
        let e = parse(&format!("{GOOD}[qos]\ncredits = \"many\"\n")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (9, "qos.credits"));
        let e = parse(&format!("{GOOD}[qos]\nriops = -1\n")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (9, "qos.riops"));
        let e = parse(&format!("{GOOD}[qos]\nread_iops = 1\n")).unwrap_err();
        assert!(e.field.contains("read_iops"), "{e}");
    }

    #[test]
    fn estimate_gain_parses_and_removed_thresholds_say_so() {
        assert_eq!(parse(GOOD).unwrap().qos.estimate_gain, 2.0);
        for (text, gain) in [("3", 3.0), ("2.5", 2.5), ("1", 1.0)] {
            let c = parse(&format!("{GOOD}[qos]\nestimate_gain = {text}\n")).unwrap();
            assert_eq!(c.qos.estimate_gain, gain);
        }
        let c = parse(&format!(
            "{GOOD}[qos]\nestimate_gain = 2\nestimate_gain_max = 2\n"
        ))
        .unwrap();
        assert_eq!((c.qos.estimate_gain, c.qos.estimate_gain_max), (2.0, 2.0));
        let e = parse(&format!(
            "{GOOD}[qos]\nestimate_gain = 4\nestimate_gain_max = 3\n"
        ))
        .unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (10, "qos.estimate_gain_max"),
            "{e}"
        );
        for bad in ["0.5", "65", "nan", "\"two\""] {
            let e = parse(&format!("{GOOD}[qos]\nestimate_gain = {bad}\n")).unwrap_err();
            assert_eq!(
                (e.line, e.field.as_str()),
                (9, "qos.estimate_gain"),
                "{bad}: {e}"
            );
        }
        for old in ["estimate_latency_min_us", "estimate_latency_max_us"] {
            let e = parse(&format!("{GOOD}[qos]\ncredits = \"auto\"\n{old} = 250\n")).unwrap_err();
            assert_eq!(e.line, 10, "{e}");
            assert!(e.field.contains(old), "{e}");
            assert!(e.to_string().contains("no longer used"), "{e}");
        }
    }

    #[test]
    fn estimate_neighbours_defaults_on_and_names_a_bad_value() {
        assert!(parse(GOOD).unwrap().qos.estimate_neighbours);
        let c = parse(&format!("{GOOD}[qos]\nestimate_neighbours = false\n")).unwrap();
        assert!(!c.qos.estimate_neighbours);
        let e = parse(&format!("{GOOD}[qos]\nestimate_neighbours = \"no\"\n")).unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (9, "qos.estimate_neighbours"),
            "{e}"
        );
    }

    #[test]
    fn priority_section_parses_and_names_bad_fields() {
        use qos_core::priority::NvmeClass;
        let c = parse(GOOD).unwrap();
        assert_eq!(c.priority, PriorityConfig::default());
        let c = parse(&format!(
            "{GOOD}[priority]\nsource = \"fixed\"\nclass = \"low\"\narbitration = \"drr\"\nhigh_weight = 4\nlow_weight = 1\nidle = \"medium\"\n"
        ))
        .unwrap();
        let p = c.priority;
        assert_eq!(p.source, Source::Fixed);
        assert_eq!(p.class, NvmeClass::Low);
        assert_eq!(p.mechanism, Mechanism::Drr);
        assert_eq!((p.high_weight, p.low_weight), (4, 1));
        assert_eq!(p.map.idle, NvmeClass::Medium);
        for (bad, field) in [
            ("source = \"bpf\"", "priority.source"),
            ("class = \"rt\"", "priority.class"),
            ("realtime = \"top\"", "priority.realtime"),
            ("arbitration = \"fair\"", "priority.arbitration"),
            ("high_weight = 0", "priority.high_weight"),
            ("low_weight = 257", "priority.low_weight"),
            (
                "urgent_realtime_levels = 9",
                "priority.urgent_realtime_levels",
            ),
        ] {
            let e = parse(&format!("{GOOD}[priority]\n{bad}\n")).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (9, field), "{bad}: {e}");
        }
    }

    const MIRROR: &str = r#"
name = "mirror0"
[[replica]]
address = "10.0.0.1"
subnqn = "nqn.2026-01.io.gimbal:a"
[[replica]]
address = "10.0.0.2"
port = 4421
subnqn = "nqn.2026-01.io.gimbal:b"
nsid = 2
"#;

    #[test]
    fn cluster_section_parses_and_names_bad_fields() {
        assert_eq!(parse(GOOD).unwrap().cluster, None, "no etcd by default");
        let c = parse(&format!(
            "{GOOD}[cluster]\nendpoints = [\"10.0.0.1:2379\", \"http://10.0.0.2:2379\"]\nprefix = \"/p/\"\n"
        ))
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(
            c.endpoints,
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(c.prefix, "/p");
        assert_eq!(c.lease_ttl, Duration::from_secs(10));
        assert_eq!(c.op_timeout, Duration::from_millis(1000));
        assert_eq!(c.health_wait, Duration::from_secs(60));
        assert_eq!(c.fencing, Fencing::Reservations);
        let bad = |body: &str| parse(&format!("{GOOD}[cluster]\n{body}")).unwrap_err();
        for (body, field, says) in [
            ("endpoints = []\n", "cluster.endpoints", "at least one"),
            ("endpoints = [\"etcd\"]\n", "cluster.endpoints", "HOST:PORT"),
            (
                "endpoints = [\"https://e:2379\"]\n",
                "cluster.endpoints",
                "TLS",
            ),
            (
                "endpoints = [\"e:1\"]\nprefix = \"x\"\n",
                "cluster.prefix",
                "'/'",
            ),
            (
                "endpoints = [\"e:1\"]\nlease_ttl = 1\n",
                "cluster.lease_ttl",
                "",
            ),
            (
                "endpoints = [\"e:1\"]\nlease_ttl = 3\nop_timeout_ms = 1500\n",
                "cluster.op_timeout_ms",
                "third",
            ),
            ("endpoints = [\"e:1\"]\nleas_ttl = 3\n", "leas_ttl", ""),
            (
                "endpoints = [\"e:1\"]\nfencing = \"yes\"\n",
                "cluster.fencing",
                "none",
            ),
        ] {
            let e = bad(body);
            assert!(e.field.contains(field), "{body}: {e}");
            assert!(e.to_string().contains(says), "{body}: {e}");
            assert!(e.line >= 9, "{body}: {e}");
        }
    }

    #[test]
    fn a_single_target_is_the_only_replica() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.replicas, vec![c.target.clone()]);
        assert!(!c.is_replicated());
        assert_eq!(c.replication, ReplicationConfig::default());
        assert_eq!(c.replication.read_policy, ReplicaPolicy::LeastLoaded);
        assert_eq!(c.replication.resync_rate_bps, 64 << 20);
        assert_eq!(c.replication.region_size, 1 << 20);
        assert_eq!(
            c.replication.bitmap_path("vol0"),
            Path::new("/var/lib/ublk-nvmf/vol0.bitmap")
        );
    }

    #[test]
    fn replicas_parse_in_order_and_the_first_is_the_target() {
        let c = parse(MIRROR).unwrap();
        assert_eq!(c.replicas.len(), 2);
        assert!(c.is_replicated());
        assert_eq!(c.target, c.replicas[0]);
        assert_eq!(c.replicas[0].address, "10.0.0.1");
        assert_eq!((c.replicas[0].port, c.replicas[0].nsid), (4420, 1));
        assert_eq!(c.replicas[1].subnqn, "nqn.2026-01.io.gimbal:b");
        assert_eq!((c.replicas[1].port, c.replicas[1].nsid), (4421, 2));
        assert_eq!(c.replication, ReplicationConfig::default());
    }

    #[test]
    fn replication_section_parses() {
        let c = parse(&format!(
            "{MIRROR}[replication]\nread_policy = \"round-robin\"\nresync_rate = \"10m\"\n\
             region_size = 65536\nbitmap_dir = \"/srv/bitmaps\"\n"
        ))
        .unwrap();
        let r = &c.replication;
        assert_eq!(r.read_policy, ReplicaPolicy::RoundRobin);
        assert_eq!(r.resync_rate_bps, 10 << 20);
        assert_eq!(r.region_size, 64 << 10);
        assert_eq!(
            r.bitmap_path("mirror0"),
            Path::new("/srv/bitmaps/mirror0.bitmap")
        );
        for (text, policy) in [
            ("least-loaded", ReplicaPolicy::LeastLoaded),
            ("primary", ReplicaPolicy::Primary),
        ] {
            let c = parse(&format!(
                "{MIRROR}[replication]\nread_policy = \"{text}\"\n"
            ))
            .unwrap();
            assert_eq!(c.replication.read_policy, policy);
            assert_eq!(read_policy_name(policy), text);
        }
        for (text, bps) in [
            ("0", 0),
            ("\"max\"", 0),
            ("1048576", 1 << 20),
            ("\"2g\"", 2 << 30),
        ] {
            let c = parse(&format!("{MIRROR}[replication]\nresync_rate = {text}\n")).unwrap();
            assert_eq!(c.replication.resync_rate_bps, bps, "{text}");
        }
        let c = parse(&format!("{MIRROR}[replication]\nregion_size = \"64m\"\n")).unwrap();
        assert_eq!(c.replication.region_size, 64 << 20);
    }

    #[test]
    fn target_and_replicas_are_exclusive_and_one_is_required() {
        let both = format!("{GOOD}{}", MIRROR.replace("name = \"mirror0\"\n", ""));
        let e = parse(&both).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (10, "replica"), "{e}");
        assert!(e.message.contains("not both"), "{e}");

        let e = parse("name = \"vol0\"\n[io]\nqueues = 1\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (0, ""), "{e}");
        assert!(e.message.contains("[[replica]]"), "{e}");
        assert!(
            e.to_string().starts_with("/etc/ublk-nvmf/vol0.toml: "),
            "{e}"
        );
    }

    #[test]
    fn replica_errors_name_the_replica_line_and_field() {
        for (from, to, line, field) in [
            ("port = 4421", "port = 0", 8, "replica[1].port"),
            ("nsid = 2", "nsid = 0", 10, "replica[1].nsid"),
            ("\"10.0.0.2\"", "\" \"", 7, "replica[1].address"),
            (
                "\"nqn.2026-01.io.gimbal:a\"",
                "\"x\"",
                5,
                "replica[0].subnqn",
            ),
        ] {
            let e = parse(&MIRROR.replace(from, to)).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{to}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("/etc/ublk-nvmf/vol0.toml:{line}:")),
                "{e}"
            );
        }
        // Missing and unknown keys come from the TOML parser.
        let e = parse(&MIRROR.replace("subnqn = \"nqn.2026-01.io.gimbal:b\"\n", "")).unwrap_err();
        assert!(e.field.contains("subnqn"), "{e}");
        let e = parse(&MIRROR.replace("nsid = 2", "nsidd = 2")).unwrap_err();
        assert_eq!(e.line, 10, "{e}");
        assert!(e.field.contains("nsidd"), "{e}");
    }

    #[test]
    fn the_same_namespace_twice_is_refused() {
        let dup = MIRROR
            .replace("\"10.0.0.2\"", "\"10.0.0.1\"")
            .replace("port = 4421\n", "")
            .replace("gimbal:b", "gimbal:a")
            .replace("nsid = 2", "nsid = 1");
        let e = parse(&dup).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (8, "replica[1]"), "{e}");
        assert!(e.message.contains("same namespace as replica 0"), "{e}");
        // Same subsystem, another namespace: fine.
        let other_ns = dup.replace("nsid = 1", "nsid = 3");
        assert_eq!(parse(&other_ns).unwrap().replicas[1].nsid, 3);
    }

    #[test]
    fn at_most_max_replicas() {
        let mut text = String::from("name = \"wide\"\n");
        for i in 0..=MAX_REPLICAS {
            text.push_str(&format!(
                "[[replica]]\naddress = \"10.0.0.{i}\"\nsubnqn = \"nqn.x:{i}\"\n"
            ));
        }
        let e = parse(&text).unwrap_err();
        assert_eq!(e.field, "replica", "{e}");
        assert_eq!(e.line, 2 + 3 * MAX_REPLICAS + 1, "{e}");
        let ok = text[..text.rfind("[[replica]]").unwrap()].to_string();
        assert_eq!(parse(&ok).unwrap().replicas.len(), MAX_REPLICAS);
    }

    #[test]
    fn replication_errors_name_file_line_and_field() {
        for (bad, field) in [
            ("read_policy = \"fastest\"", "replication.read_policy"),
            ("read_policy = \"least_loaded\"", "replication.read_policy"),
            ("resync_rate = -1", "replication.resync_rate"),
            ("resync_rate = \"fast\"", "replication.resync_rate"),
            ("region_size = 100000", "replication.region_size"),
            ("region_size = \"32k\"", "replication.region_size"),
            ("region_size = \"128m\"", "replication.region_size"),
            ("region_size = 0", "replication.region_size"),
            ("bitmap_dir = \"var/lib\"", "replication.bitmap_dir"),
        ] {
            let e = parse(&format!("{MIRROR}[replication]\n{bad}\n")).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (12, field), "{bad}: {e}");
        }
        let e = parse(&format!("{MIRROR}[replication]\nread_only = true\n")).unwrap_err();
        assert!(e.field.contains("read_only"), "{e}");
    }

    #[test]
    fn replication_with_a_single_target_is_refused() {
        let e = parse(&format!("{GOOD}[replication]\nresync_rate = \"1m\"\n")).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (9, "replication"), "{e}");
        assert!(e.message.contains("[[replica]]"), "{e}");
    }

    // Keys from nvme-cli 2.3's `nvme gen-dhchap-key` (nvmf-proto's
    // tests/proto/auth_secret.rs).
    const KEY_A: &str = "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCa:";
    const KEY_B: &str = "DHHC-1:01:5NmdC6ei6ufThKzxcNLrVwG7B51dcFJp4loC4hNpFH00R4sa:";

    #[test]
    fn dhchap_keys_inline_or_from_files() {
        use std::os::unix::fs::PermissionsExt;
        let c = parse(&format!(
            "{GOOD}[host]\ndhchap_secret = \"{KEY_A}\"\ndhchap_ctrl_secret = \"{KEY_B}\"\n"
        ))
        .unwrap();
        // Secrets alone keep the persisted identity.
        assert_eq!(c.host, None);
        let k = c.dhchap.unwrap();
        assert_eq!(k.secret, DhchapSecret::parse(KEY_A).unwrap());
        assert_eq!(k.ctrl_secret, Some(DhchapSecret::parse(KEY_B).unwrap()));
        assert!(!format!("{k:?}").contains("0GUMx"));
        // From files, relative to the volume file.
        let dir = std::env::temp_dir().join(format!("ublk-dhchap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("host.key"), format!("{KEY_A}\n")).unwrap();
        std::fs::set_permissions(dir.join("host.key"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        let vol = dir.join("vol0.toml");
        let text = format!("{GOOD}[host]\ndhchap_secret_file = \"host.key\"\n");
        std::fs::write(&vol, &text).unwrap();
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A world-readable volume file is fine when the key is elsewhere.
        let c = VolumeConfig::load(&vol).unwrap();
        assert_eq!(
            c.dhchap.unwrap().secret,
            DhchapSecret::parse(KEY_A).unwrap()
        );
        // A world-readable key file is not.
        std::fs::set_permissions(dir.join("host.key"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let e = VolumeConfig::load(&vol).unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (9, "host.dhchap_secret_file"),
            "{e}"
        );
        assert!(
            e.message.contains("readable by every user (mode 0644)"),
            "{e}"
        );
        // Nor a world-readable volume file with the key inline.
        std::fs::write(&vol, format!("{GOOD}[host]\ndhchap_secret = \"{KEY_A}\"\n")).unwrap();
        let e = VolumeConfig::load(&vol).unwrap_err();
        assert!(
            e.to_string()
                .contains("holds DH-HMAC-CHAP secrets ([host]) but is readable"),
            "{e}"
        );
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o600)).unwrap();
        VolumeConfig::load(&vol).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_dhchap_keys_name_the_field_and_never_quote_a_key() {
        let bad = "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCb:";
        let cases = [
            (
                format!("dhchap_secret = \"{bad}\""),
                "host.dhchap_secret",
                "CRC",
            ),
            (
                format!("dhchap_ctrl_secret = \"{KEY_B}\""),
                "host.dhchap_ctrl_secret",
                "needs dhchap_secret too",
            ),
            (
                format!("dhchap_secret = \"{KEY_A}\"\ndhchap_ctrl_secret = \"{KEY_A}\""),
                "host.dhchap_ctrl_secret",
                "same key",
            ),
            (
                format!("dhchap_secret = \"{KEY_A}\"\ndhchap_secret_file = \"k\""),
                "host.dhchap_secret_file",
                "not both",
            ),
            (
                "dhchap_secret_file = \"/nonexistent/k\"".to_string(),
                "host.dhchap_secret_file",
                "cannot inspect",
            ),
            (
                "id = \"00000000000000000000000000000001\"".to_string(),
                "host.id",
                "give `nqn` with `id`",
            ),
        ];
        for (host, field, needle) in cases {
            let e = parse(&format!("{GOOD}[host]\n{host}\n")).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(needle), "{e}");
            assert!(!e.to_string().contains("0GUMx"), "{e}");
        }
    }

    #[test]
    fn host_identity_is_persisted_once() {
        let dir = std::env::temp_dir().join(format!("ublk-nvmf-host-{}", std::process::id()));
        let a = persistent_host_identity(&dir).unwrap();
        let b = persistent_host_identity(&dir).unwrap();
        assert_eq!(a, b);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(parse_uuid(&format_uuid(&a.id)), Some(a.id));
    }
}
