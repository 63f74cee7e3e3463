//! The per-namespace (per backend device) pipeline between the NVMe/TCP
//! front end and the backend.
//!
//! Every I/O command of every controller attached to a namespace passes
//! through that namespace's pipeline. With `qos = "none"` it goes straight to
//! the backend; with `qos = "gimbal"` the storage switch decides when each
//! request reaches the device and what credit its completion carries. The
//! front end never talks to a backend directly, so the switch sees all
//! traffic of its device (the paper's shared-nothing, per-SSD design).
//!
//! Requests run inline on the caller's thread when the backend never blocks
//! (`ram`, `null`): a thread hop per I/O would cost more than the copy. A
//! backend that may block (`file`) runs on tokio's blocking pool so that one
//! slow device cannot stall a connection's event loop. A backend that models
//! its latency (`sim`) is booked and its data moved inline at dispatch, and
//! the request completes on a runtime timer at the modelled instant.
//!
//! Class arbitration (issue 8): requests of a controller that enabled
//! weighted round robin (CC.AMS 001b) or our vendor-specific DRR (111b)
//! carry a [`ClassTag`]. When the namespace has a `device_queue_depth`, at
//! most that many of them are outstanding below this stage (at the backend
//! with `qos = "none"`, held or run by the switch with `qos = "gimbal"`);
//! the rest wait in the namespace's [`ClassArbiter`] (urgent strictly
//! first, then WRR by commands or DRR by bytes with the controller's
//! weights and burst, aging so nothing starves) and are released one by one
//! as earlier ones complete. The per-tenant Gimbal scheduler thus sees the
//! classes' shares, as the per-tenant priority queues of the Gimbal paper
//! (§3.5) would give them. Without a `device_queue_depth` nothing ever
//! waits, so the arbiter is skipped: the classes cannot matter if the
//! device takes every request at once. Round-robin requests (no tag),
//! flushes and deallocates never wait here and are not counted.

use std::borrow::Cow;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use qos_core::class_arbiter::{ArbiterConfig, ClassArbiter, QueueId};
use qos_core::config::GimbalConfig;
use qos_core::error::QosError;
use qos_core::priority::NvmeClass;
use qos_core::scheduler::Dispatched;
use qos_core::switch::{GimbalSwitch, VirtualView};
use qos_core::time::Nanos;
use qos_core::types::{IoKind, RequestId, TenantId};

use crate::backend::{Backend, UringDone, UringOp};
use crate::clock::SwitchClock;

/// What a request asks the backend to do. Offsets and lengths are in bytes
/// and were checked against the namespace size by the front end.
#[derive(Debug)]
pub enum IoOp {
    /// Read `len` bytes at `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: usize,
    },
    /// Write `data` at `offset`, durable on completion when `fua`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data.
        data: Vec<u8>,
        /// Force unit access.
        fua: bool,
    },
    /// Make completed writes durable.
    Flush,
    /// Zero `len` bytes at `offset`.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u64,
    },
    /// Deallocate byte ranges (offset, length).
    Discard {
        /// The ranges.
        ranges: Vec<(u64, u64)>,
    },
}

impl IoOp {
    /// Bytes the request moves to or from the device (what schedulers
    /// count); zero for flush and deallocate.
    pub fn transfer_bytes(&self) -> u64 {
        match self {
            IoOp::Read { len, .. } => *len as u64,
            IoOp::Write { data, .. } => data.len() as u64,
            IoOp::WriteZeroes { len, .. } => *len,
            IoOp::Flush | IoOp::Discard { .. } => 0,
        }
    }

    /// Whether the request writes (for write-cost accounting).
    pub fn is_write(&self) -> bool {
        !matches!(self, IoOp::Read { .. })
    }
}

/// The outcome of a request.
#[derive(Debug)]
pub struct IoDone {
    /// Read data for a read, empty otherwise; or the backend's error.
    pub result: io::Result<Cow<'static, [u8]>>,
    /// Credit to report to the tenant in completion dword 1 (Gimbal only).
    pub credit: Option<u32>,
}

/// Where a request comes from, for arbitration between NVMe priority
/// classes: passed with every request of a controller that chose weighted
/// round robin (CC.AMS 001b) or the vendor-specific DRR (111b). Requests of
/// a round-robin controller carry none and take today's path unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassTag {
    /// The submitting controller's arbitration (mode, weights, burst,
    /// aging).
    pub arbiter: ArbiterConfig,
    /// The class of the submission queue (its Connect CATTR bits 1:0).
    pub class: NvmeClass,
    /// The submission queue, unique within the namespace (see
    /// [`ClassTag::queue_id`]).
    pub queue: QueueId,
    /// The namespace's `device_queue_depth`: requests outstanding at the
    /// device (or the switch) beyond which arbitrated requests wait.
    /// `None`: unlimited.
    pub device_queue_depth: Option<u32>,
}

