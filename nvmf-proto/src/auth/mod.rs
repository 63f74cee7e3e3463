//! NVMe in-band authentication with DH-HMAC-CHAP (NVMe Base Specification
//! 2.x, "Authentication", formerly TP 8006), sans-IO.
//!
//! - [`message`]: the AUTH_Negotiate, DH-HMAC-CHAP_Challenge, _Reply,
//!   _Success1, _Success2, AUTH_Failure1 and _Failure2 messages, their byte
//!   layouts, and a decode error ([`MessageError`]) that says which field is
//!   wrong and which failure reason to send back.
//! - [`secret`]: the `DHHC-1:xx:<base64>:` secret representation that
//!   `nvme gen-dhchap-key` prints, and the key transformation.
//! - [`crypto`]: HMAC, the augmented challenge, and the host and controller
//!   responses, computed as Linux computes them.
//! - [`dh`]: the RFC 7919 FFDHE groups, key generation, public value
//!   validation and the shared secret.
//! - [`HostAuth`] and [`CtrlAuth`]: the two sides of one transaction, as
//!   state machines fed with received messages.
//!
//! The Fabrics commands that carry the messages are
//! [`crate::fabrics::AuthenticationSend`] and
//! [`crate::fabrics::AuthenticationReceive`]; the Connect response's AUTHREQ
//! field is [`crate::fabrics::AuthReq`].
//!
//! # Who sends what
//!
//! Every message travels in the data of a Fabrics command the *host*
//! issues; the controller only ever answers an Authentication Receive.
//!
//! | step | message | command (issued by the host) | length field |
//! |------|---------|------------------------------|--------------|
//! | 1 | AUTH_Negotiate (host → ctrl) | Authentication Send | TL = 8 + 64 × NAPD (72 from Linux) |
//! | 2 | DH-HMAC-CHAP_Challenge (ctrl → host) | Authentication Receive | AL = [`HOST_RECEIVE_AL`] (4096) |
//! | 3 | DH-HMAC-CHAP_Reply (host → ctrl) | Authentication Send | TL = 16 + 2 × HL + DHVLEN |
//! | 4 | DH-HMAC-CHAP_Success1 (ctrl → host) | Authentication Receive | AL = 4096 |
//! | 5 | DH-HMAC-CHAP_Success2 (host → ctrl), bidirectional only | Authentication Send | TL = 16 |
//! | – | AUTH_Failure1 (ctrl → host), instead of 2 or 4 | Authentication Receive | AL = 4096 |
//! | – | AUTH_Failure2 (host → ctrl), after a check failed on the host | Authentication Send | TL = 8 |
//!
//! All commands use SECP = E9h, SPSP0 = 01h, SPSP1 = 01h (what Linux sends
//! and what Linux nvmet requires). A controller answers a Receive with the
//! message zero-padded up to min(AL, [`MAX_MESSAGE_LEN`]) bytes, as nvmet
//! does; decoders here ignore bytes after the message.
//!
//! A controller that wants authentication sets ATR in the Connect
//! response's AUTHREQ ([`crate::fabrics::AuthReq`]), on the admin queue and
//! on every I/O queue; Linux then authenticates each queue with its own
//! transaction (its own T_ID), and the controller fails every other command
//! on that queue with Authentication Required (`Status::AUTHENTICATION_REQUIRED`)
//! until the queue is authenticated.
//!
//! # Driving a transaction
//!
//! ```
//! use std::sync::Arc;
//! use nvmf_proto::auth::{
//!     CtrlAuth, CtrlAuthConfig, CtrlProgress, DhGroup, DhchapSecret, HostAuth, HostAuthConfig,
//!     HostNext,
//! };
//! use nvmf_proto::fabrics::{AuthenticationReceive, AuthenticationSend};
//!
//! let host_nqn = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
//! let subnqn = "nqn.2024-05.io.gimbal:disk1";
//! // What `nvme gen-dhchap-key` printed, given to both sides.
//! let key: DhchapSecret = "DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9YjiZe:".parse()?;
//!
//! // Target: per host, after a Connect answered with AuthReq::ATR.
//! let cfg = CtrlAuthConfig::new(host_nqn, subnqn, key.clone()).with_dh_groups(&[DhGroup::Null]);
//! let mut ctrl = CtrlAuth::new(Arc::new(cfg), 0)?;
//!
//! // Initiator: on the same queue, with a fresh transaction ID.
//! let mut host = HostAuth::new(Arc::new(HostAuthConfig::new(host_nqn, subnqn, key)), 0, 1)?;
//! let mut step = host.start();
//! let authenticated = loop {
//!     if let Some(message) = step.send.take() {
//!         // Host: Authentication Send, TL = message length, data in-capsule.
//!         let sqe = AuthenticationSend::dhchap(message.len() as u32).to_sqe(1);
//!         // Target: check the SQE, then feed the data.
//!         AuthenticationSend::from_sqe(&sqe)?.check_dhchap()?;
//!         let _progress = ctrl.on_send(&message);
//!     }
//!     match step.next {
//!         HostNext::Receive { al } => {
//!             // Host: Authentication Receive with AL = 4096.
//!             let sqe = AuthenticationReceive::dhchap(al).to_sqe(2);
//!             let cmd = AuthenticationReceive::from_sqe(&sqe)?;
//!             cmd.check_dhchap()?;
//!             // Target: return `data` in C2HData (an AL too small for the
//!             // message is an Invalid Field in Command).
//!             let reply = ctrl.on_receive(cmd.al).expect("AL is large enough");
//!             if let CtrlProgress::Authenticated(a) = &reply.progress {
//!                 assert!(!a.bidirectional); // the target may now serve the queue
//!             }
//!             step = host.receive(&reply.data);
//!         }
//!         HostNext::Done(a) => break a,
//!         HostNext::Failed(e) => panic!("{e}"),
//!     }
//! };
//! assert_eq!(authenticated.dh_group, DhGroup::Null);
//! assert!(ctrl.is_authenticated());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Decisions where the specification or Linux leave room
//!
//! - **Hash and group choice.** [`CtrlAuth`] picks the first entry of its
//!   configured list that the host offered, and fails with "hash function
//!   unusable" / "DH group unusable" otherwise. Linux nvmet instead falls
//!   back to the host's first valid hash when its configured one is not
//!   offered, and its DH group loop keeps the configured group whenever the
//!   host offers *any* other group (the comparison in `nvmet_auth_negotiate`
//!   is inverted), so nvmet may challenge with a group the host did not
//!   offer. [`HostAuth`] rejects a challenge that names a hash or group it
//!   did not offer; the Linux host only rejects ids it does not know. With
//!   the Linux host's full offer (all three hashes, all six groups) these
//!   differences never show.
//! - **Bidirectional authentication is enforced.** A host that sent C2 and
//!   receives a Success1 without a response (RVALID = 0) fails and sends
//!   Failure2. The Linux host accepts such a Success1 (it only checks R2
//!   when RVALID is set), which lets a controller skip proving itself.
//! - **Transformed key length.** The HMAC key is the whole transformed key
//!   (the transform hash's output). Linux before the 2024 rework keyed the
//!   HMAC with the *secret's* length instead, which differs only for a
//!   secret whose length does not match its transform hash (e.g. a 32-byte
//!   key tagged 03/SHA-512); `nvme gen-dhchap-key` never writes such keys,
//!   and [`secret::DhchapSecret::generate`] refuses to.
//! - **DH values** are big-endian and exactly as long as the group's prime
//!   when this crate writes them (what Linux writes, and the form that is
//!   hashed into the session key); shorter received values are accepted as
//!   the same integer, longer ones are rejected before anything is
//!   allocated. Received values must satisfy 1 < y < p − 1 (for a safe
//!   prime that excludes the only small subgroup, {1, p − 1}).
//! - **Secure channel concatenation** (SC_C ≠ 0) is not implemented: the
//!   host always sends SC_C = 0 and the controller answers any other value
//!   with "secure channel concatenation mismatch", as nvmet built without
//!   TLS does.
//! - **Failure reason explanations** follow the side of Linux that detects
//!   the same problem, except T_ID mismatches (incorrect payload on both
//!   sides; the Linux host says incorrect message) and bad DH values
//!   (incorrect payload; nvmet says DH group unusable). The explanation is
//!   informational: neither side's behaviour depends on it.

