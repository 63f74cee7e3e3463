//! An io_uring engine for the `file` backend's direct I/O.
//!
//! One thread per file owns a ring. Callers hand it operations through a
//! channel and wake it with an eventfd that the ring itself watches (an
//! outstanding read on the eventfd), so the thread sleeps in one place,
//! `io_uring_enter`, whether it waits for new work or for completions.
//! Completions run the caller's callback on the ring thread. Many
//! operations are in flight at once without a thread each, which is what
//! the worker-pool fallback costs.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Mutex;
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring};

/// Called once with the outcome: read data for a read, empty otherwise.
pub type UringDone = Box<dyn FnOnce(io::Result<Cow<'static, [u8]>>) + Send>;

/// Alignment of direct I/O buffers.
pub const ALIGN: usize = 4096;

/// What to do.
pub enum UringOp {
    /// Read `len` bytes at `offset`.
    Read {
        /// Byte offset (aligned).
        offset: u64,
        /// Byte count (aligned).
        len: usize,
    },
    /// Write `data` at `offset`; durable on completion with `fua`.
    Write {
        /// Byte offset (aligned).
        offset: u64,
        /// The data (aligned length).
        data: Vec<u8>,
        /// Force unit access (RWF_DSYNC).
        fua: bool,
    },
    /// fdatasync.
    Flush,
}

struct Request {
    op: UringOp,
    done: UringDone,
}

/// A buffer aligned for O_DIRECT, carved from an over-allocated Vec (no
/// unsafe allocation needed).
pub(super) struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes starting at an [`ALIGN`]-aligned address.
    pub(super) fn new(len: usize) -> Self {
        let storage = vec![0u8; len + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.storage[self.start..].as_mut_ptr()
    }
    /// The aligned bytes.
    pub(super) fn as_ref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
    /// The aligned bytes, writable.
    pub(super) fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// An operation at the kernel: its buffer must stay put until the CQE.
struct InFlight {
    kind: Kind,
    buf: AlignedBuf,
    offset: u64,
    /// Bytes transferred so far (short transfers are resubmitted).
    done_bytes: usize,
    done: UringDone,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write { fua: bool },
    Flush,
}

/// The engine of one file.
pub struct Uring {
    tx: Mutex<Option<Sender<Request>>>,
    wake: OwnedFd,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Uring")
    }
}

const WAKE_TOKEN: u64 = u64::MAX;
const RING_ENTRIES: u32 = 256;

impl Uring {
    /// Starts an engine for `file` (opened with O_DIRECT). Fails when the
    /// kernel refuses io_uring (e.g. disabled by sysctl or a sandbox).
    pub fn start(file: File) -> io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES)?;
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: efd is a fresh, valid descriptor owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(efd) };
        let (tx, rx) = channel();
        let wake_fd = wake.as_raw_fd();
        let thread = std::thread::Builder::new()
            .name("gimbal-uring".into())
            .spawn(move || ring_loop(ring, file, wake_fd, rx))?;
        Ok(Uring {
            tx: Mutex::new(Some(tx)),
            wake,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues an operation; `done` runs on the ring thread.
    pub fn submit(&self, op: UringOp, done: UringDone) {
        let sent = {
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            match tx.as_ref() {
                Some(tx) => tx.send(Request { op, done }).map_err(|e| e.0),
                None => Err(Request { op, done }),
            }
        };
        match sent {
            Ok(()) => self.kick(),
            Err(r) => (r.done)(Err(io::Error::other("io_uring engine stopped"))),
        }
    }

    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our eventfd.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            );
        }
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // Closing the channel and waking the thread lets it finish what is
        // in flight and exit.
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.kick();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn ring_loop(mut ring: IoUring, file: File, wake_fd: RawFd, rx: Receiver<Request>) {
    let fd = types::Fd(file.as_raw_fd());
    let mut slots: Vec<Option<InFlight>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut in_flight = 0usize;
    let mut wake_buf = Box::new([0u8; 8]);
    let mut wake_armed = false;
    let mut closed = false;
    // Operations waiting for a free submission queue entry.
    let mut backlog: std::collections::VecDeque<usize> = Default::default();

    loop {
        // Take new work.
        while !closed {
            match rx.try_recv() {
                Ok(req) => {
                    let slot = prepare(req);
                    let idx = free.pop().unwrap_or_else(|| {
                        slots.push(None);
                        slots.len() - 1
                    });
                    slots[idx] = Some(slot);
                    backlog.push_back(idx);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => closed = true,
            }
        }
        if closed && in_flight == 0 && backlog.is_empty() {
            return;
        }
        // Push what fits into the submission queue.
        {
            let mut sq = ring.submission();
            if !wake_armed && !closed {
                let e = opcode::Read::new(types::Fd(wake_fd), wake_buf.as_mut_ptr(), 8)
                    .build()
                    .user_data(WAKE_TOKEN);
                // SAFETY: wake_buf lives as long as the loop, and only one
                // read on it is outstanding at a time.
                if unsafe { sq.push(&e) }.is_ok() {
                    wake_armed = true;
                }
            }
            while let Some(&idx) = backlog.front() {
                let Some(f) = slots[idx].as_mut() else {
                    backlog.pop_front();
                    continue;
                };
                let entry = sqe_for(fd, f, idx as u64);
                // SAFETY: the buffer belongs to the slot, which stays in
                // `slots` untouched until its completion arrives.
                if unsafe { sq.push(&entry) }.is_err() {
                    break;
                }
                backlog.pop_front();
                in_flight += 1;
            }
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            log::error!("io_uring submit failed: {e}; failing in-flight I/O");
            for s in slots.iter_mut() {
                if let Some(f) = s.take() {
                    (f.done)(Err(io::Error::new(e.kind(), e.to_string())));
                }
            }
            return;
        }
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (token, res) in cqes {
            if token == WAKE_TOKEN {
                wake_armed = false;
                continue;
            }
            let idx = token as usize;
            in_flight -= 1;
            let Some(mut f) = slots[idx].take() else {
                continue;
            };
            let outcome = if res < 0 {
                Some(Err(io::Error::from_raw_os_error(-res)))
            } else if f.kind == Kind::Flush {
                Some(Ok(Cow::Borrowed(&[][..])))
            } else if res == 0 {
                Some(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "direct I/O transferred nothing",
                )))
            } else {
                f.done_bytes += res as usize;
                if f.done_bytes < f.buf.len {
                    // Short transfer: the rest goes back in the queue.
                    slots[idx] = Some(f);
                    backlog.push_back(idx);
                    continue;
                }
                match f.kind {
                    Kind::Read => Some(Ok(Cow::Owned(f.buf.as_ref().to_vec()))),
                    _ => Some(Ok(Cow::Borrowed(&[][..]))),
                }
            };
            free.push(idx);
            if let Some(o) = outcome {
                (f.done)(o);
            }
        }
    }
}

