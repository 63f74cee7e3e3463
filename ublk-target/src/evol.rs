//! Elastic volumes (issue 18) on the client: a volume of fixed-size
//! extents placed on many namespaces of a pool, mapped on first write.
//!
//! # The pieces
//!
//! - [`ExtentMap`]: the client's cache of the eVol's extent map
//!   (`cluster_store::evol`), shared by every ublk queue thread, the
//!   allocator thread and the etcd watch. An extent's copies are kept as
//!   *member* indices: every namespace of the pool the volume may use is a
//!   member, connected at start like a replica of a mirrored volume, so a
//!   part's path is its member's. Members are bounded by
//!   [`MAX_MEMBERS`] (= `qos_core`'s `MAX_REPLICAS`, 16): the fan-out
//!   names a part's copy in a 16-bit set, and here a copy *is* its member.
//!   A bigger pool is refused at start with an error saying so.
//! - [`pieces`]: a request split at extent boundaries (pure).
//! - [`ExtentAllocator`]: what maps an extent on first write (the arbiter,
//!   in production); [`AllocatorThread`] calls it off the io_uring
//!   threads, one allocation per extent however many writes wait for it.
//!
//! # The rules
//!
//! - **Unmapped reads are zeros**, filled locally: no command is sent
//!   (nothing was ever written there; the pool's physical extents are
//!   zeroed before reuse, flint-core's allocator states).
//! - **A first write waits for its mapping**, parked in the queue's
//!   requests (never blocking the io_uring thread), for at most
//!   `[evol] alloc_wait`; then it fails with EIO, never acknowledged, so
//!   nothing is lost. Discard and write-zeroes of an unmapped extent
//!   complete at once: it reads as zeros already.
//! - **A write piece goes to every copy in parallel** (Flint chains copies
//!   through the client; we do not): latency is the slowest copy's, not
//!   the sum, and no client trusts another to forward its data.
//! - **A copy that misses a write is recorded stale in etcd before the
//!   write is acknowledged.** A copy's part that answers an error, or
//!   whose member's path is down (the engine drops the parts it holds for
//!   a member without a connection, as long as another copy of the piece
//!   is in sync), is a miss: the copy is taken off reads at once
//!   ([`ExtentMap::mark_stale`]), the [`HealthThread`] writes the
//!   extent's mark (`PREFIX/evols/NAME/stale/L`, guarded by the owner's
//!   attach epoch: [`EtcdStaleStore`]) and the write completes with the
//!   other copies' success once the mark is durable. If the mark cannot
//!   be written (deposed owner, etcd down past the bound) or no copy took
//!   the write, it fails. A new owner loads the marks at start
//!   ([`ExtentMap::load_stale`]) and reads no stale copy.
//! - **A stale copy is repaired from an in-sync one** once its member is
//!   reachable ([`MemberIo`]), chunk by chunk (at most [`REPAIR_CHUNK`]
//!   and the members' max I/O, rate-limited by `[replication]
//!   resync_rate`), while writes go on: writes keep going to every copy,
//!   the stale one included; a chunk is redone if a write to the extent
//!   was in flight or started while it was copied, and the whole copy if
//!   it missed another write meanwhile. Then the copy is taken off the
//!   stale set and its mark is deleted (epoch-guarded).
//! - **A member's unflushed writes.** A target with a volatile write
//!   cache may lose the writes it acknowledged and no flush covered when
//!   it crashes. The map counts, per member, the extents with such writes
//!   ([`ExtentMap::write_acked`], [`ExtentMap::flush_sent`],
//!   [`ExtentMap::flush_acked`]); when a member's controller goes away
//!   (a connection fails or it is reset: the engine calls
//!   [`ExtentMap::member_lost`] once per controller epoch) each of them
//!   with another readable copy is marked stale like a missed write, and
//!   a flush is acknowledged only once those marks are durable. An
//!   extent with one copy has nothing to repair from: as on any volume
//!   and with the kernel's host, its unflushed writes may be lost with
//!   the target's cache. The repair flushes the copy it rewrote before it
//!   clears the mark.
//! - **Discard never frees an extent** (not in this step): unmapping
//!   races with this host's own in-flight writes to the extent and with
//!   the arbiter handing the physical extent to another volume, which
//!   needs the extent zeroed (and every client's map to have forgotten
//!   it) first. A discard of a mapped extent is sent to its copies as a
//!   deallocate, as on any volume.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cluster_store::evol::{ExtentRecord, Placement};
use qos_core::ReplicaSet;

/// Most namespaces (members) one eVol may use: copies are named by
/// member in the fan-out's 16-bit copy sets.
pub const MAX_MEMBERS: usize = qos_core::replica_set::MAX_REPLICAS;

/// Most copies of one extent the cache holds.
pub const MAX_COPIES: usize = 4;

/// Default bound on a first write's wait for its extent's mapping.
pub const DEFAULT_ALLOC_WAIT: Duration = Duration::from_secs(30);

/// Maps an extent of an eVol on its first write: the arbiter in
/// production (`evol_arbiter::client::ArbiterClient`, plugged in by the
/// daemon), a direct etcd mapping in tests.
///
/// Called on the volume's allocator thread, never on an I/O thread; it may
/// block until `deadline` and must return by then. The record returned
/// must be durable in etcd (rule 4 of `cluster_store::evol`): the writes
/// waiting for it are sent as soon as it returns.
pub trait ExtentAllocator: Send + Sync {
    /// Logical extent `index` of eVol `evol`'s copies (an existing
    /// mapping if another party mapped it first).
    fn allocate(&self, evol: &str, index: u64, deadline: Instant) -> Result<ExtentRecord, String>;
}

