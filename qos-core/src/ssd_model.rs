//! A deterministic NAND SSD model for simulations and the target's
//! simulated backend, calibrated to the Gimbal paper's device (Samsung
//! DCT983 960 GB, §2.3, §5.1, Appendix A).
//!
//! # What it models
//!
//! - **Internal parallelism.** `dies` NAND dies, each a server with a
//!   timeline of reserved busy intervals. A read needs one *sense* per
//!   `sense_unit_bytes` of contiguous data on one die (a 16 KiB multi-plane
//!   page), occupying the die for `read_sense_ns` plus the transfer of its
//!   bytes over the die's bus (`die_transfer_bytes_per_sec`).
//! - **Size-dependent service time.** A 4 KiB read costs a whole sense; a
//!   128 KiB read of sequentially written data needs eight senses on eight
//!   dies in parallel, and all data crosses one host link
//!   (`host_link_bytes_per_sec`, PCIe 3.0 ×4), which caps large transfers.
//!   So 4 KiB random reads are die-bound (~1.6 GB/s) and 128 KiB reads are
//!   link-bound (~3.2 GB/s), as on the DCT983.
//! - **Write buffer.** A write crosses the link, lands in a DRAM buffer of
//!   `write_buffer_bytes` and completes (`buffer_write_ns`). Buffered data is
//!   programmed in `program_unit_bytes` units (`program_ns` of die time)
//!   in the background, in slices of at most `flush_slice_ns` and only
//!   when the die has no read waiting: reads first, and a read waits at
//!   most one slice for background work (firmware with read-priority
//!   queues and program/erase suspend). Each suspension costs
//!   `suspend_resume_ns` of extra die time, so interleaving reads with
//!   writes costs more than either alone. A write that finds the buffer full
//!   forces the flush it needs onto the dies and waits for it: bursts are
//!   absorbed, sustained writes get the NAND's real speed and take die
//!   time from reads only as fast as they need buffer space.
//! - **Garbage collection that grows with fragmentation.** The device state
//!   is a `fragmentation` in [0, 1]: 0 is a device preconditioned with large
//!   sequential writes (Clean-SSD), 1 one preconditioned with hours of
//!   4 KiB random writes (Fragment-SSD). Greedy GC picks victim blocks whose
//!   valid ratio is `u = fragmentation × gc_victim_valid_ratio_max`, so each
//!   programmed unit costs a write amplification `WA = 1 / (1 − u)`: before
//!   the program, `WA − 1` GC copy operations (a sense plus a program each)
//!   run on the same die. Host writes move the fragmentation toward their
//!   own pattern (small writes fragment, block-sized writes clean) over
//!   `state_change_bytes` of writes; with the default (the drive's capacity)
//!   a simulated run keeps the state it was preconditioned with, like the
//!   paper re-conditioning the drive before each test. Fragmentation also
//!   scatters logical pages, so on a fragmented device every 4 KiB page of
//!   a large read is its own sense on its own die.
//! - **Read/write interference.** Programs and GC copies occupy the same
//!   dies as reads: a read that arrives while its die programs waits for the
//!   program, and die time spent on writes is lost to reads.
//!
//! # Calibration (defaults, see [`SsdModelConfig::dct983_clean`])
//!
//! | quantity | paper | model (measured by the tests in this module) |
//! |---|---|---|
//! | 4 KiB random read, max | 1.6–1.67 GB/s (§2.3, §5.3) | 32 dies / (72 µs + 5 µs) × 4 KiB: 1.61 GB/s measured at QD 256 (random placement leaves some dies idle) |
//! | 128 KiB read, max | 3.16–3.2 GB/s (§2.3, §5.3) | host link, 3.20 GB/s (the dies could do 5.7 GB/s) |
//! | 128 KiB reads in flight for max | 8 (§4.2) | 3.19 GB/s at 8, 1.75 GB/s at 2 |
//! | unloaded latency of one I/O | ≤ 230 µs (§4.2) | 4 KiB read 86 µs, 128 KiB read 141 µs, 4 KiB write 14 µs (buffered) |
//! | fragmented 4 KiB random write | ≈ 180 MB/s (§3.3) | WA 5: 32 dies × 16 KiB / (4 × (72 + 500) µs + 500 µs + 20 µs) = 187 MB/s measured |
//! | clean write | fragmented is 16.9 % of clean (App. A), i.e. ≈ 1.06 GB/s | 32 dies × 16 KiB / 520 µs: 1.01 GB/s for 4 KiB random and 128 KiB sequential (fragmented is 18.5 % of it) |
//! | 5 % writes in a 4 KiB read stream, fragmented | −42.6 % IOPS (App. A) | −26 % at QD 256 (die time plus 35 µs per suspension; the real device loses more, to contention the model leaves out) |
//! | write latency while the buffer absorbs | ≈ 70 µs end to end (§5.5) | 14 µs at the device |
//!
//! The die count, sense and program times are plausible TLC values chosen
//! so that the products above match; the model does not claim the DCT983
//! has exactly these internals.
//!
//! # Determinism and the clock
//!
//! The model never reads a clock. [`SsdModel::submit`] takes `now` (which
//! must not go backwards) and returns the completion time, decided at
//! submission: the model reserves die and link time first-fit in per-
//! resource timelines, and later submissions only ever fill gaps that are
//! still free, so an already announced completion never moves. Background
//! flushing is scheduled lazily at the next call into idle die time that
//! began since the previous call, which is causal because nothing arrived
//! in between. Service times get a seeded ±`jitter_pct` perturbation
//! (splitmix64); the same configuration and the same calls give the same
//! completions.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::config::{check_nonzero, KIB, MIB};
use crate::error::{QosError, Result};
use crate::time::{Nanos, NANOS_PER_SEC};
use crate::types::IoKind;

