//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0) and their encoding.
//!
//! Every PDU starts with an 8-byte common header: PDU-Type (byte 0), FLAGS
//! (1), HLEN (2), PDO (3), PLEN (4..8, little endian). Then comes the rest of
//! the PDU header (HLEN bytes in all), an optional 4-byte header digest, zero
//! padding up to PDO, the PDU data, and an optional 4-byte data digest.
//!
//! ```text
//! | CH (8) | PSH (HLEN-8) | HDGST (0/4) | PAD | DATA | DDGST (0/4) |
//! 0                       HLEN                PDO                 PLEN
//! ```
//!
//! Digests are CRC32C (Castagnoli), stored little endian; the header digest
//! covers the HLEN header bytes, the data digest covers the data only (not
//! the padding). ICReq, ICResp and both TermReq PDUs never carry digests or
//! padding, even after digests were negotiated.
//!
//! **How data is carried.** A PDU's data is a `Cow<[u8]>`: the decoder hands
//! out slices borrowed from the caller's receive buffer (no copy of large
//! data; copy it where it is going, e.g. straight into the I/O buffer), and
//! builders take owned vectors. [`Pdu::into_owned`] detaches a decoded PDU
//! from the buffer. For sending without copying the data, [`Pdu::encode_head`]
//! writes everything before the data and returns the data digest to send
//! after it, so a writev can take the data from where it already is.

use std::borrow::Cow;

use crate::cqe::{Cqe, CQE_LEN};
use crate::error::{ProtoError, Termination};
use crate::sqe::{Sqe, SQE_LEN};
use crate::wire::{put_u16, put_u32};

/// PDU-Type values (byte 0 of the common header).
pub mod pdu_type {
    /// Initialize Connection Request (host to controller).
    pub const IC_REQ: u8 = 0x00;
    /// Initialize Connection Response (controller to host).
    pub const IC_RESP: u8 = 0x01;
    /// Host to Controller Terminate Connection Request.
    pub const H2C_TERM_REQ: u8 = 0x02;
    /// Controller to Host Terminate Connection Request.
    pub const C2H_TERM_REQ: u8 = 0x03;
    /// Command Capsule (host to controller).
    pub const CAPSULE_CMD: u8 = 0x04;
    /// Response Capsule (controller to host).
    pub const CAPSULE_RESP: u8 = 0x05;
    /// Host to Controller Data.
    pub const H2C_DATA: u8 = 0x06;
    /// Controller to Host Data.
    pub const C2H_DATA: u8 = 0x07;
    /// Ready to Transfer (controller to host).
    pub const R2T: u8 = 0x09;
}

/// FLAGS bits (byte 1 of the common header).
pub mod pdu_flags {
    /// HDGSTF: a header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU (H2CData, C2HData): last data PDU of this transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// SUCCESS (C2HData only): the command completed successfully and no
    /// CapsuleResp will follow. Only valid together with LAST_PDU.
    pub const SUCCESS: u8 = 1 << 3;
}

/// Length of the common header.
pub const COMMON_HEADER_LEN: usize = 8;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// HLEN (and PLEN) of ICReq and ICResp.
pub const IC_PDU_LEN: usize = 128;
/// HLEN of H2CTermReq and C2HTermReq.
pub const TERM_REQ_HLEN: usize = 24;
/// Most bytes of the offending PDU header a TermReq may carry.
pub const TERM_REQ_MAX_DATA_LEN: usize = 128;
/// Largest valid TermReq PLEN.
pub const TERM_REQ_MAX_PLEN: usize = TERM_REQ_HLEN + TERM_REQ_MAX_DATA_LEN;
/// HLEN of CapsuleCmd: common header plus the 64-byte SQE.
pub const CAPSULE_CMD_HLEN: usize = COMMON_HEADER_LEN + SQE_LEN;
/// HLEN of CapsuleResp: common header plus the 16-byte CQE.
pub const CAPSULE_RESP_HLEN: usize = COMMON_HEADER_LEN + CQE_LEN;
/// HLEN of H2CData and C2HData.
pub const DATA_PDU_HLEN: usize = 24;
/// HLEN of R2T.
pub const R2T_HLEN: usize = 24;
/// PDU Format Version 1.0, the only one defined (ICReq/ICResp PFV).
pub const PFV_1_0: u16 = 0;
/// Largest HPDA/CPDA value (0's based dwords: 128-byte alignment).
pub const MAX_PDA: u8 = 31;
/// Smallest MAXH2CDATA a controller may advertise.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// ICReq/ICResp digest byte: header digest enabled/requested.
pub const IC_DIGEST_HEADER: u8 = 1 << 0;
/// ICReq/ICResp digest byte: data digest enabled/requested.
pub const IC_DIGEST_DATA: u8 = 1 << 1;

