//! Controller recovery policy, as the Linux host has it: after a reset,
//! reconnect every `reconnect_delay` until `ctrl_loss_tmo`; pending I/O is
//! requeued for the new connection, or failed once `fast_io_fail_tmo` has
//! passed (reconnecting goes on), or when the controller is given up.
//!
//! [`Recovery`] is pure: it takes `now`, logs each transition once (not per
//! I/O), and tells its driver when to try, and what to do with I/O.
//!
//! ```text
//!   Live ──failure──► Reconnecting ──attempt ok──► Live
//!                        │  ▲  attempt failed (retry after reconnect_delay)
//!                        │  └──┘
//!                        └── ctrl_loss_tmo passed, or a permanent error ──► Lost
//! ```

use std::time::{Duration, Instant};

use crate::error::Error;

/// When to give up, when to fail I/O, how often to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Wait between reconnect attempts (Linux `reconnect_delay`, 10 s).
    pub reconnect_delay: Duration,
    /// Give the controller up after this long without a connection; `None`
    /// retries forever (Linux `ctrl_loss_tmo` = -1; default 600 s).
    pub ctrl_loss_tmo: Option<Duration>,
    /// Fail pending and new I/O after this long without a connection while
    /// reconnect goes on; `None` keeps it queued until reconnect succeeds or
    /// the controller is lost (Linux `fast_io_fail_tmo`, off by default).
    pub fast_io_fail_tmo: Option<Duration>,
    /// Requeue in-flight I/O for the new connection (`true`, the kernel's
    /// way) or fail it at once when the connection breaks.
    pub requeue: bool,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        Self {
            reconnect_delay: Duration::from_secs(10),
            ctrl_loss_tmo: Some(Duration::from_secs(600)),
            fast_io_fail_tmo: None,
            requeue: true,
        }
    }
}

impl ReconnectPolicy {
    /// Seconds as the kernel's options take them: negative means "never"
    /// (for `ctrl_loss_tmo`: retry forever; for `fast_io_fail_tmo`: off).
    pub fn secs_or_never(secs: i64) -> Option<Duration> {
        u64::try_from(secs).ok().map(Duration::from_secs)
    }
}

/// Where the controller is.
#[derive(Debug, Clone)]
pub enum Phase {
    /// Connected.
    Live,
    /// Connection lost at `since`; next attempt at `next_attempt`.
    Reconnecting {
        /// When the connection was lost.
        since: Instant,
        /// When to try next.
        next_attempt: Instant,
        /// Attempts made so far.
        attempts: u32,
    },
    /// Given up; every request fails with this error.
    Lost(Error),
}

/// What to do with a request that has no connection to go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Keep it for the next connection.
    Requeue,
    /// Fail it with this error.
    Fail(ErrorKind),
}

/// Why a request without a connection fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The policy does not requeue.
    NoRequeue,
    /// `fast_io_fail_tmo` has passed.
    FastIoFail,
    /// The controller was given up.
    Lost,
}

/// The recovery state machine of one controller.
#[derive(Debug, Clone)]
pub struct Recovery {
    name: String,
    policy: ReconnectPolicy,
    phase: Phase,
    resets: u64,
}

