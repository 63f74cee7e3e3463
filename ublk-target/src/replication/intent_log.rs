//! The persistent write-intent log of a replicated volume: which regions
//! each replica missed, kept in a local file (normally
//! `/var/lib/ublk-nvmf/NAME.bitmap`; `docs/architecture.md` says why it is
//! local and not on the replicas).
//!
//! # File layout (format version 1, little endian)
//!
//! ```text
//! [0, 8 KiB)        header slot 0  } the same header, written alternately;
//! [8 KiB, 16 KiB)   header slot 1  } the valid one with the higher seq wins
//! [16 KiB, ...)     one bitmap per replica, each rounded up to 4 KiB pages:
//!                   bit r of replica i's bitmap = replica i missed a write
//!                   to region r (bytes [r × region_size, (r+1) × region_size))
//! ```
//!
//! A header holds: magic `ublk-nvmf-intent`, format version, its own length,
//! a sequence number, volume size, region size, the volume's degradation
//! generation, flags (clean shutdown), the replica count, the volume name,
//! and per replica its identity string (whatever the caller derives from
//! the namespace: [`replica_identity`]), its state (in sync or out of sync)
//! and its generation; then a CRC32C of everything before it.
//!
//! # How the engine uses it
//!
//! 1. [`IntentLog::open_or_create`] at start. A file for another volume
//!    size, region size, name or replica set is refused with an error that
//!    names the file and says what to do; so is a corrupt one.
//! 2. A replica's path fails: [`IntentLog::set_state`] (`OutOfSync`), then
//!    [`IntentLog::mark`] for each write that was outstanding on it.
//! 3. While any replica is out of sync, every write, discard and write
//!    zeroes first [`IntentLog::mark`]s its range for each replica that
//!    will not receive it; when the outcome asks for a sync, the request
//!    waits for a sync covering it ([`IntentLog::sync`], or the split
//!    [`IntentLog::begin_sync`] / [`SyncBatch::write`] /
//!    [`IntentLog::finish_sync`] to run the I/O outside a lock) **before it
//!    is sent to any replica**. Many marks share one sync (group commit).
//!    Waiting only before the acknowledgement would be enough for the
//!    acknowledged data, but not for consistency: if this host crashed
//!    after the write reached the live replicas and before its bit was
//!    durable, the returning replica would rejoin without that region and
//!    reads would alternate between old and new data. The wait is paid
//!    once per region per degradation: later writes to the region find
//!    the bit set and durable.
//! 4. Resync ([`crate::replication::resync`]) walks [`IntentLog::dirty_regions`] and
//!    [`IntentLog::clear`]s each region it copied; when none is left,
//!    [`IntentLog::set_state`] (`InSync`).
//! 5. Orderly shutdown: [`IntentLog::close_clean`].
//!
//! # Crash safety
//!
//! - Bits are only ever set by writes the engine has not yet sent, and a
//!   write is sent (hence acknowledged) only after the sync that covers its
//!   bit returned (`pwrite` of the dirty pages, then `fdatasync`). A crash
//!   at any point therefore leaves every bit of every sent write on disk,
//!   and possibly more bits: a torn page write mixes old and new sectors of
//!   a page whose bits only went from 0 to 1 (or were being cleared, see
//!   below), so each bit reads as either its old or its new value, and an
//!   unacknowledged new value is not needed.
//! - Clears are lazy: written with the next sync, never waited for. A lost
//!   or torn clear leaves a bit set, which costs one extra copy of that
//!   region, never a missed one.
//! - The header is written to the slot not holding the current header, with
//!   a sequence number and a checksum; a torn header write leaves the other
//!   slot valid, and an unacknowledged state change is simply not seen.
//! - A replica recorded in sync but with bits set (a crash between writing
//!   its `InSync` header and its cleared pages, or a misuse) is reopened as
//!   out of sync: extra resync, never a missed region.
//! - A file that is not a valid log (bad magic, both header checksums bad,
//!   wrong length, unknown version) is an error naming the file, never
//!   treated as clean; a new file is written under a temporary name,
//!   synced and renamed, so a crash while creating it leaves no half file.
//! - A failed sync poisons the log: Linux may drop the dirty pages of a
//!   failed `fdatasync` and report success on a retry, so no later sync is
//!   trusted and every one returns the original error.
//! - An exclusive `flock` keeps a second server (a duplicated config) from
//!   using the same file.
//!
//! # What the local file cannot do
//!
//! - The degradation generation goes up each time a replica goes out of
//!   sync, and each replica records the generation at which its bitmap
//!   started. Today the local file is the only record; a copy kept on the
//!   replicas (an NVMe reservation key is one candidate) would let a new
//!   host detect a stale replica. Until then, a new file (new host, lost
//!   file) takes replica 0 as the source and marks every other replica
//!   fully dirty: if the old host died while replica 0 was the stale one,
//!   list the current replica first before starting again.
//! - Writes in flight on *every* replica when this host crashes may have
//!   reached some replicas and not others; no bit records that (md
//!   records it with a bitmap of every in-flight write, at the cost of a
//!   sync on the healthy path). [`Opened::Existing`] reports whether the
//!   previous run shut down cleanly, so the engine can decide (e.g. resync
//!   in full from replica 0 after an unclean stop).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File magic, at offset 0 of each header slot.
pub const MAGIC: [u8; 16] = *b"ublk-nvmf-intent";
/// The format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Most replicas a log holds (as `config::MAX_REPLICAS`).
pub const MAX_REPLICAS: usize = 16;
/// Longest replica identity, in bytes.
pub const MAX_IDENTITY_LEN: usize = 400;
/// Longest volume name, in bytes (as `config::valid_name`).
pub const MAX_NAME_LEN: usize = 64;
/// Smallest region size accepted.
pub const MIN_REGION_SIZE: u64 = 4096;

/// Unit of bitmap writes: a page.
const PAGE: u64 = 4096;
/// Bytes of one header slot (the largest header is under 7 KiB).
const HEADER_SLOT: u64 = 8192;
/// Where the first bitmap starts.
const BITMAP_OFFSET: u64 = 2 * HEADER_SLOT;
const FLAG_CLEAN_SHUTDOWN: u32 = 1;

