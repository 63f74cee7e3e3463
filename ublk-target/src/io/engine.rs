//! The per-ublk-queue I/O engine: one NVMe/TCP I/O queue ([`Queue`], the
//! initiator's sans-IO core) per priority class in use, pumped on the ublk
//! queue's own io_uring.
//!
//! Per ublk queue thread there is one [`Engine`] (shared by the thread's
//! tasks through `Rc<RefCell<_>>`, never across threads). A request's NVMe
//! class (from the ioprio side channel or the volume's fixed class) picks
//! its *path*: the I/O queue opened with that class in the Connect
//! command's CATTR (`Volume::paths`, `Volume::class_path`). Besides the
//! per-tag tasks the thread runs an rx and a tx task per path, and one
//! tick and one pacing task:
//!
//! - **rx**: a `Recv` SQE on the path's socket; bytes go to `Queue::handle_bytes`,
//!   completions wake the tag that owns them (`user_data` = tag). While the
//!   data of a C2HData PDU is due (`Queue::rx_direct`), the `Recv` goes
//!   straight into the tag's buffer at that data's place instead, so read
//!   data is copied once by the kernel and never by us (see [`rx_task`] for
//!   why a reset with such a `Recv` in the ring is safe).
//! - **tx**: woken when the queue has PDUs; one `SendMsg` SQE carries
//!   everything queued since the last one, so requests that arrive in the
//!   same ring pass go out in one write. PDU headers are gathered in the
//!   thread's send buffer; write data of at least [`TX_IN_PLACE_BYTES`]
//!   is sent from the tag's buffer where it is (an iovec), not copied
//!   (see [`tx_task`] for why the tag is pinned until the send is done).
//! - **tick**: a `Timeout` SQE every [`TICK`]: command timeouts, keep-alive
//!   is on the admin queue (the blocking [`Controller`](nvmf_initiator::blocking::Controller)'s maintenance thread),
//!   and reconnect: when the controller has been reset (its epoch moved) or
//!   this queue failed, the queue reconnects in the new epoch and resubmits
//!   what it held, or fails it once the reconnect policy says so
//!   (`fast_io_fail_tmo`, `ctrl_loss_tmo`).
//!
//! The (re)connect itself (TCP, ICReq, Connect) is done blocking on the
//! queue thread, bounded by the connect timeout: no I/O can make progress
//! on this queue without a connection anyway.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nvmf_initiator::{Event, Queue, QueueConfig, Request};
use qos_core::priority::NvmeClass;
use qos_core::Nanos;
use sock_tune::grow_receive_buffer;

use crate::io::fanout::PartId;
pub use crate::io::requests::TagBuf;
use crate::io::requests::{PartSink, Requests, Submission};
use crate::qos::priority::{class_name, connect_class};
use crate::qos::QueueQos;
use crate::volume::{Stats, Volume};

/// NVMe priority classes: a replica has a path entry per class.
const CLASSES: usize = NvmeClass::ALL.len();

/// Period of the housekeeping timer.
pub const TICK: Duration = Duration::from_millis(50);

/// Receive buffer per connection.
pub const RX_BYTES: usize = 256 * 1024;
/// What a receive into that buffer asks for while a read still expects at
/// least [`LARGE_READ_BYTES`] of data and the queue is not at a PDU
/// boundary (at one it asks for just the next headers, [`buffered_len`]):
/// a full-size receive would take
/// (and so copy) most of a large read's data out of the buffer, a short
/// one takes the headers before it and a little of its data, and the rest
/// is offered for a direct receive (measured with
/// `examples/client_path_cost.rs`: 128 KiB reads went from 131,072 bytes
/// copied per read to about 8 KiB, at two receives per read instead of
/// about one half).
pub const RX_SHORT_BYTES: usize = 8 * 1024;
/// See [`RX_SHORT_BYTES`]: below this a read's data is cheaper to copy than
/// a second receive.
pub const LARGE_READ_BYTES: u32 = 64 * 1024;
/// Receive C2HData data straight into the tag's buffer only when at least
/// this much of it is still due: below that, the `Recv` that also brings
/// the PDUs behind it saves a ring round trip worth more than the copy.
pub const DIRECT_MIN_BYTES: usize = 16 * 1024;
/// A direct receive of at least this many bytes waits in the kernel until
/// all of them have arrived (the socket's low-water mark raised to its
/// length, see [`rx_task`]): a 1 MiB read's data then takes about one
/// receive instead of ten. Below it the receive takes what has arrived:
/// a 128 KiB read's data took 1.3 receives without the mark, and waiting
/// for all of it left more unread in the socket, whose window then
/// closed six times as often (0.25 zero-window advertisements per read
/// against 0.04, `BENCH_PERF=1 BENCH_ONLY=profile tests/vm/run --bench
/// ublk`, `by=tcp`).
pub const LOWAT_MIN_BYTES: usize = 256 * 1024;
/// Read data an I/O queue's socket can hold unread (its TCP receive
/// window), set at the connection's first direct receive, that is once
/// large read data comes ([`grow_receive_buffer`], [`rx_task`]); a queue
/// that only writes receives only small PDUs and keeps what TCP chose.
/// A queue's reads can have `depth x MDTS` of data on the way, and with
/// the buffer TCP chose (about 2 MiB, most of it from the low-water mark
/// of 1 MiB reads) 32 reads of 128 KiB filled it: the window closed 12
/// times a second and the target's sends waited for it to reopen. With
/// 4 MiB it no longer closed, and in the bench's matrix 1 MiB reads went
/// from 0.75-0.86x of the kernel host to 0.89-0.94x (`tests/vm/run
/// --bench ublk`; docs/benchmarks.md, 2026-11-30, fourth). Memory is
/// taken only for data that has arrived and is not read yet, which is
/// data this queue asked for.
pub const RX_WINDOW_BYTES: usize = 4 * 1024 * 1024;
/// Bytes gathered per send.
pub const TX_LIMIT: usize = 256 * 1024;
/// Write data (in-capsule or H2CData) of at least this many bytes is sent
/// from the tag's buffer instead of being copied into the send buffer.
/// Smaller data is copied: one iovec each would cost the kernel more than
/// the copy, and this bounds the iovecs per send (see [`MAX_TX_IOVECS`]).
pub const TX_IN_PLACE_BYTES: usize = 4096;
/// Most iovecs one send can need: a header run before and after each piece
/// of data left in place (`poll_transmit_vectored` leaves at most
/// `TX_LIMIT / TX_IN_PLACE_BYTES + 1` in place), far below `UIO_MAXIOV`.
pub const MAX_TX_IOVECS: usize = 2 * (TX_LIMIT / TX_IN_PLACE_BYTES + 1) + 1;

/// One io_uring operation, as the libublk adapter submits it on the
/// queue's ring (`ublk::uring_op`); the result is the CQE's `res`.
pub type UringOp = fn(io_uring::squeue::Entry) -> Pin<Box<dyn Future<Output = i32>>>;

/// SQEs submitted as one linked chain (`IOSQE_IO_LINK` on all but the
/// last), contiguously on the queue's ring so they run in order
/// (`ublk::uring_chain`). As many as the ring has room for are submitted,
/// at least the first; the result is their CQEs' `res`, in order (its
/// length says how many went).
pub type ChainOp = fn(&[io_uring::squeue::Entry]) -> Pin<Box<dyn Future<Output = Vec<i32>>>>;

/// Write data in our memory of at least this many bytes is sent by
/// reference (`vmsplice` into a pipe, `splice` to the socket: see
/// [`SendPlan`] and `send_inline`) rather than copied by the socket into
/// pages it allocates and the kernel zeroes. Below it the two system
/// calls' worth of work costs more than the copy.
pub const SPLICE_MIN_BYTES: usize = 32 * 1024;

/// The pipe a path's spliced sends go through: room for a whole send
/// ([`TX_LIMIT`] of pieces, each possibly one page more than its
/// length), so that a chain is rarely cut short for want of room.
pub const SPLICE_PIPE_BYTES: usize = 1024 * 1024;

/// Most SQEs [`tx_task`] links into one chain (a 256 KiB send of 128 KiB
/// writes is five).
pub const MAX_CHAIN: usize = 32;

struct Conn {
    sock: TcpStream,
    queue: Queue<TagBuf>,
    /// Bumped per connection, so a stale rx/tx completion is ignored.
    generation: u64,
}

/// One NVMe/TCP I/O queue of the engine: the queue of one priority class
/// on one target (its Connect carries the class in CATTR).
struct Path {
    /// Index of the replica in `Volume::replicas`.
    replica: usize,
    class: NvmeClass,
    qid: Option<u16>,
    /// Controller epoch the connection belongs to.
    epoch: u64,
    conn: Option<Conn>,
    generation: u64,
    /// Requests waiting for a connection, oldest first.
    held: VecDeque<Request<TagBuf>>,
    tx_waker: Option<Waker>,
    rx_waker: Option<Waker>,
    /// The tag whose buffer this path's `Recv` in the ring writes into, if
    /// it is a direct one: that tag is not handed back to the driver until
    /// the `Recv` has completed (see [`rx_task`]).
    rx_direct_tag: Option<u16>,
    /// Where in the request's data that direct `Recv` writes (zero copy
    /// records what it received).
    rx_direct_at: u32,
    /// Sockets of failed connections, shut down but kept open until this
    /// path's send in the ring is done: the SQEs of a linked chain that
    /// have not started yet look their fd up when they start, and a
    /// closed fd's number may belong to the new connection by then
    /// (see [`tx_task`]).
    retired: Vec<TcpStream>,
    /// When the last reconnect attempt failed (attempts are spaced by the
    /// reconnect delay).
    last_attempt: Option<Instant>,
}

/// The engine of one ublk queue; see the module documentation.
pub struct Engine {
    volume: Arc<Volume>,
    stats: Arc<Stats>,
    /// One per (replica, class with a queue of its own).
    paths: Vec<Path>,
    /// Path of (replica r, class c): `path_of[r * CLASSES + c.index()]`
    /// (see [`PathSink::path_index`]).
    path_of: Vec<u8>,
    /// The requests: QoS stage (rate limiter, credit gates, class
    /// arbitration, replica choice) and the fan-out to their parts.
    requests: Requests,
    pace_waker: Option<Waker>,
    wakers: Vec<Option<Waker>>,
    /// Per tag: pieces of its data that sends in the ring read in place
    /// (one send per path at most, but one pin per piece: a write whose
    /// data is only in its pages has every piece placed, up to
    /// `TX_LIMIT / 512` per send); the tag is not handed back to the
    /// driver while any is (see [`tx_task`]).
    tx_pins: Vec<u32>,
    /// ublk zero copy, when the device runs with it.
    zero_copy: Option<ZeroCopy>,
    /// Write data in our memory of at least this many bytes is spliced
    /// ([`SPLICE_MIN_BYTES`]; `usize::MAX`: never).
    splice_min: usize,
    /// Copies of the headers in front of spliced data, spliced with it.
    heads: HeadCopies,
}

/// ublk zero copy on one queue (see [`crate::io::ublk`]): the driver
/// registers each request's pages as the ring's fixed buffer number `tag`
/// and copies nothing itself. A direct receive of read data then goes
/// straight into those pages (`READ_FIXED` at the data's offset); the rest
/// of a read's data (what came in a buffered receive with the headers, or
/// zeros an eVol fills in) lands in the tag's buffer in our memory, as
/// without zero copy, and the tag task copies just those ranges into the
/// request before it commits ([`Engine::take_copied`]).
///
/// A large write's data is not copied into our memory at all: the tag
/// task marks it ([`Engine::data_in_request`]), every piece of it is left
/// in place by the initiator ([`gather`]) and [`tx_task`] sends it with a
/// `WRITE_FIXED` from those pages, linked between the `SendMsg`s of the
/// PDU headers around it.
struct ZeroCopy {
    /// Per tag: where its buffer in our memory starts (a direct place in
    /// it is turned into an offset into the request).
    bases: Vec<usize>,
    /// Per tag: byte ranges of the current request's data received
    /// straight into its pages, in arrival order.
    direct: Vec<Vec<(u32, u32)>>,
    /// Per tag: its current request is a write whose data is only in the
    /// request's pages (the tag's buffer does not hold it).
    in_request: Vec<bool>,
}

/// Where a direct receive writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectRecv {
    /// Into our memory (the tag's buffer).
    Mem {
        /// Start.
        ptr: *mut u8,
        /// Length.
        len: usize,
    },
    /// Into the request's pages: fixed buffer `tag`, at `offset`.
    Fixed {
        /// The tag (= its fixed buffer's index).
        tag: u16,
        /// Offset in the request's data.
        offset: u32,
        /// Length.
        len: usize,
    },
}

impl DirectRecv {
    /// How many bytes the receive asks for.
    fn len(&self) -> usize {
        match *self {
            DirectRecv::Mem { len, .. } | DirectRecv::Fixed { len, .. } => len,
        }
    }
}

/// The engine's paths as the requests' [`PartSink`].
struct PathSink<'a> {
    paths: &'a mut [Path],
    path_of: &'a [u8],
    volume: &'a Volume,
    now: Instant,
}

impl PathSink<'_> {
    /// The path replica `r`'s requests of class `class` go on.
    fn path_index(&self, r: usize, class: NvmeClass) -> usize {
        usize::from(self.path_of[r * CLASSES + class.index()])
    }
}

impl PartSink for PathSink<'_> {
    fn send(&mut self, replica: usize, class: NvmeClass, req: Request<TagBuf>) {
        let p = self.path_index(replica, class);
        let path = &mut self.paths[p];
        match path.conn.as_mut() {
            Some(c) => match c.queue.submit(self.now, req) {
                Err(rej) => path.held.push_back(rej.request),
                Ok(()) => wake(&mut path.tx_waker),
            },
            None => path.held.push_back(req),
        }
    }

    fn reset_replica(&mut self, replica: usize) {
        let ctrl = &self.volume.replicas[replica].ctrl;
        ctrl.report_failure(ctrl.epoch(), &nvmf_initiator::Error::QueueClosed);
    }
}

