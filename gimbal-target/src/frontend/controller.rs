//! One NVMe controller: the state a host association has (registers,
//! features, I/O queues, keep-alive) and the admin command set.
//!
//! Admin commands are answered here as pure functions of the controller and
//! target state; the connection driver only moves bytes. Controllers use the
//! dynamic model: the target picks the ID at admin Connect, and I/O queue
//! Connects name it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_proto::command::{
    cns, log_id, AdminCommand, GetFeatures, GetLogPage, Identify, SetFeatures, IDENTIFY_DATA_LEN,
};
use nvmf_proto::fabrics::{
    arbitration_mechanism, property, Capabilities, ControllerConfiguration, ControllerStatus,
    FabricsCommand, PropertySize, Version, DISCOVERY_NQN,
};
use nvmf_proto::features::{
    feature_id, Arbitration, NumberOfQueues, ReservationNotificationMask, ReservationPersistence,
    HOST_IDENTIFIER_EXHID, HOST_IDENTIFIER_LEN,
};
use nvmf_proto::identify::{
    controller_type, oncs, sgls, vwc, ActiveNamespaceList, IdentifyController, IdentifyNamespace,
    LbaFormat, NamespaceIdDescriptor, CTRATT_HOST_ID_128,
};
use nvmf_proto::log_page::{
    adrfam, subtype, tcp_sectype, treq, trtype, DiscoveryLogEntry, DiscoveryLogPage,
    GimbalViewPage, SmartLog, ERROR_LOG_ENTRY_LEN, SMART_LOG_LEN,
};
use nvmf_proto::reservation::rescap;
use nvmf_proto::{SglKind, Sqe, Status};
use qos_core::class_arbiter::{ArbiterConfig, ArbitrationMode, DRR_QUANTUM_UNIT_BYTES};
use qos_core::congestion::CongestionState;
use tokio_util::sync::CancellationToken;

use crate::frontend::budget::DISCOVERY_DEFAULT_KATO_MS;
use crate::frontend::reservation::{NotificationLog, NsInflight};
use crate::frontend::target::{Namespace, Subsystem, Target};

/// IEEE OUI reported in Identify Controller: none registered, so zero.
const IEEE_OUI: [u8; 3] = [0, 0, 0];
/// Firmware revision: the crate version, which fits the 8-byte field.
const FIRMWARE_REVISION: &str = env!("CARGO_PKG_VERSION");
/// Outstanding Asynchronous Event Requests allowed (AERL + 1).
pub const AER_LIMIT: usize = 4;
/// Error log entries kept (ELPE + 1); we keep none, but report one page.
const ERROR_LOG_ENTRIES: usize = 1;
/// CAP.TO: how long a host waits for CSTS.RDY, in 500 ms units (7.5 s).
const READY_TIMEOUT_500MS: u8 = 15;
/// Keep Alive Support granularity (KAS), in 100 ms units.
const KEEP_ALIVE_GRANULARITY_100MS: u16 = 1;
/// The only I/O queue entry sizes the NVM command set has: 2^6 = 64-byte
/// SQEs and 2^4 = 16-byte CQEs (Identify Controller SQES/CQES report
/// exactly these).
const NVM_IOSQES: u8 = 6;
const NVM_IOCQES: u8 = 4;

/// Mutable controller state, behind one lock (touched only by admin
/// commands and queue connects, never on the I/O path).
#[derive(Debug)]
struct Registers {
    cc: ControllerConfiguration,
    csts: ControllerStatus,
    kato_ms: u32,
    /// I/O queues granted by Set Features (Number of Queues).
    granted_io_queues: u16,
    io_queues: BTreeSet<u16>,
    /// Bumped by every controller reset: a queue attached before it may
    /// not detach a queue of the same ID attached after it.
    io_epoch: u64,
    /// Cancelled by a controller reset (CC.EN 1 -> 0): every I/O queue
    /// attached since the last reset closes. A child of `teardown`.
    io_queues_reset: CancellationToken,
    arbitration: Arbitration,
    /// CIDs of Asynchronous Event Requests waiting for an event.
    pending_aers: Vec<u16>,
}

/// One controller.
#[derive(Debug)]
pub struct Controller {
    /// Controller ID.
    pub cntlid: u16,
    /// The NVM subsystem, or `None` for a discovery controller.
    pub subsystem: Option<Arc<Subsystem>>,
    /// The host's NQN (the tenant identity).
    pub host_nqn: String,
    /// The host identifier from Connect.
    pub host_id: [u8; 16],
    /// The tenant index of `host_nqn`.
    pub tenant: u32,
    /// Admin queue size (entries).
    pub admin_queue_size: u32,
    regs: Mutex<Registers>,
    last_activity_ms: AtomicU64,
    /// CC.AMS in force since the last enable (read on the I/O path without
    /// the register lock: round robin needs nothing more).
    ams: AtomicU8,
    /// Cancelled when the controller is torn down: every queue connection
    /// of the controller closes.
    pub teardown: CancellationToken,
    /// Per namespace: this controller's commands admitted past the
    /// reservation check and not completed (what Preempt and Abort
    /// drains). The namespaces are fixed for the life of the process.
    pub ns_inflight: BTreeMap<u32, Arc<NsInflight>>,
    /// Reservation notifications waiting for the host (log page 80h).
    resv_log: Mutex<NotificationLog>,
    /// Reservation Notification Mask per namespace (feature 82h); absent
    /// is 0 (nothing masked).
    resv_masks: Mutex<BTreeMap<u32, ReservationNotificationMask>>,
}

