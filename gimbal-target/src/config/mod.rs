//! The target's TOML configuration (`gimbal-target run --config FILE`).
//!
//! ```toml
//! listen = ["127.0.0.1:4420"]
//!
//! [[subsystem]]
//! nqn = "nqn.2026-01.io.gimbal:demo"
//! allow_any_host = true
//!
//! [[subsystem.namespace]]
//! backend = "ram"
//! size = "256MiB"
//! ```
//!
//! Every error names the file, line and field (see [`ConfigError`]).
//! A size is bytes as an integer, or a string in
//! [`config_diag::parse_size`]'s grammar (`"4k"`, `"512KiB"`, `"1G"`:
//! binary units, any case). One namespace table is checked in
//! `namespace.rs`.
//! Hosts are denied unless `allow_any_host = true` or their NQN is listed in
//! `allowed_hosts`: a target that serves any host by accident is a data leak.
//!
//! A host with a `[[host]]` table must authenticate with DH-HMAC-CHAP
//! (NVMe Base Specification 2.x, "Authentication"; nvmet's per-host
//! `dhchap_key`, `dhchap_ctrl_key`, `dhchap_hash`, `dhchap_dhgroup`):
//!
//! ```toml
//! [[host]]
//! nqn = "nqn.2014-08.org.nvmexpress:uuid:..."
//! dhchap_secret = "DHHC-1:01:...:"        # the host's key (`nvme gen-dhchap-key`)
//! dhchap_ctrl_secret = "DHHC-1:01:...:"   # optional: the target proves itself too
//! dhchap_hash = ["sha256", "sha384", "sha512"]   # allowed, preferred first
//! dhchap_dhgroup = ["null", "ffdhe2048"]         # allowed, preferred first
//! ```
//!
//! and a subsystem with `require_auth = true` refuses every host that has
//! no secret. A file that holds a secret is refused when every user may
//! read it ([`TargetConfig::load`]).

mod namespace;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;

use config_diag::Ctx;
use nvmf_proto::auth::{DhGroup, DhchapSecret, HashId};
use serde::Deserialize;
use toml::Spanned;

pub use config_diag::ConfigError;
use namespace::{validate_namespace, RawNamespace};
pub use namespace::{BackendConfig, BackendKind, NamespaceConfig, QosMode, SimProfile};

/// NQN of the discovery subsystem every target serves.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// A validated target configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    /// TCP addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// Per-controller queue and transfer limits.
    pub limits: Limits,
    /// Keep-alive bounds.
    pub keep_alive: KeepAlive,
    /// How long a host may keep the target waiting.
    pub timeouts: Timeouts,
    /// The NVM subsystems served (never the discovery subsystem).
    pub subsystems: Vec<SubsystemConfig>,
    /// Hosts that authenticate with DH-HMAC-CHAP (`[[host]]` tables), in
    /// file order.
    pub hosts: Vec<HostConfig>,
    /// `[metrics] listen`: where Prometheus scrapes `GET /metrics`; `None`
    /// (the default): no metrics listener. Put it on loopback or a
    /// management network: the page names every tenant's host NQN.
    pub metrics_listen: Option<SocketAddr>,
}

impl TargetConfig {
    /// The authentication settings of the host `nqn`, if it has any.
    pub fn host(&self, nqn: &str) -> Option<&HostConfig> {
        self.hosts.iter().find(|h| h.nqn == nqn)
    }
}

/// How one host authenticates (a `[[host]]` table): the keys and what may
/// be negotiated, as nvmet keeps them per host in configfs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    /// Host NQN.
    pub nqn: String,
    /// The host's secret (nvmet `dhchap_key`); the host proves it knows it.
    pub dhchap_secret: DhchapSecret,
    /// The controller's secret (nvmet `dhchap_ctrl_key`): when set, a host
    /// that asks for it gets proof that the target knows this key.
    pub dhchap_ctrl_secret: Option<DhchapSecret>,
    /// Hashes allowed, preferred first (default SHA-256, -384, -512).
    pub dhchap_hashes: Vec<HashId>,
    /// DH groups allowed, preferred first (default null, then ffdhe2048 ..
    /// ffdhe8192: the null group first, as nvmet's default, because the
    /// exchange adds nothing without secure channel concatenation, which
    /// this target does not offer, and costs two modular exponentiations
    /// per queue).
    pub dhchap_dhgroups: Vec<DhGroup>,
}

