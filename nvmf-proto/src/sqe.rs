//! The 64-byte submission queue entry (SQE) and its SGL data pointer.
//!
//! Byte layout (NVMe base specification, "Common Command Format"):
//!
//! | bytes  | field |
//! |--------|-------|
//! | 0      | OPC opcode |
//! | 1      | FUSE (bits 1:0), PSDT (bits 7:6) |
//! | 2..4   | CID command identifier |
//! | 4..8   | NSID (Fabrics commands: byte 4 is FCTYPE, 5..8 reserved) |
//! | 8..16  | CDW2, CDW3 |
//! | 16..24 | MPTR metadata pointer |
//! | 24..40 | DPTR data pointer: SGL descriptor 1 over fabrics |
//! | 40..64 | CDW10..CDW15 command specific |

use crate::wire::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

/// Size of a submission queue entry.
pub const SQE_LEN: usize = 64;

/// Admin command opcodes.
pub mod admin_opcode {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Fabrics command (the FCTYPE byte says which).
    pub const FABRICS: u8 = 0x7F;
}

/// NVM command set I/O command opcodes.
pub mod io_opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Reservation Register.
    pub const RESERVATION_REGISTER: u8 = 0x0D;
    /// Reservation Report.
    pub const RESERVATION_REPORT: u8 = 0x0E;
    /// Reservation Acquire.
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RESERVATION_RELEASE: u8 = 0x15;
    /// Fabrics command (allowed on I/O queues too, e.g. Disconnect).
    pub const FABRICS: u8 = 0x7F;
}

/// The data direction encoded in an opcode's two low bits (NVMe base
/// specification: 01b host to controller, 10b controller to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataDirection {
    /// No data transfer.
    None,
    /// Host to controller (a write: data travels in capsule or H2CData).
    HostToController,
    /// Controller to host (a read: data travels in C2HData).
    ControllerToHost,
    /// Both directions (bidirectional, not used by NVMe/TCP).
    Bidirectional,
}

impl DataDirection {
    /// Direction of a non-Fabrics opcode, or of a Fabrics FCTYPE (same rule).
    pub const fn of_opcode(opcode: u8) -> Self {
        match opcode & 0x3 {
            0 => Self::None,
            1 => Self::HostToController,
            2 => Self::ControllerToHost,
            _ => Self::Bidirectional,
        }
    }
}

/// SQE byte 1 value selecting SGLs for the data pointer (PSDT = 01b), which
/// NVMe over Fabrics requires; no fused operation.
pub const FLAGS_PSDT_SGL: u8 = 0x40;

/// SQE byte 1 bits 7:6: PSDT (PRP or SGL for data transfer).
pub const FLAGS_PSDT_MASK: u8 = 0xC0;

/// SQE byte 1 bits 1:0: FUSE (00b: normal operation; 01b/10b: first/second
/// command of a fused operation).
pub const FLAGS_FUSE_MASK: u8 = 0x03;

/// SGL descriptor types (upper nibble of byte 15).
pub mod sgl_type {
    /// SGL Data Block.
    pub const DATA_BLOCK: u8 = 0x0;
    /// SGL Bit Bucket.
    pub const BIT_BUCKET: u8 = 0x1;
    /// SGL Segment.
    pub const SEGMENT: u8 = 0x2;
    /// SGL Last Segment.
    pub const LAST_SEGMENT: u8 = 0x3;
    /// Keyed SGL Data Block (RDMA).
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
    /// Transport SGL Data Block.
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5;
}

/// SGL descriptor subtypes (lower nibble of byte 15).
pub mod sgl_subtype {
    /// Address: the address field is a memory address.
    pub const ADDRESS: u8 = 0x0;
    /// Offset: the address field is an offset into the in-capsule data.
    pub const OFFSET: u8 = 0x1;
    /// Transport specific; NVMe/TCP uses 0Ah for data moved by R2T/H2CData
    /// or C2HData.
    pub const TRANSPORT: u8 = 0xA;
}

/// SGL identifier byte for in-capsule data: Data Block (type 0h) with the
/// Offset subtype (1h).
pub const SGL_ID_IN_CAPSULE: u8 = (sgl_type::DATA_BLOCK << 4) | sgl_subtype::OFFSET;

