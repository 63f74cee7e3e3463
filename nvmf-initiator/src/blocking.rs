//! A blocking driver for tools and tests: `std::net::TcpStream`, one
//! `poll(2)` loop per connection, a maintenance thread per controller for
//! keep-alive and reconnect.
//!
//! - [`Controller::connect`] opens the admin queue and brings the
//!   controller up; admin helpers (`identify_*`, `get_log_page`) and simple
//!   synchronous `read`/`write`/`flush` are methods on it.
//! - [`Controller::io_queue`] opens one more I/O queue (its own TCP
//!   connection) for a thread that wants many commands in flight:
//!   [`IoQueue::submit`] then [`IoQueue::wait`].
//! - [`discover`] reads a discovery controller's log page.
//!
//! Failure handling follows [`crate::recovery`]: any queue that fails
//! (socket error, TermReq, protocol violation, timeout, keep-alive expiry)
//! resets the whole controller: every connection is shut down, the
//! maintenance thread reconnects the admin queue with a new controller ID
//! every `reconnect_delay`, and each [`IoQueue`] reconnects itself once the
//! controller is back, resubmitting what it held; or fails it after
//! `fast_io_fail_tmo`, or when `ctrl_loss_tmo` passes.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvmf_proto::auth::{DhchapSecret, HostAuthConfig};
use nvmf_proto::command::{cns, log_id, GetLogPage, Identify};
use nvmf_proto::fabrics::{
    property, Capabilities, ControllerConfiguration, ControllerStatus, Disconnect, PriorityClass,
    PropertyGet, PropertySet, Version, DISCOVERY_NQN,
};
use nvmf_proto::features::{feature_id, NumberOfQueues};
use nvmf_proto::identify::{ActiveNamespaceList, IdentifyController, IdentifyNamespace};
use nvmf_proto::log_page::{DiscoveryLogEntry, DiscoveryLogHeader, DiscoveryLogPage};
use nvmf_proto::reservation::{
    ReservationAcquire, ReservationRegister, ReservationRelease, ReservationReport,
    ReservationStatus, REGISTRANT_EXT_LEN, STATUS_EXT_HEADER_LEN,
};
use nvmf_proto::uuid::{format_uuid, parse_uuid};
use nvmf_proto::{Sqe, Status};

use crate::controller::{self, Arbitration, ControllerInfo, Namespace};
use crate::error::{Error, Result};
use crate::queue::{Command, Completion, Event, Queue, QueueConfig, Request};
use crate::recovery::{Disposition, Phase, ReconnectPolicy, Recovery};

/// Bytes handed to the socket per write call: large enough for a full
/// MDTS write, small enough to interleave reads.
const TRANSMIT_CHUNK: usize = 256 * 1024;

/// The host's identity: NQN and host ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Host NQN.
    pub nqn: String,
    /// Host identifier (UUID bytes).
    pub id: [u8; 16],
}

impl HostIdentity {
    /// The system's identity as nvme-cli keeps it (`/etc/nvme/hostnqn`,
    /// `/etc/nvme/hostid`), or a fresh random UUID-based one.
    pub fn system() -> Self {
        let nqn = std::fs::read_to_string("/etc/nvme/hostnqn")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        let id = std::fs::read_to_string("/etc/nvme/hostid")
            .ok()
            .and_then(|s| parse_uuid(s.trim()));
        match (nqn, id) {
            (Some(nqn), Some(id)) => Self { nqn, id },
            (Some(nqn), None) => {
                // An NQN of the uuid form carries its host ID.
                let id = nqn
                    .rsplit(':')
                    .next()
                    .and_then(parse_uuid)
                    .unwrap_or_else(random_uuid);
                Self { nqn, id }
            }
            _ => Self::random(),
        }
    }

    /// A random `nqn.2014-08.org.nvmexpress:uuid:...` identity.
    pub fn random() -> Self {
        let id = random_uuid();
        Self {
            nqn: format!("nqn.2014-08.org.nvmexpress:uuid:{}", format_uuid(&id)),
            id,
        }
    }
}

fn random_uuid() -> [u8; 16] {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        // No urandom: time and pid are unique enough for a host ID.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    b[6] = (b[6] & 0x0F) | 0x40;
    b[8] = (b[8] & 0x3F) | 0x80;
    b
}

/// How to connect to a controller.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Target address.
    pub addr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Who we are.
    pub host: HostIdentity,
    /// Keep alive timeout proposed in Connect (zero: none).
    pub kato: Duration,
    /// Ask for header digests.
    pub header_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// I/O queues to ask for in Set Features Number of Queues.
    pub io_queues: u16,
    /// Entries per I/O queue (capped by CAP.MQES).
    pub queue_depth: u16,
    /// Bound on TCP connect, ICReq and Connect.
    pub connect_timeout: Duration,
    /// Bound on each command.
    pub command_timeout: Duration,
    /// What to do when the connection breaks.
    pub reconnect: ReconnectPolicy,
    /// Arbitration mechanism to select in CC.AMS.
    pub arbitration: Arbitration,
    /// Set Features Arbitration (FID 01h) dword 11 (HPW, MPW, LPW, burst)
    /// to send after every enable, so the weights survive a controller
    /// reset; `None` leaves the controller's. Not sent when the controller
    /// runs round robin.
    pub arbitration_feature: Option<u32>,
    /// DH-HMAC-CHAP keys, used on every queue the target asks to
    /// authenticate, after every reconnect too.
    pub dhchap: Option<DhchapKeys>,
}

/// A host's DH-HMAC-CHAP keys (nvme-cli's `--dhchap-secret` and
/// `--dhchap-ctrl-secret`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhchapKeys {
    /// The host's secret: the host proves it knows it.
    pub secret: DhchapSecret,
    /// The controller's secret: when set, the target must prove it knows
    /// it, and a target that does not ask for authentication is refused.
    pub ctrl_secret: Option<DhchapSecret>,
}

