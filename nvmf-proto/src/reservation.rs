//! Reservations (NVMe Base Specification 2.x, "Reservations"): the four
//! I/O commands, their data, the Reservation Status data structure and the
//! Reservation Notification log page.
//!
//! | command | opcode | data |
//! |---|---|---|
//! | Reservation Register | 0Dh | host to controller, 16 bytes: CRKEY, NRKEY |
//! | Reservation Report | 0Eh | controller to host, (NUMD + 1) * 4 bytes |
//! | Reservation Acquire | 11h | host to controller, 16 bytes: CRKEY, PRKEY |
//! | Reservation Release | 15h | host to controller, 8 bytes: CRKEY |
//!
//! Each command converts to an [`Sqe`] (`to_sqe(cid)`, with a transport SGL
//! describing its data; a host sending the data in the capsule replaces the
//! data pointer) and its data (`data()`), and back (`parse(sqe, data)`).
//! Parsing checks the data length against the command's fixed size and
//! keeps fields it does not judge (an unknown action, a reserved type) so
//! that the controller answers them with the status it chooses.
//!
//! [`ReservationStatus`] encodes into a caller-sized buffer (a report
//! returns as many registrant entries as fit, REGCTL counting all of them)
//! and decodes only the entries the buffer holds, whatever REGCTL claims.

use crate::command::expect_opcode;
use crate::error::ProtoError;
use crate::sqe::{SglDescriptor, Sqe};
use crate::wire::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

/// Reservation command opcodes (NVM command set I/O commands).
pub mod opcode {
    use crate::sqe::io_opcode;

    /// Reservation Register.
    pub const REGISTER: u8 = io_opcode::RESERVATION_REGISTER;
    /// Reservation Report.
    pub const REPORT: u8 = io_opcode::RESERVATION_REPORT;
    /// Reservation Acquire.
    pub const ACQUIRE: u8 = io_opcode::RESERVATION_ACQUIRE;
    /// Reservation Release.
    pub const RELEASE: u8 = io_opcode::RESERVATION_RELEASE;
}

/// Reservation Capabilities (Identify Namespace RESCAP, byte 31).
pub mod rescap {
    /// Persist Through Power Loss is supported.
    pub const PTPL: u8 = 1 << 0;
    /// Write Exclusive.
    pub const WRITE_EXCLUSIVE: u8 = 1 << 1;
    /// Exclusive Access.
    pub const EXCLUSIVE_ACCESS: u8 = 1 << 2;
    /// Write Exclusive - Registrants Only.
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 1 << 3;
    /// Exclusive Access - Registrants Only.
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 1 << 4;
    /// Write Exclusive - All Registrants.
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 1 << 5;
    /// Exclusive Access - All Registrants.
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 1 << 6;
    /// Ignore Existing Key is used as NVMe 1.3 and later define it.
    pub const IEKEY_1_3: u8 = 1 << 7;
    /// Every reservation type.
    pub const ALL_TYPES: u8 = 0x7E;
}

/// A reservation type (Acquire and Release CDW10 bits 15:8, Report RTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReservationType {
    /// 1h: only the holder may write; anyone may read.
    WriteExclusive = 1,
    /// 2h: only the holder may read or write.
    ExclusiveAccess = 2,
    /// 3h: registrants may write; anyone may read.
    WriteExclusiveRegistrantsOnly = 3,
    /// 4h: only registrants may read or write.
    ExclusiveAccessRegistrantsOnly = 4,
    /// 5h: like 3h, and every registrant is a holder.
    WriteExclusiveAllRegistrants = 5,
    /// 6h: like 4h, and every registrant is a holder.
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    /// Every type, in code order.
    pub const ALL: [Self; 6] = [
        Self::WriteExclusive,
        Self::ExclusiveAccess,
        Self::WriteExclusiveRegistrantsOnly,
        Self::ExclusiveAccessRegistrantsOnly,
        Self::WriteExclusiveAllRegistrants,
        Self::ExclusiveAccessAllRegistrants,
    ];

    /// The type with code `v` (1..=6).
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::WriteExclusive,
            2 => Self::ExclusiveAccess,
            3 => Self::WriteExclusiveRegistrantsOnly,
            4 => Self::ExclusiveAccessRegistrantsOnly,
            5 => Self::WriteExclusiveAllRegistrants,
            6 => Self::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Its code.
    pub const fn to_u8(self) -> u8 {
        self as u8
    }

    /// Whether reads by hosts without access are refused too (the
    /// Exclusive Access family), not only writes.
    pub const fn excludes_reads(self) -> bool {
        matches!(
            self,
            Self::ExclusiveAccess
                | Self::ExclusiveAccessRegistrantsOnly
                | Self::ExclusiveAccessAllRegistrants
        )
    }

    /// Whether registrants have the holder's access (the Registrants Only
    /// and All Registrants types).
    pub const fn registrants_have_access(self) -> bool {
        !matches!(self, Self::WriteExclusive | Self::ExclusiveAccess)
    }

    /// Whether every registrant is a reservation holder (All Registrants).
    pub const fn all_registrants(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants
        )
    }
}

