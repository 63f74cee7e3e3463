//! `ublk-nvmf`: block devices served over NVMe/TCP.
//!
//! This crate holds the `ublk-nvmf` command and what it runs. So far:
//! `discover`, `identify` and `bench` over the embedded initiator
//! (`nvmf-initiator`); the ublk server itself (`run`, `add`, `del`, `list`,
//! `status`, `recover`, `demo`) comes with the block device work.

pub mod bench;
pub mod error;
pub mod histogram;

pub use error::Error;