impl ConnectOptions {
    /// Defaults like the kernel host: KATO 5 s, 128-entry queues, 30 s
    /// command timeout, the system's host identity.
    pub fn new(addr: SocketAddr, subnqn: &str) -> Self {
        Self {
            addr,
            subnqn: subnqn.to_owned(),
            host: HostIdentity::system(),
            kato: Duration::from_secs(5),
            header_digest: false,
            data_digest: false,
            io_queues: 4,
            queue_depth: 128,
            connect_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(30),
            reconnect: ReconnectPolicy::default(),
            arbitration: Arbitration::RoundRobin,
            arbitration_feature: None,
            dhchap: None,
        }
    }

    fn admin_config(&self) -> QueueConfig {
        let mut c = QueueConfig::admin(
            &self.host.nqn,
            self.host.id,
            &self.subnqn,
            self.kato.as_millis().min(u128::from(u32::MAX)) as u32,
        );
        c.header_digest = self.header_digest;
        c.data_digest = self.data_digest;
        c.connect_timeout = self.connect_timeout;
        c.command_timeout = self.command_timeout;
        // Offers every hash and group, as the Linux host does.
        c.auth = self.dhchap.as_ref().map(|k| {
            let mut a = HostAuthConfig::new(&self.host.nqn, &self.subnqn, k.secret.clone());
            a.ctrl_secret = k.ctrl_secret.clone();
            Arc::new(a)
        });
        c
    }
}

/// A finished request in the blocking driver: the completion, or the error
/// that ended it without one (reset with no requeue, fast_io_fail,
/// controller lost).
#[derive(Debug)]
pub struct IoCompletion {
    /// The request's `user_data`.
    pub user_data: u64,
    /// The buffer (read data after a successful read).
    pub buf: Option<Vec<u8>>,
    /// NVMe status and completion dwords, or why there is no completion.
    pub result: Result<CompletionInfo>,
}

/// The completion fields of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionInfo {
    /// NVMe status.
    pub status: Status,
    /// Completion dword 0.
    pub dw0: u32,
    /// Completion dword 1 (Gimbal credits).
    pub dw1: u32,
}

impl IoCompletion {
    fn from_completion(c: Completion<Vec<u8>>) -> Self {
        Self {
            user_data: c.user_data,
            buf: c.buf,
            result: Ok(CompletionInfo {
                status: c.status,
                dw0: c.dw0,
                dw1: c.dw1,
            }),
        }
    }

    fn failed(r: Request<Vec<u8>>, e: Error) -> Self {
        Self {
            user_data: r.user_data,
            buf: r.buf,
            result: Err(e),
        }
    }

    /// The buffer if the command succeeded, else the error (Reservation
    /// Conflict becomes [`Error::ReservationConflict`], any other NVMe
    /// error status [`Error::CommandFailed`], named `what`).
    pub fn into_result(self, what: &'static str) -> Result<Option<Vec<u8>>> {
        let info = self.result?;
        if !info.status.is_success() {
            return Err(Error::from_status(what, info.status));
        }
        Ok(self.buf)
    }
}

/// One TCP connection and its queue core: the pump.
struct Conn {
    sock: TcpStream,
    q: Queue<Vec<u8>>,
    tx: Vec<u8>,
    tx_off: usize,
    rx: Vec<u8>,
    next_user_data: u64,
}

impl Conn {
    /// TCP connect, ICReq, Connect; returns once live.
    fn open(addr: SocketAddr, cfg: QueueConfig) -> Result<Self> {
        let timeout = cfg.connect_timeout;
        let sock = TcpStream::connect_timeout(&addr, timeout).map_err(|e| Error::Unreachable {
            addr,
            source: Arc::new(e),
        })?;
        sock.set_nodelay(true).map_err(Error::io)?;
        sock.set_nonblocking(true).map_err(Error::io)?;
        let mut c = Self {
            sock,
            q: Queue::new(cfg, Instant::now()),
            tx: Vec::with_capacity(TRANSMIT_CHUNK),
            tx_off: 0,
            rx: vec![0; 256 * 1024],
            next_user_data: 1 << 63,
        };
        loop {
            c.pump(None)?;
            match c.q.poll_event() {
                Some(Event::Connected { .. }) => return Ok(c),
                Some(Event::Failed(e)) => return Err(e),
                _ => {}
            }
        }
    }

    /// Send what can be sent, wait for input or the queue's next timeout
    /// (or `until`), feed what arrived. Errors only on socket failures,
    /// which are also given to the queue (so its Failed event follows).
    fn pump(&mut self, until: Option<Instant>) -> Result<()> {
        if self.q.is_closed() && !self.q.has_transmit() && self.tx_off >= self.tx.len() {
            return Ok(());
        }
        self.flush_tx();
        if self.q.is_closed() {
            return Ok(());
        }
        // Read what is there before sleeping: at high queue depth the
        // answer is usually already in.
        if self.read_available()? {
            self.flush_tx();
            return Ok(());
        }
        let now = Instant::now();
        let deadline = match (self.q.poll_timeout(), until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout_ms = match deadline {
            _ if self.q.has_events() => 0,
            None => -1,
            Some(d) if d <= now => 0,
            Some(d) => (d - now).as_micros().div_ceil(1000).min(60_000) as i32,
        };
        if timeout_ms != 0 {
            let want_write = self.tx_off < self.tx.len();
            wait_fd(&self.sock, want_write, timeout_ms).map_err(Error::io)?;
            if self.read_available()? {
                self.flush_tx();
                return Ok(());
            }
        }
        let now = Instant::now();
        if self.q.poll_timeout().is_some_and(|t| t <= now) {
            self.q.handle_timeout(now);
        }
        // What the input or the timeout produced (H2CData after an R2T, a
        // Keep Alive) goes out now, not at the next pump.
        self.flush_tx();
        Ok(())
    }

    /// Write as much as the socket takes without blocking.
    fn flush_tx(&mut self) {
        loop {
            if self.tx_off >= self.tx.len() {
                self.tx.clear();
                self.tx_off = 0;
                if self.q.poll_transmit(&mut self.tx, TRANSMIT_CHUNK) == 0 {
                    return;
                }
            }
            match self.sock.write(&self.tx[self.tx_off..]) {
                Ok(n) => self.tx_off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.q.handle_io_error(e);
                    self.tx.clear();
                    self.tx_off = 0;
                    return;
                }
            }
        }
    }