impl Recovery {
    /// A live controller; `name` identifies it in log lines.
    pub fn new(name: impl Into<String>, policy: ReconnectPolicy) -> Self {
        Self {
            name: name.into(),
            policy,
            phase: Phase::Live,
            resets: 0,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &ReconnectPolicy {
        &self.policy
    }

    /// The current phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Whether the controller is connected.
    pub fn is_live(&self) -> bool {
        matches!(self.phase, Phase::Live)
    }

    /// Connection losses so far.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// A connection broke (socket error, TermReq, protocol violation,
    /// keep-alive or command timeout). Ignored unless live: one failure
    /// seen by several queues is one reset.
    pub fn on_failure(&mut self, now: Instant, err: &Error) {
        if !matches!(self.phase, Phase::Live) {
            return;
        }
        self.resets += 1;
        let loss = match self.policy.ctrl_loss_tmo {
            Some(t) => format!("for up to {t:?}"),
            None => "forever".to_owned(),
        };
        log::warn!(
            "{}: connection lost ({err}); reconnecting every {:?} {loss}",
            self.name,
            self.policy.reconnect_delay
        );
        // The first attempt comes at once: most losses are a target restart
        // or a dropped port, and the kernel also tries right away.
        self.phase = Phase::Reconnecting {
            since: now,
            next_attempt: now,
            attempts: 0,
        };
    }

    /// Whether an attempt is due now.
    pub fn should_attempt(&self, now: Instant) -> bool {
        matches!(self.phase, Phase::Reconnecting { next_attempt, .. } if now >= next_attempt)
    }

    /// An attempt succeeded.
    pub fn on_reconnected(&mut self, now: Instant) {
        if let Phase::Reconnecting {
            since, attempts, ..
        } = self.phase
        {
            log::warn!(
                "{}: reconnected after {:?} ({} attempt{})",
                self.name,
                now.saturating_duration_since(since),
                attempts + 1,
                if attempts == 0 { "" } else { "s" }
            );
            self.phase = Phase::Live;
        }
    }

    /// An attempt failed: schedule the next one, or give up when
    /// `ctrl_loss_tmo` has passed or the error is permanent.
    pub fn on_attempt_failed(&mut self, now: Instant, err: &Error) {
        let Phase::Reconnecting {
            since, attempts, ..
        } = self.phase
        else {
            return;
        };
        let attempts = attempts + 1;
        let next = now + self.policy.reconnect_delay;
        let out_of_time = self
            .policy
            .ctrl_loss_tmo
            .is_some_and(|t| next.saturating_duration_since(since) > t);
        if out_of_time || !err.is_transient() {
            let lost_after = now.saturating_duration_since(since);
            log::error!(
                "{}: giving up after {attempts} reconnect attempt(s) over {lost_after:?}: {err}",
                self.name
            );
            self.phase = Phase::Lost(if err.is_transient() {
                Error::ControllerLost(lost_after)
            } else {
                err.clone()
            });
            return;
        }
        // Log the first failure and then only every tenth, so a long outage
        // does not flood the log.
        if attempts == 1 || attempts % 10 == 0 {
            log::info!(
                "{}: reconnect attempt {attempts} failed: {err}; next in {:?}",
                self.name,
                self.policy.reconnect_delay
            );
        }
        self.phase = Phase::Reconnecting {
            since,
            next_attempt: next,
            attempts,
        };
    }

    /// Give up now (the user deleted the controller).
    pub fn give_up(&mut self, err: Error) {
        self.phase = Phase::Lost(err);
    }

    /// When the next reconnect attempt is due, while reconnecting. (The
    /// other deadline, [`Recovery::fast_io_fail_at`], matters only to a
    /// driver holding I/O.)
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Reconnecting { next_attempt, .. } => Some(next_attempt),
            _ => None,
        }
    }

