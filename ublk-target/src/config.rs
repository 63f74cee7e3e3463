//! A volume's configuration: one TOML file per volume.
//!
//! ```toml
//! name = "vol0"
//! [target]
//! address = "127.0.0.1"
//! port = 4420
//! subnqn = "nqn.2026-01.io.gimbal:demo"
//! nsid = 1
//! [host]                  # optional: generated and persisted once if absent
//! nqn = "nqn.2014-08.org.nvmexpress:uuid:..."
//! id = "0f1e..."
//! [io]
//! queues = 2
//! queue_depth = 64
//! io_timeout = 30         # seconds
//! [reconnect]
//! reconnect_delay = 2     # seconds
//! ctrl_loss_tmo = 600     # seconds, -1: forever
//! fast_io_fail_tmo = -1   # seconds, -1: never
//! keep_alive_tmo = 5      # seconds
//! [qos]                   # see crate::qos
//! credits = "auto"        # auto | target | estimate | off
//! riops = 2000            # io.max names: riops wiops rbps wbps, *_burst
//! [priority]              # see crate::priority
//! source = "ionice"       # ionice | fixed
//! arbitration = "drr"     # auto | wrr | drr
//! high_weight = 4
//! ```
//!
//! Unknown keys are errors (a typo must not silently do nothing);
//! `[[replica]]` is added here when replicated volumes are built.
//! Every error names the file, the line and the field
//! ([`gimbal_target::config_error::ConfigError`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gimbal_target::config_error::ConfigError;
use nvmf_initiator::blocking::HostIdentity;
use nvmf_initiator::ReconnectPolicy;
use serde::Deserialize;
use toml::Spanned;

use crate::priority::{parse_class, Mechanism, PriorityConfig, Source};
use crate::qos::{parse_mode, QosConfig};

/// A parsed, checked volume configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeConfig {
    /// Where it was read from.
    pub path: PathBuf,
    /// Volume name: `[A-Za-z0-9_.-]`, at most 64 characters (used in file
    /// names, the systemd instance and the udev symlink).
    pub name: String,
    /// The target namespace.
    pub target: TargetSpec,
    /// Host identity from the file, if given.
    pub host: Option<HostIdentity>,
    /// ublk queues, each with its own thread and NVMe/TCP I/O queue.
    pub queues: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Bound on each NVMe command.
    pub io_timeout: Duration,
    /// Reconnect behaviour.
    pub reconnect: ReconnectPolicy,
    /// Keep Alive timeout proposed to the target.
    pub keep_alive: Duration,
    /// Client-side QoS (`[qos]`): credit mode and rate limits.
    pub qos: QosConfig,
    /// I/O priority classes (`[priority]`).
    pub priority: PriorityConfig,
}

/// One target namespace (a replica, once volumes have several).
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
    target: RawTarget,
    host: Option<RawHost>,
    #[serde(default)]
    io: RawIo,
    #[serde(default)]
    reconnect: RawReconnect,
    #[serde(default)]
    qos: RawQos,
    #[serde(default)]
    priority: RawPriority,
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
    estimate_latency_min_us: Option<Spanned<i64>>,
    estimate_latency_max_us: Option<Spanned<i64>>,
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
    nqn: Spanned<String>,
    id: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawIo {
    queues: Option<Spanned<i64>>,
    queue_depth: Option<Spanned<i64>>,
    io_timeout: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawReconnect {
    reconnect_delay: Option<Spanned<i64>>,
    ctrl_loss_tmo: Option<Spanned<i64>>,
    fast_io_fail_tmo: Option<Spanned<i64>>,
    keep_alive_tmo: Option<Spanned<i64>>,
}

struct Ctx<'a> {
    file: &'a Path,
    source: &'a str,
}