impl Engine {
    /// An engine for ublk queue `qid` of `depth` tags; not connected yet.
    pub fn new(volume: Arc<Volume>, qid: u16, depth: u16) -> Self {
        let stats = Arc::clone(&volume.stats);
        let policy = volume.config.replication.read_policy;
        let qos = if volume.evol.is_some() {
            // One charge per request (see `Requests::set_evol`).
            QueueQos::new(
                Arc::clone(&volume.qos),
                qid,
                volume.priority.config.arbiter(),
            )
        } else {
            QueueQos::replicated(
                Arc::clone(&volume.qos),
                qid,
                volume.priority.config.arbiter(),
                volume.replicas.len(),
                policy,
            )
        };
        let mut paths = Vec::new();
        let mut path_of = vec![0u8; volume.replicas.len() * CLASSES];
        for (r, t) in volume.replicas.iter().enumerate() {
            let base = paths.len();
            for &class in &t.classes {
                paths.push(Path {
                    replica: r,
                    class,
                    qid: None,
                    epoch: 0,
                    conn: None,
                    generation: 0,
                    held: VecDeque::new(),
                    tx_waker: None,
                    rx_waker: None,
                    rx_direct_tag: None,
                    rx_direct_at: 0,
                    retired: Vec::new(),
                    last_attempt: None,
                });
            }
            for c in NvmeClass::ALL {
                path_of[r * CLASSES + c.index()] =
                    (base + usize::from(t.class_path[c.index()])) as u8;
            }
        }
        let mut requests = Requests::new(
            volume.config.name.clone(),
            volume.replicas.iter().map(|t| t.spec.nsid).collect(),
            volume.replication.clone(),
            Arc::clone(&stats),
            qos,
            depth,
        );
        if let Some(c) = &volume.cluster {
            requests.set_cluster(Arc::clone(c));
        }
        if let Some(ev) = &volume.evol {
            requests.set_evol(
                Arc::clone(&ev.map),
                volume.geometry.block_size,
                ev.wait,
                ev.flint.clone(),
            );
        }
        Self {
            requests,
            pace_waker: None,
            volume,
            stats,
            paths,
            path_of,
            wakers: vec![None; usize::from(depth)],
            tx_pins: vec![0; usize::from(depth)],
            zero_copy: None,
            splice_min: SPLICE_MIN_BYTES,
            heads: HeadCopies::new(depth),
        }
    }

    /// The device runs with ublk's zero copy; `bases[tag]` is where tag
    /// `tag`'s buffer in our memory starts.
    pub fn set_zero_copy(&mut self, bases: Vec<usize>) {
        let n = bases.len();
        self.zero_copy = Some(ZeroCopy {
            bases,
            direct: vec![Vec::new(); n],
            in_request: vec![false; n],
        });
        self.stats.zero_copy.store(true, Ordering::Relaxed);
    }

    /// Zero copy: the ranges of tag `tag`'s read data (`len` bytes) that
    /// did not go straight into the request's pages, so must be copied
    /// there from the tag's buffer; forgets the request's direct ranges.
    /// Empty without zero copy.
    pub fn take_copied(&mut self, tag: u16, len: u32) -> Vec<(u32, u32)> {
        let Some(z) = self.zero_copy.as_mut() else {
            return Vec::new();
        };
        let direct = &mut z.direct[usize::from(tag)];
        let copied = uncovered(len, direct);
        direct.clear();
        let c: u64 = copied.iter().map(|&(a, b)| u64::from(b - a)).sum();
        self.stats.zc_read_copied.fetch_add(c, Ordering::Relaxed);
        self.stats
            .zc_read_direct
            .fetch_add(u64::from(len) - c, Ordering::Relaxed);
        copied
    }

    /// Zero copy: whether the write tag `tag` submits next keeps its data
    /// in the request's pages only (sent from there with `WRITE_FIXED`,
    /// never copied into the tag's buffer). Set before each submission;
    /// `true` is refused (returns `false`) without zero copy.
    pub fn data_in_request(&mut self, tag: u16, yes: bool) -> bool {
        match self.zero_copy.as_mut() {
            Some(z) => {
                z.in_request[usize::from(tag)] = yes;
                yes
            }
            None => false,
        }
    }

    /// How many NVMe/TCP queues (replicas x classes in use) this engine
    /// runs; the queue thread starts an rx and a tx task per path.
    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    /// Connect every path (blocking, bounded) if its controller is live;
    /// on failure the tick retries.
    pub fn try_connect(&mut self, now: Instant) {
        for p in 0..self.paths.len() {
            self.try_connect_path(p, now);
        }
    }

    fn try_connect_path(&mut self, p: usize, now: Instant) {
        let vol = Arc::clone(&self.volume);
        let r = self.paths[p].replica;
        let target = &vol.replicas[r];
        let path = &mut self.paths[p];
        if path.conn.is_some() {
            return;
        }
        let ctrl = &target.ctrl;
        if !ctrl.is_live() {
            return;
        }
        if let Some(t) = path.last_attempt {
            if now.duration_since(t) < vol.config.reconnect.reconnect_delay.min(TICK * 20) {
                return;
            }
        }
        if let Some(rep) = &vol.replication {
            // Out of sync, or fenced: the manager says when it may return.
            if !rep.may_connect(r) {
                return;
            }
        }
        let class = connect_class(path.class);
        let (epoch, cfg) = match path.qid {
            Some(qid) => ctrl.io_queue_reconnect_config(qid, class),
            None => match ctrl.io_queue_config(class) {
                Ok((e, c)) => {
                    path.qid = Some(c.qid);
                    (e, c)
                }
                Err(e) => {
                    log::error!("{}: no I/O queue: {e}", vol.config.name);
                    path.last_attempt = Some(now);
                    return;
                }
            },
        };
        match connect_blocking(target.addr, cfg) {
            Ok((sock, queue)) => {
                // Spliced sends run from this thread (`send_inline`) and
                // must not block it on a full socket: a splice to a
                // socket waits unless the socket itself is non-blocking.
                // The ring's own operations on it are unaffected (a
                // socket supports non-blocking issue, so io_uring polls
                // and retries as before; an -EAGAIN that does reach a
                // CQE is retried by every task).
                if let Err(e) = sock.set_nonblocking(true) {
                    log::warn!("tx: socket stays blocking, sends go through the ring: {e}");
                }
                path.epoch = epoch;
                path.generation += 1;
                let held = std::mem::take(&mut path.held);
                let n = held.len();
                path.conn = Some(Conn {
                    sock,
                    queue,
                    generation: path.generation,
                });
                path.last_attempt = None;
                let now = Instant::now();
                let mut refused = Vec::new();
                for req in held {
                    let c = self.paths[p].conn.as_mut().expect("just connected");
                    if let Err(rej) = c.queue.submit(now, req) {
                        // A fresh queue refuses only what it can never
                        // send (e.g. larger than the new limits).
                        refused.push(rej.request);
                    }
                }
                self.fail_parts(refused);
                let path = &mut self.paths[p];
                if epoch > 0 || n > 0 {
                    log::info!(
                        "{}: I/O queue {} ({}, target {r}) connected (controller epoch {epoch}), {n} requests resubmitted",
                        vol.config.name,
                        cfg_qid(path),
                        class_name(path.class),
                    );
                }
                wake(&mut path.tx_waker);
                wake(&mut path.rx_waker);
            }
            Err(e) => {
                log::warn!("{}: I/O queue connect: {e}", vol.config.name);
                path.last_attempt = Some(now);
                ctrl.report_failure(epoch, &e);
            }
        }
    }
    /// The requests and the paths they are sent on, borrowed apart.
    fn split(&mut self, now: Instant) -> (&mut Requests, PathSink<'_>) {
        (
            &mut self.requests,
            PathSink {
                paths: &mut self.paths,
                path_of: &self.path_of,
                volume: &self.volume,
                now,
            },
        )
    }

    /// Queue request `s`; what may go now is sent.
    pub fn submit(&mut self, s: Submission) {
        // The tag's last request completed: nothing reads its header
        // copies any more.
        self.heads.reset(s.tag);
        if let Some(z) = self.zero_copy.as_mut() {
            // A direct receive of the tag's previous request (pinned until
            // it completed) is done by now.
            z.direct[usize::from(s.tag)].clear();
        }
        let at = Instant::now();
        let now = self.requests.now(at);
        let (req, mut sink) = self.split(at);
        req.submit(now, s, &mut sink);
        self.after_requests();
    }

    /// Wake the tasks of tags that finished, and the pacing task if the
    /// rate limiter holds a request back.
    fn after_requests(&mut self) {
        for tag in self.requests.take_finished() {
            if let Some(w) = self.wakers.get_mut(usize::from(tag)) {
                wake(w);
            }
        }
        if self.requests.timer().is_some() {
            wake(&mut self.pace_waker);
        }
    }

    /// Send what the QoS stage admits now.
    fn pump(&mut self, at: Instant) {
        let now = self.requests.now(at);
        let (req, mut sink) = self.split(at);
        req.pump(now, &mut sink);
        self.after_requests();
    }

    /// How long until the pacing timer should fire, if it is armed.
    fn pace_delay(&self) -> Option<Duration> {
        let at = self.requests.timer()?;
        let now = self.requests.now(Instant::now());
        Some(Duration::from_nanos(at.nanos_since(now)).min(TICK))
    }