/// Logical page size of the model (the FTL's mapping unit) in bytes.
pub const PAGE_BYTES: u64 = 4096;

/// Parameters of the SSD model. [`Default`] is the clean DCT983 calibration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdModelConfig {
    /// Independent NAND dies. Default 32.
    pub dies: u32,
    /// Contiguous bytes one sense reads (a multi-plane page). Default 16 KiB.
    pub sense_unit_bytes: u64,
    /// Die time of one sense, before its data transfer. Default 72 µs.
    pub read_sense_ns: u64,
    /// Bus speed between a die and the controller, bytes per second.
    /// Default 800 MB/s (ONFI 4).
    pub die_transfer_bytes_per_sec: u64,
    /// Bytes one program writes. Default 16 KiB.
    pub program_unit_bytes: u64,
    /// Die time of one program, before its data transfer. Default 500 µs.
    pub program_ns: u64,
    /// Host link speed (PCIe), bytes per second. Default 3.2 GB/s.
    pub host_link_bytes_per_sec: u64,
    /// Controller time per command (fetch, FTL look-up, completion), not
    /// queued. Default 8 µs.
    pub command_overhead_ns: u64,
    /// DRAM write buffer capacity. Default 1 MiB.
    pub write_buffer_bytes: u64,
    /// Time to place a write's data into the buffer. Default 5 µs.
    pub buffer_write_ns: u64,
    /// Longest stretch of background flush work (GC copy or program) a die
    /// does before a queued read may go: program/erase suspend. Default
    /// 50 µs.
    pub flush_slice_ns: u64,
    /// Die time a read adds when it has to suspend background work on its
    /// die (suspend plus resume). This is what makes mixing reads and
    /// writes cost more than the sum of the parts (Appendix A). Default
    /// 35 µs.
    pub suspend_resume_ns: u64,
    /// Device state: 0 = clean (sequentially preconditioned), 1 = fully
    /// fragmented (random-write preconditioned). Default 0.
    pub fragmentation: f64,
    /// Valid-page ratio of GC victim blocks on a fully fragmented device;
    /// write amplification is 1 / (1 − fragmentation × this). In [0, 1).
    /// Default 0.8 (WA 5).
    pub gc_victim_valid_ratio_max: f64,
    /// Bytes of host writes that move the fragmentation all the way toward
    /// the written pattern. Default 960 GB (the drive's capacity).
    pub state_change_bytes: u64,
    /// Erase-block size: writes of at least this size leave no
    /// fragmentation behind. Default 4 MiB.
    pub erase_block_bytes: u64,
    /// Per-operation service-time jitter in percent (0 to 100). Default 5.
    pub jitter_pct: u32,
    /// Seed of the jitter generator and of the random offsets chosen by
    /// [`SsdModel::submit_random`].
    pub seed: u64,
}

impl Default for SsdModelConfig {
    fn default() -> Self {
        SsdModelConfig::dct983_clean()
    }
}

impl SsdModelConfig {
    /// The DCT983 preconditioned with 128 KiB sequential writes (the
    /// paper's Clean-SSD).
    pub fn dct983_clean() -> Self {
        SsdModelConfig {
            dies: 32,
            sense_unit_bytes: 16 * KIB,
            read_sense_ns: 72_000,
            die_transfer_bytes_per_sec: 800_000_000,
            program_unit_bytes: 16 * KIB,
            program_ns: 500_000,
            host_link_bytes_per_sec: 3_200_000_000,
            command_overhead_ns: 8_000,
            write_buffer_bytes: MIB,
            buffer_write_ns: 5_000,
            flush_slice_ns: 50_000,
            suspend_resume_ns: 35_000,
            fragmentation: 0.0,
            gc_victim_valid_ratio_max: 0.8,
            state_change_bytes: 960_000_000_000,
            erase_block_bytes: 4 * MIB,
            jitter_pct: 5,
            seed: 0,
        }
    }

    /// The DCT983 preconditioned with hours of 4 KiB random writes (the
    /// paper's Fragment-SSD).
    pub fn dct983_fragmented() -> Self {
        SsdModelConfig {
            fragmentation: 1.0,
            ..SsdModelConfig::dct983_clean()
        }
    }

    /// The same configuration with another seed.
    pub fn with_seed(self, seed: u64) -> Self {
        SsdModelConfig { seed, ..self }
    }

