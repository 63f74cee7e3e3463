//! One ublk queue's requests from admission to completion, without the
//! sockets: the QoS stage ([`QueueQos`]) decides when a request may go and
//! to which replicas, the fan-out ([`FanOut`]) decides what its parts do,
//! and this module carries out the fan-out's actions against the
//! replication state (intent log, replica health) and a [`PartSink`] that
//! puts NVMe requests on paths.
//!
//! The engine ([`crate::io::engine`]) is one `PartSink` (io_uring sockets, one
//! path per replica and class); the in-process tests
//! (`tests/fanout.rs`) are another (initiator queue cores talking to fake
//! targets in memory), so everything a request's parts do is tested
//! without a kernel.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use nvmf_initiator::{Command, Completion, Request};
use nvmf_proto::status::Status;
use qos_core::priority::NvmeClass;
use qos_core::{Nanos, ReplicaSet};

use crate::cluster::ClusterLink;
use crate::evol::{self, AllocState, ExtentMap, Mapped, MAX_MEMBERS};
use crate::evol_qos::{EvolQos, EvolSched, MemberCosts};
use crate::io::fanout::{Action, FanOut, Op, PartId, PieceSpec, MAX_PIECES};
use crate::qos::{LimitKind, QueueQos, Route, Ticket};
use crate::replication::Replication;
use crate::volume::Stats;

/// A view of a tag's I/O buffer (the ublk queue's per-tag `IoBuf`) handed
/// to the initiator's queue for a part's lifetime.
///
/// The buffers are allocated once per queue thread and outlive the engine
/// (see `ublk.rs`), and a tag's buffer is touched by nobody else while its
/// request is in the engine: the tag task waits for the completion before
/// it commits the buffer back to the driver, and also, when the kernel may
/// still use the buffer after the request ended, for the direct `Recv`
/// writing into it or the `SendMsg` reading a write's data from it
/// (`engine::rx_task`, `engine::tx_task`). A read has one part at a
/// time, which may write the buffer ([`TagBuf::exclusive`]); the parts of
/// a write (one per replica) share it read-only ([`TagBuf::shared`]).
pub struct TagBuf {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

impl TagBuf {
    /// The one view of a buffer that may be written (a read's data lands
    /// in it).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid, and be neither read nor written
    /// through anything else, while the `TagBuf` or a request holding it
    /// lives.
    pub unsafe fn exclusive(ptr: *mut u8, len: usize) -> Self {
        Self {
            ptr,
            len,
            writable: true,
        }
    }

    /// One of several read-only views of a buffer (a write's data, sent
    /// to every replica).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid, and not be written through
    /// anything, while the `TagBuf` or a request holding it lives.
    pub unsafe fn shared(ptr: *const u8, len: usize) -> Self {
        Self {
            ptr: ptr as *mut u8,
            len,
            writable: false,
        }
    }
}

impl AsRef<[u8]> for TagBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the constructors: valid for `len`, not written by
        // anyone else while we live.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for TagBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        if !self.writable {
            // The initiator writes into a request's buffer only for data
            // a read returns (it refuses C2HData for a command that reads
            // nothing), so a write's shared view is never asked for this.
            debug_assert!(
                false,
                "a shared (write) buffer view was asked to be written"
            );
            return &mut [];
        }
        // SAFETY: `exclusive`: nobody else reads or writes it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Where a request's parts go: the engine's paths, or a test's fake
/// targets.
pub trait PartSink {
    /// Send `req` to replica `replica` on its path for class `class`, or
    /// hold it there until that path is connected.
    fn send(&mut self, replica: usize, class: NvmeClass, req: Request<TagBuf>);

    /// Replica `replica` answered a write with an error: it no longer
    /// holds the volume's data, so reset its controller (its paths then
    /// reconnect only through resync).
    fn reset_replica(&mut self, replica: usize);
}

/// A request as the ublk adapter hands it over.
pub struct Submission {
    /// The ublk tag.
    pub tag: u16,
    /// The NVMe command that serves it (namespace set per replica).
    pub command: Command,
    /// The tag's buffer, when data travels (the exclusive view: the
    /// requests make each part's view from it).
    pub buf: Option<TagBuf>,
    /// What the rate limiter charges it as.
    pub kind: LimitKind,
    /// Bytes the rate limiter charges.
    pub bytes: u64,
    /// Its NVMe priority class.
    pub class: NvmeClass,
    /// The volume bytes a write, discard or write-zeroes changes (what the
    /// intent log records); `None` for reads and flushes.
    pub write: Option<Range<u64>>,
}

/// A request between the ublk tag and its NVMe commands: what the QoS
/// stage holds, and what each part's command is built from.
#[derive(Clone)]
pub struct Pending {
    tag: u16,
    command: Command,
    /// The tag's buffer (pointer, length) when data travels.
    buf: Option<(*mut u8, usize)>,
}

/// Per tag: the request between admission and completion.
#[derive(Default)]
struct TagState {
    /// Admitted: the QoS ticket (its replicas shrink as parts end).
    ticket: Option<Ticket>,
    pending: Option<Pending>,
    class: Option<NvmeClass>,
    /// Bytes of the volume a write, discard or write-zeroes changes (the
    /// intent log's unit).
    write: Option<Range<u64>>,
}

/// One ublk queue's requests; see the module documentation.
pub struct Requests {
    name: String,
    /// Per replica: its namespace ID.
    nsids: Vec<u32>,
    replication: Option<Arc<Replication>>,
    stats: Arc<Stats>,
    qos: QueueQos<Pending>,
    fan: FanOut,
    tags: Vec<TagState>,
    /// Per tag: the outcome once known (true: success), until taken.
    results: Vec<Option<bool>>,
    /// Tags whose outcome became known since the last
    /// [`Requests::take_finished`].
    finished: Vec<u16>,
    /// Cluster mode: ownership and the health record in etcd.
    cluster: Option<Arc<ClusterLink>>,
    /// Writes that skipped a replica etcd does not yet record out of sync
    /// (see [`Requests::cluster_tick`]).
    cluster_waits: Vec<ClusterWait>,
    /// Elastic volumes: the extent map and the requests' pieces.
    evol: Option<EvolState>,
}

