//! The class stage: arbitration between NVMe priority classes in front of
//! the switch or the backend (see the [module](super) documentation).
//!
//! Once `device_queue_depth` arbitrated requests are outstanding below
//! this stage, further ones wait in a `qos_core` [`ClassArbiter`]; each
//! completion releases the next.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use qos_core::class_arbiter::ClassArbiter;
use qos_core::time::Nanos;

use super::gimbal::GimbalStage;
use super::{run_direct, ClassTag, Completion, IoOp};
use crate::backend::Backend;

/// A request waiting in the class arbiter.
pub(super) struct Held {
    tenant: u32,
    op: IoOp,
    done: Completion,
}

pub(super) struct ClassState {
    /// Created by the first arbitrated request; its configuration follows
    /// the latest submitter's (controllers sharing a namespace with
    /// different weights: the last one to submit sets them).
    pub(super) arbiter: Option<ClassArbiter<Held>>,
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
pub(super) struct ClassStage {
    backend: Arc<dyn Backend>,
    gimbal: Option<Arc<GimbalStage>>,
    state: Mutex<ClassState>,
    /// The arbiter's clock (aging) is real time since this instant.
    epoch: Instant,
}

impl ClassStage {
    pub(super) fn new(backend: Arc<dyn Backend>, gimbal: Option<Arc<GimbalStage>>) -> Arc<Self> {
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

    pub(super) fn lock(&self) -> MutexGuard<'_, ClassState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    pub(super) fn submit(self: &Arc<Self>, tenant: u32, tag: ClassTag, op: IoOp, done: Completion) {
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
                    {
                        let mut st = me.lock();
                        debug_assert!(st.outstanding > 0, "each release completes once");
                        st.outstanding -= 1;
                    }
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
