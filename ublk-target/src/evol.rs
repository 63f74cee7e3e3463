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
//! - **A copy that fails a write is not read from again** (it is marked
//!   stale for that extent in this client's cache) and the write fails:
//!   per-extent repair (resync of a copy from another) is not built, so
//!   the volume never acknowledges a write that one copy may not hold and
//!   never serves a read from a copy that may be behind.
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

use cluster_store::evol::ExtentRecord;
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

/// The client's cache of an eVol's extent map; see the module
/// documentation.
pub struct ExtentMap {
    name: String,
    extent_bytes: u64,
    size_bytes: u64,
    /// Per member: its namespace id in the pool.
    members: Vec<String>,
    extents: RwLock<HashMap<u64, Mapped>>,
    /// (extent, member) copies that missed a write: never read from.
    stale: Mutex<HashSet<(u64, usize)>>,
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
        Ok(Self {
            name: name.to_owned(),
            extent_bytes,
            size_bytes,
            members,
            extents: RwLock::new(HashMap::new()),
            stale: Mutex::new(HashSet::new()),
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

    /// Copy `member` of extent `index` missed a write: never read from it
    /// again (in this process; see the module documentation).
    pub fn mark_stale(&self, index: u64, member: usize) {
        let fresh = self
            .stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((index, member));
        if fresh {
            log::error!(
                "eVol {}: extent {index}: the copy on namespace {} missed a write; no more reads from it (per-extent repair is not built)",
                self.name,
                self.members.get(member).map_or("?", String::as_str)
            );
        }
    }

    /// The members of `m` (extent `index`) that may serve reads.
    pub fn readable(&self, index: u64, m: &Mapped) -> ReplicaSet {
        let stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        if stale.is_empty() {
            return m.members();
        }
        m.copies()
            .filter(|&(member, _)| !stale.contains(&(index, member)))
            .fold(ReplicaSet::EMPTY, |s, (member, _)| s.with(member))
    }

    /// Copies marked stale.
    pub fn stale_copies(&self) -> usize {
        self.stale.lock().unwrap_or_else(|e| e.into_inner()).len()
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
}