/// What an admin command produced.
#[derive(Debug, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Complete now: data (if any) goes to the host first (C2HData), then
    /// the completion.
    Reply {
        /// Completion status.
        status: Status,
        /// Completion dword 0.
        dw0: u32,
        /// Completion dword 1 (high half of an 8-byte property).
        dw1: u32,
        /// Data for the host (at most what the command asked for).
        data: Vec<u8>,
        /// Zero bytes that follow `data` up to the command's transfer
        /// length: sent from a static page, never allocated.
        zeros: usize,
    },
    /// An Asynchronous Event Request the controller holds until an event.
    Held,
    /// The host asked to disconnect this queue.
    Disconnect,
}

impl AdminOutcome {
    fn status(status: Status) -> Self {
        AdminOutcome::Reply {
            status,
            dw0: 0,
            dw1: 0,
            data: Vec::new(),
            zeros: 0,
        }
    }
    fn ok_dw0(dw0: u32) -> Self {
        AdminOutcome::Reply {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
            data: Vec::new(),
            zeros: 0,
        }
    }
}

/// An attached I/O queue's hold on its controller.
#[derive(Debug, Clone)]
pub struct IoQueueLease {
    /// The controller's reset epoch when the queue attached.
    pub epoch: u64,
    /// Cancelled when the controller is reset or torn down: the queue
    /// closes.
    pub reset: CancellationToken,
}

/// Who is connecting: from the Connect data, plus the tenant index.
#[derive(Debug, Clone)]
pub struct HostIdentity {
    /// Host NQN.
    pub nqn: String,
    /// Host identifier.
    pub id: [u8; 16],
    /// Tenant index of the NQN.
    pub tenant: u32,
}

impl Controller {
    /// A new, disabled controller.
    pub fn new(
        cntlid: u16,
        subsystem: Option<Arc<Subsystem>>,
        host: HostIdentity,
        admin_queue_size: u32,
        kato_ms: u32,
        now_ms: u64,
    ) -> Self {
        let teardown = CancellationToken::new();
        Controller {
            cntlid,
            host_nqn: host.nqn,
            host_id: host.id,
            tenant: host.tenant,
            admin_queue_size,
            regs: Mutex::new(Registers {
                cc: ControllerConfiguration::from_u32(0),
                csts: ControllerStatus::from_u32(0),
                kato_ms,
                granted_io_queues: 0,
                io_queues: BTreeSet::new(),
                io_epoch: 0,
                io_queues_reset: teardown.child_token(),
                arbitration: Arbitration::from_dword(0),
                pending_aers: Vec::new(),
            }),
            last_activity_ms: AtomicU64::new(now_ms),
            ams: AtomicU8::new(arbitration_mechanism::ROUND_ROBIN),
            teardown,
            ns_inflight: subsystem
                .as_ref()
                .map(|s| {
                    s.namespaces
                        .keys()
                        .map(|&n| (n, Arc::new(NsInflight::default())))
                        .collect()
                })
                .unwrap_or_default(),
            resv_log: Mutex::new(NotificationLog::default()),
            resv_masks: Mutex::new(BTreeMap::new()),
            subsystem,
        }
    }

