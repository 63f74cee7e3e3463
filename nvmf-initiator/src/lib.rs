//! The NVMe/TCP host (initiator) of `ublk-nvmf`.
//!
//! - [`queue`]: the sans-IO queue core. One [`Queue`] is one TCP connection
//!   carrying the admin queue or one I/O queue: ICReq/ICResp, Connect,
//!   commands with generation-tagged command IDs, MDTS splitting, in-capsule
//!   or R2T/H2CData writes, C2HData reads (with the SUCCESS shortcut),
//!   per-command timeouts and Keep Alive. Bytes in, bytes and events out,
//!   time passed in as `now`.
//! - [`controller`]: bring-up rules (CC, CAP.TO, MDTS, IOCCSZ) and what a
//!   controller and a namespace look like after it.
//! - [`recovery`]: the reconnect policy (`reconnect_delay`,
//!   `ctrl_loss_tmo`, `fast_io_fail_tmo`, requeue or fail) as a pure state
//!   machine that logs each transition once.
//! - [`blocking`]: a driver on `std::net::TcpStream` for tools and tests:
//!   [`blocking::Controller::connect`], identify, read/write/flush,
//!   [`blocking::discover`], and [`blocking::IoQueue`] for many
//!   outstanding commands per thread.
//! - `fake_target` (feature `test-support`): a scripted target that
//!   misbehaves on purpose.
//!
//! A driver for an io_uring loop is another thin pump around [`Queue`]: see
//! the [`queue`] module documentation for the call order.

pub mod blocking;
pub mod controller;
pub mod error;
#[cfg(feature = "test-support")]
pub mod fake_target;
pub mod queue;
pub mod recovery;

pub use controller::{Arbitration, ControllerInfo, Namespace};
pub use error::{ConnectRefusal, Error, Result};
pub use queue::{Command, Completion, Event, Queue, QueueConfig, QueueState, Rejected, Request};
pub use recovery::{ReconnectPolicy, Recovery};