    /// Rejects out-of-range values, naming the field.
    pub fn validate(&self) -> Result<()> {
        check_nonzero("dies", u64::from(self.dies))?;
        for (field, value) in [
            ("sense_unit_bytes", self.sense_unit_bytes),
            ("program_unit_bytes", self.program_unit_bytes),
            ("erase_block_bytes", self.erase_block_bytes),
        ] {
            if value < PAGE_BYTES || value % PAGE_BYTES != 0 {
                return Err(QosError::invalid(
                    field,
                    format!("must be a non-zero multiple of 4 KiB, got {value}"),
                ));
            }
        }
        check_nonzero("read_sense_ns", self.read_sense_ns)?;
        check_nonzero("program_ns", self.program_ns)?;
        check_nonzero("flush_slice_ns", self.flush_slice_ns)?;
        check_nonzero(
            "die_transfer_bytes_per_sec",
            self.die_transfer_bytes_per_sec,
        )?;
        check_nonzero("host_link_bytes_per_sec", self.host_link_bytes_per_sec)?;
        check_nonzero("state_change_bytes", self.state_change_bytes)?;
        if self.write_buffer_bytes < self.program_unit_bytes {
            return Err(QosError::invalid(
                "write_buffer_bytes",
                "must hold at least one program unit",
            ));
        }
        if !(self.fragmentation.is_finite() && (0.0..=1.0).contains(&self.fragmentation)) {
            return Err(QosError::invalid("fragmentation", "must be in [0, 1]"));
        }
        if !(self.gc_victim_valid_ratio_max.is_finite()
            && (0.0..0.99).contains(&self.gc_victim_valid_ratio_max))
        {
            return Err(QosError::invalid(
                "gc_victim_valid_ratio_max",
                "must be in [0, 0.99)",
            ));
        }
        if self.jitter_pct > 100 {
            return Err(QosError::invalid("jitter_pct", "must be at most 100"));
        }
        Ok(())
    }
}

/// Busy intervals of one resource, sorted and disjoint, in nanoseconds,
/// each marked as background work (flushing) or not.
#[derive(Clone, Debug, Default)]
struct Timeline {
    busy: VecDeque<(u64, u64, bool)>,
}

impl Timeline {
    /// Forgets intervals that ended at or before `t`.
    fn prune(&mut self, t: u64) {
        while self.busy.front().is_some_and(|&(_, end, _)| end <= t) {
            self.busy.pop_front();
        }
    }

    /// The earliest start at or after `ready` of a free gap of `duration`.
    fn first_fit(&self, ready: u64, duration: u64) -> u64 {
        let mut start = ready;
        for &(begin, end, _) in &self.busy {
            if end <= start {
                continue;
            }
            if begin >= start.saturating_add(duration) {
                break;
            }
            start = end;
        }
        start
    }

    /// Whether background work ends exactly at `t` (an operation starting
    /// at `t` had to wait for it).
    fn background_ends_at(&self, t: u64) -> bool {
        let at = self.busy.partition_point(|&(_, end, _)| end < t);
        self.busy
            .get(at)
            .is_some_and(|&(_, end, background)| end == t && background)
    }

    /// The first instant at or after `t` when the resource is idle.
    fn first_idle(&self, t: u64) -> u64 {
        self.first_fit(t, 1)
    }

    /// Reserves `duration` of foreground work at the first fit from
    /// `ready`; returns the end.
    fn reserve(&mut self, ready: u64, duration: u64) -> u64 {
        self.reserve_kind(ready, duration, false)
    }

    /// Reserves `duration` at the first fit from `ready`; returns the end.
    fn reserve_kind(&mut self, ready: u64, duration: u64, background: bool) -> u64 {
        let start = self.first_fit(ready, duration);
        let end = start.saturating_add(duration.max(1));
        let at = self.busy.partition_point(|&(begin, _, _)| begin < start);
        // Merge with touching neighbours of the same kind to keep the
        // timeline short.
        let touches_prev =
            at > 0 && self.busy[at - 1].1 == start && self.busy[at - 1].2 == background;
        let touches_next =
            at < self.busy.len() && self.busy[at].0 == end && self.busy[at].2 == background;
        match (touches_prev, touches_next) {
            (true, true) => {
                let next_end = self.busy[at].1;
                self.busy[at - 1].1 = next_end;
                self.busy.remove(at);
            }
            (true, false) => self.busy[at - 1].1 = end,
            (false, true) => self.busy[at].0 = start,
            (false, false) => self.busy.insert(at, (start, end, background)),
        }
        end
    }
}

/// A program unit on its way to one die: the GC copies that must come
/// first, then the program itself.
#[derive(Clone, Copy, Debug)]
struct FlushJob {
    /// Die time still to spend on the job (GC copies, then the program).
    remaining_ns: u64,
    pages: u64,
    /// End of the job's latest slice (or when its data was ready).
    ready: u64,
}

/// Lifetime counters of the model, for calibration and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SsdStats {
    /// Host bytes read.
    pub host_read_bytes: u64,
    /// Host bytes written.
    pub host_write_bytes: u64,
    /// Program units written for host data.
    pub programs: u64,
    /// GC copy operations (a sense and a program each).
    pub gc_copies: u64,
    /// Writes that waited for buffer space.
    pub buffer_full_waits: u64,
    /// Reads that suspended background work.
    pub suspensions: u64,
}

