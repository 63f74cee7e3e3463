//! Authentication messages: byte layouts, encoding and decoding.
//!
//! Every message starts with the same 6 bytes: AUTH_TYPE (0), AUTH_ID (1),
//! reserved (2..4), T_ID (4..6, little-endian). AUTH_TYPE 00h holds the
//! protocol-independent messages (AUTH_Negotiate, AUTH_Failure1/2), 01h the
//! DH-HMAC-CHAP ones.
//!
//! | message | layout |
//! |---------|--------|
//! | AUTH_Negotiate (00h/00h) | SC_C (6), NAPD (7), NAPD × 64-byte protocol descriptors (8..) |
//! | protocol descriptor | AUTHID (0) = 01h, reserved (1), HALEN (2), DHLEN (3), hash IDs (4..34), DH group IDs (34..64) |
//! | Challenge (01h/01h) | HL (6), reserved (7), HASHID (8), DHGID (9), DHVLEN (10..12), SEQNUM (12..16), C1 (16..16+HL), DH value |
//! | Reply (01h/02h) | HL (6), reserved (7), CVALID (8), reserved (9), DHVLEN (10..12), SEQNUM (12..16), R1 (HL), C2 (HL, zero unless CVALID), DH value |
//! | Success1 (01h/03h) | HL (6), reserved (7), RVALID (8), reserved (9..16), R2 (16..16+HL, zero unless RVALID) |
//! | Success2 (01h/04h) | reserved (6..16) |
//! | AUTH_Failure1 (00h/F1h), AUTH_Failure2 (00h/F0h) | REASON CODE (6), REASON CODE EXPLANATION (7) |
//!
//! Multi-byte fields are little-endian; challenge, response and DH values
//! are byte strings (DH values big-endian integers). Reserved bytes are
//! written as zero and ignored when read. Bytes after a message are
//! ignored: nvmet returns a whole AL-sized, zero-padded buffer.
//!
//! Every length a peer chooses is checked before anything is allocated: HL
//! must be a hash's output size (32, 48 or 64), HALEN and DHLEN at most 30,
//! NAPD at most [`MAX_PROTOCOL_DESCRIPTORS`], a DH value at most the
//! group's prime size (1024 bytes for ffdhe8192, [`MAX_DH_VALUE_LEN`] when
//! the group is not known yet), and the buffer must hold what the lengths
//! announce.

use std::fmt;

use crate::auth::crypto::HashValue;
use crate::auth::{DhGroup, HashId};
use crate::error::ProtoError;
use crate::wire::{get_u16, get_u32, put_u16, put_u32};

/// AUTH_TYPE values.
pub mod auth_type {
    /// Common (protocol independent) messages: Negotiate, Failure1/2.
    pub const COMMON: u8 = 0x00;
    /// DH-HMAC-CHAP messages.
    pub const DHCHAP: u8 = 0x01;
}

/// AUTH_ID values.
pub mod auth_id {
    /// AUTH_Negotiate (common).
    pub const NEGOTIATE: u8 = 0x00;
    /// DH-HMAC-CHAP_Challenge.
    pub const CHALLENGE: u8 = 0x01;
    /// DH-HMAC-CHAP_Reply.
    pub const REPLY: u8 = 0x02;
    /// DH-HMAC-CHAP_Success1.
    pub const SUCCESS1: u8 = 0x03;
    /// DH-HMAC-CHAP_Success2.
    pub const SUCCESS2: u8 = 0x04;
    /// AUTH_Failure2 (common; host to controller).
    pub const FAILURE2: u8 = 0xF0;
    /// AUTH_Failure1 (common; controller to host).
    pub const FAILURE1: u8 = 0xF1;
}

/// AUTHID of the DH-HMAC-CHAP protocol descriptor.
pub const AUTHID_DHCHAP: u8 = 0x01;

/// Size of one protocol descriptor in AUTH_Negotiate.
pub const PROTOCOL_DESCRIPTOR_LEN: usize = 64;

/// Entries in a descriptor's hash ID list and in its DH group ID list.
pub const MAX_IDS: usize = 30;

/// Most protocol descriptors accepted in one AUTH_Negotiate. Only
/// DH-HMAC-CHAP is defined, so a real host sends one (Linux does, and nvmet
/// rejects anything else); 16 leaves room without letting NAPD = 255 cost
/// 255 descriptors.
pub const MAX_PROTOCOL_DESCRIPTORS: usize = 16;