/// Byte alignment a PDA value (HPDA or CPDA, 0's based dwords) asks for.
pub const fn pda_alignment(pda: u8) -> usize {
    (pda as usize + 1) * 4
}

/// CRC32C as NVMe/TCP uses it for header and data digests.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of data that arrives in pieces: start from 0, pass each piece in
/// order; the result equals [`crc32c`] of the whole.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// Which end of the connection a piece of code plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The host (initiator): receives ICResp, C2HTermReq, CapsuleResp,
    /// C2HData and R2T.
    Host,
    /// The controller (target): receives ICReq, H2CTermReq, CapsuleCmd and
    /// H2CData.
    Controller,
}

impl Role {
    /// Whether a PDU of `pdu_type` may be sent to this role. The direction is
    /// the type's low bit: even types travel host to controller.
    pub const fn receives(&self, pdu_type: u8) -> bool {
        match self {
            Role::Controller => pdu_type & 1 == 0,
            Role::Host => pdu_type & 1 == 1,
        }
    }
}

/// The 8-byte common header as it is on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommonHeader {
    /// PDU-Type.
    pub pdu_type: u8,
    /// FLAGS.
    pub flags: u8,
    /// Header length (without the header digest).
    pub hlen: u8,
    /// PDU data offset (0 when the PDU has no data).
    pub pdo: u8,
    /// Total PDU length.
    pub plen: u32,
}

impl CommonHeader {
    /// Parse the first 8 bytes of `b`, if there are that many.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let b: &[u8; COMMON_HEADER_LEN] = b.get(..COMMON_HEADER_LEN)?.try_into().ok()?;
        Some(Self {
            pdu_type: b[0],
            flags: b[1],
            hlen: b[2],
            pdo: b[3],
            plen: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
    }

    /// The 8 wire bytes.
    pub fn to_bytes(&self) -> [u8; COMMON_HEADER_LEN] {
        let p = self.plen.to_le_bytes();
        [
            self.pdu_type,
            self.flags,
            self.hlen,
            self.pdo,
            p[0],
            p[1],
            p[2],
            p[3],
        ]
    }
}

/// ICReq: the first PDU a host sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IcReq {
    /// HPDA: data alignment the host wants in C2H PDUs (0's based dwords, ≤ 31).
    pub hpda: u8,
    /// The host asks for header digests.
    pub header_digest: bool,
    /// The host asks for data digests.
    pub data_digest: bool,
    /// MAXR2T: outstanding R2Ts per command the host accepts (0's based).
    pub maxr2t: u32,
}

/// ICResp: the controller's answer to ICReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcResp {
    /// CPDA: data alignment the controller wants in H2C PDUs (0's based dwords).
    pub cpda: u8,
    /// Header digests are enabled on this connection.
    pub header_digest: bool,
    /// Data digests are enabled on this connection.
    pub data_digest: bool,
    /// MAXH2CDATA: most data bytes per H2CData PDU (≥ 4096, dword multiple).
    pub maxh2cdata: u32,
}

/// H2CTermReq / C2HTermReq: the sender closes the connection after this.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TermReq<'a> {
    /// Fatal Error Status.
    pub fes: crate::error::FatalErrorStatus,
    /// Fatal Error Information.
    pub fei: u32,
    /// Up to 128 bytes of the PDU header that caused the error.
    pub data: Cow<'a, [u8]>,
}

/// CapsuleCmd: an SQE plus optional in-capsule data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CapsuleCmd<'a> {
    /// The command.
    pub sqe: Sqe,
    /// In-capsule data (empty if none).
    pub data: Cow<'a, [u8]>,
}

/// CapsuleResp: a CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CapsuleResp {
    /// The completion.
    pub cqe: Cqe,
}

/// H2CData: write data the controller solicited with an R2T.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct H2CData<'a> {
    /// CCCID: the command's CID.
    pub cccid: u16,
    /// TTAG from the R2T being answered.
    pub ttag: u16,
    /// DATAO: offset of this data within the command's data buffer.
    pub datao: u32,
    /// LAST_PDU flag: last H2CData for this R2T.
    pub last: bool,
    /// The data; DATAL is its length.
    pub data: Cow<'a, [u8]>,
}

