//! The crate's one error type.
//!
//! An NVMe status in a completion is data ([`nvmf_proto::Status`] inside a
//! [`crate::Completion`]), not an [`Error`]: a read of an out-of-range LBA
//! completes with a status. An [`Error`] is something that went wrong with
//! the transport, the controller or the request itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nvmf_proto::fabrics::ConnectInvalidParameter;
use nvmf_proto::{ProtoError, Status};

/// Why a Fabrics Connect was refused, in the words a user needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectRefusal {
    /// Connect Invalid Host: the subsystem does not allow this host NQN.
    HostNotAllowed,
    /// Connect Invalid Parameters pointing at SUBNQN: no such subsystem on
    /// this port.
    UnknownSubsystem,
    /// Connect Invalid Parameters pointing elsewhere (queue size, KATO, ...).
    InvalidParameter(ConnectInvalidParameter),
    /// The controller is busy (try again later).
    ControllerBusy,
    /// The target wants in-band authentication, which this host lacks.
    AuthenticationRequired,
    /// Any other status.
    Other(Status),
}

impl ConnectRefusal {
    /// Classify a failed Connect completion.
    pub fn from_completion(status: Status, dw0: u32) -> Self {
        if status.same_code(Status::CONNECT_INVALID_HOST) {
            Self::HostNotAllowed
        } else if status.same_code(Status::CONNECT_INVALID_PARAMETERS) {
            match ConnectInvalidParameter::from_dw0(dw0) {
                ConnectInvalidParameter::Data(o)
                    if o == nvmf_proto::fabrics::connect_data_offset::SUBNQN =>
                {
                    Self::UnknownSubsystem
                }
                p => Self::InvalidParameter(p),
            }
        } else if status.same_code(Status::CONNECT_CONTROLLER_BUSY) {
            Self::ControllerBusy
        } else if status.same_code(Status::AUTHENTICATION_REQUIRED) {
            Self::AuthenticationRequired
        } else {
            Self::Other(status)
        }
    }

    /// Whether trying again later may succeed (a reconnect loop keeps going
    /// only for these; a host that is not allowed stays not allowed).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::ControllerBusy | Self::Other(_))
    }
}

impl std::fmt::Display for ConnectRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::HostNotAllowed => f.write_str("host NQN not allowed by the subsystem"),
            Self::UnknownSubsystem => f.write_str("no such subsystem NQN on the target"),
            Self::InvalidParameter(ConnectInvalidParameter::Command(o)) => {
                write!(f, "invalid Connect parameter at command byte {o}")
            }
            Self::InvalidParameter(ConnectInvalidParameter::Data(o)) => {
                write!(f, "invalid Connect parameter at data byte {o}")
            }
            Self::ControllerBusy => f.write_str("controller busy"),
            Self::AuthenticationRequired => {
                f.write_str("target requires authentication (not supported)")
            }
            Self::Other(s) => write!(f, "status {s}"),
        }
    }
}