/// The SSD model's state.
#[derive(Clone, Debug)]
pub struct SsdModel {
    config: SsdModelConfig,
    dies: Vec<Timeline>,
    host_link: Timeline,
    /// Ready time of each buffered page not yet assigned to a program.
    unscheduled_pages: VecDeque<u64>,
    /// Program end time → pages it frees from the buffer.
    pending_frees: BTreeMap<u64, u64>,
    pending_free_pages: u64,
    /// Per die: the program unit being flushed there, if any.
    flush_jobs: Vec<Option<FlushJob>>,
    buffer_pages_max: u64,
    pages_per_sense: u64,
    pages_per_program: u64,
    fragmentation: f64,
    gc_copy_debt: f64,
    last_call_ns: u64,
    rng_state: u64,
    stats: SsdStats,
}

/// splitmix64 step: the generator behind every random choice of the model.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stateless hash of `x` under `key` (one splitmix64 round).
fn mix(key: u64, x: u64) -> u64 {
    let mut s = key ^ x.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix64(&mut s)
}

fn transfer_ns(bytes: u64, bytes_per_sec: u64) -> u64 {
    (u128::from(bytes) * u128::from(NANOS_PER_SEC)).div_ceil(u128::from(bytes_per_sec)) as u64
}

impl SsdModel {
    /// An idle device in the configured state.
    pub fn new(config: SsdModelConfig) -> Result<Self> {
        config.validate()?;
        Ok(SsdModel {
            dies: vec![Timeline::default(); config.dies as usize],
            host_link: Timeline::default(),
            unscheduled_pages: VecDeque::new(),
            pending_frees: BTreeMap::new(),
            pending_free_pages: 0,
            flush_jobs: vec![None; config.dies as usize],
            buffer_pages_max: config.write_buffer_bytes / PAGE_BYTES,
            pages_per_sense: config.sense_unit_bytes / PAGE_BYTES,
            pages_per_program: config.program_unit_bytes / PAGE_BYTES,
            fragmentation: config.fragmentation,
            gc_copy_debt: 0.0,
            last_call_ns: 0,
            rng_state: config.seed,
            stats: SsdStats::default(),
            config,
        })
    }

    /// The configuration the model was built with.
    pub fn config(&self) -> &SsdModelConfig {
        &self.config
    }

    /// Current fragmentation in [0, 1].
    pub fn fragmentation(&self) -> f64 {
        self.fragmentation
    }

    /// Current write amplification of garbage collection (≥ 1).
    pub fn write_amplification(&self) -> f64 {
        1.0 / (1.0 - self.fragmentation * self.config.gc_victim_valid_ratio_max)
    }

    /// Lifetime counters.
    pub fn stats(&self) -> SsdStats {
        self.stats
    }

    /// Bytes in the write buffer (buffered or being programmed) as of the
    /// latest call.
    pub fn buffered_bytes(&self) -> u64 {
        (self.unscheduled_pages.len() as u64 + self.pending_free_pages) * PAGE_BYTES
    }

    fn jittered(&mut self, ns: u64) -> u64 {
        let pct = u64::from(self.config.jitter_pct);
        if pct == 0 {
            return ns;
        }
        let span = ns * pct / 100;
        let offset = splitmix64(&mut self.rng_state) % (2 * span + 1);
        (ns - span + offset).max(1)
    }

    /// Submits an I/O of `bytes` at byte `offset` at `now`; returns when it
    /// completes. `now` must not go backwards between calls.
    pub fn submit(&mut self, now: Nanos, kind: IoKind, offset: u64, bytes: u64) -> Nanos {
        let now_ns = now.as_nanos().max(self.last_call_ns);
        self.catch_up(now_ns);
        let done = match kind {
            IoKind::Read => self.read(now_ns, offset, bytes),
            IoKind::Write => self.write(now_ns, offset, bytes),
        };
        self.last_call_ns = now_ns;
        Nanos(done)
    }

    /// [`submit`](Self::submit) at a random 4 KiB-aligned offset in the
    /// first 64 GiB, drawn from the model's seeded generator.
    pub fn submit_random(&mut self, now: Nanos, kind: IoKind, bytes: u64) -> Nanos {
        let span_pages = 64 * 1024 * MIB / PAGE_BYTES;
        let offset = (splitmix64(&mut self.rng_state) % span_pages) * PAGE_BYTES;
        self.submit(now, kind, offset, bytes)
    }