/// SGL identifier byte for data moved by NVMe/TCP data PDUs: Transport SGL
/// Data Block (type 5h) with subtype Ah.
pub const SGL_ID_TRANSPORT: u8 = (sgl_type::TRANSPORT_DATA_BLOCK << 4) | sgl_subtype::TRANSPORT;

/// One 16-byte SGL descriptor: address (0..8), length (8..12), reserved
/// (12..15), SGL identifier = type << 4 | subtype (15).
///
/// The reserved bytes are kept so that any 16 bytes round-trip exactly (a
/// keyed descriptor uses them, NVMe/TCP does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SglDescriptor {
    /// Address or, for in-capsule data, the offset into the capsule's data.
    pub address: u64,
    /// Length in bytes.
    pub length: u32,
    /// Bytes 12..15.
    pub reserved: [u8; 3],
    /// SGL identifier (descriptor type in bits 7:4, subtype in bits 3:0).
    pub id: u8,
}

/// Where a command's data is, as NVMe/TCP reads an SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SglKind {
    /// Data is in the CapsuleCmd PDU, `offset` bytes into the in-capsule data.
    InCapsule {
        /// Offset into the in-capsule data (relative to ICDOFF).
        offset: u64,
        /// Length in bytes.
        length: u32,
    },
    /// Data moves in H2CData (after R2T) or C2HData PDUs. Length 0 means the
    /// command has no data.
    Transport {
        /// Length in bytes.
        length: u32,
    },
    /// A descriptor NVMe/TCP does not use (keyed, segment, ...).
    Unsupported {
        /// Descriptor type (upper nibble).
        descriptor_type: u8,
        /// Descriptor subtype (lower nibble).
        subtype: u8,
    },
}

impl SglDescriptor {
    /// Descriptor for `length` bytes of in-capsule data at `offset`.
    pub const fn in_capsule(offset: u64, length: u32) -> Self {
        Self {
            address: offset,
            length,
            reserved: [0; 3],
            id: SGL_ID_IN_CAPSULE,
        }
    }

    /// Descriptor for `length` bytes moved by R2T/H2CData or C2HData.
    pub const fn transport(length: u32) -> Self {
        Self {
            address: 0,
            length,
            reserved: [0; 3],
            id: SGL_ID_TRANSPORT,
        }
    }

    /// Descriptor for a command without data (what Linux sends): a transport
    /// data block of length 0.
    pub const fn null() -> Self {
        Self::transport(0)
    }

    /// Descriptor type (upper nibble of the identifier).
    pub const fn descriptor_type(&self) -> u8 {
        self.id >> 4
    }

    /// Descriptor subtype (lower nibble of the identifier).
    pub const fn subtype(&self) -> u8 {
        self.id & 0xF
    }

    /// How NVMe/TCP interprets this descriptor.
    pub const fn kind(&self) -> SglKind {
        match self.id {
            SGL_ID_IN_CAPSULE => SglKind::InCapsule {
                offset: self.address,
                length: self.length,
            },
            SGL_ID_TRANSPORT => SglKind::Transport {
                length: self.length,
            },
            _ => SglKind::Unsupported {
                descriptor_type: self.descriptor_type(),
                subtype: self.subtype(),
            },
        }
    }

    /// Decode from 16 bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        Self {
            address: get_u64(b, 0),
            length: get_u32(b, 8),
            reserved: [b[12], b[13], b[14]],
            id: b[15],
        }
    }

    /// Encode to 16 bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put_u64(&mut b, 0, self.address);
        put_u32(&mut b, 8, self.length);
        b[12..15].copy_from_slice(&self.reserved);
        b[15] = self.id;
        b
    }
}

