//! Prometheus metrics for both daemons, in the text exposition format,
//! version 0.0.4 (what every Prometheus server and `promtool check metrics`
//! read).
//!
//! - [`Exposition`]: builds one scrape's text: families with `# HELP` and
//!   `# TYPE`, samples grouped under their family whatever order the caller
//!   adds them in, label values and help text escaped, histograms as
//!   cumulative `_bucket{le}` series with `+Inf`, `_sum` and `_count`.
//! - [`LatencyHistogram`]: fixed buckets in seconds, updated with relaxed
//!   atomics from I/O threads (no lock, no allocation per observation).
//! - [`MetricsServer`]: answers `GET /metrics` over HTTP/1.1 on a std
//!   `TcpListener` thread.
//! - [`check`]: for the daemons' tests: scrape, and check with
//!   `promtool check metrics`.
//!
//! Why hand-written rather than the `prometheus` or `metrics` crates: the
//! daemons already keep their counters (`ublk-nvmf status`, the Gimbal
//! switch's virtual view); what is missing is only their rendering and
//! one HTTP route. A registry crate would have the counters kept twice,
//! and an HTTP stack (hyper, tokio on the ublk side) is far more code than
//! a responder that serves one path to a scraper. The responder handles
//! one connection at a time with a bounded request head and read/write
//! timeouts, so a stuck client costs at most those timeouts and never
//! memory: it is meant for loopback or a management network, not to be
//! exposed to tenants.

pub mod check;
mod encode;
mod histogram;
mod http;

pub use encode::{Exposition, Kind};
pub use histogram::{HistogramSnapshot, LatencyHistogram, LATENCY_BOUNDS_SECONDS};
pub use http::{MetricsServer, CONTENT_TYPE};