/// Reservation Register Action (CDW10 bits 2:0).
pub mod register_action {
    /// Register a reservation key.
    pub const REGISTER: u8 = 0;
    /// Unregister.
    pub const UNREGISTER: u8 = 1;
    /// Replace the key.
    pub const REPLACE: u8 = 2;
}

/// Change Persist Through Power Loss State (Register CDW10 bits 31:30).
pub mod cptpl {
    /// No change.
    pub const NO_CHANGE: u8 = 0;
    /// Set PTPL to 0: reservations are released and registrants cleared
    /// on a power loss.
    pub const CLEAR: u8 = 2;
    /// Set PTPL to 1: reservations and registrants persist.
    pub const SET: u8 = 3;
}

/// Reservation Acquire Action (CDW10 bits 2:0).
pub mod acquire_action {
    /// Acquire.
    pub const ACQUIRE: u8 = 0;
    /// Preempt.
    pub const PREEMPT: u8 = 1;
    /// Preempt and Abort.
    pub const PREEMPT_AND_ABORT: u8 = 2;
}

/// Reservation Release Action (CDW10 bits 2:0).
pub mod release_action {
    /// Release.
    pub const RELEASE: u8 = 0;
    /// Clear.
    pub const CLEAR: u8 = 1;
}

/// Bytes of Reservation Register and Acquire data.
pub const REGISTER_DATA_LEN: usize = 16;
/// Bytes of Reservation Acquire data.
pub const ACQUIRE_DATA_LEN: usize = 16;
/// Bytes of Reservation Release data.
pub const RELEASE_DATA_LEN: usize = 8;

fn data_of<const N: usize>(data: &[u8], structure: &'static str) -> Result<[u8; N], ProtoError> {
    data.get(..N)
        .and_then(|d| d.try_into().ok())
        .filter(|_| data.len() == N)
        .ok_or(ProtoError::Truncated {
            structure,
            needed: N,
            actual: data.len(),
        })
}

/// Reservation Register (opcode 0Dh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationRegister {
    /// Namespace.
    pub nsid: u32,
    /// Reservation Register Action (CDW10 bits 2:0), see [`register_action`].
    pub action: u8,
    /// Ignore Existing Key (CDW10 bit 3): CRKEY is not checked.
    pub iekey: bool,
    /// Change Persist Through Power Loss State (CDW10 bits 31:30), see
    /// [`cptpl`].
    pub cptpl: u8,
    /// Current Reservation Key (data bytes 0..8).
    pub crkey: u64,
    /// New Reservation Key (data bytes 8..16).
    pub nrkey: u64,
}

impl ReservationRegister {
    /// Register `key` on `nsid`.
    pub const fn register(nsid: u32, key: u64) -> Self {
        Self {
            nsid,
            action: register_action::REGISTER,
            iekey: false,
            cptpl: cptpl::NO_CHANGE,
            crkey: 0,
            nrkey: key,
        }
    }