    /// Read until the socket is drained (bounded); `true` if bytes came.
    fn read_available(&mut self) -> Result<bool> {
        let mut got = false;
        for _ in 0..16 {
            match self.sock.read(&mut self.rx) {
                Ok(0) => {
                    self.q.handle_closed();
                    return Ok(true);
                }
                Ok(n) => {
                    got = true;
                    self.q.handle_bytes(Instant::now(), &self.rx[..n]);
                    if n < self.rx.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.q.handle_io_error(e);
                    return Ok(true);
                }
            }
        }
        Ok(got)
    }

    /// Run one command to completion (admin bring-up and helpers).
    fn exec(&mut self, command: Command, buf: Option<Vec<u8>>) -> Result<IoCompletion> {
        let user_data = self.next_user_data;
        self.next_user_data += 1;
        self.q
            .submit(
                Instant::now(),
                Request {
                    command,
                    buf,
                    user_data,
                },
            )
            .map_err(|r| r.error)?;
        loop {
            self.pump(None)?;
            while let Some(ev) = self.q.poll_event() {
                match ev {
                    Event::Completed(c) if c.user_data == user_data => {
                        return Ok(IoCompletion::from_completion(c))
                    }
                    Event::Failed(e) => return Err(e),
                    _ => {}
                }
            }
        }
    }

    fn exec_ok(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        buf: Option<Vec<u8>>,
    ) -> Result<IoCompletion> {
        let c = self.exec(Command::Raw(sqe), buf)?;
        match &c.result {
            Ok(info) if !info.status.is_success() => Err(Error::CommandFailed {
                what,
                status: info.status,
            }),
            _ => Ok(c),
        }
    }

    fn property_get(&mut self, offset: u32, what: &'static str) -> Result<u64> {
        let c = self.exec_ok(what, PropertyGet::new(offset).to_sqe(0), None)?;
        let info = c.result?;
        Ok(u64::from(info.dw0) | (u64::from(info.dw1) << 32))
    }

