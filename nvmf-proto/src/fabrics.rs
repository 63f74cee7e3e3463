//! NVMe over Fabrics commands (opcode 7Fh): Connect and its 1024-byte data,
//! Property Get/Set with the controller properties they reach, Disconnect.
//!
//! Fabrics SQE layout: opcode (0), reserved (1), CID (2..4), FCTYPE (4),
//! reserved (5..24), SGL1 (24..40), FCTYPE specific (40..64). In [`Sqe`]
//! terms FCTYPE is the low byte of `nsid` and bytes 40..64 are CDW10..15.

use crate::command::expect_opcode;
use crate::error::ProtoError;
use crate::sqe::{admin_opcode, SglDescriptor, Sqe};
use crate::wire::{get_nul_terminated, get_u16, put_nul_terminated, put_u16};

/// Fabrics command types (FCTYPE, SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    /// Disconnect (ends one I/O queue).
    pub const DISCONNECT: u8 = 0x08;
}

/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Size of an NQN field (the NQN itself is at most 223 bytes plus NUL).
pub const NQN_FIELD_LEN: usize = 256;
/// Controller ID meaning "any, dynamic controller model" in Connect data.
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;
/// Controller ID meaning "any, static controller model" in Connect data.
pub const CNTLID_STATIC_ANY: u16 = 0xFFFE;
/// NQN of discovery controllers.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Byte offsets in the Connect SQE, for Connect Invalid Parameters (IPO).
pub mod connect_sqe_offset {
    /// RECFMT.
    pub const RECFMT: u16 = 40;
    /// QID.
    pub const QID: u16 = 42;
    /// SQSIZE.
    pub const SQSIZE: u16 = 44;
    /// CATTR.
    pub const CATTR: u16 = 46;
    /// KATO.
    pub const KATO: u16 = 48;
}

/// Byte offsets in the Connect data, for Connect Invalid Parameters (IPO).
pub mod connect_data_offset {
    /// HOSTID.
    pub const HOSTID: u16 = 0;
    /// CNTLID.
    pub const CNTLID: u16 = 16;
    /// SUBNQN.
    pub const SUBNQN: u16 = 256;
    /// HOSTNQN.
    pub const HOSTNQN: u16 = 512;
}

/// Connect Attributes (CATTR, SQE byte 46) bits.
pub mod connect_attr {
    /// Bits 1:0: priority class of an I/O queue's commands, as QPRIO in
    /// Create I/O Submission Queue (see [`super::PriorityClass`]); used when
    /// weighted round robin with urgent priority class arbitration is on.
    pub const PRIORITY_CLASS_MASK: u8 = 0x3;
    /// Bit 2: the host asks to disable SQ flow control; a controller that
    /// agrees returns SQHD = FFFFh in the Connect response.
    pub const DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;
}

/// Submission queue priority class (CATTR bits 1:0, QPRIO encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PriorityClass {
    /// 00b Urgent: served before every other class.
    Urgent = 0,
    /// 01b High.
    High = 1,
    /// 10b Medium.
    Medium = 2,
    /// 11b Low.
    Low = 3,
}

impl PriorityClass {
    /// From the two low bits of `bits`.
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 0x3 {
            0 => Self::Urgent,
            1 => Self::High,
            2 => Self::Medium,
            _ => Self::Low,
        }
    }
}

/// Connect (FCTYPE 01h): creates the admin queue (QID 0) or an I/O queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Connect {
    /// Record format (bytes 40..42); 0 is the only one defined.
    pub recfmt: u16,
    /// Queue to create (bytes 42..44); 0 is the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based (bytes 44..46).
    pub sqsize: u16,
    /// Connect Attributes (byte 46), see [`connect_attr`].
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (bytes 48..52); admin queue only.
    pub kato_ms: u32,
    /// Where the 1024-byte [`ConnectData`] is (in-capsule in practice).
    pub sgl: SglDescriptor,
}

