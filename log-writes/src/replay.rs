//! Applies a range of a log's entries to a replay target.
//!
//! A replay first walks the range without writing anything: it checks every
//! entry (against the log device and the target) and finds the stop entry.
//! Only a range that is valid in full is then applied, so a bad log or a
//! mark that is not there leaves the target untouched. Entries before the
//! start are skipped, which is how a replay continues where the previous
//! one stopped (`--start-entry` = the previous stop + 1).
//!
//! Discards are replayed as zeros: the bench's devices (loop devices on
//! tmpfs) read discarded ranges back as zeros, and zeros make the replay
//! deterministic.

use crate::device::Device;
use crate::format::Flags;
use crate::log::{Entry, LogReader};
use crate::LogError;

/// The largest buffer a replay allocates: data is copied through it in
/// pieces, whatever lengths the log claims.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Where a replay stops (the stop entry itself is applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// At the end of the log.
    End,
    /// After entry N.
    Entry(u64),
    /// At the first mark of this name at or after the start.
    Mark(String),
    /// After the first flush or FUA entry at or after the start (or at the
    /// end of the log if there is none).
    NextFlushPoint,
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The first entry considered.
    pub start: u64,
    /// The last entry applied (`None`: the range was empty).
    pub last: Option<u64>,
    /// Write entries applied (including FUA and flushes with data).
    pub writes: u64,
    /// Discards applied (as zeros).
    pub discards: u64,
    /// Flush and FUA entries in the range.
    pub flush_points: u64,
    /// Bytes written to the target.
    pub bytes: u64,
    /// The entries in the log.
    pub nr_entries: u64,
}

impl Report {
    /// The entry a following replay starts at.
    pub fn next_entry(&self) -> u64 {
        self.last.map_or(self.start, |l| l + 1)
    }
}

/// Checks that a write or discard lies within the target.
fn check_target(e: &Entry, sector_size: u32, target_bytes: u64) -> Result<(), LogError> {
    if e.flags.contains(Flags::MARK) || e.nr_sectors == 0 {
        return Ok(());
    }
    let end = e
        .sector
        .checked_add(e.nr_sectors)
        .and_then(|s| s.checked_mul(u64::from(sector_size)));
    match end {
        Some(end) if end <= target_bytes => Ok(()),
        _ => Err(LogError::PastTarget {
            index: e.index,
            sector: e.sector,
            nr_sectors: e.nr_sectors,
            sector_size,
            target_bytes,
        }),
    }
}

/// Finds the last entry to apply, checking every entry from `start` to it.
fn plan<L: Device>(
    log: &LogReader<L>,
    target_bytes: u64,
    start: u64,
    stop: &Stop,
) -> Result<Option<u64>, LogError> {
    let sb = log.super_block();
    let n = sb.nr_entries;
    if start > n {
        return Err(LogError::NoSuchEntry {
            wanted: start,
            nr_entries: n,
        });
    }
    if let Stop::Entry(want) = *stop {
        if want >= n || want < start {
            return Err(LogError::NoSuchEntry {
                wanted: want,
                nr_entries: n,
            });
        }
    }
    let mut last = None;
    for e in log.entries() {
        let e = e?;
        if e.index < start {
            continue;
        }
        check_target(&e, sb.sector_size, target_bytes)?;
        last = Some(e.index);
        let here = match stop {
            Stop::End => false,
            Stop::Entry(want) => e.index == *want,
            Stop::Mark(name) => e.mark.as_deref() == Some(name.as_str()),
            Stop::NextFlushPoint => e.is_flush_point(),
        };
        if here {
            return Ok(last);
        }
    }
    match stop {
        Stop::Mark(name) => Err(LogError::MarkNotFound {
            name: name.clone(),
            start,
        }),
        _ => Ok(last),
    }
}

/// Copies `e`'s data (or zeros, for a discard) to the target through `buf`.
fn apply<L: Device, T: Device>(
    log: &LogReader<L>,
    target: &mut T,
    e: &Entry,
    buf: &mut [u8],
) -> Result<u64, LogError> {
    let ss = u64::from(log.super_block().sector_size);
    // Checked by plan(): within the target, no overflow.
    let dest = e.sector * ss;
    let len = if e.flags.contains(Flags::DISCARD) {
        e.nr_sectors * ss
    } else {
        e.data_bytes
    };
    let discard = e.flags.contains(Flags::DISCARD);
    if discard {
        buf.fill(0);
    }
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        if !discard {
            log.device()
                .read_exact_at(&mut buf[..n], e.data_offset + done)
                .map_err(|err| LogError::io(format!("reading entry {}'s data", e.index), err))?;
        }
        target
            .write_all_at(&buf[..n], dest + done)
            .map_err(|err| LogError::io(format!("writing entry {} to the target", e.index), err))?;
        done += n as u64;
    }
    Ok(len)
}

/// Applies the entries from `start` up to `stop` to `target` and syncs it.
/// Nothing is written unless the whole range checks out.
pub fn replay<L: Device, T: Device>(
    log: &LogReader<L>,
    target: &mut T,
    start: u64,
    stop: &Stop,
) -> Result<Report, LogError> {
    let last = plan(log, target.size_bytes(), start, stop)?;
    let mut report = Report {
        start,
        last,
        nr_entries: log.super_block().nr_entries,
        ..Report::default()
    };
    let Some(last) = last else {
        return Ok(report);
    };
    let mut buf = Vec::new();
    for e in log.entries() {
        let e = e?;
        if e.index < start {
            continue;
        }
        if e.index > last {
            break;
        }
        if e.is_flush_point() {
            report.flush_points += 1;
        }
        if e.flags.contains(Flags::MARK) || e.nr_sectors == 0 {
            continue;
        }
        if buf.is_empty() {
            buf = vec![0u8; CHUNK_BYTES];
        }
        report.bytes += apply(log, target, &e, &mut buf)?;
        if e.flags.contains(Flags::DISCARD) {
            report.discards += 1;
        } else {
            report.writes += 1;
        }
    }
    target
        .sync()
        .map_err(|e| LogError::io("syncing the target", e))?;
    Ok(report)
}