    fn close(&mut self) {
        self.q.close();
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

/// Wait until `sock` is readable (or writable, if asked) or the timeout
/// passes (`-1`: forever).
fn wait_fd(sock: &TcpStream, want_write: bool, timeout_ms: i32) -> std::io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN | if want_write { libc::POLLOUT } else { 0 },
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; the fd stays
    // open because `sock` is borrowed.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Controller bring-up on a live admin connection.
fn bring_up(conn: &mut Conn, opts: &ConnectOptions, discovery: bool) -> Result<ControllerInfo> {
    let cap = Capabilities::from_u64(conn.property_get(property::CAP, "Property Get CAP")?);
    let version = Version::from_u32(conn.property_get(property::VS, "Property Get VS")? as u32);
    let cc = controller::enable_cc(&cap, opts.arbitration)?;
    conn.exec_ok(
        "Property Set CC",
        PropertySet::new(property::CC, u64::from(cc.to_u32())).to_sqe(0),
        None,
    )?;
    let ready_by = Instant::now() + controller::ready_timeout(&cap);
    loop {
        let csts = ControllerStatus::from_u32(
            conn.property_get(property::CSTS, "Property Get CSTS")? as u32,
        );
        if csts.fatal {
            return Err(Error::ControllerFatal);
        }
        if csts.ready {
            break;
        }
        if Instant::now() >= ready_by {
            return Err(Error::NotReady(controller::ready_timeout(&cap)));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let page = conn
        .exec_ok(
            "Identify Controller",
            Identify::new(cns::CONTROLLER, 0).to_sqe(0),
            Some(vec![0; 4096]),
        )?
        .buf
        .unwrap_or_default();
    let identify = IdentifyController::from_bytes(&page).map_err(|e| Error::BadData {
        what: "Identify Controller",
        source: e,
    })?;
    controller::check_identify(&identify)?;
    let max_transfer = controller::max_transfer_bytes(identify.mdts, &cap);
    let in_capsule = controller::in_capsule_bytes(&identify, max_transfer);
    let io_queues = if discovery {
        0
    } else {
        let want = NumberOfQueues::with_count(opts.io_queues.max(1));
        let sf =
            nvmf_proto::command::SetFeatures::new(feature_id::NUMBER_OF_QUEUES, want.to_dword());
        let c = conn.exec_ok("Set Features Number of Queues", sf.to_sqe(0), None)?;
        let got = NumberOfQueues::from_dword(c.result?.dw0);
        got.queue_pairs().min(u32::from(opts.io_queues.max(1))) as u16
    };
    let arbitration = opts.arbitration.resolve(&cap);
    // Weights mean nothing under round robin, and targets that offer only
    // round robin (Linux nvmet) refuse the feature.
    if let (Some(dw11), false, true) = (
        opts.arbitration_feature,
        discovery,
        arbitration.uses_classes(),
    ) {
        let sf = nvmf_proto::command::SetFeatures::new(feature_id::ARBITRATION, dw11);
        conn.exec_ok("Set Features Arbitration", sf.to_sqe(0), None)?;
    }
    conn.q.set_limits(max_transfer, 8192.min(max_transfer));
    let kato_ms = conn.q.config().kato_ms;
    if kato_ms > 0 {
        let kato = Duration::from_millis(u64::from(kato_ms));
        conn.q.start_keep_alive(Instant::now(), kato / 2, kato);
    }
    Ok(ControllerInfo {
        cntlid: conn.q.cntlid(),
        cap,
        version,
        identify,
        io_queues,
        max_queue_depth: (u32::from(cap.mqes) + 1).min(u32::from(u16::MAX)) as u16,
        max_transfer_bytes: max_transfer,
        in_capsule_bytes: in_capsule,
        kato_ms,
        arbitration,
    })
}

struct CtrlState {
    recovery: Recovery,
    /// Bumped by every successful (re)connect.
    epoch: u64,
    info: ControllerInfo,
    /// Clones of I/O sockets, to shut them down on a reset.
    io_socks: HashMap<u64, TcpStream>,
    /// What broke the last connection.
    cause: Option<Error>,
    next_qid: u16,
    free_qids: Vec<u16>,
}

struct Shared {
    opts: ConnectOptions,
    state: Mutex<CtrlState>,
    cond: Condvar,
    admin: Mutex<Option<Conn>>,
    shutdown: AtomicBool,
    next_sock_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, CtrlState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection of `epoch` failed: reset the controller once.
    fn report(&self, epoch: u64, err: &Error) {
        let mut s = self.lock();
        if s.epoch != epoch || !s.recovery.is_live() {
            return;
        }
        s.recovery.on_failure(Instant::now(), err);
        s.cause = Some(err.clone());
        for sock in s.io_socks.values() {
            let _ = sock.shutdown(Shutdown::Both);
        }
        drop(s);
        self.cond.notify_all();
    }
}

/// A connected NVMe/TCP controller (blocking driver); see the module
/// documentation.
pub struct Controller {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    sync_queue: Mutex<Option<IoQueue>>,
    block_sizes: Mutex<HashMap<u32, u32>>,
}

impl Controller {
    /// Connect the admin queue and bring the controller up. The first
    /// connection is not retried: an unreachable target, an unknown NQN or
    /// a refused host is reported at once.
    pub fn connect(opts: ConnectOptions) -> Result<Self> {
        let mut conn = Conn::open(opts.addr, opts.admin_config())?;
        let info = bring_up(&mut conn, &opts, false)?;
        let name = format!("nvme-tcp {} {}", opts.addr, opts.subnqn);
        log::info!(
            "{name}: connected, controller {} ({} I/O queues, MDTS {} bytes)",
            info.cntlid,
            info.io_queues,
            info.max_transfer_bytes
        );
        let shared = Arc::new(Shared {
            state: Mutex::new(CtrlState {
                recovery: Recovery::new(name, opts.reconnect),
                epoch: 0,
                info,
                io_socks: HashMap::new(),
                cause: None,
                next_qid: 1,
                free_qids: Vec::new(),
            }),
            opts,
            cond: Condvar::new(),
            admin: Mutex::new(Some(conn)),
            shutdown: AtomicBool::new(false),
            next_sock_id: AtomicU64::new(0),
        });
        let s2 = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("nvmf-maint".into())
            .spawn(move || maintenance(&s2))
            .map_err(Error::io)?;
        Ok(Self {
            shared,
            thread: Some(thread),
            sync_queue: Mutex::new(None),
            block_sizes: Mutex::new(HashMap::new()),
        })
    }

    /// What bring-up learned (of the current connection).
    pub fn info(&self) -> ControllerInfo {
        self.shared.lock().info.clone()
    }

    /// Controller resets (connection losses) so far.
    pub fn resets(&self) -> u64 {
        self.shared.lock().recovery.resets()
    }

    /// Whether the controller is connected right now.
    pub fn is_live(&self) -> bool {
        self.shared.lock().recovery.is_live()
    }

    /// Run an admin command (waits for a reconnect in progress).
    pub fn admin(&self, sqe: Sqe, buf: Option<Vec<u8>>) -> Result<IoCompletion> {
        loop {
            let epoch = self.wait_live(None)?;
            let mut admin = self.shared.admin.lock().unwrap_or_else(|p| p.into_inner());
            let Some(conn) = admin.as_mut() else {
                drop(admin);
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            match conn.exec(Command::Raw(sqe), buf.clone()) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    drop(admin);
                    self.shared.report(epoch, &e);
                    return Err(e);
                }
            }
        }
    }

    fn admin_ok(&self, what: &'static str, sqe: Sqe, buf: Option<Vec<u8>>) -> Result<IoCompletion> {
        let c = self.admin(sqe, buf)?;
        match &c.result {
            Ok(i) if !i.status.is_success() => Err(Error::CommandFailed {
                what,
                status: i.status,
            }),
            _ => Ok(c),
        }
    }

    /// Identify Controller, read now.
    pub fn identify_controller(&self) -> Result<IdentifyController> {
        let c = self.admin_ok(
            "Identify Controller",
            Identify::new(cns::CONTROLLER, 0).to_sqe(0),
            Some(vec![0; 4096]),
        )?;
        IdentifyController::from_bytes(&c.buf.unwrap_or_default()).map_err(|e| Error::BadData {
            what: "Identify Controller",
            source: e,
        })
    }

    /// Identify Namespace `nsid`.
    pub fn identify_namespace(&self, nsid: u32) -> Result<Namespace> {
        let c = self.admin_ok(
            "Identify Namespace",
            Identify::new(cns::NAMESPACE, nsid).to_sqe(0),
            Some(vec![0; 4096]),
        )?;
        let id = IdentifyNamespace::from_bytes(&c.buf.unwrap_or_default()).map_err(|e| {
            Error::BadData {
                what: "Identify Namespace",
                source: e,
            }
        })?;
        let ns = Namespace::from_identify(nsid, id)?;
        self.block_sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(nsid, ns.block_size);
        Ok(ns)
    }

    /// Active namespace IDs.
    pub fn active_namespaces(&self) -> Result<Vec<u32>> {
        let c = self.admin_ok(
            "Identify Active Namespace List",
            Identify::new(cns::ACTIVE_NAMESPACE_LIST, 0).to_sqe(0),
            Some(vec![0; 4096]),
        )?;
        Ok(ActiveNamespaceList::from_bytes(&c.buf.unwrap_or_default())
            .map_err(|e| Error::BadData {
                what: "Active Namespace List",
                source: e,
            })?
            .nsids)
    }

    /// Get Log Page `lid` (`len` bytes, a multiple of 4, from `offset`).
    pub fn get_log_page(&self, lid: u8, nsid: u32, len: u32, offset: u64) -> Result<Vec<u8>> {
        let g = GetLogPage::new(lid, nsid, len, offset).map_err(|_| {
            Error::InvalidRequest("log page length must be a non-zero multiple of 4")
        })?;
        Ok(self
            .admin_ok("Get Log Page", g.to_sqe(0), Some(vec![0; len as usize]))?
            .buf
            .unwrap_or_default())
    }

    /// Open one more I/O queue (its own TCP connection) of `class`.
    pub fn io_queue(&self, class: PriorityClass) -> Result<IoQueue> {
        let qid = {
            let mut s = self.shared.lock();
            match s.free_qids.pop() {
                Some(q) => q,
                None if s.next_qid <= s.info.io_queues => {
                    s.next_qid += 1;
                    s.next_qid - 1
                }
                None => return Err(Error::InvalidRequest("all granted I/O queues are in use")),
            }
        };
        let mut q = IoQueue {
            shared: Arc::clone(&self.shared),
            qid,
            class,
            conn: None,
            epoch: 0,
            sock_id: self.shared.next_sock_id.fetch_add(1, Ordering::Relaxed),
            held: VecDeque::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            cause: None,
        };
        q.connect()?;
        Ok(q)
    }

    /// For a driver that runs its own [`Queue`] per I/O queue (the ublk
    /// server's io_uring pump): reserve an I/O queue ID and get the
    /// [`QueueConfig`] to connect it with, and the controller epoch it
    /// belongs to. The admin queue, keep-alive and reconnect stay with this
    /// handle; the pump reports its failures with [`Controller::report_failure`]
    /// and, after [`Controller::wait_until_live`] returns a newer epoch, opens a new
    /// [`Queue`] with a fresh config (the controller ID changes). Release the
    /// ID with [`Controller::release_qid`].
    pub fn io_queue_config(&self, class: PriorityClass) -> Result<(u64, QueueConfig)> {
        let mut s = self.shared.lock();
        let qid = match s.free_qids.pop() {
            Some(q) => q,
            None if s.next_qid <= s.info.io_queues => {
                s.next_qid += 1;
                s.next_qid - 1
            }
            None => return Err(Error::InvalidRequest("all granted I/O queues are in use")),
        };
        Ok((s.epoch, self.config_for(&s, qid, class)))
    }

    /// The config to reconnect I/O queue `qid` with, in the current epoch.
    pub fn io_queue_reconnect_config(&self, qid: u16, class: PriorityClass) -> (u64, QueueConfig) {
        let s = self.shared.lock();
        (s.epoch, self.config_for(&s, qid, class))
    }

    fn config_for(&self, s: &CtrlState, qid: u16, class: PriorityClass) -> QueueConfig {
        let opts = &self.shared.opts;
        let depth = opts.queue_depth.min(s.info.max_queue_depth).max(2);
        let mut cfg = QueueConfig::io(&opts.admin_config(), qid, s.info.cntlid, depth);
        cfg.priority = class;
        cfg.max_transfer_bytes = s.info.max_transfer_bytes;
        cfg.in_capsule_bytes = s.info.in_capsule_bytes;
        cfg
    }

    /// Give back an I/O queue ID from [`Controller::io_queue_config`].
    pub fn release_qid(&self, qid: u16) {
        self.shared.lock().free_qids.push(qid);
    }

    /// The controller epoch: bumped by every successful reconnect.
    pub fn epoch(&self) -> u64 {
        self.shared.lock().epoch
    }

    /// A connection of `epoch` failed: reset the controller (once, however
    /// many queues report it).
    pub fn report_failure(&self, epoch: u64, err: &Error) {
        self.shared.report(epoch, err);
    }

    /// What to do now with I/O that has no connection (requeue, or fail
    /// after `fast_io_fail_tmo` / when lost), and the error to fail it with.
    pub fn disposition(&self) -> std::result::Result<(), Error> {
        let s = self.shared.lock();
        match s.recovery.disposition(Instant::now()) {
            Disposition::Requeue => Ok(()),
            Disposition::Fail(kind) => {
                let cause = s.cause.clone().unwrap_or(Error::QueueClosed);
                Err(s.recovery.error_for(kind, &cause))
            }
        }
    }

    /// Wait until the controller is live (its epoch) or lost (the error),
    /// at most `timeout`.
    pub fn wait_until_live(&self, timeout: Duration) -> Result<u64> {
        self.wait_live(Some(Instant::now() + timeout))
    }

    fn block_size(&self, nsid: u32) -> Result<u32> {
        if let Some(b) = self
            .block_sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&nsid)
        {
            return Ok(*b);
        }
        Ok(self.identify_namespace(nsid)?.block_size)
    }

    fn sync_io(
        &self,
        command: Command,
        buf: Option<Vec<u8>>,
        what: &'static str,
    ) -> Result<Option<Vec<u8>>> {
        let mut guard = self.sync_queue.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.io_queue(PriorityClass::Medium)?);
        }
        let q = guard.as_mut().expect("just set");
        q.submit(Request {
            command,
            buf,
            user_data: 0,
        });
        let c = q.wait().ok_or(Error::QueueClosed)?;
        c.into_result(what)
    }

