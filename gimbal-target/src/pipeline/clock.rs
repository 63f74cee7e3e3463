//! The switch's clock: device nanoseconds since a pipeline's epoch.
//!
//! A `gimbal` pipeline reads the clock once per request (the completion
//! time of one request is the dispatch time of the next), under its lock,
//! so the read is on every I/O's path. `CLOCK_MONOTONIC` through the vDSO
//! costs ~21 ns here (a quarter of what the whole switch adds to a `null`
//! request); the CPU's time-stamp counter costs ~9 ns. So the clock reads
//! the TSC when the kernel itself trusts it, and `CLOCK_MONOTONIC`
//! otherwise.
//!
//! Decisions:
//! - The TSC is used only on x86-64, when the kernel's current clocksource
//!   is `tsc` (the kernel has checked that it is invariant and agrees
//!   across CPUs, and would have switched away otherwise) and the CPU
//!   reports `constant_tsc` and `nonstop_tsc`. `GIMBAL_CLOCK=monotonic`
//!   forces `CLOCK_MONOTONIC`.
//! - Its rate is measured once per process against `CLOCK_MONOTONIC` over
//!   ~10 ms (the first `gimbal` namespace pays it). Each end of the
//!   interval is read three times between two `CLOCK_MONOTONIC` reads and
//!   the tightest pair is kept, so the error is a few parts per million:
//!   it scales intervals (latencies, token refills) by that much, which no
//!   decision of the switch can notice. The clock is never compared with
//!   wall time; the pacing thread converts device durations, not instants.
//! - The switch needs a clock that never goes back; the pipeline clamps
//!   every read to the latest one under its lock (`GimbalState::monotonic`),
//!   which also covers a TSC that differs by a few cycles between CPUs.
//! - A `sim` backend's time scale (device time per real time) is folded
//!   into the TSC multiplier; with `CLOCK_MONOTONIC` it divides, in a
//!   function of its own so that the unscaled path does not compute the
//!   division it does not use (the compiler had made the choice
//!   branch-free, dividing on every read).

use std::sync::OnceLock;

use qos_core::time::Nanos;

/// Where the ticks come from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    /// The time-stamp counter; device ns per tick in 32.32 fixed point.
    Tsc { mult: u64 },
    /// `CLOCK_MONOTONIC`; real ns per device ns.
    Monotonic { scale: f64 },
}

/// A pipeline's clock. Cheap to read from any thread.
#[derive(Clone, Debug)]
pub struct SwitchClock {
    source: Source,
    /// The raw reading (ticks or ns) at creation.
    epoch: u64,
}

impl SwitchClock {
    /// A clock starting at zero now, running at `time_scale` real ns per
    /// device ns (1.0 for real devices).
    pub fn new(time_scale: f64) -> Self {
        Self::with_tsc(tsc_ns_per_tick(), time_scale)
    }

    /// A clock on the TSC at `ns_per_tick` if given, else on
    /// `CLOCK_MONOTONIC`.
    fn with_tsc(ns_per_tick: Option<f64>, time_scale: f64) -> Self {
        let source = match ns_per_tick {
            Some(ns_per_tick) => Source::Tsc {
                // Device ns per tick, 32.32: below 2^32 for any tick rate
                // over 1 Hz, so the 128-bit product cannot overflow 2^96.
                mult: (ns_per_tick / time_scale * 4_294_967_296.0).round() as u64,
            },
            None => Source::Monotonic { scale: time_scale },
        };
        let epoch = match source {
            Source::Tsc { .. } => rdtsc(),
            Source::Monotonic { .. } => monotonic_ns(),
        };
        SwitchClock { source, epoch }
    }

    /// Device nanoseconds since creation.
    #[inline]
    pub fn now(&self) -> Nanos {
        match self.source {
            Source::Tsc { mult } => {
                let ticks = rdtsc().saturating_sub(self.epoch);
                Nanos(((u128::from(ticks) * u128::from(mult)) >> 32) as u64)
            }
            Source::Monotonic { scale } => {
                let ns = monotonic_ns().saturating_sub(self.epoch);
                if scale == 1.0 {
                    Nanos(ns)
                } else {
                    scaled(ns, scale)
                }
            }
        }
    }

    /// Whether this clock reads the time-stamp counter.
    pub fn uses_tsc(&self) -> bool {
        matches!(self.source, Source::Tsc { .. })
    }
}