impl Connect {
    /// Connect for the admin queue with `queue_depth` entries (≥ 1) and a
    /// keep alive timeout; the Connect data goes in-capsule.
    pub fn admin(queue_depth: u16, kato_ms: u32) -> Self {
        Self {
            recfmt: 0,
            qid: 0,
            sqsize: queue_depth.saturating_sub(1),
            cattr: 0,
            kato_ms,
            sgl: SglDescriptor::in_capsule(0, CONNECT_DATA_LEN as u32),
        }
    }

    /// Connect for I/O queue `qid` with `queue_depth` entries and a priority
    /// class; the Connect data goes in-capsule.
    pub fn io(qid: u16, queue_depth: u16, class: PriorityClass) -> Self {
        Self {
            recfmt: 0,
            qid,
            sqsize: queue_depth.saturating_sub(1),
            cattr: class as u8,
            kato_ms: 0,
            sgl: SglDescriptor::in_capsule(0, CONNECT_DATA_LEN as u32),
        }
    }

    /// Priority class requested for an I/O queue.
    pub const fn priority_class(&self) -> PriorityClass {
        PriorityClass::from_bits(self.cattr)
    }

    /// Whether the host asks to disable SQ flow control.
    pub const fn sq_flow_control_disabled(&self) -> bool {
        self.cattr & connect_attr::DISABLE_SQ_FLOW_CONTROL != 0
    }

    /// Queue depth (SQSIZE + 1).
    pub const fn queue_depth(&self) -> u32 {
        self.sqsize as u32 + 1
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::CONNECT, cid);
        s.dptr = self.sgl;
        s.cdw10 = self.recfmt as u32 | (self.qid as u32) << 16;
        s.cdw11 = self.sqsize as u32 | (self.cattr as u32) << 16;
        s.cdw12 = self.kato_ms;
        s
    }

    /// Read from a Fabrics SQE with FCTYPE 01h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_fabrics(s, fctype::CONNECT, "Connect")?;
        Ok(Self {
            recfmt: s.cdw10 as u16,
            qid: (s.cdw10 >> 16) as u16,
            sqsize: s.cdw11 as u16,
            cattr: (s.cdw11 >> 16) as u8,
            kato_ms: s.cdw12,
            sgl: s.dptr,
        })
    }
}

/// The Connect command's 1024-byte data.
///
/// Layout: HOSTID (0..16), CNTLID (16..18), reserved (18..256), SUBNQN
/// (256..512), HOSTNQN (512..768), reserved (768..1024). NQNs are UTF-8 and
/// NUL-terminated within their 256-byte fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectData {
    /// Host identifier (a UUID).
    pub host_id: [u8; 16],
    /// Controller ID: [`CNTLID_DYNAMIC`] on the admin queue of a dynamic
    /// controller, the controller's ID on I/O queues.
    pub cntlid: u16,
    /// Subsystem NQN the host connects to.
    pub subnqn: String,
    /// Host NQN (the tenant identity for a Gimbal target).
    pub hostnqn: String,
}

impl ConnectData {
    /// Encode to 1024 bytes. Fails if an NQN does not fit 255 bytes plus NUL
    /// or contains a NUL.
    pub fn to_bytes(&self) -> Result<[u8; CONNECT_DATA_LEN], ProtoError> {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[..16].copy_from_slice(&self.host_id);
        put_u16(&mut b, 16, self.cntlid);
        put_nul_terminated(&mut b, 256, NQN_FIELD_LEN, &self.subnqn, "SUBNQN")?;
        put_nul_terminated(&mut b, 512, NQN_FIELD_LEN, &self.hostnqn, "HOSTNQN")?;
        Ok(b)
    }

    /// Decode from at least 1024 bytes. An NQN field without a terminating
    /// NUL, or not UTF-8, is an [`ProtoError::InvalidField`] whose offset is
    /// the field's (what Connect Invalid Parameters reports as IPO).
    pub fn from_bytes(b: &[u8]) -> Result<Self, ProtoError> {
        let b = crate::wire::fixed::<CONNECT_DATA_LEN>(b, "Connect data")?;
        Ok(Self {
            host_id: crate::wire::get_array(b, 0),
            cntlid: get_u16(b, 16),
            subnqn: get_nul_terminated(b, 256, NQN_FIELD_LEN, "Connect data", "SUBNQN")?,
            hostnqn: get_nul_terminated(b, 512, NQN_FIELD_LEN, "Connect data", "HOSTNQN")?,
        })
    }
}