    /// Read `buf.len()` bytes (a block multiple) from block `slba`.
    pub fn read(&self, nsid: u32, slba: u64, buf: &mut [u8]) -> Result<()> {
        let block_size = self.block_size(nsid)?;
        let data = self.sync_io(
            Command::Read {
                nsid,
                slba,
                block_size,
            },
            Some(vec![0; buf.len()]),
            "Read",
        )?;
        buf.copy_from_slice(&data.unwrap_or_default());
        Ok(())
    }

    /// Write `data` (a block multiple) at block `slba`.
    pub fn write(&self, nsid: u32, slba: u64, data: &[u8]) -> Result<()> {
        let block_size = self.block_size(nsid)?;
        self.sync_io(
            Command::Write {
                nsid,
                slba,
                block_size,
                fua: false,
            },
            Some(data.to_vec()),
            "Write",
        )?;
        Ok(())
    }

    /// Flush namespace `nsid`'s volatile write cache.
    pub fn flush(&self, nsid: u32) -> Result<()> {
        self.sync_io(Command::Flush { nsid }, None, "Flush")?;
        Ok(())
    }

    /// Reservation Register on `cmd.nsid` (register, unregister or replace
    /// a key; CPTPL asks the target to keep reservations across a
    /// restart). Reservation Conflict is [`Error::ReservationConflict`].
    pub fn reservation_register(&self, cmd: &ReservationRegister) -> Result<()> {
        let sqe = cmd.to_sqe(0);
        self.sync_io(
            Command::Raw(sqe),
            Some(cmd.data().to_vec()),
            "Reservation Register",
        )?;
        Ok(())
    }

