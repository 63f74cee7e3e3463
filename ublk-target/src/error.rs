//! The crate's one error type.

/// Everything the `ublk-nvmf` library reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the NVMe/TCP initiator (connection, refusal, command failure).
    #[error(transparent)]
    Initiator(#[from] nvmf_initiator::Error),
    /// A bad option combination, explained.
    #[error("{0}")]
    Usage(String),
}