/// Largest DH value accepted before the group is known: ffdhe8192's 1024
/// bytes.
pub const MAX_DH_VALUE_LEN: usize = 1024;

/// Length of the common header every message has.
const HEADER_LEN: usize = 6;
/// Fixed part of Challenge, Reply, Success1 and Success2.
const DHCHAP_HEADER_LEN: usize = 16;
/// AUTH_Failure1/2 length.
const FAILURE_LEN: usize = 8;
/// Fixed part of AUTH_Negotiate.
const NEGOTIATE_HEADER_LEN: usize = 8;

/// REASON CODE 01h: authentication failure (the only one defined).
pub const REASON_AUTHENTICATION_FAILURE: u8 = 0x01;

/// REASON CODE EXPLANATION of AUTH_Failure1/2.
///
/// A newtype so that a received value this crate does not know still
/// round-trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailureExplanation(pub u8);

impl FailureExplanation {
    /// 01h: authentication failed (wrong response, missing key, ...).
    pub const FAILED: Self = Self(0x01);
    /// 02h: no offered authentication protocol is usable.
    pub const PROTOCOL_NOT_USABLE: Self = Self(0x02);
    /// 03h: secure channel concatenation mismatch.
    pub const SECURE_CHANNEL_MISMATCH: Self = Self(0x03);
    /// 04h: hash function not usable.
    pub const HASH_UNUSABLE: Self = Self(0x04);
    /// 05h: DH group not usable.
    pub const DHGROUP_UNUSABLE: Self = Self(0x05);
    /// 06h: incorrect payload (a field has a bad value).
    pub const INCORRECT_PAYLOAD: Self = Self(0x06);
    /// 07h: incorrect protocol message (unexpected message).
    pub const INCORRECT_PROTOCOL_MESSAGE: Self = Self(0x07);
}

impl fmt::Display for FailureExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Self::FAILED => "authentication failed",
            Self::PROTOCOL_NOT_USABLE => "authentication protocol not usable",
            Self::SECURE_CHANNEL_MISMATCH => "secure channel concatenation mismatch",
            Self::HASH_UNUSABLE => "hash function not usable",
            Self::DHGROUP_UNUSABLE => "DH group not usable",
            Self::INCORRECT_PAYLOAD => "incorrect payload",
            Self::INCORRECT_PROTOCOL_MESSAGE => "incorrect protocol message",
            _ => return write!(f, "explanation {:#04x}", self.0),
        };
        f.write_str(name)
    }
}

/// A received message is malformed or carries a value that is not
/// accepted. Says which field (named as in the specification), at which
/// byte offset of the message, and which explanation the Failure message
/// sent back should carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} in {message} (byte {offset}): {reason}")]
pub struct MessageError {
    /// Message being decoded (e.g. `"DH-HMAC-CHAP_Challenge"`).
    pub message: &'static str,
    /// Field name as in the specification (e.g. `"HL"`).
    pub field: &'static str,
    /// Byte offset of the field in the message.
    pub offset: usize,
    /// Why the value is rejected.
    pub reason: &'static str,
    /// What to put in the REASON CODE EXPLANATION sent back.
    pub explanation: FailureExplanation,
}

fn err(
    message: &'static str,
    field: &'static str,
    offset: usize,
    reason: &'static str,
    explanation: FailureExplanation,
) -> MessageError {
    MessageError {
        message,
        field,
        offset,
        reason,
        explanation,
    }
}

/// The buffer ends before the message does (incorrect payload).
fn truncated(message: &'static str, field: &'static str, offset: usize) -> MessageError {
    err(
        message,
        field,
        offset,
        "message ends before this field",
        FailureExplanation::INCORRECT_PAYLOAD,
    )
}

/// Check the buffer holds `needed` bytes; `field` is the first field past the end.
fn need(
    b: &[u8],
    needed: usize,
    message: &'static str,
    field: &'static str,
    offset: usize,
) -> Result<(), MessageError> {
    if b.len() < needed {
        return Err(truncated(message, field, offset));
    }
    Ok(())
}

fn unencodable(what: &'static str, reason: &'static str) -> ProtoError {
    ProtoError::Unencodable { what, reason }
}

/// Common header: AUTH_TYPE, AUTH_ID, reserved, T_ID.
fn put_header(b: &mut [u8], auth_type: u8, auth_id: u8, t_id: u16) {
    b[0] = auth_type;
    b[1] = auth_id;
    put_u16(b, 4, t_id);
}