impl ClassTag {
    /// A queue id unique across the controllers of a namespace.
    pub fn queue_id(cntlid: u16, qid: u16) -> QueueId {
        QueueId(u32::from(cntlid) << 16 | u32::from(qid))
    }
}

/// Receives a request's completion, exactly once, on whatever thread
/// completed the request.
pub enum Completion {
    /// A callback of its own (one allocation per request).
    Callback(Box<dyn FnOnce(IoDone) + Send + 'static>),
    /// A long-lived sink that completes many requests, told which one by
    /// the tag: no allocation per request. A connection's responder is
    /// one: a connection decodes a receive's ~30 commands before the
    /// switch runs them, and ~30 live callbacks at once overflowed the
    /// allocator's per-thread cache into its slow paths (~170 instructions
    /// more per request, measured under callgrind).
    Sink(Arc<dyn CompletionSink>, u64),
}

/// Completes requests for [`Completion::Sink`].
pub trait CompletionSink: Send + Sync {
    /// Request `tag` has ended with `done`.
    fn complete(&self, tag: u64, done: IoDone);
}

impl Completion {
    /// A completion that calls `f`.
    pub fn callback(f: impl FnOnce(IoDone) + Send + 'static) -> Self {
        Completion::Callback(Box::new(f))
    }

    /// Delivers the request's end.
    pub fn complete(self, done: IoDone) {
        match self {
            Completion::Callback(f) => f(done),
            Completion::Sink(sink, tag) => sink.complete(tag, done),
        }
    }
}

/// One namespace's pipeline.
pub struct Pipeline {
    backend: Arc<dyn Backend>,
    gimbal: Option<Arc<GimbalStage>>,
    classes: Arc<ClassStage>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("backend", &self.backend.info())
            .field("gimbal", &self.gimbal.is_some())
            .finish()
    }
}

