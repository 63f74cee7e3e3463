//! `file`: a regular file or a block device.
//!
//! Data goes through `O_DIRECT` when the file system or device accepts it
//! (the target then does not double-cache what the host's page cache already
//! holds); otherwise, e.g. on tmpfs, through the page cache. Either way the
//! namespace reports a volatile write cache, so hosts send Flush, which maps
//! to `fdatasync`, and FUA writes use `RWF_DSYNC`.
//!
//! Direct I/O goes through io_uring ([`super::uring`]): one ring thread per
//! file keeps many requests in flight without a thread each. What cannot
//! go there (buffered I/O, unaligned requests, discard, write zeroes, or a
//! kernel that refuses io_uring) runs as blocking calls on worker threads
//! ([`Backend::may_block`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::uring::AlignedBuf;
use super::{check_range, Backend, BackendInfo, UringDone, UringOp};

/// Direct I/O buffers are aligned to this (the largest logical block size
/// in common use).
const DIRECT_ALIGN: usize = super::uring::ALIGN;

// From <linux/fs.h>; libc does not export the block ioctls.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// A file- or block-device-backed namespace.
#[derive(Debug)]
pub struct FileBackend {
    buffered: File,
    direct: Option<File>,
    size_bytes: u64,
    is_block_device: bool,
    uring: Option<super::uring::Uring>,
}

impl FileBackend {
    /// Opens (creating a missing regular file of `size_bytes`) `path`. A
    /// regular file smaller than `size_bytes` is extended; the namespace
    /// size is the file's size rounded down to `block_size`.
    pub fn open(path: &Path, size_bytes: Option<u64>, block_size: u32) -> io::Result<Self> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .create(size_bytes.is_some())
            .truncate(false)
            .open(path)
            .map_err(ctx)?;
        let meta = buffered.metadata().map_err(ctx)?;
        let is_block_device = meta.file_type().is_block_device();
        let mut size = if is_block_device {
            block_device_size(&buffered).map_err(ctx)?
        } else {
            meta.len()
        };
        if let Some(want) = size_bytes {
            if !is_block_device && size < want {
                buffered.set_len(want).map_err(ctx)?;
                size = want;
            }
        }
        let size_bytes = size - size % block_size as u64;
        if size_bytes == 0 {
            return Err(ctx(io::Error::new(
                io::ErrorKind::InvalidInput,
                "is empty (give the namespace a size to create it)",
            )));
        }
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
            .filter(|f| direct_io_works(f, size_bytes));
        let uring = match direct.as_ref().map(File::try_clone) {
            Some(Ok(f)) => match super::uring::Uring::start(f) {
                Ok(u) => Some(u),
                Err(e) => {
                    log::warn!(
                        "{}: io_uring unavailable ({e}); using worker threads",
                        path.display()
                    );
                    None
                }
            },
            _ => None,
        };
        log::info!(
            "{}: {} bytes, {} I/O",
            path.display(),
            size_bytes,
            match (&direct, &uring) {
                (Some(_), Some(_)) => "direct (io_uring)",
                (Some(_), None) => "direct",
                _ => "buffered",
            }
        );
        Ok(FileBackend {
            buffered,
            direct,
            size_bytes,
            is_block_device,
            uring,
        })
    }

    /// Whether direct I/O is in use.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// fallocate(mode | KEEP_SIZE) on the range; false when the file system
    /// does not support the mode (the caller falls back to writing zeros).
    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> bool {
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe {
            libc::fallocate(
                self.buffered.as_raw_fd(),
                mode | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        rc == 0
    }

    /// Whether direct I/O goes through io_uring.
    pub fn uses_io_uring(&self) -> bool {
        self.uring.is_some()
    }

    fn direct_for(&self, offset: u64, len: usize) -> Option<&File> {
        let aligned = offset % DIRECT_ALIGN as u64 == 0 && len % DIRECT_ALIGN == 0;
        self.direct.as_ref().filter(|_| aligned)
    }
}

/// Probes a read of the first block: tmpfs and some file systems accept the
/// O_DIRECT flag at open but fail the I/O.
fn direct_io_works(f: &File, size: u64) -> bool {
    if size < DIRECT_ALIGN as u64 {
        return false;
    }
    let mut buf = AlignedBuf::new(DIRECT_ALIGN);
    f.read_exact_at(buf.as_mut(), 0).is_ok()
}

fn block_device_size(f: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at a live local.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn block_range_ioctl(f: &File, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: these ioctls read two u64s (start, length) from the pointer,
    // which points at a live local array.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), request, range.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn pwrite_dsync(f: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < data.len() {
        let iov = libc::iovec {
            iov_base: data[done..].as_ptr() as *mut libc::c_void,
            iov_len: data.len() - done,
        };
        // SAFETY: one iovec describing a live, initialized slice; the kernel
        // only reads from it for a write.
        let n = unsafe {
            libc::pwritev2(
                f.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}

impl Backend for FileBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            size_bytes: self.size_bytes,
            discard: true,
            // Punched holes in a file read as zeros; a device's discard
            // makes no such promise.
            discard_zeroes: !self.is_block_device,
            volatile_write_cache: true,
            keeps_data: true,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len() as u64)?;
        match self.direct_for(offset, buf.len()) {
            Some(f) => {
                let mut bounce = AlignedBuf::new(buf.len());
                f.read_exact_at(bounce.as_mut(), offset)?;
                buf.copy_from_slice(bounce.as_ref());
                Ok(())
            }
            None => self.buffered.read_exact_at(buf, offset),
        }
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        check_range(self.size_bytes, offset, data.len() as u64)?;
        match self.direct_for(offset, data.len()) {
            Some(f) => {
                let mut bounce = AlignedBuf::new(data.len());
                bounce.as_mut().copy_from_slice(data);
                if fua {
                    pwrite_dsync(f, bounce.as_ref(), offset)
                } else {
                    f.write_all_at(bounce.as_ref(), offset)
                }
            }
            None if fua => pwrite_dsync(&self.buffered, data, offset),
            None => self.buffered.write_all_at(data, offset),
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.buffered.sync_data()
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len)?;
        if self.is_block_device {
            return block_range_ioctl(&self.buffered, BLKZEROOUT, offset, len);
        }
        if self.fallocate(libc::FALLOC_FL_ZERO_RANGE, offset, len) {
            return Ok(());
        }
        // Not every file system zeroes ranges (tmpfs does not): write zeros.
        let zeros = vec![0u8; (len as usize).min(1 << 20)];
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(zeros.len() as u64) as usize;
            self.buffered.write_all_at(&zeros[..n], offset + pos)?;
            pos += n as u64;
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len)?;
        if self.is_block_device {
            return block_range_ioctl(&self.buffered, BLKDISCARD, offset, len);
        }
        if self.fallocate(libc::FALLOC_FL_PUNCH_HOLE, offset, len) {
            Ok(())
        } else {
            // A file system without hole punching: zeroing keeps the
            // promise that discarded blocks read back as zeros.
            self.write_zeroes(offset, len)
        }
    }

    fn may_block(&self) -> bool {
        true
    }

    fn submit_async(&self, op: UringOp, done: UringDone) -> Result<(), (UringOp, UringDone)> {
        let Some(u) = &self.uring else {
            return Err((op, done));
        };
        let aligned = |offset: u64, len: usize| {
            offset % DIRECT_ALIGN as u64 == 0
                && len % DIRECT_ALIGN == 0
                && check_range(self.size_bytes, offset, len as u64).is_ok()
        };
        let ok = match &op {
            UringOp::Read { offset, len } => aligned(*offset, *len),
            UringOp::Write { offset, data, .. } => aligned(*offset, data.len()),
            UringOp::Flush => true,
        };
        if !ok {
            return Err((op, done));
        }
        u.submit(op, done);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meets_the_backend_contract() {
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open(&dir.path().join("ns.img"), Some(4 << 20), 512).unwrap();
        super::super::tests::exercise(&b);
    }

    #[test]
    fn data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.img");
        let b = FileBackend::open(&path, Some(1 << 20), 4096).unwrap();
        b.write(8192, &[0x5Au8; 4096], true).unwrap();
        b.flush().unwrap();
        drop(b);
        let b = FileBackend::open(&path, None, 4096).unwrap();
        let mut buf = vec![0u8; 4096];
        b.read(8192, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0x5A));
    }

    #[test]
    fn missing_file_without_size_is_a_clear_error() {
        let e = FileBackend::open(Path::new("/nonexistent/dir/ns.img"), None, 512).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dir/ns.img"), "{e}");
    }

    #[test]
    fn unaligned_requests_use_the_buffered_path() {
        let dir = tempfile::tempdir().unwrap();
        let b = FileBackend::open(&dir.path().join("ns.img"), Some(1 << 20), 512).unwrap();
        b.write(512, &[9u8; 1024], false).unwrap();
        let mut buf = vec![0u8; 4096];
        b.read(0, &mut buf).unwrap();
        assert!(buf[..512].iter().all(|&x| x == 0));
        assert!(buf[512..1536].iter().all(|&x| x == 9));
    }
}