    /// The outcome of tag `tag`'s request, once known and once no `Recv`
    /// can write into its buffer any more.
    fn poll_result(&mut self, tag: u16, cx: &Context<'_>) -> Poll<bool> {
        if self.paths.iter().any(|p| p.rx_direct_tag == Some(tag))
            || self.tx_pins[usize::from(tag)] > 0
        {
            // on_direct wakes the tag when that Recv completes, on_sent
            // when the last send reading its buffer does.
            self.wakers[usize::from(tag)] = Some(cx.waker().clone());
            return Poll::Pending;
        }
        match self.requests.take_result(tag) {
            Some(ok) => Poll::Ready(ok),
            None => {
                self.wakers[usize::from(tag)] = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// Hand path `p`'s completions to the requests; a failed queue ends
    /// its connection.
    fn drain_events(&mut self, p: usize) {
        let r = self.paths[p].replica;
        // The clock is read once per batch, and only if something completed
        // (a direct receive usually brings no event): the QoS clock's
        // conversion alone is ~90 instructions.
        let mut clock: Option<(Instant, Nanos)> = None;
        while let Some(ev) = self.paths[p]
            .conn
            .as_mut()
            .and_then(|c| c.queue.poll_event())
        {
            match ev {
                Event::Connected { .. } => {}
                Event::Completed(done) => {
                    let (at, now) = *clock.get_or_insert_with(|| {
                        let at = Instant::now();
                        (at, self.requests.now(at))
                    });
                    let (req, mut sink) = self.split(at);
                    req.on_completion(now, r, &done, &mut sink);
                }
                Event::Failed(e) => self.on_failure(p, e),
            }
        }
        if let Some((at, now)) = clock {
            let (req, mut sink) = self.split(at);
            req.pump_if_queued(now, &mut sink);
            self.after_requests();
        }
        // Admissions may have queued PDUs on any path.
        for path in &mut self.paths {
            if path.conn.as_ref().is_some_and(|c| c.queue.has_transmit()) {
                wake(&mut path.tx_waker);
            }
        }
    }

    /// `held` failed for good (the reconnect policy gave up on its
    /// controller, or a fresh queue can never send them).
    fn fail_parts(&mut self, held: impl IntoIterator<Item = Request<TagBuf>>) {
        let at = Instant::now();
        let (req, mut sink) = self.split(at);
        for r in held {
            req.part_failed(&r, &mut sink);
        }
        self.after_requests();
    }

    /// The pacing timer fired.
    fn on_pace(&mut self) {
        self.pump(Instant::now());
    }

    /// Path `p`'s connection is gone: reset its controller (once, whoever
    /// reports). On a one-target volume (or the last in-sync replica) the
    /// unfinished requests are kept for the next connection; a replica
    /// that is now out of sync drops them (writes recorded as missed,
    /// reads moved to another replica).
    fn on_failure(&mut self, p: usize, err: nvmf_initiator::Error) {
        let path = &mut self.paths[p];
        let r = path.replica;
        let Some(mut c) = path.conn.take() else {
            return;
        };
        log::warn!(
            "{}: I/O queue {} ({}, replica {r}) failed: {err}",
            self.volume.config.name,
            c.queue.config().qid,
            class_name(path.class)
        );
        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        self.volume.replicas[r]
            .ctrl
            .report_failure(path.epoch, &err);
        if let Some(ev) = &self.volume.evol {
            // Its target may have crashed with acknowledged writes in a
            // volatile cache: their copies there become stale.
            ev.map.member_lost(r, path.epoch);
        }
        c.queue.close();
        abort(&c.sock);
        let _ = c.sock.shutdown(Shutdown::Both);
        path.retired.push(c.sock);
        let mut unfinished = c.queue.take_unfinished();
        // Requests that never reached the queue stay behind those.
        unfinished.extend(path.held.drain(..));
        path.held = unfinished.into();
        // A recv still in flight on the socket returns on the shutdown.
        wake(&mut path.rx_waker);
        self.requests.path_failed(r);
        self.drop_if_out(p);
    }

    /// If path `p`'s replica is out of sync, end what it holds (see
    /// [`Requests::drop_held_if_out`]).
    fn drop_if_out(&mut self, p: usize) {
        let r = self.paths[p].replica;
        let mut held = std::mem::take(&mut self.paths[p].held);
        let at = Instant::now();
        let now = self.requests.now(at);
        let (req, mut sink) = self.split(at);
        req.drop_held_if_out(now, r, &mut held, &mut sink);
        // Whatever the requests sent here meanwhile waits behind.
        held.extend(self.paths[p].held.drain(..));
        self.paths[p].held = held;
        self.after_requests();
    }

    /// Housekeeping, every [`TICK`]: timeouts, controller resets, reconnect,
    /// and failing held I/O when the policy says so.
    pub fn tick(&mut self, now: Instant) {
        let vol = Arc::clone(&self.volume);
        if vol.cluster.as_ref().is_some_and(|c| c.is_fenced()) {
            // Another host owns the volume: requests waiting for a path
            // (a fence, a reconnect) will never be sent; fail them now
            // rather than when the path returns.
            for p in 0..self.paths.len() {
                let held = std::mem::take(&mut self.paths[p].held);
                if !held.is_empty() {
                    self.fail_parts(held);
                }
            }
        }
        for p in 0..self.paths.len() {
            let r = self.paths[p].replica;
            let ctrl = &vol.replicas[r].ctrl;
            if let Some(c) = self.paths[p].conn.as_mut() {
                if c.queue.poll_timeout().is_some_and(|t| t <= now) {
                    c.queue.handle_timeout(now);
                }
            }
            self.drain_events(p);
            if self.paths[p].conn.is_some() && ctrl.epoch() != self.paths[p].epoch {
                // The controller was reset behind this queue (keep-alive
                // failure, another queue's error): its connection belongs
                // to the old controller.
                self.on_failure(p, nvmf_initiator::Error::QueueClosed);
            }
            if self.paths[p].conn.is_none() {
                if vol.replication.is_some() {
                    // Requests wait on a path whose controller is down
                    // (it never connected, or was reset while idle): the
                    // replica has failed for them, as if the connection
                    // had broken under them.
                    if !ctrl.is_live() && !self.paths[p].held.is_empty() && !self.requests.is_out(r)
                    {
                        self.requests.path_failed(r);
                    }
                    self.drop_if_out(p);
                } else if vol.evol.is_some() {
                    // eVol: a member without a connection holds nothing
                    // another copy can take (writes complete once the
                    // copy is recorded stale in etcd; see `crate::evol`).
                    self.drop_if_out(p);
                }
                if let Err(e) = ctrl.disposition() {
                    let held = std::mem::take(&mut self.paths[p].held);
                    if !held.is_empty() {
                        log::error!("{}: failing {} requests: {e}", vol.config.name, held.len());
                    }
                    self.fail_parts(held);
                }
                self.try_connect_path(p, now);
            }
        }
        {
            let (req, mut sink) = self.split(now);
            let n = req.now(now);
            req.cluster_tick(n, &mut sink);
            // eVol writes waiting for a mapping: polled every tick (a
            // first write waits up to one TICK more than its allocation).
            req.evol_tick(n, &mut sink);
        }
        self.after_requests();
        // Settings changed at run time (credit mode, limits) and replicas
        // coming back reach a queue that is otherwise idle.
        if self.requests.qos().queued() > 0 {
            self.pump(now);
        }
    }

    /// Bytes received on path `p`'s connection `generation`.
    fn on_bytes(&mut self, p: usize, generation: u64, bytes: &[u8]) {
        if let Some(c) = self.paths[p]
            .conn
            .as_mut()
            .filter(|c| c.generation == generation)
        {
            c.queue.handle_bytes(Instant::now(), bytes);
        }
        self.drain_events(p);
    }

    /// Where path `p`'s next `Recv` should write, if its connection is
    /// still `generation` and enough of a C2HData PDU's data is due: that
    /// part of the tag's buffer, or with zero copy, of the request's pages.
    /// Records the tag as pinned until [`Engine::on_direct`].
    fn rx_place(&mut self, p: usize, generation: u64) -> Option<DirectRecv> {
        let c = self.paths[p]
            .conn
            .as_mut()
            .filter(|c| c.generation == generation)?;
        let (tag, ptr, len) = direct_place(&mut c.queue)?;
        let path = &mut self.paths[p];
        path.rx_direct_tag = Some(tag);
        Some(match &self.zero_copy {
            None => DirectRecv::Mem { ptr, len },
            Some(z) => {
                // The place is in the tag's buffer, at the same offset as
                // in the request (a part's buffer is a window of it).
                let offset = (ptr as usize - z.bases[usize::from(tag)]) as u32;
                path.rx_direct_at = offset;
                DirectRecv::Fixed { tag, offset, len }
            }
        })
    }

    /// How much path `p`'s next receive into the thread's buffer asks for
    /// ([`buffered_len`]).
    fn rx_len(&self, p: usize) -> usize {
        self.paths[p]
            .conn
            .as_ref()
            .map_or(RX_BYTES, |c| buffered_len(&c.queue))
    }

    /// Gather path `p`'s PDUs into `buf` and `placed` ([`gather`]) and pin
    /// the tags whose buffers `placed` points into.
    fn tx_gather(&mut self, p: usize, buf: &mut Vec<u8>, placed: &mut Vec<Placed>) {
        if let Some(c) = self.paths[p].conn.as_mut() {
            let zc = self.zero_copy.as_ref();
            let in_request = |tag: u16| {
                let t = usize::from(tag);
                zc.filter(|z| z.in_request[t]).map(|z| z.bases[t])
            };
            gather(&mut c.queue, buf, placed, &in_request);
            let head_min = self.splice_min.max(self.stats.head_copy_min());
            self.heads.copy(buf, placed, head_min);
        }
        for d in placed.iter() {
            self.tx_pins[usize::from(d.tag)] += 1;
        }
        self.stats.sends.fetch_add(1, Ordering::Relaxed);
    }

    /// Path `p`'s send that read `placed` in place is done (sent, or
    /// failed): close the path's retired sockets, unpin the tags and wake
    /// the ones no other send holds.
    fn on_sent(&mut self, p: usize, placed: &[Placed]) {
        self.paths[p].retired.clear();
        for d in placed {
            let t = usize::from(d.tag);
            self.tx_pins[t] -= 1;
            if self.tx_pins[t] == 0 {
                wake(&mut self.wakers[t]);
            }
        }
    }

    /// A direct `Recv` of path `p`'s connection `generation` completed
    /// with `res`: the bytes are in the tag's buffer already.
    fn on_direct(&mut self, p: usize, generation: u64, res: i32) {
        let tag = self.paths[p].rx_direct_tag.take();
        if let (Some(z), Some(t), true) = (self.zero_copy.as_mut(), tag, res > 0) {
            // In the request's pages now, whatever becomes of this
            // connection: the bytes are that read's data at its offsets
            // (see `rx_task`), so they need no copy even if the read is
            // redone elsewhere.
            let at = self.paths[p].rx_direct_at;
            z.direct[usize::from(t)].push((at, at + res as u32));
        }
        if res > 0 {
            if let Some(c) = self.paths[p]
                .conn
                .as_mut()
                .filter(|c| c.generation == generation)
            {
                c.queue.handle_direct(Instant::now(), res as usize);
            }
            self.drain_events(p);
        } else if res != -libc::EINTR && res != -libc::EAGAIN {
            self.on_socket_error(p, generation, res);
        }
        // The tag may have finished (or been failed) meanwhile: its task
        // may go on now.
        if let Some(w) = tag.and_then(|t| self.wakers.get_mut(usize::from(t))) {
            wake(w);
        }
    }

    /// A socket operation of path `p`'s connection `generation` failed or
    /// hit EOF.
    fn on_socket_error(&mut self, p: usize, generation: u64, res: i32) {
        if self.paths[p]
            .conn
            .as_ref()
            .is_some_and(|c| c.generation == generation)
        {
            let err = if res == 0 {
                nvmf_initiator::Error::ConnectionClosed
            } else {
                nvmf_initiator::Error::io(std::io::Error::from_raw_os_error(-res))
            };
            if let Some(c) = self.paths[p].conn.as_mut() {
                c.queue.handle_closed();
            }
            self.drain_events(p);
            if self.paths[p].conn.is_some() {
                self.on_failure(p, err);
            }
        }
    }

    fn current(&self, p: usize) -> Option<(u64, i32)> {
        self.paths[p]
            .conn
            .as_ref()
            .map(|c| (c.generation, c.sock.as_raw_fd()))
    }
}

fn cfg_qid(p: &Path) -> u16 {
    p.conn
        .as_ref()
        .map_or(p.qid.unwrap_or(0), |c| c.queue.config().qid)
}

/// Abort a failed connection: its send queue is dropped (the peer gets a
/// reset) and nothing more of it leaves, where a shutdown alone would go
/// on transmitting its unsent bytes, possibly long after their requests
/// were handed to a new connection and their pages reused (spliced sends
/// reference our tag buffers, see [`tx_task`]). A `connect` to
/// `AF_UNSPEC` dissolves the association and keeps the descriptor, which
/// must stay open (`Path::retired`).
fn abort(sock: &TcpStream) {
    // SAFETY: an AF_UNSPEC sockaddr is valid with only the family set.
    let mut sa: libc::sockaddr = unsafe { std::mem::zeroed() };
    sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: `sa` is a valid sockaddr of the given length; the socket is
    // open.
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if r < 0 {
        log::debug!("abort: {}", std::io::Error::last_os_error());
    }
}

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
    }
}

/// Where the next receive of `q`'s connection should write, if enough of
/// a C2HData PDU's data is due (at least [`DIRECT_MIN_BYTES`]): the tag
/// whose buffer it is, and that part of the buffer.
pub fn direct_place(q: &mut Queue<TagBuf>) -> Option<(u16, *mut u8, usize)> {
    let tag = PartId::from_user_data(q.rx_direct_user_data()?)?.tag;
    let place = q.rx_direct().filter(|b| b.len() >= DIRECT_MIN_BYTES)?;
    Some((tag, place.as_mut_ptr(), place.len()))
}

/// How many bytes a receive into the thread's buffer asks for on `q`'s
/// connection: while a read still expects [`LARGE_READ_BYTES`] or more of
/// data, just the next PDU headers where the queue is at a PDU boundary
/// (`Queue::rx_header_len`: the data of a C2HData PDU behind them is then
/// all left for a direct receive, none of it copied into place
/// afterwards), else [`RX_SHORT_BYTES`]; otherwise [`RX_BYTES`]. With
/// zero copy, the ~8 KiB of each 128 KiB read that the short receive took
/// cost a copy into our buffer, one into the tag's and a `pwrite` into
/// the request: asking for the headers alone took the client's queue
/// thread from 927 to 699 us of CPU per 128 KiB read and the copied
/// share of read data from 6.2 % to 0.5 %, at 3.45 receives per read
/// against 3.30 (`BENCH_PERF=1 BENCH_ONLY=profile tests/vm/run --bench
/// ublk`, its `by=thread` and `by=socket` lines; docs/benchmarks.md,
/// 2026-11-30, fifth).
pub fn buffered_len(q: &Queue<TagBuf>) -> usize {
    if q.expects_read_data(LARGE_READ_BYTES) {
        q.rx_header_len().unwrap_or(RX_SHORT_BYTES)
    } else {
        RX_BYTES
    }
}

/// The parts of `0..len` that no range in `covered` covers, in order
/// (`covered` is sorted in place; ranges may overlap or repeat, as a read
/// received again after a reconnect does).
pub fn uncovered(len: u32, covered: &mut [(u32, u32)]) -> Vec<(u32, u32)> {
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for &(a, b) in covered.iter() {
        if a > at {
            out.push((at, a.min(len)));
        }
        at = at.max(b);
        if at >= len {
            break;
        }
    }
    if at < len {
        out.push((at, len));
    }
    out.retain(|&(a, b)| a < b);
    out
}

/// Write data a send takes from a tag's buffer where it is, or from the
/// request's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Where its PDU's header starts in the send buffer: the header (with
    /// its digest and padding) is `buf[head..at]`.
    pub head: usize,
    /// Where in the send buffer it goes (the bytes before are the PDU's
    /// header and everything gathered before it).
    pub at: usize,
    /// The data, in the tag's buffer (its place there, when the data
    /// itself is only in the request's pages).
    pub ptr: *const u8,
    /// Its length.
    pub len: usize,
    /// The tag whose buffer it is.
    pub tag: u16,
    /// Zero copy: the data is only in the request's pages (fixed buffer
    /// `tag`), at this offset of the request's data.
    pub in_request: Option<u32>,
    /// Where a copy of its header (`buf[head..at]`) that stays put until
    /// the tag's next request is ([`HeadCopies`]), when it has one: a
    /// spliced send then takes the header by reference, with its data.
    pub head_copy: Option<usize>,
}

/// The tag a request on the engine's queues belongs to: every one is a
/// part (`Requests::send_part`), whose user_data names the tag.
fn tag_of(user_data: u64) -> u16 {
    PartId::from_user_data(user_data).map_or(user_data as u16, |p| p.tag)
}

/// One send's worth of `q`'s PDUs: headers and small data into `buf`,
/// write data of at least [`TX_IN_PLACE_BYTES`] into `placed` (both
/// cleared first). With zero copy, `in_request(tag)` is the start of the
/// tag's buffer when its write's data is only in the request's pages
/// ([`Engine::data_in_request`]): all of that data is placed, with its
/// offset in the request. Returns the bytes to send.
pub fn gather(
    q: &mut Queue<TagBuf>,
    buf: &mut Vec<u8>,
    placed: &mut Vec<Placed>,
    in_request: &dyn Fn(u16) -> Option<usize>,
) -> usize {
    buf.clear();
    placed.clear();
    let min = |user_data: u64| {
        if in_request(tag_of(user_data)).is_some() {
            // Nothing of it is in the tag's buffer to copy.
            1
        } else {
            TX_IN_PLACE_BYTES
        }
    };
    q.poll_transmit_placed(buf, TX_LIMIT, min, |head, data, user_data| {
        let tag = tag_of(user_data);
        // A part's buffer is a window of the tag's, at the same offset as
        // in the request.
        let in_request = in_request(tag).map(|base| (data.as_ptr() as usize - base) as u32);
        placed.push(Placed {
            head: head.start,
            at: head.end,
            ptr: data.as_ptr(),
            len: data.len(),
            tag,
            in_request,
            head_copy: None,
        });
    })
}

/// Most bytes of a header copy ([`HeadCopies`]): an H2CData PDU's header
/// is 24 bytes, 28 with a header digest. A header padded beyond this (a
/// target's CPDA) goes from the send buffer, as without copies.
pub const HEAD_COPY_BYTES: usize = 32;

/// Header copies per tag between two of its requests: a 128 KiB write
/// the target asks for in one R2T takes one (two when mirrored), a 1 MiB
/// write at a MAXH2CDATA of 128 KiB eight. A header beyond them (a target
/// that asks in small R2Ts, a resend after a reconnect) goes from the
/// send buffer.
pub const HEAD_COPIES_PER_TAG: usize = 8;

