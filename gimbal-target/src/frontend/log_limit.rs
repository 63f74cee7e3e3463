//! Rate-limited log lines: a host that sends a flood of bad input must not
//! be able to fill the disk with the target's complaints about it.
//!
//! Every line a host can provoke belongs to a *kind* (a short name such as
//! `"protocol-error"`). Per kind, the first [`LogLimiter::BURST`] lines of
//! each [`LogLimiter::WINDOW`] are written; the rest are counted, and the
//! next line written of that kind says how many were suppressed before it.
//! So a flood writes at most `BURST` lines per kind per window, whatever
//! its rate. Use the [`limited!`](crate::limited) macro.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Per-kind counters, target-wide.
#[derive(Debug)]
pub struct LogLimiter {
    window: Duration,
    burst: u32,
    kinds: Mutex<BTreeMap<&'static str, KindState>>,
    written: AtomicU64,
    suppressed: AtomicU64,
}

#[derive(Debug)]
struct KindState {
    window_start: Instant,
    written_in_window: u32,
    suppressed_since_written: u64,
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(Self::WINDOW, Self::BURST)
    }
}

impl LogLimiter {
    /// The window lines are counted in.
    pub const WINDOW: Duration = Duration::from_secs(10);
    /// Lines of one kind written per window.
    pub const BURST: u32 = 5;

    /// A limiter writing `burst` lines per kind per `window`.
    pub fn new(window: Duration, burst: u32) -> Self {
        LogLimiter {
            window,
            burst,
            kinds: Mutex::new(BTreeMap::new()),
            written: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line of `kind` may be written at `now`: `Some(n)` with
    /// the number of lines of this kind suppressed since the last one
    /// written (to say so in this one), `None` to suppress it.
    pub fn admit(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let k = kinds.entry(kind).or_insert(KindState {
            window_start: now,
            written_in_window: 0,
            suppressed_since_written: 0,
        });
        if now.saturating_duration_since(k.window_start) >= self.window {
            k.window_start = now;
            k.written_in_window = 0;
        }
        if k.written_in_window < self.burst {
            k.written_in_window += 1;
            self.written.fetch_add(1, Ordering::Relaxed);
            Some(std::mem::take(&mut k.suppressed_since_written))
        } else {
            k.suppressed_since_written += 1;
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Lines admitted so far (for tests and status).
    pub fn lines_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Lines suppressed so far.
    pub fn lines_suppressed(&self) -> u64 {
        self.suppressed.load(Ordering::Relaxed)
    }
}

/// `limited!(limiter, Level, "kind", "format", args...)`: logs like
/// `log::log!` if `limiter` ([`LogLimiter`]) admits a line of that kind now,
/// noting how many lines of the kind were suppressed before it.
#[macro_export]
macro_rules! limited {
    ($limiter:expr, $level:expr, $kind:expr, $($arg:tt)+) => {{
        let level = $level;
        if log::log_enabled!(level) {
            if let Some(n) = $limiter.admit($kind, std::time::Instant::now()) {
                if n == 0 {
                    log::log!(level, $($arg)+);
                } else {
                    log::log!(
                        level,
                        "{} ({} more `{}` lines suppressed)",
                        format_args!($($arg)+),
                        n,
                        $kind
                    );
                }
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_writes_burst_lines_per_window_and_counts_the_rest() {
        let l = LogLimiter::new(Duration::from_secs(10), 3);
        let t0 = Instant::now();
        let admitted: Vec<_> = (0..1000).map(|_| l.admit("bad", t0)).collect();
        assert_eq!(admitted.iter().filter(|a| a.is_some()).count(), 3);
        assert_eq!(l.lines_suppressed(), 997);
        // Another kind has its own allowance.
        assert_eq!(l.admit("other", t0), Some(0));
        // Within the window: still suppressed.
        assert_eq!(l.admit("bad", t0 + Duration::from_secs(9)), None);
        // The next window's first line carries the count.
        assert_eq!(l.admit("bad", t0 + Duration::from_secs(10)), Some(998));
        assert_eq!(l.admit("bad", t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(l.lines_written(), 6);
    }
}