/// Every error this crate reports.
///
/// `Clone` so that one connection failure can be handed to every request
/// it ends (I/O errors are kept behind an `Arc`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The TCP connection could not be opened.
    #[error("cannot connect to {addr}: {source}")]
    Unreachable {
        /// Where we tried to connect.
        addr: SocketAddr,
        /// What the socket said.
        source: Arc<std::io::Error>,
    },
    /// A socket error on an open connection (reset, closed by the peer, ...).
    #[error("connection error: {0}")]
    Io(Arc<std::io::Error>),
    /// The target closed the connection.
    #[error("connection closed by the target")]
    ConnectionClosed,
    /// The target broke the NVMe/TCP protocol (malformed or unexpected PDU).
    #[error("protocol violation by the target: {0}")]
    Protocol(ProtoError),
    /// The target sent a C2HTermReq.
    #[error("target terminated the connection (FES {fes:#x}, FEI {fei:#x})")]
    TargetTerminated {
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
    /// ICResp or the Connect response did not arrive in time.
    #[error("no answer to connection setup within {0:?}")]
    ConnectTimeout(Duration),
    /// The target refused the Fabrics Connect.
    #[error("connect refused: {0}")]
    ConnectRefused(ConnectRefusal),
    /// A command got no completion within its timeout.
    #[error("command timed out after {0:?}")]
    CommandTimeout(Duration),
    /// A Keep Alive got no completion within KATO.
    #[error("keep-alive timeout: no answer within {0:?}")]
    KeepAliveTimeout(Duration),
    /// Keep Alive completed with an error status.
    #[error("keep-alive failed with status {0}")]
    KeepAliveFailed(Status),
    /// An admin command needed for controller bring-up failed.
    #[error("{what} failed with status {status}")]
    CommandFailed {
        /// Which command.
        what: &'static str,
        /// Its status.
        status: Status,
    },
    /// The controller did not become ready (CSTS.RDY) within CAP.TO.
    #[error("controller not ready within {0:?}")]
    NotReady(Duration),
    /// The controller reported a fatal status (CSTS.CFS).
    #[error("controller fatal status (CSTS.CFS)")]
    ControllerFatal,
    /// A data structure from the target could not be decoded.
    #[error("bad {what} from the target: {source}")]
    BadData {
        /// What was being decoded.
        what: &'static str,
        /// Why it is bad.
        source: ProtoError,
    },
    /// The target lacks something this host needs (e.g. SGL support).
    #[error("target unsupported: {0}")]
    Unsupported(&'static str),
    /// The request is not valid (buffer not a block multiple, too large, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The queue is closed (failed or disconnected) and takes no requests.
    #[error("queue closed")]
    QueueClosed,
    /// Reconnecting gave up after `ctrl_loss_tmo`.
    #[error("controller lost: no connection for {0:?} (ctrl_loss_tmo)")]
    ControllerLost(Duration),
    /// Pending I/O was failed after `fast_io_fail_tmo` while reconnecting.
    #[error("I/O failed: no connection for {0:?} (fast_io_fail_tmo)")]
    FastIoFail(Duration),
    /// The request was failed because the connection broke and the policy
    /// does not requeue.
    #[error("I/O aborted by a controller reset: {0}")]
    Aborted(Box<Error>),
    /// The command completed with Reservation Conflict: another host holds
    /// a reservation on the namespace that excludes this one (or, for a
    /// reservation command, the key or the state did not allow it). Not
    /// transient: retrying, reconnecting or another path gets the same
    /// answer until the reservation changes; a host fenced this way must
    /// stop writing.
    #[error("{what}: reservation conflict (the namespace is reserved by another host)")]
    ReservationConflict {
        /// Which command.
        what: &'static str,
    },
    /// The controller handle was shut down.
    #[error("controller shut down")]
    Shutdown,
    /// The target asks for in-band authentication (Connect AUTHREQ.ATR)
    /// and no DH-HMAC-CHAP secret is configured.
    #[error(
        "the target requires DH-HMAC-CHAP authentication on queue {qid}; \
         configure the host's secret (dhchap_secret, nvme-cli's --dhchap-secret)"
    )]
    AuthenticationRequired {
        /// The queue the target asked on.
        qid: u16,
    },
    /// DH-HMAC-CHAP failed: a wrong key on either side, or nothing both
    /// sides accept.
    #[error("DH-HMAC-CHAP authentication failed on queue {qid}: {source}")]
    AuthenticationFailed {
        /// The queue.
        qid: u16,
        /// What the protocol reported (never key material).
        source: nvmf_proto::auth::AuthError,
    },
    /// A controller secret is configured (the target must prove its key),
    /// but the target did not ask for authentication on the admin queue,
    /// so it proved nothing. (I/O queues may go without: their Connect
    /// names the controller the admin queue authenticated.)
    #[error(
        "the target did not ask for authentication on queue {qid}, but dhchap_ctrl_secret \
         is set: refusing a controller that does not prove its key"
    )]
    ControllerNotAuthenticated {
        /// The queue.
        qid: u16,
    },
}

impl Error {
    /// The error for a command that completed with `status` (not success):
    /// [`Error::ReservationConflict`] for Reservation Conflict, else
    /// [`Error::CommandFailed`].
    pub fn from_status(what: &'static str, status: Status) -> Self {
        if status.is_reservation_conflict() {
            Self::ReservationConflict { what }
        } else {
            Self::CommandFailed { what, status }
        }
    }

    /// Whether this is [`Error::ReservationConflict`].
    pub fn is_reservation_conflict(&self) -> bool {
        matches!(self, Self::ReservationConflict { .. })
    }

    /// Wrap a socket error.
    pub fn io(e: std::io::Error) -> Self {
        Self::Io(Arc::new(e))
    }

    /// Whether a reconnect loop should keep trying after this error. A
    /// Connect refusal counts as transient: while a port is being
    /// reconfigured a target refuses a subsystem it will serve again a
    /// moment later (only `ctrl_loss_tmo` ends the loop, as for the kernel
    /// host). A first connection is never retried, so a wrong NQN is still
    /// reported at once.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            Self::Unsupported(_)
                | Self::InvalidRequest(_)
                | Self::Shutdown
                | Self::ReservationConflict { .. }
        )
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
