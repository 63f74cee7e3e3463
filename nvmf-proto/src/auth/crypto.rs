//! The DH-HMAC-CHAP computations, byte for byte as Linux does them
//! (`drivers/nvme/host/auth.c`, `drivers/nvme/target/auth.c`,
//! `drivers/nvme/common/auth.c`).
//!
//! With H the negotiated hash, Kh / Kc the transformed host / controller
//! keys ([`crate::auth::DhchapSecret::transform`]), C1 / C2 the challenges,
//! S1 / S2 the sequence numbers and T_ID the transaction:
//!
//! ```text
//! C' = C                                 (null DH group)
//! C' = HMAC_H(H(g^xy mod p), C)          (augmented challenge, FFDHE groups)
//! R1 = HMAC_H(Kh, C1' || le32(S1) || le16(T_ID) || SC_C || "HostHost"
//!                 || NQNh || 00h || NQNc)
//! R2 = HMAC_H(Kc, C2' || le32(S2) || le16(T_ID) || SC_C || "Controller"
//!                 || NQNc || 00h || NQNh)
//! ```
//!
//! NQNs are hashed without their terminating NUL; g^xy mod p is the
//! big-endian value padded to the prime's size. SC_C is the byte from
//! AUTH_Negotiate (Linux hashed a constant 0 before it implemented secure
//! channel concatenation; the two agree for SC_C = 0, the only value this
//! crate uses).

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

use crate::auth::secret::TransformedKey;
use crate::auth::{HashId, SessionKey};

/// A value of up to 64 bytes: a challenge, a response, a digest. Stored
/// inline (no allocation) and zeroized on drop, since some of these (the
/// hashed session key, an expected response) must not linger.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HashValue {
    len: u8,
    bytes: [u8; 64],
}

impl HashValue {
    /// A value holding `b`; `None` if it is longer than 64 bytes.
    pub fn new(b: &[u8]) -> Option<Self> {
        if b.len() > 64 {
            return None;
        }
        let mut v = Self {
            len: b.len() as u8,
            bytes: [0; 64],
        };
        v.bytes[..b.len()].copy_from_slice(b);
        Some(v)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Constant-time comparison (the time depends on the lengths only):
    /// what a received response is checked with.
    pub fn ct_eq(&self, other: &[u8]) -> bool {
        self.len() == other.len() && bool::from(self.as_bytes().ct_eq(other))
    }
}

impl Drop for HashValue {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

impl fmt::Debug for HashValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// HMAC with `hash` keyed with `key` over the concatenation of `parts`.
pub fn hmac(hash: HashId, key: &[u8], parts: &[&[u8]]) -> HashValue {
    fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> HashValue {
        // HMAC accepts keys of any length (longer ones are hashed first).
        let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
            .expect("HMAC takes keys of any length");
        for p in parts {
            mac.update(p);
        }
        let mut out = mac.finalize().into_bytes();
        let v = HashValue::new(&out).expect("digest ≤ 64 bytes");
        out.zeroize();
        v
    }
    match hash {
        HashId::Sha256 => run::<Hmac<Sha256>>(key, parts),
        HashId::Sha384 => run::<Hmac<Sha384>>(key, parts),
        HashId::Sha512 => run::<Hmac<Sha512>>(key, parts),
    }
}

/// The digest of `data` with `hash`.
pub fn digest(hash: HashId, data: &[u8]) -> HashValue {
    fn run<D: Digest>(data: &[u8]) -> HashValue {
        let mut out = D::digest(data);
        let v = HashValue::new(&out).expect("digest ≤ 64 bytes");
        out.zeroize();
        v
    }
    match hash {
        HashId::Sha256 => run::<Sha256>(data),
        HashId::Sha384 => run::<Sha384>(data),
        HashId::Sha512 => run::<Sha512>(data),
    }
}

/// The augmented challenge HMAC_H(H(session key), C)
/// (`nvme_auth_augmented_challenge`): the hashed session key is the HMAC
/// key, the challenge the message.
pub fn augmented_challenge(hash: HashId, session_key: &SessionKey, challenge: &[u8]) -> HashValue {
    let hashed = session_key.hashed(hash);
    hmac(hash, hashed.as_bytes(), &[challenge])
}

/// What goes into one response computation besides the key.
#[derive(Debug, Clone, Copy)]
pub struct ResponseInput<'a> {
    /// Negotiated hash.
    pub hash: HashId,
    /// The challenge as sent (C1 for the host's response, C2 for the
    /// controller's); augmented here when `session_key` is given.
    pub challenge: &'a [u8],
    /// The Diffie-Hellman session key, for FFDHE groups.
    pub session_key: Option<&'a SessionKey>,
    /// S1 (host response) or S2 (controller response).
    pub seq_num: u32,
    /// T_ID of the transaction.
    pub t_id: u16,
    /// SC_C from AUTH_Negotiate.
    pub sc_c: u8,
    /// Host NQN.
    pub host_nqn: &'a str,
    /// Subsystem NQN.
    pub subsys_nqn: &'a str,
}

impl ResponseInput<'_> {
    fn effective_challenge(&self) -> HashValue {
        match self.session_key {
            Some(k) => augmented_challenge(self.hash, k, self.challenge),
            None => HashValue::new(self.challenge).expect("challenges are HL ≤ 64 bytes"),
        }
    }
}

/// R1, the host's response, keyed with the host key transformed with the
/// host NQN. Order after the challenge: sequence number, T_ID, SC_C,
/// "HostHost", host NQN, a zero byte, subsystem NQN.
pub fn host_response(key: &TransformedKey, input: &ResponseInput<'_>) -> HashValue {
    response(key, input, b"HostHost", input.host_nqn, input.subsys_nqn)
}

/// R2, the controller's response, keyed with the controller key
/// transformed with the subsystem NQN. Order after the challenge: sequence
/// number, T_ID, SC_C, "Controller", subsystem NQN, a zero byte, host NQN
/// (the NQNs swap places compared with R1).
pub fn controller_response(key: &TransformedKey, input: &ResponseInput<'_>) -> HashValue {
    response(key, input, b"Controller", input.subsys_nqn, input.host_nqn)
}

/// The layout both responses share; only the role string and the order of
/// the two NQNs differ.
fn response(
    key: &TransformedKey,
    input: &ResponseInput<'_>,
    role: &[u8],
    first_nqn: &str,
    second_nqn: &str,
) -> HashValue {
    let challenge = input.effective_challenge();
    hmac(
        input.hash,
        key.as_bytes(),
        &[
            challenge.as_bytes(),
            &input.seq_num.to_le_bytes(),
            &input.t_id.to_le_bytes(),
            &[input.sc_c],
            role,
            first_nqn.as_bytes(),
            &[0],
            second_nqn.as_bytes(),
        ],
    )
}