/// What [`IntentLog`] reports; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum IntentLogError {
    /// A system call on the file failed.
    #[error("{path}: {context}: {source}", path = .path.display())]
    Io {
        /// The log file.
        path: PathBuf,
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The file is not a valid write-intent log.
    #[error(
        "{path}: not a valid ublk-nvmf write-intent log ({reason}); it is never taken as clean. \
         If every replica is known to hold the same data, or replica 0 may be copied in full to \
         the others, move the file away and start again; otherwise restore it from a backup",
        path = .path.display()
    )]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file belongs to another volume, geometry or replica set.
    #[error(
        "{path}: the write-intent log is for a different volume ({what}). If the config \
         changed by mistake, restore it; if the volume really changed, move the file away: a new \
         one takes replica 0 as the source and copies it in full to the others",
        path = .path.display()
    )]
    Mismatch {
        /// The log file.
        path: PathBuf,
        /// What differs: the file's value and the caller's.
        what: String,
    },
    /// Another process holds the file.
    #[error(
        "{path}: in use by another process (another ublk-nvmf serving the same volume?)",
        path = .path.display()
    )]
    Locked {
        /// The log file.
        path: PathBuf,
    },
    /// An earlier sync failed; nothing written since can be trusted.
    #[error(
        "{path}: an earlier sync failed ({cause}); the write-intent log cannot record more \
         writes until the server restarts",
        path = .path.display()
    )]
    Poisoned {
        /// The log file.
        path: PathBuf,
        /// The first failure.
        cause: String,
    },
    /// A caller error: bad geometry, identity, replica index or sequence.
    #[error("{path}: {message}", path = .path.display())]
    Invalid {
        /// The log file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl From<IntentLogError> for crate::Error {
    fn from(e: IntentLogError) -> Self {
        crate::Error::State(e.to_string())
    }
}

/// The volume a log belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// Volume name (as in the config).
    pub volume_name: String,
    /// Volume size in bytes (every replica's namespace size).
    pub volume_size: u64,
    /// Bytes per bit: a power of two, at least 4 KiB.
    pub region_size: u64,
}

impl Geometry {
    /// Regions of the volume (the last one may be partial).
    pub fn region_count(&self) -> u64 {
        self.volume_size.div_ceil(self.region_size)
    }

    /// The bytes of the volume that `region` covers.
    pub fn region_range(&self, region: u64) -> Range<u64> {
        let start = region
            .saturating_mul(self.region_size)
            .min(self.volume_size);
        start..start.saturating_add(self.region_size).min(self.volume_size)
    }

    /// The regions that bytes `range` touch.
    pub fn regions_of(&self, range: &Range<u64>) -> Range<u64> {
        let end = range.end.min(self.volume_size);
        if range.start >= end {
            return 0..0;
        }
        range.start / self.region_size..end.div_ceil(self.region_size)
    }

    fn bitmap_stride(&self) -> u64 {
        self.region_count().div_ceil(8).div_ceil(PAGE) * PAGE
    }
}

/// The identity of a replica namespace as the log records it: what names
/// the data, not where it is reached (a target may change address).
pub fn replica_identity(subnqn: &str, nsid: u32, serial: &str) -> String {
    format!("{subnqn} nsid {nsid} serial {}", serial.trim())
}

/// Whether a replica holds all of the volume's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaSyncState {
    /// Holds every acknowledged write.
    InSync,
    /// Missed the writes its bitmap records (and may not serve reads).
    OutOfSync,
}

/// One replica's entry in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRecord {
    /// The identity given at creation.
    pub identity: String,
    /// In or out of sync.
    pub state: ReplicaSyncState,
    /// The volume generation when it was last put in or out of sync.
    pub generation: u64,
}

/// How [`IntentLog::open_or_create`] found the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// There was none: a new log, replica 0 in sync, every other replica
    /// out of sync with every region dirty (an initial full copy).
    Created,
    /// An existing log for this volume.
    Existing {
        /// Whether the previous run ended with [`IntentLog::close_clean`].
        clean_shutdown: bool,
        /// Replicas recorded in sync with bits set, reopened out of sync.
        demoted: usize,
    },
}

/// A sync sequence number: a mark is durable once the sync of its epoch
/// (or a later one) has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SyncEpoch(pub u64);

/// What [`IntentLog::mark`] (or [`IntentLog::set_state`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkOutcome {
    /// Bits that went from 0 to 1.
    pub newly_set: u64,
    /// `Some(e)`: the request must wait until [`IntentLog::is_durable`]`(e)`
    /// (a sync of epoch `e` or later finished) before it is sent; `None`:
    /// every bit it needs is already on disk.
    pub wait_for: Option<SyncEpoch>,
}

impl MarkOutcome {
    /// Whether a sync must finish before the request may go out.
    pub fn needs_sync(&self) -> bool {
        self.wait_for.is_some()
    }

    fn merge(self, other: MarkOutcome) -> MarkOutcome {
        MarkOutcome {
            newly_set: self.newly_set + other.newly_set,
            wait_for: self.wait_for.max(other.wait_for),
        }
    }
}

/// The pages one sync writes, taken by [`IntentLog::begin_sync`]; its I/O
/// ([`SyncBatch::write`]) needs no access to the log, so it may run outside
/// the caller's lock or on another thread.
#[derive(Debug)]
pub struct SyncBatch {
    epoch: SyncEpoch,
    file: Arc<File>,
    path: PathBuf,
    /// (file offset, bytes), ascending and coalesced.
    writes: Vec<(u64, Vec<u8>)>,
    header_seq: Option<u64>,
}

impl SyncBatch {
    /// The epoch this batch makes durable.
    pub fn epoch(&self) -> SyncEpoch {
        self.epoch
    }

    /// Bytes it writes.
    pub fn bytes(&self) -> u64 {
        self.writes.iter().map(|(_, b)| b.len() as u64).sum()
    }

    /// `pwrite` every page, then `fdatasync`.
    pub fn write(&self) -> Result<(), IntentLogError> {
        let io = |context, source| IntentLogError::Io {
            path: self.path.clone(),
            context,
            source,
        };
        for (offset, bytes) in &self.writes {
            self.file
                .write_all_at(bytes, *offset)
                .map_err(|e| io("writing bitmap pages", e))?;
        }
        self.file.sync_data().map_err(|e| io("fdatasync", e))
    }
}

/// The write-intent log of one volume (see the module docs).
#[derive(Debug)]
pub struct IntentLog {
    path: PathBuf,
    file: Arc<File>,
    geometry: Geometry,
    replicas: Vec<ReplicaRecord>,
    generation: u64,
    clean_shutdown: bool,
    /// One bitmap per replica, `bitmap_stride` bytes each.
    bitmaps: Vec<Vec<u8>>,
    /// Pages (file offsets) changed in memory since the last batch took them.
    dirty_pages: BTreeSet<u64>,
    /// Pages with a bit set that no finished sync has covered yet: the
    /// epoch that will cover it.
    unsynced_sets: BTreeMap<u64, SyncEpoch>,
    header_dirty: bool,
    /// Epoch that will cover the latest state change, until it is durable.
    header_unsynced: Option<SyncEpoch>,
    /// Sequence number of the newest header handed to a sync.
    header_seq: u64,
    /// The epoch the next [`IntentLog::begin_sync`] will write.
    next_epoch: u64,
    durable_epoch: u64,
    sync_in_flight: bool,
    poisoned: Option<String>,
}

