//! The Gimbal stage: one device's storage switch (`qos_core`'s
//! [`GimbalSwitch`]) and the driver that pumps it, including the pacing
//! thread that releases what the token buckets held back (see the
//! [module](super) documentation).

use std::borrow::Cow;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use qos_core::scheduler::Dispatched;
use qos_core::switch::GimbalSwitch;
use qos_core::time::Nanos;
use qos_core::types::{IoKind, RequestId, TenantId};

use super::clock::SwitchClock;
use super::{
    book, complete_at, execute, run_blocking, run_finished, Completion, IoDone, IoOp, FINISHED,
};
use crate::backend::Backend;

/// A request waiting in the switch.
pub(super) struct Queued {
    op: IoOp,
    done: Completion,
}

pub(super) struct GimbalState {
    pub(super) switch: GimbalSwitch<Queued>,
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
pub(super) enum Mode {
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
pub(super) struct GimbalStage {
    backend: Arc<dyn Backend>,
    state: Mutex<GimbalState>,
    /// The switch's clock (device time since creation).
    clock: SwitchClock,
    /// The backend's `time_scale` (device time per real time), constant.
    time_scale: f64,
    pub(super) mode: Mode,
    /// The pacing thread, started by the first submission; unparked when
    /// the earliest dispatch time moves earlier (new work arrived while
    /// tokens were short).
    pacer: OnceLock<std::thread::Thread>,
}

type Ready = Vec<(RequestId, Queued)>;

impl GimbalStage {
    pub(super) fn new(backend: Arc<dyn Backend>, switch: GimbalSwitch<Queued>) -> Self {
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
    pub(super) fn now_locked(&self, st: &mut GimbalState) -> Nanos {
        let t = self.now();
        st.monotonic(t)
    }

    /// Real time to wait for `device_ns` of device time.
    fn real_duration(&self, device_ns: u64) -> Duration {
        Duration::from_nanos((device_ns as f64 * self.time_scale) as u64)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, GimbalState> {
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
    pub(super) fn lock_for(self: &Arc<Self>, tenant: u32) -> (MutexGuard<'_, GimbalState>, Nanos) {
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

    pub(super) fn submit(self: &Arc<Self>, tenant: u32, op: IoOp, done: Completion) {
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
    pub(super) fn submit_locked(
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

/// The switch's view of a request: its kind and its size.
fn kind_and_bytes(op: &IoOp) -> (IoKind, u64) {
    let kind = if op.is_write() {
        IoKind::Write
    } else {
        IoKind::Read
    };
    (kind, op.transfer_bytes())
}
