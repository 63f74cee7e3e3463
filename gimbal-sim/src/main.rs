//! `gimbal-sim`: runs the Gimbal paper's experiments (§5.2–5.5) in
//! `qos-core`'s deterministic simulation and regenerates
//! `docs/qos-simulation.md` with its PNG plots
//! (`cargo run --release -p gimbal-sim`, from the workspace root); its
//! `flint` subcommand runs Flint's experiments in `flint-core`'s
//! simulation and regenerates `docs/flint-simulation.md`
//! (`cargo run --release -p gimbal-sim -- flint`).
//!
//! The simulation itself is pure (`qos_core::sim`); this binary only runs
//! its independent runs on worker threads, renders the report and the plots
//! (`plotters`, bitmap backend, with the DejaVu font compiled in so no
//! system font is needed) and prints the metrics as JSON. It is a crate of
//! its own so that the target's runtime does not carry the plotting stack.

mod flint;
mod parallel;
mod plots;
mod report;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use qos_core::sim::engine::{run as run_simulation, RunSpec};
use qos_core::sim::experiments::{check_bar, run_suite, BarCheck, Scale, SuiteResult};
use serde::Serialize;

/// Run the Gimbal paper's experiments in simulation and regenerate
/// docs/qos-simulation.md (or print metrics with --json).
#[derive(Parser, Clone, Debug, PartialEq, Eq)]
#[command(version, about)]
pub struct SimulateArgs {
    /// Directory that receives `qos-simulation.md` and the PNGs (in
    /// `qos-simulation/` below it).
    #[arg(long, default_value = "docs")]
    pub out_dir: PathBuf,
    /// Print every experiment's per-scheduler metrics as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The seed every random choice of the simulation derives from.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Short runs (a few hundred simulated milliseconds each, a few
    /// seconds in all) instead of the report's.
    #[arg(long)]
    pub quick: bool,
    /// Do not write the report and plots (useful with `--json`).
    #[arg(long)]
    pub no_report: bool,
    /// Simulations to run at once; default: the available cores.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Another paper's experiments instead of Gimbal's.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The other papers' experiments.
#[derive(Subcommand, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Flint (elastic volumes, shadow view, bandwidth auction): regenerate
    /// docs/flint-simulation.md.
    Flint(flint::FlintArgs),
}

impl Default for SimulateArgs {
    fn default() -> Self {
        SimulateArgs {
            out_dir: PathBuf::from("docs"),
            json: false,
            seed: 1,
            quick: false,
            no_report: false,
            jobs: None,
            command: None,
        }
    }
}

/// Everything `--json` prints.
#[derive(Debug, Serialize)]
pub struct JsonOutput<'a> {
    /// The suite: calibration, every experiment's per-scheduler metrics
    /// (utilization, f-Util per worker and deviation, latency
    /// percentiles) and the dynamic run's time series.
    pub suite: &'a SuiteResult,
    /// The bar, criterion by criterion.
    pub bar: &'a [BarCheck],
}

fn main() -> ExitCode {
    let args = SimulateArgs::parse();
    let outcome = match &args.command {
        Some(Command::Flint(flint_args)) => flint::run(flint_args),
        None => run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gimbal-sim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the experiments, writes the report (unless `no_report`) and prints
/// JSON (if `json`).
pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let scale = if args.quick {
        Scale::Quick
    } else {
        Scale::Full
    };
    run_at_scale(args, scale)
}

/// [`run`] at an explicit scale (tests use [`Scale::Tiny`]).
pub fn run_at_scale(args: &SimulateArgs, scale: Scale) -> anyhow::Result<()> {
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    });
    let started = Instant::now();
    let runner = move |specs: Vec<RunSpec>| parallel::run_in_parallel(specs, jobs, run_simulation);
    let suite = run_suite(args.seed, scale, &runner);
    let checks = check_bar(&suite.utilization, &suite.fairness);
    let elapsed = started.elapsed();
    if !args.no_report {
        write_report(&suite, &checks, &args.out_dir)?;
        eprintln!(
            "wrote {} in {:.1} s",
            args.out_dir.join("qos-simulation.md").display(),
            elapsed.as_secs_f64()
        );
    }
    if args.json {
        let out = JsonOutput {
            suite: &suite,
            bar: &checks,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

/// Writes `qos-simulation.md` and `qos-simulation/*.png` into `out_dir`.
pub fn write_report(
    suite: &SuiteResult,
    checks: &[BarCheck],
    out_dir: &Path,
) -> anyhow::Result<()> {
    let image_dir = out_dir.join("qos-simulation");
    std::fs::create_dir_all(&image_dir)
        .with_context(|| format!("creating {}", image_dir.display()))?;
    let images = plots::draw_all(suite, &image_dir)?;
    let markdown = report::render(suite, checks, &images);
    let path = out_dir.join("qos-simulation.md");
    std::fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_suite_writes_report_plots_and_json_and_threads_do_not_change_results() {
        let dir = tempfile::tempdir().unwrap();
        let args = SimulateArgs {
            out_dir: dir.path().to_path_buf(),
            jobs: Some(2),
            ..SimulateArgs::default()
        };
        run_at_scale(&args, Scale::Tiny).unwrap();
        let md = std::fs::read_to_string(dir.path().join("qos-simulation.md")).unwrap();
        assert!(md.contains("# QoS simulation"), "{md}");
        assert!(md.contains("f-Util"));
        let pngs: Vec<_> = std::fs::read_dir(dir.path().join("qos-simulation"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(pngs.len() >= 6, "{pngs:?}");
        for png in &pngs {
            let bytes = std::fs::read(png).unwrap();
            assert_eq!(&bytes[1..4], b"PNG", "{}", png.display());
            assert!(md.contains(png.file_name().unwrap().to_str().unwrap()));
        }
        let one = |jobs| {
            let runner =
                move |specs: Vec<RunSpec>| parallel::run_in_parallel(specs, jobs, run_simulation);
            run_suite(3, Scale::Tiny, &runner)
        };
        assert_eq!(one(1), one(3));
        let suite = one(2);
        let checks = check_bar(&suite.utilization, &suite.fairness);
        let json = serde_json::to_string(&JsonOutput {
            suite: &suite,
            bar: &checks,
        })
        .unwrap();
        for key in [
            "f_util",
            "f_util_deviation",
            "utilization",
            "p99_us",
            "p999_us",
        ] {
            assert!(json.contains(key), "{key} missing");
        }
    }
}
