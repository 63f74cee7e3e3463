//! `ublk-nvmf bench`: a fio-like load generator over the embedded NVMe/TCP
//! initiator, with optional data verification.
//!
//! Each job is a thread with its own I/O queue (its own TCP connection),
//! keeping `iodepth` requests in flight over its own slice of the
//! namespace. With `verify`, every written unit carries a header (unit
//! index, write generation) and a pattern derived from both; reads are
//! checked against the last completed write of that unit (units never
//! written in this run are filled first), a unit is never read and written
//! at once, and a final pass reads back everything. Any I/O error, NVMe
//! error status or mismatch is counted and makes the run fail.

pub mod histogram;
pub mod progress;

use std::time::{Duration, Instant};

use nvmf_initiator::blocking::{Controller, IoCompletion, IoQueue};
use nvmf_initiator::{Command, Request};
use nvmf_proto::fabrics::PriorityClass;

use crate::bench::histogram::Histogram;
use crate::error::Error;

/// The access pattern (`--rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mix, `rwmixread` percent reads.
    RandRw,
}

impl Pattern {
    /// Parse fio's names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "randrw" | "rw" => Self::RandRw,
            _ => return None,
        })
    }

    fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Namespace.
    pub nsid: u32,
    /// Access pattern.
    pub pattern: Pattern,
    /// Percent reads for `randrw`.
    pub rwmixread: u32,
    /// Bytes per I/O (a block multiple).
    pub bs: u32,
    /// Requests in flight per job.
    pub iodepth: u32,
    /// Jobs (threads, each with its own I/O queue).
    pub numjobs: u32,
    /// Run this long; zero: one pass over the region.
    pub runtime: Duration,
    /// Bytes of the namespace to use (zero: all of it), split among jobs.
    pub size: u64,
    /// Verify data.
    pub verify: bool,
    /// Seed for the random offsets.
    pub seed: u64,
}

/// Results of one direction.
#[derive(Debug, Clone, Default)]
pub struct DirectionReport {
    /// I/Os completed successfully.
    pub ios: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Latency distribution in nanoseconds.
    pub latency: Histogram,
}

/// Results of a run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Reads.
    pub read: DirectionReport,
    /// Writes.
    pub write: DirectionReport,
    /// Wall time of the measured phase.
    pub elapsed: Duration,
    /// I/O errors (transport errors and NVMe error statuses).
    pub errors: u64,
    /// Verification mismatches.
    pub verify_errors: u64,
    /// The first error seen, for the user.
    pub first_error: Option<String>,
    /// Units read back in the final verification pass.
    pub verified_units: u64,
    /// Controller resets during the run.
    pub resets: u64,
}

impl Report {
    fn merge(&mut self, o: Report) {
        self.read.ios += o.read.ios;
        self.read.bytes += o.read.bytes;
        self.read.latency.merge(&o.read.latency);
        self.write.ios += o.write.ios;
        self.write.bytes += o.write.bytes;
        self.write.latency.merge(&o.write.latency);
        self.errors += o.errors;
        self.verify_errors += o.verify_errors;
        self.verified_units += o.verified_units;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.elapsed = self.elapsed.max(o.elapsed);
    }

    /// Whether any error or mismatch happened.
    pub fn failed(&self) -> bool {
        self.errors > 0 || self.verify_errors > 0
    }

    fn dir_text(name: &str, d: &DirectionReport, secs: f64) -> String {
        if d.ios == 0 {
            return String::new();
        }
        format!(
            "{name:>5}: IOPS={:.0}, BW={:.1}MB/s, lat p50={:.1}us p99={:.1}us p99.9={:.1}us ({} ios)\n",
            d.ios as f64 / secs,
            d.bytes as f64 / secs / 1e6,
            d.latency.percentile(50.0) as f64 / 1e3,
            d.latency.percentile(99.0) as f64 / 1e3,
            d.latency.percentile(99.9) as f64 / 1e3,
            d.ios
        )
    }

    /// Human-readable summary.
    pub fn to_text(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let mut s = Self::dir_text("read", &self.read, secs);
        s += &Self::dir_text("write", &self.write, secs);
        s += &format!(
            "  run: {:.2}s, errors={}, verify_errors={}, verified={} units, resets={}\n",
            secs, self.errors, self.verify_errors, self.verified_units, self.resets
        );
        if let Some(e) = &self.first_error {
            s += &format!("first error: {e}\n");
        }
        s
    }

