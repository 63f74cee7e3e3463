//! The `gimbal-target` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gimbal_target::config::TargetConfig;

mod plan;

/// NVMe/TCP target and multi-tenant storage switch.
#[derive(Parser)]
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

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            config,
            status_interval,
        } => TargetConfig::load(&config)
            .map_err(anyhow::Error::from)
            .and_then(|c| {
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