    /// Logs a reservation notification for this controller's host unless
    /// the host masked its type on `nsid`. Without Asynchronous Event
    /// delivery (held AERs are never completed yet) the host finds it by
    /// reading log page 80h.
    pub fn notify_reservation(&self, nsid: u32, log_type: u8) {
        let masked = self
            .resv_masks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&nsid)
            .is_some_and(|m| m.masks(log_type));
        if !masked {
            self.resv_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(log_type, nsid);
        }
    }

    fn regs(&self) -> std::sync::MutexGuard<'_, Registers> {
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this is a discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subsystem.is_none()
    }

    /// The subsystem NQN this controller belongs to.
    pub fn subnqn(&self) -> &str {
        self.subsystem.as_ref().map_or(DISCOVERY_NQN, |s| s.nqn())
    }

    /// Records host activity (any command), which defers the keep-alive
    /// timeout. Traffic counts as keep-alive, as in the Linux target: a busy
    /// host must never be torn down because a Keep Alive queued behind I/O.
    pub fn touch(&self, now_ms: u64) {
        self.last_activity_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// The keep-alive timeout in force (0: none).
    pub fn kato_ms(&self) -> u32 {
        self.regs().kato_ms
    }

    /// Whether the host has been silent for longer than KATO at `now_ms`.
    pub fn keep_alive_expired(&self, now_ms: u64) -> bool {
        let kato = self.kato_ms() as u64;
        kato != 0 && now_ms.saturating_sub(self.last_activity_ms.load(Ordering::Relaxed)) > kato
    }

    /// Whether CC.EN = 1 and CSTS.RDY = 1 (I/O queues may connect).
    pub fn is_ready(&self) -> bool {
        self.regs().csts.ready
    }

    /// The KATO a host gets when it asks for `asked_ms` (in Connect or
    /// Set Features): clamped into the configured bounds; a discovery
    /// controller asked for none gets [`DISCOVERY_DEFAULT_KATO_MS`] unless a
    /// default is configured.
    pub fn kato_for(target: &Target, discovery: bool, asked_ms: u32) -> u32 {
        let ka = &target.config.keep_alive;
        match clamp_kato(asked_ms, ka.min_ms, ka.max_ms, ka.default_ms) {
            0 if discovery => DISCOVERY_DEFAULT_KATO_MS,
            kato => kato,
        }
    }

    /// Attaches I/O queue `qid`. Errors name what is wrong. On success: the
    /// epoch to detach it with, and the token a controller reset cancels.
    pub fn attach_io_queue(&self, qid: u16) -> Result<IoQueueLease, &'static str> {
        let mut r = self.regs();
        if !r.csts.ready {
            return Err("controller not enabled");
        }
        if qid == 0 || qid > r.granted_io_queues {
            return Err("queue ID beyond the number of queues granted");
        }
        if !r.io_queues.insert(qid) {
            return Err("queue already connected");
        }
        Ok(IoQueueLease {
            epoch: r.io_epoch,
            reset: r.io_queues_reset.clone(),
        })
    }

    /// Detaches I/O queue `qid` (its connection closed), unless a controller
    /// reset since `epoch` detached it already.
    pub fn detach_io_queue(&self, qid: u16, epoch: u64) {
        let mut r = self.regs();
        if r.io_epoch == epoch {
            r.io_queues.remove(&qid);
        }
    }

    /// Forgets a held AER (its connection is gone).
    pub fn drop_pending_aers(&self) {
        self.regs().pending_aers.clear();
    }

    /// The arbitration settings the host chose (CC.AMS, Arbitration feature).
    pub fn arbitration(&self) -> (u8, Arbitration) {
        let r = self.regs();
        (r.cc.ams, r.arbitration)
    }

    /// How this controller arbitrates between its I/O queues' classes:
    /// `None` under round robin (CC.AMS 000b, the default), else the class
    /// arbiter's configuration from CC.AMS and the Arbitration feature.
    ///
    /// CC.AMS 001b is NVMe weighted round robin with urgent: a visit of a
    /// class sends up to its weight (HPW/MPW/LPW + 1) in commands. CC.AMS
    /// 111b is our vendor-specific mechanism: deficit round robin by bytes
    /// with the same weights, a class's quantum being its weight times
    /// [`DRR_QUANTUM_UNIT_BYTES`]. Both serve urgent strictly first, take
    /// at most the arbitration burst from one queue per turn, and age
    /// commands (qos-core's default threshold) so none starves.
    pub fn arbiter_config(&self) -> Option<ArbiterConfig> {
        let mode = match self.ams.load(Ordering::Relaxed) {
            arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT => ArbitrationMode::Wrr,
            arbitration_mechanism::VENDOR_SPECIFIC => ArbitrationMode::Drr,
            _ => return None,
        };
        let dw = self.regs().arbitration.to_dword();
        let mut c = ArbiterConfig {
            mode,
            ..ArbiterConfig::default()
        }
        .with_arbitration_feature(dw);
        c.high_quantum_bytes = u64::from(c.high_weight) * DRR_QUANTUM_UNIT_BYTES;
        c.medium_quantum_bytes = u64::from(c.medium_weight) * DRR_QUANTUM_UNIT_BYTES;
        c.low_quantum_bytes = u64::from(c.low_weight) * DRR_QUANTUM_UNIT_BYTES;
        Some(c)
    }

    /// CAP as this target reports it.
    pub fn capabilities(target: &Target) -> Capabilities {
        Capabilities {
            mqes: target.config.limits.max_queue_size - 1,
            cqr: true,
            // Weighted round robin with urgent, and a vendor-specific
            // mechanism: size-aware deficit round robin (see
            // `arbiter_config`).
            ams: arbitration_mechanism::CAP_WRR_URGENT | arbitration_mechanism::CAP_VENDOR_SPECIFIC,
            timeout_500ms: READY_TIMEOUT_500MS,
            dstrd: 0,
            nssrs: false,
            css: 1,
            bps: false,
            mpsmin: 0,
            mpsmax: 0,
        }
    }

    /// Answers an admin-queue command. `in_data` is in-capsule data.
    pub fn handle_admin(&self, target: &Target, sqe: &Sqe, _in_data: &[u8]) -> AdminOutcome {
        self.touch(target.now_ms());
        let cmd = match AdminCommand::parse(sqe) {
            Ok(c) => c,
            Err(_) => return AdminOutcome::status(Status::INVALID_FIELD.with_dnr()),
        };
        match cmd {
            AdminCommand::Fabrics(f) => self.handle_fabrics(target, f),
            AdminCommand::KeepAlive => AdminOutcome::status(Status::SUCCESS),
            AdminCommand::AsyncEventRequest => {
                let mut r = self.regs();
                if r.pending_aers.len() >= AER_LIMIT {
                    AdminOutcome::status(Status::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED.with_dnr())
                } else {
                    r.pending_aers.push(sqe.cid);
                    AdminOutcome::Held
                }
            }
            _ if !self.is_ready() => {
                AdminOutcome::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr())
            }
            AdminCommand::Identify(id) => {
                // NVMe Base 2.0, Identify: the data structure is 4 KiB and
                // the data pointer must describe exactly that much; Linux
                // nvmet answers any other transfer length (zero included)
                // with Data SGL Length Invalid before looking at CNS.
                if let Err(status) = c2h_transfer_len(sqe, IDENTIFY_DATA_LEN as u64) {
                    return AdminOutcome::status(status);
                }
                match self.identify(target, &id) {
                    Ok(page) => data_reply(page, IDENTIFY_DATA_LEN),
                    Err(status) => AdminOutcome::status(status),
                }
            }
            AdminCommand::GetLogPage(glp) => self.log_page(target, sqe, &glp),
            AdminCommand::SetFeatures(sf) => self.set_features(target, &sf),
            AdminCommand::GetFeatures(gf) => self.get_features(sqe, &gf),
            AdminCommand::Other(_) => AdminOutcome::status(Status::INVALID_OPCODE.with_dnr()),
        }
    }

    fn handle_fabrics(&self, target: &Target, f: FabricsCommand) -> AdminOutcome {
        match f {
            FabricsCommand::PropertyGet(pg) => {
                let r = self.regs();
                let value = match (pg.offset, pg.size) {
                    (property::CAP, PropertySize::Eight) => Self::capabilities(target).to_u64(),
                    (property::VS, PropertySize::Four) => Version::V1_4.to_u32() as u64,
                    (property::CC, PropertySize::Four) => r.cc.to_u32() as u64,
                    (property::CSTS, PropertySize::Four) => r.csts.to_u32() as u64,
                    _ => return AdminOutcome::status(Status::INVALID_FIELD.with_dnr()),
                };
                AdminOutcome::Reply {
                    status: Status::SUCCESS,
                    dw0: value as u32,
                    dw1: (value >> 32) as u32,
                    data: Vec::new(),
                    zeros: 0,
                }
            }
            FabricsCommand::PropertySet(ps) => {
                if ps.offset != property::CC || ps.size != PropertySize::Four {
                    return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
                }
                self.write_cc(ControllerConfiguration::from_u32(ps.value as u32));
                AdminOutcome::status(Status::SUCCESS)
            }
            FabricsCommand::Disconnect(_) => AdminOutcome::Disconnect,
            // A second Connect on a live queue.
            FabricsCommand::Connect(_) => {
                AdminOutcome::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr())
            }
            FabricsCommand::Other(_) => AdminOutcome::status(Status::INVALID_OPCODE.with_dnr()),
        }
    }

    /// CC write. Enabling (CC.EN 0 -> 1) sets CSTS.RDY, or CSTS.CFS and
    /// not ready when the configuration is one the controller cannot run;
    /// disabling (1 -> 0) is a controller reset; a shutdown notification
    /// completes at once (nothing is cached in the controller; backends
    /// flush on the host's Flush).
    fn write_cc(&self, cc: ControllerConfiguration) {
        let mut r = self.regs();
        let was_enabled = r.cc.enable;
        r.cc = cc;
        if cc.enable && !was_enabled {
            let supported = self.cc_supported(&cc);
            r.csts.ready = supported;
            r.csts.fatal = !supported;
            if supported {
                self.ams.store(cc.ams, Ordering::Relaxed);
            }
        } else if !cc.enable && was_enabled {
            // NVMe Base 2.0, "Controller Level Reset": clearing CC.EN
            // resets the controller and deletes its I/O submission and
            // completion queues; over a fabric that means the I/O queues'
            // connections are torn down while the admin queue stays
            // (NVMe over Fabrics 1.1, "Controller Level Reset"). So every
            // I/O queue of this controller stops serving and closes, and
            // the host connects new ones after enabling again.
            r.csts.ready = false;
            r.csts.fatal = false;
            r.csts.shst = 0;
            r.io_queues_reset.cancel();
            r.io_queues_reset = self.teardown.child_token();
            r.io_epoch += 1;
            r.io_queues.clear();
        }
        if cc.shn != 0 {
            r.csts.shst = 2;
        }
    }

    /// Whether a controller enabled with `cc` can run (else CSTS.CFS, as
    /// Linux nvmet's `nvmet_start_ctrl`): I/O queue entry sizes must be the
    /// NVM command set's (NVMe Base 2.0, CC.IOSQES/IOCQES; a discovery
    /// controller has no I/O queues, and like nvmet we do not hold its host
    /// to clearing them), the memory page size within CAP.MPSMIN..MPSMAX
    /// (both 0: 4 KiB), the command set the NVM one (the only one CAP.CSS
    /// offers), and the arbitration mechanism one CAP.AMS offers: round
    /// robin, weighted round robin with urgent, or the vendor-specific DRR.
    fn cc_supported(&self, cc: &ControllerConfiguration) -> bool {
        let entry_sizes =
            self.is_discovery() || (cc.iosqes == NVM_IOSQES && cc.iocqes == NVM_IOCQES);
        let ams = matches!(
            cc.ams,
            arbitration_mechanism::ROUND_ROBIN
                | arbitration_mechanism::WEIGHTED_ROUND_ROBIN_URGENT
                | arbitration_mechanism::VENDOR_SPECIFIC
        );
        entry_sizes && cc.mps == 0 && cc.css == 0 && ams
    }

    fn identify(&self, target: &Target, id: &Identify) -> Result<Vec<u8>, Status> {
        let page = match (id.cns, &self.subsystem) {
            (cns::CONTROLLER, _) => self.identify_controller(target).to_bytes(),
            (cns::NAMESPACE, Some(s)) => {
                let ns = s
                    .namespaces
                    .get(&id.nsid)
                    .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
                identify_namespace(ns).to_bytes()
            }
            (cns::ACTIVE_NAMESPACE_LIST, Some(s)) => ActiveNamespaceList {
                nsids: s
                    .namespaces
                    .keys()
                    .copied()
                    .filter(|&n| n > id.nsid)
                    .take(ActiveNamespaceList::MAX_ENTRIES)
                    .collect(),
            }
            .to_bytes(),
            (cns::NAMESPACE_ID_DESCRIPTORS, Some(s)) => {
                let ns = s
                    .namespaces
                    .get(&id.nsid)
                    .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
                NamespaceIdDescriptor::encode_list(&[
                    NamespaceIdDescriptor::Nguid(ns.nguid),
                    NamespaceIdDescriptor::Uuid(ns.uuid()),
                    NamespaceIdDescriptor::Csi(0),
                ])
            }
            _ => return Err(Status::INVALID_FIELD.with_dnr()),
        };
        page.map(|b| b.to_vec()).map_err(|_| Status::INTERNAL_ERROR)
    }

    /// Identify Controller as this controller reports it.
    pub fn identify_controller(&self, target: &Target) -> IdentifyController {
        let limits = &target.config.limits;
        let mut id = IdentifyController {
            serial_number: String::new(),
            model_number: String::new(),
            firmware_revision: FIRMWARE_REVISION.chars().take(8).collect(),
            ieee: IEEE_OUI,
            cntlid: self.cntlid,
            ver: Version::V1_4.to_u32(),
            subnqn: self.subnqn().to_string(),
            kas: KEEP_ALIVE_GRANULARITY_100MS,
            maxcmd: limits.max_queue_size,
            sqes: 0x66,
            cqes: 0x44,
            sgls: sgls::SUPPORTED | sgls::KEYED | sgls::OFFSET,
            ioccsz: (64 + limits.in_capsule_data_bytes) / 16,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
            ctratt: CTRATT_HOST_ID_128,
            elpe: (ERROR_LOG_ENTRIES - 1) as u8,
            aerl: (AER_LIMIT - 1) as u8,
            acl: 3,
            lpa: 1 << 2, // extended data for Get Log Page (offsets)
            ..Default::default()
        };
        match &self.subsystem {
            None => {
                id.serial_number = "GIMBALDISCOVERY".into();
                id.model_number = "gimbal-target discovery".into();
                id.cntrltype = controller_type::DISCOVERY;
                // The discovery log page is bounded by MDTS like any
                // transfer (see `log_page`).
                id.mdts = (limits.max_data_transfer_bytes / 4096).trailing_zeros() as u8;
            }
            Some(s) => {
                id.serial_number = s.config.serial.clone();
                id.model_number = s.config.model.clone();
                id.cntrltype = controller_type::IO;
                // Several hosts may reach one namespace through different
                // controllers (multi-controller subsystem).
                id.cmic = 1 << 1;
                id.mdts = (limits.max_data_transfer_bytes / 4096).trailing_zeros() as u8;
                id.nn = s.max_nsid();
                id.mnan = s.max_nsid();
                let any = |f: fn(&Namespace) -> bool| s.namespaces.values().any(|n| f(n));
                id.oncs = oncs::WRITE_ZEROES
                    | oncs::RESERVATIONS
                    | if any(|n| n.info.discard) {
                        oncs::DATASET_MANAGEMENT
                    } else {
                        0
                    };
                id.vwc = if any(|n| n.info.volatile_write_cache) {
                    vwc::PRESENT | 0b110 // flush with NSID FFFFFFFFh supported
                } else {
                    0
                };
            }
        }
        id
    }

    /// Get Log Page, never allocating more than the page's real size
    /// (whatever NUMD says), in the order Linux nvmet checks: the data
    /// pointer must describe exactly NUMD's length (else Data SGL Length
    /// Invalid), which must not exceed MDTS (NVMe Base 2.0, Identify
    /// Controller MDTS: a larger transfer is aborted with Invalid Field in
    /// Command); LPO must be dword aligned and within the page (Get Log
    /// Page, Log Page Offset: Invalid Field). Bytes asked for beyond the
    /// page's end read as zeros, sent from a static page.
    fn log_page(&self, target: &Target, sqe: &Sqe, glp: &GetLogPage) -> AdminOutcome {
        let want = match c2h_transfer_len(sqe, glp.data_len()) {
            Ok(len) => len,
            Err(status) => return AdminOutcome::status(status),
        };
        if want > target.config.limits.max_data_transfer_bytes as usize {
            return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
        }
        if glp.offset_is_index || glp.offset % 4 != 0 {
            return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
        }
        let page = match self.log_page_bytes(target, glp) {
            Ok(page) => page,
            Err(status) => return AdminOutcome::status(status),
        };
        if glp.offset > page.len() as u64 {
            return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
        }
        let start = glp.offset as usize;
        let end = page.len().min(start + want);
        data_reply(page[start..end].to_vec(), want)
    }

    /// The whole log page `glp` names, at its real size.
    fn log_page_bytes(&self, target: &Target, glp: &GetLogPage) -> Result<Vec<u8>, Status> {
        let page: Vec<u8> = match glp.lid {
            log_id::DISCOVERY if self.is_discovery() => discovery_log(target, &self.host_nqn)
                .to_bytes()
                .map_err(|_| Status::INTERNAL_ERROR)?,
            log_id::ERROR_INFORMATION => vec![0u8; ERROR_LOG_ENTRY_LEN * ERROR_LOG_ENTRIES],
            log_id::SMART_HEALTH if !self.is_discovery() => SmartLog {
                available_spare: 100,
                available_spare_threshold: 10,
                composite_temperature: 300,
                ..Default::default()
            }
            .to_bytes()
            .to_vec(),
            log_id::FIRMWARE_SLOT if !self.is_discovery() => {
                let mut p = vec![0u8; SMART_LOG_LEN];
                p[0] = 1; // active slot 1
                let fr = FIRMWARE_REVISION.as_bytes();
                p[8..8 + fr.len().min(8)].copy_from_slice(&fr[..fr.len().min(8)]);
                p
            }
            // One notification per read, taken off the log (as nvmet).
            log_id::RESERVATION_NOTIFICATION if !self.is_discovery() => self
                .resv_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .to_bytes()
                .to_vec(),
            log_id::GIMBAL_VIRTUAL_VIEW if !self.is_discovery() => {
                let ns = self
                    .subsystem
                    .as_ref()
                    .and_then(|s| s.namespaces.get(&glp.nsid))
                    .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
                gimbal_view(ns, self.tenant).to_bytes().to_vec()
            }
            _ => return Err(Status::INVALID_LOG_PAGE.with_dnr()),
        };
        Ok(page)
    }

    fn set_features(&self, target: &Target, sf: &SetFeatures) -> AdminOutcome {
        let mut r = self.regs();
        match sf.fid {
            feature_id::NUMBER_OF_QUEUES if !self.is_discovery() => {
                let asked = NumberOfQueues::from_dword(sf.cdw11);
                if asked.nsq == 0xFFFF || asked.ncq == 0xFFFF {
                    return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
                }
                if !r.io_queues.is_empty() {
                    // The count may not change once I/O queues exist.
                    return AdminOutcome::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                }
                let max = target.config.limits.max_io_queues;
                let granted = (asked.nsq.min(asked.ncq) + 1).min(max);
                r.granted_io_queues = granted;
                AdminOutcome::ok_dw0(NumberOfQueues::with_count(granted).to_dword())
            }
            feature_id::KEEP_ALIVE_TIMER => {
                r.kato_ms = Self::kato_for(target, self.is_discovery(), sf.cdw11);
                AdminOutcome::status(Status::SUCCESS)
            }
            feature_id::ARBITRATION if !self.is_discovery() => {
                r.arbitration = Arbitration::from_dword(sf.cdw11);
                AdminOutcome::status(Status::SUCCESS)
            }
            feature_id::ASYNC_EVENT_CONFIGURATION => AdminOutcome::status(Status::SUCCESS),
            // The host identifier comes with Connect; nvmet refuses to
            // change it afterwards the same way.
            feature_id::HOST_IDENTIFIER => {
                AdminOutcome::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr())
            }
            feature_id::RESERVATION_NOTIFICATION_MASK if !self.is_discovery() => {
                drop(r);
                self.set_notification_mask(sf)
            }
            feature_id::RESERVATION_PERSISTENCE if !self.is_discovery() => {
                drop(r);
                let Some(ns) = self.namespace(sf.nsid) else {
                    return AdminOutcome::status(Status::INVALID_NAMESPACE.with_dnr());
                };
                let ptpl = ReservationPersistence::from_dword(sf.cdw11).ptpl;
                match ns.reservations.set_ptpl(ptpl) {
                    Err(status) => AdminOutcome::status(status),
                    Ok(outcome) => {
                        // A small file written and fsynced on this
                        // connection's thread: rare, and the host waits
                        // for it anyway.
                        if let Some((v, snap)) = outcome.persist {
                            if let Err(e) = ns.reservations.persist(v, snap.as_ref()) {
                                log::error!("namespace {}: persisting reservations: {e}", ns.nsid);
                                return AdminOutcome::status(Status::INTERNAL_ERROR);
                            }
                        }
                        AdminOutcome::ok_dw0(ReservationPersistence { ptpl }.to_dword())
                    }
                }
            }
            feature_id::VOLATILE_WRITE_CACHE if !self.is_discovery() => {
                // The cache cannot be turned off (page cache); accept enable.
                if sf.cdw11 & 1 == 1 {
                    AdminOutcome::status(Status::SUCCESS)
                } else {
                    AdminOutcome::status(Status::FEATURE_NOT_CHANGEABLE.with_dnr())
                }
            }
            _ => AdminOutcome::status(Status::INVALID_FIELD.with_dnr()),
        }
    }

    fn namespace(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        self.subsystem.as_ref()?.namespaces.get(&nsid)
    }

    /// Set Features Reservation Notification Mask: one namespace, or every
    /// one for NSID FFFFFFFFh; reserved bits are Invalid Field (nvmet).
    fn set_notification_mask(&self, sf: &SetFeatures) -> AdminOutcome {
        if sf.cdw11 & !ReservationNotificationMask::DEFINED != 0 {
            return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
        }
        let mask = ReservationNotificationMask::from_dword(sf.cdw11);
        let nsids: Vec<u32> = if sf.nsid == 0xFFFF_FFFF {
            self.ns_inflight.keys().copied().collect()
        } else if self.namespace(sf.nsid).is_some() {
            vec![sf.nsid]
        } else {
            return AdminOutcome::status(Status::INVALID_NAMESPACE.with_dnr());
        };
        let mut masks = self.resv_masks.lock().unwrap_or_else(|e| e.into_inner());
        for n in nsids {
            masks.insert(n, mask);
        }
        AdminOutcome::ok_dw0(mask.to_dword())
    }

    fn get_features(&self, sqe: &Sqe, gf: &GetFeatures) -> AdminOutcome {
        match gf.fid {
            // Only the 128-bit identifier exists over fabrics (EXHID must
            // be set, as nvmet): 16 bytes of data.
            feature_id::HOST_IDENTIFIER if !self.is_discovery() => {
                if gf.cdw11 & HOST_IDENTIFIER_EXHID == 0 {
                    return AdminOutcome::status(Status::INVALID_FIELD.with_dnr());
                }
                if let Err(status) = c2h_transfer_len(sqe, HOST_IDENTIFIER_LEN as u64) {
                    return AdminOutcome::status(status);
                }
                return data_reply(self.host_id.to_vec(), HOST_IDENTIFIER_LEN);
            }
            feature_id::RESERVATION_NOTIFICATION_MASK if !self.is_discovery() => {
                if self.namespace(gf.nsid).is_none() {
                    return AdminOutcome::status(Status::INVALID_NAMESPACE.with_dnr());
                }
                let masks = self.resv_masks.lock().unwrap_or_else(|e| e.into_inner());
                let mask = masks.get(&gf.nsid).copied().unwrap_or_default();
                return AdminOutcome::ok_dw0(mask.to_dword());
            }
            feature_id::RESERVATION_PERSISTENCE if !self.is_discovery() => {
                let Some(ns) = self.namespace(gf.nsid) else {
                    return AdminOutcome::status(Status::INVALID_NAMESPACE.with_dnr());
                };
                let ptpl = ns.reservations.snapshot().ptpl;
                return AdminOutcome::ok_dw0(ReservationPersistence { ptpl }.to_dword());
            }
            _ => {}
        }
        let r = self.regs();
        match gf.fid {
            feature_id::NUMBER_OF_QUEUES if !self.is_discovery() => AdminOutcome::ok_dw0(
                NumberOfQueues::with_count(r.granted_io_queues.max(1)).to_dword(),
            ),
            feature_id::KEEP_ALIVE_TIMER => AdminOutcome::ok_dw0(r.kato_ms),
            feature_id::ARBITRATION if !self.is_discovery() => {
                AdminOutcome::ok_dw0(r.arbitration.to_dword())
            }
            feature_id::ASYNC_EVENT_CONFIGURATION => AdminOutcome::ok_dw0(0),
            feature_id::VOLATILE_WRITE_CACHE if !self.is_discovery() => AdminOutcome::ok_dw0(1),
            _ => AdminOutcome::status(Status::INVALID_FIELD.with_dnr()),
        }
    }
}

