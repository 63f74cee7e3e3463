use std::io;

/// Why a log could not be read or replayed. Entry indices count from 0 in
/// log order.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Reading the log or writing the target failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The log device is smaller than one super block.
    #[error("log device of {log_bytes} bytes is too small for a super block")]
    LogTooSmall {
        /// The log device's size.
        log_bytes: u64,
    },
    /// The super block does not start with the dm-log-writes magic.
    #[error("not a dm-log-writes log (magic {found:#x}, expected {expected:#x})")]
    BadMagic {
        /// The magic found.
        found: u64,
        /// The magic expected.
        expected: u64,
    },
    /// A format version this tool does not know.
    #[error("unsupported log version {0} (this tool reads version 1)")]
    BadVersion(u64),
    /// A sector size that is not a power of two in 512..=65536.
    #[error("invalid sector size {0} in the super block")]
    BadSectorSize(u32),
    /// The super block counts more entries than the log device can hold.
    #[error(
        "super block claims {nr_entries} entries; a log of {log_bytes} bytes holds at most {fits}"
    )]
    TooManyEntries {
        /// Entries claimed.
        nr_entries: u64,
        /// Entries that fit (one block each, at least).
        fits: u64,
        /// The log device's size.
        log_bytes: u64,
    },
    /// An entry's header lies (partly) past the end of the log device.
    #[error(
        "entry {index}: header at byte {offset} is past the end of the log ({log_bytes} bytes)"
    )]
    EntryPastEnd {
        /// The entry.
        index: u64,
        /// Where its header would start.
        offset: u64,
        /// The log device's size.
        log_bytes: u64,
    },
    /// An entry's data lies (partly) past the end of the log device.
    #[error("entry {index}: {nr_sectors} sectors of data at byte {offset} run past the end of the log ({log_bytes} bytes)")]
    DataPastEnd {
        /// The entry.
        index: u64,
        /// Sectors the entry claims.
        nr_sectors: u64,
        /// Where its data starts.
        offset: u64,
        /// The log device's size.
        log_bytes: u64,
    },
    /// Flag bits this tool does not know.
    #[error("entry {index}: unknown flag bits {bits:#x}")]
    UnknownFlags {
        /// The entry.
        index: u64,
        /// The unknown bits.
        bits: u64,
    },
    /// A mark whose name does not fit in its header block, or which claims
    /// sectors.
    #[error("entry {index}: malformed mark ({why})")]
    BadMark {
        /// The entry.
        index: u64,
        /// What is wrong with it.
        why: String,
    },
    /// A non-mark entry with private data (an old kernel's inline data
    /// format, which this tool does not replay).
    #[error(
        "entry {index}: {data_len} bytes of inline data on a non-mark entry are not supported"
    )]
    InlineData {
        /// The entry.
        index: u64,
        /// Its data length.
        data_len: u64,
    },
    /// A write or discard outside the replay target.
    #[error("entry {index}: sectors {sector}+{nr_sectors} (of {sector_size} bytes) end past the replay target ({target_bytes} bytes)")]
    PastTarget {
        /// The entry.
        index: u64,
        /// First sector.
        sector: u64,
        /// Number of sectors.
        nr_sectors: u64,
        /// Bytes per sector.
        sector_size: u32,
        /// The target's size.
        target_bytes: u64,
    },
    /// `--until-mark` named a mark the log does not hold (at or after the
    /// start entry).
    #[error("no mark '{name}' at or after entry {start}")]
    MarkNotFound {
        /// The mark asked for.
        name: String,
        /// The first entry searched.
        start: u64,
    },
    /// An entry index outside the log, or a stop before the start.
    #[error("entry {wanted} is not in 0..{nr_entries} (or is before the start entry)")]
    NoSuchEntry {
        /// The entry asked for.
        wanted: u64,
        /// Entries in the log.
        nr_entries: u64,
    },
}

impl LogError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        LogError::Io {
            what: what.into(),
            source,
        }
    }
}
