//! A small deterministic SSD model for simulations and the target's
//! simulated backend.
//!
//! The device has `channels` independent NAND channels served in FIFO
//! order. An I/O is split into 4 KiB pages spread round robin over the
//! channels and completes when its last page does, plus a fixed controller
//! overhead. Reads occupy a channel for `read_page_ns`. Writes land in a
//! DRAM write buffer of `write_buffer_bytes` (taking `buffer_write_ns`) and
//! are later programmed to a channel for `program_page_ns ×
//! write_amplification` (garbage collection on a fragmented device is
//! modelled as amplification). When the buffer is full a write waits for
//! the oldest buffered page to be programmed. Programs occupy the same
//! channels as reads, which gives read/write interference.
//!
//! Everything is decided at submission: [`SsdModel::submit`] returns the
//! completion time, so the model needs no clock. An optional seeded jitter
//! (splitmix64) perturbs each page's service time by up to ±`jitter_pct`
//! percent; the same seed gives the same run.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::check_nonzero;
use crate::error::{QosError, Result};
use crate::time::Nanos;
use crate::types::IoKind;

/// Page size of the model in bytes.
pub const PAGE_BYTES: u64 = 4096;

/// Parameters of the SSD model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdModelConfig {
    /// Independent channels. Default 8.
    pub channels: u32,
    /// Channel time of one 4 KiB page read. Default 40 µs.
    pub read_page_ns: u64,
    /// Channel time of one 4 KiB page program, before amplification.
    /// Default 100 µs.
    pub program_page_ns: u64,
    /// Program work per written page (≥ 1): 1 on a clean device, more on a
    /// fragmented one. Default 1.0.
    pub write_amplification: f64,
    /// Write buffer capacity. Default 1 MiB.
    pub write_buffer_bytes: u64,
    /// Time to place one page into the write buffer. Default 10 µs.
    pub buffer_write_ns: u64,
    /// Fixed controller time added to every I/O. Default 10 µs.
    pub controller_overhead_ns: u64,
    /// Per-page service-time jitter in percent (0 to 100). Default 0.
    pub jitter_pct: u32,
    /// Seed of the jitter generator.
    pub seed: u64,
}

impl Default for SsdModelConfig {
    fn default() -> Self {
        SsdModelConfig {
            channels: 8,
            read_page_ns: 40_000,
            program_page_ns: 100_000,
            write_amplification: 1.0,
            write_buffer_bytes: 1024 * 1024,
            buffer_write_ns: 10_000,
            controller_overhead_ns: 10_000,
            jitter_pct: 0,
            seed: 0,
        }
    }
}

impl SsdModelConfig {
    /// Rejects out-of-range values, naming the field.
    pub fn validate(&self) -> Result<()> {
        check_nonzero("channels", u64::from(self.channels))?;
        check_nonzero("read_page_ns", self.read_page_ns)?;
        check_nonzero("program_page_ns", self.program_page_ns)?;
        crate::config::check_at_least("write_amplification", self.write_amplification, 1.0)?;
        if self.write_buffer_bytes < PAGE_BYTES {
            return Err(QosError::invalid(
                "write_buffer_bytes",
                "must hold at least one 4 KiB page",
            ));
        }
        if self.jitter_pct > 100 {
            return Err(QosError::invalid("jitter_pct", "must be at most 100"));
        }
        Ok(())
    }
}

/// The SSD model's state.
#[derive(Clone, Debug)]
pub struct SsdModel {
    config: SsdModelConfig,
    channel_free_at: Vec<Nanos>,
    next_channel: usize,
    /// Program completion time of each buffered page, oldest first.
    buffered_pages: VecDeque<Nanos>,
    buffer_pages_max: usize,
    rng_state: u64,
}