pub mod crypto;
mod ctrl;
pub mod dh;
mod host;
pub mod message;
pub mod secret;

use std::fmt;
use std::str::FromStr;

use zeroize::Zeroizing;

pub use crypto::HashValue;
pub use ctrl::{CtrlAuth, CtrlAuthConfig, CtrlProgress, CtrlReceive, ReceiveError};
pub use host::{HostAuth, HostAuthConfig, HostNext, HostStep};
pub use message::{AuthMessage, FailureExplanation, MessageError};
pub use secret::{DhchapSecret, SecretError, TransformedKey};

/// Allocation length the host uses for every Authentication Receive, and
/// what Linux's host uses (`CHAP_BUF_SIZE`): enough for a Challenge with an
/// ffdhe8192 value (16 + 64 + 1024 bytes).
pub const HOST_RECEIVE_AL: u32 = 4096;

/// Largest message this crate writes or accepts, and the budget for TL
/// and for the bytes a controller returns for an Authentication Receive.
/// The largest real message is a Reply with SHA-512 and ffdhe8192
/// (16 + 2 × 64 + 1024 = 1168 bytes); 4096 matches Linux's buffer.
pub const MAX_MESSAGE_LEN: u32 = 4096;

/// Longest NQN, in bytes (NVMe Base Specification: 223 bytes of UTF-8).
pub const MAX_NQN_LEN: usize = 223;