    fn read(&mut self, now: u64, offset: u64, bytes: u64) -> u64 {
        self.stats.host_read_bytes += bytes;
        let ready = now + self.config.command_overhead_ns;
        let first_page = offset / PAGE_BYTES;
        let pages = bytes.div_ceil(PAGE_BYTES).max(1);
        // Group the pages into senses: (die, sense key) → pages. Pages that
        // fragmentation scattered are their own sense on a hashed die;
        // sequentially laid out pages share a sense unit, units striped
        // over the dies.
        let scatter_below = (self.fragmentation * u64::MAX as f64) as u64;
        let dies = u64::from(self.config.dies);
        // Pages of one sense unit are consecutive, so grouping adjacent
        // pages with the same key finds every sense.
        let mut senses: Vec<((u64, u64), u64)> = Vec::with_capacity(pages.min(64) as usize);
        for page in first_page..first_page + pages {
            let key = if mix(self.config.seed ^ 0x5CA7, page) < scatter_below {
                let die = mix(self.config.seed ^ 0xD1E, page) % dies;
                (die, u64::MAX - page)
            } else {
                let unit = page / self.pages_per_sense;
                (unit % dies, unit)
            };
            match senses.last_mut() {
                Some((last, count)) if *last == key => *count += 1,
                _ => senses.push((key, 1)),
            }
        }
        let mut data_ready = ready;
        for ((die, _), sense_pages) in senses {
            let mut ns = self.jittered(self.config.read_sense_ns)
                + transfer_ns(
                    sense_pages * PAGE_BYTES,
                    self.config.die_transfer_bytes_per_sec,
                );
            let timeline = &self.dies[die as usize];
            let start = timeline.first_fit(ready, ns);
            if start > ready && timeline.background_ends_at(start) {
                // The read suspended background work on its die; suspend
                // and resume cost die time of their own.
                self.stats.suspensions += 1;
                ns += self.config.suspend_resume_ns;
            }
            let end = self.dies[die as usize].reserve(ready, ns);
            data_ready = data_ready.max(end);
        }
        let link_ns = transfer_ns(bytes, self.config.host_link_bytes_per_sec);
        self.host_link.reserve(data_ready, link_ns)
    }

    fn write(&mut self, now: u64, _offset: u64, bytes: u64) -> u64 {
        self.stats.host_write_bytes += bytes;
        self.evolve_fragmentation(bytes);
        let ready = now + self.config.command_overhead_ns;
        let link_ns = transfer_ns(bytes, self.config.host_link_bytes_per_sec);
        let data_in = self.host_link.reserve(ready, link_ns);
        let pages = bytes.div_ceil(PAGE_BYTES).max(1);
        let admitted = self.admit(now, pages.min(self.buffer_pages_max));
        if admitted > data_in {
            self.stats.buffer_full_waits += 1;
        }
        let in_buffer = data_in.max(admitted);
        for _ in 0..pages {
            self.unscheduled_pages.push_back(in_buffer);
        }
        in_buffer + self.config.buffer_write_ns
    }

    /// Moves the fragmentation toward what a write of `bytes` leaves behind.
    fn evolve_fragmentation(&mut self, bytes: u64) {
        let target = 1.0 - (bytes as f64 / self.config.erase_block_bytes as f64).min(1.0);
        let step = (bytes as f64 / self.config.state_change_bytes as f64).min(1.0);
        self.fragmentation += (target - self.fragmentation) * step;
    }

    fn occupied_pages(&self) -> u64 {
        self.unscheduled_pages.len() as u64
            + self.pending_free_pages
            + self
                .flush_jobs
                .iter()
                .flatten()
                .map(|j| j.pages)
                .sum::<u64>()
    }

    /// The time from which `pages` more pages fit into the buffer. If they
    /// do not fit now, the flushes that free space soonest are forced onto
    /// the dies (after whatever is already queued there).
    fn admit(&mut self, now: u64, pages: u64) -> u64 {
        let cap = self.buffer_pages_max;
        if self.occupied_pages() + pages <= cap {
            return now;
        }
        // Bounded: every pass finishes a job or starts one from buffered
        // pages, and there are at most dies + buffer pages of those.
        loop {
            if let Some(at) = self.first_time_with_room(pages) {
                return at;
            }
            if !self.force_one_flush(now) {
                return now;
            }
        }
    }

    /// The earliest end of a scheduled program after which `pages` more
    /// pages fit, counting buffered and in-job pages as staying.
    fn first_time_with_room(&self, pages: u64) -> Option<u64> {
        let cap = self.buffer_pages_max;
        let mut still = self.occupied_pages();
        for (&end, &freed) in &self.pending_frees {
            still -= freed;
            if still + pages <= cap {
                return Some(end);
            }
        }
        None
    }

    /// Reserves every remaining operation of the flush job that can finish
    /// first (starting a job from buffered pages on an idle-soonest die if
    /// that is sooner or no job is running). False if nothing is left to
    /// flush.
    fn force_one_flush(&mut self, now: u64) -> bool {
        // Estimated finish: first idle instant plus the remaining die time
        // (gaps between queued reads only make it later for all alike).
        let running = (0..self.dies.len())
            .filter_map(|d| {
                let job = self.flush_jobs[d]?;
                Some((
                    self.dies[d].first_idle(job.ready.max(now)) + job.remaining_ns,
                    d,
                ))
            })
            .min();
        let fresh = if self.unscheduled_pages.is_empty() {
            None
        } else {
            // The job cannot start before its data is in the buffer.
            let take = (self.unscheduled_pages.len() as u64).min(self.pages_per_program);
            let ready = self
                .unscheduled_pages
                .iter()
                .take(take as usize)
                .fold(now, |a, &b| a.max(b));
            self.earliest_idle_die_without_job(ready).map(|d| {
                let chain_ns = self.write_amplification()
                    * (self.config.read_sense_ns + self.config.program_ns) as f64;
                (self.dies[d].first_idle(ready) + chain_ns as u64, d)
            })
        };
        let die = match (running, fresh) {
            (Some(r), Some(f)) => {
                if f < r {
                    f.1
                } else {
                    r.1
                }
            }
            (Some(r), None) => r.1,
            (None, Some(f)) => f.1,
            (None, None) => return false,
        };
        if self.flush_jobs[die].is_none() {
            self.start_job(die, now, true);
        }
        while self.flush_jobs[die].is_some() {
            self.next_flush_op(die, now);
        }
        true
    }