/// An elastic volume's side of the requests (see [`crate::evol`]): the
/// member paths are the pool's namespaces (`nsids[m]` is member m's), a
/// part's copy index *is* its member, and a request's pieces are its
/// extents.
struct EvolState {
    map: Arc<ExtentMap>,
    block_size: u64,
    /// Bound on a first write's wait for its extent's mapping.
    wait: std::time::Duration,
    /// Per tag: the request's mapped pieces (kept, so the vectors are
    /// allocated once per tag).
    pieces: Vec<Vec<EvolPiece>>,
    /// Scratch for [`FanOut::start`].
    specs: Vec<PieceSpec>,
    /// Writes waiting for their extents' mappings.
    parked: Vec<Parked>,
    /// The map's version at the last look at `parked`.
    seen_version: u64,
    /// Write parts whose copy missed the write, waiting for its durable
    /// stale mark.
    missed: Vec<MissedWait>,
    /// Flint's eIO schedulers and auction gate before the QoS stage
    /// (see [`crate::evol_qos`]); `None`: straight to the QoS stage.
    sched: Option<EvolSched<EvolQueued>>,
    /// Per tag, per member: what the flush sent there covers
    /// ([`ExtentMap::flush_sent`]).
    flush_seq: Vec<[u64; MAX_MEMBERS]>,
    /// Flushes done on every member, waiting until the stale marks of
    /// members lost with unflushed writes are durable: (tag, since).
    flush_waits: Vec<(u16, Instant)>,
}

/// A mapped eVol request waiting in eIO, with what the QoS stage takes.
struct EvolQueued {
    pending: Pending,
    kind: LimitKind,
    bytes: u64,
}

/// A write part whose copy missed it, held until etcd records the copy
/// stale (see [`crate::evol`]).
struct MissedWait {
    part: PartId,
    index: u64,
    member: usize,
    since: Instant,
}

/// One mapped piece of an eVol request.
#[derive(Debug, Clone, Copy)]
struct EvolPiece {
    piece: evol::Piece,
    copies: Mapped,
}

/// A write waiting for its extents' mappings, with what the QoS stage
/// takes once they are there.
struct Parked {
    tag: u16,
    since: Instant,
    /// (extent, failures seen when the wait started).
    needs: Vec<(u64, u64)>,
    pending: Pending,
    kind: LimitKind,
    bytes: u64,
    class: NvmeClass,
}

/// What an eVol request needs before it can go.
enum EvolPlan {
    /// Its mapped pieces are in the tag's list: to the QoS stage.
    Go,
    /// Nothing to send (unmapped reads filled with zeros, discards of
    /// unmapped extents, a flush before any write): done, `ok`.
    Done(bool),
    /// A write to unmapped extents: wait for these (extent, failures
    /// seen).
    Wait(Vec<(u64, u64)>),
}

/// Where piece `piece`'s Dataset Management range for member `member`
/// lives in the tag's buffer (each part has its own: the physical LBA
/// differs per copy).
fn dsm_offset(piece: usize, member: usize) -> usize {
    (piece * MAX_MEMBERS + member) * 16
}

/// Bytes of the tag's buffer an eVol discard needs for its range lists.
pub const EVOL_DSM_BYTES: usize = MAX_PIECES * MAX_MEMBERS * 16;

/// Whether `c` is a Dataset Management command (a discard).
fn is_dsm(c: &Command) -> bool {
    matches!(c, Command::Raw(sqe) if sqe.opcode == nvmf_proto::sqe::io_opcode::DATASET_MANAGEMENT)
}

/// A fan-out step held until etcd records the replicas a write skipped
/// out of sync.
struct ClusterWait {
    /// What to tell the fan-out then.
    step: HeldStep,
    /// The replicas the write reached.
    sent_to: ReplicaSet,
    /// Since when.
    since: Nanos,
}

enum HeldStep {
    /// [`FanOut::prepared`] of a write about to skip replicas.
    Prepared { tag: u16, piece: u8 },
    /// [`FanOut::recorded`] of a write one replica missed.
    Recorded(PartId),
}

/// `command` addressed to namespace `nsid` (each replica has its own).
fn with_nsid(command: Command, nsid: u32) -> Command {
    match command {
        Command::Read {
            slba, block_size, ..
        } => Command::Read {
            nsid,
            slba,
            block_size,
        },
        Command::Write {
            slba,
            block_size,
            fua,
            ..
        } => Command::Write {
            nsid,
            slba,
            block_size,
            fua,
        },
        Command::Flush { .. } => Command::Flush { nsid },
        Command::WriteZeroes {
            slba,
            blocks,
            deallocate,
            ..
        } => Command::WriteZeroes {
            nsid,
            slba,
            blocks,
            deallocate,
        },
        Command::Raw(mut sqe) => {
            sqe.nsid = nsid;
            Command::Raw(sqe)
        }
    }
}

impl Requests {
    /// The requests of a queue of `depth` tags of volume `name`, whose
    /// replica r is namespace `nsids[r]`.
    pub fn new(
        name: String,
        nsids: Vec<u32>,
        replication: Option<Arc<Replication>>,
        stats: Arc<Stats>,
        qos: QueueQos<Pending>,
        depth: u16,
    ) -> Self {
        debug_assert!(!nsids.is_empty());
        // Several paths without a replica set: only an eVol's members
        // (`set_evol` follows).
        Requests {
            name,
            nsids,
            replication,
            stats,
            qos,
            fan: FanOut::new(depth),
            tags: (0..depth).map(|_| TagState::default()).collect(),
            results: vec![None; usize::from(depth)],
            finished: Vec::new(),
            cluster: None,
            cluster_waits: Vec::new(),
            evol: None,
        }
    }

    /// Make this an elastic volume's requests: `nsids` (given to
    /// [`Requests::new`]) are the pool members' namespaces, `map` the
    /// extent map, `block_size` the volume's, `wait` the bound on a first
    /// write's wait for its mapping. The QoS stage must be a one-target
    /// one ([`QueueQos::new`]): it charges a request once, not per part
    /// (parts of one request may share a member).
    ///
    /// `flint`: the eVol's auction and eIO (see [`crate::evol_qos`]):
    /// mapped data requests wait there, one class at a time, before the
    /// QoS stage.
    pub fn set_evol(
        &mut self,
        map: Arc<ExtentMap>,
        block_size: u32,
        wait: std::time::Duration,
        flint: Option<Arc<EvolQos>>,
    ) {
        let depth = self.tags.len();
        self.evol = Some(EvolState {
            map,
            block_size: u64::from(block_size),
            wait,
            pieces: (0..depth).map(|_| Vec::with_capacity(2)).collect(),
            specs: Vec::with_capacity(MAX_PIECES),
            parked: Vec::new(),
            seen_version: 0,
            missed: Vec::new(),
            sched: flint.map(EvolSched::new),
            flush_seq: vec![[0; MAX_MEMBERS]; depth],
            flush_waits: Vec::new(),
        });
    }

    /// Writes of this queue waiting for an extent's mapping.
    pub fn evol_parked(&self) -> usize {
        self.evol.as_ref().map_or(0, |e| e.parked.len())
    }

    fn fan_now(&self) -> Nanos {
        self.now(Instant::now())
    }

    /// Cluster mode: writes that skip a replica wait for etcd's record of
    /// it, and a fenced host fails every request.
    pub fn set_cluster(&mut self, link: Arc<ClusterLink>) {
        self.cluster = Some(link);
    }