impl Ctx<'_> {
    fn err<T>(&self, v: &Spanned<T>, field: &str, msg: impl Into<String>) -> ConfigError {
        let span = v.span();
        if span.start == span.end {
            let mut e = ConfigError::whole_file(self.file, msg);
            e.field = field.to_owned();
            return e;
        }
        let key = field.rsplit('.').next().unwrap_or(field);
        ConfigError::at_span(self.file, self.source, span, Some(key), msg)
    }

    fn int(
        &self,
        v: &Option<Spanned<i64>>,
        field: &str,
        default: i64,
        range: std::ops::RangeInclusive<i64>,
    ) -> Result<i64, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) if range.contains(s.get_ref()) => Ok(*s.get_ref()),
            Some(s) => Err(self.err(
                s,
                field,
                format!(
                    "{} is out of range ({}..={})",
                    s.get_ref(),
                    range.start(),
                    range.end()
                ),
            )),
        }
    }
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
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        Self::parse(path, &text)
    }

    /// Parse and check `source` (read from `path`, for messages).
    pub fn parse(path: &Path, source: &str) -> Result<Self, ConfigError> {
        let raw: Raw =
            toml::from_str(source).map_err(|e| ConfigError::from_toml(path, source, &e))?;
        let cx = Ctx { file: path, source };
        if !valid_name(raw.name.get_ref()) {
            return Err(cx.err(
                &raw.name,
                "name",
                "a volume name is 1 to 64 of [A-Za-z0-9_.-], not starting with a dot",
            ));
        }
        let t = &raw.target;
        if t.address.get_ref().trim().is_empty() {
            return Err(cx.err(&t.address, "target.address", "must not be empty"));
        }
        let port = *t.port.get_ref();
        if port == 0 || port > 65535 {
            return Err(cx.err(&t.port, "target.port", "a TCP port is 1..=65535"));
        }
        if !t.subnqn.get_ref().starts_with("nqn.") || t.subnqn.get_ref().len() > 223 {
            return Err(cx.err(
                &t.subnqn,
                "target.subnqn",
                "an NQN starts with `nqn.` and has at most 223 bytes",
            ));
        }
        if *t.nsid.get_ref() == 0 || *t.nsid.get_ref() == u32::MAX {
            return Err(cx.err(&t.nsid, "target.nsid", "a namespace ID is 1..=FFFFFFFEh"));
        }
        let host = match &raw.host {
            None => None,
            Some(h) => {
                if !h.nqn.get_ref().starts_with("nqn.") {
                    return Err(cx.err(&h.nqn, "host.nqn", "an NQN starts with `nqn.`"));
                }
                let id = match &h.id {
                    Some(s) => parse_uuid(s.get_ref()).ok_or_else(|| {
                        cx.err(s, "host.id", "a host ID is a UUID (32 hex digits)")
                    })?,
                    None => h
                        .nqn
                        .get_ref()
                        .rsplit(':')
                        .next()
                        .and_then(parse_uuid)
                        .ok_or_else(|| {
                            cx.err(
                                &h.nqn,
                                "host.id",
                                "give `id` (a UUID) unless the NQN ends in one",
                            )
                        })?,
                };
                Some(HostIdentity {
                    nqn: h.nqn.get_ref().clone(),
                    id,
                })
            }
        };
        let queues = cx.int(&raw.io.queues, "io.queues", 1, 1..=64)? as u16;
        let queue_depth = cx.int(&raw.io.queue_depth, "io.queue_depth", 64, 2..=1024)? as u16;
        let io_timeout = cx.int(&raw.io.io_timeout, "io.io_timeout", 30, 1..=3600)? as u64;
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
        let qos = parse_qos(&cx, &raw.qos)?;
        let priority = parse_priority(&cx, &raw.priority)?;
        Ok(Self {
            path: path.to_path_buf(),
            name: raw.name.get_ref().clone(),
            target: TargetSpec {
                address: t.address.get_ref().clone(),
                port: port as u16,
                subnqn: t.subnqn.get_ref().clone(),
                nsid: *t.nsid.get_ref(),
            },
            host,
            queues,
            queue_depth,
            io_timeout: Duration::from_secs(io_timeout),
            reconnect: ReconnectPolicy {
                reconnect_delay: Duration::from_secs(delay as u64),
                ctrl_loss_tmo: ReconnectPolicy::secs_or_never(loss),
                fast_io_fail_tmo: ReconnectPolicy::secs_or_never(fast),
                requeue: true,
            },
            keep_alive: Duration::from_secs(kato as u64),
            qos,
            priority,
        })
    }
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
    let us = |v: &Option<Spanned<i64>>, f: &str, d: u64| {
        cx.int(v, f, d as i64, 1..=10_000_000).map(|x| x as u64)
    };
    c.estimate_latency_min_us = us(
        &q.estimate_latency_min_us,
        "qos.estimate_latency_min_us",
        c.estimate_latency_min_us,
    )?;
    c.estimate_latency_max_us = us(
        &q.estimate_latency_max_us,
        "qos.estimate_latency_max_us",
        c.estimate_latency_max_us,
    )?;
    if let Err(e) = c.validate() {
        let at = q
            .estimate_latency_max_us
            .as_ref()
            .or(q.estimate_latency_min_us.as_ref());
        return Err(match at {
            Some(s) => cx.err(s, "qos.estimate_latency_max_us", e),
            None => ConfigError::whole_file(cx.file, e),
        });
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

/// Parse a UUID with or without dashes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, out) in b.iter_mut().enumerate() {
        *out = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(b)
}

/// Format a UUID with dashes.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
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