    fn dir_json(d: &DirectionReport, secs: f64) -> String {
        format!(
            "{{\"ios\":{},\"bytes\":{},\"iops\":{:.1},\"mbps\":{:.3},\"lat_us\":{{\"p50\":{:.1},\"p99\":{:.1},\"p99.9\":{:.1}}}}}",
            d.ios,
            d.bytes,
            d.ios as f64 / secs,
            d.bytes as f64 / secs / 1e6,
            d.latency.percentile(50.0) as f64 / 1e3,
            d.latency.percentile(99.0) as f64 / 1e3,
            d.latency.percentile(99.9) as f64 / 1e3,
        )
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let first = match &self.first_error {
            Some(e) => format!("\"{}\"", e.replace('\\', "\\\\").replace('"', "\\\"")),
            None => "null".into(),
        };
        format!(
            "{{\"runtime_s\":{:.3},\"read\":{},\"write\":{},\"errors\":{},\"verify_errors\":{},\"verified_units\":{},\"resets\":{},\"first_error\":{}}}",
            secs,
            Self::dir_json(&self.read, secs),
            Self::dir_json(&self.write, secs),
            self.errors,
            self.verify_errors,
            self.verified_units,
            self.resets,
            first
        )
    }
}

/// Small fast PRNG (xorshift64*): offsets and verify patterns need speed
/// and reproducibility, not quality.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const MAGIC: u64 = 0x7562_6c6b_6e76_6d66; // "ublknvmf"