/// A submission queue entry with every field addressable.
///
/// Typed views (e.g. [`crate::command::ReadWrite`], [`crate::fabrics::Connect`])
/// convert to and from this; unknown commands can still be inspected here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sqe {
    /// Opcode (byte 0).
    pub opcode: u8,
    /// FUSE (bits 1:0) and PSDT (bits 7:6) (byte 1).
    pub flags: u8,
    /// Command identifier (bytes 2..4).
    pub cid: u16,
    /// Namespace ID (bytes 4..8); for Fabrics commands the low byte is FCTYPE.
    pub nsid: u32,
    /// Command dword 2 (bytes 8..12).
    pub cdw2: u32,
    /// Command dword 3 (bytes 12..16).
    pub cdw3: u32,
    /// Metadata pointer (bytes 16..24).
    pub mptr: u64,
    /// Data pointer, SGL descriptor 1 (bytes 24..40).
    pub dptr: SglDescriptor,
    /// Command dword 10 (bytes 40..44).
    pub cdw10: u32,
    /// Command dword 11 (bytes 44..48).
    pub cdw11: u32,
    /// Command dword 12 (bytes 48..52).
    pub cdw12: u32,
    /// Command dword 13 (bytes 52..56).
    pub cdw13: u32,
    /// Command dword 14 (bytes 56..60).
    pub cdw14: u32,
    /// Command dword 15 (bytes 60..64).
    pub cdw15: u32,
}

impl Sqe {
    /// A zeroed SQE with `opcode`, `cid` and PSDT set to SGL.
    pub const fn new(opcode: u8, cid: u16) -> Self {
        Self {
            opcode,
            flags: FLAGS_PSDT_SGL,
            cid,
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            dptr: SglDescriptor::null(),
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }

    /// A Fabrics command SQE (opcode 7Fh) with `fctype` in byte 4.
    pub const fn fabrics(fctype: u8, cid: u16) -> Self {
        let mut sqe = Self::new(admin_opcode::FABRICS, cid);
        sqe.nsid = fctype as u32;
        sqe
    }

    /// Whether this is a Fabrics command.
    pub const fn is_fabrics(&self) -> bool {
        self.opcode == admin_opcode::FABRICS
    }

    /// FCTYPE of a Fabrics command (byte 4).
    pub const fn fctype(&self) -> u8 {
        self.nsid as u8
    }

    /// PSDT field (bits 7:6 of byte 1): 00b PRP, 01b/10b SGL.
    pub const fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// FUSE field (bits 1:0 of byte 1).
    pub const fn fuse(&self) -> u8 {
        self.flags & 0x3
    }

    /// Direction of the command's data, from the opcode (or FCTYPE).
    pub const fn data_direction(&self) -> DataDirection {
        if self.is_fabrics() {
            DataDirection::of_opcode(self.fctype())
        } else {
            DataDirection::of_opcode(self.opcode)
        }
    }

    /// Decode from 64 bytes. Every bit pattern is a valid SQE.
    pub fn from_bytes(b: &[u8; SQE_LEN]) -> Self {
        let mut dptr = [0u8; 16];
        dptr.copy_from_slice(&b[24..40]);
        Self {
            opcode: b[0],
            flags: b[1],
            cid: get_u16(b, 2),
            nsid: get_u32(b, 4),
            cdw2: get_u32(b, 8),
            cdw3: get_u32(b, 12),
            mptr: get_u64(b, 16),
            dptr: SglDescriptor::from_bytes(&dptr),
            cdw10: get_u32(b, 40),
            cdw11: get_u32(b, 44),
            cdw12: get_u32(b, 48),
            cdw13: get_u32(b, 52),
            cdw14: get_u32(b, 56),
            cdw15: get_u32(b, 60),
        }
    }

    /// Encode to 64 bytes.
    pub fn to_bytes(&self) -> [u8; SQE_LEN] {
        let mut b = [0u8; SQE_LEN];
        b[0] = self.opcode;
        b[1] = self.flags;
        put_u16(&mut b, 2, self.cid);
        put_u32(&mut b, 4, self.nsid);
        put_u32(&mut b, 8, self.cdw2);
        put_u32(&mut b, 12, self.cdw3);
        put_u64(&mut b, 16, self.mptr);
        b[24..40].copy_from_slice(&self.dptr.to_bytes());
        put_u32(&mut b, 40, self.cdw10);
        put_u32(&mut b, 44, self.cdw11);
        put_u32(&mut b, 48, self.cdw12);
        put_u32(&mut b, 52, self.cdw13);
        put_u32(&mut b, 56, self.cdw14);
        put_u32(&mut b, 60, self.cdw15);
        b
    }
}
