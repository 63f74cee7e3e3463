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
//! Hosts are denied unless `allow_any_host = true` or their NQN is listed in
//! `allowed_hosts`: a target that serves any host by accident is a data leak.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use qos_core::config::GimbalConfig;
use qos_core::error::QosError;
use serde::Deserialize;
use toml::Spanned;

pub use crate::config_error::ConfigError;

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
    /// The NVM subsystems served (never the discovery subsystem).
    pub subsystems: Vec<SubsystemConfig>,
}

/// Queue and transfer limits advertised to hosts.
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_io_queues: 16,
            max_queue_size: 128,
            max_data_transfer_bytes: 1 << 20,
            in_capsule_data_bytes: 8192,
            max_h2c_data_bytes: 128 * 1024,
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
    /// Namespaces, by ascending NSID.
    pub namespaces: Vec<NamespaceConfig>,
}

impl SubsystemConfig {
    /// Whether a host with this NQN may connect.
    pub fn host_allowed(&self, host_nqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(host_nqn)
    }
}

/// Which QoS the per-device pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QosMode {
    /// Plain target: requests go to the backend in arrival order.
    #[default]
    None,
    /// The Gimbal storage switch.
    Gimbal,
}

/// One namespace and its backend.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceConfig {
    /// Namespace ID (1-based).
    pub nsid: u32,
    /// Where the data lives.
    pub backend: BackendConfig,
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// The per-device pipeline's QoS.
    pub qos: QosMode,
    /// Switch parameters when `qos = "gimbal"` (paper defaults, §4.2,
    /// overridden by a `[subsystem.namespace.gimbal]` table).
    pub gimbal: GimbalConfig,
    /// Requests of class-arbitrating controllers (CC.AMS weighted round
    /// robin or DRR) outstanding at the device (`qos = "none"`) or held
    /// by the switch (`qos = "gimbal"`) at once; beyond it they wait in the
    /// namespace's class arbiter, which is where classes and weights take
    /// effect. `None` (the default): unlimited, nothing waits.
    pub device_queue_depth: Option<u32>,
    /// Wait in the class arbiter after which a request goes before all
    /// others, oldest first, whatever its class (so nothing starves);
    /// 0 turns aging off. Default 100 000 µs (qos-core's default).
    pub class_aging_us: u64,
}

/// A namespace backend.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    /// Memory, zero-filled; data lives as long as the process.
    Ram {
        /// Size in bytes.
        size_bytes: u64,
    },
    /// No data kept: writes are dropped, reads return zeros. For benchmarks.
    Null {
        /// Size in bytes.
        size_bytes: u64,
    },
    /// Memory with the latencies of a simulated SSD (qos-core's model of
    /// the Gimbal paper's device), imposed in real time: lets the switch be
    /// watched end to end without real SSDs.
    Sim {
        /// Size in bytes.
        size_bytes: u64,
        /// Preconditioned state of the simulated device.
        profile: SimProfile,
        /// Every modeled latency is multiplied by this (≥ 1), so the device
        /// can be made slower than the hosts driving it (e.g. in an emulated
        /// VM).
        time_scale: f64,
    },
    /// A file or block device.
    File {
        /// Path to the file or device.
        path: PathBuf,
        /// Size to create a missing file with, or to extend a smaller one
        /// to; `None` uses the existing file's or device's size.
        size_bytes: Option<u64>,
    },
}

impl BackendConfig {
    /// The backend's kind as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendConfig::Ram { .. } => "ram",
            BackendConfig::Null { .. } => "null",
            BackendConfig::File { .. } => "file",
            BackendConfig::Sim { .. } => "sim",
        }
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
    #[serde(default, rename = "subsystem")]
    subsystems: Vec<RawSubsystem>,
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
    #[serde(default, rename = "namespace")]
    namespaces: Vec<RawNamespace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    #[serde(default)]
    nsid: Option<Spanned<u32>>,
    backend: Spanned<String>,
    #[serde(default)]
    size: Option<Spanned<SizeValue>>,
    #[serde(default)]
    path: Option<Spanned<PathBuf>>,
    #[serde(default)]
    block_size: Option<Spanned<u32>>,
    #[serde(default)]
    qos: Option<Spanned<QosMode>>,
    #[serde(default)]
    gimbal: Option<Spanned<GimbalConfig>>,
    #[serde(default)]
    profile: Option<Spanned<SimProfile>>,
    #[serde(default)]
    time_scale: Option<Spanned<f64>>,
    #[serde(default)]
    device_queue_depth: Option<Spanned<u32>>,
    #[serde(default)]
    class_aging_us: Option<u64>,
}

