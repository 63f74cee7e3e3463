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
    /// A configuration file error (names file, line and field).
    #[error(transparent)]
    Config(#[from] config_diag::ConfigError),
    /// The ublk control device is missing: the driver is not loaded.
    #[error(
        "{0} does not exist: this kernel has no ublk driver loaded; run `modprobe ublk_drv` \
         (Linux 6.0+ built with CONFIG_BLK_DEV_UBLK), or try it in the VM bench: \
         `tests/vm/run ublk-demo`"
    )]
    NoUblk(String),
    /// Creating ublk devices needs root.
    #[error("creating a ublk device needs root (CAP_SYS_ADMIN): run ublk-nvmf as root")]
    NotRoot,
    /// The ublk driver refused an operation.
    #[error("ublk: {0}")]
    Ublk(String),
    /// A state or control-socket file problem.
    #[error("{0}")]
    State(String),
    /// An I/O error with context.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}