impl IntentLog {
    /// Opens the log at `path` for a volume of `geometry` with replicas
    /// `identities` (in config order), or creates it if there is none.
    ///
    /// Refuses a file made for another name, size, region size or replica
    /// set, and a corrupt one, with an error naming the file and saying what
    /// to do. Marks the log "in use" (not cleanly shut down) on disk before
    /// returning.
    pub fn open_or_create(
        path: &Path,
        geometry: &Geometry,
        identities: &[String],
    ) -> Result<(IntentLog, Opened), IntentLogError> {
        check_arguments(path, geometry, identities)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| IntentLogError::Io {
                path: path.to_path_buf(),
                context: "creating its directory",
                source: e,
            })?;
        }
        let opened = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => {
                lock(path, &file)?;
                let mut log = Self::load(path, file, geometry, identities)?;
                let demoted = log.demote_dirty_in_sync();
                let clean_shutdown = log.clean_shutdown;
                log.clean_shutdown = false;
                log.header_dirty = true;
                log.sync()?;
                (
                    log,
                    Opened::Existing {
                        clean_shutdown,
                        demoted,
                    },
                )
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                (Self::create(path, geometry, identities)?, Opened::Created)
            }
            Err(e) => {
                return Err(IntentLogError::Io {
                    path: path.to_path_buf(),
                    context: "opening",
                    source: e,
                })
            }
        };
        Ok(opened)
    }

    /// Writes a new log under a temporary name, syncs it and renames it into
    /// place, so a crash never leaves a half-written log at `path`.
    fn create(
        path: &Path,
        geometry: &Geometry,
        identities: &[String],
    ) -> Result<IntentLog, IntentLogError> {
        let io = |context, source| IntentLogError::Io {
            path: path.to_path_buf(),
            context,
            source,
        };
        let stride = geometry.bitmap_stride() as usize;
        let regions = geometry.region_count();
        let mut full = vec![0u8; stride];
        for r in 0..regions {
            full[(r / 8) as usize] |= 1 << (r % 8);
        }
        let replicas: Vec<ReplicaRecord> = identities
            .iter()
            .enumerate()
            .map(|(i, id)| ReplicaRecord {
                identity: id.clone(),
                state: if i == 0 {
                    ReplicaSyncState::InSync
                } else {
                    ReplicaSyncState::OutOfSync
                },
                generation: 1,
            })
            .collect();
        let bitmaps: Vec<Vec<u8>> = (0..identities.len())
            .map(|i| {
                if i == 0 {
                    vec![0; stride]
                } else {
                    full.clone()
                }
            })
            .collect();
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".new");
        let tmp = PathBuf::from(tmp_name);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io("creating", e))?;
        let header = encode_header(&HeaderFields {
            seq: 1,
            geometry,
            generation: 1,
            flags: 0,
            replicas: &replicas,
        });
        // The same header in both slots: whichever the next header write
        // tears, the other one is valid.
        let mut image = vec![0u8; BITMAP_OFFSET as usize];
        for slot in 0..2 {
            let at = slot * HEADER_SLOT as usize;
            image[at..at + header.len()].copy_from_slice(&header);
        }
        file.write_all(&image).map_err(|e| io("writing", e))?;
        for b in &bitmaps {
            file.write_all(b).map_err(|e| io("writing", e))?;
        }
        file.sync_all().map_err(|e| io("fsync", e))?;
        lock(path, &file)?;
        std::fs::rename(&tmp, path).map_err(|e| io("renaming the new file into place", e))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // The rename is durable only once the directory is.
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("fsync of its directory", e))?;
        }
        Ok(IntentLog {
            path: path.to_path_buf(),
            file: Arc::new(file),
            geometry: geometry.clone(),
            replicas,
            generation: 1,
            clean_shutdown: false,
            bitmaps,
            dirty_pages: BTreeSet::new(),
            unsynced_sets: BTreeMap::new(),
            header_dirty: false,
            header_unsynced: None,
            header_seq: 1,
            next_epoch: 1,
            durable_epoch: 0,
            sync_in_flight: false,
            poisoned: None,
        })
    }

    fn load(
        path: &Path,
        file: File,
        geometry: &Geometry,
        identities: &[String],
    ) -> Result<IntentLog, IntentLogError> {
        let corrupt = |reason: String| IntentLogError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let len = file
            .metadata()
            .map_err(|e| IntentLogError::Io {
                path: path.to_path_buf(),
                context: "stat",
                source: e,
            })?
            .len();
        if len < BITMAP_OFFSET {
            return Err(corrupt(format!("{len} bytes, shorter than its headers")));
        }
        let mut slots = vec![0u8; BITMAP_OFFSET as usize];
        file.read_exact_at(&mut slots, 0)
            .map_err(|e| IntentLogError::Io {
                path: path.to_path_buf(),
                context: "reading the header",
                source: e,
            })?;
        let decoded: Vec<Result<Header, String>> = slots
            .chunks_exact(HEADER_SLOT as usize)
            .map(decode_header)
            .collect();
        let header = match (&decoded[0], &decoded[1]) {
            (Ok(a), Ok(b)) => {
                if a.seq >= b.seq {
                    a.clone()
                } else {
                    b.clone()
                }
            }
            (Ok(a), Err(_)) => a.clone(),
            (Err(_), Ok(b)) => b.clone(),
            (Err(a), Err(b)) => return Err(corrupt(format!("header 0: {a}; header 1: {b}"))),
        };
        let mismatch = |what: String| IntentLogError::Mismatch {
            path: path.to_path_buf(),
            what,
        };
        if header.volume_name != geometry.volume_name {
            return Err(mismatch(format!(
                "volume name {:?} in the file, {:?} now",
                header.volume_name, geometry.volume_name
            )));
        }
        if header.volume_size != geometry.volume_size {
            return Err(mismatch(format!(
                "volume size {} bytes in the file, {} now",
                header.volume_size, geometry.volume_size
            )));
        }
        if header.region_size != geometry.region_size {
            return Err(mismatch(format!(
                "region size {} bytes in the file, {} now (replication.region_size)",
                header.region_size, geometry.region_size
            )));
        }
        let found: Vec<&str> = header
            .replicas
            .iter()
            .map(|r| r.identity.as_str())
            .collect();
        if found != identities {
            return Err(mismatch(format!(
                "replicas [{}] in the file, [{}] now",
                found.join(", "),
                identities.join(", ")
            )));
        }
        let stride = geometry.bitmap_stride();
        let expected = BITMAP_OFFSET + stride * identities.len() as u64;
        if len != expected {
            return Err(corrupt(format!(
                "{len} bytes, expected {expected} for this geometry"
            )));
        }
        let mut bitmaps = Vec::with_capacity(identities.len());
        for i in 0..identities.len() {
            let mut b = vec![0u8; stride as usize];
            file.read_exact_at(&mut b, BITMAP_OFFSET + stride * i as u64)
                .map_err(|e| IntentLogError::Io {
                    path: path.to_path_buf(),
                    context: "reading a bitmap",
                    source: e,
                })?;
            // Bits past the last region are never set; one set means the
            // page holds something else.
            let regions = geometry.region_count();
            let stray = (regions..stride * 8).any(|r| b[(r / 8) as usize] & (1 << (r % 8)) != 0);
            if stray {
                return Err(corrupt(format!(
                    "replica {i}'s bitmap has bits past the last region"
                )));
            }
            bitmaps.push(b);
        }
        Ok(IntentLog {
            path: path.to_path_buf(),
            file: Arc::new(file),
            geometry: geometry.clone(),
            replicas: header.replicas,
            generation: header.generation,
            clean_shutdown: header.flags & FLAG_CLEAN_SHUTDOWN != 0,
            bitmaps,
            dirty_pages: BTreeSet::new(),
            unsynced_sets: BTreeMap::new(),
            header_dirty: false,
            header_unsynced: None,
            header_seq: header.seq,
            next_epoch: 1,
            durable_epoch: 0,
            sync_in_flight: false,
            poisoned: None,
        })
    }

    /// Replicas recorded in sync but with bits set are taken as out of
    /// sync (see the module docs); how many.
    fn demote_dirty_in_sync(&mut self) -> usize {
        let mut demoted = 0;
        for i in 0..self.replicas.len() {
            if self.replicas[i].state == ReplicaSyncState::InSync && self.dirty_count(i) > 0 {
                self.generation += 1;
                self.replicas[i].state = ReplicaSyncState::OutOfSync;
                self.replicas[i].generation = self.generation;
                demoted += 1;
            }
        }
        demoted
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The volume it describes.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Every replica's header entry, by index.
    pub fn replicas(&self) -> &[ReplicaRecord] {
        &self.replicas
    }

    /// The volume's degradation generation (goes up each time a replica
    /// goes out of sync).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn invalid(&self, message: String) -> IntentLogError {
        IntentLogError::Invalid {
            path: self.path.clone(),
            message,
        }
    }

    fn check_replica(&self, replica: usize) -> Result<(), IntentLogError> {
        if replica < self.replicas.len() {
            Ok(())
        } else {
            Err(self.invalid(format!(
                "no replica {replica} (the log has {})",
                self.replicas.len()
            )))
        }
    }

    fn page_of(&self, replica: usize, region: u64) -> u64 {
        let stride = self.geometry.bitmap_stride();
        BITMAP_OFFSET + stride * replica as u64 + (region / 8) / PAGE * PAGE
    }

    fn pending(&self) -> SyncEpoch {
        SyncEpoch(self.next_epoch)
    }

    /// Records that `replica` misses the write to bytes `range` (clamped to
    /// the volume). The outcome says whether, and for which sync, the write
    /// must wait before it is sent.
    pub fn mark(
        &mut self,
        replica: usize,
        range: Range<u64>,
    ) -> Result<MarkOutcome, IntentLogError> {
        self.check_replica(replica)?;
        let mut out = MarkOutcome {
            newly_set: 0,
            wait_for: None,
        };
        for region in self.geometry.regions_of(&range) {
            let page = self.page_of(replica, region);
            let (byte, bit) = ((region / 8) as usize, 1u8 << (region % 8));
            let b = &mut self.bitmaps[replica][byte];
            if *b & bit == 0 {
                *b |= bit;
                self.dirty_pages.insert(page);
                self.unsynced_sets.insert(page, self.pending());
                out = out.merge(MarkOutcome {
                    newly_set: 1,
                    wait_for: Some(self.pending()),
                });
            } else if let Some(&e) = self.unsynced_sets.get(&page) {
                // Set by an earlier mark whose sync has not finished (or a
                // later set on the same page): wait for that one.
                out = out.merge(MarkOutcome {
                    newly_set: 0,
                    wait_for: Some(e),
                });
            }
        }
        Ok(out)
    }

    /// Clears `replica`'s bit of `region` (resync copied it). Lazy: written
    /// with the next sync, never waited for.
    pub fn clear(&mut self, replica: usize, region: u64) -> Result<(), IntentLogError> {
        self.check_replica(replica)?;
        if region >= self.geometry.region_count() {
            return Err(self.invalid(format!(
                "no region {region} (the volume has {})",
                self.geometry.region_count()
            )));
        }
        let (byte, bit) = ((region / 8) as usize, 1u8 << (region % 8));
        if self.bitmaps[replica][byte] & bit != 0 {
            self.bitmaps[replica][byte] &= !bit;
            let page = self.page_of(replica, region);
            self.dirty_pages.insert(page);
        }
        Ok(())
    }

    /// Clears every bit of `replica`: the caller knows it holds the same
    /// data as the others (e.g. an operator's "assume clean" for blank
    /// namespaces). Lazy like [`IntentLog::clear`].
    pub fn clear_all(&mut self, replica: usize) -> Result<(), IntentLogError> {
        self.check_replica(replica)?;
        let regions: Vec<u64> = self.dirty_regions(replica).collect();
        for r in regions {
            self.clear(replica, r)?;
        }
        Ok(())
    }

    /// Whether `replica` missed a write to `region`.
    pub fn is_dirty(&self, replica: usize, region: u64) -> bool {
        region < self.geometry.region_count()
            && self
                .bitmaps
                .get(replica)
                .is_some_and(|b| b[(region / 8) as usize] & (1 << (region % 8)) != 0)
    }

    /// The regions `replica` missed, ascending.
    pub fn dirty_regions(&self, replica: usize) -> impl Iterator<Item = u64> + '_ {
        let bitmap = self.bitmaps.get(replica).map_or(&[][..], Vec::as_slice);
        bitmap
            .chunks(8)
            .enumerate()
            .filter(|(_, chunk)| chunk.iter().any(|b| *b != 0))
            .flat_map(|(i, chunk)| {
                chunk.iter().enumerate().flat_map(move |(j, b)| {
                    let base = (i * 64 + j * 8) as u64;
                    (0..8u64)
                        .filter(move |bit| b & (1 << bit) != 0)
                        .map(move |bit| base + bit)
                })
            })
    }

    /// How many regions `replica` missed.
    pub fn dirty_count(&self, replica: usize) -> u64 {
        self.bitmaps.get(replica).map_or(0, |b| {
            b.iter().map(|x| u64::from(x.count_ones())).sum::<u64>()
        })
    }

    /// Records `replica`'s state. Going out of sync starts a new
    /// degradation generation; the outcome says which sync makes it
    /// durable (wait for it before acknowledging writes the replica
    /// missed). Going in sync is refused while its bitmap has bits set
    /// (resync must [`IntentLog::clear`] them first).
    pub fn set_state(
        &mut self,
        replica: usize,
        state: ReplicaSyncState,
    ) -> Result<MarkOutcome, IntentLogError> {
        self.check_replica(replica)?;
        let unchanged = MarkOutcome {
            newly_set: 0,
            wait_for: self.header_unsynced,
        };
        if self.replicas[replica].state == state {
            return Ok(unchanged);
        }
        if state == ReplicaSyncState::InSync {
            let left = self.dirty_count(replica);
            if left > 0 {
                return Err(self.invalid(format!(
                    "replica {replica} cannot be in sync with {left} dirty regions"
                )));
            }
        } else {
            self.generation += 1;
        }
        self.replicas[replica].state = state;
        self.replicas[replica].generation = self.generation;
        self.header_dirty = true;
        self.header_unsynced = Some(self.pending());
        Ok(MarkOutcome {
            newly_set: 0,
            wait_for: self.header_unsynced,
        })
    }

    /// Whether the sync of `epoch` (or a later one) has finished.
    pub fn is_durable(&self, epoch: SyncEpoch) -> bool {
        epoch.0 <= self.durable_epoch
    }

    /// Whether anything awaits a sync.
    pub fn has_unsynced(&self) -> bool {
        !self.dirty_pages.is_empty() || self.header_dirty
    }

    /// Whether a [`SyncBatch`] is out.
    pub fn sync_in_flight(&self) -> bool {
        self.sync_in_flight
    }

    /// Takes everything changed since the last batch into a new one, or
    /// `None` when there is nothing to write. One batch at a time: while
    /// one is out, marks accumulate for the next (that is the group
    /// commit), and calling this again is an error.
    pub fn begin_sync(&mut self) -> Result<Option<SyncBatch>, IntentLogError> {
        if let Some(cause) = &self.poisoned {
            return Err(IntentLogError::Poisoned {
                path: self.path.clone(),
                cause: cause.clone(),
            });
        }
        if self.sync_in_flight {
            return Err(self.invalid("begin_sync while a sync is in flight".into()));
        }
        if !self.has_unsynced() {
            return Ok(None);
        }
        let epoch = SyncEpoch(self.next_epoch);
        self.next_epoch += 1;
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let stride = self.geometry.bitmap_stride();
        for page in std::mem::take(&mut self.dirty_pages) {
            let replica = ((page - BITMAP_OFFSET) / stride) as usize;
            let at = ((page - BITMAP_OFFSET) % stride) as usize;
            let bytes = &self.bitmaps[replica][at..at + PAGE as usize];
            match writes.last_mut() {
                Some((offset, buf)) if *offset + buf.len() as u64 == page => {
                    buf.extend_from_slice(bytes)
                }
                _ => writes.push((page, bytes.to_vec())),
            }
        }
        let mut header_seq = None;
        if self.header_dirty {
            self.header_dirty = false;
            self.header_seq += 1;
            let seq = self.header_seq;
            let bytes = encode_header(&HeaderFields {
                seq,
                geometry: &self.geometry,
                generation: self.generation,
                flags: if self.clean_shutdown {
                    FLAG_CLEAN_SHUTDOWN
                } else {
                    0
                },
                replicas: &self.replicas,
            });
            // Bitmap pages first: the header goes last in submission order
            // (the fdatasync orders nothing, but a writer stopped midway
            // then leaves the older header, which is the cautious side).
            writes.push(((seq % 2) * HEADER_SLOT, bytes));
            header_seq = Some(seq);
        }
        self.sync_in_flight = true;
        Ok(Some(SyncBatch {
            epoch,
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            writes,
            header_seq,
        }))
    }

    /// Records the result of `batch`'s [`SyncBatch::write`]. Success makes
    /// its epoch durable; failure poisons the log (see the module docs).
    pub fn finish_sync(
        &mut self,
        batch: SyncBatch,
        result: Result<(), IntentLogError>,
    ) -> Result<SyncEpoch, IntentLogError> {
        self.sync_in_flight = false;
        if let Err(e) = result {
            let cause = e.to_string();
            self.poisoned.get_or_insert(cause);
            return Err(e);
        }
        let e = batch.epoch;
        self.durable_epoch = self.durable_epoch.max(e.0);
        self.unsynced_sets.retain(|_, v| *v > e);
        if self.header_unsynced.is_some_and(|h| h <= e) {
            self.header_unsynced = None;
        }
        debug_assert!(batch.header_seq.is_none_or(|s| s <= self.header_seq));
        Ok(e)
    }

    /// One whole sync: [`IntentLog::begin_sync`], [`SyncBatch::write`],
    /// [`IntentLog::finish_sync`]. Everything marked before the call is
    /// durable when it returns `Ok`.
    pub fn sync(&mut self) -> Result<(), IntentLogError> {
        if let Some(batch) = self.begin_sync()? {
            let result = batch.write();
            self.finish_sync(batch, result)?;
        }
        Ok(())
    }

    /// Records an orderly shutdown (every request completed) and syncs.
    pub fn close_clean(mut self) -> Result<(), IntentLogError> {
        self.mark_clean_shutdown()
    }

    /// [`IntentLog::close_clean`] for a log still shared (behind a lock):
    /// the caller must not mark anything afterwards.
    pub fn mark_clean_shutdown(&mut self) -> Result<(), IntentLogError> {
        self.clean_shutdown = true;
        self.header_dirty = true;
        self.sync()
    }
}