/// HL: must be the output size of a hash this crate knows (checked before
/// HL is used to size anything).
fn hash_len(b: &[u8], message: &'static str) -> Result<usize, MessageError> {
    let hl = b[6] as usize;
    if HashId::from_len(hl).is_none() {
        return Err(err(
            message,
            "HL",
            6,
            "not the output size of SHA-256, SHA-384 or SHA-512",
            FailureExplanation::HASH_UNUSABLE,
        ));
    }
    Ok(hl)
}

/// A list of up to [`MAX_IDS`] one-byte identifiers, stored inline so that
/// decoding a Negotiate allocates nothing per list.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IdList {
    len: u8,
    ids: [u8; MAX_IDS],
}

impl IdList {
    /// A list of `ids`; `None` if there are more than [`MAX_IDS`].
    pub fn new(ids: &[u8]) -> Option<Self> {
        if ids.len() > MAX_IDS {
            return None;
        }
        let mut list = Self::default();
        list.ids[..ids.len()].copy_from_slice(ids);
        list.len = ids.len() as u8;
        Some(list)
    }

    /// The identifiers, in the sender's order.
    pub fn as_slice(&self) -> &[u8] {
        &self.ids[..self.len as usize]
    }

    /// Whether `id` is in the list.
    pub fn contains(&self, id: u8) -> bool {
        self.as_slice().contains(&id)
    }

    /// Number of identifiers.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for IdList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// One authentication protocol descriptor of AUTH_Negotiate.
///
/// For AUTHID 01h (DH-HMAC-CHAP) the lists are the offered hash and DH
/// group identifiers, unknown identifiers included (the receiver skips
/// them). For any other AUTHID the descriptor's content is undefined here:
/// the lists are left empty and the descriptor is encoded back as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtocolDescriptor {
    /// AUTHID: 01h for DH-HMAC-CHAP.
    pub auth_id: u8,
    /// HashIDList (HALEN entries).
    pub hash_ids: IdList,
    /// DHGIDList (DHLEN entries).
    pub dh_group_ids: IdList,
}

impl ProtocolDescriptor {
    /// A DH-HMAC-CHAP descriptor offering `hashes` and `groups` (at most
    /// [`MAX_IDS`] of each; the enums have fewer values, so this cannot
    /// overflow unless an entry repeats).
    pub fn dhchap(hashes: &[HashId], groups: &[DhGroup]) -> Option<Self> {
        let hashes: Vec<u8> = hashes.iter().map(|h| h.id()).collect();
        let groups: Vec<u8> = groups.iter().map(|g| g.id()).collect();
        Some(Self {
            auth_id: AUTHID_DHCHAP,
            hash_ids: IdList::new(&hashes)?,
            dh_group_ids: IdList::new(&groups)?,
        })
    }
}

/// AUTH_Negotiate (host → controller, Authentication Send).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Negotiate {
    /// T_ID: the transaction identifier every later message repeats.
    pub t_id: u16,
    /// SC_C: secure channel concatenation (00h: none, what Linux sends
    /// unless TLS concatenation is configured).
    pub sc_c: u8,
    /// The protocol descriptors (NAPD of them, 1 ..= [`MAX_PROTOCOL_DESCRIPTORS`]).
    pub descriptors: Vec<ProtocolDescriptor>,
}

impl Negotiate {
    const NAME: &'static str = "AUTH_Negotiate";

    /// What Linux's host sends: one DH-HMAC-CHAP descriptor offering
    /// SHA-256, SHA-384, SHA-512 and the null group then ffdhe2048 … 8192,
    /// no secure channel concatenation.
    pub fn linux_default(t_id: u16) -> Self {
        let descriptor =
            ProtocolDescriptor::dhchap(&HashId::ALL, &DhGroup::ALL).expect("9 identifiers fit");
        Self {
            t_id,
            sc_c: 0,
            descriptors: vec![descriptor],
        }
    }

    /// The first DH-HMAC-CHAP descriptor, if any.
    pub fn dhchap(&self) -> Option<&ProtocolDescriptor> {
        self.descriptors.iter().find(|d| d.auth_id == AUTHID_DHCHAP)
    }

    /// Length on the wire: 8 + 64 × NAPD.
    pub fn encoded_len(&self) -> usize {
        NEGOTIATE_HEADER_LEN + PROTOCOL_DESCRIPTOR_LEN * self.descriptors.len()
    }