    /// When `fast_io_fail_tmo` passes in the current outage, if it applies.
    pub fn fast_io_fail_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Reconnecting { since, .. } => self.policy.fast_io_fail_tmo.map(|t| since + t),
            _ => None,
        }
    }

    /// What to do now with a request that lost its connection (or arrives
    /// while there is none).
    pub fn disposition(&self, now: Instant) -> Disposition {
        match self.phase {
            Phase::Lost(_) => Disposition::Fail(ErrorKind::Lost),
            _ if !self.policy.requeue => Disposition::Fail(ErrorKind::NoRequeue),
            Phase::Reconnecting { since, .. } => match self.policy.fast_io_fail_tmo {
                Some(t) if now.saturating_duration_since(since) >= t => {
                    Disposition::Fail(ErrorKind::FastIoFail)
                }
                _ => Disposition::Requeue,
            },
            Phase::Live => Disposition::Requeue,
        }
    }

    /// The error to fail a request with, for a `Disposition::Fail(kind)`;
    /// `cause` is what broke the connection.
    pub fn error_for(&self, kind: ErrorKind, cause: &Error) -> Error {
        match (kind, &self.phase) {
            (ErrorKind::Lost, Phase::Lost(e)) => e.clone(),
            (ErrorKind::FastIoFail, _) => {
                Error::FastIoFail(self.policy.fast_io_fail_tmo.unwrap_or_default())
            }
            _ => Error::Aborted(Box::new(cause.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ReconnectPolicy {
        ReconnectPolicy {
            reconnect_delay: Duration::from_secs(2),
            ctrl_loss_tmo: Some(Duration::from_secs(10)),
            fast_io_fail_tmo: Some(Duration::from_secs(5)),
            requeue: true,
        }
    }

    #[test]
    fn reconnects_then_gives_up_at_ctrl_loss_tmo() {
        let t0 = Instant::now();
        let mut r = Recovery::new("c", policy());
        let cause = Error::ConnectionClosed;
        r.on_failure(t0, &cause);
        assert!(r.should_attempt(t0));
        assert_eq!(r.disposition(t0), Disposition::Requeue);
        let mut now = t0;
        let mut attempts = 0;
        while !matches!(r.phase(), Phase::Lost(_)) {
            assert!(attempts < 100, "must give up");
            r.on_attempt_failed(now, &cause);
            attempts += 1;
            if let Some(t) = r.poll_timeout() {
                now = now.max(t);
                if !r.should_attempt(now) {
                    now += Duration::from_millis(1);
                }
            }
        }
        assert!(now.duration_since(t0) <= Duration::from_secs(10));
        assert_eq!(r.disposition(now), Disposition::Fail(ErrorKind::Lost));
        assert!(matches!(
            r.error_for(ErrorKind::Lost, &cause),
            Error::ControllerLost(_)
        ));
    }

    #[test]
    fn fast_io_fail_fails_io_but_keeps_reconnecting() {
        let t0 = Instant::now();
        let mut r = Recovery::new("c", policy());
        r.on_failure(t0, &Error::ConnectionClosed);
        r.on_attempt_failed(t0, &Error::ConnectionClosed);
        let t5 = t0 + Duration::from_secs(5);
        assert_eq!(r.disposition(t5), Disposition::Fail(ErrorKind::FastIoFail));
        assert!(matches!(r.phase(), Phase::Reconnecting { .. }));
        r.on_reconnected(t5);
        assert!(r.is_live());
        assert_eq!(r.disposition(t5), Disposition::Requeue);
        assert_eq!(r.resets(), 1);
    }

    #[test]
    fn permanent_errors_give_up_at_once_refusals_do_not() {
        let t0 = Instant::now();
        let mut r = Recovery::new("c", policy());
        r.on_failure(t0, &Error::ConnectionClosed);
        let refused = Error::ConnectRefused(crate::error::ConnectRefusal::UnknownSubsystem);
        r.on_attempt_failed(t0, &refused);
        assert!(matches!(r.phase(), Phase::Reconnecting { .. }));
        r.on_attempt_failed(t0, &Error::Unsupported("SGLs"));
        assert!(matches!(r.phase(), Phase::Lost(Error::Unsupported(_))));
    }

    #[test]
    fn forever_never_gives_up() {
        let t0 = Instant::now();
        let mut r = Recovery::new(
            "c",
            ReconnectPolicy {
                ctrl_loss_tmo: None,
                fast_io_fail_tmo: None,
                ..policy()
            },
        );
        r.on_failure(t0, &Error::ConnectionClosed);
        for i in 0..10_000u64 {
            r.on_attempt_failed(t0 + Duration::from_secs(2 * i), &Error::ConnectionClosed);
        }
        assert!(matches!(r.phase(), Phase::Reconnecting { .. }));
        assert_eq!(
            r.disposition(t0 + Duration::from_secs(1 << 20)),
            Disposition::Requeue
        );
    }
}
