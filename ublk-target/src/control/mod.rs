//! The control side of a running volume: what survives the server process
//! (device state under `/run/ublk-nvmf/`, for `recover`, `list` and udev),
//! the control socket (`status`, `set`, `reload`, `del`), and readiness
//! for systemd.

pub mod notify;
pub mod state;
