//! The 16-byte completion queue entry (CQE).
//!
//! Byte layout (NVMe base specification, "Common Completion Queue Entry"):
//! DW0 (0..4) and DW1 (4..8) command specific, SQHD (8..10), SQID (10..12),
//! CID (12..14), status field with phase tag (14..16).

use crate::status::Status;
use crate::wire::{get_u16, get_u32, put_u16, put_u32};

/// Size of a completion queue entry.
pub const CQE_LEN: usize = 16;

/// SQHD value a controller returns when SQ flow control is disabled
/// (Connect CATTR bit 2): the host must not use SQHD.
pub const SQHD_FLOW_CONTROL_DISABLED: u16 = 0xFFFF;

/// Bit 31 of DW1 marks a Gimbal credit report (project wire decision: a
/// Gimbal target puts the tenant's credit total in the otherwise reserved DW1).
pub const GIMBAL_CREDIT_VALID: u32 = 1 << 31;

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cqe {
    /// Command specific dword 0 (e.g. Connect's CNTLID, Property Get's value).
    pub dw0: u32,
    /// Command specific dword 1 (Property Get high half; Gimbal credits).
    pub dw1: u32,
    /// SQ head pointer.
    pub sqhd: u16,
    /// SQ identifier.
    pub sqid: u16,
    /// Identifier of the completed command.
    pub cid: u16,
    /// Completion status.
    pub status: Status,
    /// Phase tag (bit 0 of the status field; reserved over fabrics).
    pub phase: bool,
}

impl Cqe {
    /// A completion for `cid` with `status` and all other fields zero.
    pub const fn new(cid: u16, status: Status) -> Self {
        Self {
            dw0: 0,
            dw1: 0,
            sqhd: 0,
            sqid: 0,
            cid,
            status,
            phase: false,
        }
    }

    /// A successful completion for `cid`.
    pub const fn success(cid: u16) -> Self {
        Self::new(cid, Status::SUCCESS)
    }

    /// This CQE with DW0 set.
    pub const fn with_dw0(mut self, dw0: u32) -> Self {
        self.dw0 = dw0;
        self
    }

    /// This CQE with SQHD set.
    pub const fn with_sqhd(mut self, sqhd: u16) -> Self {
        self.sqhd = sqhd;
        self
    }

    /// A Property Get result: the value spans DW0 (low) and DW1 (high).
    pub const fn with_property_value(mut self, value: u64) -> Self {
        self.dw0 = value as u32;
        self.dw1 = (value >> 32) as u32;
        self
    }

    /// The 64-bit value of a Property Get completion.
    pub const fn property_value(&self) -> u64 {
        (self.dw0 as u64) | ((self.dw1 as u64) << 32)
    }

    /// This CQE carrying a Gimbal credit total (31 bits; larger values saturate).
    pub const fn with_gimbal_credit(mut self, credit: u32) -> Self {
        let credit = if credit > !GIMBAL_CREDIT_VALID {
            !GIMBAL_CREDIT_VALID
        } else {
            credit
        };
        self.dw1 = GIMBAL_CREDIT_VALID | credit;
        self
    }

    /// The Gimbal credit total, if DW1 carries one.
    pub const fn gimbal_credit(&self) -> Option<u32> {
        if self.dw1 & GIMBAL_CREDIT_VALID != 0 {
            Some(self.dw1 & !GIMBAL_CREDIT_VALID)
        } else {
            None
        }
    }

    /// Decode from 16 bytes. Every bit pattern is a valid CQE.
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Self {
        let field = get_u16(b, 14);
        Self {
            dw0: get_u32(b, 0),
            dw1: get_u32(b, 4),
            sqhd: get_u16(b, 8),
            sqid: get_u16(b, 10),
            cid: get_u16(b, 12),
            status: Status::from_field(field),
            phase: field & 1 != 0,
        }
    }

    /// Encode to 16 bytes.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        put_u32(&mut b, 0, self.dw0);
        put_u32(&mut b, 4, self.dw1);
        put_u16(&mut b, 8, self.sqhd);
        put_u16(&mut b, 10, self.sqid);
        put_u16(&mut b, 12, self.cid);
        put_u16(&mut b, 14, self.status.to_field() | self.phase as u16);
        b
    }
}