    /// Whether etcd (in cluster mode) records every replica outside
    /// `sent_to` out of sync.
    fn cluster_covers(&self, sent_to: ReplicaSet) -> bool {
        match (&self.cluster, &self.replication) {
            (Some(c), Some(rep)) => c.covers(sent_to.bits(), rep.all().bits()),
            _ => true,
        }
    }

    /// Hold `step` until etcd covers `sent_to`.
    fn hold_for_cluster(&mut self, now: Nanos, step: HeldStep, sent_to: ReplicaSet) {
        if let Some(c) = &self.cluster {
            c.writes_waiting(1);
        }
        self.cluster_waits.push(ClusterWait {
            step,
            sent_to,
            since: now,
        });
    }

    /// Every [`crate::io::engine::TICK`]: release the writes etcd now
    /// covers; fail the ones that waited longer than `health_wait` (they
    /// were not acknowledged, so nothing is lost: the kernel sees an
    /// error).
    pub fn cluster_tick(&mut self, now: Nanos, sink: &mut impl PartSink) {
        let Some(link) = self.cluster.clone() else {
            return;
        };
        if self.cluster_waits.is_empty() {
            return;
        }
        let limit = link.health_wait().as_nanos() as u64;
        let waits = std::mem::take(&mut self.cluster_waits);
        let mut released = 0i64;
        for w in waits {
            let covered = self.cluster_covers(w.sent_to);
            let expired = now.nanos_since(w.since) > limit;
            if !covered && !expired && !link.is_fenced() {
                self.cluster_waits.push(w);
                continue;
            }
            released += 1;
            let ok = covered && !link.is_fenced();
            if link.is_fenced() {
                // Logged once by fence_self.
            } else if !ok {
                log::error!(
                    "{}: a write waited {} s for etcd to record a replica out of sync; failing it",
                    self.name,
                    link.health_wait().as_secs()
                );
            }
            match w.step {
                HeldStep::Prepared { tag, piece } => self.fan.prepared(tag, piece, ok),
                HeldStep::Recorded(part) => self.fan.recorded(part, ok),
            }
        }
        link.writes_waiting(-released);
        self.run(sink);
        self.pump_if_queued(now, sink);
    }

    /// The QoS stage.
    pub fn qos(&self) -> &QueueQos<Pending> {
        &self.qos
    }

    /// Now on the QoS clock.
    pub fn now(&self, at: Instant) -> Nanos {
        self.qos.shared().now(at)
    }

    /// The fan-out machine (for its counters).
    pub fn fan_out(&self) -> &FanOut {
        &self.fan
    }

    /// Queue request `s`; send what may go now.
    pub fn submit(&mut self, now: Nanos, s: Submission, sink: &mut impl PartSink) {
        let Submission {
            tag,
            command,
            buf,
            kind,
            bytes,
            class,
            write,
        } = s;
        debug_assert!(!self.fan.is_active(tag), "tag {tag} reused while active");
        self.stats.inflight.fetch_add(1, Ordering::Relaxed);
        let t = usize::from(tag);
        if self.cluster.as_ref().is_some_and(|c| c.is_fenced()) {
            // This host lost the volume: nothing may reach a target (and a
            // read could return data the new owner already changed).
            self.tags[t] = TagState::default();
            self.finish(tag, false);
            return;
        }
        self.tags[t] = TagState {
            class: Some(class),
            write,
            ..TagState::default()
        };
        let pending = Pending {
            tag,
            command,
            buf: buf.map(|b| {
                debug_assert!(b.writable, "the tag's own view is exclusive");
                (b.ptr, b.len)
            }),
        };
        if self.evol.is_some() {
            match self.evol_plan(&pending) {
                EvolPlan::Go => {}
                EvolPlan::Done(ok) => {
                    self.finish_as(tag, ok, false);
                    return;
                }
                EvolPlan::Wait(needs) => {
                    let since = Instant::now();
                    let ev = self.evol.as_mut().expect("checked");
                    ev.map.wait_started(since);
                    ev.parked.push(Parked {
                        tag,
                        since,
                        needs,
                        pending,
                        kind,
                        bytes,
                        class,
                    });
                    return;
                }
            }
            self.evol_enqueue(now, pending, kind, bytes, class);
            self.pump(now, sink);
            return;
        }
        self.qos.push(now, pending, kind, bytes, class);
        self.pump(now, sink);
    }

    /// A mapped eVol request (its pieces planned) into its class's eIO
    /// scheduler, or straight to the QoS stage when it moves no data or
    /// there is no scheduler.
    fn evol_enqueue(
        &mut self,
        now: Nanos,
        pending: Pending,
        kind: LimitKind,
        bytes: u64,
        class: NvmeClass,
    ) {
        let io_kind = match kind {
            LimitKind::Read => qos_core::IoKind::Read,
            LimitKind::Write => qos_core::IoKind::Write,
            LimitKind::Other => return self.qos.push(now, pending, kind, bytes, class),
        };
        let Some(ev) = self.evol.as_mut() else {
            return self.qos.push(now, pending, kind, bytes, class);
        };
        let Some(sched) = ev.sched.as_mut() else {
            return self.qos.push(now, pending, kind, bytes, class);
        };
        let pieces = &ev.pieces[usize::from(pending.tag)];
        let mut costs = MemberCosts::default();
        for e in pieces {
            if io_kind == qos_core::IoKind::Read {
                // The copy `start` will read (copies only go stale
                // meanwhile, and then another serves: charged here).
                let r = ev.map.readable(e.piece.index, &e.copies);
                if let Some(m) = r.first().or_else(|| e.copies.members().first()) {
                    costs.add(m, sched.cost(m, io_kind, e.piece.len));
                }
            } else {
                for m in e.copies.members() {
                    costs.add(m, sched.cost(m, io_kind, e.piece.len));
                }
            }
        }
        // Nothing of its class waits here nor in the stage: nothing to
        // rank it against, so it skips eIO's queue when its slices admit
        // it (the common, uncontended case costs no allocation).
        if sched.class_is_empty(class)
            && self.qos.waiting_in(class) == 0
            && sched.shared().try_admit(&costs)
        {
            return self.qos.push(now, pending, kind, bytes, class);
        }
        // One stream per extent (of this queue): writes to an extent keep
        // their order, different extents reorder freely.
        let stream = pieces.first().map_or(0, |e| e.piece.index);
        let item = EvolQueued {
            pending,
            kind,
            bytes,
        };
        if let Err(item) = sched.push(now, item, class, io_kind, stream, costs) {
            // eIO's window is full (deeper than any queue): no ranking.
            self.qos
                .push(now, item.pending, item.kind, item.bytes, class);
        }
    }

