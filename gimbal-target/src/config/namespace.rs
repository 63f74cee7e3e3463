//! One `[[subsystem.namespace]]` table: its ID, block size, backend and
//! the QoS of its pipeline.
//!
//! The backend kind is parsed once into a [`BackendKind`]; each kind's keys
//! are then checked by a function of its own.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use config_diag::{parse_size, ConfigError, Ctx};
use qos_core::config::GimbalConfig;
use qos_core::error::QosError;
use serde::Deserialize;
use toml::Spanned;

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
    /// The backend's kind (displayed as written in the config).
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendConfig::Ram { .. } => BackendKind::Ram,
            BackendConfig::Null { .. } => BackendKind::Null,
            BackendConfig::File { .. } => BackendKind::File,
            BackendConfig::Sim { .. } => BackendKind::Sim,
        }
    }
}

/// The kinds of backend, as the `backend` key names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// `ram`: [`BackendConfig::Ram`].
    Ram,
    /// `null`: [`BackendConfig::Null`].
    Null,
    /// `file`: [`BackendConfig::File`].
    File,
    /// `sim`: [`BackendConfig::Sim`].
    Sim,
}

impl BackendKind {
    /// Every kind, in the order error messages list them.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Ram,
        BackendKind::Null,
        BackendKind::File,
        BackendKind::Sim,
    ];

    /// The name the config uses.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Ram => "ram",
            BackendKind::Null => "null",
            BackendKind::File => "file",
            BackendKind::Sim => "sim",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `backend` value that names no kind (the names are case-sensitive).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}` (use ram, null, file or sim)")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_owned()))
    }
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

// ---- the raw, as-written form --------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNamespace {
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

/// A size written as an integer (bytes) or a string with a unit.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

// ---- checking -------------------------------------------------------------

/// Checks the `index`-th namespace table of a subsystem, given the
/// namespaces before it.
pub(super) fn validate_namespace(
    cx: &Ctx,
    index: usize,
    rn: RawNamespace,
    earlier: &[NamespaceConfig],
) -> Result<NamespaceConfig, ConfigError> {
    let nsid = namespace_id(cx, index, rn.nsid.as_ref(), earlier)?;
    let block_size = block_size(cx, rn.block_size.as_ref())?;
    let size_bytes = size_bytes(cx, rn.size.as_ref(), block_size)?;
    let kind = rn.backend.get_ref().parse::<BackendKind>();
    // Checked before the kind itself is, as they always were.
    if kind != Ok(BackendKind::Sim) {
        reject_sim_keys(cx, &rn)?;
    }
    let kind =
        kind.map_err(|e| cx.err(&rn.backend, "subsystem.namespace.backend", e.to_string()))?;
    let backend = match kind {
        BackendKind::Sim => sim_backend(cx, &rn, size_bytes)?,
        BackendKind::Ram => BackendConfig::Ram {
            size_bytes: memory_size(cx, kind, &rn, size_bytes)?,
        },
        BackendKind::Null => BackendConfig::Null {
            size_bytes: memory_size(cx, kind, &rn, size_bytes)?,
        },
        BackendKind::File => file_backend(cx, &rn, size_bytes)?,
    };
    debug_assert_eq!(backend.kind(), kind);
    let qos = rn.qos.map(Spanned::into_inner).unwrap_or_default();
    let gimbal = match rn.gimbal {
        None => GimbalConfig::default(),
        Some(g) => gimbal_parameters(cx, g, qos)?,
    };
    Ok(NamespaceConfig {
        nsid,
        backend,
        block_size,
        qos,
        gimbal,
        device_queue_depth: device_queue_depth(cx, rn.device_queue_depth)?,
        class_aging_us: rn
            .class_aging_us
            .unwrap_or(qos_core::class_arbiter::ArbiterConfig::default().aging_threshold_us),
    })
}

/// The given NSID, or the first free one from `index + 1` on.
fn namespace_id(
    cx: &Ctx,
    index: usize,
    nsid: Option<&Spanned<u32>>,
    earlier: &[NamespaceConfig],
) -> Result<u32, ConfigError> {
    let Some(n) = nsid else {
        let mut v = index as u32 + 1;
        while earlier.iter().any(|e| e.nsid == v) {
            v += 1;
        }
        // At most `index` namespaces came before: a free ID is found
        // before the counter could wrap.
        debug_assert!(v != 0 && v != u32::MAX);
        return Ok(v);
    };
    let v = *n.get_ref();
    if v == 0 || v == u32::MAX {
        return Err(cx.err(
            n,
            "subsystem.namespace.nsid",
            format!("{v} is not a valid namespace ID"),
        ));
    }
    if earlier.iter().any(|e| e.nsid == v) {
        return Err(cx.err(
            n,
            "subsystem.namespace.nsid",
            format!("namespace {v} is defined twice"),
        ));
    }
    Ok(v)
}

/// 512 (the default) or 4096.
fn block_size(cx: &Ctx, block_size: Option<&Spanned<u32>>) -> Result<u32, ConfigError> {
    let Some(b) = block_size else {
        return Ok(512);
    };
    if *b.get_ref() != 512 && *b.get_ref() != 4096 {
        return Err(cx.err(
            b,
            "subsystem.namespace.block_size",
            format!("{} must be 512 or 4096", b.get_ref()),
        ));
    }
    Ok(*b.get_ref())
}

/// The size in bytes, if given: a positive multiple of the block size.
fn size_bytes(
    cx: &Ctx,
    size: Option<&Spanned<SizeValue>>,
    block_size: u32,
) -> Result<Option<u64>, ConfigError> {
    let Some(s) = size else {
        return Ok(None);
    };
    let field = "subsystem.namespace.size";
    let bytes = match s.get_ref() {
        SizeValue::Bytes(b) => *b,
        SizeValue::Text(t) => parse_size(t).map_err(|e| cx.err(s, field, e.to_string()))?,
    };
    if bytes == 0 || bytes % u64::from(block_size) != 0 {
        return Err(cx.err(
            s,
            field,
            format!("{bytes} bytes is not a positive multiple of the block size {block_size}"),
        ));
    }
    Ok(Some(bytes))
}

/// `profile` and `time_scale` belong to `sim` namespaces only.
fn reject_sim_keys(cx: &Ctx, rn: &RawNamespace) -> Result<(), ConfigError> {
    if let Some(p) = &rn.profile {
        return Err(cx.err(
            p,
            "subsystem.namespace.profile",
            "only a `sim` namespace takes a profile",
        ));
    }
    if let Some(t) = &rn.time_scale {
        return Err(cx.err(
            t,
            "subsystem.namespace.time_scale",
            "only a `sim` namespace takes a time_scale",
        ));
    }
    Ok(())
}

/// The size a `ram`, `null` or `sim` namespace must have; a missing one is
/// reported at the `backend` key.
fn required_size(
    cx: &Ctx,
    kind: BackendKind,
    rn: &RawNamespace,
    size_bytes: Option<u64>,
) -> Result<u64, ConfigError> {
    size_bytes.ok_or_else(|| {
        cx.err(
            &rn.backend,
            "subsystem.namespace.size",
            format!("a `{kind}` namespace needs a size"),
        )
    })
}

fn sim_backend(
    cx: &Ctx,
    rn: &RawNamespace,
    size_bytes: Option<u64>,
) -> Result<BackendConfig, ConfigError> {
    let size_bytes = required_size(cx, BackendKind::Sim, rn, size_bytes)?;
    let time_scale = match &rn.time_scale {
        None => 1.0,
        Some(t) if t.get_ref().is_finite() && (1.0..=1e6).contains(t.get_ref()) => *t.get_ref(),
        Some(t) => {
            return Err(cx.err(
                t,
                "subsystem.namespace.time_scale",
                format!("{} must be between 1 and 1000000", t.get_ref()),
            ))
        }
    };
    Ok(BackendConfig::Sim {
        size_bytes,
        profile: rn
            .profile
            .as_ref()
            .map(|p| *p.get_ref())
            .unwrap_or_default(),
        time_scale,
    })
}

/// The size of a `ram` or `null` namespace, which takes no path.
fn memory_size(
    cx: &Ctx,
    kind: BackendKind,
    rn: &RawNamespace,
    size_bytes: Option<u64>,
) -> Result<u64, ConfigError> {
    let size_bytes = required_size(cx, kind, rn, size_bytes)?;
    if let Some(p) = &rn.path {
        return Err(cx.err(
            p,
            "subsystem.namespace.path",
            format!("a `{kind}` namespace takes no path"),
        ));
    }
    Ok(size_bytes)
}

/// `file`: a path; the size is optional.
fn file_backend(
    cx: &Ctx,
    rn: &RawNamespace,
    size_bytes: Option<u64>,
) -> Result<BackendConfig, ConfigError> {
    let Some(path) = &rn.path else {
        return Err(cx.err(
            &rn.backend,
            "subsystem.namespace.path",
            "a `file` namespace needs a path",
        ));
    };
    Ok(BackendConfig::File {
        path: path.get_ref().clone(),
        size_bytes,
    })
}

/// A `[subsystem.namespace.gimbal]` table: valid, and only with
/// `qos = "gimbal"`.
fn gimbal_parameters(
    cx: &Ctx,
    gimbal: Spanned<GimbalConfig>,
    qos: QosMode,
) -> Result<GimbalConfig, ConfigError> {
    if let Err(QosError::InvalidConfig { field, reason }) = gimbal.get_ref().validate() {
        // The table is deserialized whole: its fields have no spans of
        // their own, so the error points at the table and names the field
        // under it.
        return Err(ConfigError::at_span(
            cx.file,
            cx.source,
            gimbal.span(),
            Some(&format!("gimbal.{field}")),
            reason,
        ));
    }
    if qos != QosMode::Gimbal {
        return Err(cx.err(
            &gimbal,
            "subsystem.namespace.gimbal",
            "switch parameters given but qos is not \"gimbal\"",
        ));
    }
    Ok(gimbal.into_inner())
}

/// At least 1 when given; absent means unlimited.
fn device_queue_depth(cx: &Ctx, depth: Option<Spanned<u32>>) -> Result<Option<u32>, ConfigError> {
    match depth {
        Some(d) if *d.get_ref() == 0 => Err(cx.err(
            &d,
            "subsystem.namespace.device_queue_depth",
            "device_queue_depth must be at least 1 (leave it out for no limit)",
        )),
        d => Ok(d.map(Spanned::into_inner)),
    }
}