/// Queue and transfer limits advertised to hosts, and the memory budget
/// they imply (see `frontend::budget` for what each bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Most I/O queues one controller may create.
    pub max_io_queues: u16,
    /// Most entries in one I/O queue (the host may ask for fewer).
    pub max_queue_size: u16,
    /// Largest data transfer of one command, in bytes (MDTS; a power of two
    /// multiple of 4 KiB).
    pub max_data_transfer_bytes: u32,
    /// Largest write data carried inside a command capsule (IOCCSZ - 64).
    pub in_capsule_data_bytes: u32,
    /// Largest H2CData PDU the host may send (MAXH2CDATA).
    pub max_h2c_data_bytes: u32,
    /// Read data waiting to be sent plus write data solicited by R2T that
    /// one queue may hold; commands beyond it wait. At least MDTS.
    pub max_queue_data_bytes: u32,
    /// The same for all queues of the target together; at least
    /// `max_queue_data_bytes`.
    pub max_buffered_bytes: u64,
    /// Connections the target serves at once; more are closed at accept.
    pub max_connections: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_io_queues: 16,
            max_queue_size: 128,
            max_data_transfer_bytes: 1 << 20,
            in_capsule_data_bytes: 8192,
            max_h2c_data_bytes: 128 * 1024,
            max_queue_data_bytes: 16 << 20,
            max_buffered_bytes: 256 << 20,
            max_connections: 1024,
        }
    }
}

/// Keep-alive policy: the host proposes KATO in Connect; the target clamps
/// it into these bounds and tears the controller down when the host stays
/// silent for longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeepAlive {
    /// KATO used when the host asks for 0 (no keep-alive), in milliseconds;
    /// 0 keeps the host's choice of none.
    pub default_ms: u32,
    /// Smallest KATO accepted, in milliseconds.
    pub min_ms: u32,
    /// Largest KATO accepted, in milliseconds.
    pub max_ms: u32,
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive {
            default_ms: 0,
            min_ms: 1_000,
            max_ms: 300_000,
        }
    }
}

/// Time limits on what hosts do (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// A connection that has not sent its ICReq and had its Connect
    /// accepted within this time is closed.
    pub handshake_ms: u32,
    /// A socket send that makes no progress for this long (the host does
    /// not read) ends the connection, and the controller with it.
    pub send_ms: u32,
    /// At shutdown, the longest wait for connections to hand back their
    /// commands' completions before they are dropped and the backends
    /// flushed.
    pub shutdown_ms: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake_ms: 10_000,
            send_ms: 10_000,
            shutdown_ms: 10_000,
        }
    }
}

/// One NVM subsystem.
#[derive(Debug, Clone, PartialEq)]
pub struct SubsystemConfig {
    /// Subsystem NQN.
    pub nqn: String,
    /// Serial number reported in Identify Controller (20 ASCII characters
    /// at most).
    pub serial: String,
    /// Model number reported in Identify Controller (40 ASCII characters at
    /// most).
    pub model: String,
    /// Accept any host NQN.
    pub allow_any_host: bool,
    /// Host NQNs accepted when `allow_any_host` is false.
    pub allowed_hosts: BTreeSet<String>,
    /// Refuse hosts without a DH-HMAC-CHAP secret (`[[host]]`); hosts with
    /// one authenticate whether or not this is set.
    pub require_auth: bool,
    /// Namespaces, by ascending NSID.
    pub namespaces: Vec<NamespaceConfig>,
}

impl SubsystemConfig {
    /// Whether a host with this NQN may connect.
    pub fn host_allowed(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(host_nqn)
    }
}

// ---- the raw, as-written form --------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    listen: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    limits: Option<Spanned<Limits>>,
    #[serde(default)]
    keep_alive: Option<Spanned<KeepAlive>>,
    #[serde(default)]
    timeouts: Option<Spanned<Timeouts>>,
    #[serde(default, rename = "subsystem")]
    subsystems: Vec<RawSubsystem>,
    #[serde(default, rename = "host")]
    hosts: Vec<RawHost>,
    #[serde(default)]
    metrics: RawMetrics,
}

/// `[metrics]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    nqn: Spanned<String>,
    #[serde(default)]
    dhchap_secret: Option<Spanned<String>>,
    #[serde(default)]
    dhchap_ctrl_secret: Option<Spanned<String>>,
    #[serde(default)]
    dhchap_hash: Option<Spanned<OneOrMany>>,
    #[serde(default)]
    dhchap_dhgroup: Option<Spanned<OneOrMany>>,
}