impl Pipeline {
    /// A pass-through pipeline in front of `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Pipeline {
            classes: ClassStage::new(backend.clone(), None),
            backend,
            gimbal: None,
        }
    }

    /// A pipeline running the Gimbal switch in front of `backend`.
    pub fn with_gimbal(backend: Arc<dyn Backend>, config: &GimbalConfig) -> Result<Self, QosError> {
        let switch = GimbalSwitch::new(config)?;
        let gimbal = Some(Arc::new(GimbalStage::new(backend.clone(), switch)));
        Ok(Pipeline {
            classes: ClassStage::new(backend.clone(), gimbal.clone()),
            gimbal,
            backend,
        })
    }

    /// The backend behind this pipeline.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Whether the Gimbal switch runs in this pipeline.
    pub fn is_gimbal(&self) -> bool {
        self.gimbal.is_some()
    }

    /// The switch's virtual view of the device (§3.7), if it runs one.
    pub fn virtual_view(&self) -> Option<VirtualView> {
        let g = self.gimbal.as_ref()?;
        let mut st = g.lock();
        let now = g.now_locked(&mut st);
        Some(st.switch.virtual_view(now))
    }

    /// The current credit of `tenant` (Gimbal only).
    pub fn credit(&self, tenant: u32) -> Option<u32> {
        let g = self.gimbal.as_ref()?;
        g.lock().switch.credit(TenantId(tenant))
    }

    /// Submits a request from `tenant` (an index the target assigns to each
    /// host NQN); `done` is called once it completes. Must be called from
    /// within a tokio runtime when the backend may block or the switch runs.
    /// `class` is `None` for a round-robin controller (CC.AMS 000b).
    pub fn submit(&self, tenant: u32, class: Option<ClassTag>, op: IoOp, done: Completion) {
        if let Some(tag) = class {
            if tag.device_queue_depth.is_some() && op.transfer_bytes() > 0 {
                return self.classes.submit(tenant, tag, op, done);
            }
        }
        self.dispatch(tenant, op, done)
    }

    /// Whether [`submit_batch`](Self::submit_batch) does better than
    /// one [`submit`](Self::submit) per request: the switch runs in front
    /// of an inline backend.
    pub fn takes_batches(&self) -> bool {
        self.gimbal.as_ref().is_some_and(|g| g.mode == Mode::Inline)
    }

    /// Submits `requests` of `tenant` in order, with the outcome of one
    /// [`submit`](Self::submit) each (a connection's requests from one
    /// receive). In front of an inline backend, those that go through the
    /// switch share one hold of its lock: each is submitted at the time
    /// the previous one completed (read under the lock, after its backend
    /// call), so a batch reads the clock once per request plus once, not
    /// twice per request, and takes the lock once. Dispatch and completion
    /// times still enclose only the backend call: the clock is never read
    /// before the lock, and nothing but the switch's own work lies between
    /// one request's completion time and the next one's dispatch.
    /// Completion callbacks run after the lock is released.
    pub fn submit_batch(
        &self,
        tenant: u32,
        requests: impl IntoIterator<Item = (Option<ClassTag>, IoOp, Completion)>,
    ) {
        let Some(g) = self.gimbal.as_ref().filter(|g| g.mode == Mode::Inline) else {
            for (class, op, done) in requests {
                self.submit(tenant, class, op, done);
            }
            return;
        };
        // A buffer kept per thread: a batch's completions, run after the
        // lock is released (a fresh vector per batch grew and freed
        // itself several times per batch).
        let mut finished = FINISHED.with(|f| f.take());
        let mut held: Option<(MutexGuard<'_, GimbalState>, Nanos)> = None;
        for (class, op, done) in requests {
            let arbitrated = class.is_some_and(|t| t.device_queue_depth.is_some());
            if arbitrated || op.transfer_bytes() == 0 {
                // The class stage, flush and deallocate: their own path,
                // which may take the lock itself.
                held = None;
                self.submit(tenant, class, op, done);
                continue;
            }
            let (st, now) = held.get_or_insert_with(|| g.lock_for(tenant));
            *now = g.submit_locked(st, *now, tenant, op, done, &mut finished);
        }
        drop(held);
        run_finished(finished);
    }

    /// Requests waiting in the class arbiter, by class (urgent first).
    pub fn class_waiting(&self) -> [usize; 4] {
        let st = self.classes.lock();
        NvmeClass::ALL.map(|c| st.arbiter.as_ref().map_or(0, |a| a.waiting(c)))
    }

    /// Passes a request below the class stage (today's path).
    fn dispatch(&self, tenant: u32, op: IoOp, done: Completion) {
        match &self.gimbal {
            // Flush and deallocate move no data: they bypass the switch
            // (NVMe orders neither against other commands).
            Some(g) if op.transfer_bytes() > 0 => g.submit(tenant, op, done),
            _ => run_direct(self.backend.clone(), op, done),
        }
    }

    /// Flushes the backend (used at shutdown).
    pub fn flush_blocking(&self) -> io::Result<()> {
        self.backend.flush()
    }
}