/// Hash function identifiers (HashID), as used in the Negotiate hash list,
/// the Challenge's HASHID and the secret representation's transform field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashId {
    /// 01h: SHA-256, 32-byte values.
    Sha256 = 1,
    /// 02h: SHA-384, 48-byte values.
    Sha384 = 2,
    /// 03h: SHA-512, 64-byte values.
    Sha512 = 3,
}

impl HashId {
    /// Every hash, in the order Linux offers them.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// From the wire identifier; `None` for unknown identifiers.
    pub const fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha384),
            3 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// The wire identifier.
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// Output size in bytes: the HL of every message using this hash.
    pub const fn output_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }

    /// The hash whose output is `len` bytes, if any.
    pub const fn from_len(len: usize) -> Option<Self> {
        match len {
            32 => Some(Self::Sha256),
            48 => Some(Self::Sha384),
            64 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// Name as in Linux's tables (`sha256`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
        }
    }

    /// Name of the HMAC as nvmet's configfs `dhchap_hash` shows it
    /// (`hmac(sha256)`).
    pub const fn hmac_name(self) -> &'static str {
        match self {
            Self::Sha256 => "hmac(sha256)",
            Self::Sha384 => "hmac(sha384)",
            Self::Sha512 => "hmac(sha512)",
        }
    }
}

impl fmt::Display for HashId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hmac_name())
    }
}

impl FromStr for HashId {
    type Err = UnknownName;

    /// Accepts `sha256` or `hmac(sha256)` (nvmet's spelling), and the same
    /// for SHA-384 and SHA-512.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|h| s == h.name() || s == h.hmac_name())
            .ok_or(UnknownName("hash"))
    }
}

/// Diffie-Hellman group identifiers (DHGID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DhGroup {
    /// 00h: no Diffie-Hellman exchange (plain HMAC-CHAP).
    Null = 0,
    /// 01h: RFC 7919 ffdhe2048.
    Ffdhe2048 = 1,
    /// 02h: RFC 7919 ffdhe3072.
    Ffdhe3072 = 2,
    /// 03h: RFC 7919 ffdhe4096.
    Ffdhe4096 = 3,
    /// 04h: RFC 7919 ffdhe6144.
    Ffdhe6144 = 4,
    /// 05h: RFC 7919 ffdhe8192.
    Ffdhe8192 = 5,
}

impl DhGroup {
    /// Every group, in the order Linux offers them.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// From the wire identifier; `None` for unknown identifiers.
    pub const fn from_id(id: u8) -> Option<Self> {
        match id {
            0 => Some(Self::Null),
            1 => Some(Self::Ffdhe2048),
            2 => Some(Self::Ffdhe3072),
            3 => Some(Self::Ffdhe4096),
            4 => Some(Self::Ffdhe6144),
            5 => Some(Self::Ffdhe8192),
            _ => None,
        }
    }

