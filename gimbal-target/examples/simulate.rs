//! Regenerates `docs/qos-simulation.md` until `gimbal-target simulate` is
//! wired into the binary: `cargo run --release -p gimbal-target --example
//! simulate -- [--quick] [--json] [--seed N] [--out-dir DIR]`.

use clap::Parser;
use gimbal_target::simulate::{run, SimulateArgs};

/// Command line of the example: the subcommand's arguments.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SimulateArgs,
}

fn main() -> anyhow::Result<()> {
    run(&Cli::parse().args)
}
