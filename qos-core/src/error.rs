//! The crate's one error type.

use crate::types::{RequestId, TenantId};

/// Everything that can go wrong when using a policy of this crate.
///
/// Policies never fail on ordinary load (a full queue or an empty bucket is
/// a state, not an error); errors are misuse by the caller: a contradictory
/// configuration, an unknown tenant or request id.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QosError {
    /// A configuration value is out of range or contradicts another one.
    #[error("invalid configuration: `{field}` {reason}")]
    InvalidConfig {
        /// The offending field, as spelled in the config struct.
        field: &'static str,
        /// What is wrong with it, in words.
        reason: String,
    },
    /// The tenant was never added, or has been removed.
    #[error("unknown tenant {0}")]
    UnknownTenant(TenantId),
    /// The tenant already exists.
    #[error("tenant {0} already exists")]
    DuplicateTenant(TenantId),
    /// A tenant cannot be removed while it has queued or in-flight I/O.
    #[error("tenant {0} still has queued or in-flight I/O")]
    TenantBusy(TenantId),
    /// The request id is not in flight (never dispatched, or completed twice).
    #[error("request {0} is not in flight")]
    UnknownRequest(RequestId),
    /// A replica index is out of range.
    #[error("unknown replica {0}")]
    UnknownReplica(usize),
}

impl QosError {
    /// Shorthand for [`QosError::InvalidConfig`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> QosError {
        QosError::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}

/// Result with [`QosError`].
pub type Result<T, E = QosError> = core::result::Result<T, E>;
