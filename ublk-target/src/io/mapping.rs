//! The request handler's logic, without a kernel: block device parameters
//! from Identify data, and each ublk request (op, offset, length, flags) as
//! the one NVMe command that serves it.
//!
//! Everything here is a pure function; `ublk.rs` (the libublk adapter) and
//! `engine.rs` (the initiator pump) call it per request.

use nvmf_initiator::{Command, ControllerInfo, Namespace};
use nvmf_proto::command::dsm_attr;
use nvmf_proto::identify::{oncs, vwc};
use nvmf_proto::sqe::{io_opcode, Sqe};
use serde::{Deserialize, Serialize};

/// Largest I/O the device takes in one request, whatever MDTS allows: the
/// per-tag buffers are this big.
pub const MAX_IO_BYTES: u32 = 1 << 20;

/// A ublk request's operation (the descriptor's `op_flags & 0xff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read into the tag's buffer.
    Read,
    /// Write from the tag's buffer.
    Write,
    /// Flush the volatile write cache.
    Flush,
    /// Discard (deallocate) a range.
    Discard,
    /// Write zeroes over a range (may deallocate unless NOUNMAP).
    WriteZeroes,
    /// Anything else (zoned ops, WRITE_SAME): refused with `EOPNOTSUPP`.
    Other(u32),
}

impl Op {
    /// From the ublk descriptor's op code (`UBLK_IO_OP_*`).
    pub fn from_ublk(op: u32) -> Self {
        match op {
            0 => Op::Read,
            1 => Op::Write,
            2 => Op::Flush,
            3 => Op::Discard,
            5 => Op::WriteZeroes,
            o => Op::Other(o),
        }
    }
}

/// Request flags that matter for the mapping (`UBLK_IO_F_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReqFlags {
    /// Force Unit Access.
    pub fua: bool,
    /// Write zeroes must not deallocate.
    pub no_unmap: bool,
}

impl ReqFlags {
    /// `UBLK_IO_F_FUA`.
    pub const UBLK_FUA: u32 = 1 << 13;
    /// `UBLK_IO_F_NOUNMAP`.
    pub const UBLK_NOUNMAP: u32 = 1 << 15;

    /// From the descriptor's `op_flags`.
    pub fn from_ublk(op_flags: u32) -> Self {
        Self {
            fua: op_flags & Self::UBLK_FUA != 0,
            no_unmap: op_flags & Self::UBLK_NOUNMAP != 0,
        }
    }
}

/// What the block device looks like, derived from the namespace and its
/// controller; saved with the device so a recovering server can check it
/// talks to the same thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// Namespace ID.
    pub nsid: u32,
    /// Logical block size in bytes (the LBA format in use).
    pub block_size: u32,
    /// Capacity in logical blocks (NSZE).
    pub blocks: u64,
    /// Largest request in bytes (MDTS, capped at [`MAX_IO_BYTES`]).
    pub max_io_bytes: u32,
    /// Volatile write cache present: the device advertises a cache and FUA,
    /// so flushes and FUA writes reach the target.
    pub volatile_cache: bool,
    /// Dataset Management (deallocate) supported: discard is offered.
    pub discard: bool,
    /// Write Zeroes supported.
    pub write_zeroes: bool,
}

impl Geometry {
    /// From bring-up and Identify Namespace.
    pub fn new(ctrl: &ControllerInfo, ns: &Namespace) -> Self {
        let bs = ns.block_size.max(512);
        let max = ctrl
            .max_transfer_bytes
            .clamp(bs.max(4096), MAX_IO_BYTES.max(bs));
        // Round down to whole blocks.
        let max_io_bytes = max / bs * bs;
        Self {
            nsid: ns.nsid,
            block_size: bs,
            blocks: ns.blocks,
            max_io_bytes,
            volatile_cache: ctrl.identify.vwc & vwc::PRESENT != 0,
            discard: ctrl.identify.oncs & oncs::DATASET_MANAGEMENT != 0,
            write_zeroes: ctrl.identify.oncs & oncs::WRITE_ZEROES != 0,
        }
    }

    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }

    /// Most blocks of one Write Zeroes or discard request: Write Zeroes
    /// takes a 16-bit 0's based count; one DSM range takes 32 bits, but we
    /// keep both the same so a request never needs two commands.
    pub fn max_zero_blocks(&self) -> u32 {
        // Keep the byte count within u32 sectors for the kernel limit.
        let cap = (u32::MAX >> 9) / self.block_size * 512;
        (1u32 << 16).min(cap.max(1))
    }

    /// `log2(block_size)`.
    pub fn block_shift(&self) -> u8 {
        self.block_size.trailing_zeros() as u8
    }
}

/// What to do with one ublk request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Send `command`; `data_len` bytes of the tag's buffer travel with it
    /// (0: none). `dsm_range` asks the caller to write this 16-byte
    /// Dataset Management range list into the buffer first.
    Send {
        /// The NVMe command.
        command: Command,
        /// Bytes of the tag buffer that are the command's data.
        data_len: u32,
        /// For discard: the range list to place in the buffer.
        dsm_range: Option<[u8; 16]>,
    },
    /// Complete at once with this result (bytes, or a negative errno).
    Complete(i32),
}

