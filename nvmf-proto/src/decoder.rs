//! The streaming PDU decoder.
//!
//! The caller owns the receive buffer. Each call to [`PduDecoder::decode`]
//! looks at the unconsumed bytes, starting at a PDU boundary, and returns
//! one of:
//!
//! - [`Decoded::NeedMore`]: read at least that many more bytes, append them,
//!   call again with the whole unconsumed buffer;
//! - [`Decoded::Pdu`]: one PDU, whose data borrows from the buffer, and how
//!   many bytes it took (drop them from the buffer after handling the PDU);
//! - an error: see [`ProtoError::action`] for what to do about it.
//!
//! The 8-byte common header is validated as soon as it is in, so a bad or
//! oversized PDU is rejected before its body is waited for; nothing is ever
//! allocated here, and PLEN is bounded by [`DecoderConfig::max_data_len`].
//! The decoder keeps no state between calls except its configuration, so the
//! digest settings can be changed between two PDUs, which is what happens
//! right after the ICReq/ICResp exchange.
//!
//! A receiver that wants a data PDU's payload somewhere other than its
//! receive buffer (straight into the command's I/O buffer) calls
//! [`PduDecoder::decode_data_header`] instead: it returns the header of an
//! H2CData or C2HData PDU as soon as everything before the data is in
//! (common header, PDU header, header digest, padding up to PDO), checked
//! exactly as [`PduDecoder::decode`] checks those bytes (the same code), so
//! the caller can validate it against its command and then receive
//! [`DataHeader::datal`] bytes of data and the data digest wherever it
//! likes.
//!
//! [`PduReader`] wraps the decoder with an owned buffer for callers that
//! just push bytes as they arrive.

use std::borrow::Cow;

use crate::cqe::{Cqe, CQE_LEN};
use crate::error::{FatalErrorStatus, ProtoError};
use crate::pdu::{
    crc32c, pda_alignment, pdu_flags, pdu_type, C2HData, CapsuleCmd, CapsuleResp, CommonHeader,
    H2CData, IcReq, IcResp, Pdu, Role, TermReq, CAPSULE_CMD_HLEN, CAPSULE_RESP_HLEN,
    COMMON_HEADER_LEN, DATA_PDU_HLEN, DIGEST_LEN, IC_DIGEST_DATA, IC_DIGEST_HEADER, IC_PDU_LEN,
    MAX_PDA, MIN_MAXH2CDATA, PFV_1_0, R2T, R2T_HLEN, TERM_REQ_HLEN, TERM_REQ_MAX_PLEN,
};
use crate::sqe::{Sqe, SQE_LEN};
use crate::wire::{get_u16, get_u32};

/// Default limit on PDU data: 1 MiB, above any MDTS this project uses.
pub const DEFAULT_MAX_DATA_LEN: u32 = 1 << 20;

/// Decoder settings for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecoderConfig {
    /// Which end decodes: PDU types that must not travel towards this end
    /// are rejected.
    pub role: Role,
    /// Header digests are negotiated: HDGSTF must be set in every PDU type
    /// that can carry one, and clear when this is off.
    pub header_digest: bool,
    /// Data digests are negotiated: DDGSTF must be set in every PDU that
    /// carries data, and clear when this is off.
    pub data_digest: bool,
    /// The PDA this end advertised (HPDA for a host, CPDA for a controller):
    /// PDO of data-bearing PDUs must be a multiple of `(rx_pda + 1) * 4`.
    pub rx_pda: u8,
    /// Most data bytes one PDU may carry. Larger PDUs are rejected with FES
    /// 05h (Data Transfer Limit Exceeded) before any of their body is read.
    pub max_data_len: u32,
}

impl DecoderConfig {
    /// Settings before the connection is initialized: no digests, no
    /// alignment, [`DEFAULT_MAX_DATA_LEN`].
    pub const fn new(role: Role) -> Self {
        Self {
            role,
            header_digest: false,
            data_digest: false,
            rx_pda: 0,
            max_data_len: DEFAULT_MAX_DATA_LEN,
        }
    }
}

/// Result of one [`PduDecoder::decode`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// At least this many more bytes are needed (exactly this many once the
    /// common header is in).
    NeedMore(usize),
    /// A complete, valid PDU.
    Pdu {
        /// The PDU; its data borrows from the input buffer.
        pdu: Pdu<'a>,
        /// Bytes of input the PDU occupied (its PLEN).
        consumed: usize,
    },
}