fn check_arguments(
    path: &Path,
    geometry: &Geometry,
    identities: &[String],
) -> Result<(), IntentLogError> {
    let invalid = |message: String| IntentLogError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    if geometry.volume_name.is_empty() || geometry.volume_name.len() > MAX_NAME_LEN {
        return Err(invalid(format!(
            "a volume name has 1 to {MAX_NAME_LEN} bytes"
        )));
    }
    if !geometry.region_size.is_power_of_two() || geometry.region_size < MIN_REGION_SIZE {
        return Err(invalid(format!(
            "region size {} is not a power of two of at least {MIN_REGION_SIZE}",
            geometry.region_size
        )));
    }
    if geometry.volume_size == 0 {
        return Err(invalid("volume size 0".into()));
    }
    if identities.is_empty() || identities.len() > MAX_REPLICAS {
        return Err(invalid(format!(
            "{} replicas; a log holds 1 to {MAX_REPLICAS}",
            identities.len()
        )));
    }
    for (i, id) in identities.iter().enumerate() {
        if id.is_empty() || id.len() > MAX_IDENTITY_LEN {
            return Err(invalid(format!(
                "replica {i}'s identity has {} bytes; 1 to {MAX_IDENTITY_LEN} allowed",
                id.len()
            )));
        }
        if identities[..i].contains(id) {
            return Err(invalid(format!(
                "replicas {} and {i} have the same identity {id:?}",
                identities[..i].iter().position(|x| x == id).unwrap_or(0)
            )));
        }
    }
    Ok(())
}

