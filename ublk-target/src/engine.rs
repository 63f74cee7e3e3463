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
//!   completions wake the tag that owns them (`user_data` = tag).
//! - **tx**: woken when the queue has PDUs; one `Send` SQE carries
//!   everything queued since the last one, so requests that arrive in the
//!   same ring pass go out in one write.
//! - **tick**: a `Timeout` SQE every [`TICK`]: command timeouts, keep-alive
//!   is on the admin queue (the blocking [`Controller`]'s maintenance thread),
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

use nvmf_initiator::{Command, Event, Queue, QueueConfig, Request};
use qos_core::priority::NvmeClass;

use crate::priority::{class_name, connect_class};
use crate::qos::{Class, QueueQos, Ticket};
use crate::volume::{Stats, Volume};

/// Period of the housekeeping timer.
pub const TICK: Duration = Duration::from_millis(50);

/// Receive buffer per connection.
const RX_BYTES: usize = 256 * 1024;
/// Bytes gathered per send.
const TX_LIMIT: usize = 256 * 1024;

/// A view of a tag's I/O buffer (the ublk queue's per-tag `IoBuf`) handed
/// to the initiator's queue for the request's lifetime.
///
/// The buffers are allocated once per queue thread and outlive the engine
/// (see `ublk.rs`), and a tag's buffer is touched by nobody else while its
/// request is in the engine: the tag task waits for the completion before
/// it commits the buffer back to the driver.
pub struct TagBuf {
    ptr: *mut u8,
    len: usize,
}

impl TagBuf {
    /// # Safety
    /// `ptr..ptr+len` must stay valid and unaliased while the `TagBuf` or
    /// a request holding it lives.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }
}