/// Where a Connect Invalid Parameters error points (CQE DW0: IPO in bits
/// 15:0, IATTR bit 0 in bit 16: set when the offset is into the data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectInvalidParameter {
    /// Byte offset into the Connect SQE (see [`connect_sqe_offset`]).
    Command(u16),
    /// Byte offset into the Connect data (see [`connect_data_offset`]).
    Data(u16),
}

impl ConnectInvalidParameter {
    /// CQE DW0 for a Connect Invalid Parameters completion.
    pub const fn to_dw0(self) -> u32 {
        match self {
            Self::Command(o) => o as u32,
            Self::Data(o) => o as u32 | 1 << 16,
        }
    }

    /// Read from CQE DW0 of a Connect Invalid Parameters completion.
    pub const fn from_dw0(dw0: u32) -> Self {
        if dw0 & (1 << 16) != 0 {
            Self::Data(dw0 as u16)
        } else {
            Self::Command(dw0 as u16)
        }
    }
}

/// CQE DW0 of a successful Connect: CNTLID in bits 15:0, AUTHREQ in 31:16
/// (see [`AuthReq`]; pass `AuthReq::ATR.0` to require authentication).
pub const fn connect_success_dw0(cntlid: u16, authreq: u16) -> u32 {
    cntlid as u32 | (authreq as u32) << 16
}

/// The Connect response's AUTHREQ field (CQE DW0 bits 31:16 of a
/// successful Connect), which tells the host to authenticate the queue
/// before anything else (NVMe over Fabrics, "Connect Response").
///
/// Linux nvmet sets ATR on the admin queue and on every I/O queue of a
/// host that has a DH-HMAC-CHAP key; the Linux host then runs a
/// transaction on that queue (and refuses ASCR unless it was configured
/// for TLS concatenation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AuthReq(pub u16);

impl AuthReq {
    /// No authentication required.
    pub const NONE: Self = Self(0);
    /// Bit 1, ATR: authentication transaction required (DW0 bit 17,
    /// Linux's `NVME_CONNECT_AUTHREQ_ATR`).
    pub const ATR: Self = Self(1 << 1);
    /// Bit 2, ASCR: authentication with secure channel concatenation
    /// required (DW0 bit 18, `NVME_CONNECT_AUTHREQ_ASCR`).
    pub const ASCR: Self = Self(1 << 2);

    /// Whether an authentication transaction is required.
    pub const fn transaction_required(self) -> bool {
        self.0 & Self::ATR.0 != 0
    }

    /// Whether a secure channel (TLS concatenation) is required.
    pub const fn secure_channel_required(self) -> bool {
        self.0 & Self::ASCR.0 != 0
    }

    /// Read from the DW0 of a successful Connect's CQE.
    pub const fn from_connect_dw0(dw0: u32) -> Self {
        Self((dw0 >> 16) as u16)
    }
}

/// CNTLID of a successful Connect (CQE DW0 bits 15:0).
pub const fn connect_cntlid(dw0: u32) -> u16 {
    dw0 as u16
}

/// Security protocol (SECP) of NVMe in-band authentication: DH-HMAC-CHAP
/// messages, AUTH_Negotiate and the Failure messages all travel under E9h.
pub const AUTH_SECP_DHCHAP: u8 = 0xE9;
/// SPSP0 used with [`AUTH_SECP_DHCHAP`] (Linux sends 01h and nvmet
/// requires it).
pub const AUTH_SPSP0_DHCHAP: u8 = 0x01;
/// SPSP1 used with [`AUTH_SECP_DHCHAP`] (Linux sends 01h and nvmet
/// requires it).
pub const AUTH_SPSP1_DHCHAP: u8 = 0x01;