thread_local! {
    /// [`Pipeline::submit_batch`]'s completions buffer, reused. A
    /// completion callback that submits a batch itself finds it taken and
    /// uses a new one.
    static FINISHED: std::cell::Cell<Vec<(Completion, IoDone)>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs the completions a submission gathered under the switch's lock
/// (after releasing it) and gives the buffer back to [`FINISHED`].
fn run_finished(mut finished: Vec<(Completion, IoDone)>) {
    for (done, io) in finished.drain(..) {
        done.complete(io);
    }
    FINISHED.with(|f| f.replace(finished));
}

/// A request waiting in the class arbiter.
struct Held {
    tenant: u32,
    op: IoOp,
    done: Completion,
}

struct ClassState {
    /// Created by the first arbitrated request; its configuration follows
    /// the latest submitter's (controllers sharing a namespace with
    /// different weights: the last one to submit sets them).
    arbiter: Option<ClassArbiter<Held>>,
    /// Arbitrated requests released below and not yet completed.
    outstanding: u32,
    /// The latest `device_queue_depth` seen (constant per namespace).
    depth: u32,
    /// A thread is releasing requests: others only update the counts, and
    /// it loops until nothing more may go (no recursion when an inline
    /// backend completes a request inside its release).
    pumping: bool,
}

/// The class arbitration in front of the switch or the backend.
struct ClassStage {
    backend: Arc<dyn Backend>,
    gimbal: Option<Arc<GimbalStage>>,
    state: Mutex<ClassState>,
    /// The arbiter's clock (aging) is real time since this instant.
    epoch: Instant,
}

impl ClassStage {
    fn new(backend: Arc<dyn Backend>, gimbal: Option<Arc<GimbalStage>>) -> Arc<Self> {
        Arc::new(ClassStage {
            backend,
            gimbal,
            state: Mutex::new(ClassState {
                arbiter: None,
                outstanding: 0,
                depth: u32::MAX,
                pumping: false,
            }),
            epoch: Instant::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ClassState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn submit(self: &Arc<Self>, tenant: u32, tag: ClassTag, op: IoOp, done: Completion) {
        let bytes = op.transfer_bytes();
        let now = self.now();
        {
            let mut st = self.lock();
            st.depth = tag.device_queue_depth.unwrap_or(u32::MAX).max(1);
            match &mut st.arbiter {
                Some(a) if a.config() == tag.arbiter => {}
                Some(a) => {
                    if let Err(e) = a.set_config(tag.arbiter) {
                        log::warn!("class arbitration settings refused, keeping the old: {e}");
                    }
                }
                None => match ClassArbiter::new(tag.arbiter) {
                    Ok(a) => st.arbiter = Some(a),
                    Err(e) => {
                        // Weights come from an 8-bit, 0's based field: they
                        // always validate. Serve the request rather than
                        // lose it.
                        log::error!("class arbiter refused its settings: {e}");
                        drop(st);
                        return self.dispatch(tenant, op, done);
                    }
                },
            }
            let a = st.arbiter.as_mut().expect("created above");
            a.enqueue(now, tag.queue, tag.class, bytes, Held { tenant, op, done });
        }
        self.pump();
    }

    /// Releases waiting requests while fewer than the depth are out.
    fn pump(self: &Arc<Self>) {
        {
            let mut st = self.lock();
            if st.pumping {
                return;
            }
            st.pumping = true;
        }
        loop {
            let next = {
                let mut st = self.lock();
                let next = if st.outstanding < st.depth {
                    let now = self.now();
                    st.arbiter.as_mut().and_then(|a| a.dequeue(now))
                } else {
                    None
                };
                match next {
                    Some(n) => {
                        st.outstanding += 1;
                        n.payload
                    }
                    None => {
                        // Cleared under the lock that saw nothing to do: a
                        // completion after this pumps itself.
                        st.pumping = false;
                        return;
                    }
                }
            };
            let me = self.clone();
            let done = next.done;
            self.dispatch(
                next.tenant,
                next.op,
                Completion::callback(move |d| {
                    done.complete(d);
                    me.lock().outstanding -= 1;
                    me.pump();
                }),
            );
        }
    }

    fn dispatch(&self, tenant: u32, op: IoOp, done: Completion) {
        match &self.gimbal {
            Some(g) => g.submit(tenant, op, done),
            None => run_direct(self.backend.clone(), op, done),
        }
    }
}

fn run_direct(backend: Arc<dyn Backend>, op: IoOp, done: Completion) {
    if let Some(store) = backend.untimed() {
        let deadline = book(backend.as_ref(), &op);
        let result = execute(store, op);
        complete_at(deadline, move || {
            done.complete(IoDone {
                result,
                credit: None,
            })
        });
    } else if backend.may_block() {
        run_blocking(
            backend,
            op,
            Box::new(move |result| {
                done.complete(IoDone {
                    result,
                    credit: None,
                })
            }),
        );
    } else {
        let result = execute(backend.as_ref(), op);
        done.complete(IoDone {
            result,
            credit: None,
        });
    }
}

/// Runs an operation of a backend that may block: on its asynchronous
/// engine when it has one for this operation (io_uring), else on tokio's
/// blocking pool. `finish` gets the outcome either way.
fn run_blocking(backend: Arc<dyn Backend>, op: IoOp, finish: UringDone) {
    let op = match into_uring_op(op) {
        Ok(uop) => match backend.submit_async(uop, finish) {
            Ok(()) => return,
            Err((uop, finish)) => {
                let op = from_uring_op(uop);
                return spawn_execute(backend, op, finish);
            }
        },
        Err(op) => op,
    };
    spawn_execute(backend, op, finish)
}

fn spawn_execute(backend: Arc<dyn Backend>, op: IoOp, finish: UringDone) {
    let job = move || finish(execute(backend.as_ref(), op));
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(job);
        }
        // Called from an io_uring completion (the switch dispatching the
        // next request), outside the runtime: a plain thread does the rare
        // request the ring cannot take.
        Err(_) => {
            std::thread::spawn(job);
        }
    }
}

fn into_uring_op(op: IoOp) -> Result<UringOp, IoOp> {
    match op {
        IoOp::Read { offset, len } => Ok(UringOp::Read { offset, len }),
        IoOp::Write { offset, data, fua } => Ok(UringOp::Write { offset, data, fua }),
        IoOp::Flush => Ok(UringOp::Flush),
        other => Err(other),
    }
}

fn from_uring_op(op: UringOp) -> IoOp {
    match op {
        UringOp::Read { offset, len } => IoOp::Read { offset, len },
        UringOp::Write { offset, data, fua } => IoOp::Write { offset, data, fua },
        UringOp::Flush => IoOp::Flush,
    }
}

/// A request waiting in the switch.
struct Queued {
    op: IoOp,
    done: Completion,
}

struct GimbalState {
    switch: GimbalSwitch<Queued>,
    /// Tenants registered with the switch: a handful, searched on every
    /// submission, so a vector rather than a tree.
    tenants: Vec<u32>,
    /// The latest time handed to the switch: its clock must not go back,
    /// and threads read the clock before they get the lock.
    last_now: Nanos,
    /// When the pacing timer will next poll (`None`: only its idle tick),
    /// as it last computed it; a submission wakes it only to make that
    /// earlier.
    timer_due: Option<Nanos>,
}

impl GimbalState {
    /// `t`, or the latest time already handed to the switch if later.
    fn monotonic(&mut self, t: Nanos) -> Nanos {
        if t > self.last_now {
            self.last_now = t;
        }
        self.last_now
    }
}

/// How a dispatched request reaches the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Runs inline and never blocks (`ram`, `null`): each request is
    /// dispatched, executed and completed in turn on the calling thread
    /// under the lock, so that the switch's dispatch and completion times
    /// enclose the backend call and nothing else.
    Inline,
    /// Books a latency model and completes on a timer (`sim`).
    Untimed,
    /// May block: io_uring or the blocking pool (`file`).
    Blocking,
}

/// The Gimbal switch of one device and the driver that pumps it: requests
/// go in on submit, leave when the switch dispatches them (at once, on a
/// completion, or when the pacing timer fires), and their completions feed
/// the switch back. The lock is never held while a completion callback
/// runs, nor while a backend that is not inline runs.
struct GimbalStage {
    backend: Arc<dyn Backend>,
    state: Mutex<GimbalState>,
    /// The switch's clock (device time since creation).
    clock: SwitchClock,
    /// The backend's `time_scale` (device time per real time), constant.
    time_scale: f64,
    mode: Mode,
    /// The pacing thread, started by the first submission; unparked when
    /// the earliest dispatch time moves earlier (new work arrived while
    /// tokens were short).
    pacer: OnceLock<std::thread::Thread>,
}

type Ready = Vec<(RequestId, Queued)>;

impl GimbalStage {
    fn new(backend: Arc<dyn Backend>, switch: GimbalSwitch<Queued>) -> Self {
        let mode = if backend.untimed().is_some() {
            Mode::Untimed
        } else if backend.may_block() {
            Mode::Blocking
        } else {
            Mode::Inline
        };
        let time_scale = backend.time_scale();
        GimbalStage {
            time_scale,
            clock: SwitchClock::new(time_scale),
            backend,
            state: Mutex::new(GimbalState {
                switch,
                tenants: Vec::new(),
                last_now: Nanos(0),
                timer_due: None,
            }),
            mode,
            pacer: OnceLock::new(),
        }
    }

    /// The switch's clock: the device's time (see `Backend::time_scale`).
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The clock read under the lock, never behind a time already used.
    fn now_locked(&self, st: &mut GimbalState) -> Nanos {
        let t = self.now();
        st.monotonic(t)
    }

    /// Real time to wait for `device_ns` of device time.
    fn real_duration(&self, device_ns: u64) -> Duration {
        Duration::from_nanos((device_ns as f64 * self.time_scale) as u64)
    }

    fn lock(&self) -> MutexGuard<'_, GimbalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn drain(state: &mut GimbalState, now: Nanos) -> Ready {
        let mut ready = Vec::new();
        while let Some(d) = state.switch.poll_dispatch(now) {
            ready.push((d.id, d.payload));
        }
        ready
    }

    /// Takes the lock for a submission of `tenant` (registering it on
    /// its first) and reads the clock under it.
    fn lock_for(self: &Arc<Self>, tenant: u32) -> (MutexGuard<'_, GimbalState>, Nanos) {
        if self.pacer.get().is_none() {
            self.start_pacer();
        }
        let mut st = self.lock();
        if !st.tenants.contains(&tenant) {
            st.tenants.push(tenant);
            // A fresh id is never a duplicate; ignore the impossible.
            let _ = st.switch.add_tenant(TenantId(tenant));
        }
        let now = self.now_locked(&mut st);
        (st, now)
    }

    fn submit(self: &Arc<Self>, tenant: u32, op: IoOp, done: Completion) {
        let (kind, bytes) = kind_and_bytes(&op);
        let (mut st, now) = self.lock_for(tenant);
        if self.mode == Mode::Inline {
            // A batch of one.
            let mut finished = FINISHED.with(|f| f.take());
            self.submit_locked(&mut st, now, tenant, op, done, &mut finished);
            drop(st);
            run_finished(finished);
            return;
        }
        let payload = Queued { op, done };
        if let Err(e) = st
            .switch
            .submit(now, TenantId(tenant), kind, bytes, 0, payload)
        {
            // Only unknown-tenant errors exist here, and the tenant was
            // just added; log rather than lose the request silently.
            log::error!("gimbal switch refused a request: {e}");
            return;
        }
        self.dispatch_from(st, now);
    }

    /// The common inline case, under a lock already held at `now`: the
    /// switch is empty and lets the request straight through
    /// ([`GimbalSwitch::pass_through`]), so it runs and completes here,
    /// and neither the request nor its in-flight entry ever enters the
    /// switch. Returns its completion and the clock read after the
    /// backend call (the next submission's time), or the request back
    /// when it must take the ordinary way (something queued, tokens short,
    /// no slot).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn pass_locked(
        &self,
        st: &mut GimbalState,
        now: Nanos,
        tenant: u32,
        kind: IoKind,
        bytes: u64,
        op: IoOp,
        done: Completion,
    ) -> Result<(Completion, IoDone, Nanos), (IoOp, Completion)> {
        let held = match st
            .switch
            .pass_through(now, TenantId(tenant), kind, bytes, 0)
        {
            Ok(Some(held)) => held,
            // The ordinary way reports an error itself.
            Ok(None) | Err(_) => return Err((op, done)),
        };
        let result = execute(self.backend.as_ref(), op);
        let now = self.now_locked(st);
        let credit = st.switch.complete_held(now, held).credit;
        Ok((
            done,
            IoDone {
                result,
                credit: Some(credit),
            },
            now,
        ))
    }

    /// An inline submission under a lock already held at `now` (the
    /// latest clock read under it): submits, runs what the switch
    /// releases, and returns the latest clock read, which is the next
    /// submission's time. Completions go to `finished`.
    fn submit_locked(
        &self,
        st: &mut GimbalState,
        now: Nanos,
        tenant: u32,
        op: IoOp,
        done: Completion,
        finished: &mut Vec<(Completion, IoDone)>,
    ) -> Nanos {
        let (kind, bytes) = kind_and_bytes(&op);
        let (op, done) = match self.pass_locked(st, now, tenant, kind, bytes, op, done) {
            Ok((done, io, now)) => {
                finished.push((done, io));
                return now;
            }
            Err(back) => back,
        };
        let payload = Queued { op, done };
        match st
            .switch
            .submit_dispatch(now, TenantId(tenant), kind, bytes, 0, payload)
        {
            Ok((_, first)) => {
                self.pump_locked(st, now, first, |done, io| finished.push((done, io)))
            }
            Err(e) => {
                log::error!("gimbal switch refused a request: {e}");
                now
            }
        }
    }

    /// After a poll at `now` that dispatched nothing: wakes the pacing
    /// timer if the switch could dispatch before the timer would poll.
    fn wake_timer_if_needed(&self, st: &mut GimbalState, now: Nanos) {
        // `poll_dispatch` just ran at `now`: this refills nothing and finds
        // the same head request, so it changes no decision.
        let due = st.switch.next_wakeup(now);
        let earlier = match (due, st.timer_due) {
            (Some(due), Some(armed)) => due < armed,
            (Some(_), None) => true,
            // Every queued tenant waits for a slot: a completion frees it.
            (None, _) => false,
        };
        if earlier {
            st.timer_due = due;
            if let Some(pacer) = self.pacer.get() {
                pacer.unpark();
            }
        }
    }

    /// Dispatches what the switch releases at `now` (read under `st`) and
    /// runs it; wakes the pacing timer if nothing went and it must.
    fn dispatch_from<'a>(self: &'a Arc<Self>, mut st: MutexGuard<'a, GimbalState>, now: Nanos) {
        if self.mode == Mode::Inline {
            self.pump_inline(st, now, None);
        } else {
            let ready = Self::drain(&mut st, now);
            if ready.is_empty() {
                self.wake_timer_if_needed(&mut st, now);
            }
            drop(st);
            self.run(ready);
        }
    }

    /// Runs requests on an inline backend one at a time while the switch
    /// releases them: dispatch, execute and complete under one hold of the
    /// lock; the completion callbacks run after it is released. Nothing but
    /// the backend call (no unlock, no wake-up, no callback) lies between
    /// the dispatch and completion times the switch sees, so the host's
    /// scheduling rarely passes for device latency; and since nothing lies
    /// between one request's completion and the next one's dispatch
    /// either, that completion time is the next dispatch time: one clock
    /// read per request.
    ///
    /// `dispatched` is a request the switch already released at `now`
    /// (from `submit_dispatch`); it runs first.
    fn pump_inline<'a>(
        self: &'a Arc<Self>,
        mut st: MutexGuard<'a, GimbalState>,
        now: Nanos,
        dispatched: Option<Dispatched<Queued>>,
    ) {
        // The first finished request, then any others: one request per
        // submission is the common case and needs no allocation.
        let mut first: Option<(Completion, IoDone)> = None;
        let mut rest = Vec::new();
        self.pump_locked(&mut st, now, dispatched, |done, io| {
            if first.is_none() {
                first = Some((done, io));
            } else {
                rest.push((done, io));
            }
        });
        drop(st);
        if let Some((done, io)) = first {
            done.complete(io);
            // Checked first: an empty vector's iterator still costs its
            // drop, and one request per pump is the common case.
            if !rest.is_empty() {
                for (done, io) in rest {
                    done.complete(io);
                }
            }
        }
    }

    /// The loop of [`pump_inline`](Self::pump_inline), under a lock the
    /// caller holds: hands each finished request to `finished` and
    /// returns the latest clock read.
    fn pump_locked(
        &self,
        st: &mut GimbalState,
        mut now: Nanos,
        mut dispatched: Option<Dispatched<Queued>>,
        mut finished: impl FnMut(Completion, IoDone),
    ) -> Nanos {
        loop {
            let Some(d) = dispatched.take().or_else(|| st.switch.poll_dispatch(now)) else {
                self.wake_timer_if_needed(st, now);
                break;
            };
            let result = execute(self.backend.as_ref(), d.payload.op);
            now = self.now_locked(st);
            let credit = Self::complete_locked(st, now, d.id);
            finished(d.payload.done, IoDone { result, credit });
            // Nothing queued: nothing to dispatch (and no timer to arm)
            // until a submission, which polls itself.
            if st.switch.scheduler().queued_len() == 0 {
                break;
            }
        }
        now
    }

    /// Executes dispatched requests on a backend that is not inline;
    /// inline completions feed the worklist instead of recursing.
    fn run(self: &Arc<Self>, mut ready: Ready) {
        while let Some((id, q)) = ready.pop() {
            if let Some(store) = self.backend.untimed() {
                // Booked at once, on the dispatching thread: the model sees
                // the switch's dispatch time, and the completion fires at
                // the modelled instant (give or take the timer's tick).
                let deadline = book(self.backend.as_ref(), &q.op);
                let result = execute(store, q.op);
                if deadline.is_none_or(|d| d <= Instant::now()) {
                    ready.extend(self.complete(id, result, q.done));
                } else {
                    let me = self.clone();
                    complete_at(deadline, move || {
                        let more = me.complete(id, result, q.done);
                        me.run(more);
                    });
                }
            } else {
                let me = self.clone();
                let backend = self.backend.clone();
                run_blocking(
                    backend,
                    q.op,
                    Box::new(move |result| {
                        let more = me.complete(id, result, q.done);
                        me.run(more);
                    }),
                );
            }
        }
    }

    /// Feeds a completion to the switch; the credit to report, if it knew
    /// the request.
    fn complete_locked(st: &mut GimbalState, now: Nanos, id: RequestId) -> Option<u32> {
        match st.switch.complete(now, id) {
            Ok(c) => Some(c.credit),
            Err(e) => {
                log::error!("gimbal switch lost track of request {id:?}: {e}");
                None
            }
        }
    }

    fn complete(
        &self,
        id: RequestId,
        result: io::Result<Cow<'static, [u8]>>,
        done: Completion,
    ) -> Ready {
        let completed_at = self.now();
        let (credit, ready) = {
            let mut st = self.lock();
            let completed_at = st.monotonic(completed_at);
            let credit = Self::complete_locked(&mut st, completed_at, id);
            let now = self.now_locked(&mut st);
            (credit, Self::drain(&mut st, now))
        };
        done.complete(IoDone { result, credit });
        ready
    }
}

