//! Where namespace data lives.
//!
//! Backends are synchronous and thread-safe: the per-namespace pipeline
//! decides on which thread a call runs (inline for memory backends, a
//! blocking-capable worker for files). Offsets and lengths are in bytes and
//! already checked against the namespace size by the front end; a backend
//! still rejects out-of-range requests (with `InvalidInput`) rather than
//! trusting its caller.

mod file;
mod null;
mod ram;
mod sim;
mod uring;

use std::borrow::Cow;
use std::io;
use std::sync::Arc;

pub use file::FileBackend;
pub use null::NullBackend;
pub use ram::RamBackend;
pub use sim::SimBackend;
pub use uring::{UringDone, UringOp};

use crate::config::BackendConfig;

/// What a backend can do; the front end derives Identify fields from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendInfo {
    /// Capacity in bytes (a multiple of the namespace block size).
    pub size_bytes: u64,
    /// Deallocate (discard) is supported.
    pub discard: bool,
    /// Deallocated blocks read back as zeros (reported as DLFEAT).
    pub discard_zeroes: bool,
    /// Writes may sit in a volatile cache until a flush (reported as VWC).
    pub volatile_write_cache: bool,
    /// Data written can be read back (false for `null`).
    pub keeps_data: bool,
}

/// A namespace's storage.
pub trait Backend: Send + Sync + 'static {
    /// Capabilities and size.
    fn info(&self) -> BackendInfo;
    /// Fills `buf` from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Reads `len` bytes at `offset` into a buffer of the backend's
    /// choosing. The default allocates and calls [`Backend::read`]; a
    /// backend that can hand out data without copying it overrides this.
    fn read_to_buffer(&self, offset: u64, len: usize) -> io::Result<Cow<'static, [u8]>> {
        let mut buf = vec![0u8; len];
        self.read(offset, &mut buf)?;
        Ok(Cow::Owned(buf))
    }
    /// Writes `data` at `offset`; with `fua` the data is durable on return.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Zeroes `len` bytes at `offset`.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Deallocates `len` bytes at `offset` (reads return zeros afterwards
    /// when `discard_zeroes`).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Whether calls may block for long (file I/O) and so must not run on
    /// an event-loop thread.
    fn may_block(&self) -> bool {
        false
    }
    /// Starts `op` without blocking the caller, calling `done` when it
    /// completes, if the backend has an asynchronous engine for it (the
    /// `file` backend's io_uring); otherwise hands both back, and the caller
    /// runs the operation itself.
    fn submit_async(&self, op: UringOp, done: UringDone) -> Result<(), (UringOp, UringDone)> {
        Err((op, done))
    }
    /// How many times slower than real time the device's own clock runs (1
    /// for real devices; a `sim` device's `time_scale`). The Gimbal switch
    /// runs on the device's clock, so its latency thresholds and rates
    /// keep their meaning on a slowed-down simulated device.
    fn time_scale(&self) -> f64 {
        1.0
    }
    /// For a backend that models its latency rather than taking it
    /// (`sim`): the store that moves the data without waiting, so the
    /// pipeline can [`book`](Backend::book) an I/O, move its data at once
    /// and complete it on a timer instead of parking a thread in a sleep.
    fn untimed(&self) -> Option<&dyn Backend> {
        None
    }
    /// Books an I/O of `bytes` at `offset` on the latency model and returns
    /// the real instant it completes (only when [`untimed`](Backend::untimed)
    /// is `Some`).
    fn book(
        &self,
        _kind: qos_core::types::IoKind,
        _offset: u64,
        _bytes: u64,
    ) -> Option<std::time::Instant> {
        None
    }
}

/// Opens the backend a namespace configuration describes.
pub fn open(config: &BackendConfig, block_size: u32) -> io::Result<Arc<dyn Backend>> {
    Ok(match config {
        BackendConfig::Ram { size_bytes } => Arc::new(RamBackend::new(*size_bytes)),
        BackendConfig::Null { size_bytes } => Arc::new(NullBackend::new(*size_bytes)),
        BackendConfig::Sim {
            size_bytes,
            profile,
            time_scale,
        } => Arc::new(SimBackend::new(*size_bytes, *profile, *time_scale)?),
        BackendConfig::File { path, size_bytes } => {
            Arc::new(FileBackend::open(path, *size_bytes, block_size)?)
        }
    })
}

/// Rejects a range that does not fit in `size`.
pub(crate) fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} beyond backend size {size}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract every data-keeping backend must meet.
    pub(crate) fn exercise(b: &dyn Backend) {
        let size = b.info().size_bytes;
        let mut buf = vec![0xAAu8; 8192];
        b.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0), "fresh backend reads zeros");
        let data: Vec<u8> = (0..12288u32).map(|i| (i * 7 + 3) as u8).collect();
        b.write(4096, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        b.read(4096, &mut back).unwrap();
        assert_eq!(back, data);
        b.write(size - 4096, &data[..4096], true).unwrap();
        b.flush().unwrap();
        b.write_zeroes(8192, 4096).unwrap();
        b.read(4096, &mut back).unwrap();
        assert_eq!(&back[..4096], &data[..4096]);
        assert!(back[4096..8192].iter().all(|&x| x == 0));
        assert_eq!(&back[8192..], &data[8192..]);
        if b.info().discard_zeroes {
            b.discard(4096, 12288).unwrap();
            b.read(4096, &mut back).unwrap();
            assert!(back.iter().all(|&x| x == 0));
        }
        assert!(b.write(size - 512, &data[..4096], false).is_err());
        assert!(b.read(u64::MAX - 10, &mut back).is_err());
    }

    #[test]
    fn range_check_catches_overflow() {
        assert!(check_range(100, 50, 50).is_ok());
        assert!(check_range(100, 50, 51).is_err());
        assert!(check_range(100, u64::MAX, 2).is_err());
    }
}