    /// Unregister the host holding `key`.
    pub const fn unregister(nsid: u32, key: u64) -> Self {
        Self {
            nsid,
            action: register_action::UNREGISTER,
            iekey: false,
            cptpl: cptpl::NO_CHANGE,
            crkey: key,
            nrkey: 0,
        }
    }

    /// Replace `current` with `new`.
    pub const fn replace(nsid: u32, current: u64, new: u64) -> Self {
        Self {
            nsid,
            action: register_action::REPLACE,
            iekey: false,
            cptpl: cptpl::NO_CHANGE,
            crkey: current,
            nrkey: new,
        }
    }

    /// The SQE; the data (16 bytes) is described by a transport SGL.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode::REGISTER, cid);
        s.nsid = self.nsid;
        s.dptr = SglDescriptor::transport(REGISTER_DATA_LEN as u32);
        s.cdw10 = (self.action & 0x7) as u32
            | (self.iekey as u32) << 3
            | ((self.cptpl & 0x3) as u32) << 30;
        s
    }

    /// The command's data: CRKEY, NRKEY.
    pub fn data(&self) -> [u8; REGISTER_DATA_LEN] {
        let mut d = [0u8; REGISTER_DATA_LEN];
        put_u64(&mut d, 0, self.crkey);
        put_u64(&mut d, 8, self.nrkey);
        d
    }

    /// Read from an SQE with opcode 0Dh and its 16 bytes of data.
    pub fn parse(s: &Sqe, data: &[u8]) -> Result<Self, ProtoError> {
        expect_opcode(s, opcode::REGISTER, "Reservation Register")?;
        let d: [u8; REGISTER_DATA_LEN] = data_of(data, "Reservation Register data")?;
        Ok(Self {
            nsid: s.nsid,
            action: (s.cdw10 & 0x7) as u8,
            iekey: s.cdw10 & (1 << 3) != 0,
            cptpl: (s.cdw10 >> 30) as u8,
            crkey: get_u64(&d, 0),
            nrkey: get_u64(&d, 8),
        })
    }
}

/// Reservation Acquire (opcode 11h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationAcquire {
    /// Namespace.
    pub nsid: u32,
    /// Reservation Acquire Action (CDW10 bits 2:0), see [`acquire_action`].
    pub action: u8,
    /// Ignore Existing Key (CDW10 bit 3); a controller following NVMe 1.3
    /// and later refuses it.
    pub iekey: bool,
    /// Reservation Type (CDW10 bits 15:8), see [`ReservationType`].
    pub rtype: u8,
    /// Current Reservation Key (data bytes 0..8).
    pub crkey: u64,
    /// Preempt Reservation Key (data bytes 8..16).
    pub prkey: u64,
}

impl ReservationAcquire {
    /// Acquire a reservation of type `rtype` with key `key`.
    pub const fn acquire(nsid: u32, rtype: ReservationType, key: u64) -> Self {
        Self {
            nsid,
            action: acquire_action::ACQUIRE,
            iekey: false,
            rtype: rtype.to_u8(),
            crkey: key,
            prkey: 0,
        }
    }

    /// Preempt the registrants holding `victim` (and take the reservation
    /// if they held it), aborting their commands when `abort`.
    pub const fn preempt(
        nsid: u32,
        rtype: ReservationType,
        key: u64,
        victim: u64,
        abort: bool,
    ) -> Self {
        Self {
            nsid,
            action: if abort {
                acquire_action::PREEMPT_AND_ABORT
            } else {
                acquire_action::PREEMPT
            },
            iekey: false,
            rtype: rtype.to_u8(),
            crkey: key,
            prkey: victim,
        }
    }