/// The pacing thread's poll when nothing is held back: only a submission
/// can change that, and it unparks the thread; this is a safety net, and
/// how soon the thread notices that its pipeline is gone.
const PACER_IDLE_TICK: Duration = Duration::from_millis(100);

/// The shortest pacing sleep (real time).
const PACER_MIN_SLEEP: Duration = Duration::from_micros(20);

impl GimbalStage {
    /// Starts the pacing thread (once). It runs the runtime context of the
    /// caller, so that requests it dispatches may spawn tasks (`sim`
    /// timers, the blocking pool).
    fn start_pacer(self: &Arc<Self>) {
        self.pacer.get_or_init(|| {
            let weak = Arc::downgrade(self);
            let rt = tokio::runtime::Handle::try_current().ok();
            std::thread::Builder::new()
                .name("gimbal-target-pacer".into())
                .spawn(move || pacer(weak, rt))
                .expect("spawn the gimbal pacing thread")
                .thread()
                .clone()
        });
    }
}

/// Dispatches what the token buckets held back, when they allow it, until
/// the pipeline is dropped. A thread of its own rather than a runtime
/// timer: tokio's timer ticks in milliseconds, and a switch pacing 4 KiB
/// requests at GB/s must release them every few microseconds, or it runs
/// far below the rate it set (with a bucket of 64 requests, one tick per
/// millisecond caps it at 64 k IOPS).
fn pacer(weak: Weak<GimbalStage>, rt: Option<tokio::runtime::Handle>) {
    let _context = rt.as_ref().map(tokio::runtime::Handle::enter);
    loop {
        let wait = {
            let Some(g) = weak.upgrade() else { return };
            let mut st = g.lock();
            let now = g.now_locked(&mut st);
            let next = st.switch.next_wakeup(now);
            st.timer_due = next;
            next.map_or(PACER_IDLE_TICK, |t| {
                g.real_duration(t.nanos_since(now)).max(PACER_MIN_SLEEP)
            })
        };
        std::thread::park_timeout(wait);
        let Some(g) = weak.upgrade() else { return };
        let mut st = g.lock();
        let now = g.now_locked(&mut st);
        // Awake: it recomputes its due time before it sleeps again.
        st.timer_due = Some(now);
        g.dispatch_from(st, now);
    }
}

