//! The arbiter's TOML configuration (`evol-arbiter run --config FILE`).
//!
//! ```toml
//! id = "arbiter-a"                  # unique per instance (the leader key names it)
//! listen = "127.0.0.1:7450"         # the RPC (port 0: any free port)
//! advertise = "10.0.0.5:7450"       # optional: the address clients dial (default: listen)
//! extent_bytes = "2MiB"             # optional: the pool's extent size
//!
//! [etcd]
//! endpoints = ["http://127.0.0.1:2379"]
//! prefix = "/ublk-nvmf"             # as ublk-nvmf's [cluster] prefix
//! lease_ttl = 5                     # seconds; keep-alive every ttl/3
//! op_timeout_ms = 500               # bound on one etcd request (default: ttl/3 / endpoints, at most 1000)
//!
//! [placement]                       # flint_core::placement::PlacementWeights
//! extents = 1.0
//! capacity_used = 1.0
//! busy = 2.0
//! write_cost = 1.0
//! preference = 1.0
//!
//! [profile]                         # what the view and auction assume of
//! read_bytes_per_sec = 3000000000   # every namespace and port until
//! read_iops = 700000                # profiles are per namespace
//! port_bytes_per_sec = 3125000000
//!
//! [view]                            # flint_core::view::ViewConfig
//! epoch_ns = 100000000              # the arbiter's default: 100 ms (gRPC)
//! [auction]                         # flint_core::auction::AuctionConfig
//! epoch_ns = 10000000               # the arbiter's default: 10 ms (gRPC)
//!
//! [metrics]
//! listen = "127.0.0.1:9752"         # optional: Prometheus at /metrics
//! ```
//!
//! Every error names the file, line and field ([`ConfigError`]).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use config_diag::ConfigError;
use config_diag::Ctx;
use flint_core::auction::AuctionConfig;
use flint_core::placement::PlacementWeights;
use flint_core::view::ViewConfig;
use serde::Deserialize;
use toml::Spanned;

use crate::limits;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct ArbiterConfig {
    /// This instance's name.
    pub id: String,
    /// Where the RPC listens.
    pub listen: SocketAddr,
    /// What the leader key tells clients to dial (default: the bound
    /// listen address).
    pub advertise: Option<String>,
    /// The pool's extent size.
    pub extent_bytes: u64,
    /// etcd.
    pub etcd: EtcdConfig,
    /// The placement score's weights.
    pub placement: PlacementWeights,
    /// Assumed device and port speeds.
    pub profile: Profile,
    /// The view controller's parameters.
    pub view: ViewConfig,
    /// The auction's parameters.
    pub auction: AuctionConfig,
    /// Prometheus metrics address, if any.
    pub metrics_listen: Option<SocketAddr>,
}

/// The `[etcd]` table.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Member URLs.
    pub endpoints: Vec<String>,
    /// Key prefix.
    pub prefix: String,
    /// The leader lease's TTL.
    pub lease_ttl: Duration,
    /// Bound on one etcd request.
    pub op_timeout: Duration,
}

/// The `[profile]` table: what the view and the auction assume of a
/// namespace and a target port (per-namespace profiles are not built).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Profile {
    /// A namespace's read bandwidth, bytes per second.
    pub read_bytes_per_sec: u64,
    /// A namespace's read IOPS.
    pub read_iops: u64,
    /// A target port's bandwidth per direction, bytes per second.
    pub port_bytes_per_sec: u64,
}

impl Default for Profile {
    fn default() -> Self {
        // A datacenter NVMe drive and a 25 GbE port.
        Profile {
            read_bytes_per_sec: 3_000_000_000,
            read_iops: 700_000,
            port_bytes_per_sec: 3_125_000_000,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    id: Spanned<String>,
    listen: Spanned<String>,
    advertise: Option<Spanned<String>>,
    extent_bytes: Option<Spanned<toml::Value>>,
    etcd: RawEtcd,
    placement: Option<Spanned<PlacementWeights>>,
    profile: Option<Spanned<Profile>>,
    view: Option<Spanned<ViewConfig>>,
    auction: Option<Spanned<AuctionConfig>>,
    metrics: Option<RawMetrics>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    endpoints: Spanned<Vec<String>>,
    prefix: Option<Spanned<String>>,
    lease_ttl: Option<Spanned<i64>>,
    op_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<Spanned<String>>,
}

/// The default key prefix (ublk-nvmf's).
pub const DEFAULT_PREFIX: &str = "/ublk-nvmf";

impl ArbiterConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let source = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        Self::parse(path, &source)
    }

