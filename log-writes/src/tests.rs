//! Tests of reading and replaying synthetic logs built by [`LogWriter`].

use crate::device::{Device, MemDevice};
use crate::format::{EntryHeader, Flags, ENTRY_HEADER_LEN};
use crate::log::{Entry, LogReader};
use crate::replay::{replay, Stop};
use crate::writer::LogWriter;
use crate::LogError;

const SS: usize = 512;
const TARGET_SECTORS: usize = 32;

fn fill(tag: u8, sectors: usize) -> Vec<u8> {
    (0..sectors * SS)
        .map(|i| tag.wrapping_add((i / 7) as u8))
        .collect()
}

/// What the synthetic log does, as operations on a model of the device.
#[derive(Clone)]
enum Op {
    Write(u64, Vec<u8>),
    Discard(u64, u64),
    None,
}

/// A log with writes, flushes, a FUA write, a discard and marks, and the
/// model operation for each entry.
fn synthetic() -> (Vec<u8>, Vec<Op>) {
    let mut w = LogWriter::new(SS as u32);
    let mut ops = Vec::new();
    let a = fill(1, 2);
    let b = fill(50, 1);
    let c = fill(90, 3);
    let d = fill(130, 4);
    w.mark("start");
    ops.push(Op::None);
    w.write(0, &a);
    ops.push(Op::Write(0, a));
    w.write(4, &b);
    ops.push(Op::Write(4, b));
    w.flush();
    ops.push(Op::None);
    w.fua(8, &c);
    ops.push(Op::Write(8, c));
    w.discard(0, 1);
    ops.push(Op::Discard(0, 1));
    w.mark("durable-1");
    ops.push(Op::None);
    w.write_with(2, &d, Flags::METADATA);
    ops.push(Op::Write(2, d));
    w.flush();
    ops.push(Op::None);
    w.mark("dm-log-writes-end");
    ops.push(Op::None);
    (w.finish(4 * SS), ops)
}

/// The device after applying `ops[..=last]` to zeros.
fn model(ops: &[Op], last: usize) -> Vec<u8> {
    let mut dev = vec![0u8; TARGET_SECTORS * SS];
    for op in &ops[..=last] {
        match op {
            Op::Write(s, data) => {
                let at = *s as usize * SS;
                dev[at..at + data.len()].copy_from_slice(data);
            }
            Op::Discard(s, n) => {
                let at = *s as usize * SS;
                dev[at..at + *n as usize * SS].fill(0);
            }
            Op::None => {}
        }
    }
    dev
}

fn target() -> MemDevice {
    MemDevice(vec![0; TARGET_SECTORS * SS])
}

fn entries(log: &[u8]) -> Result<Vec<Entry>, LogError> {
    LogReader::open(MemDevice(log.to_vec()))?
        .entries()
        .collect()
}

#[test]
fn lists_every_entry_with_flags_and_marks() {
    let (log, ops) = synthetic();
    let es = entries(&log).unwrap();
    assert_eq!(es.len(), ops.len());
    let lines: Vec<String> = es.iter().map(Entry::list_line).collect();
    assert_eq!(
        lines,
        [
            "0 MARK 0 0 start",
            "1 - 0 2",
            "2 - 4 1",
            "3 FLUSH 0 0",
            "4 FUA 8 3",
            "5 DISCARD 0 1",
            "6 MARK 0 0 durable-1",
            "7 METADATA 2 4",
            "8 FLUSH 0 0",
            "9 MARK 0 0 dm-log-writes-end",
        ]
    );
    // Header block, then data: entry 1 at block 2 (after the super block
    // and the mark), its data at block 3.
    assert_eq!(es[1].data_offset, 3 * SS as u64);
    assert_eq!(es[1].data_bytes, 2 * SS as u64);
    assert_eq!(es[5].data_bytes, 0, "a discard carries no data");
}

#[test]
fn replay_to_every_entry_matches_the_model() {
    let (log, ops) = synthetic();
    let reader = LogReader::open(MemDevice(log)).unwrap();
    for last in 0..ops.len() {
        let mut t = target();
        let r = replay(&reader, &mut t, 0, &Stop::Entry(last as u64)).unwrap();
        assert_eq!(r.last, Some(last as u64));
        assert_eq!(t.0, model(&ops, last), "entry {last}");
    }
}