/// Result of one [`PduDecoder::decode_data_header`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataHeaderDecoded {
    /// Exactly this many more bytes are needed before the header is known
    /// (or, for the first 8 bytes, before the PDU type is).
    NeedMore(usize),
    /// The PDU at the start of the buffer is valid so far but not a data
    /// PDU: decode it with [`PduDecoder::decode`].
    NotData,
    /// The header of an H2CData or C2HData PDU; its first
    /// [`DataHeader::data_offset`] bytes are the header, the data follows.
    Header(DataHeader),
}

/// The header of a data PDU (H2CData or C2HData), validated as
/// [`PduDecoder::decode`] validates it; the data is not part of it.
///
/// ```text
/// | CH | PSH | HDGST | PAD | DATA (datal) | DDGST (0/4) |
/// 0                      data_offset      plen - trailer_len  plen
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataHeader {
    /// [`pdu_type::H2C_DATA`] or [`pdu_type::C2H_DATA`].
    pub pdu_type: u8,
    /// CCCID: the command's CID.
    pub cccid: u16,
    /// TTAG (H2CData); zero for C2HData.
    pub ttag: u16,
    /// DATAO: offset of the data within the command's buffer.
    pub datao: u32,
    /// DATAL: data bytes; never zero, at most the configured maximum.
    pub datal: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (C2HData only; implies `last`).
    pub success: bool,
    /// Bytes before the data (PDO): header, header digest, padding.
    pub data_offset: usize,
    /// A 4-byte data digest follows the data.
    pub data_digest: bool,
    /// The whole PDU's length (PLEN).
    pub plen: usize,
}

impl DataHeader {
    /// Bytes after the data: the data digest, if any.
    pub const fn trailer_len(&self) -> usize {
        if self.data_digest {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Compare the CRC32C a receiver computed over the data with the digest
    /// it received after it; a mismatch is the same
    /// [`ProtoError::DataDigestMismatch`] that [`PduDecoder::decode`]
    /// reports for this PDU.
    pub fn check_data_digest(&self, computed: u32, received: u32) -> Result<(), ProtoError> {
        if computed == received {
            return Ok(());
        }
        Err(ProtoError::DataDigestMismatch {
            pdu_type: self.pdu_type,
            command_id: self.cccid,
            transfer_tag: self.ttag,
            consumed: self.plen,
            computed,
            received,
        })
    }
}

/// Where things are in a PDU whose common header passed validation.
#[derive(Debug, Clone, Copy)]
struct Layout {
    header: CommonHeader,
    plen: usize,
    hlen: usize,
    header_digest: bool,
    data_digest: bool,
    data_start: usize,
    data_len: usize,
}

/// Stateless-between-PDUs NVMe/TCP decoder; see the module documentation.
#[derive(Debug, Clone)]
pub struct PduDecoder {
    config: DecoderConfig,
}

impl PduDecoder {
    /// A decoder with `config`.
    pub const fn new(config: DecoderConfig) -> Self {
        Self { config }
    }

    /// Current settings.
    pub const fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Change settings (takes effect from the next PDU).
    pub fn set_config(&mut self, config: DecoderConfig) {
        self.config = config;
    }

    /// Turn digests on or off, e.g. after ICReq/ICResp.
    pub fn set_digests(&mut self, header_digest: bool, data_digest: bool) {
        self.config.header_digest = header_digest;
        self.config.data_digest = data_digest;
    }

    /// Set the alignment this end advertised (HPDA or CPDA).
    pub fn set_rx_pda(&mut self, rx_pda: u8) {
        self.config.rx_pda = rx_pda;
    }

    /// Set the largest data length accepted in one PDU.
    pub fn set_max_data_len(&mut self, max_data_len: u32) {
        self.config.max_data_len = max_data_len;
    }

    /// Decode the PDU at the start of `buf`. Never panics, never allocates;
    /// `consumed` never exceeds `buf.len()`.
    pub fn decode<'b>(&self, buf: &'b [u8]) -> Result<Decoded<'b>, ProtoError> {
        let layout = match self.check_head(buf)? {
            Ok(layout) => layout,
            Err(need) => return Ok(Decoded::NeedMore(need)),
        };
        let header = layout.header;
        let Some(pdu_bytes) = buf.get(..layout.plen) else {
            return Ok(Decoded::NeedMore(layout.plen - buf.len()));
        };
        let pdu = parse_pdu(&layout, pdu_bytes)?;
        if layout.data_digest {
            let data = &pdu_bytes[layout.data_start..layout.data_start + layout.data_len];
            let computed = crc32c(data);
            let received = get_u32(pdu_bytes, layout.plen - DIGEST_LEN);
            if computed != received {
                let (command_id, transfer_tag) = match &pdu {
                    Pdu::CapsuleCmd(c) => (c.sqe.cid, 0),
                    Pdu::H2CData(d) => (d.cccid, d.ttag),
                    Pdu::C2HData(d) => (d.cccid, 0),
                    _ => (0, 0),
                };
                return Err(ProtoError::DataDigestMismatch {
                    pdu_type: header.pdu_type,
                    command_id,
                    transfer_tag,
                    consumed: layout.plen,
                    computed,
                    received,
                });
            }
        }
        Ok(Decoded::Pdu {
            pdu,
            consumed: layout.plen,
        })
    }

