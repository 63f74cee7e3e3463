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
//! the rest wait in the namespace's
//! [`ClassArbiter`](qos_core::class_arbiter::ClassArbiter) (urgent strictly
//! first, then WRR by commands or DRR by bytes with the controller's
//! weights and burst, aging so nothing starves) and are released one by one
//! as earlier ones complete. The per-tenant Gimbal scheduler thus sees the
//! classes' shares, as the per-tenant priority queues of the Gimbal paper
//! (§3.5) would give them. Without a `device_queue_depth` nothing ever
//! waits, so the arbiter is skipped: the classes cannot matter if the
//! device takes every request at once. Round-robin requests (no tag),
//! flushes and deallocates never wait here and are not counted.
//!
//! A request passes up to three stages, one file each: the class stage
//! (`class.rs`, only for arbitrated requests), the Gimbal stage
//! (`gimbal.rs`: the switch, its pacing thread, and its clock in
//! [`clock`]; only with `qos = "gimbal"`), then the backend, run from this
//! file (inline, completed on a timer at a modelled instant, or on an
//! engine that may block).

mod class;
pub mod clock;
mod gimbal;

use std::borrow::Cow;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use qos_core::class_arbiter::{ArbiterConfig, QueueId};
use qos_core::config::GimbalConfig;
use qos_core::error::QosError;
use qos_core::priority::NvmeClass;
use qos_core::switch::{GimbalSwitch, VirtualView};
use qos_core::time::Nanos;
use qos_core::types::{IoKind, TenantId};

use crate::backend::{Backend, UringDone, UringOp};
use class::ClassStage;
use gimbal::{GimbalStage, GimbalState, Mode};

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

/// Names of [`PipelineCounters::requests`]' entries, in index order.
pub const OP_NAMES: [&str; 5] = ["read", "write", "write_zeroes", "flush", "discard"];

/// Names of [`PipelineCounters::class_requests`]' entries, in index order:
/// the NVMe classes of arbitrating controllers, then `none` for requests
/// of round-robin controllers (which carry no class).
pub const CLASS_NAMES: [&str; 5] = ["urgent", "high", "medium", "low", "none"];

/// What a namespace's pipeline was given, counted as each request enters
/// it (the only per-namespace I/O counters the target keeps; exported by
/// `/metrics`). Relaxed adds: no order with anything else is needed.
#[derive(Debug, Default)]
pub struct PipelineCounters {
    /// Requests per operation ([`OP_NAMES`]).
    pub requests: [AtomicU64; 5],
    /// Bytes per operation ([`IoOp::transfer_bytes`]; zero for flush
    /// and discard).
    pub bytes: [AtomicU64; 5],
    /// Requests per class ([`CLASS_NAMES`]).
    pub class_requests: [AtomicU64; 5],
}

impl PipelineCounters {
    fn count(&self, class: Option<&ClassTag>, op: &IoOp) {
        let i = match op {
            IoOp::Read { .. } => 0,
            IoOp::Write { .. } => 1,
            IoOp::WriteZeroes { .. } => 2,
            IoOp::Flush => 3,
            IoOp::Discard { .. } => 4,
        };
        self.requests[i].fetch_add(1, Ordering::Relaxed);
        self.bytes[i].fetch_add(op.transfer_bytes(), Ordering::Relaxed);
        let c = class.map_or(4, |t| t.class.index());
        self.class_requests[c].fetch_add(1, Ordering::Relaxed);
    }
}

/// One namespace's pipeline.
pub struct Pipeline {
    backend: Arc<dyn Backend>,
    gimbal: Option<Arc<GimbalStage>>,
    classes: Arc<ClassStage>,
    counters: PipelineCounters,
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
            counters: PipelineCounters::default(),
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
            counters: PipelineCounters::default(),
        })
    }

    /// The backend behind this pipeline.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Requests given to this pipeline so far, by operation and class.
    pub fn counters(&self) -> &PipelineCounters {
        &self.counters
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
        self.counters.count(class.as_ref(), &op);
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
            self.counters.count(class.as_ref(), &op);
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