    /// The wire identifier.
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// Size of the group's prime in bytes: the length of every DH value
    /// this crate writes, and the most it accepts (0 for the null group).
    pub const fn value_len(self) -> usize {
        match self {
            Self::Null => 0,
            Self::Ffdhe2048 => 256,
            Self::Ffdhe3072 => 384,
            Self::Ffdhe4096 => 512,
            Self::Ffdhe6144 => 768,
            Self::Ffdhe8192 => 1024,
        }
    }

    /// Whether a Diffie-Hellman exchange takes place.
    pub const fn is_null(self) -> bool {
        matches!(self, Self::Null)
    }

    /// Name as in Linux and nvmet's configfs `dhchap_dhgroup` (`ffdhe2048`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Ffdhe2048 => "ffdhe2048",
            Self::Ffdhe3072 => "ffdhe3072",
            Self::Ffdhe4096 => "ffdhe4096",
            Self::Ffdhe6144 => "ffdhe6144",
            Self::Ffdhe8192 => "ffdhe8192",
        }
    }
}

impl fmt::Display for DhGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DhGroup {
    type Err = UnknownName;

    /// Accepts `null` and `ffdhe2048` … `ffdhe8192`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|g| s == g.name())
            .ok_or(UnknownName("DH group"))
    }
}

/// A hash or DH group name that is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown {0} name")]
pub struct UnknownName(&'static str);

/// Where the random bytes come from: challenges, sequence numbers and DH
/// private keys. [`OsRandom`] in production; tests inject their own to be
/// deterministic.
pub trait RandomSource: Send {
    /// Fill `buf` with random bytes.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), RandomError>;
}

/// The operating system's random number generator (`getrandom`).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), RandomError> {
        getrandom::fill(buf).map_err(|_| RandomError)
    }
}

/// The random source failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("random number generator failed")]
pub struct RandomError;

/// A random nonzero 32-bit sequence number. Zero is avoided because a zero
/// SEQNUM in a Reply means "no bidirectional authentication".
pub(crate) fn random_seq_num(rng: &mut dyn RandomSource) -> Result<u32, RandomError> {
    loop {
        let mut b = [0u8; 4];
        rng.fill(&mut b)?;
        let v = u32::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}

/// The outcome of a successful transaction.
#[derive(Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// Hash function used.
    pub hash: HashId,
    /// Diffie-Hellman group used.
    pub dh_group: DhGroup,
    /// Whether the controller authenticated itself too.
    pub bidirectional: bool,
    /// The Diffie-Hellman session key, when a group other than null was used.
    pub session_key: Option<SessionKey>,
}

impl fmt::Debug for Authenticated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticated")
            .field("hash", &self.hash)
            .field("dh_group", &self.dh_group)
            .field("bidirectional", &self.bidirectional)
            .field(
                "session_key",
                &self.session_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The Diffie-Hellman shared value g^xy mod p, big-endian, as long as the
/// group's prime (leading zeros kept). Linux hashes exactly this form into
/// the augmented challenge, and passes it as the key to its TLS PSK
/// derivation. Zeroized on drop; `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKey {
    bytes: Zeroizing<Vec<u8>>,
}

impl SessionKey {
    pub(crate) fn new(bytes: Zeroizing<Vec<u8>>) -> Self {
        Self { bytes }
    }

    /// The shared value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// H(g^xy mod p) with `hash`: the HMAC key of the augmented challenge.
    pub fn hashed(&self, hash: HashId) -> HashValue {
        crypto::digest(hash, &self.bytes)
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey(<{} bytes redacted>)", self.bytes.len())
    }
}