/// C2HData: read data from the controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct C2HData<'a> {
    /// CCCID: the command's CID.
    pub cccid: u16,
    /// DATAO: offset of this data within the command's data buffer.
    pub datao: u32,
    /// LAST_PDU flag: last C2HData for this command.
    pub last: bool,
    /// SUCCESS flag: the command succeeded and no CapsuleResp follows.
    /// Requires `last`.
    pub success: bool,
    /// The data; DATAL is its length.
    pub data: Cow<'a, [u8]>,
}

/// R2T: the controller asks for write data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct R2T {
    /// CCCID: the command's CID.
    pub cccid: u16,
    /// TTAG: tag the host echoes in the H2CData PDUs answering this R2T.
    pub ttag: u16,
    /// R2TO: offset of the requested data within the command's buffer.
    pub r2to: u32,
    /// R2TL: number of bytes requested (non-zero).
    pub r2tl: u32,
}

/// Any NVMe/TCP PDU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pdu<'a> {
    /// Initialize Connection Request.
    IcReq(IcReq),
    /// Initialize Connection Response.
    IcResp(IcResp),
    /// Host to Controller Terminate Connection Request.
    H2CTermReq(TermReq<'a>),
    /// Controller to Host Terminate Connection Request.
    C2HTermReq(TermReq<'a>),
    /// Command Capsule.
    CapsuleCmd(CapsuleCmd<'a>),
    /// Response Capsule.
    CapsuleResp(CapsuleResp),
    /// Host to Controller Data.
    H2CData(H2CData<'a>),
    /// Controller to Host Data.
    C2HData(C2HData<'a>),
    /// Ready to Transfer.
    R2T(R2T),
}

/// Settings for encoding PDUs on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EncodeConfig {
    /// Add header digests (to every PDU type except IC and TermReq).
    pub header_digest: bool,
    /// Add data digests (to PDUs that carry data).
    pub data_digest: bool,
    /// The PDA the *peer* asked for: the controller's CPDA when encoding as
    /// host, the host's HPDA when encoding as controller. Data is padded to
    /// start at a multiple of `(tx_pda + 1) * 4` bytes.
    pub tx_pda: u8,
}

impl<'a> TermReq<'a> {
    /// A TermReq reporting `termination`, carrying the start of the offending
    /// PDU (`offending` is the receive buffer at that PDU): as much of its
    /// header as is available, at most 128 bytes.
    pub fn for_error(termination: Termination, offending: &[u8]) -> TermReq<'static> {
        let header_len = match CommonHeader::parse(offending) {
            Some(ch)
                if (COMMON_HEADER_LEN..=TERM_REQ_MAX_DATA_LEN).contains(&(ch.hlen as usize)) =>
            {
                ch.hlen as usize
            }
            _ => COMMON_HEADER_LEN,
        };
        let n = header_len.min(offending.len());
        TermReq {
            fes: termination.fes,
            fei: termination.fei,
            data: Cow::Owned(offending[..n].to_vec()),
        }
    }

    /// Detach from the receive buffer.
    pub fn into_owned(self) -> TermReq<'static> {
        TermReq {
            fes: self.fes,
            fei: self.fei,
            data: Cow::Owned(self.data.into_owned()),
        }
    }
}

impl<'a> CapsuleCmd<'a> {
    /// A capsule with no in-capsule data.
    pub fn new(sqe: Sqe) -> CapsuleCmd<'static> {
        CapsuleCmd {
            sqe,
            data: Cow::Borrowed(&[]),
        }
    }

    /// A capsule carrying `data` in-capsule; sets the SQE's data pointer to
    /// an in-capsule SGL (offset 0, the data's length).
    pub fn with_data(mut sqe: Sqe, data: impl Into<Cow<'a, [u8]>>) -> Result<Self, ProtoError> {
        let data = data.into();
        let len = u32::try_from(data.len()).map_err(|_| ProtoError::Unencodable {
            what: "CapsuleCmd",
            reason: "in-capsule data longer than 4 GiB",
        })?;
        sqe.dptr = crate::sqe::SglDescriptor::in_capsule(0, len);
        Ok(CapsuleCmd { sqe, data })
    }
}