    /// The header of the data PDU (H2CData or C2HData) at the start of
    /// `buf`, as soon as the bytes before its data are in, without waiting
    /// for the data. Never panics, never allocates.
    ///
    /// The bytes are checked by the same code and in the same order as in
    /// [`PduDecoder::decode`] (common header, header digest, DATAL against
    /// PLEN and PDO), so a bad header gives the same error, only possibly
    /// sooner. What `decode` would still check is left to the caller: the
    /// data digest ([`DataHeader::check_data_digest`] over the
    /// [`DataHeader::datal`] bytes at [`DataHeader::data_offset`]).
    pub fn decode_data_header(&self, buf: &[u8]) -> Result<DataHeaderDecoded, ProtoError> {
        let layout = match self.check_head(buf)? {
            Ok(layout) => layout,
            Err(need) => return Ok(DataHeaderDecoded::NeedMore(need)),
        };
        let t = layout.header.pdu_type;
        if t != pdu_type::H2C_DATA && t != pdu_type::C2H_DATA {
            return Ok(DataHeaderDecoded::NotData);
        }
        // A data PDU always has data (validate_common_header refuses one
        // without), so the PDO it points to lies past the header digest.
        let Some(head) = buf.get(..layout.data_start) else {
            return Ok(DataHeaderDecoded::NeedMore(layout.data_start - buf.len()));
        };
        parse_data_header(&layout, head).map(DataHeaderDecoded::Header)
    }

    /// What `decode` and `decode_data_header` check before the PDU's body:
    /// the common header and, once it is in, the header digest. `Err(n)`
    /// inside: `n` more bytes are needed for the common header.
    fn check_head(&self, buf: &[u8]) -> Result<Result<Layout, usize>, ProtoError> {
        let Some(header) = CommonHeader::parse(buf) else {
            return Ok(Err(COMMON_HEADER_LEN - buf.len()));
        };
        let layout = self.validate_common_header(header)?;
        // The header digest is checked as soon as the header is in, so a
        // corrupted header is reported without waiting for a body whose
        // length came from that header.
        if layout.header_digest {
            if let Some(digested) = buf.get(..layout.hlen + DIGEST_LEN) {
                check_header_digest(header.pdu_type, digested)?;
            }
        }
        Ok(Ok(layout))
    }

