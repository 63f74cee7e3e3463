//! DH-HMAC-CHAP secrets: the `DHHC-1:xx:<base64>:` representation and the
//! key transformation.
//!
//! The representation (NVMe Base Specification, "DH-HMAC-CHAP secret
//! representation"; what `nvme gen-dhchap-key` prints and Linux's
//! `dhchap_secret` / configfs `dhchap_key` take):
//!
//! ```text
//! DHHC-1:xx:<base64 of key || le32(CRC-32(key))>:
//! ```
//!
//! `xx` is the transform hash: `00` none, `01` SHA-256, `02` SHA-384, `03`
//! SHA-512. The key is 32, 48 or 64 bytes. The CRC is the ordinary CRC-32
//! (IEEE 802.3, reflected, initial and final XOR 0xFFFFFFFF — zlib's; Linux
//! computes it as `~crc32(~0, key, len)`), appended little-endian. The
//! base64 is RFC 4648's standard alphabet with `=` padding.
//!
//! Parsing follows Linux where it is lenient in a harmless way (surrounding
//! whitespace, the trailing `:` optional, a key length that does not match
//! the transform hash) and is strict otherwise (exactly two digits, 00 to
//! 03, one base64 block, correct CRC). Errors never contain key material.
//!
//! Note on `nvme gen-dhchap-key`: given `--secret` and `--hmac` ≠ 0, it
//! prints HMAC(secret, NQN || "NVMe-over-Fabrics") rather than the secret
//! itself (nvme-cli 2.3, checked with Debian's package); the host or
//! controller then transforms that key again with the NQN. This module
//! reads and writes the key that is printed; it does not repeat nvme-cli's
//! pre-transformation.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use zeroize::{Zeroize, Zeroizing};

use crate::auth::crypto::hmac;
use crate::auth::{HashId, OsRandom, RandomError, RandomSource};

/// The representation's prefix.
pub const PREFIX: &str = "DHHC-1:";

/// Key lengths the representation allows.
pub const KEY_LENGTHS: [usize; 3] = [32, 48, 64];

/// The longest base64 text accepted: 68 bytes (64-byte key and CRC) take
/// 92 characters with padding. Checked before decoding.
const MAX_BASE64_LEN: usize = 92;

/// Why a secret representation is rejected. No variant carries key
/// material.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The text does not start with `DHHC-1:`.
    #[error("DH-HMAC-CHAP secret must start with \"DHHC-1:\"")]
    Prefix,
    /// The transform field is not `00`, `01`, `02` or `03` followed by `:`.
    #[error("DH-HMAC-CHAP secret transform hash must be 00, 01, 02 or 03")]
    TransformHash,
    /// The key field is not valid base64 (bad character, misplaced `=`,
    /// text after the closing `:`).
    #[error("DH-HMAC-CHAP secret key field is not valid base64")]
    Base64,
    /// The decoded key is not 32, 48 or 64 bytes (plus 4 CRC bytes).
    #[error("DH-HMAC-CHAP secret key is {0} bytes, must be 32, 48 or 64")]
    Length(usize),
    /// The CRC-32 after the key does not match the key.
    #[error("DH-HMAC-CHAP secret CRC does not match its key")]
    Crc,
    /// A generated key's length does not match its transform hash
    /// (`nvme gen-dhchap-key` refuses these too).
    #[error("a {len}-byte key does not match transform hash {hash}")]
    LengthForHash {
        /// Requested key length.
        len: usize,
        /// Requested transform hash.
        hash: HashId,
    },
    /// The random source failed while generating a key.
    #[error(transparent)]
    Random(#[from] RandomError),
}

/// A DH-HMAC-CHAP secret: key bytes and the hash that transforms them.
///
/// `Debug` shows the transform and the length, never the key; the key is
/// zeroized on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapSecret {
    key: [u8; 64],
    len: u8,
    transform: Option<HashId>,
}

impl DhchapSecret {
    /// A secret from raw key bytes (32, 48 or 64 of them) and the transform
    /// hash (`None` for `00`).
    pub fn new(key: &[u8], transform: Option<HashId>) -> Result<Self, SecretError> {
        if !KEY_LENGTHS.contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        let mut s = Self {
            key: [0; 64],
            len: key.len() as u8,
            transform,
        };
        s.key[..key.len()].copy_from_slice(key);
        Ok(s)
    }