/// How a simulated SSD was preconditioned (the paper's Clean-SSD and
/// Fragment-SSD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SimProfile {
    /// Preconditioned with large sequential writes.
    #[default]
    Clean,
    /// Preconditioned with small random writes: writes cost more.
    Fragmented,
}

/// A size written as an integer (bytes) or a string with a unit.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// Parses sizes such as `4096`, `"512KiB"`, `"256MiB"`, `"1GiB"`, `"2G"`
/// (binary units; `K`, `M`, `G`, `T` mean the same as `KiB`...).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size (use e.g. 4096, \"512KiB\", \"1GiB\")"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{text}` overflows"))
}

struct Ctx<'a> {
    file: &'a Path,
    source: &'a str,
}

impl Ctx<'_> {
    fn err<T>(
        &self,
        span: std::ops::Range<usize>,
        field: Option<&str>,
        msg: String,
    ) -> Result<T, ConfigError> {
        Err(ConfigError::at_span(
            self.file,
            self.source,
            span,
            field,
            msg,
        ))
    }
}

impl TargetConfig {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        Self::parse(path, &source)
    }

    /// Parses and validates configuration text; `path` is used in errors.
    pub fn parse(path: &Path, source: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig =
            toml::from_str(source).map_err(|e| ConfigError::from_toml(path, source, &e))?;
        let cx = Ctx { file: path, source };

        let listen = match raw.listen {
            None => vec![SocketAddr::from(([127, 0, 0, 1], 4420))],
            Some(list) => {
                if list.get_ref().is_empty() {
                    return cx.err(
                        list.span(),
                        Some("listen"),
                        "needs at least one address".into(),
                    );
                }
                let mut out = Vec::new();
                for a in list.get_ref() {
                    let addr = a.get_ref().parse::<SocketAddr>().or_else(|_| {
                        cx.err(
                            a.span(),
                            Some("listen"),
                            format!("`{}` is not an IP:port address", a.get_ref()),
                        )
                    })?;
                    out.push(addr);
                }
                out
            }
        };

        let limits = match raw.limits {
            None => Limits::default(),
            Some(l) => {
                let v = *l.get_ref();
                validate_limits(&cx, l.span(), &v)?;
                v
            }
        };
        let keep_alive = match raw.keep_alive {
            None => KeepAlive::default(),
            Some(k) => {
                let v = *k.get_ref();
                if v.min_ms > v.max_ms {
                    return cx.err(
                        k.span(),
                        Some("keep_alive.min_ms"),
                        format!("min_ms ({}) is above max_ms ({})", v.min_ms, v.max_ms),
                    );
                }
                if v.default_ms != 0 && (v.default_ms < v.min_ms || v.default_ms > v.max_ms) {
                    return cx.err(
                        k.span(),
                        Some("keep_alive.default_ms"),
                        format!(
                            "default_ms ({}) is outside [min_ms, max_ms] = [{}, {}]",
                            v.default_ms, v.min_ms, v.max_ms
                        ),
                    );
                }
                v
            }
        };

        let mut subsystems: Vec<SubsystemConfig> = Vec::new();
        for (i, rs) in raw.subsystems.into_iter().enumerate() {
            subsystems.push(validate_subsystem(&cx, i, rs, &subsystems)?);
        }
        Ok(TargetConfig {
            listen,
            limits,
            keep_alive,
            subsystems,
        })
    }
}

fn validate_limits(cx: &Ctx, span: std::ops::Range<usize>, l: &Limits) -> Result<(), ConfigError> {
    let bad = |field: &str, msg: String| cx.err::<()>(span.clone(), Some(field), msg);
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
    Ok(())
}