    /// Check the common header against the PDU type's rules, lowest field
    /// offset first (type, flags, HLEN, PDO, PLEN), as the specification
    /// asks errors to be reported.
    fn validate_common_header(&self, ch: CommonHeader) -> Result<Layout, ProtoError> {
        let cfg = &self.config;
        let t = ch.pdu_type;
        let invalid = |field, fei, reason| ProtoError::InvalidHeaderField {
            pdu_type: t,
            field,
            fei,
            reason,
        };
        let plen = ch.plen as usize;

        // Byte 0: PDU-Type.
        let (expected_hlen, valid_flags, digest_capable, carries_data) = match t {
            pdu_type::IC_REQ | pdu_type::IC_RESP => (IC_PDU_LEN, 0, false, false),
            pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => (TERM_REQ_HLEN, 0, false, true),
            pdu_type::CAPSULE_CMD => (
                CAPSULE_CMD_HLEN,
                pdu_flags::HDGSTF | pdu_flags::DDGSTF,
                true,
                true,
            ),
            pdu_type::CAPSULE_RESP => (CAPSULE_RESP_HLEN, pdu_flags::HDGSTF, true, false),
            pdu_type::H2C_DATA => (
                DATA_PDU_HLEN,
                pdu_flags::HDGSTF | pdu_flags::DDGSTF | pdu_flags::LAST_PDU,
                true,
                true,
            ),
            pdu_type::C2H_DATA => (
                DATA_PDU_HLEN,
                pdu_flags::HDGSTF | pdu_flags::DDGSTF | pdu_flags::LAST_PDU | pdu_flags::SUCCESS,
                true,
                true,
            ),
            pdu_type::R2T => (R2T_HLEN, pdu_flags::HDGSTF, true, false),
            _ => return Err(invalid("PDU-Type", 0, "unknown PDU type")),
        };
        if !cfg.role.receives(t) {
            return Err(invalid(
                "PDU-Type",
                0,
                "PDU type not allowed in this direction",
            ));
        }

        // A malformed TermReq is not answered with a TermReq: the peer is
        // already closing. Only the lengths matter; FLAGS and PDO are
        // reserved and ignored so that the peer's reason still gets through.
        if t == pdu_type::H2C_TERM_REQ || t == pdu_type::C2H_TERM_REQ {
            if ch.hlen as usize != TERM_REQ_HLEN {
                return Err(ProtoError::InvalidTermReq {
                    pdu_type: t,
                    reason: "HLEN is not 24",
                });
            }
            if !(TERM_REQ_HLEN..=TERM_REQ_MAX_PLEN).contains(&plen) {
                return Err(ProtoError::InvalidTermReq {
                    pdu_type: t,
                    reason: "PLEN outside 24..=152",
                });
            }
            return Ok(Layout {
                header: ch,
                plen,
                hlen: TERM_REQ_HLEN,
                header_digest: false,
                data_digest: false,
                data_start: TERM_REQ_HLEN,
                data_len: plen - TERM_REQ_HLEN,
            });
        }

        // Byte 1: FLAGS.
        if ch.flags & !valid_flags != 0 {
            return Err(invalid("FLAGS", 1, "flag not defined for this PDU type"));
        }
        let header_digest = ch.flags & pdu_flags::HDGSTF != 0;
        let data_digest = ch.flags & pdu_flags::DDGSTF != 0;
        if digest_capable && header_digest != cfg.header_digest {
            return Err(invalid(
                "FLAGS",
                1,
                "HDGSTF does not match the negotiated header digest setting",
            ));
        }
        if data_digest && !cfg.data_digest {
            return Err(invalid(
                "FLAGS",
                1,
                "DDGSTF set but data digests were not negotiated",
            ));
        }
        if ch.flags & pdu_flags::SUCCESS != 0 && ch.flags & pdu_flags::LAST_PDU == 0 {
            return Err(invalid("FLAGS", 1, "SUCCESS set without LAST_PDU"));
        }

        // Byte 2: HLEN.
        if ch.hlen as usize != expected_hlen {
            return Err(invalid("HLEN", 2, "wrong header length for this PDU type"));
        }
        let hlen = expected_hlen;
        let header_end = hlen + if header_digest { DIGEST_LEN } else { 0 };

        // Byte 3: PDO. Data-less PDUs have PDO reserved (0); a PDU that may
        // carry data but has none may say 0 too (Linux does).
        let has_data = carries_data && plen > header_end;
        let pdo = ch.pdo as usize;
        if !carries_data || t == pdu_type::IC_REQ || t == pdu_type::IC_RESP {
            if pdo != 0 {
                return Err(invalid("PDO", 3, "PDO must be 0 in a PDU without data"));
            }
        } else if has_data || pdo != 0 {
            if pdo < header_end {
                return Err(invalid(
                    "PDO",
                    3,
                    "PDO points inside the header or header digest",
                ));
            }
            if pdo % pda_alignment(cfg.rx_pda.min(MAX_PDA)) != 0 {
                return Err(invalid(
                    "PDO",
                    3,
                    "PDO not aligned as this end's PDA requires",
                ));
            }
            if pdo > plen {
                return Err(invalid("PDO", 3, "PDO beyond the end of the PDU"));
            }
        }

        // Bytes 4..8: PLEN.
        if plen < hlen {
            return Err(invalid("PLEN", 4, "PLEN smaller than HLEN"));
        }
        if plen < header_end {
            return Err(invalid("PLEN", 4, "PLEN smaller than header plus digest"));
        }
        if (t == pdu_type::IC_REQ || t == pdu_type::IC_RESP) && plen != IC_PDU_LEN {
            return Err(invalid("PLEN", 4, "ICReq/ICResp PLEN must be 128"));
        }
        if !carries_data && plen != header_end {
            return Err(invalid("PLEN", 4, "PDU type carries no data"));
        }
        if !has_data {
            if data_digest {
                return Err(invalid("FLAGS", 1, "DDGSTF set in a PDU without data"));
            }
            if t == pdu_type::H2C_DATA || t == pdu_type::C2H_DATA {
                return Err(invalid("PLEN", 4, "data PDU without data"));
            }
            return Ok(Layout {
                header: ch,
                plen,
                hlen,
                header_digest,
                data_digest: false,
                data_start: header_end,
                data_len: 0,
            });
        }
        if cfg.data_digest && !data_digest {
            return Err(invalid(
                "FLAGS",
                1,
                "DDGSTF clear but data digests were negotiated",
            ));
        }
        let trailer = if data_digest { DIGEST_LEN } else { 0 };
        let data_len = plen
            .checked_sub(pdo + trailer)
            .filter(|&n| n > 0)
            .ok_or(invalid(
                "PLEN",
                4,
                "PLEN too small for data and data digest",
            ))?;
        if data_len > cfg.max_data_len as usize {
            return Err(ProtoError::DataLimitExceeded {
                pdu_type: t,
                data_len: data_len as u32,
                limit: cfg.max_data_len,
            });
        }
        Ok(Layout {
            header: ch,
            plen,
            hlen,
            header_digest,
            data_digest,
            data_start: pdo,
            data_len,
        })
    }
}