    /// Encode. Fails without descriptors or with more than
    /// [`MAX_PROTOCOL_DESCRIPTORS`].
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        if self.descriptors.is_empty() || self.descriptors.len() > MAX_PROTOCOL_DESCRIPTORS {
            return Err(unencodable(
                Self::NAME,
                "NAPD must be 1 ..= MAX_PROTOCOL_DESCRIPTORS",
            ));
        }
        let mut b = vec![0u8; self.encoded_len()];
        put_header(&mut b, auth_type::COMMON, auth_id::NEGOTIATE, self.t_id);
        b[6] = self.sc_c;
        b[7] = self.descriptors.len() as u8;
        for (i, d) in self.descriptors.iter().enumerate() {
            let o = NEGOTIATE_HEADER_LEN + i * PROTOCOL_DESCRIPTOR_LEN;
            let desc = &mut b[o..o + PROTOCOL_DESCRIPTOR_LEN];
            desc[0] = d.auth_id;
            if d.auth_id == AUTHID_DHCHAP {
                desc[2] = d.hash_ids.len() as u8;
                desc[3] = d.dh_group_ids.len() as u8;
                desc[4..4 + d.hash_ids.len()].copy_from_slice(d.hash_ids.as_slice());
                let g = 4 + MAX_IDS;
                desc[g..g + d.dh_group_ids.len()].copy_from_slice(d.dh_group_ids.as_slice());
            }
        }
        Ok(b)
    }

    /// Decode. NAPD must be 1 ..= [`MAX_PROTOCOL_DESCRIPTORS`] and the
    /// buffer must hold all descriptors; a DH-HMAC-CHAP descriptor's HALEN
    /// and DHLEN must be at most 30. Whether a DH-HMAC-CHAP descriptor is
    /// present at all is for the controller to judge.
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        need(b, NEGOTIATE_HEADER_LEN, Self::NAME, "NAPD", 7)?;
        expect_ids(b, auth_type::COMMON, auth_id::NEGOTIATE, Self::NAME)?;
        let napd = b[7] as usize;
        if napd == 0 || napd > MAX_PROTOCOL_DESCRIPTORS {
            return Err(err(
                Self::NAME,
                "NAPD",
                7,
                "must be 1 ..= 16 protocol descriptors",
                FailureExplanation::INCORRECT_PAYLOAD,
            ));
        }
        need(
            b,
            NEGOTIATE_HEADER_LEN + napd * PROTOCOL_DESCRIPTOR_LEN,
            Self::NAME,
            "protocol descriptor",
            NEGOTIATE_HEADER_LEN,
        )?;
        let mut descriptors = Vec::with_capacity(napd);
        for i in 0..napd {
            let o = NEGOTIATE_HEADER_LEN + i * PROTOCOL_DESCRIPTOR_LEN;
            let desc = &b[o..o + PROTOCOL_DESCRIPTOR_LEN];
            let mut d = ProtocolDescriptor {
                auth_id: desc[0],
                hash_ids: IdList::default(),
                dh_group_ids: IdList::default(),
            };
            if d.auth_id == AUTHID_DHCHAP {
                let (halen, dhlen) = (desc[2] as usize, desc[3] as usize);
                if halen > MAX_IDS {
                    return Err(err(
                        Self::NAME,
                        "HALEN",
                        o + 2,
                        "more than 30 hash identifiers",
                        FailureExplanation::INCORRECT_PAYLOAD,
                    ));
                }
                if dhlen > MAX_IDS {
                    return Err(err(
                        Self::NAME,
                        "DHLEN",
                        o + 3,
                        "more than 30 DH group identifiers",
                        FailureExplanation::INCORRECT_PAYLOAD,
                    ));
                }
                d.hash_ids = IdList::new(&desc[4..4 + halen]).expect("checked above");
                let g = 4 + MAX_IDS;
                d.dh_group_ids = IdList::new(&desc[g..g + dhlen]).expect("checked above");
            }
            descriptors.push(d);
        }
        Ok(Self {
            t_id: get_u16(b, 4),
            sc_c: b[6],
            descriptors,
        })
    }
}

/// DH-HMAC-CHAP_Challenge (controller → host, Authentication Receive).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Challenge {
    /// T_ID of the transaction.
    pub t_id: u16,
    /// HASHID: the hash the controller chose; HL is its output size.
    pub hash: HashId,
    /// DHGID: the DH group the controller chose.
    pub dh_group: DhGroup,
    /// SEQNUM: S1, hashed into the host's response.
    pub seq_num: u32,
    /// C1, HL bytes.
    pub challenge: HashValue,
    /// The controller's DH value g^y mod p (empty for the null group).
    pub dh_value: Vec<u8>,
}