/// Map one ublk request to its NVMe command. `start_sector` and
/// `nr_sectors` are in 512-byte units, as in the ublk descriptor. The
/// result on success is the request's byte count (what ublk expects back).
pub fn map_request(
    geo: &Geometry,
    op: Op,
    start_sector: u64,
    nr_sectors: u32,
    flags: ReqFlags,
) -> Plan {
    let bytes = u64::from(nr_sectors) << 9;
    let start = start_sector << 9;
    let bs = u64::from(geo.block_size);
    if op != Op::Flush {
        if start % bs != 0 || bytes % bs != 0 {
            return Plan::Complete(-libc::EINVAL);
        }
        if start / bs + bytes / bs > geo.blocks {
            return Plan::Complete(-libc::EIO);
        }
    }
    let slba = start / bs;
    let blocks = bytes / bs;
    let nsid = geo.nsid;
    match op {
        Op::Read | Op::Write if bytes == 0 => Plan::Complete(0),
        Op::Read | Op::Write if bytes > u64::from(geo.max_io_bytes) => {
            Plan::Complete(-libc::EINVAL)
        }
        Op::Read => Plan::Send {
            command: Command::Read {
                nsid,
                slba,
                block_size: geo.block_size,
            },
            data_len: bytes as u32,
            dsm_range: None,
        },
        Op::Write => Plan::Send {
            command: Command::Write {
                nsid,
                slba,
                block_size: geo.block_size,
                fua: flags.fua && geo.volatile_cache,
            },
            data_len: bytes as u32,
            dsm_range: None,
        },
        Op::Flush if !geo.volatile_cache => Plan::Complete(0),
        Op::Flush => Plan::Send {
            command: Command::Flush { nsid },
            data_len: 0,
            dsm_range: None,
        },
        Op::Discard | Op::WriteZeroes if blocks == 0 => Plan::Complete(0),
        Op::Discard | Op::WriteZeroes if blocks > u64::from(geo.max_zero_blocks()) => {
            Plan::Complete(-libc::EINVAL)
        }
        Op::Discard if !geo.discard => Plan::Complete(-libc::EOPNOTSUPP),
        Op::Discard => {
            let mut range = [0u8; 16];
            range[4..8].copy_from_slice(&(blocks as u32).to_le_bytes());
            range[8..16].copy_from_slice(&slba.to_le_bytes());
            let mut sqe = Sqe::new(io_opcode::DATASET_MANAGEMENT, 0);
            sqe.nsid = nsid;
            sqe.cdw10 = 0; // one range (0's based)
            sqe.cdw11 = dsm_attr::DEALLOCATE;
            Plan::Send {
                command: Command::Raw(sqe),
                data_len: 16,
                dsm_range: Some(range),
            }
        }
        Op::WriteZeroes if !geo.write_zeroes => Plan::Complete(-libc::EOPNOTSUPP),
        Op::WriteZeroes => Plan::Send {
            command: Command::WriteZeroes {
                nsid,
                slba,
                blocks: blocks as u32,
                deallocate: !flags.no_unmap,
            },
            data_len: 0,
            dsm_range: None,
        },
        Op::Other(_) => Plan::Complete(-libc::EOPNOTSUPP),
    }
}

/// The ublk result for a finished command: the request's byte count on
/// success, `-EIO` on an NVMe error status or a lost connection.
pub fn result_for(success: bool, nr_sectors: u32) -> i32 {
    if success {
        (u64::from(nr_sectors) << 9).min(i32::MAX as u64) as i32
    } else {
        -libc::EIO
    }
}

/// Block device parameters in the terms ublk's `ublk_params` uses, kept
/// free of libublk types so they are testable here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceParams {
    /// `log2` of the logical block size.
    pub logical_bs_shift: u8,
    /// `log2` of the physical block size.
    pub physical_bs_shift: u8,
    /// Capacity in 512-byte sectors.
    pub dev_sectors: u64,
    /// Largest request in sectors.
    pub max_sectors: u32,
    /// Advertise a volatile write cache (flushes reach us).
    pub volatile_cache: bool,
    /// Advertise FUA.
    pub fua: bool,
    /// Discard limits (sectors), 0 when not offered.
    pub max_discard_sectors: u32,
    /// Write-zeroes limit (sectors), 0 when not offered.
    pub max_write_zeroes_sectors: u32,
    /// Discard granularity in bytes.
    pub discard_granularity: u32,
}

impl DeviceParams {
    /// From the geometry.
    pub fn new(geo: &Geometry) -> Self {
        let zero_sectors = geo.max_zero_blocks() * (geo.block_size >> 9);
        Self {
            logical_bs_shift: geo.block_shift(),
            physical_bs_shift: geo.block_shift().max(12),
            dev_sectors: geo.size_bytes() >> 9,
            max_sectors: geo.max_io_bytes >> 9,
            volatile_cache: geo.volatile_cache,
            fua: geo.volatile_cache,
            max_discard_sectors: if geo.discard { zero_sectors } else { 0 },
            max_write_zeroes_sectors: if geo.write_zeroes { zero_sectors } else { 0 },
            discard_granularity: geo.block_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            nsid: 1,
            block_size: 4096,
            blocks: 1024,
            max_io_bytes: 128 * 1024,
            volatile_cache: true,
            discard: true,
            write_zeroes: true,
        }
    }

