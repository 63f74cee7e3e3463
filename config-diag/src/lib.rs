//! Configuration diagnostics shared by both binaries (`gimbal-target` and
//! `ublk-nvmf`): an operator who gets an error about a TOML file must be
//! able to go straight to the offending line.
//!
//! - [`ConfigError`]: an error located by file, line, column and dotted
//!   field name, built from a `toml` parse error or from the span of a
//!   value a semantic check rejected.
//! - [`Ctx`]: the file being checked (path and text), with [`Ctx::err`] to
//!   reject a `toml::Spanned` value by its field name.
//! - [`parse_size`]: the one grammar for sizes (`4096`, `4k`, `"512KiB"`,
//!   `1G`) in config files and on command lines.
//! - [`refuse_world_readable`]: files holding secrets must not be readable
//!   by every user.

mod ctx;
mod error;
pub mod logging;
mod secret_file;
mod size;

pub use ctx::Ctx;
pub use error::{line_column, ConfigError};
pub use secret_file::refuse_world_readable;
pub use size::{parse_size, SizeError};
