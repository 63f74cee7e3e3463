//! A volume: what one `/dev/ublkbN` is served from.
//!
//! Today a volume is one target namespace behind one NVMe/TCP controller.
//! The QoS work turns it into a set of replicas (each a [`Volume`]-like
//! path with its own controller, credits and state); the device side only
//! sees [`Volume::geometry`], the I/O engine and [`Stats`], so that change
//! stays inside this module and the engine.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvmf_initiator::blocking::{ConnectOptions, Controller, HostIdentity};
use nvmf_initiator::Arbitration;
use serde::{Deserialize, Serialize};

use crate::config::VolumeConfig;
use crate::error::Error;
use crate::mapping::Geometry;
use crate::qos::{QosSnapshot, VolumeQos};

/// Counters of a volume (all queues), cheap to update from queue threads.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reads completed.
    pub reads: AtomicU64,
    /// Writes completed.
    pub writes: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Bytes written.
    pub write_bytes: AtomicU64,
    /// Flushes.
    pub flushes: AtomicU64,
    /// Discards and write-zeroes.
    pub discards: AtomicU64,
    /// Requests failed back to the kernel.
    pub errors: AtomicU64,
    /// Requests in the engine now.
    pub inflight: AtomicU64,
    /// I/O queue connection losses.
    pub reconnects: AtomicU64,
    /// Socket sends (each carries one or more commands).
    pub sends: AtomicU64,
}

/// A point-in-time copy of [`Stats`] plus the volume's identity, as
/// `status` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Volume name.
    pub volume: String,
    /// Block device.
    pub device: String,
    /// Target `address:port`.
    pub target: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Whether the controller is connected now.
    pub connected: bool,
    /// Controller resets so far.
    pub controller_resets: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Flushes.
    pub flushes: u64,
    /// Discards and write-zeroes.
    pub discards: u64,
    /// Requests failed back to the kernel.
    pub errors: u64,
    /// Requests in flight.
    pub inflight: u64,
    /// I/O queue connection losses.
    pub queue_failures: u64,
    /// Socket sends.
    pub sends: u64,
    /// Client-side QoS: credits, rate limits, local queue.
    pub qos: QosSnapshot,
}

/// What a recovering server checks before it reattaches a device: the
/// namespace must be the same one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TargetIdentity {
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller serial number.
    pub serial: String,
    /// Namespace NGUID (hex).
    pub nguid: String,
    /// Geometry.
    pub geometry: Geometry,
}

/// A connected volume.
pub struct Volume {
    /// Its configuration.
    pub config: VolumeConfig,
    /// Who we are to the target.
    pub host: HostIdentity,
    /// Target address.
    pub addr: SocketAddr,
    /// The controller (admin queue, keep-alive, reconnect).
    pub ctrl: Controller,
    /// Block device geometry.
    pub geometry: Geometry,
    /// Namespace identity.
    pub identity: TargetIdentity,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Rate limiter, run-time QoS settings and QoS counters (all queues).
    pub qos: Arc<VolumeQos>,
}

impl Volume {
    /// Connect the controller and identify the namespace. The first
    /// connection is not retried: an unreachable target, a wrong NQN or a
    /// refused host is reported at once.
    pub fn connect(config: VolumeConfig, host: HostIdentity) -> Result<Self, Error> {
        let addr = config
            .target
            .socket_addr()
            .map_err(|e| Error::Usage(format!("{}: {e}", config.target.address)))?;
        let mut opts = ConnectOptions::new(addr, &config.target.subnqn);
        opts.host = host.clone();
        opts.io_queues = config.queues;
        opts.queue_depth = config.queue_depth;
        opts.command_timeout = config.io_timeout;
        opts.kato = config.keep_alive;
        opts.reconnect = config.reconnect;
        opts.arbitration = Arbitration::RoundRobin;
        let ctrl = Controller::connect(opts)?;
        let info = ctrl.info();
        if info.io_queues < config.queues {
            return Err(Error::Usage(format!(
                "the target grants {} I/O queues, the volume needs {} (io.queues)",
                info.io_queues, config.queues
            )));
        }
        let ns = ctrl.identify_namespace(config.target.nsid)?;
        let geometry = Geometry::new(&info, &ns);
        let identity = TargetIdentity {
            subnqn: config.target.subnqn.clone(),
            serial: info.identify.serial_number.trim().to_owned(),
            nguid: ns
                .identify
                .nguid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            geometry,
        };
        Ok(Self {
            host,
            addr,
            ctrl,
            geometry,
            identity,
            stats: Arc::new(Stats::default()),
            qos: Arc::new(VolumeQos::new(&config.qos, config.queues)),
            config,
        })
    }

    /// A snapshot of the counters.
    pub fn snapshot(&self, device: &str) -> StatsSnapshot {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            volume: self.config.name.clone(),
            device: device.to_owned(),
            target: self.addr.to_string(),
            subnqn: self.config.target.subnqn.clone(),
            connected: self.ctrl.is_live(),
            controller_resets: self.ctrl.resets(),
            reads: g(&s.reads),
            writes: g(&s.writes),
            read_bytes: g(&s.read_bytes),
            write_bytes: g(&s.write_bytes),
            flushes: g(&s.flushes),
            discards: g(&s.discards),
            errors: g(&s.errors),
            inflight: g(&s.inflight),
            queue_failures: g(&s.reconnects),
            sends: g(&s.sends),
            qos: self.qos.snapshot(),
        }
    }
}
