//! The on-disk structures of a dm-log-writes log (see the crate docs for
//! the layout), decoded from and encoded to little-endian bytes.

use std::fmt;
use std::ops::BitOr;

use crate::LogError;

/// The super block's magic number.
pub const MAGIC: u64 = 0x006a_7366_7773_6872;
/// The only format version there is.
pub const VERSION: u64 = 1;
/// Bytes of the super block's fields (the block itself is one sector).
pub const SUPER_LEN: usize = 28;
/// Bytes of an entry header's fields (the header takes one sector).
pub const ENTRY_HEADER_LEN: usize = 32;
/// Smallest sector size accepted.
pub const SECTOR_SIZE_MIN: u32 = 512;
/// Largest sector size accepted (the kernel writes a header block from one
/// page; 64 KiB is the largest page size Linux has).
pub const SECTOR_SIZE_MAX: u32 = 65536;

/// The flags of a log entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u64);

impl Flags {
    /// No flags: a plain write.
    pub const NONE: Flags = Flags(0);
    /// A cache flush (REQ_PREFLUSH): everything before it is durable.
    pub const FLUSH: Flags = Flags(1 << 0);
    /// A write that bypassed the cache (REQ_FUA).
    pub const FUA: Flags = Flags(1 << 1);
    /// A discard: a range, no data.
    pub const DISCARD: Flags = Flags(1 << 2);
    /// A mark inserted by userspace; its name is the entry's data.
    pub const MARK: Flags = Flags(1 << 3);
    /// The write carried file system metadata (REQ_META).
    pub const METADATA: Flags = Flags(1 << 4);

    const KNOWN: u64 = 0x1f;
    const NAMES: [(Flags, &'static str); 5] = [
        (Flags::FLUSH, "FLUSH"),
        (Flags::FUA, "FUA"),
        (Flags::DISCARD, "DISCARD"),
        (Flags::MARK, "MARK"),
        (Flags::METADATA, "METADATA"),
    ];

    /// The raw bits.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// Flags from raw bits; `None` if a bit is unknown.
    pub fn from_bits(bits: u64) -> Option<Flags> {
        (bits & !Self::KNOWN == 0).then_some(Flags(bits))
    }

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// A point where the device's contents are defined: a flush or a FUA
    /// write.
    pub fn is_flush_point(self) -> bool {
        self.contains(Flags::FLUSH) || self.contains(Flags::FUA)
    }
}

impl BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// `FLUSH|FUA|METADATA`, or `-` for none.
impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (flag, name) in Self::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The log's super block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperBlock {
    /// Entries in the log.
    pub nr_entries: u64,
    /// Bytes per sector (the data device's logical block size).
    pub sector_size: u32,
}

impl SuperBlock {
    /// Decodes and checks the magic, version and sector size. `bytes` must
    /// hold at least [`SUPER_LEN`] bytes.
    pub fn parse(bytes: &[u8; SUPER_LEN]) -> Result<SuperBlock, LogError> {
        let magic = le64(bytes, 0);
        if magic != MAGIC {
            return Err(LogError::BadMagic {
                found: magic,
                expected: MAGIC,
            });
        }
        let version = le64(bytes, 8);
        if version != VERSION {
            return Err(LogError::BadVersion(version));
        }
        let nr_entries = le64(bytes, 16);
        let sector_size = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
        if !sector_size.is_power_of_two()
            || !(SECTOR_SIZE_MIN..=SECTOR_SIZE_MAX).contains(&sector_size)
        {
            return Err(LogError::BadSectorSize(sector_size));
        }
        Ok(SuperBlock {
            nr_entries,
            sector_size,
        })
    }

    /// Encodes the fields (the caller pads them to a sector).
    pub fn encode(&self) -> [u8; SUPER_LEN] {
        let mut b = [0u8; SUPER_LEN];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.nr_entries.to_le_bytes());
        b[24..28].copy_from_slice(&self.sector_size.to_le_bytes());
        b
    }
}

/// An entry header as stored; nothing in it is checked yet except that
/// the flags are known (see [`crate::log`] for the checks against sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// First sector written (units of the sector size).
    pub sector: u64,
    /// Sectors written or discarded.
    pub nr_sectors: u64,
    /// What kind of entry.
    pub flags: Flags,
    /// Bytes of private data (a mark's name).
    pub data_len: u64,
}

impl EntryHeader {
    /// Decodes a header; `index` names the entry in errors.
    pub fn parse(bytes: &[u8; ENTRY_HEADER_LEN], index: u64) -> Result<EntryHeader, LogError> {
        let bits = le64(bytes, 16);
        let flags = Flags::from_bits(bits).ok_or(LogError::UnknownFlags {
            index,
            bits: bits & !Flags::KNOWN,
        })?;
        Ok(EntryHeader {
            sector: le64(bytes, 0),
            nr_sectors: le64(bytes, 8),
            flags,
            data_len: le64(bytes, 24),
        })
    }

    /// Encodes the fields (the caller pads them to a sector).
    pub fn encode(&self) -> [u8; ENTRY_HEADER_LEN] {
        let mut b = [0u8; ENTRY_HEADER_LEN];
        b[0..8].copy_from_slice(&self.sector.to_le_bytes());
        b[8..16].copy_from_slice(&self.nr_sectors.to_le_bytes());
        b[16..24].copy_from_slice(&self.flags.bits().to_le_bytes());
        b[24..32].copy_from_slice(&self.data_len.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn super_block_round_trips() {
        let sb = SuperBlock {
            nr_entries: 42,
            sector_size: 4096,
        };
        assert_eq!(SuperBlock::parse(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn magic_matches_the_kernels_ascii() {
        // "jsfwshr" read as a little-endian integer, most significant first.
        let b = MAGIC.to_le_bytes();
        assert_eq!(&b[..7], b"rhswfsj");
        assert_eq!(b[7], 0);
    }

    #[test]
    fn bad_super_blocks_are_refused() {
        let good = SuperBlock {
            nr_entries: 1,
            sector_size: 512,
        }
        .encode();
        let mut b = good;
        b[0] ^= 1;
        assert!(matches!(
            SuperBlock::parse(&b),
            Err(LogError::BadMagic { .. })
        ));
        let mut b = good;
        b[8] = 2;
        assert!(matches!(
            SuperBlock::parse(&b),
            Err(LogError::BadVersion(2))
        ));
        for size in [0u32, 256, 513, 1 << 17, u32::MAX] {
            let mut b = good;
            b[24..28].copy_from_slice(&size.to_le_bytes());
            assert!(
                matches!(SuperBlock::parse(&b), Err(LogError::BadSectorSize(s)) if s == size),
                "{size}"
            );
        }
    }

    #[test]
    fn entry_header_round_trips_and_refuses_unknown_flags() {
        let h = EntryHeader {
            sector: 7,
            nr_sectors: 8,
            flags: Flags::FUA | Flags::METADATA,
            data_len: 0,
        };
        assert_eq!(EntryHeader::parse(&h.encode(), 0).unwrap(), h);
        let mut b = h.encode();
        b[16] |= 0x40;
        assert!(matches!(
            EntryHeader::parse(&b, 3),
            Err(LogError::UnknownFlags {
                index: 3,
                bits: 0x40
            })
        ));
    }

    #[test]
    fn flags_display() {
        assert_eq!(Flags::NONE.to_string(), "-");
        assert_eq!((Flags::FLUSH | Flags::FUA).to_string(), "FLUSH|FUA");
        assert!(Flags::FUA.is_flush_point());
        assert!(!(Flags::MARK | Flags::METADATA).is_flush_point());
    }
}