/// One extent's copies, as members of the volume and physical extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    n: u8,
    members: [u8; MAX_COPIES],
    pexts: [u64; MAX_COPIES],
}

impl Mapped {
    /// From (member, physical extent) pairs, reads' preferred first.
    ///
    /// # Panics
    /// If there are none or more than [`MAX_COPIES`], or a member is
    /// beyond [`MAX_MEMBERS`] (callers check).
    pub fn new(copies: &[(usize, u64)]) -> Self {
        assert!(!copies.is_empty() && copies.len() <= MAX_COPIES);
        let mut m = Mapped {
            n: copies.len() as u8,
            members: [0; MAX_COPIES],
            pexts: [0; MAX_COPIES],
        };
        for (i, &(member, pext)) in copies.iter().enumerate() {
            assert!(member < MAX_MEMBERS);
            m.members[i] = member as u8;
            m.pexts[i] = pext;
        }
        m
    }

    /// The copies: (member, physical extent), reads' preferred first.
    pub fn copies(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..usize::from(self.n)).map(|i| (usize::from(self.members[i]), self.pexts[i]))
    }

    /// The members holding a copy.
    pub fn members(&self) -> ReplicaSet {
        self.copies().fold(ReplicaSet::EMPTY, |s, (m, _)| s.with(m))
    }

    /// The physical extent member `member` holds, if it holds a copy.
    pub fn pext_of(&self, member: usize) -> Option<u64> {
        self.copies().find(|&(m, _)| m == member).map(|(_, p)| p)
    }
}

/// One piece of a request: the part of it within one extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The logical extent.
    pub index: u64,
    /// Where the piece starts within the extent (bytes).
    pub offset: u64,
    /// Its length (bytes).
    pub len: u64,
    /// Where it starts within the request (bytes; its data's place in the
    /// tag's buffer).
    pub at: u64,
}

/// The request of `len` bytes at volume byte `start` split at extent
/// boundaries (`extent_bytes` > 0), in order; nothing for `len == 0`.
pub fn pieces(extent_bytes: u64, start: u64, len: u64) -> impl Iterator<Item = Piece> {
    let end = start.saturating_add(len);
    let mut pos = start;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let index = pos / extent_bytes;
        let offset = pos % extent_bytes;
        let n = (extent_bytes - offset).min(end - pos);
        let p = Piece {
            index,
            offset,
            len: n,
            at: pos - start,
        };
        pos += n;
        Some(p)
    })
}

/// What [`ExtentMap::allocation`] says of an unmapped extent a write
/// waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocState {
    /// Mapped now.
    Mapped(Mapped),
    /// Still being allocated.
    Pending,
    /// The allocation the write waited for failed.
    Failed(String),
}

#[derive(Default)]
struct AllocBook {
    /// Extents being allocated.
    pending: HashSet<u64>,
    /// Per extent: how many allocations failed, and the last error.
    failures: HashMap<u64, (u64, String)>,
    /// The allocator thread's queue.
    queue: Option<mpsc::Sender<u64>>,
    /// When each write waiting for an allocation started waiting.
    waits: Vec<Instant>,
}

type Waker = Box<dyn Fn() + Send + Sync>;

/// Where the durable (etcd) stale mark of a copy that missed a write
/// stands; the write is acknowledged only once it is `Durable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaleState {
    /// In etcd (or the copy was repaired since).
    Durable,
    /// Being recorded.
    Pending,
    /// The record failed (not the owner any more, etcd unreachable).
    Failed(String),
}

#[derive(Debug, Default)]
struct StaleCopy {
    /// Its mark is in etcd.
    durable: bool,
    /// Its mark is being written.
    recording: bool,
    /// The last record's failure.
    failed: Option<String>,
    /// Writes it missed (the repair starts over if one more comes).
    misses: u64,
}

/// Writes members acknowledged that their volatile write caches may
/// still hold (see the module docs: "a member's unflushed writes").
#[derive(Default)]
struct UnflushedBook {
    seq: u64,
    /// Per member: extent -> the sequence number of its last write the
    /// member acknowledged.
    members: Vec<HashMap<u64, u64>>,
    /// Per member: the controller epoch `member_lost` last handled.
    lost_epoch: Vec<Option<u64>>,
    /// Stale marks `member_lost` made and flushes wait for.
    marks: Vec<(u64, usize)>,
}

#[derive(Default)]
struct StaleBook {
    copies: HashMap<(u64, usize), StaleCopy>,
    /// The health thread's queue of extents whose marks to write.
    queue: Option<mpsc::Sender<u64>>,
    repairing: Option<(u64, usize)>,
    repaired: u64,
}

/// The client's cache of an eVol's extent map; see the module
/// documentation.
pub struct ExtentMap {
    name: String,
    extent_bytes: u64,
    size_bytes: u64,
    /// Per member: its namespace id in the pool.
    members: Vec<String>,
    extents: RwLock<HashMap<u64, Mapped>>,
    /// Copies that missed a write (never read from) and their repair.
    stale: Mutex<StaleBook>,
    /// Per extent with writes in flight: (in flight, started).
    writes: Mutex<HashMap<u64, (u32, u64)>>,
    /// Acknowledged writes not yet covered by a flush, per member.
    unflushed: Mutex<UnflushedBook>,
    /// One etcd stale-mark write at a time.
    etcd: Mutex<()>,
    /// Bumped on every change a parked write may wait for.
    version: AtomicU64,
    /// Members holding any extent (flushes go there).
    used: AtomicU32,
    alloc: Mutex<AllocBook>,
    wakers: Mutex<Vec<Waker>>,
    allocations: AtomicU64,
}