/// A spliced piece of write data of at least this many bytes takes its
/// PDU header along from a [`HeadCopies`] slot: the default of the
/// volume's run-time `head_copy_min` ([`crate::volume::Stats::head_copy_min`],
/// `max` for never). Every piece that is spliced at all
/// ([`SPLICE_MIN_BYTES`]), since a header between two splices costs a
/// `sendmsg` of its own: 3.96 system calls per 128 KiB write QD 32 on the
/// queue thread without the copies against 2.05 with them
/// (docs/benchmarks.md, 2026-12-01, later).
pub const HEAD_COPY_MIN_BYTES: usize = SPLICE_MIN_BYTES;

/// Copies of the PDU headers in front of write data that is spliced, in
/// memory that stays put until the tag's next request, so that a spliced
/// send takes each header by reference together with its data: one
/// `vmsplice` and one `splice(2)` for all the headers and data of a send,
/// where a header from the send buffer took a `sendmsg` of its own
/// between two splices (`SendPlan::build` merges what follows a copy into
/// one `Seg::Splice`).
///
/// Why copies: a splice hands the socket references to the pages, which
/// TCP reads when it transmits, possibly after the send completed; the
/// send buffer is rewritten by the next gather. A tag's copies are
/// rewritten only once the tag has a new request ([`HeadCopies::reset`]
/// from `Engine::submit`), that is once its last one completed, which
/// the target answered after reading its data and so its headers: the
/// same guarantee that lets the data itself be spliced from the tag's
/// buffer (see [`tx_task`]).
#[derive(Debug)]
pub struct HeadCopies {
    /// `HEAD_COPIES_PER_TAG` slots of [`HEAD_COPY_BYTES`] per tag; boxed
    /// once, so the addresses handed out never move.
    mem: Box<[u8]>,
    /// Per tag: slots used since its current request began.
    used: Vec<u8>,
}

impl HeadCopies {
    /// Room for `depth` tags.
    pub fn new(depth: u16) -> Self {
        let tags = usize::from(depth);
        HeadCopies {
            mem: vec![0; tags * HEAD_COPIES_PER_TAG * HEAD_COPY_BYTES].into_boxed_slice(),
            used: vec![0; tags],
        }
    }

    /// Tag `tag` begins a new request: its last one completed, so nothing
    /// reads its copies any more.
    pub fn reset(&mut self, tag: u16) {
        if let Some(u) = self.used.get_mut(usize::from(tag)) {
            *u = 0;
        }
    }

    /// Give each piece of `placed` that will be spliced (in our memory, at
    /// least `splice_min` bytes) a copy of its header from `buf`, while
    /// its tag has a slot left and the header fits one.
    pub fn copy(&mut self, buf: &[u8], placed: &mut [Placed], splice_min: usize) {
        for d in placed.iter_mut() {
            let t = usize::from(d.tag);
            let head = d.head..d.at;
            if d.in_request.is_some()
                || d.len < splice_min
                || head.is_empty()
                || head.len() > HEAD_COPY_BYTES
                || head.end > buf.len()
                || t >= self.used.len()
                || usize::from(self.used[t]) >= HEAD_COPIES_PER_TAG
            {
                continue;
            }
            let at = (t * HEAD_COPIES_PER_TAG + usize::from(self.used[t])) * HEAD_COPY_BYTES;
            let slot = &mut self.mem[at..at + head.len()];
            slot.copy_from_slice(&buf[head]);
            d.head_copy = Some(slot.as_ptr() as usize);
            self.used[t] += 1;
        }
    }
}

/// The iovecs that send `buf` with `placed` spliced in (in order), into
/// `iov` (cleared first). The pointers are `buf`'s and `placed`'s: valid
/// while `buf` is neither changed nor dropped and the tags stay pinned.
/// Every piece is taken from our memory (`ptr`), `in_request` or not:
/// for a driver without zero copy ([`SendPlan`] is the engine's).
pub fn iovecs(buf: &[u8], placed: &[Placed], iov: &mut Vec<libc::iovec>) {
    iov.clear();
    splice(buf, placed, false, |run| match run {
        Run::Mem(v) => iov.push(v),
        Run::Piece { v, head } => iov.extend(head.into_iter().chain([v])),
        Run::Fixed { .. } => {}
    });
}

/// One run of a send, as [`splice`] walks it.
enum Run {
    /// Bytes of the send buffer (headers and small data).
    Mem(libc::iovec),
    /// A piece of write data in our memory (its tag's buffer), with the
    /// copy of its header that stands in for the header's bytes in the
    /// send buffer, if it has one ([`HeadCopies`]).
    Piece {
        /// The data.
        v: libc::iovec,
        /// The header copy, sent right before it.
        head: Option<libc::iovec>,
    },
    /// A piece that is only in its request's pages: `len` bytes at
    /// `offset` of tag `tag`'s request.
    Fixed { tag: u16, offset: u32, len: u32 },
}

/// Walk `buf` with `placed` spliced in, in wire order, handing each run to
/// `run`; a piece only in its request's pages is a [`Run::Fixed`] when
/// `use_fixed` (else its place in the tag buffer is a [`Run::Mem`] too).
fn splice(buf: &[u8], placed: &[Placed], use_fixed: bool, mut run: impl FnMut(Run)) {
    let mut from = 0;
    for d in placed {
        let fixed = d.in_request.filter(|_| use_fixed);
        // A header copy stands in for the header's bytes of the buffer.
        let head = d
            .head_copy
            .filter(|_| fixed.is_none() && d.head >= from && d.head < d.at);
        let mem_end = if head.is_some() { d.head } else { d.at };
        if mem_end > from {
            run(Run::Mem(libc::iovec {
                iov_base: buf[from..].as_ptr() as *mut libc::c_void,
                iov_len: mem_end - from,
            }));
        }
        match fixed {
            Some(offset) => run(Run::Fixed {
                tag: d.tag,
                offset,
                len: d.len as u32,
            }),
            None => run(Run::Piece {
                v: libc::iovec {
                    iov_base: d.ptr as *mut libc::c_void,
                    iov_len: d.len,
                },
                head: head.map(|h| libc::iovec {
                    iov_base: h as *mut libc::c_void,
                    iov_len: d.at - d.head,
                }),
            }),
        }
        from = d.at;
    }
    if buf.len() > from {
        run(Run::Mem(libc::iovec {
            iov_base: buf[from..].as_ptr() as *mut libc::c_void,
            iov_len: buf.len() - from,
        }));
    }
}

/// One SQE of a send: see [`SendPlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seg {
    /// A `SendMsg` of `SendPlan::iov[first..first + count]`.
    Msg {
        /// Its first iovec.
        first: usize,
        /// How many.
        count: usize,
    },
    /// A `WriteFixed` of `len` bytes at `offset` of tag `tag`'s request
    /// (fixed buffer `tag`).
    Fixed {
        /// The tag.
        tag: u16,
        /// Offset in the request's data.
        offset: u32,
        /// Length.
        len: u32,
    },
    /// Write data in our memory (pieces in their tags' buffers), with
    /// the copies of their headers in front of them ([`HeadCopies`]),
    /// `SendPlan::iov[first..first + count]`, sent by reference: put in
    /// the send's pipe with `vmsplice` and moved from there to the socket
    /// with a `Splice`, so the socket holds our pages instead of copying
    /// them into pages it allocates (and the kernel zeroes) for the
    /// purpose. Pieces with nothing between them but a header that has a
    /// copy are one segment: one `vmsplice` and one `Splice` for them all.
    Splice {
        /// Its first iovec (what is still to send starts there).
        first: usize,
        /// How many.
        count: usize,
        /// Bytes still to send.
        len: u32,
        /// How many of them are in the pipe already.
        queued: u32,
    },
}

/// One gathered send as io_uring operations, in wire order: runs of bytes
/// of the send buffer as `SendMsg`s, write data that is only in its
/// request's pages (zero copy, [`Placed::in_request`]) as `WriteFixed`s
/// from the registered pages, and write data in our memory as `Splice`s
/// through a pipe when the piece is at least the plan's `splice_min`
/// (else as iovecs of the `SendMsg`s). [`tx_task`] submits the pending
/// segments as one linked chain; one that comes back short (a
/// `WriteFixed` or `Splice` on a socket returns what the socket took;
/// the link breaks there and the rest is cancelled) is advanced by what
/// went, and the chain is submitted again from it, so the bytes go out in
/// order whatever each operation took. Without such pieces the plan is
/// one `SendMsg`, as before.
///
/// The pipe: before a chain is submitted, [`SendPlan::fill_pipe`] puts
/// the pages of its `Splice` segments in the pipe (in wire order, so the
/// pipe always holds exactly the not yet sent bytes of the pending
/// `Splice`s, front first); a segment the pipe had no room for ends the
/// chain, and its `Splice` moves what is in the pipe.
#[derive(Debug, Default)]
pub struct SendPlan {
    /// The iovecs of the `Msg` and `Splice` segments.
    pub iov: Vec<libc::iovec>,
    /// The segments, in wire order.
    pub segs: Vec<Seg>,
    /// The first segment not yet sent in full.
    pub next: usize,
    /// The iovecs a `vmsplice` is asked for (`fill_pipe`).
    scratch: Vec<libc::iovec>,
}

/// Append `v` to the `Msg` segment at the end of `segs`, or to a new one.
fn push_msg(iov: &mut Vec<libc::iovec>, segs: &mut Vec<Seg>, v: libc::iovec) {
    match segs.last_mut() {
        Some(Seg::Msg { count, .. }) => *count += 1,
        _ => segs.push(Seg::Msg {
            first: iov.len(),
            count: 1,
        }),
    }
    iov.push(v);
}

impl SendPlan {
    /// The plan that sends `buf` with `placed` spliced in; pieces in our
    /// memory of at least `splice_min` bytes become `Splice`s (never with
    /// `usize::MAX`).
    pub fn build(&mut self, buf: &[u8], placed: &[Placed], splice_min: usize) {
        self.iov.clear();
        self.segs.clear();
        self.next = 0;
        let (iov, segs) = (&mut self.iov, &mut self.segs);
        splice(buf, placed, true, |run| match run {
            Run::Piece { v, head } if v.iov_len >= splice_min => {
                let more = head.into_iter().chain([v]);
                let bytes = (head.map_or(0, |h| h.iov_len) + v.iov_len) as u32;
                let k = 1 + usize::from(head.is_some());
                match segs.last_mut() {
                    // Nothing between the last splice and this one (its
                    // header is a copy): one splice takes both. Its
                    // iovecs are the last ones, so this one's follow.
                    Some(Seg::Splice { count, len, .. }) => {
                        *count += k;
                        *len += bytes;
                    }
                    _ => segs.push(Seg::Splice {
                        first: iov.len(),
                        count: k,
                        len: bytes,
                        queued: 0,
                    }),
                }
                iov.extend(more);
            }
            Run::Piece { v, head } => {
                for v in head.into_iter().chain([v]) {
                    push_msg(iov, segs, v);
                }
            }
            Run::Mem(v) => push_msg(iov, segs, v),
            Run::Fixed { tag, offset, len } => segs.push(Seg::Fixed { tag, offset, len }),
        });
    }

    /// The segments still to send.
    pub fn pending(&self) -> &[Seg] {
        &self.segs[self.next..]
    }

    /// Whether everything went.
    pub fn is_done(&self) -> bool {
        self.next >= self.segs.len()
    }

    /// The bytes segment `seg` still has to send.
    pub fn seg_len(&self, seg: &Seg) -> usize {
        match *seg {
            Seg::Msg { first, count } => self.iov[first..first + count]
                .iter()
                .map(|v| v.iov_len)
                .sum(),
            Seg::Fixed { len, .. } | Seg::Splice { len, .. } => len as usize,
        }
    }

    /// The bytes segment `seg`'s SQE asks for: a `Splice` moves what is in
    /// the pipe of it.
    pub fn sqe_len(&self, seg: &Seg) -> usize {
        match *seg {
            Seg::Splice { queued, .. } => queued as usize,
            _ => self.seg_len(seg),
        }
    }

    /// Before submitting the first `n` pending segments: put what their
    /// `Splice`s still lack in the pipe, in order, with `vmsplice(iovecs)`
    /// (returns the bytes it took, 0 when the pipe is full, or an
    /// error). Returns how many segments to submit: the chain ends at the
    /// first `Splice` not wholly in the pipe, and does not reach one with
    /// nothing in it. An error of `vmsplice` for the first segment is
    /// returned (nothing could be sent); a later one ends the chain there.
    pub fn fill_pipe(
        &mut self,
        n: usize,
        mut vmsplice: impl FnMut(&[libc::iovec]) -> Result<usize, i32>,
    ) -> Result<usize, i32> {
        for i in 0..n {
            let Seg::Splice {
                first,
                count,
                len,
                queued,
            } = &mut self.segs[self.next + i]
            else {
                continue;
            };
            if *queued < *len {
                let want = (*len - *queued) as usize;
                // The iovecs of what the pipe lacks: the segment's, less
                // what it holds already.
                self.scratch.clear();
                self.scratch
                    .extend_from_slice(&self.iov[*first..*first + *count]);
                let mut skip = 0;
                advance_iovecs(&mut self.scratch, &mut skip, *queued as usize);
                match vmsplice(&self.scratch[skip..]) {
                    Ok(took) => *queued += took.min(want) as u32,
                    Err(e) if i == 0 && *queued == 0 => return Err(e),
                    Err(_) => {}
                }
            }
            if *queued == 0 {
                // Nothing of it in the pipe: it waits for the next chain.
                // (At the front the pipe holds nothing pending, so it
                // had room; refusing it then is an error, and the path
                // reconnects with an empty pipe.)
                return if i == 0 { Err(-libc::ENOBUFS) } else { Ok(i) };
            }
            if *queued < *len {
                return Ok(i + 1);
            }
        }
        Ok(n)
    }