impl Challenge {
    const NAME: &'static str = "DH-HMAC-CHAP_Challenge";

    /// Length on the wire: 16 + HL + DHVLEN.
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + self.hash.output_len() + self.dh_value.len()
    }

    /// Encode. Fails if C1 is not HL bytes or the DH value does not suit
    /// the group (empty for null, 1 ..= the prime's size otherwise).
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let hl = self.hash.output_len();
        if self.challenge.len() != hl {
            return Err(unencodable(Self::NAME, "C1 is not HL bytes"));
        }
        check_dh_len_for_encode(self.dh_group, self.dh_value.len(), Self::NAME)?;
        let mut b = vec![0u8; self.encoded_len()];
        put_header(&mut b, auth_type::DHCHAP, auth_id::CHALLENGE, self.t_id);
        b[6] = hl as u8;
        b[8] = self.hash.id();
        b[9] = self.dh_group.id();
        put_u16(&mut b, 10, self.dh_value.len() as u16);
        put_u32(&mut b, 12, self.seq_num);
        b[16..16 + hl].copy_from_slice(self.challenge.as_bytes());
        b[16 + hl..].copy_from_slice(&self.dh_value);
        Ok(b)
    }

    /// Decode. HASHID and DHGID must be known, HL must be HASHID's output
    /// size, DHVLEN must be 0 for the null group and 1 ..= the prime's size
    /// otherwise, and the buffer must hold C1 and the DH value.
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        const N: &str = Challenge::NAME;
        need(b, DHCHAP_HEADER_LEN, N, "SEQNUM", 12)?;
        expect_ids(b, auth_type::DHCHAP, auth_id::CHALLENGE, N)?;
        let hash = HashId::from_id(b[8]).ok_or_else(|| {
            err(
                N,
                "HASHID",
                8,
                "unknown hash function",
                FailureExplanation::HASH_UNUSABLE,
            )
        })?;
        if b[6] as usize != hash.output_len() {
            return Err(err(
                N,
                "HL",
                6,
                "not the output size of HASHID",
                FailureExplanation::HASH_UNUSABLE,
            ));
        }
        let dh_group = DhGroup::from_id(b[9]).ok_or_else(|| {
            err(
                N,
                "DHGID",
                9,
                "unknown DH group",
                FailureExplanation::DHGROUP_UNUSABLE,
            )
        })?;
        let dhvlen = get_u16(b, 10) as usize;
        check_dh_len_for_decode(dh_group, dhvlen, N, 10)?;
        let hl = hash.output_len();
        need(b, DHCHAP_HEADER_LEN + hl, N, "C1", 16)?;
        need(b, DHCHAP_HEADER_LEN + hl + dhvlen, N, "DHV", 16 + hl)?;
        Ok(Self {
            t_id: get_u16(b, 4),
            hash,
            dh_group,
            seq_num: get_u32(b, 12),
            challenge: HashValue::new(&b[16..16 + hl]).expect("HL ≤ 64"),
            dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
        })
    }
}

fn check_dh_len_for_encode(
    group: DhGroup,
    len: usize,
    what: &'static str,
) -> Result<(), ProtoError> {
    if group.is_null() && len != 0 {
        return Err(unencodable(what, "null DH group with a DH value"));
    }
    if !group.is_null() && (len == 0 || len > group.value_len()) {
        return Err(unencodable(
            what,
            "DH value must be 1 ..= the group's prime size",
        ));
    }
    Ok(())
}

/// DHVLEN against the group: 0 for null (Linux: incorrect payload), 1 ..=
/// the prime size otherwise (0 is "DH group unusable" as Linux says,
/// longer is incorrect payload).
fn check_dh_len_for_decode(
    group: DhGroup,
    len: usize,
    message: &'static str,
    offset: usize,
) -> Result<(), MessageError> {
    if group.is_null() {
        if len != 0 {
            return Err(err(
                message,
                "DHVLEN",
                offset,
                "a DH value with the null DH group",
                FailureExplanation::INCORRECT_PAYLOAD,
            ));
        }
    } else if len == 0 {
        return Err(err(
            message,
            "DHVLEN",
            offset,
            "no DH value with a non-null DH group",
            FailureExplanation::DHGROUP_UNUSABLE,
        ));
    } else if len > group.value_len() {
        return Err(err(
            message,
            "DHVLEN",
            offset,
            "DH value longer than the group's prime",
            FailureExplanation::INCORRECT_PAYLOAD,
        ));
    }
    Ok(())
}

