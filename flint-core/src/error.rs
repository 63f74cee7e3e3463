//! The crate's one error type.
//!
//! Errors are misuse or a refused request (a batch over its limit, an
//! unknown id, no namespace with room); ordinary load never is one.

use crate::extent::{LogicalExtent, PhysicalExtent};
use crate::ids::{NamespaceId, PortId, SessionId, TargetId, VolumeId};

/// Everything a Flint policy can refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlintError {
    /// A configuration value is out of range or contradicts another one.
    #[error("invalid configuration: `{field}` {reason}")]
    InvalidConfig {
        /// The offending field, as spelled in the config struct.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A batch of I/O vectors longer than the controller accepts.
    #[error("batch of {len} I/O vectors is over the limit of {max}")]
    BatchTooLarge {
        /// Vectors in the batch.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// The namespace was never added.
    #[error("unknown namespace {0}")]
    UnknownNamespace(NamespaceId),
    /// The namespace already exists.
    #[error("namespace {0} already exists")]
    DuplicateNamespace(NamespaceId),
    /// The target was never added.
    #[error("unknown target {0}")]
    UnknownTarget(TargetId),
    /// The port was never added.
    #[error("unknown port {0}")]
    UnknownPort(PortId),
    /// The session was never added or was removed.
    #[error("unknown session {0}")]
    UnknownSession(SessionId),
    /// The volume was never created or was deleted.
    #[error("unknown volume {0}")]
    UnknownVolume(VolumeId),
    /// The volume already exists.
    #[error("volume {0} already exists")]
    DuplicateVolume(VolumeId),
    /// A logical extent beyond the volume's size.
    #[error("{volume}: extent {logical} is beyond its {size_extents} extents")]
    OutOfRange {
        /// The volume.
        volume: VolumeId,
        /// The extent asked for.
        logical: LogicalExtent,
        /// The volume's size in extents.
        size_extents: u64,
    },
    /// The logical extent is already mapped (mappings are created only if
    /// absent).
    #[error("{volume}: extent {logical} is already mapped")]
    AlreadyMapped {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
    },
    /// The logical extent is not mapped.
    #[error("{volume}: extent {logical} is not mapped")]
    NotMapped {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
    },
    /// A physical extent that is not free was to be allocated, or one that
    /// is not allocated was to be freed.
    #[error("{namespace}: physical extent {physical} is {state}")]
    PhysicalState {
        /// The namespace.
        namespace: NamespaceId,
        /// The physical extent.
        physical: PhysicalExtent,
        /// What it is instead ("not free", "not allocated", ...).
        state: &'static str,
    },
    /// Not enough capacity: too few namespaces with a free extent for the
    /// copies asked for, or not enough unreserved space for a volume.
    #[error("no room: {0}")]
    NoRoom(String),
}

impl FlintError {
    /// Shorthand for [`FlintError::InvalidConfig`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> FlintError {
        FlintError::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}

/// Result with [`FlintError`].
pub type Result<T, E = FlintError> = core::result::Result<T, E>;