impl std::fmt::Debug for ExtentMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtentMap")
            .field("name", &self.name)
            .field("extent_bytes", &self.extent_bytes)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl ExtentMap {
    /// An empty map of eVol `name` (`size_bytes`, extents of
    /// `extent_bytes`) over `members` (namespace ids, member order).
    pub fn new(
        name: &str,
        size_bytes: u64,
        extent_bytes: u64,
        members: Vec<String>,
    ) -> Result<Self, String> {
        if extent_bytes == 0 || size_bytes % extent_bytes != 0 {
            return Err(format!(
                "eVol {name}: size {size_bytes} is not a multiple of the extent size {extent_bytes}"
            ));
        }
        if members.is_empty() {
            return Err(format!("eVol {name}: the pool has no namespace"));
        }
        if members.len() > MAX_MEMBERS {
            return Err(format!(
                "eVol {name}: the pool has {} namespaces; a client connects to at most {MAX_MEMBERS} per volume (the fan-out names copies in a 16-bit set): split the pool",
                members.len()
            ));
        }
        let n = members.len();
        Ok(Self {
            name: name.to_owned(),
            extent_bytes,
            size_bytes,
            members,
            extents: RwLock::new(HashMap::new()),
            stale: Mutex::new(StaleBook::default()),
            writes: Mutex::new(HashMap::new()),
            unflushed: Mutex::new(UnflushedBook {
                members: vec![HashMap::new(); n],
                lost_epoch: vec![None; n],
                ..UnflushedBook::default()
            }),
            etcd: Mutex::new(()),
            version: AtomicU64::new(0),
            used: AtomicU32::new(0),
            alloc: Mutex::new(AllocBook::default()),
            wakers: Mutex::new(Vec::new()),
            allocations: AtomicU64::new(0),
        })
    }

    /// The eVol's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes per extent.
    pub fn extent_bytes(&self) -> u64 {
        self.extent_bytes
    }

    /// The volume's size.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The members' namespace ids.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Changes so far (a parked write looks again when it moved).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Members holding any extent.
    pub fn used_members(&self) -> ReplicaSet {
        ReplicaSet::from_bits(self.used.load(Ordering::Acquire))
    }

    /// Allocations this client asked for (not counting joined waits).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Extent `index`'s copies, if mapped.
    pub fn get(&self, index: u64) -> Option<Mapped> {
        self.extents
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .copied()
    }

    /// Extents mapped (in this cache).
    pub fn mapped(&self) -> usize {
        self.extents.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// `rec` as members of this volume.
    pub fn translate(&self, rec: &ExtentRecord) -> Result<Mapped, String> {
        if rec.copies.is_empty() || rec.copies.len() > MAX_COPIES {
            return Err(format!(
                "eVol {}: extent {} has {} copies (this client handles 1 to {MAX_COPIES})",
                self.name,
                rec.index,
                rec.copies.len()
            ));
        }
        let mut copies = Vec::with_capacity(rec.copies.len());
        for c in &rec.copies {
            let m = self
                .members
                .iter()
                .position(|n| *n == c.namespace)
                .ok_or_else(|| {
                    format!(
                        "eVol {}: extent {} is on namespace {}, which was not in the pool when this volume started (restart it to connect new namespaces)",
                        self.name, rec.index, c.namespace
                    )
                })?;
            copies.push((m, c.pext));
        }
        Ok(Mapped::new(&copies))
    }

    /// Caches `rec` (a mapping read, watched or allocated).
    pub fn insert(&self, rec: &ExtentRecord) -> Result<(), String> {
        if rec.evol != self.name {
            return Err(format!(
                "extent record of eVol {} given to {}",
                rec.evol, self.name
            ));
        }
        let m = self.translate(rec)?;
        self.extents
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(rec.index, m);
        self.used.fetch_or(m.members().bits(), Ordering::AcqRel);
        self.changed();
        Ok(())
    }

    /// Forgets extent `index` (unmapped by another party: later reads are
    /// zeros, a later write allocates again).
    pub fn remove(&self, index: u64) {
        self.extents
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&index);
        self.changed();
    }

    /// Replaces the whole cache with `recs` (a re-read).
    pub fn replace(&self, recs: &[ExtentRecord]) {
        let mut fresh = HashMap::new();
        let mut used = 0;
        for r in recs {
            match self.translate(r) {
                Ok(m) => {
                    used |= m.members().bits();
                    fresh.insert(r.index, m);
                }
                Err(e) => log::error!("{e}; its reads and writes will fail"),
            }
        }
        *self.extents.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        self.used.fetch_or(used, Ordering::AcqRel);
        self.changed();
    }

    /// Copy `member` of extent `index` missed a write: no more reads from
    /// it, and its stale mark is to be made durable in etcd (by the
    /// [`HealthThread`]) before the write is acknowledged. Returns where
    /// the durable mark stands ([`ExtentMap::stale_state`]).
    pub fn mark_stale(&self, index: u64, member: usize) -> StaleState {
        let mut b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        let queue = b.queue.clone();
        let c = b.copies.entry((index, member)).or_default();
        c.misses += 1;
        let fresh = c.misses == 1;
        let state = if c.durable {
            StaleState::Durable
        } else if c.recording {
            StaleState::Pending
        } else {
            // New, or an earlier record failed: (re)record it.
            match queue.map(|q| q.send(index)) {
                Some(Ok(())) => {
                    c.recording = true;
                    c.failed = None;
                    StaleState::Pending
                }
                _ => {
                    let why = format!("eVol {}: nothing records stale copies in etcd", self.name);
                    c.failed = Some(why.clone());
                    StaleState::Failed(why)
                }
            }
        };
        drop(b);
        if fresh {
            log::warn!(
                "eVol {}: extent {index}: the copy on namespace {} missed a write; no reads from it until it is repaired",
                self.name,
                self.members.get(member).map_or("?", String::as_str)
            );
        }
        state
    }

    /// Member `member` acknowledged a write to extent `index` (not FUA):
    /// its volatile cache may hold it until the member's next flush.
    pub fn write_acked(&self, member: usize, index: u64) {
        let mut u = self.unflushed.lock().unwrap_or_else(|e| e.into_inner());
        u.seq += 1;
        let seq = u.seq;
        if let Some(m) = u.members.get_mut(member) {
            m.insert(index, seq);
        }
    }

    /// A flush is about to be sent (to any member): what it covers, for
    /// [`ExtentMap::flush_acked`] (every write acknowledged before now;
    /// the sequence is one for all members).
    pub fn flush_sent(&self) -> u64 {
        let mut u = self.unflushed.lock().unwrap_or_else(|e| e.into_inner());
        u.seq += 1;
        u.seq
    }

    /// `member` completed the flush [`ExtentMap::flush_sent`] numbered
    /// `seq`: the writes it acknowledged before are durable there.
    pub fn flush_acked(&self, member: usize, seq: u64) {
        let mut u = self.unflushed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = u.members.get_mut(member) {
            m.retain(|_, s| *s > seq);
        }
    }

    /// Extents with a write `member` acknowledged and no flush covered.
    pub fn unflushed(&self, member: usize) -> usize {
        let u = self.unflushed.lock().unwrap_or_else(|e| e.into_inner());
        u.members.get(member).map_or(0, HashMap::len)
    }

    /// `member`'s controller of epoch `epoch` is gone (a connection
    /// failed or it was reset): if its target crashed, its volatile cache
    /// lost the writes it acknowledged and no flush covered. Each such
    /// extent with another copy is marked stale (reads go to the other
    /// copy, the repair rewrites this one), and flushes complete only
    /// once those marks are durable ([`ExtentMap::lost_marks`]). An
    /// extent with one copy has nothing to repair from: as on any volume
    /// (and the kernel's host), an unflushed write may be lost with the
    /// target's cache. Once per (member, epoch); returns the marks made.
    pub fn member_lost(&self, member: usize, epoch: u64) -> usize {
        let extents: Vec<u64> = {
            let mut u = self.unflushed.lock().unwrap_or_else(|e| e.into_inner());
            match u.lost_epoch.get_mut(member) {
                Some(e) if *e == Some(epoch) => return 0,
                Some(e) => *e = Some(epoch),
                None => return 0,
            }
            u.members[member].drain().map(|(i, _)| i).collect()
        };
        let mut marks = Vec::new();
        for index in extents {
            let Some(m) = self.get(index) else {
                continue;
            };
            if m.pext_of(member).is_some()
                && m.copies().any(|(c, _)| c != member)
                && !self.readable(index, &m).without(member).is_empty()
            {
                let _ = self.mark_stale(index, member);
                marks.push((index, member));
            }
        }
        if !marks.is_empty() {
            log::warn!(
                "eVol {}: namespace {} went away with {} extents written since its last flush: marked stale (its cache may have lost them)",
                self.name,
                self.members.get(member).map_or("?", String::as_str),
                marks.len()
            );
        }
        let n = marks.len();
        self.unflushed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .marks
            .extend(marks);
        n
    }

    /// Where the marks [`ExtentMap::member_lost`] made stand, all
    /// together: `Durable` when every one is in etcd (or repaired), the
    /// first failure, else `Pending`. A flush completes only when they
    /// are durable.
    pub fn lost_marks(&self) -> StaleState {
        let marks = std::mem::take(
            &mut self
                .unflushed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .marks,
        );
        let mut keep = Vec::new();
        let mut failed = None;
        for (index, member) in marks {
            match self.stale_state(index, member) {
                StaleState::Durable => {}
                StaleState::Pending => keep.push((index, member)),
                StaleState::Failed(why) => {
                    // The flush waiting for it fails now; the mark is
                    // recorded again for the next one.
                    failed.get_or_insert(why);
                    let _ = self.mark_stale(index, member);
                    keep.push((index, member));
                }
            }
        }
        let pending = !keep.is_empty();
        self.unflushed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .marks
            .extend(keep);
        match (failed, pending) {
            (Some(why), _) => StaleState::Failed(why),
            (None, true) => StaleState::Pending,
            (None, false) => StaleState::Durable,
        }
    }

    /// Where copy `member` of extent `index`'s durable stale mark stands.
    pub fn stale_state(&self, index: u64, member: usize) -> StaleState {
        let b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        match b.copies.get(&(index, member)) {
            // Repaired meanwhile: nothing to wait for.
            None => StaleState::Durable,
            Some(c) if c.durable => StaleState::Durable,
            Some(c) => match &c.failed {
                Some(why) => StaleState::Failed(why.clone()),
                None => StaleState::Pending,
            },
        }
    }

    /// Marks read from etcd at start (a previous owner's): durable already.
    pub fn load_stale(&self, recs: &[cluster_store::evol_health::StaleRecord]) {
        let mut b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        for r in recs {
            for c in &r.copies {
                match self.members.iter().position(|n| *n == c.namespace) {
                    Some(m) => {
                        let e = b.copies.entry((r.index, m)).or_default();
                        e.durable = true;
                        e.misses += 1;
                    }
                    None => log::error!(
                        "eVol {}: extent {}: a stale copy on namespace {}, which is not a member",
                        self.name,
                        r.index,
                        c.namespace
                    ),
                }
            }
        }
        drop(b);
        self.changed();
    }

    /// The members of `m` (extent `index`) that may serve reads.
    pub fn readable(&self, index: u64, m: &Mapped) -> ReplicaSet {
        let stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        if stale.copies.is_empty() {
            return m.members();
        }
        m.copies()
            .filter(|&(member, _)| !stale.copies.contains_key(&(index, member)))
            .fold(ReplicaSet::EMPTY, |s, (member, _)| s.with(member))
    }

    /// Copies marked stale.
    pub fn stale_copies(&self) -> usize {
        self.stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .copies
            .len()
    }

    /// Extents with a stale copy.
    pub fn stale_extents(&self) -> usize {
        let b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        let set: HashSet<u64> = b.copies.keys().map(|&(i, _)| i).collect();
        set.len()
    }

    /// The (extent, member) being repaired now, if any.
    pub fn repairing(&self) -> Option<(u64, usize)> {
        self.stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .repairing
    }

    /// Stale copies repaired so far.
    pub fn repaired(&self) -> u64 {
        self.stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .repaired
    }

    /// A write to the pieces of extent `index` started (the repair redoes
    /// a chunk that a write may have overlapped).
    pub fn write_started(&self, index: u64) {
        let mut w = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        let e = w.entry(index).or_insert((0, 0));
        e.0 += 1;
        e.1 += 1;
    }

    /// A write to extent `index` ended (every copy's part did).
    pub fn write_ended(&self, index: u64) {
        let mut w = self.writes.lock().unwrap_or_else(|e| e.into_inner());
        // The entry stays (its start count is what the repair compares),
        // one per extent ever written, like the map's own.
        if let Some(e) = w.get_mut(&index) {
            e.0 = e.0.saturating_sub(1);
        }
    }

    /// Writes in flight to extent `index`, and how many started so far.
    fn writes_of(&self, index: u64) -> (u32, u64) {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .copied()
            .unwrap_or((0, 0))
    }

    /// The stale copies of extent `index` as placements (what its etcd
    /// mark lists), and the members they are.
    fn stale_of(&self, b: &StaleBook, index: u64) -> (Vec<usize>, Vec<Placement>) {
        let m = self.get(index);
        let mut members = Vec::new();
        let mut places = Vec::new();
        for (&(i, member), _) in b.copies.iter().filter(|(k, _)| k.0 == index) {
            debug_assert_eq!(i, index);
            if let Some(pext) = m.and_then(|m| m.pext_of(member)) {
                members.push(member);
                places.push(Placement {
                    namespace: self.members[member].clone(),
                    pext,
                });
            }
        }
        places.sort();
        (members, places)
    }

    /// Writes extent `index`'s stale mark as the book has it now (none:
    /// deletes it) and marks what it lists durable. Serialized, so the
    /// last write is of the latest state.
    fn sync_stale(&self, store: &dyn StaleStore, index: u64) -> Result<(), String> {
        let _one = self.etcd.lock().unwrap_or_else(|e| e.into_inner());
        let (members, places) = {
            let b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
            self.stale_of(&b, index)
        };
        let r = store.put(index, &places);
        let mut b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        for m in members {
            if let Some(c) = b.copies.get_mut(&(index, m)) {
                c.recording = false;
                match &r {
                    Ok(()) => c.durable = true,
                    Err(e) => c.failed = Some(e.clone()),
                }
            }
        }
        drop(b);
        self.changed();
        r
    }

    /// A write waits for extent `index`: make sure it is being allocated.
    /// Returns what to pass to [`ExtentMap::allocation`] later.
    pub fn request(&self, index: u64) -> u64 {
        let mut b = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let seen = b.failures.get(&index).map_or(0, |f| f.0);
        if self.get(index).is_none() && b.pending.insert(index) {
            self.allocations.fetch_add(1, Ordering::Relaxed);
            let sent = b.queue.as_ref().is_some_and(|q| q.send(index).is_ok());
            if !sent {
                b.pending.remove(&index);
                let f = b.failures.entry(index).or_insert((0, String::new()));
                f.0 += 1;
                f.1 = format!("eVol {}: no allocator is running", self.name);
            }
        }
        seen
    }

    /// Where the allocation of extent `index` a write started waiting for
    /// at failure count `seen` ([`ExtentMap::request`]) stands.
    pub fn allocation(&self, index: u64, seen: u64) -> AllocState {
        if let Some(m) = self.get(index) {
            return AllocState::Mapped(m);
        }
        let b = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        match b.failures.get(&index) {
            Some((n, why)) if *n > seen => AllocState::Failed(why.clone()),
            _ => AllocState::Pending,
        }
    }

    /// A write started waiting for an allocation at `since`.
    pub fn wait_started(&self, since: Instant) {
        self.alloc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waits
            .push(since);
    }

    /// A write that waited since `since` stopped waiting.
    pub fn wait_ended(&self, since: Instant) {
        let mut b = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = b.waits.iter().position(|t| *t == since) {
            b.waits.swap_remove(i);
        }
    }

    /// Writes waiting for an allocation now, and the oldest one's wait.
    pub fn waiting(&self, now: Instant) -> (usize, Duration) {
        let b = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = b
            .waits
            .iter()
            .map(|t| now.saturating_duration_since(*t))
            .max()
            .unwrap_or_default();
        (b.waits.len(), oldest)
    }

    /// Called (from any thread) after every change, so a queue thread
    /// looks at its parked writes without waiting for its tick.
    pub fn add_waker(&self, w: impl Fn() + Send + Sync + 'static) {
        self.wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(w));
    }

    fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        for w in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            w();
        }
    }

    fn allocated(&self, index: u64, r: Result<ExtentRecord, String>) {
        let r = r.and_then(|rec| {
            if rec.index != index || rec.evol != self.name {
                return Err(format!(
                    "the allocator answered extent {} of {} for extent {index} of {}",
                    rec.index, rec.evol, self.name
                ));
            }
            self.insert(&rec)
        });
        let mut b = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        b.pending.remove(&index);
        if let Err(e) = r {
            log::error!("eVol {}: allocating extent {index}: {e}", self.name);
            let f = b.failures.entry(index).or_insert((0, String::new()));
            f.0 += 1;
            f.1 = e;
            drop(b);
            self.changed();
        }
    }
}