fn lock(path: &Path, file: &File) -> Result<(), IntentLogError> {
    // SAFETY: flock on a valid descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(IntentLogError::Locked {
            path: path.to_path_buf(),
        })
    } else {
        Err(IntentLogError::Io {
            path: path.to_path_buf(),
            context: "flock",
            source: e,
        })
    }
}

struct HeaderFields<'a> {
    seq: u64,
    geometry: &'a Geometry,
    generation: u64,
    flags: u32,
    replicas: &'a [ReplicaRecord],
}

#[derive(Debug, Clone)]
struct Header {
    seq: u64,
    volume_name: String,
    volume_size: u64,
    region_size: u64,
    generation: u64,
    flags: u32,
    replicas: Vec<ReplicaRecord>,
}

fn encode_header(h: &HeaderFields<'_>) -> Vec<u8> {
    let mut b = Vec::with_capacity(1024);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // length, filled in below
    b.extend_from_slice(&h.seq.to_le_bytes());
    b.extend_from_slice(&h.geometry.volume_size.to_le_bytes());
    b.extend_from_slice(&h.geometry.region_size.to_le_bytes());
    b.extend_from_slice(&h.generation.to_le_bytes());
    b.extend_from_slice(&h.flags.to_le_bytes());
    b.extend_from_slice(&(h.replicas.len() as u32).to_le_bytes());
    let put_str = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u16).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    put_str(&mut b, &h.geometry.volume_name);
    for r in h.replicas {
        put_str(&mut b, &r.identity);
        b.push(match r.state {
            ReplicaSyncState::InSync => 0,
            ReplicaSyncState::OutOfSync => 1,
        });
        b.extend_from_slice(&r.generation.to_le_bytes());
    }
    let len = b.len() as u32;
    b[20..24].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    debug_assert!(b.len() as u64 <= HEADER_SLOT);
    // Whole pages, so the write never needs a read-modify-write.
    b.resize(b.len().div_ceil(PAGE as usize) * PAGE as usize, 0);
    b
}