/// `ns / scale`, kept out of line (see the module's decisions).
#[inline(never)]
fn scaled(ns: u64, scale: f64) -> Nanos {
    Nanos((ns as f64 / scale) as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `Instant` reads, without
/// its checked `Duration` arithmetic.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU and has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn rdtsc() -> u64 {
    unreachable!("the TSC source is only chosen on x86-64")
}

/// Nanoseconds per TSC tick when the TSC may be used, measured once per
/// process; `None` (and why, logged once) when it may not.
fn tsc_ns_per_tick() -> Option<f64> {
    static RATE: OnceLock<Option<f64>> = OnceLock::new();
    *RATE.get_or_init(|| match tsc_usable() {
        Ok(()) => {
            let rate = calibrate();
            match rate {
                Some(ns) => log::info!(
                    "switch clock: TSC at {:.3} GHz (kernel clocksource tsc)",
                    1.0 / ns
                ),
                None => log::info!("switch clock: CLOCK_MONOTONIC (TSC rate implausible)"),
            }
            rate
        }
        Err(why) => {
            log::info!("switch clock: CLOCK_MONOTONIC ({why})");
            None
        }
    })
}

/// Whether the TSC may stand in for `CLOCK_MONOTONIC`, or why not.
fn tsc_usable() -> Result<(), String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("not x86-64".into());
    }
    if std::env::var("GIMBAL_CLOCK").is_ok_and(|v| v == "monotonic") {
        return Err("GIMBAL_CLOCK=monotonic".into());
    }
    const SOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    let current =
        std::fs::read_to_string(SOURCE).map_err(|e| format!("cannot read {SOURCE}: {e}"))?;
    if current.trim() != "tsc" {
        return Err(format!("kernel clocksource is {}", current.trim()));
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
        .map_err(|e| format!("cannot read /proc/cpuinfo: {e}"))?;
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    for flag in ["constant_tsc", "nonstop_tsc"] {
        if !flags.split_whitespace().any(|f| f == flag) {
            return Err(format!("CPU lacks {flag}"));
        }
    }
    Ok(())
}

/// A (monotonic ns, TSC) pair read as close together as this thread
/// manages: the TSC between two monotonic reads, the tightest of three.
fn paired_reading() -> (u64, u64) {
    (0..3)
        .map(|_| {
            let before = monotonic_ns();
            let tsc = rdtsc();
            let after = monotonic_ns();
            (after - before, before + (after - before) / 2, tsc)
        })
        .min_by_key(|&(gap, _, _)| gap)
        .map(|(_, ns, tsc)| (ns, tsc))
        .expect("three readings")
}

/// Nanoseconds per TSC tick over ~10 ms; `None` if the rate is not one a
/// CPU runs at (0.1-10 GHz).
fn calibrate() -> Option<f64> {
    let (ns0, tsc0) = paired_reading();
    std::thread::sleep(std::time::Duration::from_millis(10));
    let (ns1, tsc1) = paired_reading();
    let ns_per_tick = (ns1 - ns0) as f64 / tsc1.checked_sub(tsc0)?.max(1) as f64;
    (0.1..=10.0).contains(&ns_per_tick).then_some(ns_per_tick)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each source (the TSC where this machine allows it) measures a
    /// sleep as `CLOCK_MONOTONIC` does, unscaled and at a `sim` time
    /// scale: within 1 % plus the time between the two reads (taken back
    /// to back, the tightest of five tries).
    #[test]
    fn agrees_with_clock_monotonic() {
        let mut sources = vec![None];
        if tsc_usable().is_ok() {
            sources.push(Some(
                calibrate().expect("a usable TSC has a plausible rate"),
            ));
        }
        for tsc in sources {
            for scale in [1.0, 300.0] {
                let clock = SwitchClock::with_tsc(tsc, scale);
                assert_eq!(clock.uses_tsc(), tsc.is_some());
                let best = (0..5)
                    .map(|_| {
                        let (m0, c0) = (monotonic_ns(), clock.now());
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        let (c1, m1) = (clock.now(), monotonic_ns());
                        let real = (m1 - m0) as f64 / scale;
                        let measured = c1.0.saturating_sub(c0.0) as f64;
                        (measured - real).abs() / real
                    })
                    .fold(f64::INFINITY, f64::min);
                assert!(
                    best < 0.01,
                    "tsc {tsc:?}, scale {scale}: clock off by {:.3} %",
                    best * 100.0
                );
            }
        }
    }

    /// A clock starts at zero when created, and its reads grow.
    #[test]
    fn starts_at_zero_and_advances() {
        for clock in [SwitchClock::new(1.0), SwitchClock::with_tsc(None, 1.0)] {
            let a = clock.now();
            std::thread::sleep(std::time::Duration::from_millis(2));
            let b = clock.now();
            assert!(a.0 < 1_000_000_000, "epoch is creation: {a:?}");
            assert!(b.0 >= a.0 + 1_000_000, "{a:?} then {b:?}");
        }
    }
}