/// A name or a list of names (`dhchap_hash = "sha256"` or `["sha256",
/// "sha512"]`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn names(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(s) => vec![s.as_str()],
            OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubsystem {
    nqn: Spanned<String>,
    #[serde(default)]
    serial: Option<Spanned<String>>,
    #[serde(default)]
    model: Option<Spanned<String>>,
    #[serde(default)]
    allow_any_host: bool,
    #[serde(default)]
    allowed_hosts: Vec<Spanned<String>>,
    #[serde(default)]
    require_auth: bool,
    #[serde(default, rename = "namespace")]
    namespaces: Vec<RawNamespace>,
}

impl TargetConfig {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        let config = Self::parse(path, &source)?;
        if !config.hosts.is_empty() {
            config_diag::refuse_world_readable(path, "holds DH-HMAC-CHAP secrets ([[host]])")?;
        }
        Ok(config)
    }

    /// Parses and validates configuration text; `path` is used in errors.
    pub fn parse(path: &Path, source: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig =
            toml::from_str(source).map_err(|e| ConfigError::from_toml(path, source, &e))?;
        let cx = Ctx { file: path, source };
        let listen = match raw.listen {
            None => vec![SocketAddr::from(([127, 0, 0, 1], 4420))],
            Some(list) => validate_listen(&cx, &list)?,
        };
        let limits = match raw.limits {
            None => Limits::default(),
            Some(l) => validate_limits(&cx, &l)?,
        };
        let keep_alive = match raw.keep_alive {
            None => KeepAlive::default(),
            Some(k) => validate_keep_alive(&cx, &k)?,
        };
        let timeouts = match raw.timeouts {
            None => Timeouts::default(),
            Some(t) => validate_timeouts(&cx, &t)?,
        };
        let mut hosts: Vec<HostConfig> = Vec::new();
        for rh in raw.hosts {
            hosts.push(validate_host(&cx, rh, &hosts)?);
        }
        let mut subsystems: Vec<SubsystemConfig> = Vec::new();
        for rs in raw.subsystems {
            subsystems.push(validate_subsystem(&cx, rs, &subsystems, &hosts)?);
        }
        let metrics_listen = cx.listen_addr(&raw.metrics.listen, "metrics.listen")?;
        Ok(TargetConfig {
            metrics_listen,
            listen,
            limits,
            keep_alive,
            timeouts,
            subsystems,
            hosts,
        })
    }
}