/// Why a transaction failed. [`AuthError::explanation`] is the reason code
/// explanation to put in the AUTH_Failure1/Failure2 this side sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A received message is malformed, or carries a value this side does
    /// not accept.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The peer sent AUTH_Failure1 (to a host) or AUTH_Failure2 (to a
    /// controller).
    #[error("peer reported authentication failure: reason code {reason_code:#04x}, {explanation}")]
    PeerFailure {
        /// REASON CODE (01h: authentication failure).
        reason_code: u8,
        /// REASON CODE EXPLANATION.
        explanation: FailureExplanation,
    },
    /// A message arrived that is not the one this step expects.
    #[error("unexpected {got} while waiting for {expected}")]
    UnexpectedMessage {
        /// What this side waits for.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// The message's T_ID is not the transaction's.
    #[error("transaction ID {got:#06x} does not match {expected:#06x}")]
    TransactionId {
        /// This transaction's T_ID.
        expected: u16,
        /// The received T_ID.
        got: u16,
    },
    /// The peer chose, or offered only, hash functions this side does not
    /// allow.
    #[error("no usable hash function")]
    HashUnusable,
    /// The peer chose, or offered only, DH groups this side does not allow.
    #[error("no usable DH group")]
    DhGroupUnusable,
    /// The AUTH_Negotiate has no DH-HMAC-CHAP protocol descriptor.
    #[error("no DH-HMAC-CHAP protocol descriptor offered")]
    ProtocolNotUsable,
    /// The host asked for secure channel concatenation (SC_C ≠ 0).
    #[error("secure channel concatenation (SC_C {0:#04x}) is not supported")]
    SecureChannel(u8),
    /// The peer's Diffie-Hellman value is not acceptable.
    #[error("DH value rejected: {0}")]
    DhValue(#[from] dh::DhError),
    /// The host's response R1 does not match: the host does not know the
    /// host secret.
    #[error("host response does not match")]
    HostResponseMismatch,
    /// The controller's response R2 does not match: the controller does
    /// not know the controller secret.
    #[error("controller response does not match")]
    ControllerResponseMismatch,
    /// The host asked for bidirectional authentication and the controller
    /// answered Success1 without a response.
    #[error(
        "controller did not authenticate itself though bidirectional authentication was requested"
    )]
    ControllerNotAuthenticated,
    /// The host asked for bidirectional authentication but this controller
    /// has no controller secret for it.
    #[error("bidirectional authentication requested but no controller secret is configured")]
    NoControllerSecret,
    /// The random source failed.
    #[error(transparent)]
    Random(#[from] RandomError),
    /// A configuration value is unusable (empty or too long NQN, empty
    /// hash or group list).
    #[error("invalid authentication configuration: {0}")]
    Config(&'static str),
    /// The state machine was driven out of order by its caller (e.g.
    /// `start` twice).
    #[error("authentication state machine misuse: {0}")]
    Misuse(&'static str),
}

impl AuthError {
    /// The reason code explanation for the Failure1/Failure2 that reports
    /// this error.
    pub fn explanation(&self) -> FailureExplanation {
        match self {
            Self::Message(e) => e.explanation,
            Self::PeerFailure { explanation, .. } => *explanation,
            Self::UnexpectedMessage { .. } => FailureExplanation::INCORRECT_PROTOCOL_MESSAGE,
            Self::TransactionId { .. } | Self::DhValue(_) => FailureExplanation::INCORRECT_PAYLOAD,
            Self::HashUnusable => FailureExplanation::HASH_UNUSABLE,
            Self::DhGroupUnusable => FailureExplanation::DHGROUP_UNUSABLE,
            Self::ProtocolNotUsable => FailureExplanation::PROTOCOL_NOT_USABLE,
            Self::SecureChannel(_) => FailureExplanation::SECURE_CHANNEL_MISMATCH,
            Self::HostResponseMismatch
            | Self::ControllerResponseMismatch
            | Self::ControllerNotAuthenticated
            | Self::NoControllerSecret
            | Self::Random(_)
            | Self::Config(_)
            | Self::Misuse(_) => FailureExplanation::FAILED,
        }
    }
}

/// Check an NQN used in the response computation: non-empty, at most
/// [`MAX_NQN_LEN`] bytes, no NUL (it is hashed without a terminator, and a
/// NUL would make two NQNs hash alike).
pub(crate) fn check_nqn(nqn: &str) -> Result<(), AuthError> {
    if nqn.is_empty() {
        return Err(AuthError::Config("NQN is empty"));
    }
    if nqn.len() > MAX_NQN_LEN {
        return Err(AuthError::Config("NQN is longer than 223 bytes"));
    }
    if nqn.as_bytes().contains(&0) {
        return Err(AuthError::Config("NQN contains a NUL byte"));
    }
    Ok(())
}