/// Books `op` on a latency-modelling backend (see [`Backend::untimed`]);
/// `None` when it moves no data or the backend models nothing.
fn book(backend: &dyn Backend, op: &IoOp) -> Option<Instant> {
    let (kind, offset, bytes) = match op {
        IoOp::Read { offset, len } => (IoKind::Read, *offset, *len as u64),
        IoOp::Write { offset, data, .. } => (IoKind::Write, *offset, data.len() as u64),
        // As the sim backend books a direct call: one slot's worth.
        IoOp::WriteZeroes { offset, len } => (IoKind::Write, *offset, (*len).min(128 * 1024)),
        IoOp::Flush | IoOp::Discard { .. } => return None,
    };
    backend.book(kind, offset, bytes)
}

/// Runs `f` at `deadline` on a runtime timer (at once if it has passed or
/// is `None`). Must be called within a tokio runtime when it must wait.
fn complete_at(deadline: Option<Instant>, f: impl FnOnce() + Send + 'static) {
    match deadline {
        Some(d) if d > Instant::now() => {
            tokio::spawn(async move {
                tokio::time::sleep_until(d.into()).await;
                f()
            });
        }
        _ => f(),
    }
}

/// The switch's view of a request: its kind and its size.
fn kind_and_bytes(op: &IoOp) -> (IoKind, u64) {
    let kind = if op.is_write() {
        IoKind::Write
    } else {
        IoKind::Read
    };
    (kind, op.transfer_bytes())
}

/// Runs one request against a backend.
pub fn execute(backend: &dyn Backend, op: IoOp) -> io::Result<Cow<'static, [u8]>> {
    const NONE: Cow<'static, [u8]> = Cow::Borrowed(&[]);
    match op {
        IoOp::Read { offset, len } => backend.read_to_buffer(offset, len),
        IoOp::Write { offset, data, fua } => backend.write(offset, &data, fua).map(|_| NONE),
        IoOp::Flush => backend.flush().map(|_| NONE),
        IoOp::WriteZeroes { offset, len } => backend.write_zeroes(offset, len).map(|_| NONE),
        IoOp::Discard { ranges } => {
            for (offset, len) in ranges {
                backend.discard(offset, len)?;
            }
            Ok(NONE)
        }
    }
}
