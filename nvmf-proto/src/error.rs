//! The crate's one error type, and the NVMe/TCP fatal error statuses it maps to.
//!
//! An NVMe *status* (what a command completion says) is data, see
//! [`crate::status::Status`]; a [`ProtoError`] is what went wrong while
//! decoding or validating bytes. Each PDU-level error knows what the
//! receiver must do about it ([`ProtoError::termination`]): send a TermReq
//! with a given FES/FEI and close, close silently, or (data digest errors
//! only) keep the connection and fail the one command.

/// Fatal Error Status (FES) carried in an H2CTermReq/C2HTermReq PDU.
///
/// A newtype rather than an enum because a received TermReq may carry a value
/// this crate does not know; it must still round-trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FatalErrorStatus(pub u16);

impl FatalErrorStatus {
    /// 01h: a PDU header field is invalid; FEI is the byte offset of the field.
    pub const INVALID_HEADER_FIELD: Self = Self(0x01);
    /// 02h: a PDU arrived that is not allowed at this point of the exchange.
    pub const PDU_SEQUENCE_ERROR: Self = Self(0x02);
    /// 03h: the header digest did not match; FEI is the received digest.
    pub const HEADER_DIGEST_ERROR: Self = Self(0x03);
    /// 04h: a data transfer PDU addressed bytes outside the command's buffer.
    pub const DATA_TRANSFER_OUT_OF_RANGE: Self = Self(0x04);
    /// 05h: a PDU carried more data than the receiver allows (MAXH2CDATA,
    /// or the configured maximum PDU data size).
    pub const DATA_TRANSFER_LIMIT_EXCEEDED: Self = Self(0x05);
    /// 06h: a parameter (e.g. PFV in ICReq/ICResp) is not supported; FEI is
    /// the byte offset of the field.
    pub const UNSUPPORTED_PARAMETER: Self = Self(0x06);
}

/// What a receiver puts in the TermReq it sends before closing the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Termination {
    /// Fatal Error Status.
    pub fes: FatalErrorStatus,
    /// Fatal Error Information: a byte offset for FES 01h/06h, the received
    /// header digest for 03h, zero otherwise.
    pub fei: u32,
}

/// Every error this crate reports.
///
/// PDU decoding errors say which field is wrong (`field`, named as in the
/// NVMe/TCP specification) and at which byte offset of the PDU header; the
/// decoder reports the lowest-offset invalid field first, as the
/// specification asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A PDU header field is invalid (FES 01h).
    #[error("invalid {field} in PDU type {pdu_type:#04x} (byte {fei}): {reason}")]
    InvalidHeaderField {
        /// PDU type byte of the offending PDU.
        pdu_type: u8,
        /// Field name as in the specification (e.g. `"PLEN"`).
        field: &'static str,
        /// Byte offset of the field in the PDU header (goes into FEI).
        fei: u32,
        /// Why the value is rejected.
        reason: &'static str,
    },

    /// A parameter has a value this implementation does not support (FES 06h).
    #[error("unsupported {field} in PDU type {pdu_type:#04x} (byte {fei}): {reason}")]
    UnsupportedParameter {
        /// PDU type byte of the offending PDU.
        pdu_type: u8,
        /// Field name as in the specification.
        field: &'static str,
        /// Byte offset of the field in the PDU header (goes into FEI).
        fei: u32,
        /// Why the value is rejected.
        reason: &'static str,
    },

    /// The PDU carries more data than the configured limit (FES 05h). Detected
    /// from the 8-byte common header, before anything is buffered.
    #[error("PDU type {pdu_type:#04x} carries {data_len} data bytes, limit is {limit}")]
    DataLimitExceeded {
        /// PDU type byte of the offending PDU.
        pdu_type: u8,
        /// Data bytes the PDU claims to carry.
        data_len: u32,
        /// Configured maximum.
        limit: u32,
    },

    /// The header digest does not match the header (FES 03h).
    #[error("header digest mismatch in PDU type {pdu_type:#04x}: computed {computed:#010x}, received {received:#010x}")]
    HeaderDigestMismatch {
        /// PDU type byte of the offending PDU.
        pdu_type: u8,
        /// CRC32C computed over the received header.
        computed: u32,
        /// Digest value found in the PDU.
        received: u32,
    },

    /// The data digest does not match the data. Not a fatal transport error:
    /// the PDU framing is intact, so the receiver may skip `consumed` bytes,
    /// fail command `command_id` (e.g. with Transient Transport Error) and
    /// keep the connection; or close it, which is what Linux nvmet does.
    #[error("data digest mismatch in PDU type {pdu_type:#04x} for command {command_id:#06x}: computed {computed:#010x}, received {received:#010x}")]
    DataDigestMismatch {
        /// PDU type byte of the offending PDU.
        pdu_type: u8,
        /// CCCID of the data PDU, or the CID of the capsule's SQE.
        command_id: u16,
        /// TTAG of an H2CData PDU (zero for other types).
        transfer_tag: u16,
        /// Length of the whole PDU: skip this many bytes to go on.
        consumed: usize,
        /// CRC32C computed over the received data.
        computed: u32,
        /// Digest value found in the PDU.
        received: u32,
    },

    /// A received TermReq is itself malformed (bad HLEN or PLEN outside
    /// 24..=152). The specification says to close the connection without
    /// sending a TermReq back.
    #[error("malformed TermReq (type {pdu_type:#04x}): {reason}")]
    InvalidTermReq {
        /// PDU type byte (02h or 03h).
        pdu_type: u8,
        /// What is wrong.
        reason: &'static str,
    },

    /// A PDU arrived that the connection state does not allow (FES 02h).
    /// Raised by the connection state machines built on this crate, not by
    /// the stateless decoder.
    #[error("PDU sequence error: {reason}")]
    SequenceError {
        /// What was unexpected.
        reason: &'static str,
    },

    /// A data transfer addressed bytes outside the command's buffer (FES 04h).
    /// Raised by the connection state machines built on this crate.
    #[error("data transfer out of range for command {command_id:#06x}: {reason}")]
    DataOutOfRange {
        /// The command whose buffer was overrun.
        command_id: u16,
        /// What was out of range.
        reason: &'static str,
    },

    /// A field of an NVMe structure (SQE, Connect data, log page, ...) is
    /// invalid. Not a transport error: a target answers with an NVMe status
    /// such as Invalid Field in Command, and `offset` can go into the error
    /// log's parameter error location.
    #[error("invalid {field} in {structure} (byte {offset}): {reason}")]
    InvalidField {
        /// Structure being decoded (e.g. `"Connect data"`).
        structure: &'static str,
        /// Field name as in the specification.
        field: &'static str,
        /// Byte offset of the field within the structure.
        offset: usize,
        /// Why the value is rejected.
        reason: &'static str,
    },

    /// A buffer is shorter than the structure decoded from it.
    #[error("{structure} needs {needed} bytes, got {actual}")]
    Truncated {
        /// Structure being decoded.
        structure: &'static str,
        /// Bytes required.
        needed: usize,
        /// Bytes available.
        actual: usize,
    },

    /// Something to be encoded does not fit the wire format (e.g. data
    /// longer than PLEN can express).
    #[error("cannot encode {what}: {reason}")]
    Unencodable {
        /// What was being encoded.
        what: &'static str,
        /// Why it does not fit.
        reason: &'static str,
    },
}