    /// The first `res.len()` pending segments were submitted as one chain
    /// and completed with `res`: drop what went. A short or retryable
    /// result leaves the rest pending (to be submitted again); an error is
    /// the socket's, returned.
    pub fn complete(&mut self, res: &[i32]) -> Result<(), i32> {
        for (j, &r) in res.iter().enumerate() {
            let seg = self.segs[self.next];
            let want = self.sqe_len(&seg);
            if r >= 0 && r as usize == want && want == self.seg_len(&seg) {
                self.next += 1;
                continue;
            }
            if r > 0 && (r as usize) <= want {
                // Short, or a splice of the part of its piece that was in
                // the pipe (the chain ended with it).
                self.advance(r as usize);
                return Ok(());
            }
            // A retryable result; ECANCELED only after an earlier one in
            // the chain came back short, which returned above.
            if r == -libc::EAGAIN || r == -libc::EINTR || (r == -libc::ECANCELED && j > 0) {
                return Ok(());
            }
            return Err(r);
        }
        Ok(())
    }

    /// Drop `n` bytes (fewer than it holds) from the first pending segment.
    fn advance(&mut self, n: usize) {
        match &mut self.segs[self.next] {
            Seg::Msg { first, count } => {
                let mut done = 0;
                advance_iovecs(&mut self.iov[*first..*first + *count], &mut done, n);
                *first += done;
                *count -= done;
            }
            Seg::Fixed { offset, len, .. } => {
                *offset += n as u32;
                *len -= n as u32;
            }
            Seg::Splice {
                first,
                count,
                len,
                queued,
            } => {
                let mut done = 0;
                advance_iovecs(&mut self.iov[*first..*first + *count], &mut done, n);
                *first += done;
                *count -= done;
                *len -= n as u32;
                *queued -= n as u32;
            }
        }
    }
}

/// After a send of `n` bytes from `iov[*first..]`: drop what was sent, so
/// `iov[*first..]` is what is left (the first entry possibly shortened).
pub fn advance_iovecs(iov: &mut [libc::iovec], first: &mut usize, mut n: usize) {
    while n > 0 && *first < iov.len() {
        let v = &mut iov[*first];
        if n < v.iov_len {
            // SAFETY: `n` is within the entry, so the pointer stays in the
            // buffer it points into.
            v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) } as *mut libc::c_void;
            v.iov_len -= n;
            return;
        }
        n -= v.iov_len;
        *first += 1;
    }
}

/// The pipe of a path's spliced sends ([`SendPlan`], [`tx_task`]).
#[derive(Debug)]
pub struct SplicePipe {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl SplicePipe {
    /// A pipe of [`SPLICE_PIPE_BYTES`] (or the system's default size when
    /// that is refused: sends then take more chains); errors are negative
    /// errnos.
    pub fn new() -> Result<Self, i32> {
        use std::os::fd::FromRawFd;
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return Err(-std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        // SAFETY: both were just opened and are owned by nothing else.
        let (read, write) = unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        // SAFETY: F_SETPIPE_SZ takes an int; a refusal leaves the pipe as
        // it is.
        unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, SPLICE_PIPE_BYTES as libc::c_int) };
        Ok(SplicePipe { read, write })
    }

    /// The end a `Splice` reads from.
    pub fn read_fd(&self) -> i32 {
        self.read.as_raw_fd()
    }