/// Byte offsets in the Authentication Send/Receive SQE, for error
/// locations.
pub mod auth_sqe_offset {
    /// SPSP0.
    pub const SPSP0: usize = 41;
    /// SPSP1.
    pub const SPSP1: usize = 42;
    /// SECP.
    pub const SECP: usize = 43;
    /// TL (Send) or AL (Receive).
    pub const LENGTH: usize = 44;
}

/// The fields shared by Authentication Send and Receive: CDW10 holds
/// reserved (byte 40), SPSP0 (41), SPSP1 (42), SECP (43); CDW11 holds TL or
/// AL (44..48).
fn auth_cdw10(secp: u8, spsp0: u8, spsp1: u8) -> u32 {
    (spsp0 as u32) << 8 | (spsp1 as u32) << 16 | (secp as u32) << 24
}

/// Check SECP/SPSP0/SPSP1 are DH-HMAC-CHAP's and the length is 1 ..=
/// `max` bytes, naming the offending field the way Linux nvmet reports it
/// (Invalid Field in Command, with this offset as the error location).
fn check_dhchap_fields(
    structure: &'static str,
    secp: u8,
    spsp0: u8,
    spsp1: u8,
    len: u32,
    len_field: &'static str,
    max: u32,
) -> Result<(), ProtoError> {
    let bad = |field, offset, reason| ProtoError::InvalidField {
        structure,
        field,
        offset,
        reason,
    };
    if secp != AUTH_SECP_DHCHAP {
        return Err(bad("SECP", auth_sqe_offset::SECP, "not DH-HMAC-CHAP (E9h)"));
    }
    if spsp0 != AUTH_SPSP0_DHCHAP {
        return Err(bad("SPSP0", auth_sqe_offset::SPSP0, "must be 01h"));
    }
    if spsp1 != AUTH_SPSP1_DHCHAP {
        return Err(bad("SPSP1", auth_sqe_offset::SPSP1, "must be 01h"));
    }
    if len == 0 {
        return Err(bad(len_field, auth_sqe_offset::LENGTH, "zero length"));
    }
    if len > max {
        return Err(bad(
            len_field,
            auth_sqe_offset::LENGTH,
            "longer than any authentication message",
        ));
    }
    Ok(())
}

/// Authentication Send (FCTYPE 05h): carries one message from host to
/// controller in its data (in-capsule in practice: at most a few hundred
/// bytes, well within NVMe/TCP's in-capsule data size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthenticationSend {
    /// Security protocol (byte 43): [`AUTH_SECP_DHCHAP`].
    pub secp: u8,
    /// SPSP0 (byte 41).
    pub spsp0: u8,
    /// SPSP1 (byte 42).
    pub spsp1: u8,
    /// Transfer length (bytes 44..48): the message's length.
    pub tl: u32,
    /// Where the message is.
    pub sgl: SglDescriptor,
}

impl AuthenticationSend {
    /// A DH-HMAC-CHAP Send of a `tl`-byte message, in-capsule (as Linux
    /// sends it).
    pub const fn dhchap(tl: u32) -> Self {
        Self {
            secp: AUTH_SECP_DHCHAP,
            spsp0: AUTH_SPSP0_DHCHAP,
            spsp1: AUTH_SPSP1_DHCHAP,
            tl,
            sgl: SglDescriptor::in_capsule(0, tl),
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::AUTHENTICATION_SEND, cid);
        s.dptr = self.sgl;
        s.cdw10 = auth_cdw10(self.secp, self.spsp0, self.spsp1);
        s.cdw11 = self.tl;
        s
    }