/// DH-HMAC-CHAP_Reply (host → controller, Authentication Send).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reply {
    /// T_ID of the transaction.
    pub t_id: u16,
    /// R1, the host's response; its length is HL.
    pub response: HashValue,
    /// C2 when the host asks the controller to authenticate itself
    /// (CVALID = 01h); HL bytes.
    pub ctrl_challenge: Option<HashValue>,
    /// SEQNUM: S2 (0 when the controller is not to authenticate itself).
    pub seq_num: u32,
    /// The host's DH value g^x mod p (empty for the null group).
    pub dh_value: Vec<u8>,
}

impl Reply {
    const NAME: &'static str = "DH-HMAC-CHAP_Reply";

    /// Length on the wire: 16 + 2 × HL + DHVLEN (the C2 field is present
    /// even when CVALID is 0, zero-filled, as Linux sends it).
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + 2 * self.response.len() + self.dh_value.len()
    }

    /// Encode. Fails if R1 is not a hash size, C2 is not as long as R1, or
    /// the DH value is longer than [`MAX_DH_VALUE_LEN`].
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let hl = self.response.len();
        if HashId::from_len(hl).is_none() {
            return Err(unencodable(Self::NAME, "R1 is not a hash output size"));
        }
        if self.ctrl_challenge.as_ref().is_some_and(|c| c.len() != hl) {
            return Err(unencodable(Self::NAME, "C2 is not HL bytes"));
        }
        if self.dh_value.len() > MAX_DH_VALUE_LEN {
            return Err(unencodable(Self::NAME, "DH value longer than 1024 bytes"));
        }
        let mut b = vec![0u8; self.encoded_len()];
        put_header(&mut b, auth_type::DHCHAP, auth_id::REPLY, self.t_id);
        b[6] = hl as u8;
        b[8] = self.ctrl_challenge.is_some() as u8;
        put_u16(&mut b, 10, self.dh_value.len() as u16);
        put_u32(&mut b, 12, self.seq_num);
        b[16..16 + hl].copy_from_slice(self.response.as_bytes());
        if let Some(c2) = &self.ctrl_challenge {
            b[16 + hl..16 + 2 * hl].copy_from_slice(c2.as_bytes());
        }
        b[16 + 2 * hl..].copy_from_slice(&self.dh_value);
        Ok(b)
    }

    /// Decode. HL must be a hash output size, CVALID 0 or 1, DHVLEN at most
    /// [`MAX_DH_VALUE_LEN`] (the controller then checks both against what
    /// it chose), and the buffer must hold R1, C2 and the DH value.
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        const N: &str = Reply::NAME;
        need(b, DHCHAP_HEADER_LEN, N, "SEQNUM", 12)?;
        expect_ids(b, auth_type::DHCHAP, auth_id::REPLY, N)?;
        let hl = hash_len(b, N)?;
        let cvalid = match b[8] {
            0 => false,
            1 => true,
            _ => {
                return Err(err(
                    N,
                    "CVALID",
                    8,
                    "must be 00h or 01h",
                    FailureExplanation::INCORRECT_PAYLOAD,
                ))
            }
        };
        let dhvlen = get_u16(b, 10) as usize;
        if dhvlen > MAX_DH_VALUE_LEN {
            return Err(err(
                N,
                "DHVLEN",
                10,
                "DH value longer than ffdhe8192's 1024 bytes",
                FailureExplanation::INCORRECT_PAYLOAD,
            ));
        }
        need(b, DHCHAP_HEADER_LEN + hl, N, "RVAL", 16)?;
        need(b, DHCHAP_HEADER_LEN + 2 * hl, N, "CVAL", 16 + hl)?;
        need(
            b,
            DHCHAP_HEADER_LEN + 2 * hl + dhvlen,
            N,
            "DHV",
            16 + 2 * hl,
        )?;
        let start = DHCHAP_HEADER_LEN + 2 * hl;
        Ok(Self {
            t_id: get_u16(b, 4),
            response: HashValue::new(&b[16..16 + hl]).expect("HL ≤ 64"),
            ctrl_challenge: cvalid
                .then(|| HashValue::new(&b[16 + hl..16 + 2 * hl]).expect("HL ≤ 64")),
            seq_num: get_u32(b, 12),
            dh_value: b[start..start + dhvlen].to_vec(),
        })
    }
}

/// DH-HMAC-CHAP_Success1 (controller → host, Authentication Receive).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Success1 {
    /// T_ID of the transaction.
    pub t_id: u16,
    /// HL: the chosen hash's output size.
    pub hash_len: u8,
    /// R2, the controller's response (RVALID = 01h), HL bytes.
    pub response: Option<HashValue>,
}