impl CapsuleCmd<'_> {
    /// The command's data inside this capsule, as its SGL describes it.
    ///
    /// `Ok(None)` when the SGL is not in-capsule (data comes by R2T/H2CData,
    /// or there is none). Otherwise the slice, or the NVMe status a target
    /// answers with: SGL Offset Invalid or Data SGL Length Invalid when the
    /// descriptor points outside the in-capsule data, SGL Descriptor Type
    /// Invalid for descriptors NVMe/TCP does not use, Invalid Field when the
    /// SQE does not select SGLs at all.
    pub fn in_capsule_data(&self) -> Result<Option<&[u8]>, crate::status::Status> {
        use crate::sqe::SglKind;
        use crate::status::Status;
        if self.sqe.psdt() == 0 {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        match self.sqe.dptr.kind() {
            SglKind::Transport { .. } if self.data.is_empty() => Ok(None),
            // Data in the capsule that the SGL does not point at.
            SglKind::Transport { .. } => Err(Status::INVALID_FIELD.with_dnr()),
            SglKind::InCapsule { offset, length } => {
                let start = usize::try_from(offset)
                    .ok()
                    .filter(|&s| s <= self.data.len())
                    .ok_or(Status::SGL_OFFSET_INVALID.with_dnr())?;
                let end = start
                    .checked_add(length as usize)
                    .filter(|&e| e <= self.data.len())
                    .ok_or(Status::DATA_SGL_LENGTH_INVALID.with_dnr())?;
                Ok(Some(&self.data[start..end]))
            }
            SglKind::Unsupported { .. } => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
        }
    }
}

impl<'a> Pdu<'a> {
    /// The PDU-Type byte.
    pub fn pdu_type(&self) -> u8 {
        match self {
            Pdu::IcReq(_) => pdu_type::IC_REQ,
            Pdu::IcResp(_) => pdu_type::IC_RESP,
            Pdu::H2CTermReq(_) => pdu_type::H2C_TERM_REQ,
            Pdu::C2HTermReq(_) => pdu_type::C2H_TERM_REQ,
            Pdu::CapsuleCmd(_) => pdu_type::CAPSULE_CMD,
            Pdu::CapsuleResp(_) => pdu_type::CAPSULE_RESP,
            Pdu::H2CData(_) => pdu_type::H2C_DATA,
            Pdu::C2HData(_) => pdu_type::C2H_DATA,
            Pdu::R2T(_) => pdu_type::R2T,
        }
    }

    /// The PDU's data (empty for types that carry none).
    pub fn data(&self) -> &[u8] {
        match self {
            Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => &t.data,
            Pdu::CapsuleCmd(c) => &c.data,
            Pdu::H2CData(d) => &d.data,
            Pdu::C2HData(d) => &d.data,
            Pdu::IcReq(_) | Pdu::IcResp(_) | Pdu::CapsuleResp(_) | Pdu::R2T(_) => &[],
        }
    }

    /// Detach from the receive buffer (copies borrowed data).
    pub fn into_owned(self) -> Pdu<'static> {
        fn own(c: Cow<'_, [u8]>) -> Cow<'static, [u8]> {
            Cow::Owned(c.into_owned())
        }
        match self {
            Pdu::IcReq(p) => Pdu::IcReq(p),
            Pdu::IcResp(p) => Pdu::IcResp(p),
            Pdu::H2CTermReq(t) => Pdu::H2CTermReq(t.into_owned()),
            Pdu::C2HTermReq(t) => Pdu::C2HTermReq(t.into_owned()),
            Pdu::CapsuleCmd(c) => Pdu::CapsuleCmd(CapsuleCmd {
                sqe: c.sqe,
                data: own(c.data),
            }),
            Pdu::CapsuleResp(r) => Pdu::CapsuleResp(r),
            Pdu::H2CData(d) => Pdu::H2CData(H2CData {
                data: own(d.data),
                ..d
            }),
            Pdu::C2HData(d) => Pdu::C2HData(C2HData {
                data: own(d.data),
                ..d
            }),
            Pdu::R2T(r) => Pdu::R2T(r),
        }
    }

    /// A TermReq in the direction `sender` sends (H2C from a host, C2H from
    /// a controller).
    pub fn term_req(sender: Role, term: TermReq<'a>) -> Self {
        match sender {
            Role::Host => Pdu::H2CTermReq(term),
            Role::Controller => Pdu::C2HTermReq(term),
        }
    }

    /// Append the whole PDU (header, digests, padding, data) to `out`.
    pub fn encode(&self, cfg: &EncodeConfig, out: &mut Vec<u8>) -> Result<(), ProtoError> {
        let data_digest = self.encode_head(cfg, out)?;
        out.extend_from_slice(self.data());
        if let Some(d) = data_digest {
            out.extend_from_slice(&d);
        }
        Ok(())
    }

