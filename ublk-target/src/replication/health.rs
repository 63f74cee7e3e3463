//! The health of a replicated volume's replicas as a pure state machine
//! ([`ReplicaHealth`]): which replicas take writes, which serve reads,
//! when a failed one may be reconnected. The caller passes `now` and path events; nothing here
//! reads a clock or does I/O.
//!
//! ```text
//!            path failed                 fence passed (tick)
//!   InSync ──────────────► Fencing{until} ─────────────► Failed{since}
//!     ▲                      │  ▲  path failed again        │
//!     │ resync done          │  └───────────────────────────┤
//!     │                      │ (reconnect refused           │ path reconnected
//!   Resyncing ◄──────────────┴── before `until`) ◄──────────┘ (new association)
//!     │ path failed → Fencing
//! ```
//!
//! - Writes go to every `InSync` and `Resyncing` replica; reads only to an
//!   `InSync` one whose path is up. The volume is degraded while any
//!   replica is not `InSync`.
//! - The last `InSync` replica never leaves `InSync` on a path failure: no
//!   other replica has newer data, so marking it out of sync would leave
//!   the volume without a source. Its path is down, and I/O is held and
//!   retried (or failed) by the reconnect policy, as for a one-target
//!   volume ([`FailOutcome::LastInSync`]). I/O is refused only when no
//!   replica is `InSync` at all (which only a start from such a log can
//!   produce).
//!
//! # The fence: why a write of unknown outcome cannot land late
//!
//! When a replica's path fails with writes outstanding, their outcome is
//! unknown: each may have landed, may never land, or may still sit at the
//! target (in its socket buffers, its queues, its backend) and land later.
//! If it landed *after* a newer write to the same blocks, the replica
//! would silently hold stale data. [`ReplicaHealth`] prevents that with
//! three rules:
//!
//! 1. The engine records the regions of those writes as missed (the
//!    intent log), like any write the replica does not get while out of
//!    sync, so resync copies them again.
//! 2. The replica is not reconnected (no new association, hence no newer
//!    write and no copy) before `fence_until = last_command_at +
//!    keep_alive + command_timeout (+ slack)`. The target's keep-alive
//!    timer restarts at each command it receives, none of which it can
//!    receive after the last one we sent (the old connection is closed, so
//!    nothing more arrives on it): `keep_alive` after that, the target
//!    declares the host gone and tears the controller down. A command it
//!    had already started is bounded by the target's own command timeout
//!    (NVMe 2.1 calls it the Command Quiesce Time, CQT, in Identify
//!    Controller; the kernel host waits KATO + CQT before retrying a
//!    command on another path, the same bound). So at `fence_until`, every
//!    write of the old association has landed or never will.
//! 3. Newer user writes and resync copies reach the replica only over the
//!    new association, i.e. after `fence_until`. The last write to any
//!    block of the replica is therefore a newer one: a copy of the current
//!    data or a user write that also reached the in-sync replicas.
//!
//! Assumptions, stated: the engine closes (resets) the failed connection
//! when it declares the path failed and passes the instant of the last
//! command it sent on it (or the close, if later); the target honours its
//! keep-alive timeout and its command bound; packets are not held in the
//! network longer than `slack`. A target with no command bound (a backend
//! that can hang forever) cannot be fenced by time; NVMe reservations
//! (preempt and abort) would be the stronger tool.

use qos_core::replica::ReplicaSelector;
use qos_core::Nanos;
use std::time::Duration;

/// The times the fence is made of (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceTimes {
    /// The Keep Alive timeout of the association (KATO, as proposed in
    /// Connect).
    pub keep_alive: Duration,
    /// The target's bound on a command it has started (its CQT, or the
    /// configured command timeout of the target).
    pub target_command_timeout: Duration,
    /// Margin for timer granularity and network delay.
    pub slack: Duration,
}

impl FenceTimes {
    /// The fence after the last command sent at `last_command_at`.
    pub fn fence_until(&self, last_command_at: Nanos) -> Nanos {
        last_command_at + self.keep_alive + self.target_command_timeout + self.slack
    }
}