    /// Moves eIO's next admissible request of each class that has nothing
    /// waiting in the QoS stage into it; whether any moved.
    fn evol_release(&mut self, now: Nanos) -> bool {
        let Some(sched) = self.evol.as_mut().and_then(|e| e.sched.as_mut()) else {
            return false;
        };
        let mut moved = false;
        loop {
            let qos = &self.qos;
            let Some((item, class)) = sched.pop(now, |c| qos.waiting_in(c) == 0) else {
                break;
            };
            self.qos
                .push(now, item.pending, item.kind, item.bytes, class);
            moved = true;
        }
        moved
    }

    /// Requests of this queue waiting in eIO.
    pub fn evol_scheduled(&self) -> usize {
        self.evol
            .as_ref()
            .and_then(|e| e.sched.as_ref())
            .map_or(0, EvolSched::len)
    }

    /// Split eVol request `p` at extents into its tag's piece list (see
    /// [`EvolPlan`]); fills the buffer's unmapped read pieces with zeros
    /// and its discards' range lists.
    fn evol_plan(&mut self, p: &Pending) -> EvolPlan {
        let t = usize::from(p.tag);
        let write = self.tags[t].write.clone();
        let Some(ev) = self.evol.as_mut() else {
            return EvolPlan::Done(false);
        };
        let list = &mut ev.pieces[t];
        list.clear();
        let bs = ev.block_size;
        let (start, len) = match (&p.command, &write) {
            (Command::Flush { .. }, _) => {
                // Every member that holds any extent; none: nothing was
                // ever written, nothing to flush.
                return if ev.map.used_members().is_empty() {
                    EvolPlan::Done(true)
                } else {
                    EvolPlan::Go
                };
            }
            (Command::Read { slba, .. }, _) => (slba * bs, p.buf.map_or(0, |b| b.1 as u64)),
            (Command::Write { slba, .. }, _) => (slba * bs, p.buf.map_or(0, |b| b.1 as u64)),
            (_, Some(r)) => (r.start, r.end - r.start),
            _ => {
                log::error!("{}: an eVol request with no range", self.name);
                return EvolPlan::Done(false);
            }
        };
        let reading = matches!(p.command, Command::Read { .. });
        let writing = matches!(p.command, Command::Write { .. });
        let dsm = is_dsm(&p.command);
        let mut needs = Vec::new();
        for piece in evol::pieces(ev.map.extent_bytes(), start, len) {
            match ev.map.get(piece.index) {
                Some(copies) => list.push(EvolPiece { piece, copies }),
                None if writing => needs.push((piece.index, ev.map.request(piece.index))),
                None if reading => {
                    if let Some((ptr, l)) = p.buf {
                        let r = evol::buf_range(&piece);
                        debug_assert!(r.end <= l);
                        // SAFETY: the tag's buffer is ours until the tag
                        // completes (see `TagBuf`); this piece's bytes
                        // are written by nothing else (no part reads it).
                        unsafe {
                            std::ptr::write_bytes(ptr.add(r.start), 0, r.len().min(l - r.start))
                        };
                    }
                }
                // Discard, write-zeroes: an unmapped extent reads as
                // zeros already.
                None => {}
            }
        }
        if !needs.is_empty() {
            list.clear();
            return EvolPlan::Wait(needs);
        }
        if list.is_empty() {
            return EvolPlan::Done(true);
        }
        if list.len() > MAX_PIECES {
            log::error!(
                "{}: a request of {len} bytes spans {} extents (at most {MAX_PIECES})",
                self.name,
                list.len()
            );
            return EvolPlan::Done(false);
        }
        if dsm {
            let Some((ptr, l)) = p.buf.filter(|b| b.1 >= EVOL_DSM_BYTES) else {
                debug_assert!(false, "an eVol discard's buffer is too small");
                return EvolPlan::Done(false);
            };
            for (i, e) in list.iter().enumerate() {
                for (m, pext) in e.copies.copies() {
                    let slba = (pext * ev.map.extent_bytes() + e.piece.offset) / bs;
                    let mut range = [0u8; 16];
                    range[4..8].copy_from_slice(&((e.piece.len / bs) as u32).to_le_bytes());
                    range[8..16].copy_from_slice(&slba.to_le_bytes());
                    let off = dsm_offset(i, m);
                    debug_assert!(off + 16 <= l);
                    // SAFETY: as above; the range lists live past the
                    // request's data (a discard carries none).
                    unsafe { std::ptr::copy_nonoverlapping(range.as_ptr(), ptr.add(off), 16) };
                }
            }
        }
        if reading {
            for e in list.iter() {
                if ev.map.readable(e.piece.index, &e.copies).is_empty() {
                    log::error!(
                        "{}: extent {}: no copy may serve reads (every copy missed a write)",
                        self.name,
                        e.piece.index
                    );
                    return EvolPlan::Done(false);
                }
            }
        }
        EvolPlan::Go
    }

    /// Look at the writes waiting for their extents' mappings (every
    /// [`crate::io::engine::TICK`], and when the map changed): the ones
    /// whose extents are all mapped go to the QoS stage; the ones whose
    /// allocation failed, or that waited longer than the bound, fail
    /// (never acknowledged: nothing is lost).
    pub fn evol_tick(&mut self, now: Nanos, sink: &mut impl PartSink) {
        self.evol_missed_tick(sink);
        let Some(ev) = self.evol.as_mut() else {
            return;
        };
        if ev.parked.is_empty() {
            return;
        }
        let version = ev.map.version();
        let at = Instant::now();
        let expired = ev
            .parked
            .iter()
            .any(|w| at.saturating_duration_since(w.since) > ev.wait);
        if version == ev.seen_version && !expired {
            return;
        }
        ev.seen_version = version;
        let parked = std::mem::take(&mut ev.parked);
        let map = Arc::clone(&ev.map);
        let wait = ev.wait;
        let mut keep = Vec::new();
        for w in parked {
            let mut state = Ok(true);
            for &(index, seen) in &w.needs {
                match map.allocation(index, seen) {
                    AllocState::Mapped(_) => {}
                    AllocState::Pending => state = state.map(|_| false),
                    AllocState::Failed(why) => state = Err(why),
                }
            }
            let state = match state {
                Ok(false) if at.saturating_duration_since(w.since) > wait => {
                    Err(format!("no mapping within {} s", wait.as_secs_f64()))
                }
                s => s,
            };
            match state {
                Ok(false) => keep.push(w),
                Ok(true) => {
                    map.wait_ended(w.since);
                    match self.evol_plan(&w.pending) {
                        EvolPlan::Go => self.evol_enqueue(now, w.pending, w.kind, w.bytes, w.class),
                        EvolPlan::Done(ok) => self.finish_as(w.tag, ok, false),
                        // Unmapped again (another party unmapped it
                        // meanwhile): wait anew.
                        EvolPlan::Wait(needs) => {
                            map.wait_started(w.since);
                            keep.push(Parked { needs, ..w });
                        }
                    }
                }
                Err(why) => {
                    map.wait_ended(w.since);
                    log::error!(
                        "{}: a first write to an unmapped extent fails: {why}",
                        self.name
                    );
                    self.finish_as(w.tag, false, false);
                }
            }
        }
        if let Some(ev) = self.evol.as_mut() {
            ev.parked.extend(keep);
        }
        self.pump(now, sink);
    }