#[cfg(test)]
mod uring_tests {
    use super::*;
    use crate::pipeline::{Completion, IoOp, Pipeline};
    use std::sync::mpsc::channel;
    use std::sync::Arc;

    /// Through the pipeline, on a file system that takes O_DIRECT (the
    /// build directory; tmpfs does not), requests ride io_uring.
    #[test]
    fn direct_io_goes_through_io_uring_via_the_pipeline() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let b = FileBackend::open(&dir.path().join("ns.img"), Some(8 << 20), 4096).unwrap();
        if !b.is_direct() {
            eprintln!("skipping: this file system refuses O_DIRECT");
            return;
        }
        assert!(b.uses_io_uring(), "direct I/O without io_uring");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let pipeline = Pipeline::new(Arc::new(b));
        let (tx, rx) = channel();
        rt.block_on(async {
            for i in 0..32u64 {
                let tx = tx.clone();
                pipeline.submit(
                    0,
                    None,
                    IoOp::Write {
                        offset: i * 8192,
                        data: vec![i as u8 + 1; 8192],
                        fua: i == 0,
                    },
                    Completion::callback(move |d| tx.send(d.result.is_ok()).unwrap()),
                );
            }
        });
        assert!((0..32).all(|_| rx.recv().unwrap()));
        let (tx, rx) = channel();
        rt.block_on(async {
            pipeline.submit(
                0,
                None,
                IoOp::Read {
                    offset: 5 * 8192,
                    len: 8192,
                },
                Completion::callback(move |d| tx.send(d.result.map(|c| c.into_owned())).unwrap()),
            );
        });
        let back = rx.recv().unwrap().unwrap();
        assert!(back.iter().all(|&x| x == 6));
    }
}
