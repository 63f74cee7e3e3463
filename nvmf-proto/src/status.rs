//! NVMe completion status as data: Status Code Type, Status Code, and the
//! CRD/More/DNR bits of the completion queue entry's status field.
//!
//! Layout of CQE bytes 14..16 (NVMe base specification, "Completion Queue
//! Entry: Status Field"): bit 0 phase tag, bits 8:1 SC, bits 11:9 SCT,
//! bits 13:12 CRD, bit 14 More, bit 15 DNR. The phase tag is kept in
//! [`crate::Cqe`], not here, because it is a queue property, not a status.

use std::fmt;

/// Status Code Type values.
pub mod sct {
    /// Generic Command Status.
    pub const GENERIC: u8 = 0x0;
    /// Command Specific Status (meaning depends on the opcode).
    pub const COMMAND_SPECIFIC: u8 = 0x1;
    /// Media and Data Integrity Errors.
    pub const MEDIA_ERROR: u8 = 0x2;
    /// Path Related Status.
    pub const PATH_RELATED: u8 = 0x3;
    /// Vendor Specific.
    pub const VENDOR_SPECIFIC: u8 = 0x7;
}

/// A command's completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status {
    /// Status Code Type (3 bits), see [`sct`].
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Command Retry Delay index (2 bits): which CRDTn of Identify Controller
    /// the host waits before retrying.
    pub crd: u8,
    /// More: further information is in the Error Information log page.
    pub more: bool,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

const fn generic(sc: u8) -> Status {
    Status {
        sct: sct::GENERIC,
        sc,
        crd: 0,
        more: false,
        dnr: false,
    }
}

const fn command_specific(sc: u8) -> Status {
    Status {
        sct: sct::COMMAND_SPECIFIC,
        sc,
        crd: 0,
        more: false,
        dnr: false,
    }
}

const fn path_related(sc: u8) -> Status {
    Status {
        sct: sct::PATH_RELATED,
        sc,
        crd: 0,
        more: false,
        dnr: false,
    }
}

const fn media(sc: u8) -> Status {
    Status {
        sct: sct::MEDIA_ERROR,
        sc,
        crd: 0,
        more: false,
        dnr: false,
    }
}

impl Status {
    /// 0/00h Successful Completion.
    pub const SUCCESS: Self = generic(0x00);
    /// 0/01h Invalid Command Opcode.
    pub const INVALID_OPCODE: Self = generic(0x01);
    /// 0/02h Invalid Field in Command.
    pub const INVALID_FIELD: Self = generic(0x02);
    /// 0/03h Command ID Conflict.
    pub const COMMAND_ID_CONFLICT: Self = generic(0x03);
    /// 0/04h Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Self = generic(0x04);
    /// 0/05h Commands Aborted due to Power Loss Notification.
    pub const ABORTED_POWER_LOSS: Self = generic(0x05);
    /// 0/06h Internal Error.
    pub const INTERNAL_ERROR: Self = generic(0x06);
    /// 0/07h Command Abort Requested.
    pub const ABORT_REQUESTED: Self = generic(0x07);
    /// 0/08h Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Self = generic(0x08);
    /// 0/0Bh Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Self = generic(0x0B);
    /// 0/0Ch Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: Self = generic(0x0C);
    /// 0/0Dh Invalid SGL Segment Descriptor.
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Self = generic(0x0D);
    /// 0/0Eh Invalid Number of SGL Descriptors.
    pub const INVALID_SGL_DESCRIPTOR_COUNT: Self = generic(0x0E);
    /// 0/0Fh Data SGL Length Invalid.
    pub const DATA_SGL_LENGTH_INVALID: Self = generic(0x0F);
    /// 0/11h SGL Descriptor Type Invalid.
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Self = generic(0x11);
    /// 0/15h Operation Denied.
    pub const OPERATION_DENIED: Self = generic(0x15);
    /// 0/16h SGL Offset Invalid (e.g. in-capsule data beyond the capsule).
    pub const SGL_OFFSET_INVALID: Self = generic(0x16);
    /// 0/18h Host Identifier Inconsistent Format.
    pub const HOST_ID_INCONSISTENT_FORMAT: Self = generic(0x18);
    /// 0/19h Keep Alive Timer Expired.
    pub const KEEP_ALIVE_TIMER_EXPIRED: Self = generic(0x19);
    /// 0/1Ah Keep Alive Timeout Invalid.
    pub const KEEP_ALIVE_TIMEOUT_INVALID: Self = generic(0x1A);
    /// 0/1Bh Command Aborted due to Preempt and Abort.
    pub const ABORTED_PREEMPT: Self = generic(0x1B);
    /// 0/20h Namespace is Write Protected.
    pub const NAMESPACE_WRITE_PROTECTED: Self = generic(0x20);
    /// 0/21h Command Interrupted (retry is expected to succeed).
    pub const COMMAND_INTERRUPTED: Self = generic(0x21);
    /// 0/22h Transient Transport Error (e.g. a data digest error).
    pub const TRANSIENT_TRANSPORT_ERROR: Self = generic(0x22);
    /// 0/80h LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Self = generic(0x80);
    /// 0/81h Capacity Exceeded.
    pub const CAPACITY_EXCEEDED: Self = generic(0x81);
    /// 0/82h Namespace Not Ready.
    pub const NAMESPACE_NOT_READY: Self = generic(0x82);
    /// 0/83h Reservation Conflict.
    pub const RESERVATION_CONFLICT: Self = generic(0x83);