    /// Put (references to) the pages of the bytes `iov` names in the pipe,
    /// in order, without waiting: the bytes it took (0 when it is full),
    /// or a negative errno.
    pub fn vmsplice(&self, iov: &[libc::iovec]) -> Result<usize, i32> {
        loop {
            // SAFETY: the caller's bytes are pinned tags' buffers and their
            // header copies (`Engine::tx_gather`); vmsplice only takes
            // references to their pages, and the socket reads them after
            // the send for as long as `tx_task` explains.
            let r = unsafe {
                libc::vmsplice(
                    self.write.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len(),
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                e => return Err(-e.unwrap_or(libc::EIO)),
            }
        }
    }
}

/// TCP connect, ICReq, Connect, blocking and bounded by the config's
/// connect timeout; returns the live queue and its socket.
pub fn connect_blocking(
    addr: std::net::SocketAddr,
    cfg: QueueConfig,
) -> Result<(TcpStream, Queue<TagBuf>), nvmf_initiator::Error> {
    let timeout = cfg.connect_timeout;
    let sock = TcpStream::connect_timeout(&addr, timeout).map_err(nvmf_initiator::Error::io)?;
    sock.set_nodelay(true).map_err(nvmf_initiator::Error::io)?;
    let deadline = Instant::now() + timeout;
    let mut q: Queue<TagBuf> = Queue::new(cfg, Instant::now());
    let mut tx = Vec::new();
    let mut rx = vec![0u8; 64 * 1024];
    let mut s = &sock;
    loop {
        tx.clear();
        while q.poll_transmit(&mut tx, TX_LIMIT) > 0 {}
        if !tx.is_empty() {
            s.write_all(&tx).map_err(nvmf_initiator::Error::io)?;
        }
        while let Some(ev) = q.poll_event() {
            match ev {
                Event::Connected { .. } => return Ok((sock, q)),
                Event::Failed(e) => return Err(e),
                Event::Completed(_) => {}
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(nvmf_initiator::Error::ConnectTimeout(timeout));
        }
        sock.set_read_timeout(Some(left))
            .map_err(nvmf_initiator::Error::io)?;
        match s.read(&mut rx) {
            Ok(0) => q.handle_closed(),
            Ok(n) => q.handle_bytes(Instant::now(), &rx[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                q.handle_timeout(Instant::now())
            }
            Err(e) => q.handle_io_error(e),
        }
    }
}

/// Wait for tag `tag`'s outcome.
pub struct TagWait {
    /// The engine.
    pub engine: Rc<RefCell<Engine>>,
    /// The tag.
    pub tag: u16,
}

impl Future for TagWait {
    type Output = bool;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        self.engine.borrow_mut().poll_result(self.tag, cx)
    }
}

enum Wait {
    Rx,
    Tx,
}

/// Wait until the pacing timer is armed; yields the delay.
struct PaceWait {
    engine: Rc<RefCell<Engine>>,
}

impl Future for PaceWait {
    type Output = Duration;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Duration> {
        let mut e = self.engine.borrow_mut();
        match e.pace_delay() {
            Some(d) => Poll::Ready(d),
            None => {
                e.pace_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The pacing task (runs for the queue thread's lifetime): while the rate
/// limiter holds a request back, one Timeout SQE on the queue's ring at its
/// eligible instant (at most [`TICK`] away, so a limit raised at run time
/// takes effect within a tick); nothing runs otherwise.
pub async fn pace_task(engine: Rc<RefCell<Engine>>, op: UringOp) {
    loop {
        let d = PaceWait {
            engine: Rc::clone(&engine),
        }
        .await;
        if !d.is_zero() {
            let ts = io_uring::types::Timespec::new()
                .sec(d.as_secs())
                .nsec(d.subsec_nanos());
            op(io_uring::opcode::Timeout::new(&ts).build()).await;
        }
        engine.borrow_mut().on_pace();
    }
}

struct WaitFor {
    engine: Rc<RefCell<Engine>>,
    path: usize,
    what: Wait,
}

impl Future for WaitFor {
    type Output = (u64, i32);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(u64, i32)> {
        let mut e = self.engine.borrow_mut();
        let p = self.path;
        let ready = match self.what {
            Wait::Rx => e.current(p),
            Wait::Tx => e.current(p).filter(|_| {
                e.paths[p]
                    .conn
                    .as_ref()
                    .is_some_and(|c| c.queue.has_transmit())
            }),
        };
        match ready {
            Some(x) => Poll::Ready(x),
            None => {
                let w = Some(cx.waker().clone());
                match self.what {
                    Wait::Rx => e.paths[p].rx_waker = w,
                    Wait::Tx => e.paths[p].tx_waker = w,
                }
                Poll::Pending
            }
        }
    }
}

/// The receive task of path `path` (runs for the queue thread's lifetime).
///
/// Each `Recv` goes into the thread's receive buffer, or, while the data of
/// a C2HData PDU is due, straight into that data's place in the tag's
/// buffer ([`Engine::rx_place`]). A direct receive of at least
/// [`LOWAT_MIN_BYTES`] is the last of a linked chain that first raises
/// the socket's `SO_RCVLOWAT` to its length and polls for that much, so
/// that it completes once with all of it; the next buffered `Recv` is
/// chained behind a setsockopt that lowers the mark again (it must
/// return whatever arrives). A failed connection's abort and shutdown
/// wake the poll whatever the mark (a hang-up is always reported), so a
/// reset never leaves it waiting.
///
/// A direct `Recv` may still be in the ring when the connection is reset
/// (command timeout, epoch change, the other socket direction failing):
/// the queue then hands the request back (`take_unfinished`) and the
/// engine may resubmit it, move it to another replica, or fail it, while
/// the kernel can still write into the buffer (up to the rest of that
/// PDU's data, from the old socket; the shutdown in `on_failure` makes
/// the `Recv` return soon). That is safe because:
///
/// - the tag stays pinned (`Path::rx_direct_tag`) until this task has seen
///   the `Recv`'s completion, and `poll_result` does not hand a pinned tag
///   back to its task, so the buffer is never committed to the driver (nor
///   reused for the tag's next request) while the kernel may write it, and
///   the tag task, hence `queue_main`, cannot finish and free the buffers
///   before that either;
/// - the bytes it can write are that read's own data at its own offsets
///   (the queue checked the PDU's header against the command), so a copy of
///   the same read on a new connection or another in-sync replica at most
///   has its bytes overwritten with the same blocks' data as read by the
///   old one;
/// - this task issues no other `Recv` for the path before that completion,
///   and a stale completion is dropped by the generation check.
///
/// When the queue thread ends (libublk's event loop failing, or the queue
/// going down) with such a `Recv` possibly still in the ring,
/// `queue_main` keeps (leaks) the tag buffers, as this task leaks its
/// receive buffer below, so the kernel never writes into freed memory.
pub async fn rx_task(engine: Rc<RefCell<Engine>>, path: usize, op: UringOp, chain: ChainOp) {
    // Leaked on purpose: a Recv may still be in the ring when the thread's
    // executor is dropped at shutdown, and must never write into freed
    // memory. One buffer per queue thread.
    let buf: &'static mut [u8] = Box::leak(vec![0u8; RX_BYTES].into_boxed_slice());
    // SO_RCVLOWAT's value for the setsockopt SQE, which the kernel reads
    // when the SQE runs: leaked for the same reason.
    let lowat: &'static mut libc::c_int = Box::leak(Box::new(1));
    // The connection whose socket has a low-water mark above one byte
    // (raised for a direct receive, lowered before the next buffered one).
    let mut raised: Option<u64> = None;
    // Cleared if the kernel cannot set socket options from the ring
    // (before 6.7): direct receives then take what has arrived, as a
    // plain Recv does.
    let mut can_wait = true;
    // The connection whose receive buffer has been grown to
    // `RX_WINDOW_BYTES` (at its first direct receive).
    let mut grown: Option<u64> = None;
    loop {
        let (generation, fd) = WaitFor {
            engine: Rc::clone(&engine),
            path,
            what: Wait::Rx,
        }
        .await;
        let (direct, short, wait_min) = {
            let mut e = engine.borrow_mut();
            let wait_min = e.stats.read_wait_min();
            (e.rx_place(path, generation), e.rx_len(path), wait_min)
        };
        if direct.is_some() && grown != Some(generation) {
            grown = Some(generation);
            match grow_receive_buffer(fd, RX_WINDOW_BYTES) {
                Ok(n) => log::debug!("path {path}: receive buffer {n} bytes"),
                Err(e) => log::debug!("path {path}: receive buffer left to TCP: {e}"),
            }
        }
        let sock = io_uring::types::Fd(fd);
        let read = match direct {
            None => {
                let len = short.min(buf.len()) as u32;
                io_uring::opcode::Recv::new(sock, buf.as_mut_ptr(), len).build()
            }
            // MSG_WAITALL: the ring retries a short receive itself, so the
            // PDU's data takes one completion even where the low-water
            // mark below cannot be set.
            Some(DirectRecv::Mem { ptr, len }) => {
                io_uring::opcode::Recv::new(sock, ptr, len as u32)
                    .flags(libc::MSG_WAITALL)
                    .build()
            }
            // With a fixed buffer the address is the offset into it. A
            // READ on a socket returns what has arrived, as Recv does;
            // the socket has no file position (offset 0).
            Some(DirectRecv::Fixed { tag, offset, len }) => {
                io_uring::opcode::ReadFixed::new(sock, offset as usize as *mut u8, len as u32, tag)
                    .build()
            }
        };
        let set_lowat = |v: &mut libc::c_int, to: usize| {
            *v = to.min(libc::c_int::MAX as usize) as libc::c_int;
            io_uring::opcode::SetSockOpt::new(
                sock,
                libc::SOL_SOCKET as u32,
                libc::SO_RCVLOWAT as u32,
                (v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
            .build()
            // A failed setsockopt must not cancel the receive behind it.
            .flags(io_uring::squeue::Flags::IO_HARDLINK)
        };
        // Whether this receive's socket had its mark raised to the
        // receive's length (counted as a waited receive if it brings data).
        let mut waited = false;
        let res = match direct {
            // The rest of a large PDU's data in one completion: the
            // socket's low-water mark is raised to it and a poll waits for
            // that much (TCP wakes it once, not per arrival), then the
            // read takes it all. Without them the read returns what has
            // arrived, and a 1 MiB read's data took about ten
            // completions, each a trip through the ring and this thread.
            Some(d) if can_wait && d.len() >= wait_min => {
                let sqes = [
                    set_lowat(lowat, d.len()),
                    io_uring::opcode::PollAdd::new(sock, libc::POLLIN as u32)
                        .build()
                        .flags(io_uring::squeue::Flags::IO_HARDLINK),
                    read,
                ];
                let r = chain(&sqes).await;
                match r.first() {
                    Some(&e) if e == -libc::EOPNOTSUPP || e == -libc::EINVAL => {
                        log::info!(
                            "path {path}: the kernel cannot set a socket's low-water mark \
                             from io_uring ({}); large reads take more receives",
                            std::io::Error::from_raw_os_error(-e)
                        );
                        can_wait = false;
                    }
                    Some(&0) => {
                        raised = Some(generation);
                        waited = true;
                    }
                    _ => {}
                }
                // Fewer results: the ring had room for only part of the
                // chain, and the read did not go (as if interrupted).
                r.get(2).copied().unwrap_or(-libc::EINTR)
            }
            // A buffered receive must not wait for more than arrives: the
            // next PDU may be a 16-byte response.
            None if raised == Some(generation) => {
                let r = chain(&[set_lowat(lowat, 1), read]).await;
                if r.first() == Some(&0) {
                    raised = None;
                }
                r.get(1).copied().unwrap_or(-libc::EINTR)
            }
            _ => op(read).await,
        };
        let mut e = engine.borrow_mut();
        if res > 0 {
            e.stats.receives.fetch_add(1, Ordering::Relaxed);
            if direct.is_some() {
                e.stats.direct_receives.fetch_add(1, Ordering::Relaxed);
            }
            if waited {
                e.stats.waited_receives.fetch_add(1, Ordering::Relaxed);
            }
        }
        if direct.is_some() {
            e.on_direct(path, generation, res);
        } else if res > 0 {
            e.on_bytes(path, generation, &buf[..res as usize]);
        } else if res != -libc::EINTR && res != -libc::EAGAIN {
            e.on_socket_error(path, generation, res);
        }
    }
}

/// The transmit task of path `path` (runs for the queue thread's
/// lifetime).
///
/// Each send carries the PDU headers (and small data) gathered in the
/// thread's send buffer and, between them, write data of at least
/// [`TX_IN_PLACE_BYTES`] straight from the tags' buffers ([`gather`]):
/// the kernel copies it once, we never do. With zero copy, a large
/// write's data is sent from the request's registered pages instead
/// (`WriteFixed`, [`SendPlan`]), so it is never in our memory at all; the
/// send is then a chain of linked SQEs (`SendMsg`, `WriteFixed`,
/// `SendMsg`, ...), submitted with `chain` so that they reach the ring
/// contiguously and run in order. The kernel reads those buffers and pages
/// until the send completes, which may be after the request itself has
/// completed (a target may answer before all data left) or after the
/// connection was reset and the request handed back, resubmitted elsewhere
/// or failed. That is safe because:
///
/// - every tag with data in the send is pinned (`Engine::tx_gather`) until
///   this task has seen the last SQE of the send complete
///   (`Engine::on_sent`), and `poll_result` does not hand a pinned tag
///   back to its task: it is not committed to the driver, so neither the
///   driver (the next request's data, or unregistering the pages) nor a
///   read (its data) writes it meanwhile, and the tag task, hence
///   `queue_main`, cannot finish and free the buffers before that either;
/// - a write's data is only ever read by the engine (every part of a
///   write holds a shared view), so several sends (one per replica) may
///   read one tag's buffer or pages at once;
/// - a chain's SQEs look the socket's fd up only when each starts; a
///   failed connection's socket is shut down (every later SQE on it fails
///   and cancels the rest of its chain) and kept open until this task's
///   send is done (`Path::retired`), so its fd number cannot be the next
///   connection's while a later SQE of the chain may still start;
/// - the send buffer, the iovec array and the message headers are leaked,
///   as the receive buffer is, and not touched until the send has
///   completed; when the queue thread ends with a send in the ring,
///   `queue_main` keeps (leaks) the tag buffers as it does for a direct
///   `Recv`.
///
/// Every `SendMsg` asks for `MSG_WAITALL` (the kernel sends all of it or
/// fails), so in a chain only a `WriteFixed` or a `Splice` can come back
/// short; the plan then goes on from where it stopped. What the send
/// carries is what `poll_transmit` would have copied, byte for byte
/// (`Queue::poll_transmit_placed`): the wire does not change.
///
/// A send with `Splice`s goes out from this thread (`send_inline`:
/// `sendmsg` and `splice(2)` on the non-blocking socket, a ring poll when
/// it is full), since the ring runs every splice on a worker thread; the
/// ring's chain serves the others, and a socket that could not be made
/// non-blocking.
///
/// A `Splice` ([`SendPlan`], pieces of at least [`SPLICE_MIN_BYTES`] in
/// our memory) hands the socket our pages by reference, as the kernel
/// host hands it a bio's: the socket reads them until the peer has taken
/// the bytes, which can be after the send completed and the tag was
/// unpinned. A tag's buffer is only written again once its request has
/// completed, i.e. once the target answered, which it does after it read
/// the data (a retransmission of bytes it acknowledged is never made,
/// and one it did not would be discarded). The one other reader is a
/// failed connection's socket, whose unsent bytes TCP would go on
/// transmitting after the request was handed to a new connection and the
/// tag reused; `Engine::on_failure` therefore aborts the connection
/// (`abort`: its queues are purged, nothing more leaves) instead of only
/// shutting it down. The pipe holds page references too; it is dropped
/// (closed, releasing them) whenever a send ends with an error, so the
/// next connection starts with an empty one.
pub async fn tx_task(engine: Rc<RefCell<Engine>>, path: usize, chain: ChainOp) {
    // Leaked for the same reason as the receive buffer.
    let buf: &'static mut Vec<u8> = Box::leak(Box::new(Vec::with_capacity(2 * TX_LIMIT)));
    let placed: &'static mut Vec<Placed> =
        Box::leak(Box::new(Vec::with_capacity(MAX_TX_IOVECS / 2)));
    let plan: &'static mut SendPlan = Box::leak(Box::new(SendPlan {
        iov: Vec::with_capacity(MAX_TX_IOVECS),
        segs: Vec::with_capacity(MAX_TX_IOVECS),
        next: 0,
        scratch: Vec::with_capacity(MAX_TX_IOVECS),
    }));
    let msgs: &'static mut Vec<libc::msghdr> = Box::leak(Box::new(Vec::with_capacity(MAX_CHAIN)));
    let mut sqes = Vec::with_capacity(MAX_CHAIN);
    let splice_min = engine.borrow().splice_min;
    let mut pipe: Option<SplicePipe> = None;
    // Whether connection `nonblocking_gen`'s socket is non-blocking, so
    // its spliced sends can go out from this thread (`send_inline`).
    let (mut nonblocking_gen, mut inline) = (None, false);
    loop {
        let (generation, fd) = WaitFor {
            engine: Rc::clone(&engine),
            path,
            what: Wait::Tx,
        }
        .await;
        engine.borrow_mut().tx_gather(path, buf, placed);
        plan.build(buf, placed, splice_min);
        let splices = plan.segs.iter().any(|s| matches!(s, Seg::Splice { .. }));
        if splices && nonblocking_gen != Some(generation) {
            // Once per connection, not per send: an fcntl is a system call.
            nonblocking_gen = Some(generation);
            inline = nonblocking(fd);
        }
        if splices && inline {
            if let Some(p) = ensure_pipe(&mut pipe) {
                let mut spliced = 0u64;
                let res = send_inline(plan, p, fd, chain, &mut spliced).await;
                if spliced > 0 {
                    engine
                        .borrow()
                        .stats
                        .spliced
                        .fetch_add(spliced, Ordering::Relaxed);
                }
                if let Err(e) = res {
                    // What the pipe still holds is the failed send's.
                    pipe = None;
                    engine.borrow_mut().on_socket_error(path, generation, e);
                }
                engine.borrow_mut().on_sent(path, placed);
                continue;
            }
        }
        while !plan.is_done() {
            let mut n = plan.pending().len().min(MAX_CHAIN);
            if plan.pending()[..n]
                .iter()
                .any(|s| matches!(s, Seg::Splice { .. }))
            {
                let filled = match ensure_pipe(&mut pipe) {
                    Some(p) => plan.fill_pipe(n, |iov| p.vmsplice(iov)),
                    None => Err(-libc::EMFILE),
                };
                match filled {
                    Ok(k) => n = k,
                    Err(e) => {
                        pipe = None;
                        engine.borrow_mut().on_socket_error(path, generation, e);
                        break;
                    }
                }
            }
            let window = &plan.pending()[..n];
            // The message headers first: the SQEs point into `msgs`.
            msgs.clear();
            for seg in window {
                if let Seg::Msg { first, count } = *seg {
                    // SAFETY: an all-zero msghdr is valid (no name, no
                    // control data).
                    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                    m.msg_iov = plan.iov[first..].as_ptr() as *mut libc::iovec;
                    m.msg_iovlen = count as _;
                    msgs.push(m);
                }
            }
            sqes.clear();
            let mut m = msgs.iter();
            let pending = plan.pending().len();
            for (i, seg) in window.iter().enumerate() {
                sqes.push(match *seg {
                    Seg::Msg { .. } => {
                        let m = m.next().expect("one header per Msg segment");
                        // A header followed by its data (a `WriteFixed`,
                        // which takes no flags) waits for it: with
                        // TCP_NODELAY it would otherwise leave as a packet
                        // of its own, and the peer would wake for a header
                        // without its data (the kernel host sends its
                        // headers with MSG_MORE for the same reason). The
                        // plan's last segment never has it, so nothing
                        // stays corked: a broken chain is resubmitted from
                        // where it stopped.
                        let more = if i + 1 < pending { libc::MSG_MORE } else { 0 };
                        io_uring::opcode::SendMsg::new(io_uring::types::Fd(fd), m)
                            .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL | more) as u32)
                            .build()
                    }
                    Seg::Fixed { tag, offset, len } => write_fixed_sqe(fd, tag, offset, len),
                    // From the pipe (no offset) to the socket; more
                    // follows as with MSG_MORE above.
                    Seg::Splice { queued, .. } => {
                        let p = pipe.as_ref().expect("filled above");
                        let more = if i + 1 < pending {
                            libc::SPLICE_F_MORE
                        } else {
                            0
                        };
                        io_uring::opcode::Splice::new(
                            io_uring::types::Fd(p.read_fd()),
                            -1,
                            io_uring::types::Fd(fd),
                            -1,
                            queued,
                        )
                        .flags(more)
                        .build()
                    }
                });
            }
            let res = chain(&sqes).await;
            let spliced: i64 = window
                .iter()
                .zip(&res)
                .filter(|(s, &r)| matches!(s, Seg::Splice { .. }) && r > 0)
                .map(|(_, &r)| i64::from(r))
                .sum();
            if spliced > 0 {
                engine
                    .borrow()
                    .stats
                    .spliced
                    .fetch_add(spliced as u64, Ordering::Relaxed);
            }
            if let Err(e) = plan.complete(&res) {
                // What the pipe still holds is the failed send's.
                pipe = None;
                engine.borrow_mut().on_socket_error(path, generation, e);
                break;
            }
        }
        engine.borrow_mut().on_sent(path, placed);
    }
}

/// The path's splice pipe, opened on first use (`None`, logged, when the
/// system refuses one).
fn ensure_pipe(pipe: &mut Option<SplicePipe>) -> Option<&SplicePipe> {
    if pipe.is_none() {
        *pipe = SplicePipe::new()
            .map_err(|e| log::warn!("tx: no pipe for spliced sends: errno {}", -e))
            .ok();
    }
    pipe.as_ref()
}

/// The `WriteFixed` of a [`Seg::Fixed`]: `len` bytes at `offset` of fixed
/// buffer `tag` (a request's registered pages) to socket `fd`.
fn write_fixed_sqe(fd: i32, tag: u16, offset: u32, len: u32) -> io_uring::squeue::Entry {
    // With a fixed buffer the address is the offset into it; a socket has
    // no file position (offset 0).
    io_uring::opcode::WriteFixed::new(
        io_uring::types::Fd(fd),
        offset as usize as *const u8,
        len,
        tag,
    )
    .build()
}

/// Whether `fd` is non-blocking (`O_NONBLOCK`), as `connect` leaves a
/// path's socket unless that was refused.
fn nonblocking(fd: i32) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// The result of a system call as a CQE would carry it: what it returned,
/// or the negative errno.
fn sys_res(r: isize) -> i32 {
    if r >= 0 {
        r.min(i32::MAX as isize) as i32
    } else {
        -std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    }
}

/// Send `plan` from this thread: its `SendMsg` runs as `sendmsg` and its
/// `Splice`s as `splice(2)` from the pipe to the (non-blocking) socket;
/// a `WriteFixed` (pages only the ring can name) still goes through the
/// ring. When the socket is full, an io_uring poll waits for room.
///
/// Why not the ring's `Splice`: io_uring never issues a splice inline
/// (`io_splice` refuses a non-blocking issue), so each one wakes an
/// io-wq worker thread, a wake-up and two context switches per send
/// that cost what splicing saves (docs/benchmarks.md, "Which connection
/// loses ..."). A `splice(2)` from the queue thread does the same work in
/// one system call. `spliced` counts the bytes that went by reference.
async fn send_inline(
    plan: &mut SendPlan,
    pipe: &SplicePipe,
    fd: i32,
    chain: ChainOp,
    spliced: &mut u64,
) -> Result<(), i32> {
    while !plan.is_done() {
        let more_after = plan.pending().len() > 1;
        let r = match plan.pending()[0] {
            Seg::Msg { first, count } => {
                // SAFETY: an all-zero msghdr is valid (no name, no control
                // data); its iovecs point into the send buffer and the
                // tags' pinned buffers (see `tx_task`), alive for the call.
                let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                m.msg_iov = plan.iov[first..].as_ptr() as *mut libc::iovec;
                m.msg_iovlen = count as _;
                let more = if more_after { libc::MSG_MORE } else { 0 };
                // SAFETY: as above.
                sys_res(unsafe {
                    libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | more)
                })
            }
            Seg::Splice { .. } => {
                plan.fill_pipe(1, |iov| pipe.vmsplice(iov))?;
                let Seg::Splice { queued, len, .. } = plan.pending()[0] else {
                    unreachable!("the front segment is this splice");
                };
                // More follows this call if the piece is not all in the
                // pipe yet, as with MSG_MORE.
                let more = if more_after || queued < len {
                    libc::SPLICE_F_MORE
                } else {
                    0
                };
                // SAFETY: plain descriptors; the pipe holds references to
                // pinned pages (see `tx_task`).
                let r = sys_res(unsafe {
                    libc::splice(
                        pipe.read_fd(),
                        std::ptr::null_mut(),
                        fd,
                        std::ptr::null_mut(),
                        queued as usize,
                        libc::SPLICE_F_NONBLOCK | more,
                    )
                });
                if r > 0 {
                    *spliced += r as u64;
                }
                r
            }
            Seg::Fixed { tag, offset, len } => chain(&[write_fixed_sqe(fd, tag, offset, len)])
                .await
                .first()
                .copied()
                .unwrap_or(-libc::ECANCELED),
        };
        match r {
            r if r == -libc::EAGAIN => {
                let sqe =
                    io_uring::opcode::PollAdd::new(io_uring::types::Fd(fd), libc::POLLOUT as u32)
                        .build();
                let p = chain(&[sqe])
                    .await
                    .first()
                    .copied()
                    .unwrap_or(-libc::ECANCELED);
                if p < 0 && p != -libc::EINTR {
                    return Err(p);
                }
            }
            r if r == -libc::EINTR => {}
            // Nothing moved though something was due: the peer is gone.
            0 => return Err(-libc::EPIPE),
            r => plan.complete(&[r])?,
        }
    }
    Ok(())
}

/// The housekeeping task (runs for the queue thread's lifetime).
pub async fn tick_task(engine: Rc<RefCell<Engine>>, op: UringOp) {
    let ts = io_uring::types::Timespec::new()
        .sec(TICK.as_secs())
        .nsec(TICK.subsec_nanos());
    loop {
        let sqe = io_uring::opcode::Timeout::new(&ts).build();
        op(sqe).await;
        engine.borrow_mut().tick(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(iov: &[libc::iovec]) -> Vec<u8> {
        let mut out = Vec::new();
        for v in iov {
            // SAFETY: the tests' iovecs point into live vectors.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
            });
        }
        out
    }

    /// A piece of `data` placed at `at` of the send buffer, for tag `tag`.
    fn piece(at: usize, data: &[u8], tag: u16, in_request: Option<u32>) -> Placed {
        Placed {
            head: at,
            at,
            ptr: data.as_ptr(),
            len: data.len(),
            tag,
            in_request,
            head_copy: None,
        }
    }

    /// The bytes `iov` names, counted.
    fn total(iov: &[libc::iovec]) -> usize {
        iov.iter().map(|v| v.iov_len).sum()
    }

    #[test]
    fn iovecs_splice_the_placed_data_in_order() {
        let buf: Vec<u8> = (0..100).collect();
        let d1 = vec![200u8; 7];
        let d2 = vec![201u8; 5];
        let d3 = vec![202u8; 3];
        let placed = [
            piece(0, &d1, 0, None),
            piece(40, &d2, 1, None),
            piece(40, &d3, 2, None),
        ];
        let mut iov = Vec::new();
        iovecs(&buf, &placed, &mut iov);
        // No empty runs of the send buffer between or around them.
        assert_eq!(iov.len(), 5);
        let mut want = d1.clone();
        want.extend_from_slice(&buf[..40]);
        want.extend_from_slice(&d2);
        want.extend_from_slice(&d3);
        want.extend_from_slice(&buf[40..]);
        assert_eq!(bytes(&iov), want);
        iovecs(&buf[..40], &placed[1..2], &mut iov);
        assert_eq!(iov.len(), 2, "nothing after the last piece");
    }

    /// A send of header runs, pieces in our memory and pieces only in
    /// their requests' pages, run as the ring would: each SQE takes what
    /// `caps` allows (a short one breaks the chain, the rest is
    /// cancelled), and the plan goes on until all went. The bytes are the
    /// wire's, in order, at every cap.
    #[test]
    fn a_send_plan_sends_the_wire_in_order_whatever_each_sqe_takes() {
        let buf: Vec<u8> = (0..100).collect();
        let d1 = vec![200u8; 7];
        let d3 = vec![202u8; 3];
        // Tag 1's request pages; its tag buffer holds nothing of them.
        let pages: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
        let garbage = vec![0xeeu8; 2000];
        let placed = [
            piece(0, &d1, 0, None),
            piece(40, &garbage[1000..][..50], 1, Some(1000)),
            piece(40, &d3, 2, None),
            piece(100, &garbage[10..][..20], 1, Some(10)),
        ];
        let mut want = d1.clone();
        want.extend_from_slice(&buf[..40]);
        want.extend_from_slice(&pages[1000..1050]);
        want.extend_from_slice(&d3);
        want.extend_from_slice(&buf[40..]);
        want.extend_from_slice(&pages[10..30]);
        let mut plan = SendPlan::default();
        plan.build(&buf, &placed, usize::MAX);
        assert_eq!(
            plan.segs,
            vec![
                Seg::Msg { first: 0, count: 2 },
                Seg::Fixed {
                    tag: 1,
                    offset: 1000,
                    len: 50
                },
                Seg::Msg { first: 2, count: 2 },
                Seg::Fixed {
                    tag: 1,
                    offset: 10,
                    len: 20
                },
            ]
        );
        // Without zero copy every piece is an iovec from our memory.
        let mut iov = Vec::new();
        iovecs(&buf, &placed, &mut iov);
        assert_eq!(iov.len(), 6);
        for cap in 1..=want.len() + 1 {
            for window in 1..=4 {
                plan.build(&buf, &placed, usize::MAX);
                let mut wire = Vec::new();
                let mut rounds = 0;
                while !plan.is_done() {
                    rounds += 1;
                    assert!(rounds < 1000);
                    let n = plan.pending().len().min(window);
                    let mut res = Vec::new();
                    let mut broken = false;
                    for seg in &plan.pending()[..n] {
                        if broken {
                            res.push(-libc::ECANCELED);
                            continue;
                        }
                        let len = plan.seg_len(seg);
                        let take = len.min(cap);
                        match *seg {
                            Seg::Msg { first, count } => {
                                let mut b = bytes(&plan.iov[first..first + count]);
                                b.truncate(take);
                                wire.extend_from_slice(&b);
                            }
                            Seg::Fixed { tag, offset, .. } => {
                                assert_eq!(tag, 1);
                                let o = offset as usize;
                                wire.extend_from_slice(&pages[o..o + take]);
                            }
                            Seg::Splice { .. } => unreachable!("never spliced"),
                        }
                        res.push(take as i32);
                        broken = take < len;
                    }
                    plan.complete(&res).unwrap();
                }
                assert_eq!(wire, want, "cap {cap} window {window}");
            }
        }
        // A socket error is returned, EAGAIN leaves it pending.
        plan.build(&buf, &placed, usize::MAX);
        plan.complete(&[-libc::EAGAIN]).unwrap();
        assert_eq!(plan.next, 0);
        assert_eq!(plan.complete(&[-libc::ECONNRESET]), Err(-libc::ECONNRESET));
        assert_eq!(plan.complete(&[-libc::ECANCELED]), Err(-libc::ECANCELED));
    }

    /// Pieces in our memory of at least the threshold become splices; the
    /// pipe is filled in wire order, a chain ends at the first splice not
    /// wholly in it, and a splice moves what is in it.
    #[test]
    fn splices_go_through_the_pipe_in_order() {
        let buf: Vec<u8> = (0..60).collect();
        let d1 = vec![200u8; 10];
        let d2 = vec![201u8; 30];
        let d3 = vec![202u8; 25];
        let placed = [
            piece(10, &d1, 0, None),
            piece(20, &d2, 1, None),
            piece(30, &d3, 2, None),
        ];
        let mut plan = SendPlan::default();
        plan.build(&buf, &placed, 20);
        let p2 = d2.as_ptr() as usize;
        let p3 = d3.as_ptr() as usize;
        assert_eq!(
            plan.segs,
            vec![
                Seg::Msg { first: 0, count: 3 },
                Seg::Splice {
                    first: 3,
                    count: 1,
                    len: 30,
                    queued: 0
                },
                Seg::Msg { first: 4, count: 1 },
                Seg::Splice {
                    first: 5,
                    count: 1,
                    len: 25,
                    queued: 0
                },
                Seg::Msg { first: 6, count: 1 },
            ]
        );
        // A pipe with room for 40 bytes: d2 whole, 10 of d3; the chain
        // ends with d3's splice.
        let mut room = 40;
        let mut took = Vec::new();
        let n = plan
            .fill_pipe(5, |iov| {
                assert_eq!(iov.len(), 1);
                let n = total(iov).min(room);
                room -= n;
                took.push((iov[0].iov_base as usize, n));
                Ok(n)
            })
            .unwrap();
        assert_eq!(n, 4);
        assert_eq!(took, vec![(p2, 30), (p3, 10)]);
        assert_eq!(plan.sqe_len(&plan.pending()[3]), 10);
        // All of it went: d3's splice moved its 10, 15 are still to go.
        plan.complete(&[30, 30, 10, 10]).unwrap();
        assert_eq!(
            plan.pending()[0],
            Seg::Splice {
                first: 5,
                count: 1,
                len: 15,
                queued: 0
            }
        );
        assert_eq!(plan.iov[5].iov_base as usize, p3 + 10);
        // The pipe is full (nothing pending in it would be a bug): the
        // front splice gets nothing, which fails the send.
        assert_eq!(plan.fill_pipe(2, |_| Ok(0)), Err(-libc::ENOBUFS));
        assert_eq!(
            plan.fill_pipe(2, |_| Err(-libc::EFAULT)),
            Err(-libc::EFAULT)
        );
        // A short splice leaves the rest in the pipe; the next fill adds
        // nothing to it.
        assert_eq!(plan.fill_pipe(2, |iov| Ok(total(iov))), Ok(2));
        plan.complete(&[5, -libc::ECANCELED]).unwrap();
        let mut asked = 0;
        assert_eq!(
            plan.fill_pipe(2, |iov| {
                asked += total(iov);
                Ok(total(iov))
            }),
            Ok(2)
        );
        assert_eq!(asked, 0, "its bytes are in the pipe already");
        assert_eq!(plan.sqe_len(&plan.pending()[0]), 10);
        plan.complete(&[10, 30]).unwrap();
        assert!(plan.is_done());
    }

    /// A send buffer of a capsule and two H2CData-like PDUs (header, then
    /// data left in place) and a trailer: `(buf, placed)` for `d1`, `d2`.
    fn two_pdus(d1: &[u8], d2: &[u8]) -> (Vec<u8>, Vec<Placed>) {
        let buf: Vec<u8> = (0..80).collect();
        let mut a = piece(46, d1, 3, None);
        a.head = 30;
        let mut b = piece(70, d2, 4, None);
        b.head = 46;
        (buf, vec![a, b])
    }

    /// The bytes of a plan's segments, in order (splices from their
    /// iovecs), and how many `vmsplice` + `Splice` pairs it takes.
    fn plan_bytes(plan: &SendPlan) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut splices = 0;
        for seg in &plan.segs {
            let (first, count) = match *seg {
                Seg::Msg { first, count } => (first, count),
                Seg::Splice { first, count, .. } => {
                    splices += 1;
                    (first, count)
                }
                Seg::Fixed { .. } => unreachable!("no zero copy here"),
            };
            out.extend(bytes(&plan.iov[first..first + count]));
        }
        (out, splices)
    }

    /// With header copies, a send's headers and data go in one splice;
    /// the bytes are the wire's, and the copies are of the headers.
    #[test]
    fn header_copies_join_their_data_in_one_splice() {
        let d1 = vec![201u8; 40];
        let d2 = vec![202u8; 50];
        let (mut buf, mut placed) = two_pdus(&d1, &d2);
        let mut want = Vec::new();
        let mut iov = Vec::new();
        iovecs(&buf, &placed, &mut iov);
        want.extend(bytes(&iov));
        let mut plan = SendPlan::default();
        plan.build(&buf, &placed, 20);
        let (wire, splices) = plan_bytes(&plan);
        assert_eq!(wire, want);
        assert_eq!(splices, 2, "without copies: a sendmsg between two splices");
        assert_eq!(plan.segs.len(), 5);

        let mut heads = HeadCopies::new(8);
        heads.copy(&buf, &mut placed, 20);
        assert!(placed.iter().all(|d| d.head_copy.is_some()));
        plan.build(&buf, &placed, 20);
        assert_eq!(
            plan.segs,
            vec![
                Seg::Msg { first: 0, count: 1 },
                Seg::Splice {
                    first: 1,
                    count: 4,
                    len: 16 + 40 + 24 + 50,
                    queued: 0
                },
                Seg::Msg { first: 5, count: 1 },
            ]
        );
        let (wire, splices) = plan_bytes(&plan);
        assert_eq!(wire, want);
        assert_eq!(splices, 1);
        // The splice takes the headers from the copies, not the buffer.
        buf.iter_mut().for_each(|b| *b = 0xee);
        let Seg::Splice { first, count, .. } = plan.segs[1] else {
            unreachable!()
        };
        let spliced = bytes(&plan.iov[first..first + count]);
        assert_eq!(&spliced[..16], &want[30..46]);
        assert_eq!(&spliced[56..80], &want[86..110]);

        // A plan in pieces (over a buffer as it was): the pipe takes 7 bytes at a time, the splice
        // moves what is in it, the bytes arrive in order.
        let (buf, _) = two_pdus(&d1, &d2);
        plan.build(&buf, &placed, 20);
        let mut sent: Vec<u8> = Vec::new();
        let mut pipe = std::collections::VecDeque::<u8>::new();
        let mut rounds = 0;
        while !plan.is_done() {
            rounds += 1;
            assert!(rounds < 100);
            let n = plan
                .fill_pipe(1, |iov| {
                    let b = bytes(iov);
                    let n = b.len().min(7);
                    pipe.extend(&b[..n]);
                    Ok(n)
                })
                .unwrap();
            assert_eq!(n, 1);
            let seg = plan.pending()[0];
            let take = plan.sqe_len(&seg).min(5);
            match seg {
                Seg::Msg { first, count } => {
                    sent.extend(&bytes(&plan.iov[first..first + count])[..take])
                }
                Seg::Splice { .. } => sent.extend(pipe.drain(..take)),
                Seg::Fixed { .. } => unreachable!(),
            }
            plan.complete(&[take as i32]).unwrap();
        }
        assert_eq!(sent, want);
    }

    /// A tag's copies last until its next request; beyond the slots, and
    /// for headers too long, data too small or only in the request's
    /// pages, a header stays in the send buffer.
    #[test]
    fn header_copies_are_bounded_per_tag_and_reset_by_its_next_request() {
        let d = [1u8; 64];
        let buf: Vec<u8> = (0..=255).collect();
        let mut heads = HeadCopies::new(4);
        let copied = |heads: &mut HeadCopies, head: usize, at: usize, len, tag, ir| {
            let mut p = [piece(at, &d[..len], tag, ir)];
            p[0].head = head;
            heads.copy(&buf, &mut p, 32);
            p[0].head_copy.inspect(|&c| {
                // SAFETY: a slot of `heads`, `at - head` bytes.
                let b = unsafe { std::slice::from_raw_parts(c as *const u8, at - head) };
                assert_eq!(b, &buf[head..at]);
            })
        };
        let mut seen = std::collections::HashSet::new();
        for k in 0..HEAD_COPIES_PER_TAG {
            let c = copied(&mut heads, k, k + 24, 64, 1, None).expect("a slot");
            assert!(seen.insert(c), "each copy has a slot of its own");
        }
        assert_eq!(copied(&mut heads, 0, 24, 64, 1, None), None, "tag 1 is out");
        assert!(
            copied(&mut heads, 0, 24, 64, 2, None).is_some(),
            "tag 2 is not"
        );
        heads.reset(1);
        assert!(copied(&mut heads, 0, 24, 64, 1, None).is_some());
        assert_eq!(copied(&mut heads, 0, 33, 64, 3, None), None, "too long");
        assert!(copied(&mut heads, 0, 32, 64, 3, None).is_some());
        assert_eq!(copied(&mut heads, 0, 24, 31, 3, None), None, "not spliced");
        assert_eq!(copied(&mut heads, 0, 24, 64, 3, Some(0)), None, "pages");
        assert_eq!(copied(&mut heads, 24, 24, 64, 3, None), None, "no header");
        assert_eq!(copied(&mut heads, 0, 24, 64, 9, None), None, "no such tag");
    }

    /// The kernel's side of a splice: the bytes vmsplice'd into the pipe
    /// reach the peer through the socket, in order.
    #[test]
    fn a_splice_pipe_carries_our_bytes_to_a_socket() {
        let (tx, mut rx) = loopback_pair();
        let pipe = SplicePipe::new().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let mut sent = 0;
        while sent < data.len() {
            let n = pipe
                .vmsplice(&[libc::iovec {
                    iov_base: data[sent..].as_ptr() as *mut libc::c_void,
                    iov_len: data.len() - sent,
                }])
                .unwrap();
            assert!(n > 0);
            let mut moved = 0;
            while moved < n {
                // SAFETY: both descriptors are open; no offsets.
                let r = unsafe {
                    libc::splice(
                        pipe.read_fd(),
                        std::ptr::null_mut(),
                        tx.as_raw_fd(),
                        std::ptr::null_mut(),
                        n - moved,
                        0,
                    )
                };
                assert!(r > 0, "{}", std::io::Error::last_os_error());
                moved += r as usize;
            }
            sent += n;
        }
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).unwrap();
        assert_eq!(got, data);
    }

    /// Both ends of a TCP connection on loopback: (ours, the peer's).
    fn loopback_pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        (tx, rx)
    }