/// `b` is a PDU header followed by its 4-byte digest.
fn check_header_digest(pdu_type: u8, b: &[u8]) -> Result<(), ProtoError> {
    let hlen = b.len() - DIGEST_LEN;
    let computed = crc32c(&b[..hlen]);
    let received = get_u32(b, hlen);
    if computed == received {
        Ok(())
    } else {
        Err(ProtoError::HeaderDigestMismatch {
            pdu_type,
            computed,
            received,
        })
    }
}

/// Parse the PDU specific header fields; `b` is exactly the PDU (PLEN bytes)
/// and `layout` has been validated against it.
fn parse_pdu<'b>(layout: &Layout, b: &'b [u8]) -> Result<Pdu<'b>, ProtoError> {
    let t = layout.header.pdu_type;
    let data = || Cow::Borrowed(&b[layout.data_start..layout.data_start + layout.data_len]);
    let invalid = |field, fei, reason| ProtoError::InvalidHeaderField {
        pdu_type: t,
        field,
        fei,
        reason,
    };
    let pdu = match t {
        pdu_type::IC_REQ | pdu_type::IC_RESP => {
            if get_u16(b, 8) != PFV_1_0 {
                return Err(ProtoError::UnsupportedParameter {
                    pdu_type: t,
                    field: "PFV",
                    fei: 8,
                    reason: "only PDU format version 1.0 (0) is supported",
                });
            }
            let pda = b[10];
            if pda > MAX_PDA {
                return Err(invalid(
                    if t == pdu_type::IC_REQ {
                        "HPDA"
                    } else {
                        "CPDA"
                    },
                    10,
                    "PDA above 31",
                ));
            }
            let digest = b[11];
            if digest & !(IC_DIGEST_HEADER | IC_DIGEST_DATA) != 0 {
                return Err(invalid("DGST", 11, "reserved digest bits set"));
            }
            let header_digest = digest & IC_DIGEST_HEADER != 0;
            let data_digest = digest & IC_DIGEST_DATA != 0;
            let value = get_u32(b, 12);
            if t == pdu_type::IC_REQ {
                Pdu::IcReq(IcReq {
                    hpda: pda,
                    header_digest,
                    data_digest,
                    maxr2t: value,
                })
            } else {
                if value < MIN_MAXH2CDATA || value % 4 != 0 {
                    return Err(invalid(
                        "MAXH2CDATA",
                        12,
                        "MAXH2CDATA must be a dword multiple of at least 4096",
                    ));
                }
                Pdu::IcResp(IcResp {
                    cpda: pda,
                    header_digest,
                    data_digest,
                    maxh2cdata: value,
                })
            }
        }
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => {
            let term = TermReq {
                fes: FatalErrorStatus(get_u16(b, 8)),
                fei: get_u32(b, 10),
                data: data(),
            };
            if t == pdu_type::H2C_TERM_REQ {
                Pdu::H2CTermReq(term)
            } else {
                Pdu::C2HTermReq(term)
            }
        }
        pdu_type::CAPSULE_CMD => {
            let mut sqe = [0u8; SQE_LEN];
            sqe.copy_from_slice(&b[COMMON_HEADER_LEN..COMMON_HEADER_LEN + SQE_LEN]);
            Pdu::CapsuleCmd(CapsuleCmd {
                sqe: Sqe::from_bytes(&sqe),
                data: data(),
            })
        }
        pdu_type::CAPSULE_RESP => {
            let mut cqe = [0u8; CQE_LEN];
            cqe.copy_from_slice(&b[COMMON_HEADER_LEN..COMMON_HEADER_LEN + CQE_LEN]);
            Pdu::CapsuleResp(CapsuleResp {
                cqe: Cqe::from_bytes(&cqe),
            })
        }
        pdu_type::H2C_DATA | pdu_type::C2H_DATA => {
            let h = parse_data_header(layout, b)?;
            if t == pdu_type::H2C_DATA {
                Pdu::H2CData(H2CData {
                    cccid: h.cccid,
                    ttag: h.ttag,
                    datao: h.datao,
                    last: h.last,
                    data: data(),
                })
            } else {
                Pdu::C2HData(C2HData {
                    cccid: h.cccid,
                    datao: h.datao,
                    last: h.last,
                    success: h.success,
                    data: data(),
                })
            }
        }
        pdu_type::R2T => {
            let r2tl = get_u32(b, 16);
            if r2tl == 0 {
                return Err(invalid("R2TL", 16, "R2T for zero bytes"));
            }
            Pdu::R2T(R2T {
                cccid: get_u16(b, 8),
                ttag: get_u16(b, 10),
                r2to: get_u32(b, 12),
                r2tl,
            })
        }
        // validate_common_header accepted only the types above.
        _ => return Err(invalid("PDU-Type", 0, "unknown PDU type")),
    };
    Ok(pdu)
}