    /// Reservation Acquire on `cmd.nsid` (acquire, preempt, preempt and
    /// abort). With Preempt and Abort the target completes it only once
    /// the preempted hosts' commands have drained.
    pub fn reservation_acquire(&self, cmd: &ReservationAcquire) -> Result<()> {
        self.sync_io(
            Command::Raw(cmd.to_sqe(0)),
            Some(cmd.data().to_vec()),
            "Reservation Acquire",
        )?;
        Ok(())
    }

    /// Reservation Release on `cmd.nsid` (release or clear).
    pub fn reservation_release(&self, cmd: &ReservationRelease) -> Result<()> {
        self.sync_io(
            Command::Raw(cmd.to_sqe(0)),
            Some(cmd.data().to_vec()),
            "Reservation Release",
        )?;
        Ok(())
    }

    /// Reservation Report on `nsid`, extended structure (128-bit host
    /// identifiers, as over fabrics). Asks for room for 63 registrants and,
    /// if REGCTL says there are more, once more for all of them (within
    /// the transfer limit).
    pub fn reservation_report(&self, nsid: u32) -> Result<ReservationStatus> {
        let mut len = 4096u32;
        loop {
            let cmd = ReservationReport::new(nsid, len, true).map_err(|e| Error::BadData {
                what: "Reservation Report",
                source: e,
            })?;
            let data = self
                .sync_io(
                    Command::Raw(cmd.to_sqe(0)),
                    Some(vec![0; len as usize]),
                    "Reservation Report",
                )?
                .unwrap_or_default();
            let status = ReservationStatus::decode(&data, true).map_err(|e| Error::BadData {
                what: "Reservation Status",
                source: e,
            })?;
            let all = (STATUS_EXT_HEADER_LEN + REGISTRANT_EXT_LEN * usize::from(status.regctl))
                .min(self.info().max_transfer_bytes as usize) as u32
                & !3;
            if status.registrants.len() >= usize::from(status.regctl) || all <= len {
                return Ok(status);
            }
            len = all;
        }
    }

    /// Wait until the controller is live; its epoch, or why it never will be.
    fn wait_live(&self, until: Option<Instant>) -> Result<u64> {
        let mut s = self.shared.lock();
        loop {
            if self.shared.shutdown.load(Ordering::SeqCst) {
                return Err(Error::Shutdown);
            }
            match s.recovery.phase() {
                Phase::Live => return Ok(s.epoch),
                Phase::Lost(e) => return Err(e.clone()),
                Phase::Reconnecting { .. } => {}
            }
            let wait = until.map_or(Duration::from_secs(1), |u| {
                u.saturating_duration_since(Instant::now())
            });
            if until.is_some_and(|u| Instant::now() >= u) {
                return Err(s.cause.clone().unwrap_or(Error::QueueClosed));
            }
            s = self
                .shared
                .cond
                .wait_timeout(s, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Orderly shutdown: Disconnect the I/O queue this handle opened for
    /// `read`/`write`, then a normal shutdown notification (CC.SHN) on the
    /// admin queue, then close.
    pub fn disconnect(mut self) -> Result<()> {
        if let Some(q) = self
            .sync_queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = q.disconnect();
        }
        let mut cc = ControllerConfiguration::from_u32(0);
        if let Some(conn) = self
            .shared
            .admin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            if let Ok(v) = conn.property_get(property::CC, "Property Get CC") {
                cc = ControllerConfiguration::from_u32(v as u32);
            }
            cc.shn = 1;
            let _ = conn.exec_ok(
                "Property Set CC",
                PropertySet::new(property::CC, u64::from(cc.to_u32())).to_sqe(0),
                None,
            );
        }
        self.stop();
        Ok(())
    }

    fn stop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let mut s = self.shared.lock();
            s.recovery.give_up(Error::Shutdown);
            for sock in s.io_socks.values() {
                let _ = sock.shutdown(Shutdown::Both);
            }
        }
        self.shared.cond.notify_all();
        if let Some(conn) = self
            .shared
            .admin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            conn.close();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.sync_queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.stop();
    }
}

/// The controller's maintenance thread: keep-alive while live, reconnect
/// after a reset.
fn maintenance(shared: &Shared) {
    loop {
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let (live, epoch, due) = {
            let s = shared.lock();
            (s.recovery.is_live(), s.epoch, s.recovery.poll_timeout())
        };
        if live {
            keep_alive_step(shared, epoch);
            continue;
        }
        // Reconnecting (or lost): wait for the next attempt.
        let Some(due) = due else {
            // Lost: nothing more to do.
            let s = shared.lock();
            let _ = shared.cond.wait_timeout(s, Duration::from_millis(200));
            continue;
        };
        let now = Instant::now();
        if now < due {
            let s = shared.lock();
            let _ = shared.cond.wait_timeout(s, due - now);
            continue;
        }
        if let Some(mut old) = shared
            .admin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            old.close();
        }
        let attempt = Conn::open(shared.opts.addr, shared.opts.admin_config())
            .and_then(|mut c| bring_up(&mut c, &shared.opts, false).map(|info| (c, info)));
        let mut s = shared.lock();
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        match attempt {
            Ok((conn, info)) => {
                *shared.admin.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
                s.info = info;
                s.epoch += 1;
                s.recovery.on_reconnected(Instant::now());
            }
            Err(e) => s.recovery.on_attempt_failed(Instant::now(), &e),
        }
        drop(s);
        shared.cond.notify_all();
    }
}

