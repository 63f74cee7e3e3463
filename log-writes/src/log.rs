//! Walks a log's entries, reading headers only (data stays on the log
//! device until a replay copies it) and checking every count and length
//! against the log device's size before using it.

use crate::device::Device;
use crate::format::{EntryHeader, Flags, SuperBlock, ENTRY_HEADER_LEN, SUPER_LEN};
use crate::LogError;

/// One entry of the log, checked against the log device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Position in the log, from 0.
    pub index: u64,
    /// First sector of the write or discard (units of the sector size).
    pub sector: u64,
    /// Sectors written or discarded.
    pub nr_sectors: u64,
    /// What kind of entry.
    pub flags: Flags,
    /// The mark's name, for a mark (bytes that are not UTF-8 are replaced).
    pub mark: Option<String>,
    /// Byte offset of the written data on the log device.
    pub data_offset: u64,
    /// Bytes of written data on the log device (0 for discards, marks and
    /// bare flushes); within the log device, checked.
    pub data_bytes: u64,
}

impl Entry {
    /// A point where the device's contents are defined (flush or FUA).
    pub fn is_flush_point(&self) -> bool {
        self.flags.is_flush_point()
    }

    /// One line for `--list`: `INDEX FLAGS SECTOR NR_SECTORS [MARK]`.
    pub fn list_line(&self) -> String {
        let mut s = format!(
            "{} {} {} {}",
            self.index, self.flags, self.sector, self.nr_sectors
        );
        if let Some(m) = &self.mark {
            s.push(' ');
            s.push_str(m);
        }
        s
    }
}

/// A log on a device: its super block, checked, and the means to walk it.
#[derive(Debug)]
pub struct LogReader<D: Device> {
    dev: D,
    sb: SuperBlock,
}

impl<D: Device> LogReader<D> {
    /// Reads and checks the super block. The entry count must fit the log
    /// device (every entry takes at least one sector).
    pub fn open(dev: D) -> Result<LogReader<D>, LogError> {
        let log_bytes = dev.size_bytes();
        if log_bytes < SUPER_LEN as u64 {
            return Err(LogError::LogTooSmall { log_bytes });
        }
        let mut b = [0u8; SUPER_LEN];
        dev.read_exact_at(&mut b, 0)
            .map_err(|e| LogError::io("reading the super block", e))?;
        let sb = SuperBlock::parse(&b)?;
        let fits = (log_bytes / u64::from(sb.sector_size)).saturating_sub(1);
        if sb.nr_entries > fits {
            return Err(LogError::TooManyEntries {
                nr_entries: sb.nr_entries,
                fits,
                log_bytes,
            });
        }
        Ok(LogReader { dev, sb })
    }

    /// The checked super block.
    pub fn super_block(&self) -> SuperBlock {
        self.sb
    }

    /// The log device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The entries in log order. After the first error the walk ends.
    pub fn entries(&self) -> Entries<'_, D> {
        Entries {
            log: self,
            next_index: 0,
            offset: u64::from(self.sb.sector_size),
            failed: false,
        }
    }
}

/// Iterator over a log's entries (see [`LogReader::entries`]).
#[derive(Debug)]
pub struct Entries<'a, D: Device> {
    log: &'a LogReader<D>,
    next_index: u64,
    offset: u64,
    failed: bool,
}

impl<D: Device> Entries<'_, D> {
    fn read_entry(&mut self) -> Result<Entry, LogError> {
        let index = self.next_index;
        let ss = u64::from(self.log.sb.sector_size);
        let log_bytes = self.log.dev.size_bytes();
        let past_end = LogError::EntryPastEnd {
            index,
            offset: self.offset,
            log_bytes,
        };
        let data_offset = self
            .offset
            .checked_add(ss)
            .filter(|&end| end <= log_bytes)
            .ok_or(past_end)?;
        let mut hb = [0u8; ENTRY_HEADER_LEN];
        self.log
            .dev
            .read_exact_at(&mut hb, self.offset)
            .map_err(|e| LogError::io(format!("reading entry {index}"), e))?;
        let h = EntryHeader::parse(&hb, index)?;

        let mut mark = None;
        if h.flags.contains(Flags::MARK) {
            let max = ss - ENTRY_HEADER_LEN as u64;
            if h.data_len > max {
                return Err(LogError::BadMark {
                    index,
                    why: format!("name of {} bytes, at most {max} fit", h.data_len),
                });
            }
            if h.nr_sectors != 0 {
                return Err(LogError::BadMark {
                    index,
                    why: format!("claims {} sectors", h.nr_sectors),
                });
            }
            // Bounded by the sector size just above.
            let mut name = vec![0u8; h.data_len as usize];
            self.log
                .dev
                .read_exact_at(&mut name, self.offset + ENTRY_HEADER_LEN as u64)
                .map_err(|e| LogError::io(format!("reading mark {index}"), e))?;
            let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            mark = Some(String::from_utf8_lossy(&name[..end]).into_owned());
        } else if h.data_len != 0 {
            return Err(LogError::InlineData {
                index,
                data_len: h.data_len,
            });
        }

        let data_bytes = if h.flags.contains(Flags::DISCARD) {
            0
        } else {
            h.nr_sectors
                .checked_mul(ss)
                .filter(|&n| n <= log_bytes - data_offset)
                .ok_or(LogError::DataPastEnd {
                    index,
                    nr_sectors: h.nr_sectors,
                    offset: data_offset,
                    log_bytes,
                })?
        };
        self.offset = data_offset + data_bytes;
        self.next_index += 1;
        Ok(Entry {
            index,
            sector: h.sector,
            nr_sectors: h.nr_sectors,
            flags: h.flags,
            mark,
            data_offset,
            data_bytes,
        })
    }
}

impl<D: Device> Iterator for Entries<'_, D> {
    type Item = Result<Entry, LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.next_index >= self.log.sb.nr_entries {
            return None;
        }
        let r = self.read_entry();
        self.failed = r.is_err();
        Some(r)
    }
}