    /// Parses and validates `source`; `path` is named in errors.
    pub fn parse(path: &Path, source: &str) -> Result<Self, ConfigError> {
        let raw: Raw =
            toml::from_str(source).map_err(|e| ConfigError::from_toml(path, source, &e))?;
        let cx = Ctx { file: path, source };
        limits::check_name("id", raw.id.get_ref()).map_err(|m| cx.err(&raw.id, "id", m))?;
        let listen = raw.listen.get_ref().parse::<SocketAddr>().map_err(|_| {
            cx.err(
                &raw.listen,
                "listen",
                format!("`{}` is not an IP:port address", raw.listen.get_ref()),
            )
        })?;
        let advertise = match &raw.advertise {
            None => None,
            Some(a) => {
                let ok = a
                    .get_ref()
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
                if !ok {
                    return Err(cx.err(a, "advertise", "expected HOST:PORT with a nonzero port"));
                }
                Some(a.get_ref().clone())
            }
        };
        let extent_bytes = match &raw.extent_bytes {
            None => cluster_store::evol::DEFAULT_EXTENT_BYTES,
            Some(v) => {
                let n = match v.get_ref() {
                    toml::Value::Integer(i) => u64::try_from(*i).map_err(|_| "negative".to_owned()),
                    toml::Value::String(s) => config_diag::parse_size(s).map_err(|e| e.to_string()),
                    _ => Err("expected a size (bytes, or a string like \"2MiB\")".to_owned()),
                }
                .map_err(|m| cx.err(v, "extent_bytes", m))?;
                if !n.is_power_of_two() || n < 4096 {
                    return Err(cx.err(
                        v,
                        "extent_bytes",
                        format!("{n} is not a power of two of at least 4096"),
                    ));
                }
                n
            }
        };
        let e = &raw.etcd;
        if e.endpoints.get_ref().is_empty() {
            return Err(cx.err(&e.endpoints, "etcd.endpoints", "at least one endpoint"));
        }
        let prefix = match &e.prefix {
            None => DEFAULT_PREFIX.to_owned(),
            Some(p) => {
                let s = p.get_ref();
                if !s.starts_with('/') || s.len() > 128 || s.contains(char::is_whitespace) {
                    return Err(cx.err(
                        p,
                        "etcd.prefix",
                        "a key prefix starting with '/', at most 128 characters, no spaces",
                    ));
                }
                s.clone()
            }
        };
        let lease_ttl = cx.int(&e.lease_ttl, "etcd.lease_ttl", 5, 2..=600)?;
        // Unset, the bound is derived so that a keep-alive tried on every
        // member fits in ttl/3 (at most 1 s): three members and the
        // default 5 s lease give 555 ms, rather than an error for a config
        // that names no timeout at all.
        let n = e.endpoints.get_ref().len().max(1) as i64;
        let derived = ((lease_ttl * 1000 / 3 - 1) / n).clamp(50, 1000);
        let op_timeout_ms = cx.int(&e.op_timeout_ms, "etcd.op_timeout_ms", derived, 50..=60_000)?;
        // Keep-alive every ttl/3 must fit a request to every member.
        if op_timeout_ms * e.endpoints.get_ref().len() as i64 >= lease_ttl * 1000 / 3 {
            let span = e
                .op_timeout_ms
                .as_ref()
                .map_or_else(|| e.endpoints.span(), |s| s.span());
            return Err(ConfigError::at_span(
                path,
                source,
                span,
                Some("op_timeout_ms"),
                format!(
                    "op_timeout_ms x endpoints ({} ms) must stay below lease_ttl / 3 ({} ms): a keep-alive must fit before the lease runs out",
                    op_timeout_ms * e.endpoints.get_ref().len() as i64,
                    lease_ttl * 1000 / 3
                ),
            ));
        }
        let placement = flint_table(&cx, raw.placement, "placement", |w: &PlacementWeights| {
            w.validate()
        })?;
        let profile = flint_table(&cx, raw.profile, "profile", |p: &Profile| {
            for (f, v) in [
                ("read_bytes_per_sec", p.read_bytes_per_sec),
                ("read_iops", p.read_iops),
                ("port_bytes_per_sec", p.port_bytes_per_sec),
            ] {
                if v == 0 {
                    return Err(flint_core::FlintError::invalid(f, "must be positive"));
                }
            }
            Ok(())
        })?;
        // Likewise the view: clients report aggregated once per epoch over
        // gRPC, so the arbiter's epoch is longer than flint-core's 10 ms,
        // and vectors go stale after two epochs unless the config says.
        let (view_epoch_given, stale_given) = (
            given(source, "view", "epoch_ns"),
            given(source, "view", "stale_after_ns"),
        );
        let mut view = flint_table(&cx, raw.view, "view", |v: &ViewConfig| {
            v.validate()?;
            if v.max_batch > limits::MAX_REPORT_BATCH {
                return Err(flint_core::FlintError::invalid(
                    "max_batch",
                    format!("at most {}", limits::MAX_REPORT_BATCH),
                ));
            }
            Ok(())
        })?;
        // flint-core's 1 ms epoch suits its simulated fabric; over gRPC a
        // slice must outlive a round trip (it expires at the end of the
        // epoch after the granting one): the arbiter's default is longer.
        if !view_epoch_given {
            view.epoch_ns = DEFAULT_VIEW_EPOCH_NS;
        }
        if !stale_given {
            view.stale_after_ns = view.epoch_ns.saturating_mul(2);
        }
        let epoch_given = given(source, "auction", "epoch_ns");
        let mut auction = flint_table(&cx, raw.auction, "auction", |a: &AuctionConfig| {
            a.validate()
        })?;
        if !epoch_given {
            auction.epoch_ns = DEFAULT_AUCTION_EPOCH_NS;
        }
        let metrics_listen = match &raw.metrics {
            None => None,
            Some(m) => cx.listen_addr(&m.listen, "metrics.listen")?,
        };
        Ok(ArbiterConfig {
            id: raw.id.into_inner(),
            listen,
            advertise,
            extent_bytes,
            etcd: EtcdConfig {
                endpoints: e.endpoints.get_ref().clone(),
                prefix,
                lease_ttl: Duration::from_secs(lease_ttl as u64),
                op_timeout: Duration::from_millis(op_timeout_ms as u64),
            },
            placement,
            profile,
            view,
            auction,
            metrics_listen,
        })
    }
}