/// A replica's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Holds every acknowledged write; takes writes and serves reads.
    InSync,
    /// Its path failed; no reconnect before `until` (the fence).
    Fencing {
        /// When the path failed.
        since: Nanos,
        /// The earliest instant a new association may be made.
        until: Nanos,
    },
    /// Its path failed and the fence has passed: it may be reconnected.
    Failed {
        /// When the path failed.
        since: Nanos,
    },
    /// Reconnected and being copied to; takes writes, serves no reads.
    Resyncing {
        /// When it was reconnected.
        since: Nanos,
    },
}

/// What a path failure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// The replica is now out of sync: record its outstanding writes in the
    /// intent log (with its state), complete them on the others, drop its
    /// resync if one ran, and reconnect no earlier than `fence_until`.
    OutOfSync {
        /// The fence.
        fence_until: Nanos,
    },
    /// It is the last in-sync replica: it stays in sync; hold its I/O and
    /// reconnect as for a one-target volume (no earlier than
    /// `fence_until`), then redo the held writes.
    LastInSync {
        /// The fence.
        fence_until: Nanos,
    },
    /// It was already out of sync (a reconnect attempt failed); the fence
    /// is extended if commands were sent.
    AlreadyOut {
        /// The fence.
        fence_until: Nanos,
    },
}

/// What a reconnect did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnected {
    /// An out-of-sync replica is back: start its resync; it takes writes
    /// from now on.
    StartResync,
    /// The last in-sync replica is back: resubmit its held I/O.
    Resume,
}

/// Errors of [`ReplicaHealth`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaHealthError {
    /// No such replica.
    #[error("no replica {0}")]
    Unknown(usize),
    /// A reconnect before the fence (an engine bug: it must ask first).
    #[error(
        "replica {replica}: reconnected {early_ns} ns before its fence; a write of the old \
         association could still land after newer ones"
    )]
    BeforeFence {
        /// The replica.
        replica: usize,
        /// How early.
        early_ns: u64,
    },
    /// An event that does not apply in the replica's state.
    #[error("replica {replica}: {event} while {state:?}")]
    Unexpected {
        /// The replica.
        replica: usize,
        /// The event.
        event: &'static str,
        /// Its state.
        state: ReplicaState,
    },
    /// No replica is in sync: nothing can serve I/O.
    #[error(
        "no replica is in sync: the volume cannot serve I/O (every replica missed writes; \
         the write-intent log says which)"
    )]
    NoneInSync,
}

#[derive(Debug, Clone, Copy)]
struct Replica {
    state: ReplicaState,
    /// Whether its path is up (only ever false while `InSync` for the last
    /// in-sync replica; the other states imply it).
    path_up: bool,
    fence_until: Nanos,
}

/// The health state of each replica of a volume (see the module docs).
#[derive(Debug, Clone)]
pub struct ReplicaHealth {
    replicas: Vec<Replica>,
    fence: FenceTimes,
}

impl ReplicaHealth {
    /// A set starting from the intent log's record (`in_sync[i]`). A
    /// replica recorded out of sync starts `Fencing` from `now` unless the
    /// previous run shut down cleanly: a crashed predecessor may have left
    /// writes of unknown outcome on it, sent at the latest now.
    pub fn new(in_sync: &[bool], fence: FenceTimes, now: Nanos, previous_run_clean: bool) -> Self {
        let replicas = in_sync
            .iter()
            .map(|&s| {
                if s {
                    Replica {
                        state: ReplicaState::InSync,
                        path_up: true,
                        fence_until: Nanos::ZERO,
                    }
                } else if previous_run_clean {
                    Replica {
                        state: ReplicaState::Failed { since: now },
                        path_up: false,
                        fence_until: now,
                    }
                } else {
                    let until = fence.fence_until(now);
                    Replica {
                        state: ReplicaState::Fencing { since: now, until },
                        path_up: false,
                        fence_until: until,
                    }
                }
            })
            .collect();
        ReplicaHealth { replicas, fence }
    }

    /// Replicas, by index.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether there is no replica.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// The fence times in use.
    pub fn fence_times(&self) -> FenceTimes {
        self.fence
    }

    fn get(&self, r: usize) -> Result<&Replica, ReplicaHealthError> {
        self.replicas.get(r).ok_or(ReplicaHealthError::Unknown(r))
    }

    /// The state of replica `r`.
    pub fn state(&self, r: usize) -> Result<ReplicaState, ReplicaHealthError> {
        Ok(self.get(r)?.state)
    }