impl Success1 {
    const NAME: &'static str = "DH-HMAC-CHAP_Success1";

    /// Length on the wire: 16 + HL. The R2 field is always there, zeroed
    /// when RVALID is 0 ("Response R2, if valid, cleared to 0h otherwise";
    /// Linux has read it so since 6.7).
    pub fn encoded_len(&self) -> usize {
        DHCHAP_HEADER_LEN + self.hash_len as usize
    }

    /// Encode. Fails if HL is not a hash size or R2 is not HL bytes.
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let hl = self.hash_len as usize;
        if HashId::from_len(hl).is_none() {
            return Err(unencodable(Self::NAME, "HL is not a hash output size"));
        }
        if self.response.as_ref().is_some_and(|r| r.len() != hl) {
            return Err(unencodable(Self::NAME, "R2 is not HL bytes"));
        }
        let mut b = vec![0u8; self.encoded_len()];
        put_header(&mut b, auth_type::DHCHAP, auth_id::SUCCESS1, self.t_id);
        b[6] = self.hash_len;
        if let Some(r2) = &self.response {
            b[8] = 1;
            b[16..16 + hl].copy_from_slice(r2.as_bytes());
        }
        Ok(b)
    }

    /// Decode. HL must be a hash output size and RVALID 0 or 1; R2 must be
    /// in the buffer when RVALID is 1 (a 16-byte Success1 without R2 is
    /// accepted, as older nvmet sized it).
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        const N: &str = Success1::NAME;
        need(b, DHCHAP_HEADER_LEN, N, "reserved", 9)?;
        expect_ids(b, auth_type::DHCHAP, auth_id::SUCCESS1, N)?;
        let hl = hash_len(b, N)?;
        let response = match b[8] {
            0 => None,
            1 => {
                need(b, DHCHAP_HEADER_LEN + hl, N, "RVAL", 16)?;
                Some(HashValue::new(&b[16..16 + hl]).expect("HL ≤ 64"))
            }
            _ => {
                return Err(err(
                    N,
                    "RVALID",
                    8,
                    "must be 00h or 01h",
                    FailureExplanation::INCORRECT_PAYLOAD,
                ))
            }
        };
        Ok(Self {
            t_id: get_u16(b, 4),
            hash_len: hl as u8,
            response,
        })
    }
}

/// DH-HMAC-CHAP_Success2 (host → controller, Authentication Send; only
/// after bidirectional authentication).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Success2 {
    /// T_ID of the transaction.
    pub t_id: u16,
}

impl Success2 {
    const NAME: &'static str = "DH-HMAC-CHAP_Success2";

    /// Length on the wire.
    pub const LEN: usize = DHCHAP_HEADER_LEN;

    /// Encode (16 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        put_header(&mut b, auth_type::DHCHAP, auth_id::SUCCESS2, self.t_id);
        b
    }

    /// Decode.
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        need(b, Self::LEN, Self::NAME, "reserved", HEADER_LEN)?;
        expect_ids(b, auth_type::DHCHAP, auth_id::SUCCESS2, Self::NAME)?;
        Ok(Self {
            t_id: get_u16(b, 4),
        })
    }
}

/// AUTH_Failure1 (controller → host) or AUTH_Failure2 (host →
/// controller): same layout, different AUTH_ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Failure {
    /// T_ID of the transaction.
    pub t_id: u16,
    /// REASON CODE: [`REASON_AUTHENTICATION_FAILURE`].
    pub reason_code: u8,
    /// REASON CODE EXPLANATION.
    pub explanation: FailureExplanation,
}

impl Failure {
    /// Length on the wire (`struct nvmf_auth_dhchap_failure_data`).
    pub const LEN: usize = FAILURE_LEN;

    /// An authentication failure with `explanation`.
    pub const fn new(t_id: u16, explanation: FailureExplanation) -> Self {
        Self {
            t_id,
            reason_code: REASON_AUTHENTICATION_FAILURE,
            explanation,
        }
    }

    fn encode_as(&self, id: u8) -> Vec<u8> {
        let mut b = vec![0u8; Self::LEN];
        put_header(&mut b, auth_type::COMMON, id, self.t_id);
        b[6] = self.reason_code;
        b[7] = self.explanation.0;
        b
    }