/// What a receiver does about a [`ProtoError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorAction {
    /// Send a TermReq carrying this FES/FEI, then close the connection.
    Terminate(Termination),
    /// Close the connection without sending anything.
    Close,
    /// The stream is still in sync: skip `consumed` bytes and fail one command.
    FailCommand {
        /// Command to complete with an error status.
        command_id: u16,
        /// Bytes of input that belong to the offending PDU.
        consumed: usize,
    },
    /// Not a transport error: answer the command with an NVMe status.
    CommandStatus,
}

impl ProtoError {
    /// What the receiver of the bad input should do.
    pub fn action(&self) -> ErrorAction {
        let terminate = |fes, fei| ErrorAction::Terminate(Termination { fes, fei });
        match *self {
            Self::InvalidHeaderField { fei, .. } => {
                terminate(FatalErrorStatus::INVALID_HEADER_FIELD, fei)
            }
            Self::UnsupportedParameter { fei, .. } => {
                terminate(FatalErrorStatus::UNSUPPORTED_PARAMETER, fei)
            }
            Self::DataLimitExceeded { .. } => {
                terminate(FatalErrorStatus::DATA_TRANSFER_LIMIT_EXCEEDED, 0)
            }
            Self::HeaderDigestMismatch { received, .. } => {
                terminate(FatalErrorStatus::HEADER_DIGEST_ERROR, received)
            }
            Self::SequenceError { .. } => terminate(FatalErrorStatus::PDU_SEQUENCE_ERROR, 0),
            Self::DataOutOfRange { .. } => {
                terminate(FatalErrorStatus::DATA_TRANSFER_OUT_OF_RANGE, 0)
            }
            Self::DataDigestMismatch {
                command_id,
                consumed,
                ..
            } => ErrorAction::FailCommand {
                command_id,
                consumed,
            },
            Self::InvalidTermReq { .. } => ErrorAction::Close,
            Self::InvalidField { .. } | Self::Truncated { .. } | Self::Unencodable { .. } => {
                ErrorAction::CommandStatus
            }
        }
    }

    /// The FES/FEI a TermReq should carry, if this error calls for one.
    pub fn termination(&self) -> Option<Termination> {
        match self.action() {
            ErrorAction::Terminate(t) => Some(t),
            _ => None,
        }
    }

    /// Whether the connection cannot go on after this error.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self.action(),
            ErrorAction::Terminate(_) | ErrorAction::Close
        )
    }
}