/// Sleep until the next Keep Alive is due (or a reset), then send it and
/// wait for its answer; a failure resets the controller.
fn keep_alive_step(shared: &Shared, epoch: u64) {
    let now = Instant::now();
    let next = {
        let admin = shared.admin.lock().unwrap_or_else(|p| p.into_inner());
        match admin.as_ref() {
            None => None,
            // Keep-alive off: look at the socket now and then anyway.
            Some(c) if c.q.config().kato_ms == 0 => Some(now + Duration::from_millis(500)),
            // None here means a Keep Alive is in flight: pump below.
            Some(c) => c.q.next_keep_alive().map(|t| t.max(now)),
        }
    };
    if let Some(due) = next.filter(|&t| t > now) {
        let s = shared.lock();
        let wait = (due - now).min(Duration::from_millis(500));
        let (s, _) = shared
            .cond
            .wait_timeout_while(s, wait, |s| {
                s.epoch == epoch && s.recovery.is_live() && !shared.shutdown.load(Ordering::SeqCst)
            })
            .unwrap_or_else(|p| p.into_inner());
        drop(s);
        // Look at the socket without waiting: a TermReq or a close from the
        // target is noticed between keep-alives.
        let mut admin = shared.admin.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(conn) = admin.as_mut() {
            let _ = conn.pump(Some(Instant::now()));
            if let Some(Event::Failed(e)) = conn.q.poll_event() {
                drop(admin);
                shared.report(epoch, &e);
            }
        }
        return;
    }
    let mut admin = shared.admin.lock().unwrap_or_else(|p| p.into_inner());
    let Some(conn) = admin.as_mut() else {
        drop(admin);
        std::thread::sleep(Duration::from_millis(10));
        return;
    };
    // Pump until the Keep Alive is answered (next one scheduled) or fails.
    loop {
        let r = conn.pump(None);
        let failed = match conn.q.poll_event() {
            Some(Event::Failed(e)) => Some(e),
            _ => r.err(),
        };
        if let Some(e) = failed {
            drop(admin);
            shared.report(epoch, &e);
            return;
        }
        if conn.q.next_keep_alive().is_some_and(|t| t > Instant::now()) || conn.q.is_closed() {
            return;
        }
    }
}

/// One I/O queue of a [`Controller`], driven by the thread that owns it.
///
/// Submit any number of requests, then `wait` for completions one at a
/// time; the queue keeps up to its depth in flight and holds the rest.
/// Across a controller reset it reconnects by itself and resubmits.
pub struct IoQueue {
    shared: Arc<Shared>,
    qid: u16,
    class: PriorityClass,
    conn: Option<Conn>,
    epoch: u64,
    sock_id: u64,
    /// Requests waiting for a connection.
    held: VecDeque<Request<Vec<u8>>>,
    ready: VecDeque<IoCompletion>,
    /// Requests submitted to `conn` and not yet completed.
    in_flight: usize,
    cause: Option<Error>,
}

impl IoQueue {
    /// Queue ID.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Requests submitted and not yet returned by `wait`.
    pub fn outstanding(&self) -> usize {
        self.in_flight + self.held.len() + self.ready.len()
    }

    fn connect(&mut self) -> Result<()> {
        let (epoch, info) = {
            let s = self.shared.lock();
            if !s.recovery.is_live() {
                return Err(s.cause.clone().unwrap_or(Error::QueueClosed));
            }
            (s.epoch, s.info.clone())
        };
        let opts = &self.shared.opts;
        let depth = opts.queue_depth.min(info.max_queue_depth).max(2);
        let mut cfg = QueueConfig::io(&opts.admin_config(), self.qid, info.cntlid, depth);
        cfg.priority = self.class;
        cfg.max_transfer_bytes = info.max_transfer_bytes;
        cfg.in_capsule_bytes = info.in_capsule_bytes;
        let conn = Conn::open(opts.addr, cfg)?;
        let clone = conn.sock.try_clone().map_err(Error::io)?;
        let mut s = self.shared.lock();
        if s.epoch != epoch {
            // A reset happened meanwhile; this connection is stale.
            return Err(Error::QueueClosed);
        }
        s.io_socks.insert(self.sock_id, clone);
        drop(s);
        self.epoch = epoch;
        self.conn = Some(conn);
        Ok(())
    }

    /// Accept a request; it is sent at once if the queue is connected, else
    /// held for the reconnect (or failed, as the policy says).
    pub fn submit(&mut self, request: Request<Vec<u8>>) {
        if let Some(conn) = self.conn.as_mut() {
            match conn.q.submit(Instant::now(), request) {
                // Sent by the next `wait` (or `flush`): a burst of
                // submissions goes out in one write.
                Ok(()) => self.in_flight += 1,
                Err(r) => match r.error {
                    Error::QueueClosed => self.dispose(r.request),
                    e => self.ready.push_back(IoCompletion::failed(r.request, e)),
                },
            }
        } else {
            self.dispose(request);
        }
    }

    fn dispose(&mut self, request: Request<Vec<u8>>) {
        let s = self.shared.lock();
        match s.recovery.disposition(Instant::now()) {
            Disposition::Requeue => self.held.push_back(request),
            Disposition::Fail(kind) => {
                let cause = s.cause.clone().unwrap_or(Error::QueueClosed);
                let e = s.recovery.error_for(kind, &cause);
                drop(s);
                self.ready.push_back(IoCompletion::failed(request, e));
            }
        }
    }

