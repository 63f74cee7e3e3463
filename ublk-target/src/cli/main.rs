//! The `ublk-nvmf` command.

mod daemon;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, CommandFactory, Parser, Subcommand};
use config_diag::parse_size;
use nvmf_initiator::blocking::{discover, ConnectOptions, Controller, DhchapKeys, HostIdentity};
use nvmf_initiator::ReconnectPolicy;
use nvmf_proto::auth::DhchapSecret;
use ublk_target::bench::{self, BenchOptions, Pattern};
use ublk_target::config::ConnectArgs;

/// Shown by `--help` and as the DESCRIPTION of ublk-nvmf(8).
const LONG_ABOUT: &str = "\
ublk-nvmf serves a volume, a namespace on an NVMe/TCP target or mirrored on \
several, as the block device /dev/ublkbN, with client-side QoS: Gimbal \
credits, io.max-style rate limits, I/O priority classes and replica load \
balancing.

Each volume is one TOML file. Under systemd, ublk-nvmf@NAME.service runs \
`ublk-nvmf run --config /etc/ublk-nvmf/NAME.toml`; without it, `add` starts \
a volume in the background and `del` stops it. A server that dies leaves its \
device in place, and `recover` (or systemd's restart) reattaches it. \
`status`, `set` and `reload` talk to a running volume; `discover`, \
`identify` and `bench` reach a target without a block device.";

#[derive(Parser)]
#[command(
    name = "ublk-nvmf",
    version,
    about = "Block devices over NVMe/TCP",
    long_about = LONG_ABOUT
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the subsystems a target's discovery controller offers.
    Discover(TargetArgs),
    /// Show a controller's Identify data and its namespaces.
    Identify(SubsystemArgs),
    /// Load a namespace with fio-like I/O through the embedded initiator.
    Bench(BenchArgs),
    /// Serve a volume as /dev/ublkbN in the foreground (for systemd).
    Run {
        /// Volume config file (TOML).
        #[arg(long)]
        config: std::path::PathBuf,
        /// Cluster mode: attach even if another host owns the volume; the
        /// new attach epoch fences the old owner at the targets.
        #[arg(long)]
        takeover: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics (IP:port),
        /// overriding `[metrics] listen` in the volume file. One port per
        /// volume; loopback or a management network only.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Start a volume in the background; prints its device once live.
    /// Either from a volume file (--config), or in one line with nvme-cli's
    /// connect options (-t tcp -a ADDR -s PORT -n NQN ...), which writes the
    /// volume file they imply to --config-dir so systemd can take it over.
    Add {
        /// Volume config file (TOML).
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// Cluster mode: attach even if another host owns the volume; the
        /// new attach epoch fences the old owner at the targets.
        #[arg(long)]
        takeover: bool,
        #[command(flatten)]
        connect: AddConnect,
    },
    /// Cluster mode: move a volume to this host now, fencing its current
    /// owner at the targets (its writes fail with Reservation Conflict);
    /// the same as `add --config DIR/NAME.toml --takeover`.
    Takeover {
        /// Volume name.
        name: String,
        /// Where NAME.toml is.
        #[arg(long, default_value = "/etc/ublk-nvmf")]
        config_dir: std::path::PathBuf,
    },
    /// Stop a volume's server and delete its device.
    Del {
        /// Volume name.
        name: String,
    },
    /// List volumes with saved state (a table; --json: the schema in
    /// docs/architecture.md, "ublk-nvmf list --json").
    List {
        /// JSON (schema 1) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// A running volume's counters.
    Status {
        /// Volume name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a running volume's QoS settings (no restart, no lost I/O):
    /// riops, wiops, rbps, wbps (0 or max: unlimited; k/m/g suffixes),
    /// their *_burst, credits=auto|target|estimate|off; and, with zero
    /// copy, write_pages_min=SIZE|max: writes of at least SIZE are sent
    /// from the request's pages, smaller ones read into our buffer first
    /// (their large pieces spliced to the socket); default max (never);
    /// read_wait_min=SIZE|max|default: a read's data of at least SIZE
    /// still due is received in one receive that waits until all of it
    /// has arrived, smaller pieces take what has arrived; default 256k;
    /// head_copy_min=SIZE|max|default: a spliced piece of write data of
    /// at least SIZE takes its PDU header along in the same splice (from
    /// a per-request copy), max sends every header on its own; default
    /// 32k.
    Set {
        /// Volume name.
        name: String,
        /// key=value settings.
        #[arg(required = true)]
        settings: Vec<String>,
    },
    /// Re-read a running volume's config file and apply its `[qos]` section.
    Reload {
        /// Volume name.
        name: String,
    },
    /// Reattach a device whose server died (same /dev/ublkbN; in-flight I/O
    /// is reissued).
    Recover {
        /// Volume name.
        name: String,
    },
    /// Try it: a gimbal-target child process (the binary next to this one,
    /// $GIMBAL_TARGET, or on PATH) with a RAM namespace on loopback and
    /// /dev/ublkbN over it, until Ctrl-C.
    Demo {
        /// Size of the RAM namespace.
        #[arg(long, default_value = "1GiB")]
        size: String,
    },
    /// For udev: print the volume name of a kernel device (ublkb0, ublkb0p1).
    UdevName {
        /// Kernel device name.
        kernel: String,
    },
}

/// The hand-written parts of ublk-nvmf(8).
const MAN: cli_docs::ManInfo = cli_docs::ManInfo {
    section: "8",
    sections: &[
        cli_docs::Section {
            title: "FILES",
            entries: &[
                (
                    "/etc/ublk-nvmf/NAME.toml",
                    "Volume NAME's configuration, served by the systemd unit ublk-nvmf@NAME.service. \
                     An annotated example is /usr/share/doc/ublk-nvmf/examples/volume.toml.",
                ),
                (
                    "/lib/systemd/system/ublk-nvmf@.service",
                    "The unit that serves volume NAME as ublk-nvmf@NAME.service: active once the \
                     device is live, restarted (recovering the same device) if the server dies.",
                ),
                (
                    "/run/ublk-nvmf/",
                    "NAME.json, the saved state of a live device (a restarted server recovers the \
                     same /dev/ublkbN from it), NAME.sock, the running server's control socket \
                     (status, set, reload, del), and neighbours/, one small shared file per target \
                     namespace in which this host's volumes publish their latency to each other's \
                     gain probes ([qos] estimate_neighbours).",
                ),
                (
                    "/var/lib/ublk-nvmf/",
                    "The generated host identity (hostnqn, hostid) and mirrored volumes' \
                     write-intent bitmaps (NAME.bitmap).",
                ),
                (
                    "/dev/disk/by-id/ublk-nvmf-NAME",
                    "Stable name of volume NAME's device, from the udev rule 99-ublk-nvmf.rules.",
                ),
            ],
        },
        cli_docs::Section {
            title: "ENVIRONMENT",
            entries: &[
                ("RUST_LOG", "Log level: error, warn (the default), info, debug, trace."),
                ("UBLK_NVMF_RUN_DIR", "Instead of /run/ublk-nvmf."),
                ("UBLK_NVMF_LIB_DIR", "Instead of /var/lib/ublk-nvmf."),
                (
                    "GIMBAL_TARGET",
                    "The gimbal-target binary demo starts (default: next to ublk-nvmf, else on PATH).",
                ),
            ],
        },
        cli_docs::Section {
            title: "SEE ALSO",
            entries: &[(
                "",
                "gimbal-target(8), systemctl(1), ionice(1), udev(7).",
            )],
        },
    ],
};

/// `add`'s one-line form: nvme-cli's `connect` options.
#[derive(Args, Clone, Default)]
struct AddConnect {
    /// Transport (nvme-cli's -t): tcp.
    #[arg(short = 't', long = "transport", value_name = "TRTYPE")]
    transport: Option<String>,
    /// Target address.
    #[arg(short = 'a', long = "traddr")]
    traddr: Option<String>,
    /// Target TCP port (default 4420).
    #[arg(short = 's', long = "trsvcid")]
    trsvcid: Option<u16>,
    /// Subsystem NQN.
    #[arg(short = 'n', long = "nqn")]
    nqn: Option<String>,
    /// Namespace ID (default 1).
    #[arg(long)]
    nsid: Option<u32>,
    /// Volume name (default: the NQN's last part and the NSID).
    #[arg(long)]
    name: Option<String>,
    /// ublk queues, each with its own NVMe/TCP I/O queue.
    #[arg(short = 'i', long)]
    nr_io_queues: Option<u16>,
    /// Requests in flight per queue.
    #[arg(short = 'Q', long)]
    queue_size: Option<u16>,
    /// Give up reconnecting after this many seconds (-1: never).
    #[arg(short = 'l', long, allow_hyphen_values = true)]
    ctrl_loss_tmo: Option<i64>,
    /// Seconds between reconnect attempts.
    #[arg(short = 'c', long)]
    reconnect_delay: Option<i64>,
    /// Keep Alive timeout in seconds.
    #[arg(short = 'k', long)]
    keep_alive_tmo: Option<i64>,
    /// Host NQN (default: the identity kept in /var/lib/ublk-nvmf).
    #[arg(short = 'q', long)]
    hostnqn: Option<String>,
    /// Host identifier (a UUID).
    #[arg(short = 'I', long)]
    hostid: Option<String>,
    /// Ask for NVMe/TCP header digests.
    #[arg(short = 'g', long)]
    hdr_digest: bool,
    /// Ask for NVMe/TCP data digests.
    #[arg(short = 'G', long)]
    data_digest: bool,
    /// DH-HMAC-CHAP secret of this host.
    #[arg(short = 'S', long, value_name = "SECRET")]
    dhchap_secret: Option<String>,
    /// DH-HMAC-CHAP secret the controller must prove it knows.
    #[arg(short = 'C', long, value_name = "SECRET")]
    dhchap_ctrl_secret: Option<String>,
    /// Where the one-line form writes NAME.toml (ublk-nvmf@NAME reads
    /// /etc/ublk-nvmf/NAME.toml).
    #[arg(long, value_name = "DIR", default_value = "/etc/ublk-nvmf")]
    config_dir: std::path::PathBuf,
}

impl AddConnect {
    /// Whether any connect option was given.
    fn given(&self) -> bool {
        self.transport.is_some() || self.traddr.is_some() || self.nqn.is_some()
    }

    fn to_args(&self) -> anyhow::Result<ConnectArgs> {
        let (Some(transport), Some(traddr), Some(nqn)) = (&self.transport, &self.traddr, &self.nqn)
        else {
            bail!("add needs --config FILE, or -t tcp -a ADDR -n NQN (nvme-cli's connect options)");
        };
        Ok(ConnectArgs {
            transport: transport.clone(),
            traddr: traddr.clone(),
            trsvcid: self.trsvcid,
            nqn: nqn.clone(),
            nsid: self.nsid,
            name: self.name.clone(),
            nr_io_queues: self.nr_io_queues,
            queue_size: self.queue_size,
            ctrl_loss_tmo: self.ctrl_loss_tmo,
            reconnect_delay: self.reconnect_delay,
            keep_alive_tmo: self.keep_alive_tmo,
            hostnqn: self.hostnqn.clone(),
            hostid: self.hostid.clone(),
            hdr_digest: self.hdr_digest,
            data_digest: self.data_digest,
            dhchap_secret: self.dhchap_secret.clone(),
            dhchap_ctrl_secret: self.dhchap_ctrl_secret.clone(),
        })
    }
}

#[derive(Args, Clone)]
struct TargetArgs {
    /// Target address (IP or host name).
    #[arg(short = 'a', long = "traddr")]
    addr: String,
    /// Target TCP port.
    #[arg(short = 's', long = "trsvcid", default_value_t = 4420)]
    port: u16,
    /// Host NQN (default: /etc/nvme/hostnqn, else a random one).
    #[arg(long)]
    hostnqn: Option<String>,
    /// DH-HMAC-CHAP secret of this host (`DHHC-1:xx:...:`, as
    /// `nvme gen-dhchap-key` prints it; nvme-cli's option).
    #[arg(short = 'S', long = "dhchap-secret", value_name = "SECRET")]
    dhchap_secret: Option<String>,
    /// DH-HMAC-CHAP secret the controller must prove it knows
    /// (bidirectional authentication; nvme-cli's option).
    #[arg(short = 'C', long = "dhchap-ctrl-secret", value_name = "SECRET")]
    dhchap_ctrl_secret: Option<String>,
    /// Bound on connecting, in seconds.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
}

#[derive(Args, Clone)]
struct SubsystemArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Subsystem NQN.
    #[arg(short = 'n', long = "nqn")]
    nqn: String,
    /// Ask for header digests.
    #[arg(long)]
    hdgst: bool,
    /// Ask for data digests.
    #[arg(long)]
    ddgst: bool,
    /// Keep alive timeout in seconds (0: none).
    #[arg(long, default_value_t = 5)]
    kato: u64,
    /// Seconds to keep reconnecting before failing I/O for good (-1: forever).
    #[arg(long, default_value_t = 600, allow_hyphen_values = true)]
    ctrl_loss_tmo: i64,
    /// Seconds between reconnect attempts.
    #[arg(long, default_value_t = 10)]
    reconnect_delay: u64,
    /// Seconds after which pending I/O fails while reconnecting (-1: never).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    fast_io_fail_tmo: i64,
    /// Per-command timeout in seconds.
    #[arg(long, default_value_t = 30)]
    io_timeout: u64,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    sub: SubsystemArgs,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// read, write, randread, randwrite or randrw.
    #[arg(long, default_value = "randread")]
    rw: String,
    /// Percent reads for randrw.
    #[arg(long, default_value_t = 50)]
    rwmixread: u32,
    /// Bytes per I/O (k, m suffixes).
    #[arg(long, default_value = "4k")]
    bs: String,
    /// Requests in flight per job.
    #[arg(long, default_value_t = 32)]
    iodepth: u32,
    /// Jobs, each a thread with its own I/O queue.
    #[arg(long, default_value_t = 1)]
    numjobs: u32,
    /// Seconds to run (0: one pass over --size).
    #[arg(long, default_value_t = 10)]
    runtime: u64,
    /// Bytes of the namespace to use (k, m, g suffixes; 0: all).
    #[arg(long, default_value = "0")]
    size: String,
    /// Verify data (fio's --verify; any value, e.g. crc32c, means on).
    #[arg(long, num_args = 0..=1, default_missing_value = "crc32c")]
    verify: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Stay connected and idle this many seconds before the run (proves
    /// keep-alive holds an idle connection).
    #[arg(long, default_value_t = 0)]
    idle: u64,
    /// Seed for random offsets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn resolve(t: &TargetArgs) -> anyhow::Result<SocketAddr> {
    (t.addr.as_str(), t.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve target address '{}'", t.addr))?
        .next()
        .ok_or_else(|| anyhow!("target address '{}' resolves to nothing", t.addr))
}

fn host(t: &TargetArgs) -> HostIdentity {
    let mut h = HostIdentity::system();
    if let Some(n) = &t.hostnqn {
        h.nqn = n.clone();
    }
    h
}

/// The `--dhchap-secret` / `--dhchap-ctrl-secret` keys (errors never quote
/// them).
fn dhchap(t: &TargetArgs) -> anyhow::Result<Option<DhchapKeys>> {
    let parse = |s: &str, opt: &str| DhchapSecret::parse(s).map_err(|e| anyhow!("--{opt}: {e}"));
    match (&t.dhchap_secret, &t.dhchap_ctrl_secret) {
        (None, None) => Ok(None),
        (None, Some(_)) => bail!("--dhchap-ctrl-secret needs --dhchap-secret too"),
        (Some(s), c) => Ok(Some(DhchapKeys {
            secret: parse(s, "dhchap-secret")?,
            ctrl_secret: c
                .as_deref()
                .map(|c| parse(c, "dhchap-ctrl-secret"))
                .transpose()?,
        })),
    }
}

fn connect(s: &SubsystemArgs, io_queues: u16) -> anyhow::Result<Controller> {
    let addr = resolve(&s.target)?;
    let mut o = ConnectOptions::new(addr, &s.nqn);
    o.host = host(&s.target);
    o.dhchap = dhchap(&s.target)?;
    o.header_digest = s.hdgst;
    o.data_digest = s.ddgst;
    o.kato = Duration::from_secs(s.kato);
    o.io_queues = io_queues.max(1);
    o.connect_timeout = Duration::from_secs(s.target.connect_timeout);
    o.command_timeout = Duration::from_secs(s.io_timeout);
    o.reconnect = ReconnectPolicy {
        reconnect_delay: Duration::from_secs(s.reconnect_delay),
        ctrl_loss_tmo: ReconnectPolicy::secs_or_never(s.ctrl_loss_tmo),
        fast_io_fail_tmo: ReconnectPolicy::secs_or_never(s.fast_io_fail_tmo),
        requeue: true,
    };
    Controller::connect(o).with_context(|| format!("{} at {addr}", s.nqn))
}

fn cmd_discover(t: &TargetArgs) -> anyhow::Result<()> {
    let addr = resolve(t)?;
    let keys = dhchap(t)?;
    let entries = discover(
        addr,
        &host(t),
        Duration::from_secs(t.connect_timeout),
        keys.as_ref(),
    )
    .with_context(|| format!("discovery at {addr}"))?;
    println!("Discovery Log Number of Records {}", entries.len());
    for (i, e) in entries.iter().enumerate() {
        println!("=====Discovery Log Entry {i}======");
        let trtype = match e.trtype {
            3 => "tcp",
            1 => "rdma",
            2 => "fc",
            _ => "other",
        };
        let subtype = match e.subtype {
            1 => "discovery subsystem referral",
            2 => "nvme subsystem",
            3 => "current discovery subsystem",
            _ => "unknown",
        };
        println!("trtype:  {trtype}");
        println!("adrfam:  {}", if e.adrfam == 2 { "ipv6" } else { "ipv4" });
        println!("subtype: {subtype}");
        println!("portid:  {}", e.portid);
        println!("trsvcid: {}", e.trsvcid);
        println!("subnqn:  {}", e.subnqn);
        println!("traddr:  {}", e.traddr);
    }
    Ok(())
}

fn cmd_identify(s: &SubsystemArgs) -> anyhow::Result<()> {
    let c = connect(s, 1)?;
    let info = c.info();
    let id = &info.identify;
    println!("subnqn    : {}", id.subnqn);
    println!("mn        : {}", id.model_number);
    println!("sn        : {}", id.serial_number);
    println!("fr        : {}", id.firmware_revision);
    println!("cntlid    : {}", info.cntlid);
    println!(
        "version   : {}.{}.{}",
        info.version.major, info.version.minor, info.version.tertiary
    );
    println!(
        "mdts      : {} ({} bytes per command)",
        id.mdts, info.max_transfer_bytes
    );
    println!(
        "ioccsz    : {} ({} bytes in-capsule)",
        id.ioccsz, info.in_capsule_bytes
    );
    println!("sgls      : {:#x}", id.sgls);
    println!("nn        : {}", id.nn);
    println!("mqes      : {}", info.cap.mqes);
    println!("cap.ams   : {:#x}", info.cap.ams);
    println!("io queues : {}", info.io_queues);
    println!("kato      : {} ms", info.kato_ms);
    if !id.vendor_specific.is_empty() {
        let shown: String = id
            .vendor_specific
            .iter()
            .take(32)
            .map(|b| format!("{b:02x}"))
            .collect();
        println!(
            "vs        : {} bytes: {shown}{}",
            id.vendor_specific.len(),
            if id.vendor_specific.len() > 32 {
                "..."
            } else {
                ""
            }
        );
    }
    for nsid in c.active_namespaces().context("active namespace list")? {
        let ns = c
            .identify_namespace(nsid)
            .with_context(|| format!("Identify Namespace {nsid}"))?;
        println!(
            "namespace {nsid}: {} blocks of {} bytes ({} bytes)",
            ns.blocks,
            ns.block_size,
            ns.size_bytes()
        );
    }
    let _ = c.disconnect();
    Ok(())
}

fn cmd_bench(b: &BenchArgs) -> anyhow::Result<bool> {
    let pattern = Pattern::parse(&b.rw).ok_or_else(|| {
        anyhow!(
            "--rw '{}' is not one of read, write, randread, randwrite, randrw",
            b.rw
        )
    })?;
    if b.rwmixread > 100 {
        bail!("--rwmixread {} is not a percentage", b.rwmixread);
    }
    let bs = parse_size(&b.bs)?;
    let bs = u32::try_from(bs).map_err(|_| anyhow!("--bs {} is too large", b.bs))?;
    let opts = BenchOptions {
        nsid: b.nsid,
        pattern,
        rwmixread: b.rwmixread,
        bs,
        iodepth: b.iodepth.max(1),
        numjobs: b.numjobs.max(1),
        runtime: Duration::from_secs(b.runtime),
        size: parse_size(&b.size)?,
        verify: b.verify.is_some(),
        seed: b.seed,
    };
    let numjobs = u16::try_from(opts.numjobs).map_err(|_| anyhow!("--numjobs too large"))?;
    let c = connect(&b.sub, numjobs)?;
    if b.idle > 0 {
        std::thread::sleep(Duration::from_secs(b.idle));
    }
    let report = with_status_line(&opts, |progress| {
        bench::run_with_progress(&c, &opts, progress).context("bench")
    })?;
    if b.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    let failed = report.failed();
    if failed {
        eprintln!(
            "ublk-nvmf: error: bench: {} I/O error(s), {} verification error(s){}",
            report.errors,
            report.verify_errors,
            report
                .first_error
                .as_deref()
                .map(|e| format!("; first: {e}"))
                .unwrap_or_default()
        );
    }
    let _ = c.disconnect();
    Ok(!failed)
}

/// Runs `bench` with fio's live status line on stdout, redrawn every
/// second, when stdout is a terminal (and erased before the report); with
/// stdout a pipe or file nothing extra is written.
fn with_status_line<T>(
    opts: &BenchOptions,
    bench: impl FnOnce(Option<&bench::progress::Progress>) -> T,
) -> T {
    use std::io::{IsTerminal as _, Write as _};
    if !std::io::stdout().is_terminal() {
        return bench(None);
    }
    let progress = bench::progress::Progress::default();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = std::time::Instant::now();
            let tick = Duration::from_secs(1);
            let mut prev = progress.sample();
            let mut last = start;
            let mut width = 0;
            loop {
                // Short sleeps, so the line goes as soon as the run ends.
                while last.elapsed() < tick {
                    if done.load(std::sync::atomic::Ordering::Relaxed) {
                        print!("\r{:width$}\r", "");
                        let _ = std::io::stdout().flush();
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let now = progress.sample();
                let plan = bench::progress::Plan {
                    pattern: opts.pattern,
                    runtime: opts.runtime,
                    bytes_total: progress.bytes_total(),
                };
                let line = bench::progress::status_line(
                    &plan,
                    &prev,
                    &now,
                    last.elapsed(),
                    start.elapsed(),
                );
                width = width.max(line.len());
                print!("\r{line:width$}");
                let _ = std::io::stdout().flush();
                prev = now;
                last = std::time::Instant::now();
            }
        });
        let r = bench(Some(&progress));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    })
}

fn main() -> ExitCode {
    config_diag::logging::init_logging("warn");
    // `ublk-nvmf generate man|completion ...` (hidden, for packaging).
    if let Some(status) = cli_docs::generate_if_asked(Cli::command, &MAN) {
        return status;
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Cmd::Discover(t) => cmd_discover(t).map(|_| true),
        Cmd::Identify(s) => cmd_identify(s).map(|_| true),
        Cmd::Bench(b) => cmd_bench(b),
        Cmd::Run {
            config,
            takeover,
            metrics_listen,
        } => ublk_target::config::VolumeConfig::load(config)
            .map_err(anyhow::Error::from)
            .and_then(|mut c| {
                if metrics_listen.is_some() {
                    c.metrics_listen = *metrics_listen;
                }
                daemon::run(c, true, *takeover)
            })
            .map(|_| true),
        Cmd::Takeover { name, config_dir } => {
            daemon::add(&config_dir.join(format!("{name}.toml")), true).map(|_| true)
        }
        Cmd::Add {
            config,
            takeover,
            connect,
        } => match (config, connect.given()) {
            (Some(_), true) => Err(anyhow!(
                "add takes --config FILE or the connect options (-t tcp -a ... -n ...), not both"
            )),
            (Some(config), false) => daemon::add(config, *takeover).map(|_| true),
            (None, _) => connect
                .to_args()
                .and_then(|a| daemon::add_connect(&a, &connect.config_dir))
                .map(|_| true),
        },
        Cmd::Del { name } => daemon::del(name).map(|_| true),
        Cmd::List { json } => daemon::list(*json).map(|_| true),
        Cmd::Status { name, json } => daemon::status(name, *json).map(|_| true),
        Cmd::Set { name, settings } => daemon::set(name, settings).map(|_| true),
        Cmd::Reload { name } => daemon::reload(name).map(|_| true),
        Cmd::Recover { name } => daemon::recover(name).map(|_| true),
        Cmd::Demo { size } => daemon::demo(size).map(|_| true),
        Cmd::UdevName { kernel } => daemon::udev_name(kernel).map(|_| true),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // One line naming the problem: anyhow's alternate form joins
            // the context chain with ": ".
            eprintln!("ublk-nvmf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