/// A controller-to-host transfer's length: the data pointer must be a
/// transport data block describing exactly `expected` bytes, as Linux nvmet
/// checks (`nvmet_check_transfer_len`): any other length, zero included,
/// is Data SGL Length Invalid; in-capsule data cannot carry data to the
/// host (Invalid Field, as nvmet-tcp); other descriptor types are not
/// NVMe/TCP's (SGL Descriptor Type Invalid).
fn c2h_transfer_len(sqe: &Sqe, expected: u64) -> Result<usize, Status> {
    if u64::from(sqe.dptr.length) != expected {
        return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    }
    match sqe.dptr.kind() {
        SglKind::Transport { length } => Ok(length as usize),
        SglKind::InCapsule { .. } => Err(Status::INVALID_FIELD.with_dnr()),
        SglKind::Unsupported { .. } => Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
    }
}

/// A successful reply carrying `data` (at most `len` bytes) zero-filled to
/// `len`.
fn data_reply(mut data: Vec<u8>, len: usize) -> AdminOutcome {
    data.truncate(len);
    AdminOutcome::Reply {
        status: Status::SUCCESS,
        dw0: 0,
        dw1: 0,
        zeros: len - data.len(),
        data,
    }
}

/// The virtual view page of a namespace for one tenant.
pub fn gimbal_view(ns: &Namespace, tenant: u32) -> GimbalViewPage {
    let Some(v) = ns.pipeline.virtual_view() else {
        return GimbalViewPage {
            congestion_state: GimbalViewPage::NO_SWITCH,
            ..Default::default()
        };
    };
    GimbalViewPage {
        congestion_state: match v.congestion_state {
            CongestionState::Underutilized => 0,
            CongestionState::CongestionAvoidance => 1,
            CongestionState::Congested => 2,
            CongestionState::Overloaded => 3,
        },
        target_rate_bps: v.target_rate_bps,
        read_headroom_bps: v.read_headroom_bps,
        write_headroom_bps: v.write_headroom_bps,
        write_cost_milli: (v.write_cost * 1000.0).round() as u64,
        read_latency_ewma_ns: v.read_latency_ewma_ns.unwrap_or(0),
        write_latency_ewma_ns: v.write_latency_ewma_ns.unwrap_or(0),
        read_threshold_ns: v.read_latency_threshold_ns,
        write_threshold_ns: v.write_latency_threshold_ns,
        allotted_slots: v.allotted_slots,
        credit: ns.pipeline.credit(tenant).unwrap_or(0),
        in_flight: v.in_flight as u32,
        queued: v.queued as u32,
        at_ns: v.at_ns,
    }
}