    #[test]
    fn read_and_write_map_to_blocks() {
        let g = geo();
        assert_eq!(
            map_request(&g, Op::Read, 16, 16, ReqFlags::default()),
            Plan::Send {
                command: Command::Read {
                    nsid: 1,
                    slba: 2,
                    block_size: 4096
                },
                data_len: 8192,
                dsm_range: None
            }
        );
        let fua = ReqFlags::from_ublk(ReqFlags::UBLK_FUA | 1);
        assert!(fua.fua);
        match map_request(&g, Op::from_ublk(1), 8, 8, fua) {
            Plan::Send {
                command: Command::Write { slba, fua, .. },
                data_len,
                ..
            } => {
                assert_eq!((slba, fua, data_len), (1, true, 4096));
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn misaligned_oversized_and_out_of_range_fail() {
        let g = geo();
        let f = ReqFlags::default();
        assert_eq!(
            map_request(&g, Op::Read, 1, 8, f),
            Plan::Complete(-libc::EINVAL)
        );
        assert_eq!(
            map_request(&g, Op::Read, 0, 4, f),
            Plan::Complete(-libc::EINVAL)
        );
        assert_eq!(
            map_request(&g, Op::Read, 1024 * 8, 8, f),
            Plan::Complete(-libc::EIO)
        );
        assert_eq!(
            map_request(&g, Op::Write, 0, 512, f),
            Plan::Complete(-libc::EINVAL)
        );
        assert_eq!(
            map_request(&g, Op::Other(10), 0, 8, f),
            Plan::Complete(-libc::EOPNOTSUPP)
        );
    }

    #[test]
    fn flush_needs_a_cache_and_fua_is_dropped_without_one() {
        let mut g = geo();
        let f = ReqFlags::default();
        assert!(matches!(
            map_request(&g, Op::Flush, 0, 0, f),
            Plan::Send {
                command: Command::Flush { nsid: 1 },
                ..
            }
        ));
        g.volatile_cache = false;
        assert_eq!(map_request(&g, Op::Flush, 0, 0, f), Plan::Complete(0));
        let fua = ReqFlags {
            fua: true,
            no_unmap: false,
        };
        assert!(matches!(
            map_request(&g, Op::Write, 0, 8, fua),
            Plan::Send {
                command: Command::Write { fua: false, .. },
                ..
            }
        ));
    }

    #[test]
    fn discard_is_one_dsm_range() {
        let g = geo();
        match map_request(&g, Op::Discard, 80, 800, ReqFlags::default()) {
            Plan::Send {
                command: Command::Raw(sqe),
                data_len: 16,
                dsm_range: Some(r),
            } => {
                assert_eq!(sqe.opcode, io_opcode::DATASET_MANAGEMENT);
                assert_eq!(sqe.cdw11, dsm_attr::DEALLOCATE);
                assert_eq!(u32::from_le_bytes(r[4..8].try_into().unwrap()), 100);
                assert_eq!(u64::from_le_bytes(r[8..16].try_into().unwrap()), 10);
            }
            p => panic!("{p:?}"),
        }
        let mut g2 = g;
        g2.discard = false;
        assert_eq!(
            map_request(&g2, Op::Discard, 0, 8, ReqFlags::default()),
            Plan::Complete(-libc::EOPNOTSUPP)
        );
    }

    #[test]
    fn write_zeroes_honours_nounmap() {
        let g = geo();
        let f = ReqFlags::from_ublk(ReqFlags::UBLK_NOUNMAP);
        assert_eq!(
            map_request(&g, Op::WriteZeroes, 8, 16, f),
            Plan::Send {
                command: Command::WriteZeroes {
                    nsid: 1,
                    slba: 1,
                    blocks: 2,
                    deallocate: false
                },
                data_len: 0,
                dsm_range: None
            }
        );
    }

    #[test]
    fn params_follow_geometry() {
        let g = geo();
        let p = DeviceParams::new(&g);
        assert_eq!(p.logical_bs_shift, 12);
        assert_eq!(p.dev_sectors, 1024 * 8);
        assert_eq!(p.max_sectors, 256);
        assert!(p.volatile_cache && p.fua);
        assert_eq!(p.max_discard_sectors, 65536 * 8);
        let mut g2 = g;
        g2.discard = false;
        g2.write_zeroes = false;
        g2.volatile_cache = false;
        let p2 = DeviceParams::new(&g2);
        assert_eq!(
            (p2.max_discard_sectors, p2.max_write_zeroes_sectors),
            (0, 0)
        );
        assert!(!p2.fua);
        assert_eq!(result_for(true, 8), 4096);
        assert_eq!(result_for(false, 8), -libc::EIO);
    }
}