    fn earliest_idle_die_without_job(&self, t: u64) -> Option<usize> {
        (0..self.dies.len())
            .filter(|&d| self.flush_jobs[d].is_none())
            .min_by_key(|&d| (self.dies[d].first_idle(t), d))
    }

    /// Takes the oldest buffered pages (a full program unit, or fewer when
    /// `allow_partial`) into a flush job on `die`. False if there were not
    /// enough.
    fn start_job(&mut self, die: usize, not_before: u64, allow_partial: bool) -> bool {
        let available = self.unscheduled_pages.len() as u64;
        if available == 0 || (!allow_partial && available < self.pages_per_program) {
            return false;
        }
        let take = available.min(self.pages_per_program);
        let ready = self
            .unscheduled_pages
            .drain(..take as usize)
            .fold(not_before, u64::max);
        self.gc_copy_debt += self.write_amplification() - 1.0;
        let copies = self.gc_copy_debt.floor();
        self.gc_copy_debt -= copies;
        let copies = copies as u64;
        let mut remaining_ns = self.jittered(self.config.program_ns)
            + transfer_ns(
                self.config.program_unit_bytes,
                self.config.die_transfer_bytes_per_sec,
            );
        for _ in 0..copies {
            remaining_ns += self.jittered(self.config.read_sense_ns + self.config.program_ns);
        }
        self.stats.gc_copies += copies;
        self.stats.programs += 1;
        self.flush_jobs[die] = Some(FlushJob {
            remaining_ns,
            pages: take,
            ready,
        });
        true
    }

    /// Reserves the next slice (at most `flush_slice_ns`) of `die`'s flush
    /// job, first fit from when its previous slice ended (and not before
    /// `not_before`); returns the slice's start. The last slice frees the
    /// job's pages from the buffer when it ends.
    fn next_flush_op(&mut self, die: usize, not_before: u64) -> u64 {
        let mut job = self.flush_jobs[die].expect("a running job");
        let from = job.ready.max(not_before);
        let ns = job.remaining_ns.min(self.config.flush_slice_ns).max(1);
        let start = self.dies[die].first_fit(from, ns);
        let end = self.dies[die].reserve_kind(from, ns, true);
        job.remaining_ns = job.remaining_ns.saturating_sub(ns);
        job.ready = end;
        if job.remaining_ns > 0 {
            self.flush_jobs[die] = Some(job);
        } else {
            *self.pending_frees.entry(end).or_default() += job.pages;
            self.pending_free_pages += job.pages;
            self.flush_jobs[die] = None;
        }
        start
    }