/// The KATO a host gets: 0 stays 0 unless a default is configured; others
/// are clamped into the configured bounds.
pub fn clamp_kato(asked_ms: u32, min_ms: u32, max_ms: u32, default_ms: u32) -> u32 {
    match asked_ms {
        0 => default_ms,
        k => k.clamp(min_ms, max_ms),
    }
}

/// Identify Namespace for one namespace.
pub fn identify_namespace(ns: &Namespace) -> IdentifyNamespace {
    IdentifyNamespace {
        nsze: ns.size_blocks,
        ncap: ns.size_blocks,
        nuse: ns.size_blocks,
        // Deallocated blocks read back as zeros where the backend promises it.
        dlfeat: if ns.info.discard_zeroes { 0b001 } else { 0 },
        nsfeat: if ns.info.discard { 1 } else { 0 },
        nmic: 1,
        // Every reservation type, IEKEY as NVMe 1.3 defines it, and PTPL
        // where the state has somewhere to persist.
        rescap: rescap::ALL_TYPES
            | rescap::IEKEY_1_3
            | if ns.reservations.ptpl_supported() {
                rescap::PTPL
            } else {
                0
            },
        flbas: 0,
        nguid: ns.nguid,
        lba_formats: vec![LbaFormat::with_block_shift(ns.block_shift)],
        ..Default::default()
    }
}