    /// Read from a Fabrics SQE with FCTYPE 05h. Field values are checked by
    /// [`Self::check_dhchap`].
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_fabrics(s, fctype::AUTHENTICATION_SEND, "Authentication Send")?;
        Ok(Self {
            secp: (s.cdw10 >> 24) as u8,
            spsp0: (s.cdw10 >> 8) as u8,
            spsp1: (s.cdw10 >> 16) as u8,
            tl: s.cdw11,
            sgl: s.dptr,
        })
    }

    /// What a controller checks before receiving the data: DH-HMAC-CHAP's
    /// SECP/SPSP0/SPSP1, and 0 < TL ≤ [`crate::auth::MAX_MESSAGE_LEN`] —
    /// the budget that bounds what the controller buffers.
    pub fn check_dhchap(&self) -> Result<(), ProtoError> {
        check_dhchap_fields(
            "Authentication Send",
            self.secp,
            self.spsp0,
            self.spsp1,
            self.tl,
            "TL",
            crate::auth::MAX_MESSAGE_LEN,
        )
    }
}

/// Authentication Receive (FCTYPE 06h): the controller returns one
/// message in the command's data (C2HData over NVMe/TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthenticationReceive {
    /// Security protocol (byte 43): [`AUTH_SECP_DHCHAP`].
    pub secp: u8,
    /// SPSP0 (byte 41).
    pub spsp0: u8,
    /// SPSP1 (byte 42).
    pub spsp1: u8,
    /// Allocation length (bytes 44..48): the host's buffer size; Linux
    /// uses 4096 ([`crate::auth::HOST_RECEIVE_AL`]).
    pub al: u32,
    /// Where the data goes.
    pub sgl: SglDescriptor,
}

impl AuthenticationReceive {
    /// A DH-HMAC-CHAP Receive of up to `al` bytes, returned in C2HData.
    pub const fn dhchap(al: u32) -> Self {
        Self {
            secp: AUTH_SECP_DHCHAP,
            spsp0: AUTH_SPSP0_DHCHAP,
            spsp1: AUTH_SPSP1_DHCHAP,
            al,
            sgl: SglDescriptor::transport(al),
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::AUTHENTICATION_RECEIVE, cid);
        s.dptr = self.sgl;
        s.cdw10 = auth_cdw10(self.secp, self.spsp0, self.spsp1);
        s.cdw11 = self.al;
        s
    }

    /// Read from a Fabrics SQE with FCTYPE 06h. Field values are checked by
    /// [`Self::check_dhchap`].
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_fabrics(s, fctype::AUTHENTICATION_RECEIVE, "Authentication Receive")?;
        Ok(Self {
            secp: (s.cdw10 >> 24) as u8,
            spsp0: (s.cdw10 >> 8) as u8,
            spsp1: (s.cdw10 >> 16) as u8,
            al: s.cdw11,
            sgl: s.dptr,
        })
    }

    /// What a controller checks: DH-HMAC-CHAP's SECP/SPSP0/SPSP1 and a
    /// nonzero AL. A large AL is fine: the controller returns at most
    /// [`crate::auth::MAX_MESSAGE_LEN`] bytes whatever AL says.
    pub fn check_dhchap(&self) -> Result<(), ProtoError> {
        check_dhchap_fields(
            "Authentication Receive",
            self.secp,
            self.spsp0,
            self.spsp1,
            self.al,
            "AL",
            u32::MAX,
        )
    }
}

/// Controller property offsets reachable with Property Get/Set.
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1C;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = 0x20;
}

/// Size of a property access (ATTRIB bits 2:0, byte 40).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropertySize {
    /// 000b: 4 bytes.
    Four,
    /// 001b: 8 bytes.
    Eight,
}

impl PropertySize {
    fn from_attrib(attrib: u8, structure: &'static str) -> Result<Self, ProtoError> {
        match attrib & 0x7 {
            0 => Ok(Self::Four),
            1 => Ok(Self::Eight),
            _ => Err(ProtoError::InvalidField {
                structure,
                field: "ATTRIB",
                offset: 40,
                reason: "property size must be 4 (000b) or 8 (001b) bytes",
            }),
        }
    }

    const fn attrib(self) -> u32 {
        match self {
            Self::Four => 0,
            Self::Eight => 1,
        }
    }

    /// The size properties at `offset` have (CAP is 8 bytes, the rest 4).
    pub const fn of_property(offset: u32) -> Self {
        if offset == property::CAP {
            Self::Eight
        } else {
            Self::Four
        }
    }
}

