//! Byte-addressed devices: the log is read from one, the replay is written
//! to another. A regular file, a block device, or memory (tests).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

// From <linux/fs.h>; libc does not export it.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// A fixed-size device read and written at byte offsets.
pub trait Device {
    /// Size in bytes; nothing past it is read or written.
    fn size_bytes(&self) -> u64;
    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `data` at `offset`.
    fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes what was written durable.
    fn sync(&mut self) -> io::Result<()>;
}

/// A regular file or a block device.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    size_bytes: u64,
}

impl FileDevice {
    /// Opens `path` read-only (a log) or read-write (a replay target). The
    /// size is the file's length or the block device's size.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let meta = file.metadata()?;
        let size_bytes = if meta.file_type().is_block_device() {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 stores one u64 through the pointer, which
            // points at a live local.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            size
        } else {
            meta.len()
        };
        Ok(FileDevice { file, size_bytes })
    }
}

fn check(size: u64, offset: u64, len: usize) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes at {offset} are past the device's end ({size} bytes)"),
        )),
    }
}

impl Device for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check(self.size_bytes, offset, buf.len())?;
        FileExt::read_exact_at(&self.file, buf, offset)
    }
    fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        check(self.size_bytes, offset, data.len())?;
        FileExt::write_all_at(&self.file, data, offset)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

/// A device in memory, of a fixed size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemDevice(pub Vec<u8>);

impl Device for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check(self.size_bytes(), offset, buf.len())?;
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
        Ok(())
    }
    fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        check(self.size_bytes(), offset, data.len())?;
        let at = offset as usize;
        self.0[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_past_the_end_are_errors() {
        let mut d = MemDevice(vec![0; 16]);
        assert!(d.write_all_at(&[1; 4], 12).is_ok());
        assert!(d.write_all_at(&[1; 4], 13).is_err());
        let mut b = [0u8; 4];
        assert!(d.read_exact_at(&mut b, u64::MAX - 1).is_err());
    }

    #[test]
    fn a_file_device_has_the_files_size() {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(4096).unwrap();
        let mut d = FileDevice::open(f.path(), true).unwrap();
        assert_eq!(d.size_bytes(), 4096);
        d.write_all_at(b"abc", 4093).unwrap();
        assert!(d.write_all_at(b"abcd", 4093).is_err());
    }
}