impl AsRef<[u8]> for TagBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `TagBuf::new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for TagBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: see `TagBuf::new`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// One io_uring operation, as the libublk adapter submits it on the
/// queue's ring (`ublk::uring_op`); the result is the CQE's `res`.
pub type UringOp = fn(io_uring::squeue::Entry) -> Pin<Box<dyn Future<Output = i32>>>;

struct Conn {
    sock: TcpStream,
    queue: Queue<TagBuf>,
    /// Bumped per connection, so a stale rx/tx completion is ignored.
    generation: u64,
}

/// One NVMe/TCP I/O queue of the engine: the queue of one priority class
/// (its Connect carries the class in CATTR).
struct Path {
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
    /// When the last reconnect attempt failed (attempts are spaced by the
    /// reconnect delay).
    last_attempt: Option<Instant>,
}

/// The engine of one ublk queue; see the module documentation.
pub struct Engine {
    volume: Arc<Volume>,
    stats: Arc<Stats>,
    /// One per class with a queue of its own (`Volume::paths`).
    paths: Vec<Path>,
    /// Rate limiter, credit gate and class arbitration in front of the
    /// NVMe queues.
    qos: QueueQos<Request<TagBuf>>,
    /// Per tag: the QoS ticket of an admitted request.
    tickets: Vec<Option<Ticket>>,
    /// Per tag: the path its request goes to.
    tag_path: Vec<u8>,
    pace_waker: Option<Waker>,
    /// Per tag: the outcome once known (true: success).
    results: Vec<Option<bool>>,
    wakers: Vec<Option<Waker>>,
}

impl Engine {
    /// An engine for ublk queue `qid` of `depth` tags; not connected yet.
    pub fn new(volume: Arc<Volume>, qid: u16, depth: u16) -> Self {
        let stats = Arc::clone(&volume.stats);
        let qos = QueueQos::new(
            Arc::clone(&volume.qos),
            qid,
            volume.priority.config.arbiter(),
        );
        let paths = volume
            .paths
            .iter()
            .map(|&class| Path {
                class,
                qid: None,
                epoch: 0,
                conn: None,
                generation: 0,
                held: VecDeque::new(),
                tx_waker: None,
                rx_waker: None,
                last_attempt: None,
            })
            .collect();
        Self {
            qos,
            tickets: vec![None; usize::from(depth)],
            tag_path: vec![0; usize::from(depth)],
            pace_waker: None,
            volume,
            stats,
            paths,
            results: vec![None; usize::from(depth)],
            wakers: vec![None; usize::from(depth)],
        }
    }

    /// How many NVMe/TCP queues (one per class in use) this engine runs;
    /// the queue thread starts an rx and a tx task per path.
    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    /// Connect every path (blocking, bounded) if the controller is live;
    /// on failure the tick retries.
    pub fn try_connect(&mut self, now: Instant) {
        for p in 0..self.paths.len() {
            self.try_connect_path(p, now);
        }
    }

    fn try_connect_path(&mut self, p: usize, now: Instant) {
        let vol = Arc::clone(&self.volume);
        let path = &mut self.paths[p];
        if path.conn.is_some() {
            return;
        }
        let ctrl = &vol.ctrl;
        if !ctrl.is_live() {
            return;
        }
        if let Some(t) = path.last_attempt {
            if now.duration_since(t) < vol.config.reconnect.reconnect_delay.min(TICK * 20) {
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
        match connect_blocking(vol.addr, cfg) {
            Ok((sock, queue)) => {
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
                for r in held {
                    let c = self.paths[p].conn.as_mut().expect("just connected");
                    if let Err(rej) = c.queue.submit(now, r) {
                        // A fresh queue refuses only what it can never
                        // send (e.g. larger than the new limits).
                        let tag = rej.request.user_data as usize;
                        self.finish(tag, false);
                    }
                }
                let path = &mut self.paths[p];
                if epoch > 0 || n > 0 {
                    log::info!(
                        "{}: I/O queue {} ({}) connected (controller epoch {epoch}), {n} requests resubmitted",
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

    /// Queue a request for tag `tag`: `class` and `bytes` are what the
    /// rate limiter charges, `prio` is its NVMe priority class.
    pub fn submit(
        &mut self,
        tag: u16,
        command: Command,
        buf: Option<TagBuf>,
        class: Class,
        bytes: u64,
        prio: NvmeClass,
    ) {
        self.stats.inflight.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = self.tag_path.get_mut(usize::from(tag)) {
            *p = self.volume.class_path[prio.index()];
        }
        let req = Request {
            command,
            buf,
            user_data: u64::from(tag),
        };
        let now = self.qos.shared().now(Instant::now());
        self.qos.push(now, req, class, bytes, prio);
        self.pump(now);
    }

    /// Send what the QoS stage admits now; arm the pacing timer if the
    /// limiter holds the head back.
    fn pump(&mut self, now: qos_core::Nanos) {
        while let Some((req, ticket)) = self.qos.poll_admit(now) {
            let tag = req.user_data as usize;
            if let Some(t) = self.tickets.get_mut(tag) {
                *t = Some(ticket);
            }
            let p = usize::from(self.tag_path.get(tag).copied().unwrap_or(0));
            self.send_on(p, Instant::now(), req);
        }
        if self.qos.timer().is_some() {
            wake(&mut self.pace_waker);
        }
    }

    /// How long until the pacing timer should fire, if it is armed.
    fn pace_delay(&self) -> Option<Duration> {
        let at = self.qos.timer()?;
        let now = self.qos.shared().now(Instant::now());
        Some(Duration::from_nanos(at.nanos_since(now)).min(TICK))
    }

    fn send_on(&mut self, p: usize, now: Instant, req: Request<TagBuf>) {
        let path = &mut self.paths[p];
        match path.conn.as_mut() {
            Some(c) => match c.queue.submit(now, req) {
                Err(rej) => path.held.push_back(rej.request),
                Ok(()) => wake(&mut path.tx_waker),
            },
            None => path.held.push_back(req),
        }
    }

    /// The outcome of tag `tag`'s request, once known.
    fn poll_result(&mut self, tag: u16, cx: &Context<'_>) -> Poll<bool> {
        match self.results[usize::from(tag)].take() {
            Some(ok) => Poll::Ready(ok),
            None => {
                self.wakers[usize::from(tag)] = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn finish(&mut self, tag: usize, ok: bool) {
        if let Some(t) = self.tickets.get_mut(tag).and_then(Option::take) {
            // Failed without a completion: give the credit back.
            let now = self.qos.shared().now(Instant::now());
            self.qos.on_done(now, t, None);
        }
        self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
        if !ok {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(r) = self.results.get_mut(tag) {
            *r = Some(ok);
        }
        if let Some(w) = self.wakers.get_mut(tag) {
            wake(w);
        }
    }

    fn drain_events(&mut self, p: usize) {
        let mut completed = false;
        while let Some(ev) = self.paths[p]
            .conn
            .as_mut()
            .and_then(|c| c.queue.poll_event())
        {
            match ev {
                Event::Connected { .. } => {}
                Event::Completed(done) => {
                    let ok = done.status.is_success();
                    if !ok {
                        log::warn!(
                            "{}: tag {}: NVMe status {:?}",
                            self.volume.config.name,
                            done.user_data,
                            done.status
                        );
                    }
                    let tag = done.user_data as usize;
                    if let Some(t) = self.tickets.get_mut(tag).and_then(Option::take) {
                        let now = self.qos.shared().now(Instant::now());
                        self.qos.on_done(now, t, Some(done.dw1));
                        completed = true;
                    }
                    self.finish(tag, ok);
                }
                Event::Failed(e) => self.on_failure(p, e),
            }
        }
        if completed && self.qos.queued() > 0 {
            let now = self.qos.shared().now(Instant::now());
            self.pump(now);
        }
        // Admissions may have queued PDUs on any path.
        for path in &mut self.paths {
            if path.conn.as_ref().is_some_and(|c| c.queue.has_transmit()) {
                wake(&mut path.tx_waker);
            }
        }
    }

    /// The pacing timer fired.
    fn on_pace(&mut self) {
        let now = self.qos.shared().now(Instant::now());
        self.pump(now);
    }

    /// Path `p`'s connection is gone: reset the controller (once, whoever
    /// reports), keep the unfinished requests for the next connection.
    fn on_failure(&mut self, p: usize, err: nvmf_initiator::Error) {
        let path = &mut self.paths[p];
        let Some(mut c) = path.conn.take() else {
            return;
        };
        log::warn!(
            "{}: I/O queue {} ({}) failed: {err}",
            self.volume.config.name,
            c.queue.config().qid,
            class_name(path.class)
        );
        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        self.volume.ctrl.report_failure(path.epoch, &err);
        c.queue.close();
        let _ = c.sock.shutdown(Shutdown::Both);
        let mut unfinished = c.queue.take_unfinished();
        // Requests that never reached the queue stay behind those.
        unfinished.extend(path.held.drain(..));
        path.held = unfinished.into();
        // A recv still in flight on the socket returns on the shutdown.
        wake(&mut path.rx_waker);
    }

    /// Housekeeping, every [`TICK`]: timeouts, controller resets, reconnect,
    /// and failing held I/O when the policy says so.
    pub fn tick(&mut self, now: Instant) {
        let vol = Arc::clone(&self.volume);
        let ctrl = &vol.ctrl;
        for p in 0..self.paths.len() {
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
                if let Err(e) = ctrl.disposition() {
                    let held = std::mem::take(&mut self.paths[p].held);
                    if !held.is_empty() {
                        log::error!("{}: failing {} requests: {e}", vol.config.name, held.len());
                    }
                    for r in held {
                        self.finish(r.user_data as usize, false);
                    }
                }
                self.try_connect_path(p, now);
            }
        }
        // Settings changed at run time (credit mode, limits) reach a
        // queue that is otherwise idle.
        if self.qos.queued() > 0 {
            let qnow = self.qos.shared().now(now);
            self.pump(qnow);
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

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
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
pub async fn rx_task(engine: Rc<RefCell<Engine>>, path: usize, op: UringOp) {
    // Leaked on purpose: a Recv may still be in the ring when the thread's
    // executor is dropped at shutdown, and must never write into freed
    // memory. One buffer per queue thread.
    let buf: &'static mut [u8] = Box::leak(vec![0u8; RX_BYTES].into_boxed_slice());
    loop {
        let (generation, fd) = WaitFor {
            engine: Rc::clone(&engine),
            path,
            what: Wait::Rx,
        }
        .await;
        let sqe = io_uring::opcode::Recv::new(
            io_uring::types::Fd(fd),
            buf.as_mut_ptr(),
            buf.len() as u32,
        )
        .build();
        let res = op(sqe).await;
        let mut e = engine.borrow_mut();
        if res > 0 {
            e.on_bytes(path, generation, &buf[..res as usize]);
        } else if res != -libc::EINTR && res != -libc::EAGAIN {
            e.on_socket_error(path, generation, res);
        }
    }
}

/// The transmit task of path `path` (runs for the queue thread's
/// lifetime).
pub async fn tx_task(engine: Rc<RefCell<Engine>>, path: usize, op: UringOp) {
    // Leaked for the same reason as the receive buffer.
    let buf: &'static mut Vec<u8> = Box::leak(Box::new(Vec::with_capacity(2 * TX_LIMIT)));
    loop {
        let (generation, fd) = WaitFor {
            engine: Rc::clone(&engine),
            path,
            what: Wait::Tx,
        }
        .await;
        buf.clear();
        {
            let mut e = engine.borrow_mut();
            if let Some(c) = e.paths[path].conn.as_mut() {
                c.queue.poll_transmit(buf, TX_LIMIT);
            }
            e.stats.sends.fetch_add(1, Ordering::Relaxed);
        }
        let mut off = 0;
        while off < buf.len() {
            let sqe = io_uring::opcode::Send::new(
                io_uring::types::Fd(fd),
                buf[off..].as_ptr(),
                (buf.len() - off) as u32,
            )
            .flags(libc::MSG_NOSIGNAL)
            .build();
            let res = op(sqe).await;
            if res > 0 {
                off += res as usize;
            } else if res != -libc::EINTR && res != -libc::EAGAIN {
                engine.borrow_mut().on_socket_error(path, generation, res);
                break;
            }
        }
    }
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