    /// The SQE; the data (16 bytes) is described by a transport SGL.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode::ACQUIRE, cid);
        s.nsid = self.nsid;
        s.dptr = SglDescriptor::transport(ACQUIRE_DATA_LEN as u32);
        s.cdw10 = (self.action & 0x7) as u32 | (self.iekey as u32) << 3 | (self.rtype as u32) << 8;
        s
    }

    /// The command's data: CRKEY, PRKEY.
    pub fn data(&self) -> [u8; ACQUIRE_DATA_LEN] {
        let mut d = [0u8; ACQUIRE_DATA_LEN];
        put_u64(&mut d, 0, self.crkey);
        put_u64(&mut d, 8, self.prkey);
        d
    }

    /// Read from an SQE with opcode 11h and its 16 bytes of data.
    pub fn parse(s: &Sqe, data: &[u8]) -> Result<Self, ProtoError> {
        expect_opcode(s, opcode::ACQUIRE, "Reservation Acquire")?;
        let d: [u8; ACQUIRE_DATA_LEN] = data_of(data, "Reservation Acquire data")?;
        Ok(Self {
            nsid: s.nsid,
            action: (s.cdw10 & 0x7) as u8,
            iekey: s.cdw10 & (1 << 3) != 0,
            rtype: (s.cdw10 >> 8) as u8,
            crkey: get_u64(&d, 0),
            prkey: get_u64(&d, 8),
        })
    }
}

/// Reservation Release (opcode 15h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationRelease {
    /// Namespace.
    pub nsid: u32,
    /// Reservation Release Action (CDW10 bits 2:0), see [`release_action`].
    pub action: u8,
    /// Ignore Existing Key (CDW10 bit 3); refused as for Acquire.
    pub iekey: bool,
    /// Reservation Type (CDW10 bits 15:8): must match the reservation's.
    pub rtype: u8,
    /// Current Reservation Key (data bytes 0..8).
    pub crkey: u64,
}

impl ReservationRelease {
    /// Release the reservation of type `rtype` held with `key`.
    pub const fn release(nsid: u32, rtype: ReservationType, key: u64) -> Self {
        Self {
            nsid,
            action: release_action::RELEASE,
            iekey: false,
            rtype: rtype.to_u8(),
            crkey: key,
        }
    }

    /// Clear the reservation and every registration (by a registrant
    /// holding `key`).
    pub const fn clear(nsid: u32, key: u64) -> Self {
        Self {
            nsid,
            action: release_action::CLEAR,
            iekey: false,
            rtype: 0,
            crkey: key,
        }
    }

    /// The SQE; the data (8 bytes) is described by a transport SGL.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode::RELEASE, cid);
        s.nsid = self.nsid;
        s.dptr = SglDescriptor::transport(RELEASE_DATA_LEN as u32);
        s.cdw10 = (self.action & 0x7) as u32 | (self.iekey as u32) << 3 | (self.rtype as u32) << 8;
        s
    }

    /// The command's data: CRKEY.
    pub fn data(&self) -> [u8; RELEASE_DATA_LEN] {
        self.crkey.to_le_bytes()
    }

    /// Read from an SQE with opcode 15h and its 8 bytes of data.
    pub fn parse(s: &Sqe, data: &[u8]) -> Result<Self, ProtoError> {
        expect_opcode(s, opcode::RELEASE, "Reservation Release")?;
        let d: [u8; RELEASE_DATA_LEN] = data_of(data, "Reservation Release data")?;
        Ok(Self {
            nsid: s.nsid,
            action: (s.cdw10 & 0x7) as u8,
            iekey: s.cdw10 & (1 << 3) != 0,
            rtype: (s.cdw10 >> 8) as u8,
            crkey: get_u64(&d, 0),
        })
    }
}

/// Reservation Report (opcode 0Eh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationReport {
    /// Namespace.
    pub nsid: u32,
    /// Number of dwords to return, 0's based (CDW10).
    pub numd: u32,
    /// Extended Data Structure (CDW11 bit 0): 64-byte registrant entries
    /// with 128-bit host identifiers.
    pub eds: bool,
}

impl ReservationReport {
    /// Report into `len` bytes (a non-zero multiple of 4).
    pub fn new(nsid: u32, len: u32, eds: bool) -> Result<Self, ProtoError> {
        if len == 0 || len % 4 != 0 {
            return Err(ProtoError::Unencodable {
                what: "Reservation Report",
                reason: "length must be a non-zero multiple of 4",
            });
        }
        Ok(Self {
            nsid,
            numd: len / 4 - 1,
            eds,
        })
    }

    /// Bytes requested: (NUMD + 1) * 4.
    pub const fn data_len(&self) -> u64 {
        (self.numd as u64 + 1) * 4
    }