/// The discovery log a host sees: one entry per (subsystem it may reach,
/// listening address).
pub fn discovery_log(target: &Target, host_nqn: &str) -> DiscoveryLogPage {
    let addrs = target
        .listen_addrs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut entries = Vec::new();
    for s in target.subsystems.values() {
        if !s.config.host_allowed(host_nqn) {
            continue;
        }
        for (port_id, addr) in addrs.iter().enumerate() {
            entries.push(DiscoveryLogEntry {
                trtype: trtype::TCP,
                adrfam: if addr.is_ipv4() {
                    adrfam::IPV4
                } else {
                    adrfam::IPV6
                },
                subtype: subtype::NVME,
                treq: treq::SECURE_CHANNEL_NOT_REQUIRED | treq::DISABLE_SQ_FLOW_CONTROL,
                portid: port_id as u16 + 1,
                cntlid: nvmf_proto::fabrics::CNTLID_DYNAMIC,
                asqsz: 32,
                eflags: 0,
                trsvcid: addr.port().to_string(),
                subnqn: s.nqn().to_string(),
                traddr: addr.ip().to_string(),
                tcp_sectype: tcp_sectype::NONE,
            });
        }
    }
    DiscoveryLogPage {
        // The configuration is fixed for the life of the process.
        genctr: 1,
        recfmt: 0,
        entries,
    }
}
