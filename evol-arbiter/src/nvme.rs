//! NVMe/TCP to a pool namespace, shared by the leader's zeroing task
//! (`server::zeroing`) and `evol-arbiter check --scan-data`
//! ([`crate::scan`]): an `nvmf-initiator` blocking controller with one I/O
//! queue of the Low class (Gimbal schedules it behind the clients'
//! traffic), that fails fast when the target goes away (the callers retry
//! or report, each with its own policy).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use cluster_store::evol::NamespaceRecord;
use nvmf_initiator::blocking::{ConnectOptions, Controller, HostIdentity, IoQueue};
use nvmf_initiator::{Command, ReconnectPolicy, Request};
use nvmf_proto::fabrics::PriorityClass;
use nvmf_proto::identify::oncs;

/// A connection to one namespace of the pool.
pub struct NsConnection {
    record: NamespaceRecord,
    // The queue before the controller: dropped first.
    queue: IoQueue,
    _ctrl: Controller,
    block_size: u64,
    blocks: u64,
    max_transfer: u64,
    write_zeroes: bool,
}

impl NsConnection {
    /// Connects to `record`'s namespace as `host` (None: the system's
    /// identity, `/etc/nvme/hostnqn` as nvme-cli keeps it, else a random
    /// one), identifies the controller and the namespace, and opens the
    /// I/O queue.
    pub fn connect(record: &NamespaceRecord, host: Option<&HostIdentity>) -> Result<Self, String> {
        let addr: SocketAddr = record
            .address
            .to_socket_addrs()
            .map_err(|e| format!("address {}: {e}", record.address))?
            .next()
            .ok_or_else(|| format!("address {} resolves to nothing", record.address))?;
        let mut o = ConnectOptions::new(addr, &record.subnqn);
        if let Some(h) = host {
            o.host = h.clone();
        }
        o.connect_timeout = Duration::from_secs(5);
        o.command_timeout = Duration::from_secs(30);
        o.io_queues = 1;
        o.queue_depth = 16;
        // Fail fast: the callers retry with their own backoff, or report.
        o.reconnect = ReconnectPolicy {
            reconnect_delay: Duration::from_secs(1),
            ctrl_loss_tmo: Some(Duration::from_secs(5)),
            fast_io_fail_tmo: Some(Duration::ZERO),
            requeue: false,
        };
        let ctrl = Controller::connect(o).map_err(|e| format!("connecting: {e}"))?;
        let id = ctrl
            .identify_controller()
            .map_err(|e| format!("Identify Controller: {e}"))?;
        let ns = ctrl
            .identify_namespace(record.nsid)
            .map_err(|e| format!("Identify Namespace {}: {e}", record.nsid))?;
        let queue = ctrl
            .io_queue(PriorityClass::Low)
            .map_err(|e| format!("I/O queue: {e}"))?;
        let max_transfer = u64::from(ctrl.info().max_transfer_bytes);
        Ok(NsConnection {
            record: record.clone(),
            queue,
            _ctrl: ctrl,
            block_size: u64::from(ns.block_size),
            blocks: ns.blocks,
            max_transfer,
            write_zeroes: id.oncs & oncs::WRITE_ZEROES != 0,
        })
    }

    /// The namespace record it connected to.
    pub fn record(&self) -> &NamespaceRecord {
        &self.record
    }

    /// The namespace's block size in bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Bytes one command may transfer (the controller's MDTS, capped by
    /// the initiator's own limit).
    pub fn max_transfer_bytes(&self) -> u64 {
        self.max_transfer
    }

    /// Whether the controller says it has Write Zeroes (ONCS bit 3).
    pub fn write_zeroes(&self) -> bool {
        self.write_zeroes
    }

    /// Physical extent `pext`'s first block and length in blocks, or why
    /// it cannot be addressed (an extent not a block multiple, or beyond
    /// the namespace's capacity).
    pub fn extent_blocks(&self, pext: u64) -> Result<(u64, u64), String> {
        let eb = self.record.extent_bytes;
        let bs = self.block_size;
        if bs == 0 || eb % bs != 0 {
            return Err(format!(
                "extent of {eb} bytes is not a multiple of the {bs}-byte block"
            ));
        }
        let (first, blocks) = (pext * eb / bs, eb / bs);
        if first + blocks > self.blocks {
            return Err(format!(
                "physical extent {pext} lies beyond the namespace's {} blocks",
                self.blocks
            ));
        }
        Ok((first, blocks))
    }

    /// Runs one command and waits for it: the buffer back (a read's
    /// data, in the buffer given) or the error, named `what`.
    pub fn run(
        &mut self,
        command: Command,
        buf: Option<Vec<u8>>,
        what: &'static str,
    ) -> Result<Option<Vec<u8>>, nvmf_initiator::Error> {
        self.queue.submit(Request {
            command,
            buf,
            user_data: 0,
        });
        let c = self
            .queue
            .wait()
            .ok_or(nvmf_initiator::Error::QueueClosed)?;
        c.into_result(what)
    }
}
