//! Byte-level PDU surgery for tests of peers (initiator, target): start from
//! a valid encoding, break exactly one thing, send the bytes.
//!
//! ```
//! use nvmf_proto::raw::RawPdu;
//! use nvmf_proto::{EncodeConfig, Pdu, R2T};
//!
//! let cfg = EncodeConfig { header_digest: true, ..Default::default() };
//! let r2t = Pdu::R2T(R2T { cccid: 0xBEEF, ttag: 1, r2to: 0, r2tl: 4096 });
//! // An R2T whose PLEN lies, with a header digest that still matches, so
//! // the peer has to catch the PLEN and not the digest.
//! let bytes = RawPdu::encode(&r2t, &cfg)?.set_plen(20).refresh_header_digest().into_bytes();
//! assert_eq!(bytes[4], 20);
//! # Ok::<(), nvmf_proto::ProtoError>(())
//! ```
//!
//! These are test tools: an offset outside the PDU is a bug in the test and
//! panics with a message saying so.

use crate::error::ProtoError;
use crate::pdu::{crc32c, pdu_flags, EncodeConfig, Pdu, DIGEST_LEN};

/// An encoded PDU open to editing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPdu {
    bytes: Vec<u8>,
}

impl RawPdu {
    /// Encode `pdu` with `cfg` as the starting point.
    pub fn encode(pdu: &Pdu<'_>, cfg: &EncodeConfig) -> Result<Self, ProtoError> {
        Ok(Self {
            bytes: pdu.to_vec(cfg)?,
        })
    }

    /// Start from arbitrary bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    /// Set one byte.
    ///
    /// # Panics
    /// If `offset` is outside the PDU.
    pub fn set_byte(mut self, offset: usize, value: u8) -> Self {
        let len = self.bytes.len();
        *self
            .bytes
            .get_mut(offset)
            .unwrap_or_else(|| panic!("offset {offset} outside a {len}-byte PDU")) = value;
        self
    }

    /// Set a little-endian 16-bit field.
    ///
    /// # Panics
    /// If the field is outside the PDU.
    pub fn set_u16(self, offset: usize, value: u16) -> Self {
        let [a, b] = value.to_le_bytes();
        self.set_byte(offset, a).set_byte(offset + 1, b)
    }

    /// Set a little-endian 32-bit field.
    ///
    /// # Panics
    /// If the field is outside the PDU.
    pub fn set_u32(self, offset: usize, value: u32) -> Self {
        let [a, b, c, d] = value.to_le_bytes();
        self.set_byte(offset, a)
            .set_byte(offset + 1, b)
            .set_byte(offset + 2, c)
            .set_byte(offset + 3, d)
    }

    /// Set PDU-Type (byte 0).
    pub fn set_pdu_type(self, pdu_type: u8) -> Self {
        self.set_byte(0, pdu_type)
    }

    /// Set FLAGS (byte 1).
    pub fn set_flags(self, flags: u8) -> Self {
        self.set_byte(1, flags)
    }

    /// Set HLEN (byte 2).
    pub fn set_hlen(self, hlen: u8) -> Self {
        self.set_byte(2, hlen)
    }

    /// Set PDO (byte 3).
    pub fn set_pdo(self, pdo: u8) -> Self {
        self.set_byte(3, pdo)
    }

    /// Set PLEN (bytes 4..8) without changing how many bytes there are.
    pub fn set_plen(self, plen: u32) -> Self {
        self.set_u32(4, plen)
    }

    /// Recompute the header digest after edits, if the PDU has one
    /// (HDGSTF set), so only the edited field is wrong.
    pub fn refresh_header_digest(mut self) -> Self {
        if let Some(d) = self.header_digest_offset() {
            let digest = crc32c(&self.bytes[..d]);
            self.bytes[d..d + DIGEST_LEN].copy_from_slice(&digest.to_le_bytes());
        }
        self
    }

    /// Flip a bit of the header digest.
    ///
    /// # Panics
    /// If the PDU has no header digest.
    pub fn corrupt_header_digest(self) -> Self {
        let d = self
            .header_digest_offset()
            .expect("PDU has no header digest (HDGSTF clear)");
        let v = self.bytes[d] ^ 0x01;
        self.set_byte(d, v)
    }

    /// Flip a bit of the data digest (the last 4 bytes).
    ///
    /// # Panics
    /// If the PDU has no data digest.
    pub fn corrupt_data_digest(self) -> Self {
        let has = self
            .bytes
            .get(1)
            .is_some_and(|f| f & pdu_flags::DDGSTF != 0);
        assert!(has, "PDU has no data digest (DDGSTF clear)");
        let last = self.bytes.len() - 1;
        let v = self.bytes[last] ^ 0x80;
        self.set_byte(last, v)
    }

    /// Keep only the first `len` bytes (a short read, or a cut connection).
    pub fn truncate(mut self, len: usize) -> Self {
        self.bytes.truncate(len);
        self
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    fn header_digest_offset(&self) -> Option<usize> {
        let flags = *self.bytes.get(1)?;
        let hlen = *self.bytes.get(2)? as usize;
        (flags & pdu_flags::HDGSTF != 0 && self.bytes.len() >= hlen + DIGEST_LEN).then_some(hlen)
    }
}