impl SsdModel {
    /// An idle device.
    pub fn new(config: SsdModelConfig) -> Result<Self> {
        config.validate()?;
        Ok(SsdModel {
            channel_free_at: vec![Nanos::ZERO; config.channels as usize],
            next_channel: 0,
            buffered_pages: VecDeque::new(),
            buffer_pages_max: (config.write_buffer_bytes / PAGE_BYTES) as usize,
            rng_state: config.seed,
            config,
        })
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64
        self.rng_state = self.rng_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn jittered(&mut self, ns: u64) -> u64 {
        let pct = u64::from(self.config.jitter_pct);
        if pct == 0 {
            return ns;
        }
        let span = ns * pct / 100;
        let offset = self.next_random() % (2 * span + 1);
        (ns - span + offset).max(1)
    }

    /// Occupies the next channel from `ready` for `ns`; returns the end.
    fn occupy_channel(&mut self, ready: Nanos, ns: u64) -> Nanos {
        let ns = self.jittered(ns);
        let c = self.next_channel;
        self.next_channel = (self.next_channel + 1) % self.channel_free_at.len();
        let start = ready.max(self.channel_free_at[c]);
        let end = start.saturating_add_nanos(ns);
        self.channel_free_at[c] = end;
        end
    }

    /// Submits an I/O at `now`; returns when it completes.
    pub fn submit(&mut self, now: Nanos, kind: IoKind, bytes: u64) -> Nanos {
        let pages = bytes.div_ceil(PAGE_BYTES).max(1);
        let mut done = now;
        for _ in 0..pages {
            let page_done = match kind {
                IoKind::Read => self.occupy_channel(now, self.config.read_page_ns),
                IoKind::Write => self.write_page(now),
            };
            done = done.max(page_done);
        }
        done.saturating_add_nanos(self.config.controller_overhead_ns)
    }

    fn write_page(&mut self, now: Nanos) -> Nanos {
        while self.buffered_pages.front().is_some_and(|&t| t <= now) {
            self.buffered_pages.pop_front();
        }
        let mut ready = now;
        if self.buffered_pages.len() >= self.buffer_pages_max {
            ready = self.buffered_pages.pop_front().expect("buffer is full");
        }
        let buffered = ready.saturating_add_nanos(self.config.buffer_write_ns);
        let program_ns =
            (self.config.program_page_ns as f64 * self.config.write_amplification).round() as u64;
        let programmed = self.occupy_channel(buffered, program_ns);
        self.buffered_pages.push_back(programmed);
        buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_read_latency_is_one_page_plus_overhead() {
        let mut m = SsdModel::new(SsdModelConfig::default()).unwrap();
        assert_eq!(m.submit(Nanos(0), IoKind::Read, 4096), Nanos(50_000));
        // 128 KiB = 32 pages over 8 channels = 4 rounds.
        let mut m = SsdModel::new(SsdModelConfig::default()).unwrap();
        assert_eq!(
            m.submit(Nanos(0), IoKind::Read, 128 * 1024),
            Nanos(4 * 40_000 + 10_000)
        );
    }

    #[test]
    fn writes_are_fast_until_the_buffer_fills() {
        let cfg = SsdModelConfig {
            write_buffer_bytes: 8 * 4096,
            ..SsdModelConfig::default()
        };
        let mut m = SsdModel::new(cfg).unwrap();
        for _ in 0..8 {
            assert_eq!(m.submit(Nanos(0), IoKind::Write, 4096), Nanos(20_000));
        }
        // The ninth waits for the first program (10 µs + 100 µs).
        assert_eq!(
            m.submit(Nanos(0), IoKind::Write, 4096),
            Nanos(110_000 + 20_000)
        );
    }

    #[test]
    fn jitter_is_seeded() {
        let cfg = SsdModelConfig {
            jitter_pct: 20,
            seed: 7,
            ..SsdModelConfig::default()
        };
        let run = |cfg: SsdModelConfig| {
            let mut m = SsdModel::new(cfg).unwrap();
            (0..50)
                .map(|i| m.submit(Nanos(i * 1000), IoKind::Read, 8192))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(cfg.clone()), run(cfg.clone()));
        assert_ne!(run(cfg.clone()), run(SsdModelConfig { seed: 8, ..cfg }));
    }

    #[test]
    fn invalid_config_names_the_field() {
        let cfg = SsdModelConfig {
            channels: 0,
            ..SsdModelConfig::default()
        };
        assert!(matches!(
            SsdModel::new(cfg),
            Err(QosError::InvalidConfig {
                field: "channels",
                ..
            })
        ));
    }
}