    thread_local! {
        static RING: RefCell<io_uring::IoUring> =
            RefCell::new(io_uring::IoUring::new(8).expect("io_uring"));
    }

    /// A [`ChainOp`] on a ring of the test's own, waiting for the CQEs
    /// before it returns (so its future is ready at once).
    fn ring_chain(sqes: &[io_uring::squeue::Entry]) -> Pin<Box<dyn Future<Output = Vec<i32>>>> {
        let res = RING.with(|r| {
            let mut ring = r.borrow_mut();
            for (i, sqe) in sqes.iter().enumerate() {
                let mut e = sqe.clone().user_data(i as u64);
                if i + 1 < sqes.len() {
                    e = e.flags(io_uring::squeue::Flags::IO_LINK);
                }
                // SAFETY: what the entries point to outlives the wait.
                unsafe { ring.submission().push(&e).expect("room") };
            }
            ring.submit_and_wait(sqes.len()).expect("submit");
            let mut res = vec![0; sqes.len()];
            for c in ring.completion() {
                res[c.user_data() as usize] = c.result();
            }
            res
        });
        Box::pin(std::future::ready(res))
    }

    /// Polls `f` to its end: every operation of [`ring_chain`] is ready
    /// when asked.
    fn run_ready<T>(f: impl Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("a ready ring never pends"),
        }
    }

    /// `send_inline` against a real socket that fills: headers and
    /// pieces of several MiB go out in order, through partial splices,
    /// EAGAINs and waits for room, while the peer reads slowly.
    #[test]
    fn an_inline_send_carries_every_byte_through_a_full_socket() {
        let (tx, mut rx) = loopback_pair();
        tx.set_nonblocking(true).unwrap();
        assert!(nonblocking(tx.as_raw_fd()));
        let buf: Vec<u8> = (0..3000u32).map(|i| (i % 241) as u8).collect();
        let pieces: Vec<Vec<u8>> = (0..6u32)
            .map(|k| {
                (0..(700_000 + 90_001 * k))
                    .map(|i| (i.wrapping_mul(7) ^ k) as u8)
                    .collect()
            })
            .collect();
        let mut placed: Vec<Placed> = pieces
            .iter()
            .enumerate()
            .map(|(k, d)| {
                // A header of 24 bytes before each, spliced from its copy
                // with its data: the first three back to back (one splice
                // segment), the others apart (a `sendmsg` between).
                let at = if k < 3 { 400 + 24 * k } else { 400 * (k + 1) };
                let mut p = piece(at, d, k as u16, None);
                p.head = at - 24;
                p
            })
            .collect();
        let mut want = Vec::new();
        splice(&buf, &placed, false, |run| {
            let v = match run {
                Run::Mem(v) | Run::Piece { v, head: None } => v,
                _ => unreachable!("no piece is in a request or has a copy"),
            };
            // SAFETY: the iovecs point into `buf` and `pieces`.
            want.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
            });
        });
        // Kept until the send is done: the copies live in it.
        let mut heads = HeadCopies::new(8);
        heads.copy(&buf, &mut placed, SPLICE_MIN_BYTES);
        let mut plan = SendPlan::default();
        plan.build(&buf, &placed, SPLICE_MIN_BYTES);
        assert!(plan.segs.iter().any(|s| matches!(s, Seg::Splice { .. })));
        let total = want.len();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 16 * 1024];
            while got.len() < total {
                let n = rx.read(&mut chunk).unwrap();
                assert!(n > 0, "EOF after {} bytes", got.len());
                got.extend_from_slice(&chunk[..n]);
                std::thread::sleep(Duration::from_micros(200));
            }
            got
        });
        let pipe = SplicePipe::new().unwrap();
        let mut spliced = 0;
        run_ready(send_inline(
            &mut plan,
            &pipe,
            tx.as_raw_fd(),
            ring_chain,
            &mut spliced,
        ))
        .unwrap();
        assert!(plan.is_done());
        let got = reader.join().unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the bytes arrived out of order");
        let pieces_len: usize = pieces.iter().map(Vec::len).sum();
        assert_eq!(
            spliced as usize,
            pieces_len + 24 * pieces.len(),
            "every piece and its header went by reference"
        );
    }

    /// What the pipe holds of a send's headers comes from their copies:
    /// the send buffer is overwritten (as the next gather does) after the
    /// `vmsplice` and before the bytes leave the pipe, and they are still
    /// the wire's.
    #[test]
    fn spliced_headers_come_from_copies_that_outlive_the_send_buffer() {
        let mut buf: Vec<u8> = (0..3000u32).map(|i| (i % 239) as u8).collect();
        let pieces: Vec<Vec<u8>> = (0..6u32)
            .map(|k| (0..(40_000 + 7 * k)).map(|i| (i ^ k) as u8).collect())
            .collect();
        let mut placed: Vec<Placed> = pieces
            .iter()
            .enumerate()
            .map(|(k, d)| {
                // Back to back: between two pieces only the next one's
                // header, as a gather of H2CData PDUs lays them out.
                let mut p = piece(400 + 24 * k, d, k as u16, None);
                p.head = p.at - 24;
                p
            })
            .collect();
        let mut iov = Vec::new();
        iovecs(&buf, &placed, &mut iov);
        let want = bytes(&iov);
        let mut heads = HeadCopies::new(8);
        heads.copy(&buf, &mut placed, SPLICE_MIN_BYTES);
        let mut plan = SendPlan::default();
        plan.build(&buf, &placed, SPLICE_MIN_BYTES);
        // The send buffer's bytes before the first header, one splice of
        // all the headers and pieces, then the rest of the buffer.
        assert_eq!(plan.segs.len(), 3, "{:?}", plan.segs);
        let pipe = SplicePipe::new().unwrap();
        assert_eq!(plan.fill_pipe(3, |iov| pipe.vmsplice(iov)), Ok(3));
        let len = plan.sqe_len(&plan.segs[1]);
        assert_eq!(len, 24 * 6 + pieces.iter().map(Vec::len).sum::<usize>());
        buf.iter_mut().for_each(|b| *b = 0xee);
        drop(buf);
        let mut got = vec![0u8; len];
        let mut at = 0;
        while at < len {
            // SAFETY: reads into `got`'s unfilled tail.
            let r = unsafe {
                libc::read(
                    pipe.read_fd(),
                    got[at..].as_mut_ptr() as *mut libc::c_void,
                    len - at,
                )
            };
            assert!(r > 0, "{}", std::io::Error::last_os_error());
            at += r as usize;
        }
        assert!(got == want[400 - 24..][..len], "the pipe holds other bytes");
    }

    /// An inline send to a socket whose peer is gone fails with the
    /// socket's error, not a hang.
    #[test]
    fn an_inline_send_to_a_closed_peer_fails() {
        let (tx, rx) = loopback_pair();
        tx.set_nonblocking(true).unwrap();
        // SAFETY: SO_LINGER 0 makes the close a reset.
        unsafe {
            let lg = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            libc::setsockopt(
                rx.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &lg as *const libc::linger as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as u32,
            );
        }
        drop(rx);
        std::thread::sleep(Duration::from_millis(20));
        let buf = vec![1u8; 100];
        let data = vec![2u8; 4 << 20];
        let placed = [piece(50, &data, 0, None)];
        let mut plan = SendPlan::default();
        plan.build(&buf, &placed, SPLICE_MIN_BYTES);
        let pipe = SplicePipe::new().unwrap();
        let mut spliced = 0;
        let r = run_ready(send_inline(
            &mut plan,
            &pipe,
            tx.as_raw_fd(),
            ring_chain,
            &mut spliced,
        ));
        assert!(
            matches!(r, Err(e) if e == -libc::ECONNRESET || e == -libc::EPIPE),
            "{r:?}"
        );
    }

    /// An aborted connection sends nothing more: the bytes still queued
    /// in it never reach the peer (a shutdown would deliver them), and its
    /// descriptor stays open.
    #[test]
    fn an_aborted_connection_sends_nothing_more() {
        let (tx, mut rx) = loopback_pair();
        // Fill the peer's receive window and our send queue.
        tx.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0;
        loop {
            match (&tx).write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        abort(&tx);
        let _ = tx.shutdown(Shutdown::Both);
        // SAFETY: F_GETFD on a descriptor we own.
        assert!(unsafe { libc::fcntl(tx.as_raw_fd(), libc::F_GETFD) } >= 0);
        let mut got = 0;
        let mut b = vec![0u8; 1 << 20];
        loop {
            match rx.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        assert!(got < written, "received {got} of {written}");
    }

    #[test]
    fn uncovered_is_the_complement_of_the_direct_ranges() {
        assert_eq!(uncovered(100, &mut []), vec![(0, 100)]);
        assert_eq!(uncovered(100, &mut [(0, 100)]), vec![]);
        assert_eq!(uncovered(100, &mut [(8, 100)]), vec![(0, 8)]);
        assert_eq!(
            uncovered(100, &mut [(60, 90), (10, 40)]),
            vec![(0, 10), (40, 60), (90, 100)]
        );
        // Overlaps and repeats (a read received again on a new connection).
        assert_eq!(
            uncovered(100, &mut [(10, 50), (20, 30), (10, 50), (45, 70)]),
            vec![(0, 10), (70, 100)]
        );
        // Exhaustive against a byte map, small lengths.
        for len in 0..12u32 {
            for mask in 0u32..(1 << 6) {
                let mut ranges: Vec<(u32, u32)> = (0..6)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| {
                        (
                            (i * 5) % len.max(1),
                            ((i * 5) % len.max(1) + i + 1).min(len),
                        )
                    })
                    .collect();
                let mut hit = vec![false; len as usize];
                for &(a, b) in &ranges {
                    for x in a..b {
                        hit[x as usize] = true;
                    }
                }
                let out = uncovered(len, &mut ranges);
                let mut got = vec![true; len as usize];
                for w in out.windows(2) {
                    assert!(w[0].1 < w[1].0, "disjoint, in order, merged: {out:?}");
                }
                for &(a, b) in &out {
                    assert!(a < b);
                    for x in a..b {
                        got[x as usize] = false;
                    }
                }
                assert_eq!(got, hit, "len {len} ranges {ranges:?} -> {out:?}");
            }
        }
    }

    #[test]
    fn advance_drops_what_was_sent_at_any_count() {
        let a: Vec<u8> = (0..10).collect();
        let b: Vec<u8> = (10..13).collect();
        let c: Vec<u8> = (13..30).collect();
        let all: Vec<u8> = (0..30).collect();
        for split in 0..=30 {
            let mut iov = Vec::new();
            for v in [&a, &b, &c] {
                iov.push(libc::iovec {
                    iov_base: v.as_ptr() as *mut libc::c_void,
                    iov_len: v.len(),
                });
            }
            let mut first = 0;
            advance_iovecs(&mut iov, &mut first, split);
            assert_eq!(bytes(&iov[first..]), &all[split..], "after {split}");
            advance_iovecs(&mut iov, &mut first, 30 - split);
            assert_eq!(first, iov.len());
        }
    }
}