/// Reads fields from a header slot, bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| "header truncated".to_string())?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a name is not UTF-8".to_string())
    }
}

fn decode_header(slot: &[u8]) -> Result<Header, String> {
    if slot[..16] != MAGIC {
        return Err("bad magic".into());
    }
    let mut r = Reader { buf: slot, at: 16 };
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}; this ublk-nvmf reads version {FORMAT_VERSION}"
        ));
    }
    let len = r.u32()? as usize;
    if len < 64 || len + 4 > slot.len() {
        return Err(format!("header length {len} out of range"));
    }
    let stored = u32::from_le_bytes(slot[len..len + 4].try_into().expect("4"));
    if crc32c::crc32c(&slot[..len]) != stored {
        return Err("header checksum mismatch".into());
    }
    let mut r = Reader {
        buf: &slot[..len],
        at: 24,
    };
    let seq = r.u64()?;
    let volume_size = r.u64()?;
    let region_size = r.u64()?;
    let generation = r.u64()?;
    let flags = r.u32()?;
    let count = r.u32()? as usize;
    if count == 0 || count > MAX_REPLICAS {
        return Err(format!("{count} replicas"));
    }
    if !region_size.is_power_of_two() || volume_size == 0 {
        return Err("bad geometry".into());
    }
    let volume_name = r.string()?;
    let mut replicas = Vec::with_capacity(count);
    for _ in 0..count {
        let identity = r.string()?;
        let state = match r.take(1)?[0] {
            0 => ReplicaSyncState::InSync,
            1 => ReplicaSyncState::OutOfSync,
            s => return Err(format!("unknown replica state {s}")),
        };
        let generation = r.u64()?;
        replicas.push(ReplicaRecord {
            identity,
            state,
            generation,
        });
    }
    Ok(Header {
        seq,
        volume_name,
        volume_size,
        region_size,
        generation,
        flags,
        replicas,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn geometry() -> Geometry {
        Geometry {
            volume_name: "vol0".into(),
            volume_size: 100 * MIB + 4096,
            region_size: MIB,
        }
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| replica_identity(&format!("nqn.2026-01.io.gimbal:{i}"), 1, "SN"))
            .collect()
    }

    fn fresh(dir: &tempfile::TempDir, n: usize) -> (IntentLog, PathBuf) {
        let path = dir.path().join("vol0.bitmap");
        let (mut log, opened) = IntentLog::open_or_create(&path, &geometry(), &ids(n)).unwrap();
        assert_eq!(opened, Opened::Created);
        // Start from "every replica in sync", as after an initial copy.
        for r in 1..n {
            log.clear_all(r).unwrap();
            log.set_state(r, ReplicaSyncState::InSync).unwrap();
        }
        log.sync().unwrap();
        (log, path)
    }

    #[test]
    fn geometry_maps_bytes_to_regions() {
        let g = geometry();
        assert_eq!(g.region_count(), 101);
        assert_eq!(g.regions_of(&(0..1)), 0..1);
        assert_eq!(g.regions_of(&(MIB - 1..MIB + 1)), 0..2);
        assert_eq!(g.regions_of(&(5..5)), 0..0);
        assert_eq!(g.regions_of(&(100 * MIB..u64::MAX)), 100..101);
        assert_eq!(g.region_range(100), 100 * MIB..100 * MIB + 4096);
        assert_eq!(g.bitmap_stride(), PAGE);
    }

    #[test]
    fn a_new_log_copies_replica_0_to_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/vol0.bitmap");
        let (log, opened) = IntentLog::open_or_create(&path, &geometry(), &ids(3)).unwrap();
        assert_eq!(opened, Opened::Created);
        assert_eq!(log.replicas()[0].state, ReplicaSyncState::InSync);
        assert_eq!(log.dirty_count(0), 0);
        for r in 1..3 {
            assert_eq!(log.replicas()[r].state, ReplicaSyncState::OutOfSync);
            assert_eq!(log.dirty_count(r), 101);
            assert_eq!(
                log.dirty_regions(r).collect::<Vec<_>>(),
                (0..101).collect::<Vec<_>>()
            );
        }
        assert!(!path.with_extension("bitmap.new").exists());
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, BITMAP_OFFSET + 3 * PAGE);
    }

    #[test]
    fn marks_need_one_sync_then_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = fresh(&dir, 2);
        let a = log.mark(1, 0..4096).unwrap();
        assert_eq!(a.newly_set, 1);
        let e = a.wait_for.expect("a new bit needs a sync");
        assert!(!log.is_durable(e));
        // Same region again before the sync: nothing new, still waits.
        let b = log.mark(1, 100..200).unwrap();
        assert_eq!((b.newly_set, b.wait_for), (0, Some(e)));
        // Group commit: a third mark rides the same sync.
        let c = log.mark(1, 3 * MIB..5 * MIB).unwrap();
        assert_eq!((c.newly_set, c.wait_for), (2, Some(e)));
        log.sync().unwrap();
        assert!(log.is_durable(e));
        let d = log.mark(1, 4 * MIB..4 * MIB + 1).unwrap();
        assert_eq!(
            d,
            MarkOutcome {
                newly_set: 0,
                wait_for: None
            }
        );
        assert!(!d.needs_sync());
        assert_eq!(log.dirty_regions(1).collect::<Vec<_>>(), [0, 3, 4]);
        assert_eq!(log.dirty_count(0), 0);
    }

    #[test]
    fn marks_during_a_sync_wait_for_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = fresh(&dir, 2);
        let first = log.mark(1, 0..1).unwrap().wait_for.unwrap();
        let batch = log.begin_sync().unwrap().unwrap();
        assert_eq!(batch.epoch(), first);
        assert!(log.begin_sync().is_err(), "one batch at a time");
        // The bit of region 0 is in the batch: a repeat waits for it.
        assert_eq!(log.mark(1, 0..1).unwrap().wait_for, Some(first));
        let second = log.mark(1, MIB..MIB + 1).unwrap().wait_for.unwrap();
        assert!(second > first);
        let result = batch.write();
        log.finish_sync(batch, result).unwrap();
        assert!(log.is_durable(first) && !log.is_durable(second));
        // Region 1 shares the page of region 0: conservatively waits.
        assert_eq!(log.mark(1, 0..1).unwrap().wait_for, Some(second));
        log.sync().unwrap();
        assert!(log.is_durable(second));
        assert_eq!(log.mark(1, 0..1).unwrap().wait_for, None);
    }

    #[test]
    fn only_dirty_pages_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bitmap");
        let g = Geometry {
            volume_name: "big".into(),
            volume_size: 1 << 40,
            region_size: MIB,
        };
        let (mut log, _) = IntentLog::open_or_create(&path, &g, &ids(2)).unwrap();
        log.clear_all(1).unwrap();
        log.set_state(1, ReplicaSyncState::InSync).unwrap();
        log.sync().unwrap();
        assert!(log.begin_sync().unwrap().is_none(), "nothing to write");
        log.mark(1, 0..1).unwrap();
        log.mark(1, 5 * MIB..5 * MIB + 1).unwrap();
        log.mark(1, (1 << 39)..(1 << 39) + 1).unwrap();
        let batch = log.begin_sync().unwrap().unwrap();
        // Two pages of replica 1's 32-page bitmap; no header change.
        assert_eq!(batch.bytes(), 2 * PAGE);
        let result = batch.write();
        log.finish_sync(batch, result).unwrap();
        log.set_state(1, ReplicaSyncState::OutOfSync).unwrap();
        let batch = log.begin_sync().unwrap().unwrap();
        assert_eq!(batch.bytes(), PAGE, "just the header");
        log.finish_sync(batch, Ok(())).unwrap();
    }

    #[test]
    fn state_and_bits_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = fresh(&dir, 3);
        let g0 = log.generation();
        log.set_state(2, ReplicaSyncState::OutOfSync).unwrap();
        assert_eq!(log.generation(), g0 + 1);
        log.mark(2, 7 * MIB..9 * MIB).unwrap();
        log.mark(2, 100 * MIB..100 * MIB + 10).unwrap();
        log.sync().unwrap();
        // Clears are lazy: one is synced, one is not (a crash loses it).
        log.clear(2, 7).unwrap();
        log.sync().unwrap();
        log.clear(2, 8).unwrap();
        drop(log);

        let (log, opened) = IntentLog::open_or_create(&path, &geometry(), &ids(3)).unwrap();
        assert_eq!(
            opened,
            Opened::Existing {
                clean_shutdown: false,
                demoted: 0
            }
        );
        assert_eq!(log.generation(), g0 + 1);
        assert_eq!(log.replicas()[2].state, ReplicaSyncState::OutOfSync);
        assert_eq!(log.replicas()[2].generation, g0 + 1);
        assert_eq!(log.replicas()[1].state, ReplicaSyncState::InSync);
        assert_eq!(log.dirty_regions(2).collect::<Vec<_>>(), [8, 100]);
        log.close_clean().unwrap();

        let (mut log, opened) = IntentLog::open_or_create(&path, &geometry(), &ids(3)).unwrap();
        assert_eq!(
            opened,
            Opened::Existing {
                clean_shutdown: true,
                demoted: 0
            }
        );
        drop(log);
        // The clean flag is reset at open: a crash now is unclean.
        let (l, opened) = IntentLog::open_or_create(&path, &geometry(), &ids(3)).unwrap();
        assert!(matches!(
            opened,
            Opened::Existing {
                clean_shutdown: false,
                ..
            }
        ));
        log = l;
        log.clear(2, 8).unwrap();
        log.clear(2, 100).unwrap();
        log.set_state(2, ReplicaSyncState::InSync).unwrap();
        log.sync().unwrap();
        assert_eq!(log.dirty_count(2), 0);
    }

    #[test]
    fn in_sync_is_refused_while_bits_are_set() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = fresh(&dir, 2);
        log.set_state(1, ReplicaSyncState::OutOfSync).unwrap();
        log.mark(1, 0..1).unwrap();
        let e = log.set_state(1, ReplicaSyncState::InSync).unwrap_err();
        assert!(e.to_string().contains("1 dirty regions"), "{e}");
        assert!(log.mark(2, 0..1).is_err());
        assert!(log.clear(1, 101).is_err());
    }

    #[test]
    fn an_in_sync_replica_with_bits_reopens_out_of_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = fresh(&dir, 2);
        // Marked without a state change (engine misuse, or a crash between
        // an InSync header and its cleared pages).
        log.mark(1, 0..1).unwrap();
        log.sync().unwrap();
        let g = log.generation();
        drop(log);
        let (log, opened) = IntentLog::open_or_create(&path, &geometry(), &ids(2)).unwrap();
        assert_eq!(
            opened,
            Opened::Existing {
                clean_shutdown: false,
                demoted: 1
            }
        );
        assert_eq!(log.replicas()[1].state, ReplicaSyncState::OutOfSync);
        assert_eq!(log.generation(), g + 1);
    }

    #[test]
    fn a_different_volume_is_refused_with_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let (log, path) = fresh(&dir, 2);
        drop(log);
        let mut g = geometry();
        g.volume_size += MIB;
        let e = IntentLog::open_or_create(&path, &g, &ids(2)).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, IntentLogError::Mismatch { .. }), "{s}");
        assert!(s.starts_with(&path.display().to_string()), "{s}");
        assert!(
            s.contains("volume size 104861696 bytes in the file, 105910272 now"),
            "{s}"
        );
        assert!(s.contains("move the file away"), "{s}");

        let mut g = geometry();
        g.region_size = 2 * MIB;
        let e = IntentLog::open_or_create(&path, &g, &ids(2)).unwrap_err();
        assert!(e.to_string().contains("region size 1048576"), "{e}");

        let mut g = geometry();
        g.volume_name = "vol1".into();
        let e = IntentLog::open_or_create(&path, &g, &ids(2)).unwrap_err();
        assert!(e.to_string().contains("\"vol0\" in the file"), "{e}");

        let e = IntentLog::open_or_create(&path, &geometry(), &ids(3)).unwrap_err();
        assert!(e.to_string().contains("replicas ["), "{e}");
        let mut swapped = ids(2);
        swapped.swap(0, 1);
        let e = IntentLog::open_or_create(&path, &geometry(), &swapped).unwrap_err();
        assert!(matches!(e, IntentLogError::Mismatch { .. }), "{e}");
        // The right one still opens.
        IntentLog::open_or_create(&path, &geometry(), &ids(2)).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_an_error_never_clean() {
        let dir = tempfile::tempdir().unwrap();
        let (log, path) = fresh(&dir, 2);
        drop(log);
        let good = std::fs::read(&path).unwrap();
        let reopen = || IntentLog::open_or_create(&path, &geometry(), &ids(2));

        // One torn header slot: the other one is used.
        let mut torn = good.clone();
        for b in &mut torn[30..40] {
            *b ^= 0xff;
        }
        std::fs::write(&path, &torn).unwrap();
        reopen().unwrap();

        // Both slots bad.
        let mut bad = good.clone();
        for slot in 0..2 {
            let at = slot * HEADER_SLOT as usize + 40;
            bad[at] ^= 1;
        }
        std::fs::write(&path, &bad).unwrap();
        let e = reopen().unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, IntentLogError::Corrupt { .. }), "{s}");
        assert!(s.starts_with(&path.display().to_string()), "{s}");
        assert!(s.contains("checksum"), "{s}");
        assert!(s.contains("never taken as clean"), "{s}");

        // Not a log at all.
        std::fs::write(&path, vec![0u8; 40_000]).unwrap();
        let e = reopen().unwrap_err();
        assert!(e.to_string().contains("bad magic"), "{e}");

        // Truncated bitmaps.
        std::fs::write(&path, &good[..good.len() - 100]).unwrap();
        let e = reopen().unwrap_err();
        assert!(e.to_string().contains("bytes, expected"), "{e}");
        std::fs::write(&path, &good[..100]).unwrap();
        let e = reopen().unwrap_err();
        assert!(e.to_string().contains("shorter than its headers"), "{e}");

        // A bit past the last region.
        let mut stray = good.clone();
        let last = BITMAP_OFFSET as usize + PAGE as usize - 1;
        stray[last] = 0x80;
        std::fs::write(&path, &stray).unwrap();
        let e = reopen().unwrap_err();
        assert!(e.to_string().contains("past the last region"), "{e}");

        // A newer format.
        let mut newer = good.clone();
        for slot in 0..2 {
            let at = slot * HEADER_SLOT as usize + 16;
            newer[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        }
        std::fs::write(&path, &newer).unwrap();
        let e = reopen().unwrap_err();
        assert!(e.to_string().contains("format version 2"), "{e}");
    }

    #[test]
    fn the_newer_header_slot_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, path) = fresh(&dir, 2);
        log.set_state(1, ReplicaSyncState::OutOfSync).unwrap();
        log.sync().unwrap();
        drop(log);
        let bytes = std::fs::read(&path).unwrap();
        let a = decode_header(&bytes[..HEADER_SLOT as usize]).unwrap();
        let b = decode_header(&bytes[HEADER_SLOT as usize..2 * HEADER_SLOT as usize]).unwrap();
        let newer = if a.seq > b.seq { a } else { b };
        assert_eq!(newer.replicas[1].state, ReplicaSyncState::OutOfSync);
        let (log, _) = IntentLog::open_or_create(&path, &geometry(), &ids(2)).unwrap();
        assert_eq!(log.replicas()[1].state, ReplicaSyncState::OutOfSync);
    }

    #[test]
    fn a_second_opener_is_locked_out() {
        let dir = tempfile::tempdir().unwrap();
        let (log, path) = fresh(&dir, 2);
        let e = IntentLog::open_or_create(&path, &geometry(), &ids(2)).unwrap_err();
        assert!(matches!(e, IntentLogError::Locked { .. }), "{e}");
        drop(log);
        IntentLog::open_or_create(&path, &geometry(), &ids(2)).unwrap();
    }

    #[test]
    fn a_failed_sync_poisons_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = fresh(&dir, 2);
        log.mark(1, 0..1).unwrap();
        let batch = log.begin_sync().unwrap().unwrap();
        let failure = IntentLogError::Io {
            path: log.path().to_path_buf(),
            context: "fdatasync",
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        assert!(log.finish_sync(batch, Err(failure)).is_err());
        log.mark(1, MIB..MIB + 1).unwrap();
        let e = log.sync().unwrap_err();
        assert!(matches!(e, IntentLogError::Poisoned { .. }), "{e}");
        assert!(e.to_string().contains("fdatasync"), "{e}");
        let as_crate: crate::Error = e.into();
        assert!(as_crate.to_string().contains("vol0.bitmap"));
    }

    #[test]
    fn bad_arguments_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.bitmap");
        let mut g = geometry();
        g.region_size = 3 * MIB;
        assert!(IntentLog::open_or_create(&path, &g, &ids(2)).is_err());
        assert!(IntentLog::open_or_create(&path, &geometry(), &[]).is_err());
        assert!(IntentLog::open_or_create(&path, &geometry(), &ids(17)).is_err());
        let dup = vec!["a".to_string(), "a".to_string()];
        let e = IntentLog::open_or_create(&path, &geometry(), &dup).unwrap_err();
        assert!(e.to_string().contains("same identity"), "{e}");
        assert!(!path.exists());
        // The largest header fits its slot.
        let long: Vec<String> = (0..MAX_REPLICAS)
            .map(|i| format!("{i:0>width$}", width = MAX_IDENTITY_LEN))
            .collect();
        let mut g = geometry();
        g.volume_name = "v".repeat(MAX_NAME_LEN);
        let (log, _) = IntentLog::open_or_create(&path, &g, &long).unwrap();
        drop(log);
        IntentLog::open_or_create(&path, &g, &long).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever sequence of marks, clears, state changes and syncs, a
        /// reopened log has every bit whose mark was reported durable, and
        /// no bit that was never marked (clears are lazy, so a cleared bit
        /// may come back).
        #[test]
        fn durable_marks_survive_and_nothing_is_invented(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 0u64..101 * MIB, 1u64..3 * MIB), 1..60),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (mut log, path) = fresh(&dir, 3);
            let mut ever_marked = vec![BTreeSet::new(); 3];
            let mut durable_needed: Vec<(usize, u64, Option<SyncEpoch>)> = Vec::new();
            for (op, replica, offset, len) in ops {
                match op {
                    0 | 1 => {
                        let range = offset..offset + len;
                        let out = log.mark(replica, range.clone()).unwrap();
                        for region in log.geometry().regions_of(&range) {
                            prop_assert!(log.is_dirty(replica, region));
                            ever_marked[replica].insert(region);
                            durable_needed.push((replica, region, out.wait_for));
                        }
                    }
                    2 => {
                        let region = offset / MIB;
                        log.clear(replica, region).unwrap();
                        durable_needed.retain(|(r, g, _)| !(*r == replica && *g == region));
                    }
                    _ => log.sync().unwrap(),
                }
            }
            // Only what the log says is durable must survive a "crash".
            let durable: Vec<(usize, u64)> = durable_needed
                .iter()
                .filter(|(_, _, e)| e.is_none_or(|e| log.is_durable(e)))
                .map(|(r, g, _)| (*r, *g))
                .collect();
            drop(log);
            let (log, _) = IntentLog::open_or_create(&path, &geometry(), &ids(3)).unwrap();
            for (r, g) in durable {
                prop_assert!(log.is_dirty(r, g), "replica {} region {} lost", r, g);
            }
            for (r, marked) in ever_marked.iter().enumerate() {
                for g in log.dirty_regions(r) {
                    prop_assert!(marked.contains(&g), "replica {} region {} invented", r, g);
                }
            }
        }
    }
}