    /// The whole PDU as a new vector.
    pub fn to_vec(&self, cfg: &EncodeConfig) -> Result<Vec<u8>, ProtoError> {
        let mut out = Vec::with_capacity(self.encoded_len(cfg)?);
        self.encode(cfg, &mut out)?;
        Ok(out)
    }

    /// PLEN this PDU will have when encoded with `cfg`.
    pub fn encoded_len(&self, cfg: &EncodeConfig) -> Result<usize, ProtoError> {
        Ok(self.layout(cfg)?.plen)
    }

    /// Append everything up to the data (common header, PDU specific header,
    /// header digest, padding) to `out`, and return the data digest bytes to
    /// send after [`Pdu::data`], if data digests apply. Sending `out`, then
    /// the data, then the digest gives the same bytes as [`Pdu::encode`].
    pub fn encode_head(
        &self,
        cfg: &EncodeConfig,
        out: &mut Vec<u8>,
    ) -> Result<Option<[u8; DIGEST_LEN]>, ProtoError> {
        let layout = self.layout(cfg)?;
        let mut header = [0u8; IC_PDU_LEN];
        let hlen = layout.hlen;
        let plen = u32::try_from(layout.plen).map_err(|_| ProtoError::Unencodable {
            what: "PDU",
            reason: "PLEN does not fit in 32 bits",
        })?;
        let ch = CommonHeader {
            pdu_type: self.pdu_type(),
            flags: layout.flags,
            hlen: hlen as u8,
            pdo: layout.pdo as u8,
            plen,
        };
        header[..COMMON_HEADER_LEN].copy_from_slice(&ch.to_bytes());
        self.write_specific_header(&mut header);
        let header = &header[..hlen];
        out.extend_from_slice(header);
        if layout.header_digest {
            out.extend_from_slice(&crc32c(header).to_le_bytes());
        }
        out.resize(out.len() + layout.padding, 0);
        Ok(layout
            .data_digest
            .then(|| crc32c(self.data()).to_le_bytes()))
    }

    fn write_specific_header(&self, h: &mut [u8; IC_PDU_LEN]) {
        match self {
            Pdu::IcReq(p) => {
                put_u16(h, 8, PFV_1_0);
                h[10] = p.hpda;
                h[11] = digest_byte(p.header_digest, p.data_digest);
                put_u32(h, 12, p.maxr2t);
            }
            Pdu::IcResp(p) => {
                put_u16(h, 8, PFV_1_0);
                h[10] = p.cpda;
                h[11] = digest_byte(p.header_digest, p.data_digest);
                put_u32(h, 12, p.maxh2cdata);
            }
            Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => {
                put_u16(h, 8, t.fes.0);
                put_u32(h, 10, t.fei);
            }
            Pdu::CapsuleCmd(c) => h[8..8 + SQE_LEN].copy_from_slice(&c.sqe.to_bytes()),
            Pdu::CapsuleResp(r) => h[8..8 + CQE_LEN].copy_from_slice(&r.cqe.to_bytes()),
            Pdu::H2CData(d) => {
                put_u16(h, 8, d.cccid);
                put_u16(h, 10, d.ttag);
                put_u32(h, 12, d.datao);
                put_u32(h, 16, d.data.len() as u32);
            }
            Pdu::C2HData(d) => {
                put_u16(h, 8, d.cccid);
                put_u32(h, 12, d.datao);
                put_u32(h, 16, d.data.len() as u32);
            }
            Pdu::R2T(r) => {
                put_u16(h, 8, r.cccid);
                put_u16(h, 10, r.ttag);
                put_u32(h, 12, r.r2to);
                put_u32(h, 16, r.r2tl);
            }
        }
    }