fn validate_listen(
    cx: &Ctx,
    list: &Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<SocketAddr>, ConfigError> {
    if list.get_ref().is_empty() {
        return Err(cx.err(list, "listen", "needs at least one address"));
    }
    list.get_ref()
        .iter()
        .map(|a| {
            a.get_ref().parse::<SocketAddr>().map_err(|_| {
                cx.err(
                    a,
                    "listen",
                    format!("`{}` is not an IP:port address", a.get_ref()),
                )
            })
        })
        .collect()
}

/// An error about `field` of a table deserialized whole, whose fields have
/// no spans of their own: it points at the table, and `field` is named
/// under the table header the table's span starts below.
fn table_err<T>(cx: &Ctx, table: &Spanned<T>, field: &str, message: String) -> ConfigError {
    ConfigError::at_span(cx.file, cx.source, table.span(), Some(field), message)
}

fn validate_limits(cx: &Ctx, limits: &Spanned<Limits>) -> Result<Limits, ConfigError> {
    let l = *limits.get_ref();
    let bad = |field: &str, message: String| Err(table_err(cx, limits, field, message));
    if l.max_io_queues == 0 {
        return bad("limits.max_io_queues", "must be at least 1".into());
    }
    if !(2..=1024).contains(&l.max_queue_size) {
        return bad(
            "limits.max_queue_size",
            format!("{} is outside 2..=1024", l.max_queue_size),
        );
    }
    let mdts = l.max_data_transfer_bytes;
    if mdts < 4096 || !mdts.is_power_of_two() || mdts > 16 << 20 {
        return bad(
            "limits.max_data_transfer_bytes",
            format!("{mdts} must be a power of two between 4096 and 16 MiB"),
        );
    }
    if l.in_capsule_data_bytes % 16 != 0 || l.in_capsule_data_bytes > 64 * 1024 {
        return bad(
            "limits.in_capsule_data_bytes",
            format!(
                "{} must be a multiple of 16 and at most 65536",
                l.in_capsule_data_bytes
            ),
        );
    }
    if l.max_h2c_data_bytes < 4096 || l.max_h2c_data_bytes % 4 != 0 {
        return bad(
            "limits.max_h2c_data_bytes",
            format!(
                "{} must be a multiple of 4 and at least 4096",
                l.max_h2c_data_bytes
            ),
        );
    }
    if l.max_queue_data_bytes < mdts {
        return bad(
            "limits.max_queue_data_bytes",
            format!(
                "{} is below max_data_transfer_bytes ({mdts}): a command could never run",
                l.max_queue_data_bytes
            ),
        );
    }
    if l.max_buffered_bytes < u64::from(l.max_queue_data_bytes) {
        return bad(
            "limits.max_buffered_bytes",
            format!(
                "{} is below max_queue_data_bytes ({})",
                l.max_buffered_bytes, l.max_queue_data_bytes
            ),
        );
    }
    if l.max_connections == 0 {
        return bad("limits.max_connections", "must be at least 1".into());
    }
    Ok(l)
}

fn validate_timeouts(cx: &Ctx, timeouts: &Spanned<Timeouts>) -> Result<Timeouts, ConfigError> {
    let t = *timeouts.get_ref();
    for (field, v) in [
        ("timeouts.handshake_ms", t.handshake_ms),
        ("timeouts.send_ms", t.send_ms),
        ("timeouts.shutdown_ms", t.shutdown_ms),
    ] {
        if v == 0 {
            return Err(table_err(
                cx,
                timeouts,
                field,
                "must be at least 1 (a host must never be waited for without end)".into(),
            ));
        }
    }
    Ok(t)
}

fn validate_keep_alive(
    cx: &Ctx,
    keep_alive: &Spanned<KeepAlive>,
) -> Result<KeepAlive, ConfigError> {
    let k = *keep_alive.get_ref();
    if k.min_ms > k.max_ms {
        return Err(table_err(
            cx,
            keep_alive,
            "keep_alive.min_ms",
            format!("min_ms ({}) is above max_ms ({})", k.min_ms, k.max_ms),
        ));
    }
    if k.default_ms != 0 && (k.default_ms < k.min_ms || k.default_ms > k.max_ms) {
        return Err(table_err(
            cx,
            keep_alive,
            "keep_alive.default_ms",
            format!(
                "default_ms ({}) is outside [min_ms, max_ms] = [{}, {}]",
                k.default_ms, k.min_ms, k.max_ms
            ),
        ));
    }
    Ok(k)
}

fn validate_nqn(cx: &Ctx, s: &Spanned<String>, field: &str) -> Result<(), ConfigError> {
    let v = s.get_ref();
    if !v.starts_with("nqn.") || v.len() > 223 || !v.is_ascii() {
        return Err(cx.err(
            s,
            field,
            format!(
                "`{v}` is not an NQN (nqn.yyyy-mm.reverse.domain:name, ASCII, at most 223 bytes)"
            ),
        ));
    }
    Ok(())
}

/// A string of 1 to `max` ASCII characters, or `default` when absent.
fn ascii_text(
    cx: &Ctx,
    value: Option<Spanned<String>>,
    field: &str,
    max: usize,
    default: impl FnOnce() -> String,
) -> Result<String, ConfigError> {
    match value {
        Some(v) => {
            let t = v.get_ref();
            if t.is_empty() || t.len() > max || !t.is_ascii() {
                return Err(cx.err(&v, field, format!("must be 1 to {max} ASCII characters")));
            }
            Ok(v.into_inner())
        }
        None => Ok(default()),
    }
}

/// One `[[host]]` table: a known NQN once, a secret that parses (the
/// error never quotes it), a controller secret unlike the host's, and
/// known hash and group names.
fn validate_host(cx: &Ctx, rh: RawHost, earlier: &[HostConfig]) -> Result<HostConfig, ConfigError> {
    validate_nqn(cx, &rh.nqn, "host.nqn")?;
    let nqn = rh.nqn.get_ref().clone();
    if earlier.iter().any(|h| h.nqn == nqn) {
        return Err(cx.err(
            &rh.nqn,
            "host.nqn",
            format!("host `{nqn}` is defined twice"),
        ));
    }
    let secret = |v: &Spanned<String>, field: &str| {
        DhchapSecret::parse(v.get_ref()).map_err(|e| cx.err(v, field, e.to_string()))
    };
    let Some(raw_secret) = &rh.dhchap_secret else {
        return Err(cx.err(
            &rh.nqn,
            "host.dhchap_secret",
            format!(
                "host `{nqn}` has no dhchap_secret (a [[host]] table says how a host \
                 authenticates; generate one with `nvme gen-dhchap-key -n {nqn}`)"
            ),
        ));
    };
    let dhchap_secret = secret(raw_secret, "host.dhchap_secret")?;
    let dhchap_ctrl_secret = match &rh.dhchap_ctrl_secret {
        Some(v) => {
            let s = secret(v, "host.dhchap_ctrl_secret")?;
            // One key for both directions lets whoever learns it pose as
            // either side; nvme-cli's documentation asks for two.
            if s == dhchap_secret {
                return Err(cx.err(
                    v,
                    "host.dhchap_ctrl_secret",
                    "is the same key as dhchap_secret; use a key of its own",
                ));
            }
            Some(s)
        }
        None => None,
    };
    fn names<T: std::str::FromStr + Copy + PartialEq>(
        cx: &Ctx,
        v: &Option<Spanned<OneOrMany>>,
        field: &str,
        all: &[T],
        known: &str,
    ) -> Result<Vec<T>, ConfigError> {
        let Some(v) = v else {
            return Ok(all.to_vec());
        };
        let names = v.get_ref().names();
        if names.is_empty() {
            return Err(cx.err(v, field, format!("needs at least one of {known}")));
        }
        let mut out: Vec<T> = Vec::new();
        for n in names {
            // HashId also takes nvmet's spelling, `hmac(sha256)`.
            let Ok(t) = n.parse::<T>() else {
                return Err(cx.err(v, field, format!("`{n}` is not one of {known}")));
            };
            if !out.contains(&t) {
                out.push(t);
            }
        }
        Ok(out)
    }
    let dhchap_hashes = names(
        cx,
        &rh.dhchap_hash,
        "host.dhchap_hash",
        &HashId::ALL,
        "sha256, sha384, sha512",
    )?;
    let dhchap_dhgroups = names(
        cx,
        &rh.dhchap_dhgroup,
        "host.dhchap_dhgroup",
        &DhGroup::ALL,
        "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
    )?;
    Ok(HostConfig {
        nqn,
        dhchap_secret,
        dhchap_ctrl_secret,
        dhchap_hashes,
        dhchap_dhgroups,
    })
}

fn validate_subsystem(
    cx: &Ctx,
    rs: RawSubsystem,
    earlier: &[SubsystemConfig],
    hosts: &[HostConfig],
) -> Result<SubsystemConfig, ConfigError> {
    validate_nqn(cx, &rs.nqn, "subsystem.nqn")?;
    let nqn = rs.nqn.get_ref().clone();
    if nqn == DISCOVERY_NQN {
        return Err(cx.err(
            &rs.nqn,
            "subsystem.nqn",
            "the discovery subsystem is built in; configure NVM subsystems only",
        ));
    }
    if earlier.iter().any(|s| s.nqn == nqn) {
        return Err(cx.err(
            &rs.nqn,
            "subsystem.nqn",
            format!("subsystem `{nqn}` is defined twice"),
        ));
    }
    // Stable across restarts (hosts key multipath on it), distinct per
    // subsystem.
    let serial = ascii_text(cx, rs.serial, "subsystem.serial", 20, || {
        format!("GIMBAL{:014X}", fnv1a(nqn.as_bytes()) & 0xFF_FFFF_FFFF_FFFF)
    })?;
    let model = ascii_text(cx, rs.model, "subsystem.model", 40, || {
        "gimbal-target".to_string()
    })?;
    let mut allowed_hosts = BTreeSet::new();
    for h in &rs.allowed_hosts {
        validate_nqn(cx, h, "subsystem.allowed_hosts")?;
        if rs.require_auth && !hosts.iter().any(|k| &k.nqn == h.get_ref()) {
            return Err(cx.err(
                h,
                "subsystem.allowed_hosts",
                format!(
                    "host `{}` has no [[host]] dhchap_secret, and subsystem {nqn} has \
                     require_auth = true: it could never connect",
                    h.get_ref()
                ),
            ));
        }
        allowed_hosts.insert(h.get_ref().clone());
    }
    if !rs.allow_any_host && allowed_hosts.is_empty() {
        log::warn!(
            "{}: subsystem {nqn} allows no host (set allow_any_host = true or list allowed_hosts)",
            cx.file.display()
        );
    }
    let mut namespaces: Vec<NamespaceConfig> = Vec::new();
    for (i, rn) in rs.namespaces.into_iter().enumerate() {
        let ns = validate_namespace(cx, i, rn, &namespaces)?;
        namespaces.push(ns);
    }
    namespaces.sort_by_key(|n| n.nsid);
    Ok(SubsystemConfig {
        nqn,
        serial,
        model,
        allow_any_host: rs.allow_any_host,
        allowed_hosts,
        require_auth: rs.require_auth,
        namespaces,
    })
}

/// FNV-1a: a stable hash for deriving serial numbers (std's hasher is
/// randomly seeded and may change between releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TargetConfig, ConfigError> {
        TargetConfig::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn shipped_example_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/target.toml");
        let c = TargetConfig::load(&path).unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:4420".parse().unwrap()]);
        assert_eq!(c.subsystems.len(), 1);
        let s = &c.subsystems[0];
        assert_eq!(s.nqn, "nqn.2026-01.io.gimbal:demo");
        assert!(s.allow_any_host);
        assert_eq!(
            s.namespaces[0].backend,
            BackendConfig::Ram {
                size_bytes: 256 << 20
            }
        );
    }

    #[test]
    fn defaults_deny_hosts_and_listen_on_loopback() {
        let c = parse("[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n").unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:4420".parse().unwrap()]);
        assert!(!c.subsystems[0].host_allowed("nqn.2026-01.io.t:host"));
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.metrics_listen, None);
    }

    #[test]
    fn metrics_listen_is_an_ip_and_port() {
        let c = parse("[metrics]\nlisten = \"127.0.0.1:9750\"\n").unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9750".parse().unwrap()));
        expect_err(
            "listen = [\"127.0.0.1:4420\"]\n[metrics]\nlisten = \"9750\"\n",
            3,
            "metrics.listen",
            "not an IP:port",
        );
        expect_err("[metrics]\nport = 1\n", 2, "metrics.port", "unknown field");
    }

    fn expect_err(src: &str, line: usize, field: &str, needle: &str) {
        let e = parse(src).unwrap_err();
        assert_eq!(e.line, line, "{e}");
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(needle), "{e}");
        assert!(e.to_string().starts_with("t.toml:"), "{e}");
    }

    #[test]
    fn errors_name_line_and_field() {
        let base = "[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\nallow_any_host = true\n[[subsystem.namespace]]\n";
        expect_err(
            &format!("{base}backend = \"ram\"\nsize = \"12 parsecs\"\n"),
            6,
            "subsystem.namespace.size",
            "unknown size unit",
        );
        expect_err(
            &format!("{base}backend = \"tape\"\nsize = 4096\n"),
            5,
            "subsystem.namespace.backend",
            "unknown backend",
        );
        expect_err(
            &format!("{base}backend = \"ram\"\n"),
            5,
            "subsystem.namespace.size",
            "needs a size",
        );
        expect_err(
            &format!("{base}backend = \"file\"\n"),
            5,
            "subsystem.namespace.path",
            "needs a path",
        );
        expect_err(
            &format!("{base}backend = \"ram\"\nsize = 1000\n"),
            6,
            "subsystem.namespace.size",
            "multiple of the block size",
        );
        expect_err(
            &format!("{base}backend = \"ram\"\nsize = 4096\nblock_size = 1000\n"),
            7,
            "subsystem.namespace.block_size",
            "512 or 4096",
        );
        expect_err(
            &format!("{base}backend = \"ram\"\nsize = 4096\ncolour = \"blue\"\n"),
            7,
            "subsystem.namespace.colour",
            "unknown field",
        );
        expect_err("listen = [\"localhost\"]\n", 1, "listen", "not an IP:port");
        expect_err(
            "[[subsystem]]\nnqn = \"bogus\"\n",
            2,
            "subsystem.nqn",
            "not an NQN",
        );
        expect_err(
            "[[subsystem]]\nserial = \"x\"\n",
            1,
            "subsystem.nqn",
            "missing field",
        );
        expect_err(
            "[limits]\nmax_data_transfer_bytes = 5000\n",
            1,
            "limits.max_data_transfer_bytes",
            "power of two",
        );
        expect_err(
            "[keep_alive]\nmin_ms = 5000\nmax_ms = 10\n",
            1,
            "keep_alive.min_ms",
            "above max_ms",
        );
        expect_err(
            "[limits]\nmax_queue_data_bytes = 4096\n",
            1,
            "limits.max_queue_data_bytes",
            "below max_data_transfer_bytes",
        );
        expect_err(
            "[limits]\nmax_buffered_bytes = 1048576\n",
            1,
            "limits.max_buffered_bytes",
            "below max_queue_data_bytes",
        );
        expect_err(
            "[timeouts]\nsend_ms = 0\n",
            1,
            "timeouts.send_ms",
            "at least 1",
        );
        expect_err("listen = [\n", 2, "", "");
    }

    #[test]
    fn device_queue_depth_defaults_to_unlimited_and_rejects_zero() {
        let base = "[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = 4096\n";
        let c = parse(base).unwrap();
        assert_eq!(c.subsystems[0].namespaces[0].device_queue_depth, None);
        let c = parse(&format!("{base}device_queue_depth = 1\n")).unwrap();
        assert_eq!(c.subsystems[0].namespaces[0].device_queue_depth, Some(1));
        let e = parse(&format!("{base}device_queue_depth = 0\n")).unwrap_err();
        assert_eq!(e.field, "subsystem.namespace.device_queue_depth", "{e}");
        assert_eq!(c.subsystems[0].namespaces[0].class_aging_us, 100_000);
        let c = parse(&format!("{base}class_aging_us = 0\n")).unwrap();
        assert_eq!(c.subsystems[0].namespaces[0].class_aging_us, 0);
    }

    #[test]
    fn gimbal_parameters_are_validated_with_their_field() {
        let base = "[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = 4096\n";
        let c = parse(&format!(
            "{base}qos = \"gimbal\"\n[subsystem.namespace.gimbal]\nslot_size_bytes = 65536\n"
        ))
        .unwrap();
        let ns = &c.subsystems[0].namespaces[0];
        assert_eq!(ns.qos, QosMode::Gimbal);
        assert_eq!(ns.gimbal.slot_size_bytes, 65536);
        assert_eq!(
            ns.gimbal.latency_threshold_min_us, 250,
            "paper default kept"
        );
        let e = parse(&format!(
            "{base}qos = \"gimbal\"\n[subsystem.namespace.gimbal]\nlatency_threshold_min_us = 2000\nlatency_threshold_max_us = 1000\n"
        ))
        .unwrap_err();
        assert_eq!(
            e.field, "subsystem.namespace.gimbal.latency_threshold_min_us",
            "{e}"
        );
        let e = parse(&format!(
            "{base}[subsystem.namespace.gimbal]\nslot_size_bytes = 65536\n"
        ))
        .unwrap_err();
        assert!(e.message.contains("qos is not"), "{e}");
        let e = parse(&format!(
            "{base}qos = \"gimbal\"\n[subsystem.namespace.gimbal]\nslot_size = 1\n"
        ))
        .unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
    }

    #[test]
    fn duplicate_subsystems_and_namespaces_are_rejected() {
        let s = "[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n";
        expect_err(s, 4, "subsystem.nqn", "defined twice");
        let n = "[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = 4096\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = 4096\n";
        expect_err(n, 8, "subsystem.namespace.nsid", "defined twice");
    }

    #[test]
    fn unreadable_file_is_named() {
        let e = TargetConfig::load(Path::new("/nonexistent/target.toml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/target.toml: cannot read"),
            "{e}"
        );
    }

    // Keys from nvme-cli 2.3's `nvme gen-dhchap-key` (see
    // nvmf-proto/tests/proto/auth_secret.rs).
    const KEY_A: &str = "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCa:";
    const KEY_B: &str = "DHHC-1:01:5NmdC6ei6ufThKzxcNLrVwG7B51dcFJp4loC4hNpFH00R4sa:";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

    fn auth_config(host: &str, subsystem_extra: &str) -> String {
        format!(
            "[[host]]\n{host}\n[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\n{subsystem_extra}\n\
             [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"1MiB\"\n"
        )
    }

    #[test]
    fn hosts_with_secrets_parse_with_nvmet_defaults() {
        let c = parse(&auth_config(
            &format!("nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\""),
            "allow_any_host = true",
        ))
        .unwrap();
        let h = c.host(HOST).unwrap();
        assert_eq!(h.dhchap_secret, DhchapSecret::parse(KEY_A).unwrap());
        assert_eq!(h.dhchap_ctrl_secret, None);
        assert_eq!(h.dhchap_hashes, HashId::ALL.to_vec());
        assert_eq!(h.dhchap_dhgroups, DhGroup::ALL.to_vec());
        assert_eq!(h.dhchap_dhgroups[0], DhGroup::Null);
        assert!(c.host("nqn.2014-08.org.nvmexpress:other").is_none());
        assert!(!c.subsystems[0].require_auth);
        // Debug never shows a key.
        assert!(!format!("{c:?}").contains("0GUMxintlD"));
    }

    #[test]
    fn hash_and_group_lists_take_nvmet_spellings_in_order() {
        let c = parse(&auth_config(
            &format!(
                "nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\"\ndhchap_ctrl_secret = \"{KEY_B}\"\n\
                 dhchap_hash = [\"hmac(sha512)\", \"sha256\"]\ndhchap_dhgroup = \"ffdhe3072\""
            ),
            &format!("allowed_hosts = [\"{HOST}\"]\nrequire_auth = true"),
        ))
        .unwrap();
        let h = c.host(HOST).unwrap();
        assert_eq!(h.dhchap_hashes, vec![HashId::Sha512, HashId::Sha256]);
        assert_eq!(h.dhchap_dhgroups, vec![DhGroup::Ffdhe3072]);
        assert!(h.dhchap_ctrl_secret.is_some());
        assert!(c.subsystems[0].require_auth);
    }

    #[test]
    fn bad_host_tables_name_line_and_field_and_never_quote_a_key() {
        let bad_key = "DHHC-1:01:0GUMxintlD+1ntU08h7zQX+9eM5PTH0Hf6y+psRsmsIZCqCb:";
        let e = parse(&auth_config(
            &format!("nqn = \"{HOST}\"\ndhchap_secret = \"{bad_key}\""),
            "allow_any_host = true",
        ))
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (3, "host.dhchap_secret"), "{e}");
        assert!(e.message.contains("CRC"), "{e}");
        assert!(!e.to_string().contains("0GUMxintlD"), "{e}");
        let cases = [
            (format!("nqn = \"{HOST}\""), 2, "host.dhchap_secret", "has no dhchap_secret"),
            (
                format!("nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\"\ndhchap_ctrl_secret = \"{KEY_A}\""),
                4,
                "host.dhchap_ctrl_secret",
                "same key as dhchap_secret",
            ),
            (
                format!("nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\"\ndhchap_hash = \"md5\""),
                4,
                "host.dhchap_hash",
                "`md5` is not one of sha256, sha384, sha512",
            ),
            (
                format!("nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\"\ndhchap_dhgroup = []"),
                4,
                "host.dhchap_dhgroup",
                "needs at least one",
            ),
            (
                format!("nqn = \"{HOST}\"\ndhchap_secret = \"secret\""),
                3,
                "host.dhchap_secret",
                "must start with \"DHHC-1:\"",
            ),
            ("nqn = \"host1\"\ndhchap_secret = \"x\"".to_string(), 2, "host.nqn", "is not an NQN"),
        ];
        for (host, line, field, needle) in cases {
            expect_err(
                &auth_config(&host, "allow_any_host = true"),
                line,
                field,
                needle,
            );
        }
        let twice = format!(
            "[[host]]\nnqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\"\n\
             [[host]]\nnqn = \"{HOST}\"\ndhchap_secret = \"{KEY_B}\"\n"
        );
        expect_err(&twice, 5, "host.nqn", "defined twice");
        // require_auth with an allowed host that has no secret.
        expect_err(
            &auth_config(
                &format!("nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\""),
                "allowed_hosts = [\"nqn.2014-08.org.nvmexpress:nokey\"]\nrequire_auth = true",
            ),
            6,
            "subsystem.allowed_hosts",
            "has no [[host]] dhchap_secret",
        );
    }

    #[test]
    fn a_world_readable_file_with_secrets_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gimbal-auth-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("target.toml");
        std::fs::write(
            &f,
            auth_config(
                &format!("nqn = \"{HOST}\"\ndhchap_secret = \"{KEY_A}\""),
                "allow_any_host = true",
            ),
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = TargetConfig::load(&f).unwrap_err();
        assert!(
            e.to_string()
                .contains("holds DH-HMAC-CHAP secrets ([[host]]) but is readable by every user"),
            "{e}"
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        TargetConfig::load(&f).unwrap();
        // Without secrets the mode does not matter.
        std::fs::write(
            &f,
            "[[subsystem]]\nnqn = \"nqn.2026-01.io.t:a\"\nallow_any_host = true\n",
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        TargetConfig::load(&f).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