/// Whether the TOML `source` sets `[table] field` (the arbiter's own
/// defaults differ from flint-core's for a few fields).
fn given(source: &str, table: &str, field: &str) -> bool {
    toml::from_str::<toml::Table>(source)
        .is_ok_and(|t| t.get(table).and_then(|a| a.get(field)).is_some())
}

/// The view's epoch when the config does not set `[view] epoch_ns`
/// (100 ms: clients report aggregated once per epoch over gRPC);
/// `stale_after_ns` is then two epochs unless set.
pub const DEFAULT_VIEW_EPOCH_NS: u64 = 100_000_000;

/// The auction's epoch when the config does not set `[auction] epoch_ns`:
/// 10 ms, well above a gRPC round trip (see `docs/evol.md`).
pub const DEFAULT_AUCTION_EPOCH_NS: u64 = 10_000_000;

/// A table deserialized straight into a flint-core config: its own
/// validation's field, prefixed with the table's name, at the table.
fn flint_table<T: Default>(
    cx: &Ctx<'_>,
    value: Option<Spanned<T>>,
    table: &str,
    validate: impl Fn(&T) -> flint_core::Result<()>,
) -> Result<T, ConfigError> {
    let Some(v) = value else {
        return Ok(T::default());
    };
    if let Err(e) = validate(v.get_ref()) {
        let (field, msg) = match &e {
            flint_core::FlintError::InvalidConfig { field, reason } => {
                (format!("{table}.{field}"), reason.clone())
            }
            other => (table.to_owned(), other.to_string()),
        };
        let mut err = cx.err(&v, &field, msg);
        err.field = field;
        return Err(err);
    }
    Ok(v.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"id = "a"
listen = "127.0.0.1:0"

[etcd]
endpoints = ["http://127.0.0.1:2379"]
"#;

    fn parse(s: &str) -> Result<ArbiterConfig, ConfigError> {
        ArbiterConfig::parse(Path::new("arb.toml"), s)
    }

    #[test]
    fn the_auction_epoch_defaults_to_what_outlives_a_round_trip() {
        assert_eq!(
            parse(GOOD).unwrap().auction.epoch_ns,
            DEFAULT_AUCTION_EPOCH_NS
        );
        let c = parse(&format!(
            "{GOOD}\n[view]\nepoch_ns = 5000000\n[auction]\nslice_bytes = 65536\n"
        ))
        .unwrap();
        assert_eq!(
            (
                c.auction.epoch_ns,
                c.auction.slice_bytes,
                c.view.epoch_ns,
                c.view.stale_after_ns
            ),
            (DEFAULT_AUCTION_EPOCH_NS, 65536, 5_000_000, 10_000_000)
        );
        assert_eq!(parse(GOOD).unwrap().view, arbiter_view_default());
        let c = parse(&format!("{GOOD}\n[auction]\nepoch_ns = 2000000\n")).unwrap();
        assert_eq!(c.auction.epoch_ns, 2_000_000);
    }

    #[test]
    fn defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.etcd.prefix, DEFAULT_PREFIX);
        assert_eq!(c.etcd.lease_ttl, Duration::from_secs(5));
        assert_eq!(c.extent_bytes, 2 << 20);
        assert_eq!(c.placement, PlacementWeights::default());
    }

    /// The view's defaults as the arbiter sets them (its epoch).
    fn arbiter_view_default() -> ViewConfig {
        ViewConfig {
            epoch_ns: DEFAULT_VIEW_EPOCH_NS,
            stale_after_ns: 2 * DEFAULT_VIEW_EPOCH_NS,
            ..ViewConfig::default()
        }
    }

    /// The auction's defaults as the arbiter sets them (its epoch).
    fn arbiter_auction_default() -> AuctionConfig {
        AuctionConfig {
            epoch_ns: DEFAULT_AUCTION_EPOCH_NS,
            ..AuctionConfig::default()
        }
    }

    #[test]
    fn the_shipped_example_parses() {
        // Packaged as /etc/evol-arbiter/arbiter.toml (a conffile).
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/arbiter.toml");
        let c = ArbiterConfig::load(&p).unwrap();
        assert_eq!(c.id, "arbiter-1");
        assert_eq!(c.listen, "127.0.0.1:7450".parse().unwrap());
        assert_eq!(c.advertise, None);
        assert_eq!(c.etcd.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(c.etcd.prefix, DEFAULT_PREFIX);
        assert_eq!(c.etcd.lease_ttl, Duration::from_secs(5));
        assert_eq!(c.extent_bytes, cluster_store::evol::DEFAULT_EXTENT_BYTES);
        assert_eq!(c.metrics_listen, None);
        assert_eq!(c.placement, PlacementWeights::default());
        assert_eq!(c.view, arbiter_view_default());
        assert_eq!(c.auction, arbiter_auction_default());

        // The commented-out tuning tables claim to show the defaults:
        // uncommented, they must parse to exactly the defaults.
        let text = std::fs::read_to_string(&p).unwrap();
        let (head, tuning) = text.split_once("# The rest tunes").unwrap();
        let uncommented: String = tuning
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| l.starts_with('[') || l.contains(" = "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(uncommented.contains("[auction]"), "{uncommented}");
        let t = parse(&format!("{head}{uncommented}")).unwrap();
        assert_eq!(t.placement, PlacementWeights::default());
        let d = Profile::default();
        assert_eq!(
            (
                t.profile.read_bytes_per_sec,
                t.profile.read_iops,
                t.profile.port_bytes_per_sec
            ),
            (d.read_bytes_per_sec, d.read_iops, d.port_bytes_per_sec)
        );
        assert_eq!(t.view, arbiter_view_default());
        assert_eq!(t.auction, arbiter_auction_default());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse(&format!("{GOOD}lease_ttl = 1\n")).unwrap_err();
        assert!(e.to_string().starts_with("arb.toml:6:"), "{e}");
        let e = parse(&GOOD.replace("[etcd]", "[placement]\nbusy = -1.0\n[etcd]")).unwrap_err();
        assert_eq!(e.field, "placement.busy", "{e}");
        assert_eq!(e.line, 4, "{e}");
        let e = parse(&GOOD.replace("\"a\"", "\"a/b\"")).unwrap_err();
        assert!(e.to_string().starts_with("arb.toml:1:6: field `id`"), "{e}");
    }

    #[test]
    fn op_timeout_defaults_to_what_fits_a_keep_alive_on_every_member() {
        let three = GOOD.replace(
            r#"["http://127.0.0.1:2379"]"#,
            r#"["127.0.0.1:2379", "127.0.0.1:12379", "127.0.0.1:22379"]"#,
        );
        let c = parse(&three).unwrap();
        assert_eq!(c.etcd.op_timeout, Duration::from_millis(555));
        assert_eq!(parse(GOOD).unwrap().etcd.op_timeout, Duration::from_secs(1));
        // Given explicitly, a bound that cannot fit is still refused.
        let e = parse(&format!("{three}op_timeout_ms = 1000\n")).unwrap_err();
        assert_eq!(e.field, "etcd.op_timeout_ms", "{e}");
    }
}