    fn layout(&self, cfg: &EncodeConfig) -> Result<EncodeLayout, ProtoError> {
        let data_len = self.data().len();
        let (hlen, digests_apply, extra_flags) = match self {
            Pdu::IcReq(_) | Pdu::IcResp(_) => (IC_PDU_LEN, false, 0),
            Pdu::H2CTermReq(_) | Pdu::C2HTermReq(_) => {
                if data_len > TERM_REQ_MAX_DATA_LEN {
                    return Err(ProtoError::Unencodable {
                        what: "TermReq",
                        reason: "more than 128 bytes of offending header",
                    });
                }
                (TERM_REQ_HLEN, false, 0)
            }
            Pdu::CapsuleCmd(_) => (CAPSULE_CMD_HLEN, true, 0),
            Pdu::CapsuleResp(_) => (CAPSULE_RESP_HLEN, true, 0),
            Pdu::H2CData(d) => (DATA_PDU_HLEN, true, last_flag(d.last)),
            Pdu::C2HData(d) => (
                DATA_PDU_HLEN,
                true,
                last_flag(d.last) | if d.success { pdu_flags::SUCCESS } else { 0 },
            ),
            Pdu::R2T(_) => (R2T_HLEN, true, 0),
        };
        let header_digest = digests_apply && cfg.header_digest;
        let is_term_req = matches!(self, Pdu::H2CTermReq(_) | Pdu::C2HTermReq(_));
        let data_digest = digests_apply && cfg.data_digest && data_len > 0;
        let header_end = hlen + if header_digest { DIGEST_LEN } else { 0 };
        // TermReq data sits right after its header, PDO stays 0 (reserved).
        let pdo = if data_len == 0 || is_term_req {
            0
        } else {
            header_end.next_multiple_of(pda_alignment(cfg.tx_pda.min(MAX_PDA)))
        };
        let data_start = if pdo == 0 { header_end } else { pdo };
        let plen = data_start
            .checked_add(data_len)
            .and_then(|n| n.checked_add(if data_digest { DIGEST_LEN } else { 0 }))
            .filter(|&n| n <= u32::MAX as usize)
            .ok_or(ProtoError::Unencodable {
                what: "PDU",
                reason: "PLEN does not fit in 32 bits",
            })?;
        let flags = extra_flags
            | if header_digest { pdu_flags::HDGSTF } else { 0 }
            | if data_digest { pdu_flags::DDGSTF } else { 0 };
        Ok(EncodeLayout {
            hlen,
            flags,
            pdo,
            plen,
            header_digest,
            data_digest,
            padding: data_start - header_end,
        })
    }
}

struct EncodeLayout {
    hlen: usize,
    flags: u8,
    pdo: usize,
    plen: usize,
    header_digest: bool,
    data_digest: bool,
    padding: usize,
}

fn last_flag(last: bool) -> u8 {
    if last {
        pdu_flags::LAST_PDU
    } else {
        0
    }
}

fn digest_byte(header: bool, data: bool) -> u8 {
    (if header { IC_DIGEST_HEADER } else { 0 }) | (if data { IC_DIGEST_DATA } else { 0 })
}

/// What ICReq/ICResp settled for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Negotiated {
    /// Header digests are on.
    pub header_digest: bool,
    /// Data digests are on.
    pub data_digest: bool,
    /// HPDA from ICReq: alignment of data in PDUs the host receives.
    pub hpda: u8,
    /// CPDA from ICResp: alignment of data in PDUs the controller receives.
    pub cpda: u8,
    /// MAXR2T from ICReq (0's based).
    pub maxr2t: u32,
    /// MAXH2CDATA from ICResp.
    pub maxh2cdata: u32,
}

impl Negotiated {
    /// Combine the two initialization PDUs. The controller decides which
    /// digests are on; enabling one the host did not ask for is an error
    /// (reported against the ICResp digest byte, offset 11).
    pub fn new(req: &IcReq, resp: &IcResp) -> Result<Self, ProtoError> {
        if (resp.header_digest && !req.header_digest) || (resp.data_digest && !req.data_digest) {
            return Err(ProtoError::InvalidHeaderField {
                pdu_type: pdu_type::IC_RESP,
                field: "DGST",
                fei: 11,
                reason: "controller enabled a digest the host did not request",
            });
        }
        Ok(Self {
            header_digest: resp.header_digest,
            data_digest: resp.data_digest,
            hpda: req.hpda,
            cpda: resp.cpda,
            maxr2t: req.maxr2t,
            maxh2cdata: resp.maxh2cdata,
        })
    }

    /// Encoder settings for `role`'s outgoing PDUs.
    pub fn encode_config(&self, role: Role) -> EncodeConfig {
        EncodeConfig {
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            tx_pda: match role {
                Role::Host => self.cpda,
                Role::Controller => self.hpda,
            },
        }
    }

    /// Decoder settings for `role`'s incoming PDUs.
    pub fn decoder_config(&self, role: Role, max_data_len: u32) -> crate::decoder::DecoderConfig {
        crate::decoder::DecoderConfig {
            role,
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            rx_pda: match role {
                Role::Host => self.hpda,
                Role::Controller => self.cpda,
            },
            max_data_len,
        }
    }
}
