//! The `gimbal-target` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use gimbal_target::config::TargetConfig;

mod plan;

/// gimbal-target serves the subsystems and namespaces (RAM, null, file or
/// simulated-SSD backends) a TOML file describes over NVMe/TCP. A namespace
/// with `qos = "gimbal"` runs the Gimbal storage switch (SIGCOMM '21):
/// per-tenant fair scheduling, delay-based SSD congestion control and
/// credits returned to clients. Under systemd, gimbal-target.service runs
/// `gimbal-target run --config /etc/gimbal-target/target.toml`; `check`
/// validates a file first, `plan` predicts the shares of weighted class
/// arbitration.
#[derive(Parser)]
// `about`: the package description, the NAME line of gimbal-target(8); the
// doc comment above is the long help and the page's DESCRIPTION.
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the subsystems a config file describes, until SIGTERM/SIGINT.
    Run {
        /// The TOML configuration (see examples/target.toml).
        #[arg(short, long)]
        config: PathBuf,
        /// Log the virtual view of every Gimbal namespace (one
        /// `gimbal-view ...` line each) every SECS seconds; 0 turns it off.
        #[arg(long, value_name = "SECS", default_value_t = 10)]
        status_interval: u64,
        /// Serve Prometheus metrics at http://ADDR/metrics (IP:port),
        /// overriding `[metrics] listen` in the config. Use loopback or a
        /// management network: the page names every tenant's host NQN.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Predict per-class throughput and worst-case latency under weighted
    /// class arbitration (ionice paper Equations 1-3), e.g.
    /// `plan --weights 4,2,1 --load high=max,low=20k --device 100k`.
    Plan(plan::PlanArgs),
    /// Check a config file and print what it describes.
    Check {
        /// The TOML configuration.
        #[arg(short, long)]
        config: PathBuf,
    },
}

/// The hand-written parts of gimbal-target(8).
const MAN: cli_docs::ManInfo = cli_docs::ManInfo {
    section: "8",
    sections: &[
        cli_docs::Section {
            title: "FILES",
            entries: &[(
                "/etc/gimbal-target/target.toml",
                "The configuration the systemd unit gimbal-target.service serves. An annotated \
                 example is /usr/share/doc/gimbal-target/examples/target.toml.",
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
                    "GIMBAL_CLOCK",
                    "monotonic: the storage switch times requests with CLOCK_MONOTONIC instead of \
                     the CPU's time-stamp counter.",
                ),
            ],
        },
        cli_docs::Section {
            title: "SEE ALSO",
            entries: &[("", "ublk-nvmf(8), nvme(1), systemctl(1).")],
        },
    ],
};

/// Sets up logging at `default` level (`RUST_LOG` overrides). Under
/// systemd, stderr goes to the journal, which stamps every line with its
/// own time: a timestamp of ours would be a second, redundant one. There a
/// line is `<N>target: message`, `<N>` the syslog priority journald reads
/// as the line's level (`SyslogLevelPrefix=`, on by default), so
/// `journalctl -p warning` works. Under systemd means: `$JOURNAL_STREAM`
/// names our stderr (what systemd sets when it connects a unit's stderr
/// to the journal), or `$INVOCATION_ID` is set (a unit runs us).
fn init_logging(default: &str) {
    use std::io::Write as _;
    let mut b =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    if under_systemd() {
        b.format(|buf, r| {
            let priority = match r.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            writeln!(buf, "<{priority}>{}: {}", r.target(), r.args())
        });
    } else {
        b.format_timestamp_millis();
    }
    b.init();
}

/// Whether systemd runs us (see [`init_logging`]).
fn under_systemd() -> bool {
    if std::env::var_os("INVOCATION_ID").is_some() {
        return true;
    }
    let Some(stream) = std::env::var("JOURNAL_STREAM").ok() else {
        return false;
    };
    // "DEVICE:INODE" of the journal's socket; stderr may have been
    // redirected since (then it is not the journal).
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    stream == format!("{}:{}", meta.dev(), meta.ino())
}

fn main() -> ExitCode {
    init_logging("info");
    // `gimbal-target generate man|completion ...` (hidden, for packaging).
    if let Some(status) = cli_docs::generate_if_asked(Cli::command, &MAN) {
        return status;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            config,
            status_interval,
            metrics_listen,
        } => TargetConfig::load(&config)
            .map_err(anyhow::Error::from)
            .and_then(|mut c| {
                if metrics_listen.is_some() {
                    c.metrics_listen = metrics_listen;
                }
                gimbal_target::server::run_with_status(
                    c,
                    Some(std::time::Duration::from_secs(status_interval)),
                )
            }),
        Command::Plan(args) => plan::run(&args),
        Command::Check { config } => TargetConfig::load(&config)
            .map(|c| {
                for s in &c.subsystems {
                    println!(
                        "{}: {} namespace(s), {}",
                        s.nqn,
                        s.namespaces.len(),
                        if s.allow_any_host {
                            "any host".to_string()
                        } else {
                            format!("{} allowed host(s)", s.allowed_hosts.len())
                        }
                    );
                }
            })
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gimbal-target: {e:#}");
            ExitCode::FAILURE
        }
    }
}
