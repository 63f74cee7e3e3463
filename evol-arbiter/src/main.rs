//! The `evol-arbiter` command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand};
use cluster_store::evol::{check, EvolKeys};
use cluster_store::{Store, StoreConfig};
use evol_arbiter::client::{ArbiterClient, ClientOptions};
use evol_arbiter::config::{ArbiterConfig, DEFAULT_PREFIX};
use evol_arbiter::{pb, scan};

/// evol-arbiter places the extents of elastic volumes (eVols: volumes of
/// 2 MiB extents spread over the namespaces of many NVMe/TCP targets, as
/// in Flint, "Building an Elastic Block Storage over EBOFs Using Shadow
/// Views") and shares the namespaces' bandwidth among their clients.
/// Instances run on several hosts; one leads, elected with an etcd lease,
/// and the others stand by to take over when its lease expires. The
/// leader answers ublk-nvmf's first writes to unmapped extents with the
/// extents' copies, written to etcd before the answer, and runs the
/// shadow view's controller and the bandwidth auction. `run` serves;
/// `pool`, `volume` and `status` talk to the leader; `check` reads etcd
/// directly and verifies that no physical extent is mapped twice (and,
/// with --scan-data, that every free one reads all zeros).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve (campaign for leadership, answer the RPC) until SIGTERM/SIGINT.
    Run {
        /// The TOML configuration (annotated in
        /// /etc/evol-arbiter/arbiter.toml as packaged).
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Check a config file and print what it describes.
    CheckConfig {
        /// The TOML configuration.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// The pool of namespaces extents are placed on.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Elastic volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// The leader's status.
    Status(Conn),
    /// Verify the extent maps in etcd (no arbiter needed): every copy's
    /// back pointer, no physical extent mapped twice, none beyond its
    /// namespace, copies on distinct namespaces. With --scan-data, also
    /// read every free physical extent over NVMe/TCP: it must be all
    /// zeros. Exits 1 on any finding.
    Check {
        /// etcd endpoints, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        /// Key prefix.
        #[arg(long, default_value = DEFAULT_PREFIX)]
        prefix: String,
        /// Also read every physical extent that is free in etcd (no pext
        /// key: neither mapped nor waiting for zeroing) from its namespace
        /// over NVMe/TCP, and report each one that is not all zeros as
        /// "written but unmapped". A client writes only extents the
        /// arbiter mapped durably, and freed extents are zeroed before
        /// they are freed, so a free extent holding data means a client
        /// wrote through a stale map or a bug freed a written extent: every
        /// written extent is mapped, checked against the drives rather
        /// than etcd alone. An extent found nonzero is reported only if
        /// etcd still says it is free when read again (it may have been
        /// mapped and written meanwhile). A namespace that cannot be
        /// connected to or read is a finding too. Reads use one I/O queue
        /// of the low priority class, at most 1 MiB (and the controller's
        /// maximum transfer) per command; one line is printed per
        /// namespace scanned.
        #[arg(long)]
        scan_data: bool,
        /// The host NQN --scan-data connects with (a target that allows
        /// only listed hosts must list it). Default: the system's
        /// (/etc/nvme/hostnqn), as the arbiter's zeroing and pool add
        /// connect, else a random one.
        #[arg(long, requires = "scan_data")]
        hostnqn: Option<String>,
    },
}

/// How admin commands reach the leader.
#[derive(Args, Clone)]
struct Conn {
    /// etcd endpoints, comma-separated: the leader is found in its leader key.
    #[arg(long, value_delimiter = ',', env = "EVOL_ARBITER_ENDPOINTS")]
    endpoints: Vec<String>,
    /// Key prefix.
    #[arg(long, default_value = DEFAULT_PREFIX)]
    prefix: String,
    /// An arbiter's HOST:PORT instead of (or before) etcd; a standby
    /// redirects to the leader.
    #[arg(long)]
    arbiter: Option<String>,
    /// Print JSON-like debug output instead of a table.
    #[arg(long)]
    verbose: bool,
}

#[derive(Subcommand)]
enum PoolCommand {
    /// Add a namespace (or grow or move one already in the pool). Its
    /// capacity is read from the target (Identify Namespace over NVMe/TCP)
    /// unless --extents is given.
    Add {
        #[command(flatten)]
        conn: Conn,
        /// Its name in the pool ([A-Za-z0-9_.-]).
        #[arg(long)]
        id: String,
        /// The target it is on (copies prefer distinct targets).
        #[arg(long)]
        target: String,
        /// The target's NVMe/TCP IP:PORT.
        #[arg(long)]
        address: String,
        /// The subsystem NQN.
        #[arg(long)]
        subnqn: String,
        /// The namespace ID.
        #[arg(long)]
        nsid: u32,
        /// Capacity in extents (overrides discovery).
        #[arg(long)]
        extents: Option<u64>,
    },
    /// List the pool's namespaces and their use.
    List(Conn),
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Create an eVol (capacity is reserved; extents are placed on first write).
    Create {
        #[command(flatten)]
        conn: Conn,
        /// Its name ([A-Za-z0-9_.-]).
        name: String,
        /// Size (bytes, or e.g. 10G, 512MiB).
        #[arg(long)]
        size: String,
        /// Copies of every extent, on distinct namespaces.
        #[arg(long, default_value_t = 1)]
        copies: u32,
        /// Bandwidth weight against other eVols.
        #[arg(long, default_value_t = 1)]
        weight: u32,
    },
    /// Delete an eVol: unmap its extents, then its spec. Its physical
    /// extents are zeroed before any other eVol gets them. Refused while a
    /// client host serves the eVol (its owner key in etcd).
    Delete {
        #[command(flatten)]
        conn: Conn,
        /// The eVol.
        name: String,
        /// Delete although a client host serves the eVol. DANGEROUS: that
        /// host's writes may land in extents reused by other volumes, and
        /// it may read their data. Only for a host known dead whose lease
        /// has not expired yet.
        #[arg(long)]
        force: bool,
    },
    /// Grow an eVol (never shrinks).
    Grow {
        #[command(flatten)]
        conn: Conn,
        /// The eVol.
        name: String,
        /// The new size.
        #[arg(long)]
        size: String,
    },
    /// List the eVols.
    List(Conn),
}

/// The hand-written parts of evol-arbiter(8).
const MAN: cli_docs::ManInfo = cli_docs::ManInfo {
    section: "8",
    sections: &[
        cli_docs::Section {
            title: "FILES",
            entries: &[(
                "/etc/evol-arbiter/arbiter.toml",
                "The configuration the systemd unit evol-arbiter.service serves, installed \
                 annotated as a conffile: one arbiter on loopback with a local etcd member. \
                 Give every host's arbiter its own id, an address the clients reach and the \
                 cluster's etcd endpoints; check it with evol-arbiter check-config.",
            )],
        },
        cli_docs::Section {
            title: "ENVIRONMENT",
            entries: &[
                (
                    "RUST_LOG",
                    "Log level: error, warn, info (the default), debug, trace.",
                ),
                (
                    "EVOL_ARBITER_ENDPOINTS",
                    "etcd endpoints of the admin commands, comma-separated.",
                ),
            ],
        },
        cli_docs::Section {
            title: "SEE ALSO",
            entries: &[("", "ublk-nvmf(8), gimbal-target(8), etcd(1).")],
        },
    ],
};

fn client(conn: &Conn) -> anyhow::Result<ArbiterClient> {
    let mut o = ClientOptions::new(conn.endpoints.clone(), &conn.prefix);
    o.arbiter = conn.arbiter.clone();
    Ok(ArbiterClient::connect(o)?)
}

fn size(s: &str) -> anyhow::Result<u64> {
    config_diag::parse_size(s).map_err(|e| anyhow::anyhow!("size `{s}`: {e}"))
}

fn print_volumes(v: &[pb::VolumeInfo]) {
    println!(
        "{:<24} {:>16} {:>6} {:>6} {:>10}",
        "NAME", "SIZE", "COPIES", "WEIGHT", "MAPPED"
    );
    for v in v {
        println!(
            "{:<24} {:>16} {:>6} {:>6} {:>10}",
            v.name, v.size_bytes, v.copies, v.weight, v.mapped_extents
        );
    }
}

/// Capacity of a namespace read from its target.
fn discover_bytes(address: &str, subnqn: &str, nsid: u32) -> anyhow::Result<u64> {
    let addr: std::net::SocketAddr = address
        .parse()
        .with_context(|| format!("--address {address}: not IP:PORT (discovery needs one)"))?;
    let mut opts = nvmf_initiator::blocking::ConnectOptions::new(addr, subnqn);
    opts.connect_timeout = std::time::Duration::from_secs(5);
    let ctrl = nvmf_initiator::blocking::Controller::connect(opts)
        .with_context(|| format!("connecting to {subnqn} at {address} (or give --extents)"))?;
    let ns = ctrl
        .identify_namespace(nsid)
        .with_context(|| format!("Identify Namespace {nsid}"))?;
    let _ = ctrl.disconnect();
    Ok(ns.blocks * u64::from(ns.block_size))
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config } => {
            let c = ArbiterConfig::load(&config)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("arbiter")
                .build()?;
            rt.block_on(async {
                let running = evol_arbiter::server::start(c).await?;
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                log::info!("stopping");
                running.stop().await;
                anyhow::Ok(())
            })?;
        }
        Command::CheckConfig { config } => {
            let c = ArbiterConfig::load(&config)?;
            println!(
                "arbiter {} on {}, etcd {} (prefix {}, lease {} s), extents of {} bytes",
                c.id,
                c.listen,
                c.etcd.endpoints.join(","),
                c.etcd.prefix,
                c.etcd.lease_ttl.as_secs(),
                c.extent_bytes
            );
        }
        Command::Pool(PoolCommand::Add {
            conn,
            id,
            target,
            address,
            subnqn,
            nsid,
            extents,
        }) => {
            let (extents, capacity_bytes) = match extents {
                Some(e) => (e, 0),
                None => (0, discover_bytes(&address, &subnqn, nsid)?),
            };
            let n = client(&conn)?.add_namespace(&pb::AddNamespaceRequest {
                id,
                target,
                address,
                subnqn,
                nsid,
                extents,
                capacity_bytes,
            })?;
            println!(
                "namespace {}: {} extents of {} bytes ({} used)",
                n.id, n.extents, n.extent_bytes, n.used_extents
            );
        }
        Command::Pool(PoolCommand::List(conn)) => {
            let list = client(&conn)?.list_namespaces()?;
            println!(
                "{:<16} {:<12} {:<22} {:>5} {:>10} {:>10} {:>10}",
                "ID", "TARGET", "ADDRESS", "NSID", "EXTENTS", "USED", "FREE"
            );
            for n in list {
                println!(
                    "{:<16} {:<12} {:<22} {:>5} {:>10} {:>10} {:>10}",
                    n.id, n.target, n.address, n.nsid, n.extents, n.used_extents, n.free_extents
                );
            }
        }
        Command::Volume(VolumeCommand::Create {
            conn,
            name,
            size: s,
            copies,
            weight,
        }) => {
            let v = client(&conn)?.create_volume(&name, size(&s)?, copies, weight)?;
            print_volumes(&[v]);
        }
        Command::Volume(VolumeCommand::Delete { conn, name, force }) => {
            let freed = client(&conn)?.delete_volume(&name, force)?;
            println!("eVol {name} deleted; {freed} physical extents freed (zeroed before reuse)");
        }
        Command::Volume(VolumeCommand::Grow {
            conn,
            name,
            size: s,
        }) => {
            let v = client(&conn)?.grow_volume(&name, size(&s)?)?;
            print_volumes(&[v]);
        }
        Command::Volume(VolumeCommand::List(conn)) => {
            print_volumes(&client(&conn)?.list_volumes()?);
        }
        Command::Status(conn) => {
            let s = client(&conn)?.status()?;
            if conn.verbose {
                println!("{s:#?}");
            } else {
                println!(
                    "arbiter {}: {}; leader {} at {} (revision {})\n{} namespaces, {} eVols, {} extents mapped, {} free, {} waiting for zeroing ({} zeroed, {} zeroing failures); view epoch {}, auction epoch {}",
                    s.id,
                    if s.leading { "leading" } else { "standby" },
                    s.leader_id,
                    s.leader_address,
                    s.leadership_revision,
                    s.namespaces,
                    s.volumes,
                    s.mapped_extents,
                    s.free_extents,
                    s.zeroing_extents,
                    s.zeroed_extents,
                    s.zeroing_failures,
                    s.view_epoch,
                    s.auction_epoch
                );
            }
        }
        Command::Check {
            endpoints,
            prefix,
            scan_data,
            hostnqn,
        } => {
            let store = Store::connect(StoreConfig {
                endpoints,
                op_timeout: std::time::Duration::from_secs(5),
            })?;
            let keys = EvolKeys::new(&prefix);
            let view = store.read_pool(&keys)?;
            let findings = check(&view);
            println!(
                "{} namespaces, {} eVols, {} extents mapped, {} physical extents used, {} waiting for zeroing (revision {})",
                view.namespaces.len(),
                view.evols.len(),
                view.extents.len(),
                view.pexts.len(),
                view.zeroing.len(),
                view.revision
            );
            for f in &findings {
                println!("FINDING: {f:?}");
            }
            let mut count = findings.len();
            if scan_data {
                let host = hostnqn.as_deref().map(scan::host_identity);
                let scanned = scan::scan_free_extents(&store, &keys, &view, host.as_ref(), |s| {
                    println!(
                        "namespace {}: {} of {} free extents scanned, {} finding(s){}",
                        s.namespace,
                        s.scanned,
                        s.free,
                        s.findings.len(),
                        if s.raced > 0 {
                            format!(" ({} in use since the etcd read, skipped)", s.raced)
                        } else {
                            String::new()
                        }
                    );
                    for f in &s.findings {
                        println!("FINDING: {f}");
                    }
                    // Progress, not buffered behind a long scan.
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                });
                count += scanned.len();
            }
            if count > 0 {
                println!("{count} finding(s)");
                return Ok(ExitCode::FAILURE);
            }
            println!("no findings");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    config_diag::logging::init_logging("info");
    if let Some(status) = cli_docs::generate_if_asked(Cli::command, &MAN) {
        return status;
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("evol-arbiter: {e:#}");
            ExitCode::from(2)
        }
    }
}
