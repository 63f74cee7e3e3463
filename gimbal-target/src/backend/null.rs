//! `null`: keeps nothing. Reads return zeros, writes are dropped. It
//! measures the target's own overhead (the Gimbal paper's NULL device).

use std::borrow::Cow;
use std::io;

use super::{check_range, Backend, BackendInfo};

/// Zeros for reads: in .bss, so the pages are the kernel's shared zero
/// page until written (never). As large as the largest MDTS allowed.
static ZEROS: [u8; 16 << 20] = [0; 16 << 20];

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
    /// Hands out a slice of a static zero buffer: like the kernel's null_blk,
    /// a null read touches no memory, so it measures only the target.
    fn read_to_buffer(&self, offset: u64, len: usize) -> io::Result<Cow<'static, [u8]>> {
        check_range(self.size_bytes, offset, len as u64)?;
        match ZEROS.get(..len) {
            Some(z) => Ok(Cow::Borrowed(z)),
            None => Ok(Cow::Owned(vec![0u8; len])),
        }
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