#[test]
fn stepping_flush_point_by_flush_point_equals_one_replay() {
    let (log, ops) = synthetic();
    let reader = LogReader::open(MemDevice(log)).unwrap();
    let mut stepped = target();
    let mut start = 0;
    let mut stops = Vec::new();
    loop {
        let r = replay(&reader, &mut stepped, start, &Stop::NextFlushPoint).unwrap();
        let Some(last) = r.last else { break };
        stops.push(last);
        let mut once = target();
        replay(&reader, &mut once, 0, &Stop::Entry(last)).unwrap();
        assert_eq!(stepped.0, once.0, "at entry {last}");
        assert_eq!(stepped.0, model(&ops, last as usize));
        start = r.next_entry();
    }
    // Two flushes and a FUA, then the tail up to the end of the log.
    assert_eq!(stops, [3, 4, 8, 9]);
}

#[test]
fn replay_until_a_mark_and_continue_from_it() {
    let (log, ops) = synthetic();
    let reader = LogReader::open(MemDevice(log)).unwrap();
    let mut t = target();
    let r = replay(&reader, &mut t, 0, &Stop::Mark("durable-1".into())).unwrap();
    assert_eq!(r.last, Some(6));
    assert_eq!((r.writes, r.discards, r.flush_points), (3, 1, 2));
    assert_eq!(t.0, model(&ops, 6));
    let r = replay(&reader, &mut t, r.next_entry(), &Stop::End).unwrap();
    assert_eq!(r.last, Some(9));
    assert_eq!(t.0, model(&ops, 9));
    // At the end: nothing more.
    let r = replay(&reader, &mut t, 10, &Stop::NextFlushPoint).unwrap();
    assert_eq!(r.last, None);
}

#[test]
fn a_missing_mark_or_entry_writes_nothing() {
    let (log, _) = synthetic();
    let reader = LogReader::open(MemDevice(log)).unwrap();
    let mut t = target();
    let e = replay(&reader, &mut t, 0, &Stop::Mark("nope".into())).unwrap_err();
    assert!(matches!(e, LogError::MarkNotFound { .. }), "{e}");
    // A mark before the start is not found either.
    let e = replay(&reader, &mut t, 7, &Stop::Mark("durable-1".into())).unwrap_err();
    assert!(matches!(e, LogError::MarkNotFound { .. }), "{e}");
    for (start, stop) in [(0, 10), (5, 4), (11, 11)] {
        let e = replay(&reader, &mut t, start, &Stop::Entry(stop)).unwrap_err();
        assert!(matches!(e, LogError::NoSuchEntry { .. }), "{e}");
    }
    assert_eq!(t, target());
}

#[test]
fn a_write_past_the_target_is_refused_before_anything_is_written() {
    let (log, _) = synthetic();
    let reader = LogReader::open(MemDevice(log)).unwrap();
    // Entry 4 writes sectors 8..11: a 10-sector target is too small.
    let mut small = MemDevice(vec![0; 10 * SS]);
    let e = replay(&reader, &mut small, 0, &Stop::End).unwrap_err();
    assert!(matches!(e, LogError::PastTarget { index: 4, .. }), "{e}");
    assert!(small.0.iter().all(|&b| b == 0));
}

#[test]
fn sectors_are_in_units_of_the_logs_sector_size() {
    let mut w = LogWriter::new(4096);
    w.fua(3, &[7u8; 4096]);
    let reader = LogReader::open(MemDevice(w.finish(0))).unwrap();
    let mut t = MemDevice(vec![0; 4 * 4096]);
    replay(&reader, &mut t, 0, &Stop::End).unwrap();
    assert!(t.0[..3 * 4096].iter().all(|&b| b == 0));
    assert!(t.0[3 * 4096..].iter().all(|&b| b == 7));
}