    /// A flush done on every member: whether it must wait for the stale
    /// marks of members lost with unflushed writes (then it is held in
    /// `flush_waits`, completed by `evol_missed_tick`).
    fn evol_flush_must_wait(&mut self, tag: u16) -> bool {
        let Some(ev) = self.evol.as_mut() else {
            return false;
        };
        match ev.map.lost_marks() {
            evol::StaleState::Durable => false,
            _ => {
                ev.flush_waits.push((tag, Instant::now()));
                true
            }
        }
    }

    /// Complete the held flushes once the lost members' marks are
    /// durable; fail them when a mark failed or took longer than `limit`.
    fn evol_flush_tick(&mut self, limit: std::time::Duration) {
        let Some(ev) = self.evol.as_mut() else {
            return;
        };
        if ev.flush_waits.is_empty() {
            return;
        }
        let state = ev.map.lost_marks();
        let waits = std::mem::take(&mut ev.flush_waits);
        let mut keep = Vec::new();
        let mut done = Vec::new();
        for (tag, since) in waits {
            match &state {
                evol::StaleState::Durable => done.push((tag, true)),
                evol::StaleState::Failed(why) => {
                    log::error!(
                        "{}: recording a lost member's unflushed extents stale failed: {why}; failing the flush",
                        self.name
                    );
                    done.push((tag, false));
                }
                evol::StaleState::Pending if since.elapsed() > limit => {
                    log::error!(
                        "{}: etcd did not record a lost member's unflushed extents stale within {} s; failing the flush",
                        self.name,
                        limit.as_secs_f64()
                    );
                    done.push((tag, false));
                }
                evol::StaleState::Pending => keep.push((tag, since)),
            }
        }
        if let Some(ev) = self.evol.as_mut() {
            ev.flush_waits.extend(keep);
        }
        for (tag, ok) in done {
            self.finish(tag, ok);
        }
    }

    /// Release the write parts whose copy's stale mark etcd now records;
    /// fail those whose record failed or took longer than the bound
    /// (`health_wait` in cluster mode, else `alloc_wait`): not
    /// acknowledged, nothing is lost.
    fn evol_missed_tick(&mut self, sink: &mut impl PartSink) {
        let limit = match (&self.cluster, &self.evol) {
            (Some(c), _) => c.health_wait(),
            (None, Some(ev)) => ev.wait,
            (None, None) => return,
        };
        self.evol_flush_tick(limit);
        let Some(ev) = self.evol.as_mut() else {
            return;
        };
        if ev.missed.is_empty() {
            return;
        }
        let map = Arc::clone(&ev.map);
        let waits = std::mem::take(&mut ev.missed);
        let mut keep = Vec::new();
        let mut done = Vec::new();
        for w in waits {
            match map.stale_state(w.index, w.member) {
                evol::StaleState::Durable => done.push((w.part, true)),
                evol::StaleState::Failed(why) => {
                    log::error!(
                        "{}: extent {}: recording a copy stale failed: {why}; failing the write",
                        self.name,
                        w.index
                    );
                    done.push((w.part, false));
                }
                evol::StaleState::Pending if w.since.elapsed() > limit => {
                    log::error!(
                        "{}: extent {}: etcd did not record a copy stale within {} s; failing the write",
                        self.name,
                        w.index,
                        limit.as_secs_f64()
                    );
                    done.push((w.part, false));
                }
                evol::StaleState::Pending => keep.push(w),
            }
        }
        if let Some(ev) = self.evol.as_mut() {
            ev.missed.extend(keep);
        }
        if done.is_empty() {
            return;
        }
        for (part, ok) in done {
            self.fan.recorded(part, ok);
        }
        self.run(sink);
    }

    /// eVol: member `member`'s path is down and holds `held`: the parts
    /// another copy can take end here (writes recorded as missed, reads
    /// moved to another copy, flushes not needed there any more); the
    /// others (the piece's only in-sync copy) wait for the next
    /// connection.
    fn evol_drop_held(
        &mut self,
        member: usize,
        held: &mut VecDeque<Request<TagBuf>>,
        sink: &mut impl PartSink,
    ) {
        let Some(ev) = self.evol.as_ref() else {
            return;
        };
        let mut drop_now = Vec::new();
        let mut kept = VecDeque::new();
        for req in std::mem::take(held) {
            let Some(part) = PartId::from_user_data(req.user_data) else {
                kept.push_back(req);
                continue;
            };
            let t = usize::from(part.tag);
            let readable = match ev.pieces[t].get(usize::from(part.piece)) {
                Some(e) if !matches!(req.command, Command::Flush { .. }) => {
                    ev.map.readable(e.piece.index, &e.copies)
                }
                // A flush: not needed on a member that is down.
                _ => ReplicaSet::EMPTY,
            };
            let flush = matches!(req.command, Command::Flush { .. });
            if flush || !readable.without(member).is_empty() {
                drop_now.push((part, readable));
            } else {
                kept.push_back(req);
            }
        }
        *held = kept;
        if drop_now.is_empty() {
            return;
        }
        for (part, readable) in drop_now {
            self.fan.dropped(part, readable);
        }
        self.run(sink);
    }

    /// Where requests may go now.
    pub fn route(&self) -> Route {
        match &self.replication {
            Some(rep) => rep.route(),
            None => Route::SINGLE,
        }
    }

    fn readable(&self) -> ReplicaSet {
        self.route().readable
    }

    /// Whether replica `r` is out of sync (its parts are dropped, not
    /// held).
    pub fn is_out(&self, r: usize) -> bool {
        self.replication.as_ref().is_some_and(|rep| rep.is_out(r))
    }

    /// Send what the QoS stage admits now (an eVol's eIO feeding it).
    pub fn pump(&mut self, now: Nanos, sink: &mut impl PartSink) {
        loop {
            let released = self.evol_release(now);
            let route = self.route();
            match self.qos.poll_admit_routed(now, route) {
                Some((pending, ticket)) => self.start(now, pending, ticket, sink),
                // What eIO released may free it to release more.
                None if released => {}
                None => break,
            }
        }
    }

