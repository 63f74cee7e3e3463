//! The per-namespace (per backend device) pipeline between the NVMe/TCP
//! front end and the backend.
//!
//! Every I/O command of every controller attached to a namespace passes
//! through that namespace's pipeline. With `qos = "none"` it goes straight to
//! the backend; with `qos = "gimbal"` the storage switch decides when each
//! request reaches the device and what credit its completion carries. The
//! front end never talks to a backend directly, so the switch sees all
//! traffic of its device (the paper's shared-nothing, per-SSD design).
//!
//! Requests run inline on the caller's thread when the backend never blocks
//! (`ram`, `null`): a thread hop per I/O would cost more than the copy. A
//! backend that may block (`file`) runs on tokio's blocking pool so that one
//! slow device cannot stall a connection's event loop.

use std::borrow::Cow;
use std::io;
use std::sync::Arc;

use crate::backend::Backend;

/// What a request asks the backend to do. Offsets and lengths are in bytes
/// and were checked against the namespace size by the front end.
#[derive(Debug)]
pub enum IoOp {
    /// Read `len` bytes at `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: usize,
    },
    /// Write `data` at `offset`, durable on completion when `fua`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data.
        data: Vec<u8>,
        /// Force unit access.
        fua: bool,
    },
    /// Make completed writes durable.
    Flush,
    /// Zero `len` bytes at `offset`.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u64,
    },
    /// Deallocate byte ranges (offset, length).
    Discard {
        /// The ranges.
        ranges: Vec<(u64, u64)>,
    },
}

impl IoOp {
    /// Bytes the request moves to or from the device (what schedulers
    /// count); zero for flush and deallocate.
    pub fn transfer_bytes(&self) -> u64 {
        match self {
            IoOp::Read { len, .. } => *len as u64,
            IoOp::Write { data, .. } => data.len() as u64,
            IoOp::WriteZeroes { len, .. } => *len,
            IoOp::Flush | IoOp::Discard { .. } => 0,
        }
    }

    /// Whether the request writes (for write-cost accounting).
    pub fn is_write(&self) -> bool {
        !matches!(self, IoOp::Read { .. })
    }
}

/// The outcome of a request.
#[derive(Debug)]
pub struct IoDone {
    /// Read data for a read, empty otherwise; or the backend's error.
    pub result: io::Result<Cow<'static, [u8]>>,
    /// Credit to report to the tenant in completion dword 1 (Gimbal only).
    pub credit: Option<u32>,
}

/// Receives a request's completion. Called exactly once, on whatever thread
/// completed the request.
pub type Completion = Box<dyn FnOnce(IoDone) + Send + 'static>;

/// One namespace's pipeline.
pub struct Pipeline {
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("backend", &self.backend.info())
            .finish()
    }
}

impl Pipeline {
    /// A pass-through pipeline in front of `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Pipeline { backend }
    }

    /// The backend behind this pipeline.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Submits a request from `tenant` (an index the target assigns to each
    /// host NQN); `done` is called once it completes. Must be called from
    /// within a tokio runtime when the backend may block.
    pub fn submit(&self, _tenant: u32, op: IoOp, done: Completion) {
        let backend = self.backend.clone();
        if backend.may_block() {
            tokio::task::spawn_blocking(move || {
                let result = execute(backend.as_ref(), op);
                done(IoDone {
                    result,
                    credit: None,
                })
            });
        } else {
            let result = execute(backend.as_ref(), op);
            done(IoDone {
                result,
                credit: None,
            });
        }
    }

    /// Flushes the backend (used at shutdown).
    pub fn flush_blocking(&self) -> io::Result<()> {
        self.backend.flush()
    }
}

/// Runs one request against a backend.
pub fn execute(backend: &dyn Backend, op: IoOp) -> io::Result<Cow<'static, [u8]>> {
    const NONE: Cow<'static, [u8]> = Cow::Borrowed(&[]);
    match op {
        IoOp::Read { offset, len } => backend.read_to_buffer(offset, len),
        IoOp::Write { offset, data, fua } => backend.write(offset, &data, fua).map(|_| NONE),
        IoOp::Flush => backend.flush().map(|_| NONE),
        IoOp::WriteZeroes { offset, len } => backend.write_zeroes(offset, len).map(|_| NONE),
        IoOp::Discard { ranges } => {
            for (offset, len) in ranges {
                backend.discard(offset, len)?;
            }
            Ok(NONE)
        }
    }
}