/// A log whose one entry is `header` (in a block of its own), with `tail`
/// bytes of log device after it.
fn one_entry(header: EntryHeader, tail: usize) -> Vec<u8> {
    let mut block = vec![0u8; SS];
    block[..ENTRY_HEADER_LEN].copy_from_slice(&header.encode());
    let mut w = LogWriter::new(SS as u32);
    w.raw_entry(&block);
    w.finish(tail)
}

#[test]
fn hostile_lengths_are_errors_not_allocations() {
    let h = |sector, nr_sectors, flags, data_len| EntryHeader {
        sector,
        nr_sectors,
        flags,
        data_len,
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (one_entry(h(0, u64::MAX, Flags::NONE, 0), 0), "DataPastEnd"),
        (one_entry(h(0, 1 << 50, Flags::FUA, 0), SS), "DataPastEnd"),
        (one_entry(h(0, 2, Flags::NONE, 0), SS), "DataPastEnd"),
        (one_entry(h(0, 0, Flags::MARK, u64::MAX), 0), "BadMark"),
        (
            one_entry(h(0, 0, Flags::MARK, (SS - ENTRY_HEADER_LEN + 1) as u64), 0),
            "BadMark",
        ),
        (one_entry(h(0, 3, Flags::MARK, 1), 0), "BadMark"),
        (one_entry(h(0, 1, Flags::NONE, 9), SS), "InlineData"),
        (one_entry(h(u64::MAX, 1, Flags::NONE, 0), SS), "PastTarget"),
        (
            one_entry(h(u64::MAX / 512, 1, Flags::NONE, 0), SS),
            "PastTarget",
        ),
        (
            one_entry(h(0, u64::MAX, Flags::DISCARD, 0), 0),
            "PastTarget",
        ),
        (
            one_entry(h(TARGET_SECTORS as u64, 1, Flags::NONE, 0), SS),
            "PastTarget",
        ),
    ];
    for (i, (log, want)) in cases.into_iter().enumerate() {
        let reader = LogReader::open(MemDevice(log)).unwrap();
        let mut t = target();
        let e = replay(&reader, &mut t, 0, &Stop::End).unwrap_err();
        assert!(format!("{e:?}").starts_with(want), "case {i}: {e:?}");
        assert_eq!(t, target(), "case {i} wrote to the target");
    }
}

#[test]
fn super_block_counts_are_checked_against_the_log_size() {
    let (mut log, _) = synthetic();
    log[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = LogReader::open(MemDevice(log)).unwrap_err();
    assert!(matches!(e, LogError::TooManyEntries { .. }), "{e}");

    // A count that fits the device but not the entries actually there: the
    // walk ends in an error at the end of the device.
    let (mut log, _) = synthetic();
    let fits = (log.len() / SS - 1) as u64;
    log[16..24].copy_from_slice(&fits.to_le_bytes());
    let err = entries(&log).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::EntryPastEnd { .. } | LogError::DataPastEnd { .. }
        ),
        "{err}"
    );

    assert!(matches!(
        LogReader::open(MemDevice(vec![0; 8])),
        Err(LogError::LogTooSmall { log_bytes: 8 })
    ));
    let e = LogReader::open(MemDevice(vec![0; SS])).unwrap_err();
    assert!(matches!(e, LogError::BadMagic { .. }), "{e}");
}

#[test]
fn random_corruption_never_panics() {
    let (log, _) = synthetic();
    // xorshift: deterministic, no dependency.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let mut bad = log.clone();
        for _ in 0..1 + rnd() % 4 {
            let at = (rnd() % bad.len() as u64) as usize;
            bad[at] = rnd() as u8;
        }
        if rnd() % 4 == 0 {
            bad.truncate((rnd() % bad.len() as u64) as usize);
        }
        let Ok(reader) = LogReader::open(MemDevice(bad)) else {
            continue;
        };
        let _ = reader.entries().count();
        let mut t = target();
        let _ = replay(&reader, &mut t, 0, &Stop::End);
        let _ = replay(&reader, &mut t, 0, &Stop::Mark("durable-1".into()));
        assert_eq!(t.size_bytes(), (TARGET_SECTORS * SS) as u64);
    }
}