    fn decode_as(b: &[u8], id: u8, name: &'static str) -> Result<Self, MessageError> {
        need(b, Self::LEN, name, "REASON CODE EXPLANATION", 7)?;
        expect_ids(b, auth_type::COMMON, id, name)?;
        Ok(Self {
            t_id: get_u16(b, 4),
            reason_code: b[6],
            explanation: FailureExplanation(b[7]),
        })
    }
}

/// Check AUTH_TYPE and AUTH_ID (the caller dispatched on them, or decodes
/// one message type directly).
fn expect_ids(b: &[u8], ty: u8, id: u8, message: &'static str) -> Result<(), MessageError> {
    if b[0] != ty {
        return Err(err(
            message,
            "AUTH_TYPE",
            0,
            "not this message's type",
            FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
        ));
    }
    if b[1] != id {
        return Err(err(
            message,
            "AUTH_ID",
            1,
            "not this message's identifier",
            FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
        ));
    }
    Ok(())
}

/// Any authentication message, by AUTH_TYPE and AUTH_ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AuthMessage {
    /// AUTH_Negotiate.
    Negotiate(Negotiate),
    /// DH-HMAC-CHAP_Challenge.
    Challenge(Challenge),
    /// DH-HMAC-CHAP_Reply.
    Reply(Reply),
    /// DH-HMAC-CHAP_Success1.
    Success1(Success1),
    /// DH-HMAC-CHAP_Success2.
    Success2(Success2),
    /// AUTH_Failure1 (controller → host).
    Failure1(Failure),
    /// AUTH_Failure2 (host → controller).
    Failure2(Failure),
}

impl AuthMessage {
    /// Decode whichever message `b` holds. An unknown AUTH_TYPE or AUTH_ID
    /// is an "incorrect protocol message"; trailing bytes are ignored.
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        const N: &str = "authentication message";
        need(b, HEADER_LEN, N, "T_ID", 4)?;
        Ok(match (b[0], b[1]) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => Self::Negotiate(Negotiate::decode(b)?),
            (auth_type::COMMON, auth_id::FAILURE1) => {
                Self::Failure1(Failure::decode_as(b, auth_id::FAILURE1, "AUTH_Failure1")?)
            }
            (auth_type::COMMON, auth_id::FAILURE2) => {
                Self::Failure2(Failure::decode_as(b, auth_id::FAILURE2, "AUTH_Failure2")?)
            }
            (auth_type::DHCHAP, auth_id::CHALLENGE) => Self::Challenge(Challenge::decode(b)?),
            (auth_type::DHCHAP, auth_id::REPLY) => Self::Reply(Reply::decode(b)?),
            (auth_type::DHCHAP, auth_id::SUCCESS1) => Self::Success1(Success1::decode(b)?),
            (auth_type::DHCHAP, auth_id::SUCCESS2) => Self::Success2(Success2::decode(b)?),
            (auth_type::COMMON | auth_type::DHCHAP, _) => {
                return Err(err(
                    N,
                    "AUTH_ID",
                    1,
                    "unknown message identifier",
                    FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
                ))
            }
            _ => {
                return Err(err(
                    N,
                    "AUTH_TYPE",
                    0,
                    "unknown message type",
                    FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
                ))
            }
        })
    }

    /// Encode. Fails only for values that do not fit the layout (see each
    /// message's `encode`).
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        match self {
            Self::Negotiate(m) => m.encode(),
            Self::Challenge(m) => m.encode(),
            Self::Reply(m) => m.encode(),
            Self::Success1(m) => m.encode(),
            Self::Success2(m) => Ok(m.encode()),
            Self::Failure1(m) => Ok(m.encode_as(auth_id::FAILURE1)),
            Self::Failure2(m) => Ok(m.encode_as(auth_id::FAILURE2)),
        }
    }

    /// T_ID.
    pub fn t_id(&self) -> u16 {
        match self {
            Self::Negotiate(m) => m.t_id,
            Self::Challenge(m) => m.t_id,
            Self::Reply(m) => m.t_id,
            Self::Success1(m) => m.t_id,
            Self::Success2(m) => m.t_id,
            Self::Failure1(m) | Self::Failure2(m) => m.t_id,
        }
    }

    /// The message's name in the specification.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Negotiate(_) => Negotiate::NAME,
            Self::Challenge(_) => Challenge::NAME,
            Self::Reply(_) => Reply::NAME,
            Self::Success1(_) => Success1::NAME,
            Self::Success2(_) => Success2::NAME,
            Self::Failure1(_) => "AUTH_Failure1",
            Self::Failure2(_) => "AUTH_Failure2",
        }
    }
}