/// Property Get (FCTYPE 04h); the value comes back in CQE DW0 (and DW1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PropertyGet {
    /// Access size.
    pub size: PropertySize,
    /// Property offset (bytes 44..48), see [`property`].
    pub offset: u32,
}

impl PropertyGet {
    /// Read the property at `offset` with its natural size.
    pub const fn new(offset: u32) -> Self {
        Self {
            size: PropertySize::of_property(offset),
            offset,
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::PROPERTY_GET, cid);
        s.cdw10 = self.size.attrib();
        s.cdw11 = self.offset;
        s
    }

    /// Read from a Fabrics SQE with FCTYPE 04h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_fabrics(s, fctype::PROPERTY_GET, "Property Get")?;
        Ok(Self {
            size: PropertySize::from_attrib(s.cdw10 as u8, "Property Get")?,
            offset: s.cdw11,
        })
    }
}

/// Property Set (FCTYPE 00h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PropertySet {
    /// Access size.
    pub size: PropertySize,
    /// Property offset (bytes 44..48), see [`property`].
    pub offset: u32,
    /// Value (bytes 48..56; only the low 4 bytes for 4-byte properties).
    pub value: u64,
}

impl PropertySet {
    /// Write `value` to the property at `offset` with its natural size.
    pub const fn new(offset: u32, value: u64) -> Self {
        Self {
            size: PropertySize::of_property(offset),
            offset,
            value,
        }
    }

    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::PROPERTY_SET, cid);
        s.cdw10 = self.size.attrib();
        s.cdw11 = self.offset;
        s.cdw12 = self.value as u32;
        s.cdw13 = (self.value >> 32) as u32;
        s
    }

    /// Read from a Fabrics SQE with FCTYPE 00h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_fabrics(s, fctype::PROPERTY_SET, "Property Set")?;
        Ok(Self {
            size: PropertySize::from_attrib(s.cdw10 as u8, "Property Set")?,
            offset: s.cdw11,
            value: s.cdw12 as u64 | (s.cdw13 as u64) << 32,
        })
    }
}

/// Disconnect (FCTYPE 08h): deletes the I/O queue it is sent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Disconnect {
    /// Record format (bytes 40..42); 0.
    pub recfmt: u16,
}

impl Disconnect {
    /// The SQE.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = Sqe::fabrics(fctype::DISCONNECT, cid);
        s.cdw10 = self.recfmt as u32;
        s
    }

    /// Read from a Fabrics SQE with FCTYPE 08h.
    pub fn from_sqe(s: &Sqe) -> Result<Self, ProtoError> {
        expect_fabrics(s, fctype::DISCONNECT, "Disconnect")?;
        Ok(Self {
            recfmt: s.cdw10 as u16,
        })
    }
}

/// A Fabrics command, by FCTYPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FabricsCommand {
    /// Connect.
    Connect(Connect),
    /// Property Get.
    PropertyGet(PropertyGet),
    /// Property Set.
    PropertySet(PropertySet),
    /// Disconnect.
    Disconnect(Disconnect),
    /// Any other FCTYPE, left to the caller. Authentication Send (05h) and
    /// Receive (06h) arrive here too, so that existing matches on this
    /// enum keep compiling; read them with [`AuthenticationSend::from_sqe`]
    /// and [`AuthenticationReceive::from_sqe`].
    Other(Sqe),
}

impl FabricsCommand {
    /// Dispatch a Fabrics SQE on FCTYPE.
    pub fn parse(s: &Sqe) -> Result<Self, ProtoError> {
        expect_opcode(s, admin_opcode::FABRICS, "Fabrics command")?;
        Ok(match s.fctype() {
            fctype::CONNECT => Self::Connect(Connect::from_sqe(s)?),
            fctype::PROPERTY_GET => Self::PropertyGet(PropertyGet::from_sqe(s)?),
            fctype::PROPERTY_SET => Self::PropertySet(PropertySet::from_sqe(s)?),
            fctype::DISCONNECT => Self::Disconnect(Disconnect::from_sqe(s)?),
            _ => Self::Other(*s),
        })
    }

