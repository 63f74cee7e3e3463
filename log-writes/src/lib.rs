//! Reads and replays the logs that the kernel's `dm-log-writes` target
//! records, to check that a file system is consistent, and that what an
//! `fsync` promised is there, at every point where a power cut could have
//! happened (issue 15).
//!
//! `dm-log-writes` passes I/O through to a data device and appends every
//! write to a log device, in the order the writes became durable: plain
//! writes only once a flush that covers them completes, FUA writes when
//! they complete. Userspace can insert named marks
//! (`dmsetup message DEV 0 mark NAME`). Replaying the log onto a copy of the
//! data device's initial contents, up to a flush or FUA entry, gives exactly
//! what the device held at that point.
//!
//! # The log format
//!
//! All integers are little-endian. `S` is the sector size: the data
//! device's logical block size, recorded in the super block. Sector numbers
//! and counts in entries are in units of `S`, not of 512 bytes.
//!
//! - Block 0 (the first `S` bytes): the super block, `magic: u64`
//!   ([`format::MAGIC`]), `version: u64` (1), `nr_entries: u64`,
//!   `sector_size: u32`. The kernel rewrites it after FUA and mark entries
//!   and when the target is removed, so `nr_entries` is complete only once
//!   the device is gone (removal also appends the mark `dm-log-writes-end`).
//! - Then `nr_entries` entries back to back, each one block of header
//!   (`sector: u64`, `nr_sectors: u64`, `flags: u64`, `data_len: u64`; a
//!   mark's name follows the header in the same block, `data_len` bytes,
//!   no terminating NUL), followed by `nr_sectors * S` bytes of written data
//!   unless the entry is a discard (a discard names a range, it carries no
//!   data).
//! - Flags ([`format::Flags`]): `FLUSH` 1, `FUA` 2, `DISCARD` 4, `MARK` 8,
//!   `METADATA` 16 (the write was file system metadata; informational).
//!
//! Everything read from a log is untrusted: every count and length is
//! checked against the log device's and the replay target's sizes before it
//! is used, with overflow-checked arithmetic, and data is copied through
//! one bounded buffer ([`replay::CHUNK_BYTES`]), so a corrupt or hostile log
//! yields an error, never a huge allocation, a panic or a write outside the
//! target.
//!
//! # Modules
//!
//! - [`mod@format`]: the on-disk structures, parsed and encoded.
//! - [`device`]: byte-addressed devices (files, block devices, memory).
//! - [`mod@log`]: walks a log's entries.
//! - [`replay`]: applies entries to a target up to a stop point.
//! - [`writer`]: builds logs in the kernel's format (tests, reproductions).

pub mod device;
pub mod format;
pub mod log;
pub mod replay;
pub mod writer;

mod error;
#[cfg(test)]
mod tests;

pub use error::LogError;