    /// Brings the background work up to `now`: frees buffer space of
    /// finished programs, and gives every die that fell idle since the
    /// previous call its next flush operation (nothing arrived in between,
    /// so these are the decisions the device would have made at the time;
    /// reads queued before then keep their place: reads first).
    fn catch_up(&mut self, now: u64) {
        let since = self.last_call_ns;
        while let Some((&end, &pages)) = self.pending_frees.first_key_value() {
            if end > now {
                break;
            }
            self.pending_frees.pop_first();
            self.pending_free_pages -= pages;
        }
        let flushable = self.flush_jobs.iter().any(Option::is_some)
            || self.unscheduled_pages.len() as u64 >= self.pages_per_program;
        for die in 0..self.dies.len() {
            if !flushable {
                break;
            }
            // Bounded: each pass reserves one operation that starts before
            // `now` and lasts at least 1 ns, or stops.
            loop {
                let idle_from = match self.flush_jobs[die] {
                    Some(job) => self.dies[die].first_idle(job.ready.max(since)),
                    None => {
                        let Some(&oldest) = self.unscheduled_pages.front() else {
                            break;
                        };
                        if (self.unscheduled_pages.len() as u64) < self.pages_per_program {
                            break;
                        }
                        self.dies[die].first_idle(oldest.max(since))
                    }
                };
                if idle_from >= now {
                    break;
                }
                if self.flush_jobs[die].is_none() && !self.start_job(die, idle_from, false) {
                    break;
                }
                let start = self.next_flush_op(die, idle_from);
                debug_assert!(start >= since);
                if start >= now {
                    break;
                }
            }
        }
        for die in &mut self.dies {
            die.prune(since);
        }
        self.host_link.prune(since);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// Runs `queue_depth` closed-loop I/Os of one kind and size against the
    /// model for `duration_ms`; returns (bytes/s after a warm-up of a fifth
    /// of the run, mean latency in µs).
    fn closed_loop(
        config: SsdModelConfig,
        kind: IoKind,
        bytes: u64,
        sequential: bool,
        queue_depth: u32,
        duration_ms: u64,
    ) -> (f64, f64) {
        let mut m = SsdModel::new(config).unwrap();
        let mut rng = 42u64;
        let mut next_offset = 0u64;
        let mut offset = |rng: &mut u64| {
            if sequential {
                next_offset += bytes;
                next_offset - bytes
            } else {
                (splitmix64(rng) % (1 << 24)) * bytes
            }
        };
        let end = duration_ms * 1_000_000;
        let warm = end / 5;
        let mut heap = BinaryHeap::new();
        for _ in 0..queue_depth {
            let o = offset(&mut rng);
            heap.push(Reverse((m.submit(Nanos(0), kind, o, bytes).0, 0u64)));
        }
        let (mut done_bytes, mut lat_sum, mut n) = (0u64, 0u64, 0u64);
        while let Some(Reverse((t, issued))) = heap.pop() {
            if t > end {
                break;
            }
            if t >= warm {
                done_bytes += bytes;
                lat_sum += t - issued;
                n += 1;
            }
            let o = offset(&mut rng);
            heap.push(Reverse((m.submit(Nanos(t), kind, o, bytes).0, t)));
        }
        let secs = (end - warm) as f64 / 1e9;
        (
            done_bytes as f64 / secs,
            lat_sum as f64 / n.max(1) as f64 / 1e3,
        )
    }

    fn gbps(bps: f64) -> f64 {
        bps / 1e9
    }

    #[test]
    fn calibration_4k_random_read_is_about_1_6_gbps() {
        let (bw, _) = closed_loop(
            SsdModelConfig::dct983_clean(),
            IoKind::Read,
            4 * KIB,
            false,
            256,
            30,
        );
        assert!((1.5..1.75).contains(&gbps(bw)), "{} GB/s", gbps(bw));
        // The same on a fragmented device: 4 KiB reads were always one sense.
        let (bw, _) = closed_loop(
            SsdModelConfig::dct983_fragmented(),
            IoKind::Read,
            4 * KIB,
            false,
            256,
            30,
        );
        assert!((1.5..1.75).contains(&gbps(bw)), "{} GB/s", gbps(bw));
    }

    #[test]
    fn calibration_128k_read_is_about_3_2_gbps_and_needs_about_8_in_flight() {
        let (bw, _) = closed_loop(
            SsdModelConfig::dct983_clean(),
            IoKind::Read,
            128 * KIB,
            false,
            32,
            30,
        );
        assert!((3.0..3.25).contains(&gbps(bw)), "{} GB/s", gbps(bw));
        let (bw8, _) = closed_loop(
            SsdModelConfig::dct983_clean(),
            IoKind::Read,
            128 * KIB,
            false,
            8,
            30,
        );
        let (bw2, _) = closed_loop(
            SsdModelConfig::dct983_clean(),
            IoKind::Read,
            128 * KIB,
            false,
            2,
            30,
        );
        assert!(bw8 > 0.85 * bw, "QD8 {} of {}", gbps(bw8), gbps(bw));
        assert!(bw2 < 0.7 * bw, "QD2 {} of {}", gbps(bw2), gbps(bw));
    }

    #[test]
    fn calibration_fragmented_4k_random_write_is_about_180_mbps() {
        let (bw, lat_us) = closed_loop(
            SsdModelConfig::dct983_fragmented(),
            IoKind::Write,
            4 * KIB,
            false,
            64,
            200,
        );
        assert!((160e6..205e6).contains(&bw), "{} MB/s", bw / 1e6);
        // Sustained overload shows the NAND speed in the latency, not the
        // buffer: Little's law, 64 × 4 KiB at ~180 MB/s ≈ 1.4 ms.
        assert!(lat_us > 1000.0, "{lat_us} µs");
    }

    #[test]
    fn calibration_clean_writes_are_much_faster_than_fragmented() {
        let (seq, _) = closed_loop(
            SsdModelConfig::dct983_clean(),
            IoKind::Write,
            128 * KIB,
            true,
            4,
            60,
        );
        let (rand4k, _) = closed_loop(
            SsdModelConfig::dct983_clean(),
            IoKind::Write,
            4 * KIB,
            false,
            64,
            60,
        );
        assert!((0.9..1.1).contains(&gbps(seq)), "{} GB/s", gbps(seq));
        assert!((0.9..1.1).contains(&gbps(rand4k)), "{} GB/s", gbps(rand4k));
    }

    #[test]
    fn unloaded_latencies_are_below_thresh_min() {
        let mut m = SsdModel::new(SsdModelConfig {
            jitter_pct: 0,
            ..SsdModelConfig::dct983_clean()
        })
        .unwrap();
        let read4k = m.submit(Nanos(0), IoKind::Read, 0, 4 * KIB).0;
        assert_eq!(read4k, 8_000 + 72_000 + 5_120 + 1_280);
        let t = 10_000_000;
        let read128k = m.submit(Nanos(t), IoKind::Read, 0, 128 * KIB).0 - t;
        // Eight senses of 16 KiB in parallel (72 µs + 20.5 µs) then 41 µs
        // over the link.
        assert_eq!(read128k, 8_000 + 72_000 + 20_480 + 40_960);
        let t = 20_000_000;
        let write4k = m.submit(Nanos(t), IoKind::Write, 0, 4 * KIB).0 - t;
        assert_eq!(write4k, 8_000 + 1_280 + 5_000);
        assert!(read128k < 230_000);
    }

    #[test]
    fn the_write_buffer_absorbs_a_burst_even_when_fragmented() {
        let mut m = SsdModel::new(SsdModelConfig::dct983_fragmented()).unwrap();
        // A burst of half the buffer: all at buffered latency.
        for i in 0..128u64 {
            let done = m.submit(Nanos(0), IoKind::Write, i * 4096, 4 * KIB).0;
            assert!(done < 500_000, "write {i} done at {done}");
        }
        // A burst past the buffer waits for programs at NAND speed.
        let mut last = 0;
        for i in 128..2048u64 {
            last = m.submit(Nanos(0), IoKind::Write, i * 4096, 4 * KIB).0;
        }
        assert!(last > 10_000_000, "{last}");
        assert!(m.stats().buffer_full_waits > 0);
    }

    #[test]
    fn gc_cost_grows_with_fragmentation() {
        let bw_at = |fragmentation: f64| {
            closed_loop(
                SsdModelConfig {
                    fragmentation,
                    ..SsdModelConfig::dct983_clean()
                },
                IoKind::Write,
                4 * KIB,
                false,
                64,
                120,
            )
            .0
        };
        let (clean, half, full) = (bw_at(0.0), bw_at(0.5), bw_at(1.0));
        assert!(
            clean > half * 1.3 && half > full * 1.3,
            "{clean} {half} {full}"
        );
        let m = SsdModel::new(SsdModelConfig::dct983_fragmented()).unwrap();
        assert!((m.write_amplification() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn small_random_writes_fragment_a_clean_device() {
        let mut m = SsdModel::new(SsdModelConfig {
            state_change_bytes: 64 * MIB,
            ..SsdModelConfig::dct983_clean()
        })
        .unwrap();
        let mut t = 0;
        for i in 0..8192u64 {
            t = m
                .submit(Nanos(t), IoKind::Write, i * 7919 * 4096, 4 * KIB)
                .0;
        }
        assert!(m.fragmentation() > 0.3, "{}", m.fragmentation());
        let before = m.fragmentation();
        for i in 0..64u64 {
            t = m.submit(Nanos(t), IoKind::Write, i * 4 * MIB, 4 * MIB).0;
        }
        assert!(m.fragmentation() < before, "{}", m.fragmentation());
    }

    #[test]
    fn writes_interfere_with_reads() {
        // Appendix A: on a fragmented device a few writes cost many reads.
        let mix_bw = |write_every: u64| {
            let mut m = SsdModel::new(SsdModelConfig::dct983_fragmented()).unwrap();
            let mut heap = BinaryHeap::new();
            let mut n = 0u64;

            let mut rng = 9u64;
            let mut issue = |m: &mut SsdModel, t: u64, n: &mut u64| {
                *n += 1;
                let kind = if write_every > 0 && *n % write_every == 0 {
                    IoKind::Write
                } else {
                    IoKind::Read
                };
                let offset = (splitmix64(&mut rng) % (1 << 24)) * 4096;
                m.submit(Nanos(t), kind, offset, 4 * KIB).0
            };
            for _ in 0..256 {
                heap.push(Reverse(issue(&mut m, 0, &mut n)));
            }
            let mut done = 0u64;
            while let Some(Reverse(t)) = heap.pop() {
                // Long enough for the buffer to fill: until then the
                // writes' GC work is deferred.
                if t > 400_000_000 {
                    break;
                }
                if t > 200_000_000 {
                    done += 1;
                }
                heap.push(Reverse(issue(&mut m, t, &mut n)));
            }
            done
        };
        let reads_only = mix_bw(0);
        let five_pct_writes = mix_bw(20);
        let drop = 1.0 - five_pct_writes as f64 / reads_only as f64;
        assert!(drop > 0.2, "IOPS drop {drop}");
    }

    #[test]
    fn same_seed_same_run() {
        let run = |seed: u64| {
            let mut m = SsdModel::new(SsdModelConfig::dct983_fragmented().with_seed(seed)).unwrap();
            (0..200u64)
                .map(|i| {
                    let kind = if i % 3 == 0 {
                        IoKind::Write
                    } else {
                        IoKind::Read
                    };
                    m.submit_random(Nanos(i * 3000), kind, 8192).0
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn invalid_config_names_the_field() {
        let cfg = SsdModelConfig {
            dies: 0,
            ..SsdModelConfig::default()
        };
        assert!(matches!(
            SsdModel::new(cfg),
            Err(QosError::InvalidConfig { field: "dies", .. })
        ));
        let cfg = SsdModelConfig {
            fragmentation: 1.5,
            ..SsdModelConfig::default()
        };
        assert!(matches!(
            SsdModel::new(cfg),
            Err(QosError::InvalidConfig {
                field: "fragmentation",
                ..
            })
        ));
    }
}