    /// The SQE with `cid`.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            Self::Connect(c) => c.to_sqe(cid),
            Self::PropertyGet(c) => c.to_sqe(cid),
            Self::PropertySet(c) => c.to_sqe(cid),
            Self::Disconnect(c) => c.to_sqe(cid),
            Self::Other(s) => Sqe { cid, ..*s },
        }
    }
}

fn expect_fabrics(s: &Sqe, fctype: u8, structure: &'static str) -> Result<(), ProtoError> {
    expect_opcode(s, admin_opcode::FABRICS, structure)?;
    if s.fctype() != fctype {
        return Err(ProtoError::InvalidField {
            structure,
            field: "FCTYPE",
            offset: 4,
            reason: "SQE has a different Fabrics command type",
        });
    }
    Ok(())
}

/// CAP.AMS / CC.AMS values.
pub mod arbitration_mechanism {
    /// CC.AMS 000b: round robin (always supported).
    pub const ROUND_ROBIN: u8 = 0b000;
    /// CC.AMS 001b: weighted round robin with urgent priority class. In
    /// CAP.AMS this is bit 0 of the field (CAP bit 17).
    pub const WEIGHTED_ROUND_ROBIN_URGENT: u8 = 0b001;
    /// CC.AMS 111b: vendor specific. In CAP.AMS this is bit 1 (CAP bit 18).
    pub const VENDOR_SPECIFIC: u8 = 0b111;
    /// CAP.AMS bit for weighted round robin with urgent priority class.
    pub const CAP_WRR_URGENT: u8 = 1 << 0;
    /// CAP.AMS bit for a vendor specific mechanism.
    pub const CAP_VENDOR_SPECIFIC: u8 = 1 << 1;
}

/// Controller Capabilities (CAP, property 00h, 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities {
    /// Maximum Queue Entries Supported, 0's based (bits 15:0).
    pub mqes: u16,
    /// Contiguous Queues Required (bit 16).
    pub cqr: bool,
    /// Arbitration Mechanism Supported (bits 18:17), see
    /// [`arbitration_mechanism`].
    pub ams: u8,
    /// Timeout for CSTS.RDY changes, in 500 ms units (bits 31:24).
    pub timeout_500ms: u8,
    /// Doorbell stride (bits 35:32).
    pub dstrd: u8,
    /// NVM Subsystem Reset Supported (bit 36).
    pub nssrs: bool,
    /// Command Sets Supported (bits 44:37); bit 0 is the NVM command set.
    pub css: u8,
    /// Boot Partition Support (bit 45).
    pub bps: bool,
    /// Memory Page Size Minimum, 2^(12+n) bytes (bits 51:48).
    pub mpsmin: u8,
    /// Memory Page Size Maximum, 2^(12+n) bytes (bits 55:52).
    pub mpsmax: u8,
}

impl Capabilities {
    /// The 64-bit property value.
    pub const fn to_u64(&self) -> u64 {
        self.mqes as u64
            | (self.cqr as u64) << 16
            | ((self.ams & 0x3) as u64) << 17
            | (self.timeout_500ms as u64) << 24
            | ((self.dstrd & 0xF) as u64) << 32
            | (self.nssrs as u64) << 36
            | (self.css as u64) << 37
            | (self.bps as u64) << 45
            | ((self.mpsmin & 0xF) as u64) << 48
            | ((self.mpsmax & 0xF) as u64) << 52
    }

    /// From the 64-bit property value.
    pub const fn from_u64(v: u64) -> Self {
        Self {
            mqes: v as u16,
            cqr: v & (1 << 16) != 0,
            ams: ((v >> 17) & 0x3) as u8,
            timeout_500ms: (v >> 24) as u8,
            dstrd: ((v >> 32) & 0xF) as u8,
            nssrs: v & (1 << 36) != 0,
            css: (v >> 37) as u8,
            bps: v & (1 << 45) != 0,
            mpsmin: ((v >> 48) & 0xF) as u8,
            mpsmax: ((v >> 52) & 0xF) as u8,
        }
    }
}

