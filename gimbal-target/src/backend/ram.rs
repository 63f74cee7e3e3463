//! `ram`: data in memory for the life of the process.
//!
//! Memory is split into chunks, each behind its own lock, so queues touching
//! different regions do not serialize on one lock; a chunk is allocated on
//! its first write, so a large namespace costs nothing until used, and a
//! discard that covers a whole chunk frees it.

use std::io;
use std::sync::RwLock;

use super::{check_range, Backend, BackendInfo};

const CHUNK_BYTES: usize = 256 * 1024;

/// A memory-backed namespace.
#[derive(Debug)]
pub struct RamBackend {
    size_bytes: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl RamBackend {
    /// A zero-filled RAM device of `size_bytes`.
    pub fn new(size_bytes: u64) -> Self {
        let n = size_bytes.div_ceil(CHUNK_BYTES as u64) as usize;
        RamBackend {
            size_bytes,
            chunks: (0..n).map(|_| RwLock::new(None)).collect(),
        }
    }

    /// Visits the chunk pieces that cover `offset..offset+len`, as (chunk
    /// index, offset in chunk, position in the request, length).
    fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        let mut pos = 0u64;
        std::iter::from_fn(move || {
            if pos >= len {
                return None;
            }
            let abs = offset + pos;
            let idx = (abs / CHUNK_BYTES as u64) as usize;
            let within = (abs % CHUNK_BYTES as u64) as usize;
            let n = ((CHUNK_BYTES - within) as u64).min(len - pos) as usize;
            let item = (idx, within, pos as usize, n);
            pos += n as u64;
            Some(item)
        })
    }

    fn zero_range(&self, offset: u64, len: u64, free_whole: bool) {
        for (idx, within, _, n) in Self::pieces(offset, len) {
            let mut chunk = self.chunks[idx].write().unwrap_or_else(|e| e.into_inner());
            if free_whole && n == CHUNK_BYTES {
                *chunk = None;
            } else if let Some(c) = chunk.as_mut() {
                c[within..within + n].fill(0);
            }
        }
    }
}

impl Backend for RamBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            size_bytes: self.size_bytes,
            discard: true,
            discard_zeroes: true,
            volatile_write_cache: false,
            keeps_data: true,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len() as u64)?;
        for (idx, within, pos, n) in Self::pieces(offset, buf.len() as u64) {
            let chunk = self.chunks[idx].read().unwrap_or_else(|e| e.into_inner());
            match chunk.as_ref() {
                Some(c) => buf[pos..pos + n].copy_from_slice(&c[within..within + n]),
                None => buf[pos..pos + n].fill(0),
            }
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        check_range(self.size_bytes, offset, data.len() as u64)?;
        for (idx, within, pos, n) in Self::pieces(offset, data.len() as u64) {
            let mut chunk = self.chunks[idx].write().unwrap_or_else(|e| e.into_inner());
            let c = chunk.get_or_insert_with(|| vec![0u8; CHUNK_BYTES].into_boxed_slice());
            c[within..within + n].copy_from_slice(&data[pos..pos + n]);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len)?;
        self.zero_range(offset, len, false);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, len)?;
        self.zero_range(offset, len, true);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meets_the_backend_contract() {
        super::super::tests::exercise(&RamBackend::new(4 << 20));
    }

    #[test]
    fn requests_spanning_chunks_round_trip() {
        let b = RamBackend::new(2 << 20);
        let data: Vec<u8> = (0..(CHUNK_BYTES + 9000)).map(|i| (i % 251) as u8).collect();
        let off = CHUNK_BYTES as u64 - 4096;
        b.write(off, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        b.read(off, &mut back).unwrap();
        assert_eq!(back, data);
        b.discard(0, 2 << 20).unwrap();
        b.read(off, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 0));
    }
}
