//! `log-writes-replay`: lists and replays dm-log-writes logs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use log_writes::device::FileDevice;
use log_writes::log::LogReader;
use log_writes::replay::{replay, Stop};

/// Lists or replays a dm-log-writes log.
///
/// Listing prints a header line `# entries N sector-size S`, then one line
/// per entry: `INDEX FLAGS SECTOR NR_SECTORS [MARK]`, FLAGS being `-` or
/// names joined by `|` (FLUSH, FUA, DISCARD, MARK, METADATA); sectors are
/// in units of the sector size.
///
/// Replaying applies entries from --start-entry (default 0) through the
/// stop entry (inclusive) to the replay target, which must start out as the
/// data device did (e.g. zeros) or as a previous replay left it: to step
/// through a log, replay to one point, check a copy of the target, then
/// continue with --start-entry set to the `next-entry` the previous run
/// printed. Discards are written as zeros. Nothing is written unless every
/// entry of the range is valid and the stop point exists.
#[derive(Parser, Debug)]
#[command(name = "log-writes-replay", version, verbatim_doc_comment)]
struct Args {
    /// The log device (or an image of it).
    #[arg(long)]
    log: PathBuf,
    /// List the entries and marks.
    #[arg(long, conflicts_with_all = ["replay", "start_entry", "until_entry", "until_mark", "until_flush"])]
    list: bool,
    /// The device (or image) to replay onto.
    #[arg(long, required_unless_present = "list")]
    replay: Option<PathBuf>,
    /// Skip the entries before this one.
    #[arg(long, default_value_t = 0)]
    start_entry: u64,
    /// Stop after this entry.
    #[arg(long, group = "stop")]
    until_entry: Option<u64>,
    /// Stop at the first mark of this name at or after the start.
    #[arg(long, group = "stop")]
    until_mark: Option<String>,
    /// Stop after the first flush or FUA entry at or after the start.
    #[arg(long, group = "stop")]
    until_flush: bool,
}

fn run(args: Args) -> anyhow::Result<()> {
    let log_dev = FileDevice::open(&args.log, false)
        .with_context(|| format!("opening the log {}", args.log.display()))?;
    let log = LogReader::open(log_dev).with_context(|| format!("{}", args.log.display()))?;
    let sb = log.super_block();

    let Some(target_path) = args.replay else {
        println!("# entries {} sector-size {}", sb.nr_entries, sb.sector_size);
        for e in log.entries() {
            let e = e.with_context(|| format!("{}", args.log.display()))?;
            println!("{}", e.list_line());
        }
        return Ok(());
    };

    let stop = if let Some(n) = args.until_entry {
        Stop::Entry(n)
    } else if let Some(m) = args.until_mark {
        Stop::Mark(m)
    } else if args.until_flush {
        Stop::NextFlushPoint
    } else {
        Stop::End
    };
    let mut target = FileDevice::open(&target_path, true)
        .with_context(|| format!("opening the replay target {}", target_path.display()))?;
    let r = replay(&log, &mut target, args.start_entry, &stop).with_context(|| {
        format!(
            "replaying {} onto {}",
            args.log.display(),
            target_path.display()
        )
    })?;
    match r.last {
        Some(last) => println!(
            "replayed entries {}..={last} of {}: {} writes, {} discards, {} flush points, {} bytes",
            r.start, r.nr_entries, r.writes, r.discards, r.flush_points, r.bytes
        ),
        None => println!(
            "nothing to replay from entry {} of {}",
            r.start, r.nr_entries
        ),
    }
    println!("next-entry {}", r.next_entry());
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("log-writes-replay: {e:#}");
            ExitCode::FAILURE
        }
    }
}