    /// 1/01h Invalid Queue Identifier.
    pub const INVALID_QUEUE_IDENTIFIER: Self = command_specific(0x01);
    /// 1/02h Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Self = command_specific(0x02);
    /// 1/05h Asynchronous Event Request Limit Exceeded.
    pub const ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED: Self = command_specific(0x05);
    /// 1/09h Invalid Log Page.
    pub const INVALID_LOG_PAGE: Self = command_specific(0x09);
    /// 1/0Dh Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Self = command_specific(0x0D);
    /// 1/0Eh Feature Not Changeable.
    pub const FEATURE_NOT_CHANGEABLE: Self = command_specific(0x0E);
    /// 1/0Fh Feature Not Namespace Specific.
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: Self = command_specific(0x0F);

    /// 1/80h for Fabrics Connect: Incompatible Format (RECFMT not supported).
    pub const CONNECT_INCOMPATIBLE_FORMAT: Self = command_specific(0x80);
    /// 1/81h for Fabrics Connect: Controller Busy.
    pub const CONNECT_CONTROLLER_BUSY: Self = command_specific(0x81);
    /// 1/82h for Fabrics Connect: Connect Invalid Parameters (CQE DW0 says
    /// which, see [`crate::fabrics::ConnectInvalidParameter`]).
    pub const CONNECT_INVALID_PARAMETERS: Self = command_specific(0x82);
    /// 1/83h for Fabrics Connect: Connect Restart Discovery.
    pub const CONNECT_RESTART_DISCOVERY: Self = command_specific(0x83);
    /// 1/84h for Fabrics Connect: Connect Invalid Host (host not allowed).
    pub const CONNECT_INVALID_HOST: Self = command_specific(0x84);
    /// 1/90h for Get Log Page of the discovery log: Log Restart Discovery.
    pub const DISCOVERY_RESTART: Self = command_specific(0x90);
    /// 1/91h for Fabrics commands: Authentication Required.
    pub const AUTHENTICATION_REQUIRED: Self = command_specific(0x91);

    /// 1/80h for NVM I/O commands: Conflicting Attributes (e.g. DSM).
    pub const CONFLICTING_ATTRIBUTES: Self = command_specific(0x80);
    /// 1/82h for NVM I/O commands: Attempted Write to Read Only Range.
    pub const WRITE_TO_READ_ONLY_RANGE: Self = command_specific(0x82);

    /// 2/80h Write Fault.
    pub const WRITE_FAULT: Self = media(0x80);
    /// 2/81h Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: Self = media(0x81);

    /// 3/00h Internal Path Error.
    pub const INTERNAL_PATH_ERROR: Self = path_related(0x00);
    /// 3/60h Controller Pathing Error.
    pub const CONTROLLER_PATHING_ERROR: Self = path_related(0x60);
    /// 3/70h Host Pathing Error.
    pub const HOST_PATHING_ERROR: Self = path_related(0x70);
    /// 3/71h Command Aborted By Host.
    pub const ABORTED_BY_HOST: Self = path_related(0x71);

    /// This status with Do Not Retry set.
    pub const fn with_dnr(mut self) -> Self {
        self.dnr = true;
        self
    }

    /// This status with More set (details in the Error Information log).
    pub const fn with_more(mut self) -> Self {
        self.more = true;
        self
    }

    /// Whether this is Successful Completion (ignoring CRD/More/DNR).
    pub const fn is_success(&self) -> bool {
        self.sct == sct::GENERIC && self.sc == 0
    }

    /// Whether this is Reservation Conflict: the namespace is reserved by
    /// another host. Retrying elsewhere or later does not help; a host
    /// fenced this way must stop writing.
    pub const fn is_reservation_conflict(&self) -> bool {
        self.same_code(Self::RESERVATION_CONFLICT)
    }

    /// Whether SCT and SC match `other`, ignoring CRD/More/DNR.
    pub const fn same_code(&self, other: Status) -> bool {
        self.sct == other.sct && self.sc == other.sc
    }

    /// Decode from the CQE status field (bytes 14..16 of the CQE, including
    /// the phase tag in bit 0, which is ignored here).
    pub const fn from_field(field: u16) -> Self {
        Status {
            sc: (field >> 1) as u8,
            sct: ((field >> 9) & 0x7) as u8,
            crd: ((field >> 12) & 0x3) as u8,
            more: field & (1 << 14) != 0,
            dnr: field & (1 << 15) != 0,
        }
    }

    /// Encode into the CQE status field with the phase tag bit clear.
    /// Out-of-range SCT/CRD bits are masked off.
    pub const fn to_field(&self) -> u16 {
        ((self.sc as u16) << 1)
            | (((self.sct & 0x7) as u16) << 9)
            | (((self.crd & 0x3) as u16) << 12)
            | ((self.more as u16) << 14)
            | ((self.dnr as u16) << 15)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SCT {:#x} SC {:#04x}", self.sct, self.sc)?;
        if self.dnr {
            f.write_str(" DNR")?;
        }
        if self.more {
            f.write_str(" MORE")?;
        }
        Ok(())
    }
}
