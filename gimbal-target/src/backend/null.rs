//! `null`: keeps nothing. Reads return zeros, writes are dropped. It
//! measures the target's own overhead (the Gimbal paper's NULL device).

use std::io;

use super::{check_range, Backend, BackendInfo};

/// A backend that stores nothing.
#[derive(Debug)]
pub struct NullBackend {
    size_bytes: u64,
}

impl NullBackend {
    /// A null device of `size_bytes`.
    pub fn new(size_bytes: u64) -> Self {
        NullBackend { size_bytes }
    }
}

impl Backend for NullBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            size_bytes: self.size_bytes,
            discard: true,
            discard_zeroes: true,
            volatile_write_cache: false,
            keeps_data: false,
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        check_range(self.size_bytes, offset, data.len() as u64)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_zeros_and_checks_ranges() {
        let b = NullBackend::new(1 << 20);
        let mut buf = vec![1u8; 4096];
        b.write(0, &[7u8; 4096], false).unwrap();
        b.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        assert!(b.read(1 << 20, &mut buf).is_err());
    }
}
