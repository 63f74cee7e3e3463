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

/// Keeps glibc's malloc from returning the data buffers of large writes to
/// the kernel after each command. A write of 128 KiB gets its R2T buffer
/// (`Vec::with_capacity(len)`), at glibc's default mmap threshold (128 KiB,
/// raised dynamically) from a fresh mapping or from arena space just
/// trimmed: every write then page-faults 32 pages in, which the kernel
/// zeroes, and gives them back on free. Profiled in the VM bench (issue
/// 14, docs/benchmarks.md): the copy into those new pages was 13-26 % of
/// the guest's samples at 128k writes. With buffers below 4 MiB (MDTS is 1
/// MiB) served from the arenas and up to 64 MiB of free space kept per
/// arena before trimming, they are reused warm; the data budget
/// (`limits.max_buffered_bytes`) still bounds what is live.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_buffers() {
    // SAFETY: mallopt only sets allocator parameters (the thresholds are
    // in range: at most HEAP_MAX_SIZE / 2 on 64-bit); it runs first in
    // main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_buffers() {}

fn main() -> ExitCode {
    keep_freed_buffers();
    config_diag::logging::init_logging("info");
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