    /// Parse `DHHC-1:xx:<base64>:` (surrounding whitespace and a missing
    /// final `:` are accepted, as Linux accepts them).
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        let rest = text.strip_prefix(PREFIX).ok_or(SecretError::Prefix)?;
        let transform = match rest.as_bytes() {
            [b'0', d @ b'0'..=b'3', b':', ..] => HashId::from_id(d - b'0'),
            _ => return Err(SecretError::TransformHash),
        };
        let b64 = &rest[3..];
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        if b64.len() > MAX_BASE64_LEN {
            // Longer text cannot decode to 68 bytes or fewer.
            return Err(SecretError::Length((b64.len() / 4 * 3).saturating_sub(4)));
        }
        // Padding optional on input (a hand-written key may omit it), but
        // where present it must be right.
        let engine = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let mut buf = Zeroizing::new([0u8; 72]);
        let n = engine
            .decode_slice(b64.as_bytes(), &mut buf[..])
            .map_err(|_| SecretError::Base64)?;
        let Some(key_len) = n.checked_sub(4).filter(|l| KEY_LENGTHS.contains(l)) else {
            return Err(SecretError::Length(n.saturating_sub(4)));
        };
        let (key, crc) = buf[..n].split_at(key_len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Self::new(key, transform)
    }

    /// A new random key of `key_len` bytes. With a transform hash the
    /// length must be that hash's output size (as `nvme gen-dhchap-key`
    /// requires); without one, 32, 48 or 64.
    pub fn generate(transform: Option<HashId>, key_len: usize) -> Result<Self, SecretError> {
        Self::generate_with(transform, key_len, &mut OsRandom)
    }

    /// [`Self::generate`] with an injected random source.
    pub fn generate_with(
        transform: Option<HashId>,
        key_len: usize,
        rng: &mut dyn RandomSource,
    ) -> Result<Self, SecretError> {
        if !KEY_LENGTHS.contains(&key_len) {
            return Err(SecretError::Length(key_len));
        }
        if let Some(hash) = transform.filter(|h| h.output_len() != key_len) {
            return Err(SecretError::LengthForHash { len: key_len, hash });
        }
        let mut key = Zeroizing::new([0u8; 64]);
        rng.fill(&mut key[..key_len])?;
        Self::new(&key[..key_len], transform)
    }

    /// The `DHHC-1:xx:<base64>:` text, in a buffer zeroized on drop.
    pub fn to_representation(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new([0u8; 68]);
        let n = self.len as usize;
        raw[..n].copy_from_slice(self.key());
        raw[n..n + 4].copy_from_slice(&crc32fast::hash(self.key()).to_le_bytes());
        let mut out = Zeroizing::new(String::with_capacity(PREFIX.len() + 4 + MAX_BASE64_LEN));
        out.push_str(PREFIX);
        out.push_str(match self.transform {
            None => "00",
            Some(HashId::Sha256) => "01",
            Some(HashId::Sha384) => "02",
            Some(HashId::Sha512) => "03",
        });
        out.push(':');
        STANDARD.encode_string(&raw[..n + 4], &mut out);
        out.push(':');
        out
    }

    /// The key bytes.
    pub fn key(&self) -> &[u8] {
        &self.key[..self.len as usize]
    }

    /// The transform hash (`None`: no transformation).
    pub fn transform_hash(&self) -> Option<HashId> {
        self.transform
    }

    /// The key transformed for `nqn` (`nvme_auth_transform_key`): the key
    /// itself without a transform hash, otherwise
    /// HMAC_T(key, NQN || "NVMe-over-Fabrics") with the transform hash T,
    /// the NQN without its NUL. The host's response uses the host secret
    /// transformed with the host NQN; the controller's response uses the
    /// controller secret transformed with the subsystem NQN.
    pub fn transform(&self, nqn: &str) -> TransformedKey {
        match self.transform {
            None => TransformedKey::new(self.key()),
            Some(hash) => {
                let v = hmac(hash, self.key(), &[nqn.as_bytes(), b"NVMe-over-Fabrics"]);
                TransformedKey::new(v.as_bytes())
            }
        }
    }
}

impl Drop for DhchapSecret {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DhchapSecret")
            .field("transform", &self.transform)
            .field("len", &self.len)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl FromStr for DhchapSecret {
    type Err = SecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A transformed key: the HMAC key of a response computation. Zeroized on
/// drop; `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct TransformedKey {
    key: [u8; 64],
    len: u8,
}

impl TransformedKey {
    fn new(b: &[u8]) -> Self {
        let mut k = Self {
            key: [0; 64],
            len: b.len() as u8,
        };
        k.key[..b.len()].copy_from_slice(b);
        k
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.key[..self.len as usize]
    }
}

impl Drop for TransformedKey {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl fmt::Debug for TransformedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TransformedKey(<{} bytes redacted>)", self.len)
    }
}
