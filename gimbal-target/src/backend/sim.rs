//! `sim`: a RAM store behind the latencies of a simulated SSD.
//!
//! Each request asks qos-core's deterministic SSD model (calibrated to the
//! Gimbal paper's Samsung DCT983: internal parallelism, write buffer,
//! garbage collection by fragmentation, read/write interference) when it
//! would complete, moves the data in memory, and returns no earlier than
//! that. Model time runs `time_scale` times slower than real time, so a
//! device can be made the bottleneck even for hosts as slow as an emulated
//! VM. Direct calls sleep until the modelled completion; the pipeline
//! instead books each I/O at dispatch ([`Backend::book`]), moves the data at
//! once and completes the request on a timer, so no thread is parked per
//! request and the latency the Gimbal switch measures is the model's, not
//! the host's thread scheduling (which, in an emulated VM, would add
//! milliseconds of real time, i.e. tens of device microseconds at 300x).

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use qos_core::ssd_model::{SsdModel, SsdModelConfig};
use qos_core::time::Nanos;
use qos_core::types::IoKind;

use super::{Backend, BackendInfo, RamBackend};
use crate::config::SimProfile;

/// A simulated SSD.
#[derive(Debug)]
pub struct SimBackend {
    data: RamBackend,
    model: Mutex<SsdModel>,
    epoch: Instant,
    time_scale: f64,
}

impl SimBackend {
    /// A simulated device of `size_bytes` in the given state.
    pub fn new(size_bytes: u64, profile: SimProfile, time_scale: f64) -> io::Result<Self> {
        let config = match profile {
            SimProfile::Clean => SsdModelConfig::dct983_clean(),
            SimProfile::Fragmented => SsdModelConfig::dct983_fragmented(),
        };
        let model = SsdModel::new(config)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(SimBackend {
            data: RamBackend::new(size_bytes),
            model: Mutex::new(model),
            epoch: Instant::now(),
            time_scale,
        })
    }

    /// Model time now: real time since start, slowed by `time_scale`.
    fn model_now(&self) -> Nanos {
        Nanos((self.epoch.elapsed().as_nanos() as f64 / self.time_scale) as u64)
    }

    /// Books the I/O on the model and returns the real instant it completes.
    fn book_at(&self, kind: IoKind, offset: u64, bytes: u64) -> Instant {
        let done = {
            let mut m = self.model.lock().unwrap_or_else(|e| e.into_inner());
            let now = self.model_now();
            m.submit(now, kind, offset, bytes)
        };
        self.epoch + Duration::from_nanos((done.as_nanos() as f64 * self.time_scale) as u64)
    }

    fn wait_until(deadline: Instant) {
        let now = Instant::now();
        if deadline > now {
            std::thread::sleep(deadline - now);
        }
    }
}

impl Backend for SimBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            // Like the modeled drive: a volatile write buffer the host must
            // flush (our RAM store keeps data regardless).
            volatile_write_cache: true,
            ..self.data.info()
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let deadline = self.book_at(IoKind::Read, offset, buf.len() as u64);
        self.data.read(offset, buf)?;
        Self::wait_until(deadline);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let deadline = self.book_at(IoKind::Write, offset, data.len() as u64);
        self.data.write(offset, data, fua)?;
        Self::wait_until(deadline);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let deadline = self.book_at(IoKind::Write, offset, len.min(128 * 1024));
        self.data.write_zeroes(offset, len)?;
        Self::wait_until(deadline);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.data.discard(offset, len)
    }

    fn may_block(&self) -> bool {
        true
    }

    fn time_scale(&self) -> f64 {
        self.time_scale
    }

    fn untimed(&self) -> Option<&dyn Backend> {
        Some(&self.data)
    }

    fn book(&self, kind: IoKind, offset: u64, bytes: u64) -> Option<Instant> {
        Some(self.book_at(kind, offset, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_data_and_takes_model_time() {
        let b = SimBackend::new(4 << 20, SimProfile::Fragmented, 100.0).unwrap();
        super::super::tests::exercise(&b);
        // A 4 KiB read costs tens of microseconds in the model; at 100x it
        // must take at least a millisecond of real time.
        let start = Instant::now();
        let mut buf = vec![0u8; 4096];
        b.read(0, &mut buf).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(1));
    }
}