fn validate_nqn(cx: &Ctx, s: &Spanned<String>, field: &str) -> Result<(), ConfigError> {
    let v = s.get_ref();
    if !v.starts_with("nqn.") || v.len() > 223 || !v.is_ascii() {
        return cx.err(
            s.span(),
            Some(field),
            format!(
                "`{v}` is not an NQN (nqn.yyyy-mm.reverse.domain:name, ASCII, at most 223 bytes)"
            ),
        );
    }
    Ok(())
}

fn validate_subsystem(
    cx: &Ctx,
    index: usize,
    rs: RawSubsystem,
    earlier: &[SubsystemConfig],
) -> Result<SubsystemConfig, ConfigError> {
    validate_nqn(cx, &rs.nqn, "nqn")?;
    let nqn = rs.nqn.get_ref().clone();
    if nqn == DISCOVERY_NQN {
        return cx.err(
            rs.nqn.span(),
            Some("nqn"),
            "the discovery subsystem is built in; configure NVM subsystems only".into(),
        );
    }
    if earlier.iter().any(|s| s.nqn == nqn) {
        return cx.err(
            rs.nqn.span(),
            Some("nqn"),
            format!("subsystem `{nqn}` is defined twice"),
        );
    }
    let serial = match rs.serial {
        Some(s) => {
            if s.get_ref().is_empty() || s.get_ref().len() > 20 || !s.get_ref().is_ascii() {
                return cx.err(
                    s.span(),
                    Some("serial"),
                    "must be 1 to 20 ASCII characters".into(),
                );
            }
            s.into_inner()
        }
        // Stable across restarts (hosts key multipath on it), distinct per
        // subsystem.
        None => format!("GIMBAL{:014X}", fnv1a(nqn.as_bytes()) & 0xFF_FFFF_FFFF_FFFF),
    };
    let model = match rs.model {
        Some(m) => {
            if m.get_ref().is_empty() || m.get_ref().len() > 40 || !m.get_ref().is_ascii() {
                return cx.err(
                    m.span(),
                    Some("model"),
                    "must be 1 to 40 ASCII characters".into(),
                );
            }
            m.into_inner()
        }
        None => "gimbal-target".to_string(),
    };
    let mut allowed_hosts = BTreeSet::new();
    for h in &rs.allowed_hosts {
        validate_nqn(cx, h, "allowed_hosts")?;
        allowed_hosts.insert(h.get_ref().clone());
    }
    if !rs.allow_any_host && allowed_hosts.is_empty() {
        log::warn!(
            "{}: subsystem {nqn} allows no host (set allow_any_host = true or list allowed_hosts)",
            cx.file.display()
        );
    }
    let _ = index;
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
        namespaces,
    })
}

