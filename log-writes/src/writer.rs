//! Builds logs in the kernel's format, in memory: the tests' synthetic
//! logs, and a way to reproduce a reported log by hand.

use crate::format::{EntryHeader, Flags, SuperBlock, ENTRY_HEADER_LEN};

/// Appends entries the way `dm-log-writes` lays them out.
#[derive(Debug)]
pub struct LogWriter {
    sector_size: u32,
    nr_entries: u64,
    bytes: Vec<u8>,
}

impl LogWriter {
    /// An empty log; `sector_size` is the data device's block size.
    pub fn new(sector_size: u32) -> LogWriter {
        LogWriter {
            sector_size,
            nr_entries: 0,
            bytes: vec![0; sector_size as usize],
        }
    }

    fn block(&mut self, header: EntryHeader, extra: &[u8]) {
        let at = self.bytes.len();
        self.bytes.resize(at + self.sector_size as usize, 0);
        self.bytes[at..at + ENTRY_HEADER_LEN].copy_from_slice(&header.encode());
        let x = at + ENTRY_HEADER_LEN;
        self.bytes[x..x + extra.len()].copy_from_slice(extra);
        self.nr_entries += 1;
    }

    /// A write of `data` (whole sectors) at `sector` with `flags`.
    pub fn write_with(&mut self, sector: u64, data: &[u8], flags: Flags) -> &mut Self {
        assert_eq!(
            data.len() % self.sector_size as usize,
            0,
            "whole sectors only"
        );
        let header = EntryHeader {
            sector,
            nr_sectors: (data.len() / self.sector_size as usize) as u64,
            flags,
            data_len: 0,
        };
        self.block(header, &[]);
        self.bytes.extend_from_slice(data);
        self
    }

    /// A plain write.
    pub fn write(&mut self, sector: u64, data: &[u8]) -> &mut Self {
        self.write_with(sector, data, Flags::NONE)
    }

    /// A FUA write.
    pub fn fua(&mut self, sector: u64, data: &[u8]) -> &mut Self {
        self.write_with(sector, data, Flags::FUA)
    }

    /// A bare flush.
    pub fn flush(&mut self) -> &mut Self {
        self.write_with(0, &[], Flags::FLUSH)
    }

    /// A discard of `nr_sectors` at `sector` (no data in the log).
    pub fn discard(&mut self, sector: u64, nr_sectors: u64) -> &mut Self {
        let header = EntryHeader {
            sector,
            nr_sectors,
            flags: Flags::DISCARD,
            data_len: 0,
        };
        self.block(header, &[]);
        self
    }

    /// A mark named `name`.
    pub fn mark(&mut self, name: &str) -> &mut Self {
        let header = EntryHeader {
            sector: 0,
            nr_sectors: 0,
            flags: Flags::MARK,
            data_len: name.len() as u64,
        };
        self.block(header, name.as_bytes());
        self
    }

    /// Appends raw bytes (tests of malformed logs) and counts one entry.
    pub fn raw_entry(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(bytes);
        self.nr_entries += 1;
        self
    }

    /// The log with its super block, padded with `spare` zero bytes (a log
    /// device is usually larger than what was logged).
    pub fn finish(&self, spare: usize) -> Vec<u8> {
        let mut out = self.bytes.clone();
        let sb = SuperBlock {
            nr_entries: self.nr_entries,
            sector_size: self.sector_size,
        };
        out[..crate::format::SUPER_LEN].copy_from_slice(&sb.encode());
        out.resize(out.len() + spare, 0);
        out
    }
}
