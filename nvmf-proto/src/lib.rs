//! NVMe/TCP wire protocol, sans-IO.
//!
//! This crate turns bytes into NVMe/TCP PDUs and NVMe structures and back.
//! It opens no sockets, reads no clock and starts no threads; both the
//! initiator and the target drive it with the bytes they send and receive.
//!
//! - [`pdu`]: the nine PDU types, header/data digests (CRC32C), padding,
//!   and encoding ([`Pdu::encode`], [`Pdu::encode_head`]).
//! - [`decoder`]: the streaming decoder ([`PduDecoder::decode`] returns
//!   [`Decoded::NeedMore`] or a PDU; errors say which field is wrong and
//!   which TermReq to send), and [`PduReader`], a decoder with its own buffer.
//! - [`sqe`], [`cqe`], [`status`]: the 64-byte command, 16-byte completion,
//!   SGL descriptors, and NVMe status codes as data.
//! - [`command`], [`fabrics`], [`features`]: typed admin, I/O and Fabrics
//!   commands (Connect, Property Get/Set, Disconnect) with their SQE layouts.
//! - [`identify`], [`log_page`]: Identify data structures, error/SMART logs,
//!   the discovery log page, and a vendor log page hook.
//!
//! Decoding never panics on any input and never allocates from a length it
//! read off the wire without checking it against a configured bound.

pub mod command;
pub mod cqe;
pub mod decoder;
pub mod error;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod log_page;
pub mod pdu;
pub mod raw;
pub mod sqe;
pub mod status;
mod wire;

pub use command::{AdminCommand, IoCommand};
pub use cqe::Cqe;
pub use decoder::{Decoded, DecoderConfig, PduDecoder, PduReader};
pub use error::{ErrorAction, FatalErrorStatus, ProtoError, Termination};
pub use fabrics::FabricsCommand;
pub use pdu::{
    C2HData, CapsuleCmd, CapsuleResp, EncodeConfig, H2CData, IcReq, IcResp, Negotiated, Pdu, Role,
    TermReq, R2T,
};
pub use sqe::{SglDescriptor, SglKind, Sqe};
pub use status::Status;