    /// The SQE; the data comes back by C2HData.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(opcode::REPORT, cid);
        s.nsid = self.nsid;
        // `new` bounds the length by u32; a hand-built NUMD beyond that
        // saturates rather than wraps.
        s.dptr = SglDescriptor::transport(u32::try_from(self.data_len()).unwrap_or(u32::MAX));
        s.cdw10 = self.numd;
        s.cdw11 = self.eds as u32;
        s
    }

    /// Read from an SQE with opcode 0Eh.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_opcode(s, opcode::REPORT, "Reservation Report")?;
        Ok(Self {
            nsid: s.nsid,
            numd: s.cdw10,
            eds: s.cdw11 & 1 != 0,
        })
    }
}

/// One of the four reservation commands, by opcode, before its data is
/// read (Register, Acquire and Release carry theirs to the controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReservationCommandKind {
    /// Reservation Register: 16 bytes of data.
    Register,
    /// Reservation Report: data to the host.
    Report,
    /// Reservation Acquire: 16 bytes of data.
    Acquire,
    /// Reservation Release: 8 bytes of data.
    Release,
}

impl ReservationCommandKind {
    /// The kind of a reservation opcode.
    pub const fn of_opcode(op: u8) -> Option<Self> {
        Some(match op {
            opcode::REGISTER => Self::Register,
            opcode::REPORT => Self::Report,
            opcode::ACQUIRE => Self::Acquire,
            opcode::RELEASE => Self::Release,
            _ => return None,
        })
    }

    /// Bytes of data the host sends with it (0 for Report).
    pub const fn host_data_len(self) -> usize {
        match self {
            Self::Register => REGISTER_DATA_LEN,
            Self::Acquire => ACQUIRE_DATA_LEN,
            Self::Release => RELEASE_DATA_LEN,
            Self::Report => 0,
        }
    }
}

/// Header of the Reservation Status data structure: 24 bytes, or 64 in
/// the extended layout.
pub const STATUS_HEADER_LEN: usize = 24;
/// Header of the extended Reservation Status data structure.
pub const STATUS_EXT_HEADER_LEN: usize = 64;
/// One Registered Controller data structure.
pub const REGISTRANT_LEN: usize = 24;
/// One Registered Controller Extended data structure.
pub const REGISTRANT_EXT_LEN: usize = 64;

/// RCSTS bit 0: the controller's host holds the reservation.
pub const RCSTS_HOLDS: u8 = 1 << 0;

/// A registrant in a Reservation Report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegisteredController {
    /// Controller ID (FFFFh: the dynamic model, a host rather than one of
    /// its controllers, as Linux nvmet reports).
    pub cntlid: u16,
    /// Whether this registrant holds the reservation (RCSTS bit 0).
    pub holds: bool,
    /// Host identifier: 128 bits in the extended layout; the regular
    /// layout carries only bytes 0..8 (bytes 8..16 must be zero).
    pub host_id: [u8; 16],
    /// Reservation key.
    pub rkey: u64,
}

/// The Reservation Status data structure a Reservation Report returns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReservationStatus {
    /// Generation (GEN): bumped by every registration change and preempt.
    pub generation: u32,
    /// Reservation Type (RTYPE), 0 when no reservation is held; see
    /// [`ReservationType`].
    pub rtype: u8,
    /// Number of registrants (REGCTL): all of them, also those a short
    /// buffer had no room for.
    pub regctl: u16,
    /// Persist Through Power Loss State (PTPLS).
    pub ptpls: bool,
    /// The registrant entries (those that fit in the buffer).
    pub registrants: Vec<RegisteredController>,
}

impl ReservationStatus {
    /// The reservation's type, if one is held and its code is known.
    pub fn reservation_type(&self) -> Option<ReservationType> {
        ReservationType::from_u8(self.rtype)
    }

    fn layout(extended: bool) -> (usize, usize) {
        if extended {
            (STATUS_EXT_HEADER_LEN, REGISTRANT_EXT_LEN)
        } else {
            (STATUS_HEADER_LEN, REGISTRANT_LEN)
        }
    }