/// Version (VS, property 08h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Version {
    /// Major version (bits 31:16).
    pub major: u16,
    /// Minor version (bits 15:8).
    pub minor: u8,
    /// Tertiary version (bits 7:0).
    pub tertiary: u8,
}

impl Version {
    /// NVMe 1.3.0, what Linux nvmet reports.
    pub const V1_3: Self = Self::new(1, 3, 0);
    /// NVMe 1.4.0.
    pub const V1_4: Self = Self::new(1, 4, 0);
    /// NVMe 2.0.0.
    pub const V2_0: Self = Self::new(2, 0, 0);

    /// A version.
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Self {
        Self {
            major,
            minor,
            tertiary,
        }
    }

    /// The property value.
    pub const fn to_u32(&self) -> u32 {
        (self.major as u32) << 16 | (self.minor as u32) << 8 | self.tertiary as u32
    }

    /// From the property value.
    pub const fn from_u32(v: u32) -> Self {
        Self::new((v >> 16) as u16, (v >> 8) as u8, v as u8)
    }
}

/// Controller Configuration (CC, property 14h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ControllerConfiguration {
    /// Enable (bit 0).
    pub enable: bool,
    /// I/O Command Set Selected (bits 6:4).
    pub css: u8,
    /// Memory Page Size, 2^(12+n) bytes (bits 10:7).
    pub mps: u8,
    /// Arbitration Mechanism Selected (bits 13:11), see
    /// [`arbitration_mechanism`].
    pub ams: u8,
    /// Shutdown Notification (bits 15:14): 01b normal, 10b abrupt.
    pub shn: u8,
    /// I/O Submission Queue Entry Size, 2^n bytes (bits 19:16).
    pub iosqes: u8,
    /// I/O Completion Queue Entry Size, 2^n bytes (bits 23:20).
    pub iocqes: u8,
}

impl ControllerConfiguration {
    /// The property value.
    pub const fn to_u32(&self) -> u32 {
        self.enable as u32
            | ((self.css & 0x7) as u32) << 4
            | ((self.mps & 0xF) as u32) << 7
            | ((self.ams & 0x7) as u32) << 11
            | ((self.shn & 0x3) as u32) << 14
            | ((self.iosqes & 0xF) as u32) << 16
            | ((self.iocqes & 0xF) as u32) << 20
    }

    /// From the property value.
    pub const fn from_u32(v: u32) -> Self {
        Self {
            enable: v & 1 != 0,
            css: ((v >> 4) & 0x7) as u8,
            mps: ((v >> 7) & 0xF) as u8,
            ams: ((v >> 11) & 0x7) as u8,
            shn: ((v >> 14) & 0x3) as u8,
            iosqes: ((v >> 16) & 0xF) as u8,
            iocqes: ((v >> 20) & 0xF) as u8,
        }
    }
}

/// Controller Status (CSTS, property 1Ch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ControllerStatus {
    /// Ready (bit 0).
    pub ready: bool,
    /// Controller Fatal Status (bit 1).
    pub fatal: bool,
    /// Shutdown Status (bits 3:2): 00b normal, 01b in progress, 10b complete.
    pub shst: u8,
    /// NVM Subsystem Reset Occurred (bit 4).
    pub nssro: bool,
    /// Processing Paused (bit 5).
    pub pp: bool,
}

impl ControllerStatus {
    /// The property value.
    pub const fn to_u32(&self) -> u32 {
        self.ready as u32
            | (self.fatal as u32) << 1
            | ((self.shst & 0x3) as u32) << 2
            | (self.nssro as u32) << 4
            | (self.pp as u32) << 5
    }

    /// From the property value.
    pub const fn from_u32(v: u32) -> Self {
        Self {
            ready: v & 1 != 0,
            fatal: v & 2 != 0,
            shst: ((v >> 2) & 0x3) as u8,
            nssro: v & (1 << 4) != 0,
            pp: v & (1 << 5) != 0,
        }
    }
}