    /// Moves every `Fencing` replica whose fence has passed to `Failed`.
    pub fn tick(&mut self, now: Nanos) {
        for rep in &mut self.replicas {
            if let ReplicaState::Fencing { since, until } = rep.state {
                if now >= until {
                    rep.state = ReplicaState::Failed { since };
                }
            }
        }
    }

    fn in_sync_count(&self) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.state == ReplicaState::InSync)
            .count()
    }

    /// Replica `r`'s path failed at `now`; the last command sent on it left
    /// at `last_command_at` (`None`: none was ever sent on it).
    pub fn on_path_failed(
        &mut self,
        r: usize,
        now: Nanos,
        last_command_at: Option<Nanos>,
    ) -> Result<FailOutcome, ReplicaHealthError> {
        let in_sync = self.in_sync_count();
        let fence = self.fence;
        let rep = self
            .replicas
            .get_mut(r)
            .ok_or(ReplicaHealthError::Unknown(r))?;
        if let Some(t) = last_command_at {
            rep.fence_until = rep.fence_until.max(fence.fence_until(t));
        }
        let until = rep.fence_until;
        Ok(match rep.state {
            ReplicaState::InSync if in_sync == 1 => {
                rep.path_up = false;
                FailOutcome::LastInSync { fence_until: until }
            }
            ReplicaState::InSync | ReplicaState::Resyncing { .. } => {
                rep.path_up = false;
                rep.state = if now >= until {
                    ReplicaState::Failed { since: now }
                } else {
                    ReplicaState::Fencing { since: now, until }
                };
                FailOutcome::OutOfSync { fence_until: until }
            }
            ReplicaState::Fencing { since, .. } | ReplicaState::Failed { since } => {
                rep.state = if now >= until {
                    ReplicaState::Failed { since }
                } else {
                    ReplicaState::Fencing { since, until }
                };
                FailOutcome::AlreadyOut { fence_until: until }
            }
        })
    }

    /// Whether replica `r` may be reconnected (a new association) at `now`;
    /// `Err(t)`: not before `t`.
    pub fn reconnect_allowed(&self, r: usize, now: Nanos) -> Result<(), Nanos> {
        match self.replicas.get(r) {
            Some(rep) if now < rep.fence_until => Err(rep.fence_until),
            _ => Ok(()),
        }
    }

    /// Replica `r` has a new association, made at `now`.
    pub fn on_path_reconnected(
        &mut self,
        r: usize,
        now: Nanos,
    ) -> Result<Reconnected, ReplicaHealthError> {
        let rep = self
            .replicas
            .get_mut(r)
            .ok_or(ReplicaHealthError::Unknown(r))?;
        if now < rep.fence_until {
            return Err(ReplicaHealthError::BeforeFence {
                replica: r,
                early_ns: rep.fence_until.nanos_since(now),
            });
        }
        match rep.state {
            ReplicaState::Fencing { .. } | ReplicaState::Failed { .. } => {
                rep.state = ReplicaState::Resyncing { since: now };
                rep.path_up = true;
                Ok(Reconnected::StartResync)
            }
            ReplicaState::InSync if !rep.path_up => {
                rep.path_up = true;
                Ok(Reconnected::Resume)
            }
            state => Err(ReplicaHealthError::Unexpected {
                replica: r,
                event: "path reconnected",
                state,
            }),
        }
    }

    /// Replica `r`'s resync finished (every region clean, the clears and
    /// its in-sync state recorded): it serves reads again.
    pub fn on_resync_done(&mut self, r: usize) -> Result<(), ReplicaHealthError> {
        let rep = self
            .replicas
            .get_mut(r)
            .ok_or(ReplicaHealthError::Unknown(r))?;
        match rep.state {
            ReplicaState::Resyncing { .. } => {
                rep.state = ReplicaState::InSync;
                Ok(())
            }
            state => Err(ReplicaHealthError::Unexpected {
                replica: r,
                event: "resync done",
                state,
            }),
        }
    }

    /// Whether replica `r` receives writes: `InSync` or `Resyncing`. (The
    /// last in-sync replica with its path down still does: its writes are
    /// held for the reconnect.)
    pub fn takes_writes(&self, r: usize) -> bool {
        self.replicas.get(r).is_some_and(|rep| {
            matches!(
                rep.state,
                ReplicaState::InSync | ReplicaState::Resyncing { .. }
            )
        })
    }

    /// Whether replica `r` may serve a read: `InSync` with its path up.
    pub fn serves_reads(&self, r: usize) -> bool {
        self.replicas
            .get(r)
            .is_some_and(|rep| rep.state == ReplicaState::InSync && rep.path_up)
    }

    /// The replicas that receive writes, ascending.
    pub fn write_targets(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.replicas.len()).filter(|&r| self.takes_writes(r))
    }

    /// The replicas that miss writes (record them in the intent log).
    pub fn missing_writes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.replicas.len()).filter(|&r| !self.takes_writes(r))
    }

    /// Whether any replica is not `InSync`.
    pub fn is_degraded(&self) -> bool {
        self.in_sync_count() < self.replicas.len()
    }

    /// `Ok` while some replica is `InSync` (I/O may be served, or held for
    /// its reconnect); otherwise the error to fail I/O with.
    pub fn check_io(&self) -> Result<(), ReplicaHealthError> {
        if self.in_sync_count() > 0 {
            Ok(())
        } else {
            Err(ReplicaHealthError::NoneInSync)
        }
    }

    /// Tells the read selector which replicas may serve reads.
    pub fn apply_to_selector(&self, selector: &mut ReplicaSelector) {
        for r in 0..self.replicas.len() {
            // The selector has one entry per replica (built from the same
            // config), so the index exists.
            let _ = selector.set_in_sync(r, self.serves_reads(r));
        }
    }
}