    /// Encode into `out` (the report's whole buffer, zero-filled here):
    /// the header, then as many entries as fit; REGCTL is written as
    /// given. A buffer shorter than the header gets the header's first
    /// bytes. In the regular layout a host identifier must fit 64 bits.
    pub fn encode(&self, extended: bool, out: &mut [u8]) -> Result<(), ProtoError> {
        out.fill(0);
        let (header_len, entry_len) = Self::layout(extended);
        let mut header = [0u8; STATUS_EXT_HEADER_LEN];
        put_u32(&mut header, 0, self.generation);
        header[4] = self.rtype;
        put_u16(&mut header, 5, self.regctl);
        header[9] = self.ptpls as u8;
        let n = out.len().min(header_len);
        out[..n].copy_from_slice(&header[..n]);
        let entries = out.get_mut(header_len..).unwrap_or_default();
        for (slot, r) in entries.chunks_exact_mut(entry_len).zip(&self.registrants) {
            put_u16(slot, 0, r.cntlid);
            slot[2] = if r.holds { RCSTS_HOLDS } else { 0 };
            if extended {
                put_u64(slot, 8, r.rkey);
                slot[16..32].copy_from_slice(&r.host_id);
            } else {
                if r.host_id[8..] != [0; 8] {
                    return Err(ProtoError::Unencodable {
                        what: "Reservation Status",
                        reason: "a 128-bit host identifier needs the extended layout",
                    });
                }
                slot[8..16].copy_from_slice(&r.host_id[..8]);
                put_u64(slot, 16, r.rkey);
            }
        }
        Ok(())
    }

    /// The structure in a buffer of its exact size: header plus one
    /// entry per registrant listed.
    pub fn to_vec(&self, extended: bool) -> Result<Vec<u8>, ProtoError> {
        let (header_len, entry_len) = Self::layout(extended);
        let mut out = vec![0u8; header_len + entry_len * self.registrants.len()];
        self.encode(extended, &mut out)?;
        Ok(out)
    }

    /// Decode from a report's data. Only the entries the buffer holds are
    /// read (at most REGCTL of them), so a REGCTL larger than the buffer
    /// sizes nothing.
    pub fn decode(b: &[u8], extended: bool) -> Result<Self, ProtoError> {
        let (header_len, entry_len) = Self::layout(extended);
        let header = b.get(..header_len).ok_or(ProtoError::Truncated {
            structure: "Reservation Status",
            needed: header_len,
            actual: b.len(),
        })?;
        let regctl = get_u16(header, 5);
        let registrants = b[header_len..]
            .chunks_exact(entry_len)
            .take(regctl as usize)
            .map(|e| {
                let mut host_id = [0u8; 16];
                let rkey = if extended {
                    host_id.copy_from_slice(&e[16..32]);
                    get_u64(e, 8)
                } else {
                    host_id[..8].copy_from_slice(&e[8..16]);
                    get_u64(e, 16)
                };
                RegisteredController {
                    cntlid: get_u16(e, 0),
                    holds: e[2] & RCSTS_HOLDS != 0,
                    host_id,
                    rkey,
                }
            })
            .collect();
        Ok(Self {
            generation: get_u32(header, 0),
            rtype: header[4],
            regctl,
            ptpls: header[9] & 1 != 0,
            registrants,
        })
    }
}

/// Reservation Notification log page types.
pub mod notification_type {
    /// Empty Log Page: nothing to report.
    pub const EMPTY: u8 = 0;
    /// Registration Preempted.
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    /// Reservation Released.
    pub const RESERVATION_RELEASED: u8 = 2;
    /// Reservation Preempted.
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// Size of the Reservation Notification log page (LID 80h).
pub const NOTIFICATION_LOG_LEN: usize = 64;

/// The Reservation Notification log page (LID 80h): one notification per
/// read, the oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReservationNotification {
    /// Log Page Count (bytes 0..8): increments with every notification; 0
    /// for an empty page; a jump of more than one means some were lost.
    pub count: u64,
    /// Reservation Notification Log Page Type (byte 8), see
    /// [`notification_type`].
    pub log_type: u8,
    /// Number of Available Log Pages (byte 9): how many more wait.
    pub available: u8,
    /// Namespace (bytes 12..16).
    pub nsid: u32,
}