    /// [`Requests::pump`] if anything waits in the QoS stage or in eIO
    /// (after completions freed room, or settings changed).
    pub fn pump_if_queued(&mut self, now: Nanos, sink: &mut impl PartSink) {
        if self.qos.queued() > 0 || self.evol_scheduled() > 0 {
            self.pump(now, sink);
        }
    }

    /// When to pump again though nothing completes: the rate limiter's
    /// head may go, or an eVol request waits for a slice.
    pub fn timer(&self) -> Option<Nanos> {
        let slices = self
            .evol
            .as_ref()
            .and_then(|e| e.sched.as_ref())
            .and_then(|s| s.timer(self.fan_now()));
        match (self.qos.timer(), slices) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// An admitted request enters the fan-out.
    fn start(&mut self, now: Nanos, pending: Pending, ticket: Ticket, sink: &mut impl PartSink) {
        let t = usize::from(pending.tag);
        let st = &mut self.tags[t];
        let (op, range) = if ticket.is_read() {
            (Op::Read, 0..0)
        } else {
            match &st.write {
                Some(r) => (Op::Write, r.clone()),
                None => (Op::Flush, 0..0),
            }
        };
        if let Some(ev) = self.evol.as_mut() {
            st.ticket = Some(ticket);
            st.pending = Some(pending);
            let mut specs = std::mem::take(&mut ev.specs);
            specs.clear();
            if op == Op::Flush {
                specs.push(PieceSpec {
                    range: 0..0,
                    copies: ev.map.used_members(),
                });
            }
            for e in &ev.pieces[t] {
                if op == Op::Write {
                    // The repair redoes a chunk a write overlapped.
                    ev.map.write_started(e.piece.index);
                }
                let range = e.piece.index * ev.map.extent_bytes() + e.piece.offset
                    ..e.piece.index * ev.map.extent_bytes() + e.piece.offset + e.piece.len;
                let copies = if op == Op::Read {
                    // Checked non-empty when planned; copies only go stale.
                    let r = ev.map.readable(e.piece.index, &e.copies);
                    r.first()
                        .map_or(e.copies.members(), qos_core::ReplicaSet::one)
                } else {
                    e.copies.members()
                };
                specs.push(PieceSpec { range, copies });
            }
            self.fan.start(now, t as u16, op, &specs);
            if let Some(ev) = self.evol.as_mut() {
                ev.specs = specs;
            }
            self.run(sink);
            return;
        }
        let piece = [PieceSpec {
            range,
            copies: ticket.replicas(),
        }];
        st.ticket = Some(ticket);
        st.pending = Some(pending);
        self.fan.start(now, t as u16, op, &piece);
        self.run(sink);
    }

    /// Carry out the fan-out's actions.
    fn run(&mut self, sink: &mut impl PartSink) {
        while let Some(action) = self.fan.poll_action() {
            match action {
                Action::BeforeWrite {
                    tag,
                    piece,
                    range,
                    to,
                } => {
                    let ok = match &self.replication {
                        Some(rep) => rep.before_write(&range, to).map_err(|e| {
                            // The intent log cannot record what a replica
                            // misses: the write must not go anywhere.
                            log::error!("{}: {e}; failing the write", self.name);
                        }),
                        None => Ok(()),
                    };
                    if ok.is_ok() && !self.cluster_covers(to) {
                        // In cluster mode a write that skips a replica
                        // goes nowhere before etcd records the replica
                        // out of sync: another host starting the volume
                        // after a crash must not take it for a source.
                        let now = self.fan_now();
                        self.hold_for_cluster(now, HeldStep::Prepared { tag, piece }, to);
                        continue;
                    }
                    self.fan.prepared(tag, piece, ok.is_ok());
                }
                Action::Send(part) => self.send_part(part, sink),
                Action::Retry(part) => {
                    // An eVol's ticket is the whole request's, not per
                    // member (settled when it completes).
                    if self.evol.is_none() {
                        if let Some(t) = self.ticket(part) {
                            t.add_uncounted(usize::from(part.copy));
                        }
                    }
                    self.send_part(part, sink);
                }
                Action::Reroute { from, to } => {
                    if self.evol.is_some() {
                        self.send_part(to, sink);
                        continue;
                    }
                    if let Some(mut t) = self.tags[usize::from(from.tag)].ticket.take() {
                        self.qos
                            .reroute(&mut t, usize::from(from.copy), usize::from(to.copy));
                        self.tags[usize::from(from.tag)].ticket = Some(t);
                    }
                    self.send_part(to, sink);
                }
                Action::Release(_) if self.evol.is_some() => {}
                Action::Release(part) => {
                    if let Some(mut t) = self.tags[usize::from(part.tag)].ticket.take() {
                        self.qos.release(&mut t, usize::from(part.copy));
                        self.tags[usize::from(part.tag)].ticket = Some(t);
                    }
                }
                Action::WriteMissed { part, .. } if self.evol.is_some() => {
                    // One copy missed a write (error status, or its path
                    // is down) another copy may hold: no more reads from
                    // it, and the write is acknowledged only once etcd
                    // records it stale (see `crate::evol`).
                    let Some(ev) = self.evol.as_mut() else {
                        continue;
                    };
                    let Some(e) = ev.pieces[usize::from(part.tag)].get(usize::from(part.piece))
                    else {
                        self.fan.recorded(part, false);
                        continue;
                    };
                    let (index, member) = (e.piece.index, usize::from(part.copy));
                    match ev.map.mark_stale(index, member) {
                        evol::StaleState::Durable => self.fan.recorded(part, true),
                        evol::StaleState::Failed(why) => {
                            log::error!("{}: {why}; failing the write", self.name);
                            self.fan.recorded(part, false);
                        }
                        evol::StaleState::Pending => ev.missed.push(MissedWait {
                            part,
                            index,
                            member,
                            since: Instant::now(),
                        }),
                    }
                }
                Action::WriteMissed {
                    part,
                    range,
                    out_of_sync,
                } => {
                    let ok = self.write_missed(part, &range, out_of_sync, sink);
                    let sent_to = self
                        .replication
                        .as_ref()
                        .map_or(ReplicaSet::EMPTY, |rep| rep.all())
                        .without(usize::from(part.copy));
                    if ok && !self.cluster_covers(sent_to) {
                        // Acknowledged only once etcd records the replica
                        // out of sync (see BeforeWrite).
                        let now = self.fan_now();
                        self.hold_for_cluster(now, HeldStep::Recorded(part), sent_to);
                        continue;
                    }
                    self.fan.recorded(part, ok);
                }
                Action::AfterWrite { range, sent, .. } => {
                    if let Some(rep) = &self.replication {
                        rep.after_write(&range, sent);
                    }
                }
                Action::Complete { tag, ok } => {
                    if let Some(ev) = &self.evol {
                        if self.tags[usize::from(tag)].write.is_some() {
                            for e in &ev.pieces[usize::from(tag)] {
                                ev.map.write_ended(e.piece.index);
                            }
                        }
                    }
                    let flush = matches!(
                        self.tags[usize::from(tag)]
                            .pending
                            .as_ref()
                            .map(|p| &p.command),
                        Some(Command::Flush { .. })
                    );
                    if self.evol.is_some() {
                        // The request's one QoS charge: a latency sample
                        // on success, given back otherwise.
                        if let Some(mut t) = self.tags[usize::from(tag)].ticket.take() {
                            if ok {
                                let now = self.fan_now();
                                self.qos.on_part_done(now, &mut t, 0, 0);
                            } else {
                                self.qos.release(&mut t, 0);
                            }
                        }
                        if ok && flush && self.evol_flush_must_wait(tag) {
                            continue;
                        }
                    }
                    self.finish(tag, ok)
                }
            }
        }
    }

    fn ticket(&mut self, part: PartId) -> Option<&mut Ticket> {
        self.tags[usize::from(part.tag)].ticket.as_mut()
    }

    /// Record that `part`'s replica missed the write of `range`, taking it
    /// out of sync first when it answered with an error; whether the
    /// record holds.
    fn write_missed(
        &mut self,
        part: PartId,
        range: &Range<u64>,
        out_of_sync: bool,
        sink: &mut impl PartSink,
    ) -> bool {
        let r = usize::from(part.copy);
        let Some(rep) = &self.replication else {
            // One replica: the fan-out never drops its writes.
            debug_assert!(false, "missed write on a one-replica volume");
            return false;
        };
        let mut res = Ok(());
        if out_of_sync {
            res = rep.path_failed(r).map(|_| ());
            sink.reset_replica(r);
        }
        if let Err(e) = res.and_then(|()| rep.missed(r, range)) {
            log::error!("{}: {e}", self.name);
            return false;
        }
        true
    }

    /// Send `part` (its tag's command, to its replica's namespace).
    fn send_part(&mut self, part: PartId, sink: &mut impl PartSink) {
        if self.evol.is_some() {
            self.send_evol_part(part, sink);
            return;
        }
        let st = &self.tags[usize::from(part.tag)];
        let Some(pending) = st.pending.as_ref() else {
            debug_assert!(false, "part of a tag with no request");
            return;
        };
        let r = usize::from(part.copy);
        let read = st.ticket.is_some_and(|t| t.is_read());
        let buf = pending.buf.map(|(p, l)| {
            // SAFETY: the tag's buffer outlives the engine and is ours
            // until the tag completes (see `TagBuf`); a read has one part
            // at a time (a retry goes out only after the previous part
            // ended), the parts of a write only read it.
            unsafe {
                if read {
                    TagBuf::exclusive(p, l)
                } else {
                    TagBuf::shared(p, l)
                }
            }
        });
        let req = Request {
            command: with_nsid(pending.command, self.nsids[r]),
            buf,
            user_data: part.user_data(),
        };
        sink.send(r, st.class.unwrap_or(NvmeClass::Medium), req);
    }

    /// Send eVol part `part`: its piece's command at its copy's physical
    /// LBA on its member's namespace, with its piece of the tag's buffer.
    fn send_evol_part(&mut self, part: PartId, sink: &mut impl PartSink) {
        let t = usize::from(part.tag);
        let st = &self.tags[t];
        let (Some(pending), Some(ev)) = (st.pending.as_ref(), self.evol.as_mut()) else {
            debug_assert!(false, "part of a tag with no request");
            return;
        };
        let member = usize::from(part.copy);
        let nsid = self.nsids[member];
        let class = st.class.unwrap_or(NvmeClass::Medium);
        let user_data = part.user_data();
        if let Command::Flush { .. } = pending.command {
            ev.flush_seq[t][member] = ev.map.flush_sent();
            let req = Request {
                command: Command::Flush { nsid },
                buf: None,
                user_data,
            };
            sink.send(member, class, req);
            return;
        }
        let Some(e) = ev.pieces[t].get(usize::from(part.piece)) else {
            debug_assert!(false, "part of a piece that is not there");
            return;
        };
        let Some(pext) = e.copies.pext_of(member) else {
            debug_assert!(false, "part on a member without a copy");
            return;
        };
        let slba = (pext * ev.map.extent_bytes() + e.piece.offset) / ev.block_size;
        let r = evol::buf_range(&e.piece);
        // SAFETY (all views below): the tag's buffer outlives the engine
        // and is ours until the tag completes (see `TagBuf`); a read
        // piece has one part at a time and the pieces are disjoint, so
        // its exclusive view is the only one of those bytes; write parts
        // only read theirs.
        let (command, buf) = match pending.command {
            Command::Read { block_size, .. } => (
                Command::Read {
                    nsid,
                    slba,
                    block_size,
                },
                pending
                    .buf
                    .map(|(p, _)| unsafe { TagBuf::exclusive(p.add(r.start), r.len()) }),
            ),
            Command::Write {
                block_size, fua, ..
            } => (
                Command::Write {
                    nsid,
                    slba,
                    block_size,
                    fua,
                },
                pending
                    .buf
                    .map(|(p, _)| unsafe { TagBuf::shared(p.add(r.start), r.len()) }),
            ),
            Command::WriteZeroes { deallocate, .. } => (
                Command::WriteZeroes {
                    nsid,
                    slba,
                    blocks: (e.piece.len / ev.block_size) as u32,
                    deallocate,
                },
                None,
            ),
            Command::Raw(mut sqe) => {
                // A discard: this part's range list (`evol_plan`).
                sqe.nsid = nsid;
                let off = dsm_offset(usize::from(part.piece), member);
                (
                    Command::Raw(sqe),
                    pending
                        .buf
                        .map(|(p, _)| unsafe { TagBuf::shared(p.add(off), 16) }),
                )
            }
            Command::Flush { .. } => unreachable!("handled above"),
        };
        sink.send(
            member,
            class,
            Request {
                command,
                buf,
                user_data,
            },
        );
    }

    /// eVol part `part` completed: a write its member may hold in a
    /// volatile cache is noted, a flush clears what it covered (see
    /// [`ExtentMap::member_lost`]).
    fn evol_acked(&self, part: PartId) {
        let t = usize::from(part.tag);
        let (Some(ev), Some(pending)) = (self.evol.as_ref(), self.tags[t].pending.as_ref()) else {
            return;
        };
        let member = usize::from(part.copy);
        match pending.command {
            Command::Flush { .. } => ev.map.flush_acked(member, ev.flush_seq[t][member]),
            Command::Read { .. } | Command::Write { fua: true, .. } => {}
            Command::Write { .. } | Command::WriteZeroes { .. } | Command::Raw(_) => {
                if let Some(e) = ev.pieces[t].get(usize::from(part.piece)) {
                    ev.map.write_acked(member, e.piece.index);
                }
            }
        }
    }

    /// Counts eVol part `part`'s completion at `now` for the view agent
    /// (data parts only).
    fn evol_record(&self, now: Nanos, part: PartId) {
        let t = usize::from(part.tag);
        let (Some(ev), Some(ticket), Some(pending)) = (
            self.evol.as_ref(),
            self.tags[t].ticket.as_ref(),
            self.tags[t].pending.as_ref(),
        ) else {
            return;
        };
        let Some(flint) = ev.sched.as_ref().map(EvolSched::shared) else {
            return;
        };
        let kind = match pending.command {
            Command::Read { .. } => qos_core::IoKind::Read,
            Command::Write { .. } => qos_core::IoKind::Write,
            _ => return,
        };
        if let Some(e) = ev.pieces[t].get(usize::from(part.piece)) {
            let latency = now.nanos_since(ticket.sent_at());
            flint.record(usize::from(part.copy), kind, e.piece.len, latency);
        }
    }

    /// The copies of `part`'s piece that may serve reads now.
    fn readable_for(&self, part: PartId) -> ReplicaSet {
        match &self.evol {
            None => self.readable(),
            Some(ev) => ev.pieces[usize::from(part.tag)]
                .get(usize::from(part.piece))
                .map_or(ReplicaSet::EMPTY, |e| {
                    ev.map.readable(e.piece.index, &e.copies)
                }),
        }
    }

    /// A completion arrived from replica `replica` at `now`.
    pub fn on_completion(
        &mut self,
        now: Nanos,
        replica: usize,
        done: &Completion<TagBuf>,
        sink: &mut impl PartSink,
    ) {
        let Some(part) = PartId::from_user_data(done.user_data).filter(|p| {
            debug_assert_eq!(usize::from(p.copy), replica, "a completion on another path");
            self.fan.is_outstanding(*p)
        }) else {
            return;
        };
        if done.status.is_reservation_conflict() || done.status.same_code(Status::ABORTED_PREEMPT) {
            // Another host holds the namespace's reservation: it fenced
            // this one (cluster mode: a newer owner; Aborted due to
            // Preempt and Abort: while it took over). Not a replica
            // failure: no replica goes out of sync, nothing is retried on
            // another replica; the request fails, and so does every later
            // one in cluster mode.
            let why = if done.status.is_reservation_conflict() {
                format!(
                    "replica {replica} answered Reservation Conflict: another host holds the namespace's reservation"
                )
            } else {
                format!(
                    "replica {replica} answered Command Aborted due to Preempt and Abort: another host took the namespace's reservation (Reservation Conflict to come)"
                )
            };
            match &self.cluster {
                Some(c) => c.fence_self(why),
                None => log::error!("{}: tag {}: {why}", self.name, part.tag),
            }
            self.fan.failed(part);
            self.run(sink);
            return;
        }
        let ok = done.status.is_success();
        if !ok {
            log::warn!(
                "{}: tag {} (replica {replica}): NVMe status {:?}",
                self.name,
                part.tag,
                done.status
            );
        }
        let t = usize::from(part.tag);
        if self.evol.is_some() {
            if ok && self.tags[t].ticket.is_some_and(|t| t.is_read()) {
                if let Some(c) = self.stats.replica_reads.get(replica) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
            if ok {
                self.evol_record(now, part);
                self.evol_acked(part);
            }
            let readable = self.readable_for(part);
            self.fan.answered(part, ok, readable);
            self.run(sink);
            return;
        }
        if let Some(mut ticket) = self.tags[t].ticket.take() {
            self.qos.on_part_done(now, &mut ticket, replica, done.dw1);
            if ticket.is_read() && ok {
                if let Some(c) = self.stats.replica_reads.get(replica) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.tags[t].ticket = Some(ticket);
        }
        let readable = self.readable();
        self.fan.answered(part, ok, readable);
        self.run(sink);
    }

    /// The part `req` stands for failed for good (its controller is lost
    /// for longer than the policy allows, or a queue can never send it).
    pub fn part_failed(&mut self, req: &Request<TagBuf>, sink: &mut impl PartSink) {
        if let Some(part) = PartId::from_user_data(req.user_data) {
            self.fan.failed(part);
            self.run(sink);
        }
    }

    /// Replica `replica`'s path is down and holds `held`: on an eVol, the
    /// parts another copy can take end here (see `evol_drop_held`);
    /// else, if the replica is out of sync, its parts end here (writes recorded as missed, reads
    /// moved to another replica) and `held` is emptied; else they wait
    /// for the next connection.
    pub fn drop_held_if_out(
        &mut self,
        now: Nanos,
        replica: usize,
        held: &mut VecDeque<Request<TagBuf>>,
        sink: &mut impl PartSink,
    ) {
        if self.evol.is_some() && !held.is_empty() {
            self.evol_drop_held(replica, held, sink);
            self.pump_if_queued(now, sink);
            return;
        }
        if held.is_empty() || !self.is_out(replica) {
            return;
        }
        let readable = self.readable();
        for req in std::mem::take(held) {
            if let Some(part) = PartId::from_user_data(req.user_data) {
                debug_assert_eq!(usize::from(part.copy), replica);
                self.fan.dropped(part, readable);
            }
        }
        self.run(sink);
        self.pump_if_queued(now, sink);
    }

    /// Replica `replica`'s path failed (its connection broke, or its
    /// controller went down with requests waiting): tell the replica set.
    pub fn path_failed(&self, replica: usize) {
        if let Some(rep) = &self.replication {
            if let Err(e) = rep.path_failed(replica) {
                log::error!("{}: {e}", self.name);
            }
        }
    }

    fn finish(&mut self, tag: u16, ok: bool) {
        self.finish_as(tag, ok, true);
    }

    /// Tag `tag` is done; `admitted`: it passed the QoS stage (which then
    /// counts it out).
    fn finish_as(&mut self, tag: u16, ok: bool, admitted: bool) {
        let t = usize::from(tag);
        debug_assert!(
            self.tags[t]
                .ticket
                .is_none_or(|tk| tk.replicas().is_empty()),
            "tag {tag} completed with QoS charges left"
        );
        self.tags[t] = TagState::default();
        if admitted {
            self.qos.on_request_done();
        }
        self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
        if !ok {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.results[t] = Some(ok);
        self.finished.push(tag);
    }

    /// Tag `tag`'s outcome, if known (once).
    pub fn take_result(&mut self, tag: u16) -> Option<bool> {
        self.results.get_mut(usize::from(tag))?.take()
    }

    /// Tags whose outcome became known since the last call (to wake
    /// their tasks).
    pub fn take_finished(&mut self) -> std::vec::Drain<'_, u16> {
        self.finished.drain(..)
    }
}