    /// Send what `submit` queued without waiting for anything (for a caller
    /// that submits and then does other work before `wait`).
    pub fn flush(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.flush_tx();
        }
    }

    /// The next finished request, waiting as long as it takes (through
    /// reconnects, bounded by the policy); `None` if nothing is outstanding.
    pub fn wait(&mut self) -> Option<IoCompletion> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Some(c);
            }
            if self.in_flight == 0 && self.held.is_empty() {
                return None;
            }
            if let Some(conn) = self.conn.as_mut() {
                if let Err(e) = conn.pump(None) {
                    self.cause = Some(e);
                }
                let mut failed = None;
                while let Some(ev) = conn.q.poll_event() {
                    match ev {
                        Event::Completed(c) => {
                            self.in_flight -= 1;
                            self.ready.push_back(IoCompletion::from_completion(c));
                        }
                        Event::Failed(e) => failed = Some(e),
                        Event::Connected { .. } => {}
                    }
                }
                if let Some(e) = failed {
                    self.lose_connection(e);
                }
                continue;
            }
            self.wait_for_controller();
        }
    }

    fn lose_connection(&mut self, e: Error) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        self.shared.report(self.epoch, &e);
        self.shared.lock().io_socks.remove(&self.sock_id);
        conn.close();
        let unfinished = conn.q.take_unfinished();
        self.in_flight = 0;
        for r in unfinished {
            self.dispose(r);
        }
    }

    /// No connection: wait for the controller to come back (then reconnect
    /// and resubmit), for fast_io_fail (fail what is held), or for it to be
    /// lost (fail everything).
    fn wait_for_controller(&mut self) {
        let mut s = self.shared.lock();
        loop {
            let now = Instant::now();
            match s.recovery.phase() {
                Phase::Live => {
                    drop(s);
                    match self.connect() {
                        Ok(()) => {
                            let held: Vec<_> = self.held.drain(..).collect();
                            for r in held {
                                self.submit(r);
                            }
                        }
                        Err(e) => {
                            // The new controller broke already: that is a
                            // reset of its own.
                            let epoch = self.shared.lock().epoch;
                            self.shared.report(epoch, &e);
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    return;
                }
                Phase::Lost(_) => {
                    drop(s);
                    self.fail_held();
                    return;
                }
                _ => {}
            }
            if let Disposition::Fail(_) = s.recovery.disposition(now) {
                if !self.held.is_empty() {
                    drop(s);
                    self.fail_held();
                    return;
                }
            }
            let wake = [s.recovery.fast_io_fail_at(), s.recovery.poll_timeout()]
                .into_iter()
                .flatten()
                .filter(|t| *t > now)
                .min()
                .map_or(Duration::from_millis(500), |t| t - now);
            s = self
                .shared
                .cond
                .wait_timeout(s, wake.min(Duration::from_millis(500)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn fail_held(&mut self) {
        let held: Vec<_> = self.held.drain(..).collect();
        for r in held {
            let s = self.shared.lock();
            let kind = match s.recovery.disposition(Instant::now()) {
                Disposition::Fail(k) => k,
                Disposition::Requeue => crate::recovery::ErrorKind::FastIoFail,
            };
            let cause = s.cause.clone().unwrap_or(Error::QueueClosed);
            let e = s.recovery.error_for(kind, &cause);
            drop(s);
            self.ready.push_back(IoCompletion::failed(r, e));
        }
    }

    /// Send Disconnect (deletes this I/O queue at the target) and close.
    pub fn disconnect(mut self) -> Result<()> {
        let r = match self.conn.as_mut() {
            Some(conn) => conn
                .exec_ok("Disconnect", Disconnect::default().to_sqe(0), None)
                .map(|_| ()),
            None => Ok(()),
        };
        r
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        if let Some(mut c) = self.conn.take() {
            c.close();
        }
        let mut s = self.shared.lock();
        s.io_socks.remove(&self.sock_id);
        s.free_qids.push(self.qid);
    }
}

/// Read the discovery log page of the discovery controller at `addr`.
pub fn discover(
    addr: SocketAddr,
    host: &HostIdentity,
    timeout: Duration,
    dhchap: Option<&DhchapKeys>,
) -> Result<Vec<DiscoveryLogEntry>> {
    let mut opts = ConnectOptions::new(addr, DISCOVERY_NQN);
    opts.host = host.clone();
    // A discovery controller may ask for authentication too (nvmet does
    // for a host with a key); the keys are the host's, as with nvme-cli.
    opts.dhchap = dhchap.cloned();
    opts.kato = Duration::ZERO;
    opts.connect_timeout = timeout;
    opts.command_timeout = timeout;
    let mut conn = Conn::open(addr, opts.admin_config())?;
    bring_up(&mut conn, &opts, true)?;
    // The page may change while it is read: re-read until GENCTR is stable
    // (bounded, like nvme-cli).
    let mut result = Err(Error::Unsupported("discovery log kept changing"));
    for _ in 0..10 {
        let read = |conn: &mut Conn, len: u32| -> Result<Vec<u8>> {
            let g = GetLogPage::new(log_id::DISCOVERY, 0, len, 0).map_err(|e| Error::BadData {
                what: "discovery log request",
                source: e,
            })?;
            Ok(conn
                .exec_ok(
                    "Get Log Page (discovery)",
                    g.to_sqe(0),
                    Some(vec![0; len as usize]),
                )?
                .buf
                .unwrap_or_default())
        };
        let head = read(&mut conn, 1024)?;
        let h = DiscoveryLogHeader::from_bytes(&head).map_err(|e| Error::BadData {
            what: "discovery log header",
            source: e,
        })?;
        let len = h
            .page_len()
            .filter(|&l| l <= 1024 * 1025)
            .ok_or(Error::Unsupported("discovery log with too many records"))?;
        let page = read(&mut conn, len as u32)?;
        let again = DiscoveryLogHeader::from_bytes(&read(&mut conn, 1024)?).map_err(|e| {
            Error::BadData {
                what: "discovery log header",
                source: e,
            }
        })?;
        if again.genctr != h.genctr {
            continue;
        }
        result = DiscoveryLogPage::from_bytes(&page)
            .map(|p| p.entries)
            .map_err(|e| Error::BadData {
                what: "discovery log page",
                source: e,
            });
        break;
    }
    conn.close();
    result
}