fn validate_namespace(
    cx: &Ctx,
    index: usize,
    rn: RawNamespace,
    earlier: &[NamespaceConfig],
) -> Result<NamespaceConfig, ConfigError> {
    let nsid = match &rn.nsid {
        Some(n) => {
            let v = *n.get_ref();
            if v == 0 || v == u32::MAX {
                return cx.err(
                    n.span(),
                    Some("nsid"),
                    format!("{v} is not a valid namespace ID"),
                );
            }
            if earlier.iter().any(|e| e.nsid == v) {
                return cx.err(
                    n.span(),
                    Some("nsid"),
                    format!("namespace {v} is defined twice"),
                );
            }
            v
        }
        None => {
            let mut v = index as u32 + 1;
            while earlier.iter().any(|e| e.nsid == v) {
                v += 1;
            }
            v
        }
    };
    let block_size = match &rn.block_size {
        Some(b) => {
            if *b.get_ref() != 512 && *b.get_ref() != 4096 {
                return cx.err(
                    b.span(),
                    Some("block_size"),
                    format!("{} must be 512 or 4096", b.get_ref()),
                );
            }
            *b.get_ref()
        }
        None => 512,
    };
    let size = match &rn.size {
        None => None,
        Some(s) => {
            let bytes = match s.get_ref() {
                SizeValue::Bytes(b) => *b,
                SizeValue::Text(t) => match parse_size(t) {
                    Ok(b) => b,
                    Err(m) => return cx.err(s.span(), Some("size"), m),
                },
            };
            if bytes == 0 || bytes % block_size as u64 != 0 {
                return cx.err(
                    s.span(),
                    Some("size"),
                    format!(
                        "{bytes} bytes is not a positive multiple of the block size {block_size}"
                    ),
                );
            }
            Some((bytes, s.span()))
        }
    };
    let kind = rn.backend.get_ref().as_str();
    if kind != "sim" {
        if let Some(p) = &rn.profile {
            return cx.err(
                p.span(),
                Some("profile"),
                "only a `sim` namespace takes a profile".into(),
            );
        }
        if let Some(t) = &rn.time_scale {
            return cx.err(
                t.span(),
                Some("time_scale"),
                "only a `sim` namespace takes a time_scale".into(),
            );
        }
    }
    let backend = match kind {
        "sim" => {
            let Some((size_bytes, _)) = size else {
                return cx.err(
                    rn.backend.span(),
                    Some("size"),
                    "a `sim` namespace needs a size".into(),
                );
            };
            let time_scale = match &rn.time_scale {
                None => 1.0,
                Some(t)
                    if t.get_ref().is_finite() && *t.get_ref() >= 1.0 && *t.get_ref() <= 1e6 =>
                {
                    *t.get_ref()
                }
                Some(t) => {
                    return cx.err(
                        t.span(),
                        Some("time_scale"),
                        format!("{} must be between 1 and 1000000", t.get_ref()),
                    )
                }
            };
            BackendConfig::Sim {
                size_bytes,
                profile: rn.profile.map(|p| p.into_inner()).unwrap_or_default(),
                time_scale,
            }
        }
        "ram" | "null" => {
            let Some((size_bytes, _)) = size else {
                return cx.err(
                    rn.backend.span(),
                    Some("size"),
                    format!("a `{kind}` namespace needs a size"),
                );
            };
            if let Some(p) = &rn.path {
                return cx.err(
                    p.span(),
                    Some("path"),
                    format!("a `{kind}` namespace takes no path"),
                );
            }
            if kind == "ram" {
                BackendConfig::Ram { size_bytes }
            } else {
                BackendConfig::Null { size_bytes }
            }
        }
        "file" => {
            let Some(path) = rn.path else {
                return cx.err(
                    rn.backend.span(),
                    Some("path"),
                    "a `file` namespace needs a path".into(),
                );
            };
            BackendConfig::File {
                path: path.into_inner(),
                size_bytes: size.map(|s| s.0),
            }
        }
        other => {
            return cx.err(
                rn.backend.span(),
                Some("backend"),
                format!("unknown backend `{other}` (use ram, null, file or sim)"),
            )
        }
    };
    let qos = rn.qos.map(|q| q.into_inner()).unwrap_or_default();
    let gimbal = match rn.gimbal {
        None => GimbalConfig::default(),
        Some(g) => {
            if let Err(QosError::InvalidConfig { field, reason }) = g.get_ref().validate() {
                return cx.err(g.span(), Some(&format!("gimbal.{field}")), reason);
            }
            if qos != QosMode::Gimbal {
                return cx.err(
                    g.span(),
                    Some("gimbal"),
                    "switch parameters given but qos is not \"gimbal\"".into(),
                );
            }
            g.into_inner()
        }
    };
    let device_queue_depth = match rn.device_queue_depth {
        None => None,
        Some(d) if *d.get_ref() == 0 => {
            return cx.err(
                d.span(),
                Some("device_queue_depth"),
                "device_queue_depth must be at least 1 (leave it out for no limit)".into(),
            )
        }
        Some(d) => Some(d.into_inner()),
    };
    Ok(NamespaceConfig {
        nsid,
        backend,
        block_size,
        qos,
        gimbal,
        device_queue_depth,
        class_aging_us: rn
            .class_aging_us
            .unwrap_or(qos_core::class_arbiter::ArbiterConfig::default().aging_threshold_us),
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
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999TiB").is_err());
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
}
