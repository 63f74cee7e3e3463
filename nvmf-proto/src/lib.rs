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
//!   which TermReq to send), [`PduDecoder::decode_data_header`] for a data
//!   PDU's header before its data (to receive the data in place), and
//!   [`PduReader`], a decoder with its own buffer.
//! - [`sqe`], [`cqe`], [`status`]: the 64-byte command, 16-byte completion,
//!   SGL descriptors, and NVMe status codes as data.
//! - [`command`], [`fabrics`], [`features`]: typed admin, I/O and Fabrics
//!   commands (Connect, Property Get/Set, Disconnect) with their SQE layouts.
//! - [`identify`], [`log_page`]: Identify data structures, error/SMART logs,
//!   the discovery log page, and a vendor log page hook.
//! - [`reservation`]: Reservation Register/Acquire/Release/Report, the
//!   Reservation Status data structure (regular and extended) and the
//!   Reservation Notification log page.
//! - [`uuid`]: host identifiers (UUIDs) to and from text.
//! - [`auth`]: NVMe in-band authentication (DH-HMAC-CHAP): messages,
//!   `DHHC-1` secrets, the FFDHE groups, and host and controller state
//!   machines ([`HostAuth`], [`CtrlAuth`]) that interoperate with Linux.
//!
//! Decoding never panics on any input and never allocates from a length it
//! read off the wire without checking it against a configured bound.
//!
//! # A connection's life, as this crate sees it
//!
//! ```
//! use nvmf_proto::{
//!     CapsuleCmd, Decoded, DecoderConfig, EncodeConfig, IcReq, IcResp, IoCommand, Negotiated,
//!     Pdu, PduDecoder, Role,
//! };
//!
//! // Host: ask for digests, send ICReq (never digested itself).
//! let req = IcReq { hpda: 0, header_digest: true, data_digest: true, maxr2t: 0 };
//! let mut wire = Pdu::IcReq(req).to_vec(&EncodeConfig::default())?;
//!
//! // Controller: decode it with a controller-side decoder.
//! let mut controller = PduDecoder::new(DecoderConfig::new(Role::Controller));
//! let Decoded::Pdu { pdu: Pdu::IcReq(got), consumed } = controller.decode(&wire)? else {
//!     unreachable!()
//! };
//! wire.drain(..consumed);
//!
//! // Both ends apply what ICResp settles, from the next PDU on.
//! let resp = IcResp { cpda: 0, header_digest: true, data_digest: true, maxh2cdata: 131072 };
//! let link = Negotiated::new(&got, &resp)?;
//! controller.set_config(link.decoder_config(Role::Controller, 1 << 20));
//!
//! // Host sends a Read whose data will come back in C2HData PDUs.
//! let read = IoCommand::read(1, 0, 8, 4096)?.to_sqe(7);
//! Pdu::CapsuleCmd(CapsuleCmd::new(read)).encode(&link.encode_config(Role::Host), &mut wire)?;
//!
//! // Bytes may arrive in any pieces: the decoder asks for the rest.
//! assert_eq!(controller.decode(&wire[..10])?, Decoded::NeedMore(66));
//! match controller.decode(&wire)? {
//!     Decoded::Pdu { pdu: Pdu::CapsuleCmd(cmd), .. } => {
//!         assert!(matches!(IoCommand::parse(&cmd.sqe)?, IoCommand::Read(r) if r.block_count() == 8));
//!     }
//!     other => panic!("{other:?}"),
//! }
//! # Ok::<(), nvmf_proto::ProtoError>(())
//! ```
//!
//! # Decisions where the specifications leave room
//!
//! - **Data is borrowed, not copied.** Decoded PDUs borrow their data from
//!   the caller's buffer (`Cow::Borrowed`); a whole PDU must be in the buffer
//!   before it is returned, which the configured maximum data length bounds.
//!   [`Pdu::encode_head`] lets a sender write data from where it already is.
//! - **Strict on receive where the layout depends on it.** HDGSTF/DDGSTF must
//!   match the negotiated digests exactly (DDGSTF only when there is data, as
//!   Linux sends); flags not defined for a PDU type, SUCCESS without
//!   LAST_PDU, a PDO inside the header or not aligned to the PDA this end
//!   advertised, and DATAL not matching PLEN are fatal. A PDO that is aligned
//!   but larger than needed is accepted (SPDK pads that way).
//! - **TermReqs are read leniently.** Their FLAGS and PDO are ignored so the
//!   peer's reason gets through; a TermReq with a bad HLEN/PLEN is closed on
//!   without an answer, as the specification says.
//! - **A data digest error is not fatal here.** The framing is intact, so the
//!   error carries the command ID and byte count to skip; the caller decides
//!   between failing the command (Transient Transport Error) and closing.
//! - **Reserved fields** are written as zero and ignored when read.
//! - **Strings:** SN/MN/FR, TRSVCID and TRADDR are written space-padded and
//!   read with trailing spaces or NULs dropped (Linux nvmet pads with NULs);
//!   NQNs must be NUL-terminated in Connect data and discovery entries.

pub mod auth;
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
pub mod reservation;
pub mod sqe;
pub mod status;
pub mod uuid;
mod wire;

pub use auth::{CtrlAuth, DhchapSecret, HostAuth};
pub use command::{AdminCommand, IoCommand};
pub use cqe::Cqe;
pub use decoder::{DataHeader, DataHeaderDecoded, Decoded, DecoderConfig, PduDecoder, PduReader};
pub use error::{ErrorAction, FatalErrorStatus, ProtoError, Termination};
pub use fabrics::FabricsCommand;
pub use pdu::{
    C2HData, CapsuleCmd, CapsuleResp, EncodeConfig, H2CData, IcReq, IcResp, Negotiated, Pdu, Role,
    TermReq, R2T,
};
pub use raw::RawPdu;
pub use sqe::{SglDescriptor, SglKind, Sqe};
pub use status::Status;