impl ReservationNotification {
    /// Encode to 64 bytes.
    pub fn to_bytes(&self) -> [u8; NOTIFICATION_LOG_LEN] {
        let mut b = [0u8; NOTIFICATION_LOG_LEN];
        put_u64(&mut b, 0, self.count);
        b[8] = self.log_type;
        b[9] = self.available;
        put_u32(&mut b, 12, self.nsid);
        b
    }

    /// Decode from at least 64 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = crate::wire::fixed::<NOTIFICATION_LOG_LEN>(b, "Reservation Notification log")?;
        Ok(Self {
            count: get_u64(b, 0),
            log_type: b[8],
            available: b[9],
            nsid: get_u32(b, 12),
        })
    }

    /// Whether the page holds no notification.
    pub const fn is_empty(&self) -> bool {
        self.log_type == notification_type::EMPTY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        let reg = ReservationRegister {
            nsid: 3,
            action: register_action::REPLACE,
            iekey: true,
            cptpl: cptpl::SET,
            crkey: 0x1122_3344_5566_7788,
            nrkey: u64::MAX,
        };
        let sqe = reg.to_sqe(9);
        assert_eq!(sqe.opcode, opcode::REGISTER);
        assert_eq!(sqe.cdw10, 2 | 1 << 3 | 3 << 30);
        assert_eq!(sqe.dptr.length, 16);
        assert_eq!(ReservationRegister::parse(&sqe, &reg.data()).unwrap(), reg);

        let acq = ReservationAcquire::preempt(1, ReservationType::ExclusiveAccess, 5, 6, true);
        let sqe = acq.to_sqe(1);
        assert_eq!(sqe.cdw10, 2 | 2 << 8);
        assert_eq!(ReservationAcquire::parse(&sqe, &acq.data()).unwrap(), acq);

        let rel = ReservationRelease::release(1, ReservationType::WriteExclusive, 7);
        let sqe = rel.to_sqe(1);
        assert_eq!(sqe.cdw10, 1 << 8);
        assert_eq!(ReservationRelease::parse(&sqe, &rel.data()).unwrap(), rel);

        let rep = ReservationReport::new(1, 4096, true).unwrap();
        let sqe = rep.to_sqe(1);
        assert_eq!((sqe.cdw10, sqe.cdw11, sqe.dptr.length), (1023, 1, 4096));
        assert_eq!(ReservationReport::from_sqe(&sqe).unwrap(), rep);
        assert_eq!(rep.data_len(), 4096);
    }

    #[test]
    fn wrong_data_length_and_opcode_are_errors() {
        let reg = ReservationRegister::register(1, 1);
        let sqe = reg.to_sqe(0);
        assert!(ReservationRegister::parse(&sqe, &[0; 15]).is_err());
        assert!(ReservationRegister::parse(&sqe, &[0; 17]).is_err());
        assert!(ReservationAcquire::parse(&sqe, &[0; 16]).is_err());
        let rel = ReservationRelease::clear(1, 1).to_sqe(0);
        assert!(ReservationRelease::parse(&rel, &[0; 16]).is_err());
        assert!(ReservationReport::new(1, 0, true).is_err());
        assert!(ReservationReport::new(1, 6, true).is_err());
    }

    #[test]
    fn types_and_their_rules() {
        for t in ReservationType::ALL {
            assert_eq!(ReservationType::from_u8(t.to_u8()), Some(t));
        }
        assert_eq!(ReservationType::from_u8(0), None);
        assert_eq!(ReservationType::from_u8(7), None);
        assert!(ReservationType::ExclusiveAccessAllRegistrants.all_registrants());
        assert!(!ReservationType::WriteExclusive.registrants_have_access());
        assert!(ReservationType::ExclusiveAccessRegistrantsOnly.excludes_reads());
    }

    fn status() -> ReservationStatus {
        ReservationStatus {
            generation: 7,
            rtype: 1,
            regctl: 2,
            ptpls: true,
            registrants: vec![
                RegisteredController {
                    cntlid: 0xFFFF,
                    holds: true,
                    host_id: [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0],
                    rkey: 0xAA,
                },
                RegisteredController {
                    cntlid: 0xFFFF,
                    holds: false,
                    host_id: [9, 9, 9, 9, 9, 9, 9, 9, 0, 0, 0, 0, 0, 0, 0, 0],
                    rkey: 0xBB,
                },
            ],
        }
    }

    #[test]
    fn status_round_trips_in_both_layouts() {
        let s = status();
        for ext in [false, true] {
            let bytes = s.to_vec(ext).unwrap();
            assert_eq!(bytes.len(), if ext { 64 + 128 } else { 24 + 48 });
            assert_eq!(ReservationStatus::decode(&bytes, ext).unwrap(), s);
        }
        // Extended layout offsets as nvme-cli reads them.
        let b = s.to_vec(true).unwrap();
        assert_eq!(b[0], 7);
        assert_eq!(b[4], 1);
        assert_eq!(u16::from_le_bytes([b[5], b[6]]), 2);
        assert_eq!(b[9], 1);
        assert_eq!(u16::from_le_bytes([b[64], b[65]]), 0xFFFF);
        assert_eq!(b[66], 1);
        assert_eq!(b[72], 0xAA);
        assert_eq!(&b[80..88], &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn a_short_buffer_keeps_regctl_and_drops_entries() {
        let s = status();
        let mut out = vec![0xEE; 64 + 64 + 10];
        s.encode(true, &mut out).unwrap();
        let d = ReservationStatus::decode(&out, true).unwrap();
        assert_eq!(d.regctl, 2);
        assert_eq!(d.registrants, s.registrants[..1]);
        assert!(out[128..].iter().all(|&b| b == 0));
        // Shorter than a header: its first bytes only, no panic.
        let mut tiny = [0u8; 8];
        s.encode(true, &mut tiny).unwrap();
        assert_eq!(tiny[0], 7);
        assert!(ReservationStatus::decode(&tiny, true).is_err());
    }

    #[test]
    fn regctl_beyond_the_buffer_allocates_nothing_extra() {
        let mut b = vec![0u8; 64 + 64];
        b[5] = 0xFF;
        b[6] = 0xFF;
        let d = ReservationStatus::decode(&b, true).unwrap();
        assert_eq!(d.regctl, 0xFFFF);
        assert_eq!(d.registrants.len(), 1);
        // REGCTL smaller than the entries present: only REGCTL are read.
        let mut b = status().to_vec(true).unwrap();
        b[5] = 1;
        assert_eq!(
            ReservationStatus::decode(&b, true)
                .unwrap()
                .registrants
                .len(),
            1
        );
    }

    #[test]
    fn a_long_host_id_needs_the_extended_layout() {
        let mut s = status();
        s.registrants[0].host_id = [0xFF; 16];
        assert!(s.to_vec(false).is_err());
        assert!(s.to_vec(true).is_ok());
    }

    #[test]
    fn notification_round_trip() {
        let n = ReservationNotification {
            count: u64::MAX - 1,
            log_type: notification_type::RESERVATION_PREEMPTED,
            available: 3,
            nsid: 0x0102_0304,
        };
        let b = n.to_bytes();
        assert_eq!(b[8], 3);
        assert_eq!(ReservationNotification::from_bytes(&b).unwrap(), n);
        assert!(ReservationNotification::from_bytes(&b[..63]).is_err());
        assert!(ReservationNotification::default().is_empty());
    }

    proptest::proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), ext: bool) {
            if let Ok(d) = ReservationStatus::decode(&bytes, ext) {
                let (h, e) = ReservationStatus::layout(ext);
                proptest::prop_assert!(d.registrants.len() <= (bytes.len() - h) / e);
            }
            let _ = ReservationNotification::from_bytes(&bytes);
            let sqe = Sqe::new(opcode::REGISTER, 0);
            let _ = ReservationRegister::parse(&sqe, &bytes);
        }
    }
}