/// The PDU specific header of an H2CData or C2HData PDU; `b` holds at
/// least its HLEN bytes and `layout` has been validated for it.
fn parse_data_header(layout: &Layout, b: &[u8]) -> Result<DataHeader, ProtoError> {
    let t = layout.header.pdu_type;
    let flags = layout.header.flags;
    if get_u32(b, 16) as usize != layout.data_len {
        return Err(ProtoError::InvalidHeaderField {
            pdu_type: t,
            field: "DATAL",
            fei: 16,
            reason: "DATAL does not match PLEN and PDO",
        });
    }
    let h2c = t == pdu_type::H2C_DATA;
    Ok(DataHeader {
        pdu_type: t,
        cccid: get_u16(b, 8),
        ttag: if h2c { get_u16(b, 10) } else { 0 },
        datao: get_u32(b, 12),
        // validate_common_header bounds data_len by max_data_len (a u32).
        datal: layout.data_len as u32,
        last: flags & pdu_flags::LAST_PDU != 0,
        success: !h2c && flags & pdu_flags::SUCCESS != 0,
        data_offset: layout.data_start,
        data_digest: layout.data_digest,
        plen: layout.plen,
    })
}

/// A [`PduDecoder`] with its own receive buffer: push bytes as they arrive,
/// pull PDUs out. PDUs borrow from the internal buffer until the next call.
#[derive(Debug, Clone)]
pub struct PduReader {
    decoder: PduDecoder,
    buf: Vec<u8>,
    start: usize,
}

impl PduReader {
    /// A reader decoding with `config`.
    pub fn new(config: DecoderConfig) -> Self {
        Self {
            decoder: PduDecoder::new(config),
            buf: Vec::new(),
            start: 0,
        }
    }

    /// The decoder, e.g. to switch digests on after the IC exchange.
    pub fn decoder_mut(&mut self) -> &mut PduDecoder {
        &mut self.decoder
    }

    /// Append received bytes.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        // Drop consumed bytes once they dominate, so the buffer stays bounded
        // by one PDU plus what arrived after it.
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as PDUs.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The next complete PDU, `None` if more bytes are needed. After a data
    /// digest error the offending PDU is skipped, so the caller can fail the
    /// command and go on; after any other error the stream is unusable.
    pub fn next_pdu(&mut self) -> Result<Option<Pdu<'_>>, ProtoError> {
        match self.decoder.decode(&self.buf[self.start..]) {
            Ok(Decoded::NeedMore(_)) => Ok(None),
            Ok(Decoded::Pdu { pdu, consumed }) => {
                self.start += consumed;
                Ok(Some(pdu))
            }
            Err(e) => {
                if let ProtoError::DataDigestMismatch { consumed, .. } = e {
                    self.start += consumed;
                }
                Err(e)
            }
        }
    }
}