/// The per-volume thread that calls the [`ExtentAllocator`] for the
/// extents writes wait for; stops when dropped.
pub struct AllocatorThread {
    map: Arc<ExtentMap>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AllocatorThread {
    /// Starts allocating `map`'s extents with `alloc`, each call bounded
    /// by `wait` (a write waits no longer than that anyway).
    pub fn start(
        map: Arc<ExtentMap>,
        alloc: Arc<dyn ExtentAllocator>,
        wait: Duration,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<u64>();
        map.alloc.lock().unwrap_or_else(|e| e.into_inner()).queue = Some(tx);
        let m = Arc::clone(&map);
        let thread = std::thread::Builder::new()
            .name(format!("evol-alloc-{}", map.name))
            .spawn(move || {
                while let Ok(index) = rx.recv() {
                    let deadline = Instant::now() + wait;
                    let r = alloc.allocate(&m.name, index, deadline);
                    m.allocated(index, r);
                }
            })?;
        Ok(Self {
            map,
            thread: Some(thread),
        })
    }
}

impl Drop for AllocatorThread {
    fn drop(&mut self) {
        // Closing the queue ends the thread after its current call.
        self.map
            .alloc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where an eVol's per-extent stale marks are kept: etcd, written by the
/// owner under its epoch ([`EtcdStaleStore`]).
pub trait StaleStore: Send + Sync {
    /// Records `copies` as extent `index`'s stale copies (empty: none,
    /// the mark is deleted). Must be durable when it returns `Ok`.
    fn put(&self, index: u64, copies: &[Placement]) -> Result<(), String>;
}

/// [`StaleStore`] in etcd (`cluster_store::evol_health`), guarded by the
/// owner's attach epoch: a deposed owner's records fail.
pub struct EtcdStaleStore {
    /// The client, and each mark's mod revision as this owner last left
    /// it (absent: unknown; `put_stale` reads it).
    store: Mutex<(cluster_store::Store, std::collections::HashMap<u64, i64>)>,
    vkeys: cluster_store::VolumeKeys,
    keys: cluster_store::evol::EvolKeys,
    evol: String,
    epoch: u64,
}

impl EtcdStaleStore {
    /// Marks of eVol `evol` (volume keys `vkeys`, the cluster mode's
    /// ownership) written with attach epoch `epoch`.
    pub fn new(
        store: cluster_store::Store,
        vkeys: cluster_store::VolumeKeys,
        keys: cluster_store::evol::EvolKeys,
        evol: &str,
        epoch: u64,
    ) -> Self {
        Self {
            store: Mutex::new((store, std::collections::HashMap::new())),
            vkeys,
            keys,
            evol: evol.to_owned(),
            epoch,
        }
    }
}

impl StaleStore for EtcdStaleStore {
    fn put(&self, index: u64, copies: &[Placement]) -> Result<(), String> {
        let mut g = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let (store, revs) = &mut *g;
        let expected = revs.remove(&index);
        let rev = store
            .put_stale(
                &self.vkeys,
                &self.keys,
                &self.evol,
                self.epoch,
                index,
                copies,
                expected,
            )
            .map_err(|e| e.to_string())?;
        // After an error the revision stays unknown: read again next time;
        // a deleted mark (0) is not kept, so the map holds live marks only.
        if rev != 0 {
            revs.insert(index, rev);
        }
        Ok(())
    }
}

/// How the repair reaches the members (blocking I/O, off the io_uring
/// threads): each member's controller in production, fake targets in
/// tests.
pub trait MemberIo: Send + Sync {
    /// Whether member `m` is reachable now (its controller is live).
    fn reachable(&self, m: usize) -> bool;
    /// Most bytes one command to member `m` may carry.
    fn max_io(&self, m: usize) -> usize;
    /// Read `buf.len()` bytes of member `m`'s namespace at byte `at`.
    fn read(&self, m: usize, at: u64, buf: &mut [u8]) -> Result<(), String>;
    /// Write `data` to member `m`'s namespace at byte `at`.
    fn write(&self, m: usize, at: u64, data: &[u8]) -> Result<(), String>;
    /// Flush member `m`'s namespace (its volatile cache, if any).
    fn flush(&self, m: usize) -> Result<(), String>;
}

/// Bytes the repair copies per command at most.
pub const REPAIR_CHUNK: usize = 128 << 10;

/// How often the repair looks for stale copies when idle.
const REPAIR_POLL: Duration = Duration::from_millis(100);

/// The per-volume threads that keep the stale marks: one records marks
/// in etcd (what writes that missed a copy wait for), one repairs stale
/// copies from an in-sync one and clears their marks; stops when
/// dropped.
pub struct HealthThread {
    map: Arc<ExtentMap>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl HealthThread {
    /// Starts recording `map`'s stale marks in `store` and, with `io`,
    /// repairing stale copies at up to `rate_bps` bytes per second (0:
    /// unlimited).
    pub fn start(
        map: Arc<ExtentMap>,
        store: Arc<dyn StaleStore>,
        io: Option<Arc<dyn MemberIo>>,
        rate_bps: u64,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<u64>();
        map.stale.lock().unwrap_or_else(|e| e.into_inner()).queue = Some(tx);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        let (m, st) = (Arc::clone(&map), Arc::clone(&store));
        threads.push(
            std::thread::Builder::new()
                .name(format!("evol-stale-{}", map.name))
                .spawn(move || {
                    while let Ok(index) = rx.recv() {
                        if let Err(e) = m.sync_stale(st.as_ref(), index) {
                            log::error!(
                                "eVol {}: recording extent {index}'s stale copies: {e}",
                                m.name
                            );
                        }
                    }
                })?,
        );
        if let Some(io) = io {
            let (m, st, halt) = (Arc::clone(&map), store, Arc::clone(&stop));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("evol-repair-{}", map.name))
                    .spawn(move || {
                        let mut pacer = Pacer::new(rate_bps);
                        while !halt.load(Ordering::Acquire) {
                            if !m.repair_one(st.as_ref(), io.as_ref(), &mut pacer, &halt) {
                                std::thread::sleep(REPAIR_POLL);
                            }
                        }
                    })?,
            );
        }
        Ok(Self { map, stop, threads })
    }
}

impl Drop for HealthThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.map
            .stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Spaces the repair's copies to a rate.
struct Pacer {
    rate_bps: u64,
    start: Instant,
    bytes: u64,
}

impl Pacer {
    fn new(rate_bps: u64) -> Self {
        Self {
            rate_bps,
            start: Instant::now(),
            bytes: 0,
        }
    }