/// Fill `buf` with the verify pattern of (unit, generation).
fn fill(buf: &mut [u8], unit: u64, generation: u32) {
    let mut r = Rng::new(unit.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(generation) ^ 1);
    for chunk in buf.chunks_mut(8) {
        let v = r.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    buf[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    buf[8..16].copy_from_slice(&unit.to_le_bytes());
    buf[16..20].copy_from_slice(&generation.to_le_bytes());
}

fn check(buf: &[u8], unit: u64, generation: u32, scratch: &mut Vec<u8>) -> bool {
    scratch.resize(buf.len(), 0);
    fill(scratch, unit, generation);
    buf == &scratch[..]
}

#[derive(Clone, Copy)]
struct InFlight {
    unit: u64,
    write: bool,
    generation: u32,
    start: Instant,
}

struct Job<'a> {
    q: IoQueue,
    opts: &'a BenchOptions,
    nsid: u32,
    block_size: u32,
    /// First unit of this job's region, and its length in units.
    first_unit: u64,
    units: u64,
    /// Last completed write generation per unit (verify only; 0 = never).
    written: Vec<u32>,
    busy: Vec<bool>,
    rng: Rng,
    next_seq: u64,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    report: Report,
    scratch: Vec<u8>,
    /// Buffers to reuse (no allocation per I/O in steady state).
    pool: Vec<Vec<u8>>,
    /// Where the live status line reads completions, if one is shown.
    progress: Option<&'a progress::Progress>,
}

impl<'a> Job<'a> {
    fn blocks_per_unit(&self) -> u64 {
        u64::from(self.opts.bs / self.block_size)
    }

    fn take_buf(&mut self) -> Vec<u8> {
        self.pool
            .pop()
            .unwrap_or_else(|| vec![0u8; self.opts.bs as usize])
    }

    fn submit(&mut self, unit: u64, write: bool) {
        let slot = self.free.pop().expect("a free slot");
        let mut buf = self.take_buf();
        let mut generation = 0;
        if write && self.opts.verify {
            generation = self.written[unit as usize].wrapping_add(1).max(1);
            fill(&mut buf, self.first_unit + unit, generation);
        }
        if self.opts.verify {
            self.busy[unit as usize] = true;
        }
        let slba = (self.first_unit + unit) * self.blocks_per_unit();
        let command = if write {
            Command::Write {
                nsid: self.nsid,
                slba,
                block_size: self.block_size,
                fua: false,
            }
        } else {
            Command::Read {
                nsid: self.nsid,
                slba,
                block_size: self.block_size,
            }
        };
        self.slots[slot] = Some(InFlight {
            unit,
            write,
            generation,
            start: Instant::now(),
        });
        self.q.submit(Request {
            command,
            buf: Some(buf),
            user_data: slot as u64,
        });
    }

    fn error(&mut self, e: String) {
        self.report.errors += 1;
        if self.report.first_error.is_none() {
            self.report.first_error = Some(e);
        }
    }

    /// Wait for one completion and account for it.
    fn complete(&mut self, record: bool) -> bool {
        let Some(c): Option<IoCompletion> = self.q.wait() else {
            return false;
        };
        let slot = c.user_data as usize;
        let f = self.slots[slot].take().expect("in flight");
        self.free.push(slot);
        let latency = f.start.elapsed();
        if self.opts.verify {
            self.busy[f.unit as usize] = false;
        }
        let what = if f.write { "write" } else { "read" };
        let buf = match c.result {
            Err(e) => {
                self.error(format!("{what} of unit {}: {e}", f.unit));
                c.buf
            }
            Ok(info) if !info.status.is_success() => {
                self.error(format!(
                    "{what} of unit {}: NVMe status {}",
                    f.unit, info.status
                ));
                c.buf
            }
            Ok(_) => {
                if f.write {
                    if self.opts.verify {
                        self.written[f.unit as usize] = f.generation;
                    }
                } else if self.opts.verify {
                    let expect = self.written[f.unit as usize];
                    if expect != 0 {
                        let buf = c.buf.as_deref().unwrap_or_default();
                        let mut scratch = std::mem::take(&mut self.scratch);
                        if !check(buf, self.first_unit + f.unit, expect, &mut scratch) {
                            self.report.verify_errors += 1;
                            if self.report.first_error.is_none() {
                                self.report.first_error = Some(format!(
                                    "verification failed: unit {} (lba {}) does not hold write generation {expect}",
                                    f.unit,
                                    (self.first_unit + f.unit) * self.blocks_per_unit()
                                ));
                            }
                        }
                        self.scratch = scratch;
                    }
                }
                if record {
                    let d = if f.write {
                        &mut self.report.write
                    } else {
                        &mut self.report.read
                    };
                    d.ios += 1;
                    d.bytes += u64::from(self.opts.bs);
                    d.latency.record(latency.as_nanos() as u64);
                    if let Some(p) = self.progress {
                        p.completed(f.write, u64::from(self.opts.bs));
                    }
                }
                c.buf
            }
        };
        if let Some(b) = buf {
            self.pool.push(b);
        }
        true
    }

    /// Pick the next (unit, write) to issue, avoiding units in flight when
    /// verifying; `None` when a one-pass run is done.
    fn pick(&mut self) -> Option<(u64, bool)> {
        let opts = self.opts;
        let write = match opts.pattern {
            Pattern::Read | Pattern::RandRead => false,
            Pattern::Write | Pattern::RandWrite => true,
            Pattern::RandRw => self.rng.below(100) >= u64::from(opts.rwmixread),
        };
        for _ in 0..64 {
            let unit = if opts.pattern.random() {
                if opts.runtime.is_zero() && self.next_seq >= self.units {
                    return None;
                }
                self.next_seq += 1;
                self.rng.below(self.units)
            } else {
                if opts.runtime.is_zero() && self.next_seq >= self.units {
                    return None;
                }
                let u = self.next_seq % self.units;
                self.next_seq += 1;
                u
            };
            if !opts.verify || !self.busy[unit as usize] {
                return Some((unit, write));
            }
        }
        None
    }

    /// Keep `iodepth` in flight until `until` (or the pass ends).
    fn run(&mut self, until: Option<Instant>, record: bool) {
        let depth = self.opts.iodepth.max(1) as usize;
        let mut in_flight = 0usize;
        loop {
            // Like fio, a job stops at its first error: what follows a
            // failed write cannot be verified, and a lost controller
            // would only produce more of the same.
            let stop = until.is_some_and(|u| Instant::now() >= u) || self.report.failed();
            while !stop && in_flight < depth {
                match self.pick() {
                    Some((unit, write)) => {
                        self.submit(unit, write);
                        in_flight += 1;
                    }
                    None => break,
                }
            }
            if in_flight == 0 {
                return;
            }
            if self.complete(record) {
                in_flight -= 1;
            } else {
                return;
            }
            if stop && in_flight == 0 {
                return;
            }
        }
    }

    /// Write every unit not yet written (so reads have something to check).
    fn prefill(&mut self) {
        let depth = self.opts.iodepth.max(1) as usize;
        let mut unit = 0u64;
        let mut in_flight = 0usize;
        while unit < self.units || in_flight > 0 {
            while unit < self.units && in_flight < depth && !self.report.failed() {
                self.submit(unit, true);
                unit += 1;
                in_flight += 1;
            }
            if !self.complete(false) {
                return;
            }
            in_flight -= 1;
        }
    }

    /// Read back every written unit and check it.
    fn verify_all(&mut self) {
        let depth = self.opts.iodepth.max(1) as usize;
        let mut unit = 0u64;
        let mut in_flight = 0usize;
        while unit < self.units || in_flight > 0 {
            while unit < self.units && in_flight < depth {
                if self.written[unit as usize] != 0 {
                    self.submit(unit, false);
                    in_flight += 1;
                    self.report.verified_units += 1;
                }
                unit += 1;
            }
            if in_flight == 0 {
                break;
            }
            if !self.complete(false) {
                return;
            }
            in_flight -= 1;
        }
    }
}

/// Run the benchmark on `ctrl`.
pub fn run(ctrl: &Controller, opts: &BenchOptions) -> Result<Report, Error> {
    run_with_progress(ctrl, opts, None)
}

/// [`run`], counting the measured completions into `progress` (for the
/// live status line).
pub fn run_with_progress(
    ctrl: &Controller,
    opts: &BenchOptions,
    progress: Option<&progress::Progress>,
) -> Result<Report, Error> {
    let ns = ctrl.identify_namespace(opts.nsid)?;
    if opts.bs == 0 || opts.bs % ns.block_size != 0 {
        return Err(Error::Usage(format!(
            "--bs {} is not a multiple of the namespace block size {}",
            opts.bs, ns.block_size
        )));
    }
    let numjobs = u64::from(opts.numjobs.max(1));
    let size = if opts.size == 0 {
        ns.size_bytes()
    } else {
        opts.size.min(ns.size_bytes())
    };
    let units_total = size / u64::from(opts.bs);
    let units = units_total / numjobs;
    if units == 0 {
        return Err(Error::Usage(format!(
            "--size {size} gives no {}-byte block per job",
            opts.bs
        )));
    }
    if let Some(p) = progress {
        p.set_bytes_total(units * numjobs * u64::from(opts.bs));
    }
    let depth = opts.iodepth.max(1) as usize;
    let resets_before = ctrl.resets();
    let mut queues = Vec::new();
    for _ in 0..numjobs {
        queues.push(ctrl.io_queue(PriorityClass::Medium)?);
    }
    let report = std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| {
                s.spawn(move || {
                    let mut job = Job {
                        q,
                        opts,
                        nsid: opts.nsid,
                        block_size: ns.block_size,
                        first_unit: i as u64 * units,
                        units,
                        written: if opts.verify {
                            vec![0; units as usize]
                        } else {
                            Vec::new()
                        },
                        busy: if opts.verify {
                            vec![false; units as usize]
                        } else {
                            Vec::new()
                        },
                        rng: Rng::new(opts.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9)),
                        next_seq: 0,
                        slots: vec![None; depth],
                        free: (0..depth).collect(),
                        report: Report::default(),
                        scratch: Vec::new(),
                        pool: Vec::new(),
                        progress,
                    };
                    let reads = !matches!(opts.pattern, Pattern::Write | Pattern::RandWrite);
                    if opts.verify && reads {
                        job.prefill();
                    }
                    let start = Instant::now();
                    let until = (!opts.runtime.is_zero()).then(|| start + opts.runtime);
                    if let Some(p) = progress {
                        p.job_running(true);
                    }
                    job.run(until, true);
                    if let Some(p) = progress {
                        p.job_running(false);
                    }
                    job.report.elapsed = start.elapsed();
                    if opts.verify && !job.report.failed() {
                        job.verify_all();
                    }
                    job.report
                })
            })
            .collect();
        let mut total = Report::default();
        for h in handles {
            match h.join() {
                Ok(r) => total.merge(r),
                Err(_) => {
                    total.errors += 1;
                    total
                        .first_error
                        .get_or_insert_with(|| "a job panicked".into());
                }
            }
        }
        total
    });
    let mut report = report;
    report.resets = ctrl.resets() - resets_before;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_pattern_detects_other_generations_and_units() {
        let mut a = vec![0; 4096];
        fill(&mut a, 5, 1);
        let mut s = Vec::new();
        assert!(check(&a, 5, 1, &mut s));
        assert!(!check(&a, 5, 2, &mut s));
        assert!(!check(&a, 6, 1, &mut s));
    }

    #[test]
    fn patterns_parse_like_fio() {
        assert_eq!(Pattern::parse("randrw"), Some(Pattern::RandRw));
        assert_eq!(Pattern::parse("bogus"), None);
    }
}
