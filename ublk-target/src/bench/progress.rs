//! The live status line `bench` prints on a terminal, shaped like fio's:
//! `Jobs: 1 (f=1): [r(1)][45.0%][r=120MiB/s][r=30.7k IOPS][eta 00m:11s]`.
//!
//! Jobs count completions into a [`Progress`] (relaxed atomics, read once
//! a second); [`status_line`] is a pure function of two samples, so the
//! format is tested without a clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Pattern;

/// Completions so far, all jobs together, and the jobs still running.
#[derive(Debug, Default)]
pub struct Progress {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    running: AtomicU64,
    bytes_total: AtomicU64,
}

/// A reading of [`Progress`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Reads completed.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Jobs running now.
    pub running: u64,
}

impl Progress {
    /// One completed I/O of `bytes`.
    pub fn completed(&self, write: bool, bytes: u64) {
        let (n, b) = if write {
            (&self.writes, &self.write_bytes)
        } else {
            (&self.reads, &self.read_bytes)
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A job starts (`true`) or ends (`false`) its measured run.
    pub fn job_running(&self, running: bool) {
        if running {
            self.running.fetch_add(1, Ordering::Relaxed);
        } else {
            self.running.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The bytes of one pass over the namespace (all jobs), once known.
    pub fn set_bytes_total(&self, bytes: u64) {
        self.bytes_total.store(bytes, Ordering::Relaxed);
    }

    /// What [`Progress::set_bytes_total`] stored.
    pub fn bytes_total(&self) -> u64 {
        self.bytes_total.load(Ordering::Relaxed)
    }

    /// The counts now.
    pub fn sample(&self) -> Sample {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Sample {
            reads: g(&self.reads),
            read_bytes: g(&self.read_bytes),
            writes: g(&self.writes),
            write_bytes: g(&self.write_bytes),
            running: g(&self.running),
        }
    }
}

/// What the line needs to know of the run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The I/O pattern (fio's letter: R/W sequential, r/w random, m mixed).
    pub pattern: Pattern,
    /// `--runtime` (zero: one pass over `bytes_total`).
    pub runtime: Duration,
    /// Bytes of one pass, all jobs.
    pub bytes_total: u64,
}

/// The status line for `now` (since `elapsed` into the run) given the
/// previous sample, `interval` earlier.
pub fn status_line(
    plan: &Plan,
    prev: &Sample,
    now: &Sample,
    interval: Duration,
    elapsed: Duration,
) -> String {
    let letter = match plan.pattern {
        Pattern::Read => 'R',
        Pattern::Write => 'W',
        Pattern::RandRead => 'r',
        Pattern::RandWrite => 'w',
        Pattern::RandRw => 'm',
    };
    let done = if plan.runtime.is_zero() {
        let bytes = now.read_bytes + now.write_bytes;
        (bytes as f64 / plan.bytes_total.max(1) as f64).min(1.0)
    } else {
        (elapsed.as_secs_f64() / plan.runtime.as_secs_f64()).min(1.0)
    };
    let eta = if plan.runtime.is_zero() {
        // At the rate so far.
        let per = elapsed.as_secs_f64() / done.max(1e-9);
        Duration::from_secs_f64(((1.0 - done) * per).min(359_999.0))
    } else {
        plan.runtime.saturating_sub(elapsed)
    };
    let secs = interval.as_secs_f64().max(1e-9);
    let rate = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / secs;
    let (rb, wb) = (
        rate(prev.read_bytes, now.read_bytes),
        rate(prev.write_bytes, now.write_bytes),
    );
    let (ri, wi) = (rate(prev.reads, now.reads), rate(prev.writes, now.writes));
    let (bw, iops) = match plan.pattern {
        Pattern::Read | Pattern::RandRead => {
            (format!("r={}", bytes_rate(rb)), format!("r={}", count(ri)))
        }
        Pattern::Write | Pattern::RandWrite => {
            (format!("w={}", bytes_rate(wb)), format!("w={}", count(wi)))
        }
        Pattern::RandRw => (
            format!("r={},w={}", bytes_rate(rb), bytes_rate(wb)),
            format!("r={},w={}", count(ri), count(wi)),
        ),
    };
    let t = eta.as_secs();
    let eta = if t >= 3600 {
        format!("{:02}h:{:02}m:{:02}s", t / 3600, t % 3600 / 60, t % 60)
    } else {
        format!("{:02}m:{:02}s", t / 60, t % 60)
    };
    format!(
        "Jobs: {n} (f={n}): [{letter}({n})][{:.1}%][{bw}][{iops} IOPS][eta {eta}]",
        done * 100.0,
        n = now.running
    )
}

/// Bytes per second as fio prints them: `B/s`, `KiB/s`, `MiB/s`, `GiB/s`,
/// three significant digits at most.
fn bytes_rate(v: f64) -> String {
    let units = ["B/s", "KiB/s", "MiB/s", "GiB/s"];
    let mut v = v;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 && u > 0 {
        format!("{v:.1}{}", units[u])
    } else {
        format!("{v:.0}{}", units[u])
    }
}

/// A count as fio prints IOPS: `950`, `30.7k`, `1234k`.
fn count(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.0}")
    } else if v < 100_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{:.0}k", v / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_random_read_reads_like_fio() {
        let plan = Plan {
            pattern: Pattern::RandRead,
            runtime: Duration::from_secs(20),
            bytes_total: 1 << 30,
        };
        let prev = Sample {
            reads: 100_000,
            read_bytes: 100_000 * 4096,
            running: 1,
            ..Sample::default()
        };
        let now = Sample {
            reads: 130_720,
            read_bytes: 130_720 * 4096,
            running: 1,
            ..Sample::default()
        };
        assert_eq!(
            status_line(
                &plan,
                &prev,
                &now,
                Duration::from_secs(1),
                Duration::from_secs(9)
            ),
            "Jobs: 1 (f=1): [r(1)][45.0%][r=120MiB/s][r=30.7k IOPS][eta 00m:11s]"
        );
    }

    #[test]
    fn a_pass_counts_bytes_and_mixed_shows_both() {
        let plan = Plan {
            pattern: Pattern::RandRw,
            runtime: Duration::ZERO,
            bytes_total: 1000 * 4096,
        };
        let now = Sample {
            reads: 200,
            read_bytes: 200 * 4096,
            writes: 50,
            write_bytes: 50 * 4096,
            running: 2,
        };
        assert_eq!(
            status_line(
                &plan,
                &Sample::default(),
                &now,
                Duration::from_secs(2),
                Duration::from_secs(2)
            ),
            "Jobs: 2 (f=2): [m(2)][25.0%][r=400KiB/s,w=100KiB/s][r=100,w=25 IOPS][eta 00m:06s]"
        );
    }

    #[test]
    fn rates_and_counts_scale() {
        assert_eq!(bytes_rate(512.0), "512B/s");
        assert_eq!(bytes_rate(3.5 * 1024.0 * 1024.0 * 1024.0), "3.5GiB/s");
        assert_eq!(count(1_234_567.0), "1235k");
    }

    #[test]
    fn progress_counts_completions() {
        let p = Progress::default();
        p.job_running(true);
        p.completed(true, 4096);
        p.completed(false, 512);
        let s = p.sample();
        assert_eq!(
            (s.reads, s.read_bytes, s.writes, s.write_bytes, s.running),
            (1, 512, 1, 4096, 1)
        );
        p.job_running(false);
        assert_eq!(p.sample().running, 0);
    }
}