    fn pace(&mut self, n: usize) {
        if self.rate_bps == 0 {
            return;
        }
        self.bytes += n as u64;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate_bps as f64);
        let spent = self.start.elapsed();
        if due > spent {
            std::thread::sleep(due - spent);
        }
        if spent > Duration::from_secs(10) {
            // Forget old history: an idle period is no credit for a burst.
            *self = Self::new(self.rate_bps);
        }
    }
}

impl ExtentMap {
    /// Repairs one durably stale copy whose member is reachable, if any:
    /// whether it tried one.
    ///
    /// A chunk's copy is valid only if no write to the extent was in
    /// flight when it started and none started until it was written
    /// (writes go to every copy, the stale one included, so a write that
    /// ended before the read is in the source, and on the stale copy
    /// unless it missed it); else it is redone. A copy that misses a
    /// write meanwhile (its miss count moved) is repaired again from the
    /// start. Only then is the copy taken off the stale set and its mark
    /// deleted from etcd.
    fn repair_one(
        &self,
        store: &dyn StaleStore,
        io: &dyn MemberIo,
        pacer: &mut Pacer,
        halt: &std::sync::atomic::AtomicBool,
    ) -> bool {
        let job = {
            let b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
            let mut cands: Vec<_> = b
                .copies
                .iter()
                .filter(|(&(_, m), c)| c.durable && io.reachable(m))
                .map(|(&(i, m), c)| (i, m, c.misses))
                .collect();
            cands.sort_unstable();
            cands.into_iter().find_map(|(i, m, misses)| {
                let mapped = self.get(i)?;
                let dst = mapped.pext_of(m)?;
                let src = mapped
                    .copies()
                    .find(|&(s, _)| s != m && !b.copies.contains_key(&(i, s)) && io.reachable(s))?;
                Some((i, m, dst, src, misses))
            })
        };
        let Some((index, member, dst_pext, (src, src_pext), misses)) = job else {
            return false;
        };
        self.stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .repairing = Some((index, member));
        let r = self.repair_copy(index, member, dst_pext, src, src_pext, io, pacer, halt);
        let mut b = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        b.repairing = None;
        match r {
            Ok(()) => {
                let again = b
                    .copies
                    .get(&(index, member))
                    .is_none_or(|c| c.misses != misses);
                if again {
                    // It missed another write meanwhile: once more.
                    return true;
                }
                b.copies.remove(&(index, member));
                b.repaired += 1;
                drop(b);
                log::info!(
                    "eVol {}: extent {index}: the copy on namespace {} is repaired",
                    self.name,
                    self.members[member]
                );
                self.changed();
                if let Err(e) = self.sync_stale(store, index) {
                    // Conservative: the mark stays, the next owner
                    // repairs the copy again.
                    log::error!(
                        "eVol {}: clearing extent {index}'s stale mark: {e}",
                        self.name
                    );
                }
            }
            Err(e) => {
                drop(b);
                log::warn!(
                    "eVol {}: repairing extent {index} on namespace {}: {e}; retrying",
                    self.name,
                    self.members[member]
                );
                std::thread::sleep(REPAIR_POLL);
            }
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn repair_copy(
        &self,
        index: u64,
        member: usize,
        dst_pext: u64,
        src: usize,
        src_pext: u64,
        io: &dyn MemberIo,
        pacer: &mut Pacer,
        halt: &std::sync::atomic::AtomicBool,
    ) -> Result<(), String> {
        let chunk = REPAIR_CHUNK
            .min(io.max_io(member))
            .min(io.max_io(src))
            .min(self.extent_bytes as usize)
            .max(512);
        let mut buf = vec![0u8; chunk];
        let mut off = 0u64;
        let mut redo = 0u32;
        while off < self.extent_bytes {
            if halt.load(Ordering::Acquire) {
                return Err("stopping".into());
            }
            let n = chunk.min((self.extent_bytes - off) as usize);
            let (busy, started) = self.writes_of(index);
            if busy > 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            io.read(src, src_pext * self.extent_bytes + off, &mut buf[..n])
                .map_err(|e| format!("reading the copy on {}: {e}", self.members[src]))?;
            io.write(member, dst_pext * self.extent_bytes + off, &buf[..n])?;
            if self.writes_of(index) != (0, started) {
                // A write overlapped the copy: redo the chunk.
                redo += 1;
                if redo % 1000 == 0 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            pacer.pace(n);
            off += n as u64;
        }
        // The copy leaves the stale set only once durable: a mark cleared
        // while the repaired data sits in a volatile cache could be lost
        // with it, unmarked.
        io.flush(member).map_err(|e| {
            format!(
                "flushing the repaired copy on {}: {e}",
                self.members[member]
            )
        })
    }
}

/// The byte range of the tag's buffer piece `p` of a request uses.
pub fn buf_range(p: &Piece) -> Range<usize> {
    p.at as usize..(p.at + p.len) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = 1 << 20;

    #[test]
    fn a_request_within_one_extent_is_one_piece() {
        let v: Vec<Piece> = pieces(E, 3 * E + 4096, 8192).collect();
        assert_eq!(
            v,
            [Piece {
                index: 3,
                offset: 4096,
                len: 8192,
                at: 0
            }]
        );
        assert_eq!(pieces(E, 0, 0).count(), 0);
    }

    #[test]
    fn a_request_is_split_at_every_extent_boundary() {
        let v: Vec<Piece> = pieces(E, E - 4096, 2 * E + 8192).collect();
        assert_eq!(v.len(), 4);
        assert_eq!(
            (v[0].index, v[0].offset, v[0].len, v[0].at),
            (0, E - 4096, 4096, 0)
        );
        assert_eq!(
            (v[1].index, v[1].offset, v[1].len, v[1].at),
            (1, 0, E, 4096)
        );
        assert_eq!((v[2].index, v[2].len, v[2].at), (2, E, 4096 + E));
        assert_eq!((v[3].index, v[3].offset, v[3].len), (3, 0, 4096));
        assert_eq!(v.iter().map(|p| p.len).sum::<u64>(), 2 * E + 8192);
        // Ending exactly on a boundary adds no empty piece.
        assert_eq!(pieces(E, 0, 2 * E).count(), 2);
    }

    fn rec(index: u64, copies: &[(&str, u64)]) -> ExtentRecord {
        ExtentRecord {
            schema: cluster_store::records::SCHEMA,
            evol: "v".into(),
            index,
            copies: copies
                .iter()
                .map(|(n, p)| cluster_store::evol::Placement {
                    namespace: (*n).into(),
                    pext: *p,
                })
                .collect(),
        }
    }

    #[test]
    fn records_become_members_and_unknown_namespaces_are_refused() {
        let m = ExtentMap::new("v", 8 * E, E, vec!["a".into(), "b".into(), "c".into()]).unwrap();
        m.insert(&rec(2, &[("c", 7), ("a", 1)])).unwrap();
        let x = m.get(2).unwrap();
        assert_eq!(x.copies().collect::<Vec<_>>(), [(2, 7), (0, 1)]);
        assert_eq!(x.pext_of(0), Some(1));
        assert_eq!(m.used_members().bits(), 0b101);
        assert!(m.insert(&rec(3, &[("zz", 0)])).unwrap_err().contains("zz"));
        assert_eq!(m.readable(2, &x).bits(), 0b101);
        m.mark_stale(2, 2);
        assert_eq!(m.readable(2, &x).bits(), 0b001);
    }

    #[test]
    fn pools_beyond_the_member_limit_and_odd_sizes_are_refused() {
        let many: Vec<String> = (0..17).map(|i| format!("n{i}")).collect();
        let e = ExtentMap::new("v", E, E, many).unwrap_err();
        assert!(e.contains("17 namespaces"), "{e}");
        assert!(ExtentMap::new("v", E + 1, E, vec!["a".into()]).is_err());
    }

    #[test]
    fn without_an_allocator_a_waiting_write_fails() {
        let m = ExtentMap::new("v", 8 * E, E, vec!["a".into()]).unwrap();
        let seen = m.request(1);
        assert!(matches!(m.allocation(1, seen), AllocState::Failed(_)));
    }

    #[test]
    fn a_lost_member_marks_only_its_unflushed_extents_with_another_copy() {
        let m = ExtentMap::new("v", 8 * E, E, vec!["a".into(), "b".into()]).unwrap();
        m.insert(&rec(0, &[("a", 0), ("b", 0)])).unwrap();
        m.insert(&rec(1, &[("a", 1)])).unwrap();
        m.insert(&rec(2, &[("a", 2), ("b", 1)])).unwrap();
        for i in 0..3 {
            m.write_acked(0, i);
        }
        m.write_acked(1, 2);
        let covers = m.flush_sent();
        // Acknowledged after the flush was sent: not covered by it.
        m.write_acked(0, 2);
        m.flush_acked(0, covers);
        assert_eq!((m.unflushed(0), m.unflushed(1)), (1, 1));
        // Extent 2's copy on a may be lost with a's cache: stale, reads
        // go to b; extent 0 was flushed, extent 1 has no other copy.
        assert_eq!(m.member_lost(0, 7), 1);
        assert_eq!(m.stale_copies(), 1);
        let two = m.get(2).unwrap();
        assert_eq!(m.readable(2, &two), ReplicaSet::one(1));
        assert_eq!(m.readable(0, &m.get(0).unwrap()).bits(), 0b11);
        // Once per controller epoch; the member starts over.
        assert_eq!(m.member_lost(0, 7), 0);
        assert_eq!(m.unflushed(0), 0);
        // No recorder here: the marks' record fails, so would a flush.
        assert!(matches!(m.lost_marks(), StaleState::Failed(_)));
    }
}