fn prepare(req: Request) -> InFlight {
    match req.op {
        UringOp::Read { offset, len } => InFlight {
            kind: Kind::Read,
            buf: AlignedBuf::new(len),
            offset,
            done_bytes: 0,
            done: req.done,
        },
        UringOp::Write { offset, data, fua } => {
            let mut buf = AlignedBuf::new(data.len());
            buf.as_mut().copy_from_slice(&data);
            InFlight {
                kind: Kind::Write { fua },
                buf,
                offset,
                done_bytes: 0,
                done: req.done,
            }
        }
        UringOp::Flush => InFlight {
            kind: Kind::Flush,
            buf: AlignedBuf::new(0),
            offset: 0,
            done_bytes: 0,
            done: req.done,
        },
    }
}

fn sqe_for(fd: types::Fd, f: &mut InFlight, token: u64) -> io_uring::squeue::Entry {
    let done = f.done_bytes;
    let remaining = (f.buf.len - done) as u32;
    let offset = f.offset + done as u64;
    // SAFETY (for the pointer arithmetic): `done` < len <= buffer length.
    let ptr = unsafe { f.buf.ptr().add(done) };
    match f.kind {
        Kind::Read => opcode::Read::new(fd, ptr, remaining)
            .offset(offset)
            .build()
            .user_data(token),
        Kind::Write { fua } => opcode::Write::new(fd, ptr, remaining)
            .offset(offset)
            .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
            .build()
            .user_data(token),
        Kind::Flush => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::mpsc::sync_channel;

    fn wait(u: &Uring, op: UringOp) -> io::Result<Vec<u8>> {
        let (tx, rx) = sync_channel(1);
        u.submit(
            op,
            Box::new(move |r| tx.send(r.map(|c| c.into_owned())).unwrap()),
        );
        rx.recv().unwrap()
    }

    #[test]
    fn reads_writes_and_flushes_many_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        // tmpfs refuses O_DIRECT: a plain descriptor exercises the ring the
        // same way.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(0)
            .open(&path)
            .unwrap();
        let u = Uring::start(file).unwrap();
        let (tx, rx) = channel();
        for i in 0..64u64 {
            let tx = tx.clone();
            let data = vec![i as u8; 4096];
            u.submit(
                UringOp::Write {
                    offset: i * 4096,
                    data,
                    fua: i % 2 == 0,
                },
                Box::new(move |r| tx.send(r.is_ok()).unwrap()),
            );
        }
        assert!((0..64).all(|_| rx.recv().unwrap()));
        wait(&u, UringOp::Flush).unwrap();
        for i in [0u64, 7, 63] {
            let back = wait(
                &u,
                UringOp::Read {
                    offset: i * 4096,
                    len: 4096,
                },
            )
            .unwrap();
            assert!(back.iter().all(|&b| b == i as u8));
        }
        // Reading past the end of the file is an error, not a hang.
        assert!(wait(
            &u,
            UringOp::Read {
                offset: 2 << 20,
                len: 4096
            }
        )
        .is_err());
        drop(u);
    }
}