/// What a replica's namespace reports, for [`check_same_geometry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaGeometry {
    /// How to name it in an error (e.g. `address:port subnqn nsid N`).
    pub name: String,
    /// Namespace size in bytes.
    pub size_bytes: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
}

/// Replicas that differ in size or block size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "replicas differ in {what}: replica {first} ({first_name}) has {first_value}, replica \
     {other} ({other_name}) has {other_value}; every replica of a volume must have the same \
     size and block size (resize or reformat the namespace that differs)"
)]
pub struct GeometryMismatch {
    /// `size` or `block size`.
    pub what: &'static str,
    /// Index of the first replica.
    pub first: usize,
    /// Its name.
    pub first_name: String,
    /// Its value, with unit.
    pub first_value: String,
    /// Index of the differing replica.
    pub other: usize,
    /// Its name.
    pub other_name: String,
    /// Its value, with unit.
    pub other_value: String,
}

impl From<Box<GeometryMismatch>> for crate::Error {
    fn from(e: Box<GeometryMismatch>) -> Self {
        crate::Error::Usage(e.to_string())
    }
}

/// Checks that every replica has replica 0's size and block size; the
/// error (boxed: it is large and rare) names both replicas and both values.
pub fn check_same_geometry(replicas: &[ReplicaGeometry]) -> Result<(), Box<GeometryMismatch>> {
    let Some(first) = replicas.first() else {
        return Ok(());
    };
    for (i, r) in replicas.iter().enumerate().skip(1) {
        let differs = if r.block_size != first.block_size {
            Some((
                "block size",
                format!("{} bytes", first.block_size),
                format!("{} bytes", r.block_size),
            ))
        } else if r.size_bytes != first.size_bytes {
            Some((
                "size",
                format!("{} bytes", first.size_bytes),
                format!("{} bytes", r.size_bytes),
            ))
        } else {
            None
        };
        if let Some((what, first_value, other_value)) = differs {
            return Err(Box::new(GeometryMismatch {
                what,
                first: 0,
                first_name: first.name.clone(),
                first_value,
                other: i,
                other_name: r.name.clone(),
                other_value,
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use qos_core::replica::ReplicaPolicy;

    fn fence() -> FenceTimes {
        FenceTimes {
            keep_alive: Duration::from_secs(5),
            target_command_timeout: Duration::from_secs(30),
            slack: Duration::from_secs(1),
        }
    }

    fn s(secs: u64) -> Nanos {
        Nanos::from_secs(secs)
    }

    #[test]
    fn fail_fence_reconnect_resync_rejoin() {
        let mut set = ReplicaHealth::new(&[true, true], fence(), s(0), true);
        assert!(!set.is_degraded());
        assert_eq!(set.write_targets().collect::<Vec<_>>(), [0, 1]);

        let out = set.on_path_failed(1, s(100), Some(s(98))).unwrap();
        assert_eq!(
            out,
            FailOutcome::OutOfSync {
                fence_until: s(134)
            }
        );
        assert!(set.is_degraded());
        assert_eq!(
            set.state(1).unwrap(),
            ReplicaState::Fencing {
                since: s(100),
                until: s(134)
            }
        );
        assert_eq!(set.write_targets().collect::<Vec<_>>(), [0]);
        assert_eq!(set.missing_writes().collect::<Vec<_>>(), [1]);
        assert!(!set.serves_reads(1) && set.serves_reads(0));
        assert!(set.check_io().is_ok());

        // Not before the fence, however the engine tries.
        assert_eq!(set.reconnect_allowed(1, s(133)), Err(s(134)));
        assert_eq!(
            set.on_path_reconnected(1, s(120)),
            Err(ReplicaHealthError::BeforeFence {
                replica: 1,
                early_ns: 14_000_000_000
            })
        );
        set.tick(s(133));
        assert!(matches!(set.state(1), Ok(ReplicaState::Fencing { .. })));
        set.tick(s(134));
        assert_eq!(set.state(1), Ok(ReplicaState::Failed { since: s(100) }));
        assert_eq!(set.reconnect_allowed(1, s(134)), Ok(()));

        assert_eq!(
            set.on_path_reconnected(1, s(140)),
            Ok(Reconnected::StartResync)
        );
        assert_eq!(set.state(1), Ok(ReplicaState::Resyncing { since: s(140) }));
        assert!(set.takes_writes(1) && !set.serves_reads(1));
        assert!(set.is_degraded());
        set.on_resync_done(1).unwrap();
        assert!(set.serves_reads(1) && !set.is_degraded());
        assert!(set.on_resync_done(1).is_err());
    }

    #[test]
    fn the_last_in_sync_replica_stays_in_sync() {
        let mut set = ReplicaHealth::new(&[true, true], fence(), s(0), true);
        set.on_path_failed(0, s(10), Some(s(10))).unwrap();
        let out = set.on_path_failed(1, s(20), Some(s(19))).unwrap();
        assert_eq!(out, FailOutcome::LastInSync { fence_until: s(55) });
        assert_eq!(set.state(1), Ok(ReplicaState::InSync));
        assert!(set.check_io().is_ok(), "held, not refused");
        assert!(set.takes_writes(1) && !set.serves_reads(1));
        // Replica 0 coming back cannot serve: it resyncs from replica 1.
        set.tick(s(46));
        assert_eq!(
            set.on_path_reconnected(0, s(46)),
            Ok(Reconnected::StartResync)
        );
        assert!(set.on_path_reconnected(1, s(50)).is_err());
        assert_eq!(set.on_path_reconnected(1, s(55)), Ok(Reconnected::Resume));
        assert!(set.serves_reads(1));
        assert!(set.on_path_reconnected(1, s(56)).is_err(), "not down");
    }

    #[test]
    fn a_resyncing_replica_that_fails_is_fenced_again() {
        let mut set = ReplicaHealth::new(&[true, false], fence(), s(0), true);
        assert_eq!(set.state(1), Ok(ReplicaState::Failed { since: s(0) }));
        set.on_path_reconnected(1, s(1)).unwrap();
        let out = set.on_path_failed(1, s(5), Some(s(4))).unwrap();
        assert_eq!(out, FailOutcome::OutOfSync { fence_until: s(40) });
        // A failed reconnect attempt with a command sent extends the fence.
        let out = set.on_path_failed(1, s(41), Some(s(41))).unwrap();
        assert_eq!(out, FailOutcome::AlreadyOut { fence_until: s(77) });
        // Without one it does not.
        let out = set.on_path_failed(1, s(78), None).unwrap();
        assert_eq!(out, FailOutcome::AlreadyOut { fence_until: s(77) });
        assert_eq!(set.state(1), Ok(ReplicaState::Failed { since: s(5) }));
    }

    #[test]
    fn after_an_unclean_stop_out_of_sync_replicas_are_fenced() {
        let set = ReplicaHealth::new(&[true, false], fence(), s(7), false);
        assert_eq!(set.reconnect_allowed(1, s(7)), Err(s(43)));
        assert_eq!(set.reconnect_allowed(0, s(7)), Ok(()));
    }

    #[test]
    fn no_replica_in_sync_refuses_io() {
        let set = ReplicaHealth::new(&[false, false], fence(), s(0), true);
        assert_eq!(set.check_io(), Err(ReplicaHealthError::NoneInSync));
        assert_eq!(set.write_targets().count(), 0);
        assert!(set
            .check_io()
            .unwrap_err()
            .to_string()
            .contains("no replica"));
    }

    #[test]
    fn the_selector_follows_the_set() {
        let mut set = ReplicaHealth::new(&[true, true, true], fence(), s(0), true);
        let mut sel = ReplicaSelector::new(ReplicaPolicy::RoundRobin, 3);
        set.on_path_failed(1, s(1), Some(s(1))).unwrap();
        set.apply_to_selector(&mut sel);
        let picks: Vec<_> = (0..4).map(|_| sel.select_read().unwrap()).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
    }

    #[test]
    fn geometry_mismatch_names_both_replicas_and_values() {
        let g = |name: &str, size, bs| ReplicaGeometry {
            name: name.into(),
            size_bytes: size,
            block_size: bs,
        };
        assert!(check_same_geometry(&[]).is_ok());
        assert!(check_same_geometry(&[g("a", 1 << 30, 512), g("b", 1 << 30, 512)]).is_ok());
        let e = check_same_geometry(&[
            g("10.0.0.1:4420 nqn.a nsid 1", 1 << 30, 512),
            g("b", 1 << 30, 512),
            g("10.0.0.3:4420 nqn.c nsid 1", 2 << 30, 512),
        ])
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("replica 0 (10.0.0.1:4420 nqn.a nsid 1) has 1073741824 bytes"),
            "{s}"
        );
        assert!(
            s.contains("replica 2 (10.0.0.3:4420 nqn.c nsid 1) has 2147483648 bytes"),
            "{s}"
        );
        assert!(s.starts_with("replicas differ in size"), "{s}");
        let e = check_same_geometry(&[g("a", 1 << 30, 512), g("b", 1 << 30, 4096)]).unwrap_err();
        assert_eq!(e.what, "block size");
        assert!(e.to_string().contains("has 4096 bytes"), "{e}");
        let as_crate: crate::Error = e.into();
        assert!(as_crate.to_string().contains("block size"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Under any sequence of failures, ticks, (allowed) reconnects and
        /// resync completions: no reconnect ever succeeds before a fence
        /// covering every command sent on the old path; reads go only to
        /// in-sync replicas with a path; writes reach every replica that
        /// serves reads; and some replica stays in sync.
        #[test]
        fn fence_and_sync_invariants(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 0u64..50_000), 1..200),
        ) {
            let f = fence();
            let mut set = ReplicaHealth::new(&[true, true, true], f, Nanos(0), true);
            let mut now = Nanos(0);
            let mut last_cmd: [Option<Nanos>; 3] = [None; 3];
            for (op, r, dt_ms) in ops {
                now += Duration::from_millis(dt_ms);
                match op {
                    0 => {
                        let sent = Nanos(now.as_nanos().saturating_sub(dt_ms * 1000));
                        last_cmd[r] = last_cmd[r].max(Some(sent));
                        set.on_path_failed(r, now, Some(sent)).unwrap();
                    }
                    1 => set.tick(now),
                    2 => {
                        let allowed = set.reconnect_allowed(r, now).is_ok();
                        let result = set.on_path_reconnected(r, now);
                        if result.is_ok() {
                            prop_assert!(allowed);
                            prop_assert!(last_cmd[r].is_none_or(|t| now >= f.fence_until(t)));
                        }
                        if !allowed {
                            let is_before_fence = matches!(result, Err(ReplicaHealthError::BeforeFence { .. }));
                            prop_assert!(is_before_fence);
                        }
                    }
                    _ => { let _ = set.on_resync_done(r); }
                }
                prop_assert!(set.check_io().is_ok());
                for i in 0..3 {
                    if set.serves_reads(i) {
                        prop_assert_eq!(set.state(i).unwrap(), ReplicaState::InSync);
                        prop_assert!(set.takes_writes(i));
                    }
                    if let ReplicaState::Fencing { until, .. } = set.state(i).unwrap() {
                        prop_assert!(set.reconnect_allowed(i, Nanos(until.as_nanos() - 1)).is_err());
                    }
                }
            }
        }
    }
}
