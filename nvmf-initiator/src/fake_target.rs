//! A scripted NVMe/TCP target for tests: enough of a controller to bring up
//! and do I/O against a RAM namespace, plus faults a real target should
//! never produce (bad PLEN, R2T for an unknown command, data beyond the
//! buffer, digest errors, TermReq, stale completions, silence).
//!
//! [`FakeConnection`] is sans-IO like the host's queue (bytes in, bytes
//! out), so core tests run a host queue against it in memory on a virtual
//! clock. [`FakeTarget::serve`] puts it behind a loopback TCP listener for
//! tests of the blocking driver and the CLI.
//!
//! Built with the `test-support` feature; not for production use.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nvmf_proto::auth::{CtrlAuth, CtrlAuthConfig, DhchapSecret};
use nvmf_proto::command::{cns, log_id, AdminCommand, IoCommand};
use nvmf_proto::cqe::Cqe;
use nvmf_proto::decoder::{DecoderConfig, PduReader};
use nvmf_proto::fabrics::{
    connect_success_dw0, fctype, property, AuthReq, AuthenticationReceive, AuthenticationSend,
    Capabilities, ConnectData, ConnectInvalidParameter, ControllerConfiguration, ControllerStatus,
    FabricsCommand, Version, DISCOVERY_NQN,
};
use nvmf_proto::features::{feature_id, NumberOfQueues};
use nvmf_proto::identify::{ActiveNamespaceList, IdentifyController, IdentifyNamespace, LbaFormat};
use nvmf_proto::log_page::{copy_window, DiscoveryLogEntry, DiscoveryLogPage};
use nvmf_proto::pdu::{C2HData, CapsuleResp, EncodeConfig, IcResp, Pdu, Role, TermReq, R2T};
use nvmf_proto::{FatalErrorStatus, Sqe, Status};

/// A misbehaviour to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A CapsuleResp whose PLEN is smaller than its header.
    BadPlen,
    /// An R2T naming a command ID that is not outstanding.
    R2tUnknownCid,
    /// C2HData that runs past the end of the read buffer.
    C2HBeyondBuffer,
    /// C2HData that skips ahead (a gap in the data).
    C2HGap,
    /// A successful completion of a read with no data sent.
    EarlySuccess,
    /// A wrong data digest on C2HData (needs data digests on).
    DataDigestMismatch,
    /// A wrong header digest (needs header digests on).
    HeaderDigestMismatch,
    /// A C2HTermReq instead of an answer.
    TermReq,
    /// The right completion, then the same completion again.
    StaleCompletion,
    /// Stop answering anything on this connection.
    Silence,
    /// Close the connection instead of answering.
    Close,
    /// An Internal Error status instead of doing the command (a failing
    /// device behind a healthy connection).
    ErrorStatus,
    /// A Reservation Conflict status instead of doing the command (another
    /// host holds the namespace's reservation).
    ReservationConflict,
}

/// When a [`Fault`] fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// On the I/O (Read/Write) command after `n` served normally,
    /// counted over the whole target.
    NthIo(u32),
    /// On the first Keep Alive.
    KeepAlive,
}

/// Settings of the fake target.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// The one NVM subsystem.
    pub subnqn: String,
    /// Hosts allowed (`None`: any).
    pub allowed_hosts: Option<Vec<String>>,
    /// Namespace 1 size in blocks.
    pub blocks: u64,
    /// Block size.
    pub block_size: u32,
    /// MDTS (power of two of 4 KiB pages; 0 = unlimited).
    pub mdts: u8,
    /// IOCCSZ in 16-byte units (in-capsule data = IOCCSZ*16 - 64).
    pub ioccsz: u32,
    /// MAXH2CDATA offered in ICResp.
    pub maxh2cdata: u32,
    /// Most data per C2HData PDU.
    pub c2h_chunk: u32,
    /// Most bytes per R2T.
    pub r2t_chunk: u32,
    /// Complete reads with the C2HData SUCCESS flag.
    pub success_flag: bool,
    /// Put this credit total in completion dword 1.
    pub credit: Option<u32>,
    /// Agree to digests the host asks for.
    pub digests: bool,
    /// CAP.MQES + 1.
    pub max_queue_depth: u16,
    /// Offer only round robin (CAP.AMS 0) and refuse Set Features
    /// Arbitration, as the Linux nvmet target does.
    pub round_robin_only: bool,
    /// The injected fault.
    pub fault: Option<(Fault, Trigger)>,
    /// DH-HMAC-CHAP: the host's secret and, optionally, the controller's.
    /// When set, every queue of the NVM subsystem must authenticate
    /// (Connect ATR), as nvmet does for a host with a key.
    pub dhchap: Option<(DhchapSecret, Option<DhchapSecret>)>,
    /// With `dhchap`: only the admin queue authenticates, as Linux's nvmet
    /// does since 6.15 (I/O queues get no ATR).
    pub dhchap_admin_only: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            subnqn: "nqn.2026-01.io.test:fake".into(),
            allowed_hosts: None,
            blocks: 8192,
            block_size: 512,
            mdts: 3, // 32 KiB
            ioccsz: (8192 + 64) / 16,
            maxh2cdata: 8192,
            c2h_chunk: 8192,
            r2t_chunk: 16384,
            success_flag: false,
            credit: None,
            digests: true,
            max_queue_depth: 64,
            round_robin_only: false,
            fault: None,
            dhchap: None,
            dhchap_admin_only: false,
        }
    }
}

/// State shared by every connection of one fake target.
pub struct FakeTarget {
    cfg: FakeConfig,
    inner: Mutex<Shared>,
}

struct Shared {
    data: Vec<u8>,
    next_cntlid: u16,
    controllers: HashMap<u16, u32>, // cntlid → CC
    io_served: u32,
    fault_fired: bool,
    discovery: Vec<DiscoveryLogEntry>,
    connects: u32,
}

impl FakeTarget {
    /// A target with zeroed namespace data.
    pub fn new(cfg: FakeConfig) -> Arc<Self> {
        let size = (cfg.blocks * u64::from(cfg.block_size)) as usize;
        let entry = DiscoveryLogEntry {
            trtype: nvmf_proto::log_page::trtype::TCP,
            adrfam: nvmf_proto::log_page::adrfam::IPV4,
            subtype: nvmf_proto::log_page::subtype::NVME,
            treq: 0,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: cfg.subnqn.clone(),
            traddr: "127.0.0.1".into(),
            tcp_sectype: 0,
        };
        Arc::new(Self {
            inner: Mutex::new(Shared {
                data: vec![0; size],
                next_cntlid: 1,
                controllers: HashMap::new(),
                io_served: 0,
                fault_fired: false,
                discovery: vec![entry],
                connects: 0,
            }),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FakeConfig {
        &self.cfg
    }

    /// A copy of the namespace's bytes.
    pub fn data(&self) -> Vec<u8> {
        self.inner.lock().unwrap().data.clone()
    }

    /// Successful Connect commands so far (admin and I/O).
    pub fn connects(&self) -> u32 {
        self.inner.lock().unwrap().connects
    }

    /// A new connection.
    pub fn connection(self: &Arc<Self>) -> FakeConnection {
        FakeConnection {
            target: Arc::clone(self),
            reader: PduReader::new(DecoderConfig::new(Role::Controller)),
            enc: EncodeConfig::default(),
            out: Vec::new(),
            qid: None,
            cntlid: 0,
            writes: HashMap::new(),
            silent: false,
            closed: false,
            data_digest: false,
            header_digest: false,
            next_ttag: 1,
            auth: None,
        }
    }

    /// Serve on a loopback TCP port, one thread per connection.
    pub fn serve(self: &Arc<Self>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let refuse = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let target = Arc::clone(self);
        let (stop2, refuse2, streams2) = (stop.clone(), refuse.clone(), streams.clone());
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                if refuse2.load(Ordering::SeqCst) {
                    let _ = stream.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                if let Ok(s) = stream.try_clone() {
                    streams2.lock().unwrap().push(s);
                }
                let mut conn = target.connection();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = match stream.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        conn.handle_bytes(&buf[..n]);
                        let out = conn.take_output();
                        if !out.is_empty() && stream.write_all(&out).is_err() {
                            return;
                        }
                        if conn.is_closed() {
                            let _ = stream.shutdown(Shutdown::Both);
                            return;
                        }
                    }
                });
            }
        });
        FakeServer {
            addr,
            stop,
            refuse,
            streams,
            thread: Some(thread),
        }
    }
}

/// A fake target listening on loopback; stops when dropped.
pub struct FakeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    refuse: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeServer {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drop every open connection (like removing an nvmet port).
    pub fn kill_connections(&self) {
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Close new connections at once (`true`) or serve them again.
    pub fn refuse(&self, refuse: bool) {
        self.refuse.store(refuse, Ordering::SeqCst);
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kill_connections();
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct PendingWrite {
    sqe: Sqe,
    buf: Vec<u8>,
    /// Bytes solicited so far.
    solicited: u32,
    /// Bytes received so far.
    received: u32,
    ttag: u16,
}

/// One connection of a [`FakeTarget`], sans-IO.
pub struct FakeConnection {
    target: Arc<FakeTarget>,
    reader: PduReader,
    enc: EncodeConfig,
    out: Vec<u8>,
    qid: Option<u16>,
    cntlid: u16,
    writes: HashMap<u16, PendingWrite>,
    silent: bool,
    closed: bool,
    header_digest: bool,
    data_digest: bool,
    next_ttag: u16,
    /// The queue's authentication, until it succeeds.
    auth: Option<CtrlAuth>,
}

impl FakeConnection {
    /// Bytes from the host.
    pub fn handle_bytes(&mut self, bytes: &[u8]) {
        if self.closed {
            return;
        }
        self.reader.push_bytes(bytes);
        loop {
            let pdu = match self.reader.next_pdu() {
                Ok(Some(p)) => p.into_owned(),
                Ok(None) => return,
                Err(_) => {
                    self.closed = true;
                    return;
                }
            };
            if self.silent {
                continue;
            }
            self.handle_pdu(pdu);
            if self.closed {
                return;
            }
        }
    }

    /// Bytes to send to the host.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether the target closed this connection.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn send(&mut self, pdu: Pdu<'_>) {
        pdu.encode(&self.enc, &mut self.out).expect("encodable");
    }

    fn respond(&mut self, cqe: Cqe) {
        let mut cqe = cqe;
        if let Some(c) = self.target.cfg.credit {
            if self.qid.unwrap_or(0) > 0 {
                cqe = cqe.with_gimbal_credit(c);
            }
        }
        self.send(Pdu::CapsuleResp(CapsuleResp { cqe }));
    }

    fn handle_pdu(&mut self, pdu: Pdu<'static>) {
        match pdu {
            Pdu::IcReq(req) => {
                let digests = self.target.cfg.digests;
                let resp = IcResp {
                    cpda: 0,
                    header_digest: req.header_digest && digests,
                    data_digest: req.data_digest && digests,
                    maxh2cdata: self.target.cfg.maxh2cdata,
                };
                self.send(Pdu::IcResp(resp));
                self.header_digest = resp.header_digest;
                self.data_digest = resp.data_digest;
                self.reader
                    .decoder_mut()
                    .set_digests(resp.header_digest, resp.data_digest);
                self.reader.decoder_mut().set_max_data_len(16 << 20);
                self.enc = EncodeConfig {
                    header_digest: resp.header_digest,
                    data_digest: resp.data_digest,
                    tx_pda: req.hpda,
                };
            }
            Pdu::CapsuleCmd(c) => {
                let sqe = c.sqe;
                let data = c.data.into_owned();
                if self.qid.is_some() && sqe.is_fabrics() {
                    match sqe.fctype() {
                        fctype::AUTHENTICATION_SEND => return self.auth_send(sqe, &data),
                        fctype::AUTHENTICATION_RECEIVE => return self.auth_receive(sqe),
                        _ => {}
                    }
                }
                if self.auth.as_ref().is_some_and(|a| !a.is_authenticated()) {
                    return self.respond(Cqe::new(sqe.cid, Status::AUTHENTICATION_REQUIRED));
                }
                match self.qid {
                    None => self.connect(sqe, &data),
                    Some(0) => self.admin(sqe),
                    Some(_) => self.io(sqe, data),
                }
            }
            Pdu::H2CData(d) => self.h2c(d.cccid, d.ttag, d.datao, &d.data),
            Pdu::H2CTermReq(_) => self.closed = true,
            _ => self.closed = true,
        }
    }

    fn connect(&mut self, sqe: Sqe, data: &[u8]) {
        let Ok(FabricsCommand::Connect(c)) = FabricsCommand::parse(&sqe) else {
            self.closed = true;
            return;
        };
        let Ok(cd) = ConnectData::from_bytes(data) else {
            self.respond(Cqe::new(sqe.cid, Status::CONNECT_INVALID_PARAMETERS));
            return;
        };
        let cfg = &self.target.cfg;
        if cd.subnqn != cfg.subnqn && cd.subnqn != DISCOVERY_NQN {
            let dw0 = ConnectInvalidParameter::Data(256).to_dw0();
            self.respond(Cqe::new(sqe.cid, Status::CONNECT_INVALID_PARAMETERS).with_dw0(dw0));
            return;
        }
        if let Some(allowed) = &cfg.allowed_hosts {
            if cd.subnqn != DISCOVERY_NQN && !allowed.contains(&cd.hostnqn) {
                self.respond(Cqe::new(sqe.cid, Status::CONNECT_INVALID_HOST));
                return;
            }
        }
        let mut s = self.target.inner.lock().unwrap();
        let cntlid = if c.qid == 0 {
            let id = s.next_cntlid;
            s.next_cntlid += 1;
            s.controllers.insert(id, 0);
            id
        } else if s.controllers.contains_key(&cd.cntlid) {
            cd.cntlid
        } else {
            drop(s);
            let dw0 = ConnectInvalidParameter::Data(16).to_dw0();
            self.respond(Cqe::new(sqe.cid, Status::CONNECT_INVALID_PARAMETERS).with_dw0(dw0));
            return;
        };
        s.connects += 1;
        drop(s);
        self.qid = Some(c.qid);
        self.cntlid = cntlid;
        let mut authreq = AuthReq::NONE;
        let skip = cd.subnqn == DISCOVERY_NQN || (cfg.dhchap_admin_only && c.qid > 0);
        if let (Some((host, ctrl)), false) = (&cfg.dhchap, skip) {
            let mut a = CtrlAuthConfig::new(&cd.hostnqn, &cd.subnqn, host.clone());
            a.ctrl_secret = ctrl.clone();
            self.auth = CtrlAuth::new(Arc::new(a), c.qid).ok();
            authreq = AuthReq::ATR;
        }
        self.respond(Cqe::success(sqe.cid).with_dw0(connect_success_dw0(cntlid, authreq.0)));
    }

    /// Authentication Send: the message in the capsule.
    fn auth_send(&mut self, sqe: Sqe, data: &[u8]) {
        let ok = AuthenticationSend::from_sqe(&sqe)
            .and_then(|c| c.check_dhchap().map(|()| c))
            .is_ok_and(|c| c.tl as usize == data.len());
        match self.auth.as_mut() {
            Some(a) if ok => {
                let _ = a.on_send(data);
                self.respond(Cqe::success(sqe.cid));
            }
            _ => self.respond(Cqe::new(sqe.cid, Status::INVALID_FIELD)),
        }
    }

    /// Authentication Receive: the pending message, padded to AL.
    fn auth_receive(&mut self, sqe: Sqe) {
        let al = AuthenticationReceive::from_sqe(&sqe)
            .and_then(|c| c.check_dhchap().map(|()| c.al))
            .ok()
            .filter(|&al| al <= 1 << 16);
        let reply = match (self.auth.as_mut(), al) {
            (Some(a), Some(al)) => a.on_receive(al).ok().map(|r| (r.data, al)),
            _ => None,
        };
        match reply {
            Some((data, al)) => {
                self.send_data(sqe.cid, &data, al as usize);
                self.respond(Cqe::success(sqe.cid));
            }
            None => self.respond(Cqe::new(sqe.cid, Status::INVALID_FIELD)),
        }
    }

    /// Admin data: C2HData PDUs only, the caller sends the completion.
    fn send_data(&mut self, cid: u16, page: &[u8], len: usize) {
        let mut data = page.to_vec();
        data.resize(len, 0);
        let chunk = self.target.cfg.c2h_chunk as usize;
        let n = data.len().div_ceil(chunk);
        for (i, piece) in data.chunks(chunk).enumerate() {
            self.send(Pdu::C2HData(C2HData {
                cccid: cid,
                datao: (i * chunk) as u32,
                last: i + 1 == n,
                success: false,
                data: Cow::Borrowed(piece),
            }));
        }
    }

    fn admin(&mut self, sqe: Sqe) {
        let cfg = self.target.cfg.clone();
        let cap = Capabilities {
            mqes: cfg.max_queue_depth - 1,
            timeout_500ms: 1,
            css: 1,
            ams: if cfg.round_robin_only { 0 } else { 0b11 },
            ..Default::default()
        };
        let cmd = match AdminCommand::parse(&sqe) {
            Ok(c) => c,
            Err(_) => return self.respond(Cqe::new(sqe.cid, Status::INVALID_FIELD)),
        };
        let len = sqe.dptr.length as usize;
        match cmd {
            AdminCommand::Fabrics(FabricsCommand::PropertyGet(p)) => {
                let cc = *self
                    .target
                    .inner
                    .lock()
                    .unwrap()
                    .controllers
                    .get(&self.cntlid)
                    .unwrap_or(&0);
                let v = match p.offset {
                    property::CAP => cap.to_u64(),
                    property::VS => u64::from(Version::V1_3.to_u32()),
                    property::CC => u64::from(cc),
                    property::CSTS => u64::from(
                        ControllerStatus {
                            ready: ControllerConfiguration::from_u32(cc).enable,
                            ..Default::default()
                        }
                        .to_u32(),
                    ),
                    _ => 0,
                };
                self.respond(Cqe::success(sqe.cid).with_property_value(v));
            }
            AdminCommand::Fabrics(FabricsCommand::PropertySet(p)) => {
                if p.offset == property::CC {
                    self.target
                        .inner
                        .lock()
                        .unwrap()
                        .controllers
                        .insert(self.cntlid, p.value as u32);
                }
                self.respond(Cqe::success(sqe.cid));
            }
            AdminCommand::Identify(id) => {
                let page = match id.cns {
                    cns::CONTROLLER => IdentifyController {
                        model_number: "fake target".into(),
                        serial_number: "FAKE0001".into(),
                        firmware_revision: "1.0".into(),
                        mdts: cfg.mdts,
                        cntlid: self.cntlid,
                        ver: Version::V1_3.to_u32(),
                        nn: 1,
                        sgls: 1 | (1 << 20),
                        subnqn: cfg.subnqn.clone(),
                        ioccsz: cfg.ioccsz,
                        iorcsz: 1,
                        kas: 1,
                        maxcmd: cfg.max_queue_depth,
                        vendor_specific: b"gimbal-fake".to_vec(),
                        cntrltype: 1,
                        ..Default::default()
                    }
                    .to_bytes()
                    .expect("encodable")
                    .to_vec(),
                    cns::NAMESPACE if id.nsid == 1 => IdentifyNamespace {
                        nsze: cfg.blocks,
                        ncap: cfg.blocks,
                        nuse: cfg.blocks,
                        lba_formats: vec![LbaFormat::with_block_shift(
                            cfg.block_size.trailing_zeros() as u8,
                        )],
                        ..Default::default()
                    }
                    .to_bytes()
                    .expect("encodable")
                    .to_vec(),
                    cns::NAMESPACE => vec![0; 4096],
                    cns::ACTIVE_NAMESPACE_LIST => ActiveNamespaceList { nsids: vec![1] }
                        .to_bytes()
                        .expect("encodable")
                        .to_vec(),
                    _ => return self.respond(Cqe::new(sqe.cid, Status::INVALID_FIELD)),
                };
                self.send_data(sqe.cid, &page, len.min(4096));
                self.respond(Cqe::success(sqe.cid));
            }
            AdminCommand::SetFeatures(f) if f.fid == feature_id::NUMBER_OF_QUEUES => {
                let n = NumberOfQueues::from_dword(f.cdw11);
                let granted = NumberOfQueues {
                    nsq: n.nsq.min(7),
                    ncq: n.ncq.min(7),
                };
                self.respond(Cqe::success(sqe.cid).with_dw0(granted.to_dword()));
            }
            AdminCommand::SetFeatures(f)
                if f.fid == feature_id::ARBITRATION && cfg.round_robin_only =>
            {
                self.respond(Cqe::new(sqe.cid, Status::INVALID_FIELD))
            }
            AdminCommand::SetFeatures(_) => self.respond(Cqe::success(sqe.cid)),
            AdminCommand::KeepAlive => {
                if self.fault_now(Trigger::KeepAlive).is_some() {
                    return;
                }
                self.respond(Cqe::success(sqe.cid));
            }
            AdminCommand::GetLogPage(g) if g.lid == log_id::DISCOVERY => {
                let page = DiscoveryLogPage {
                    genctr: 1,
                    recfmt: 0,
                    entries: self.target.inner.lock().unwrap().discovery.clone(),
                }
                .to_bytes()
                .expect("encodable");
                let mut out = vec![0u8; g.data_len() as usize];
                copy_window(&page, g.offset, &mut out);
                self.send_data(sqe.cid, &out, out.len());
                self.respond(Cqe::success(sqe.cid));
            }
            _ => self.respond(Cqe::new(sqe.cid, Status::INVALID_OPCODE)),
        }
    }

    /// The fault to inject now, if `trigger` is due (fires once).
    fn fault_now(&mut self, trigger: Trigger) -> Option<Fault> {
        let (fault, when) = self.target.cfg.fault?;
        let mut s = self.target.inner.lock().unwrap();
        if s.fault_fired {
            return None;
        }
        let due = match (when, trigger) {
            (Trigger::KeepAlive, Trigger::KeepAlive) => true,
            (Trigger::NthIo(n), Trigger::NthIo(_)) => s.io_served == n,
            _ => false,
        };
        if !due {
            return None;
        }
        s.fault_fired = true;
        drop(s);
        match fault {
            Fault::Silence => self.silent = true,
            Fault::Close => self.closed = true,
            Fault::TermReq => {
                self.send(Pdu::C2HTermReq(TermReq {
                    fes: FatalErrorStatus::PDU_SEQUENCE_ERROR,
                    fei: 0,
                    data: Cow::Borrowed(&[]),
                }));
            }
            _ => {}
        }
        Some(fault)
    }

    fn range(&self, slba: u64, blocks: u32) -> Option<std::ops::Range<usize>> {
        let bs = u64::from(self.target.cfg.block_size);
        let end = slba.checked_add(u64::from(blocks))?;
        if end > self.target.cfg.blocks {
            return None;
        }
        Some((slba * bs) as usize..(end * bs) as usize)
    }

    fn io(&mut self, sqe: Sqe, data: Vec<u8>) {
        let cmd = match IoCommand::parse(&sqe) {
            Ok(c) => c,
            Err(_) => return self.respond(Cqe::new(sqe.cid, Status::INVALID_FIELD)),
        };
        let fault = match cmd {
            IoCommand::Read(_) | IoCommand::Write(_) => {
                let f = self.fault_now(Trigger::NthIo(0));
                self.target.inner.lock().unwrap().io_served += 1;
                f
            }
            _ => None,
        };
        match fault {
            Some(Fault::Silence | Fault::Close | Fault::TermReq) => return,
            Some(Fault::ErrorStatus) => {
                return self.respond(Cqe::new(sqe.cid, Status::INTERNAL_ERROR));
            }
            Some(Fault::ReservationConflict) => {
                return self.respond(Cqe::new(sqe.cid, Status::RESERVATION_CONFLICT));
            }
            Some(Fault::BadPlen) => {
                let mut b = Vec::new();
                Pdu::CapsuleResp(CapsuleResp {
                    cqe: Cqe::success(sqe.cid),
                })
                .encode(&self.enc, &mut b)
                .expect("encodable");
                b[4..8].copy_from_slice(&7u32.to_le_bytes());
                self.out.extend_from_slice(&b);
                return;
            }
            Some(Fault::R2tUnknownCid) => {
                self.send(Pdu::R2T(R2T {
                    cccid: sqe.cid ^ 0x8000,
                    ttag: 1,
                    r2to: 0,
                    r2tl: 512,
                }));
                return;
            }
            _ => {}
        }
        match cmd {
            IoCommand::Read(rw) => {
                let Some(range) = self.range(rw.slba, rw.block_count()) else {
                    return self.respond(Cqe::new(sqe.cid, Status::LBA_OUT_OF_RANGE));
                };
                let bytes = self.target.inner.lock().unwrap().data[range].to_vec();
                self.send_read(sqe.cid, &bytes, fault);
            }
            IoCommand::Write(rw) => {
                let Some(range) = self.range(rw.slba, rw.block_count()) else {
                    return self.respond(Cqe::new(sqe.cid, Status::LBA_OUT_OF_RANGE));
                };
                let len = range.len() as u32;
                if !data.is_empty() {
                    if data.len() != range.len() {
                        return self.respond(Cqe::new(sqe.cid, Status::DATA_SGL_LENGTH_INVALID));
                    }
                    self.target.inner.lock().unwrap().data[range].copy_from_slice(&data);
                    self.complete_io(sqe.cid, fault);
                } else {
                    let ttag = self.next_ttag;
                    self.next_ttag = self.next_ttag.wrapping_add(1);
                    self.writes.insert(
                        sqe.cid,
                        PendingWrite {
                            sqe,
                            buf: vec![0; len as usize],
                            solicited: 0,
                            received: 0,
                            ttag,
                        },
                    );
                    self.next_r2t(sqe.cid);
                }
            }
            IoCommand::Flush { .. } => self.respond(Cqe::success(sqe.cid)),
            IoCommand::Fabrics(FabricsCommand::Disconnect(_)) => {
                self.respond(Cqe::success(sqe.cid));
                self.closed = true;
            }
            _ => self.respond(Cqe::new(sqe.cid, Status::INVALID_OPCODE)),
        }
    }

    fn complete_io(&mut self, cid: u16, fault: Option<Fault>) {
        self.respond(Cqe::success(cid));
        if fault == Some(Fault::StaleCompletion) {
            self.respond(Cqe::success(cid));
        }
    }

    fn next_r2t(&mut self, cid: u16) {
        let chunk = self.target.cfg.r2t_chunk;
        let w = self.writes.get_mut(&cid).expect("pending write");
        let len = w.buf.len() as u32;
        let r2tl = (len - w.solicited).min(chunk);
        let r2t = R2T {
            cccid: cid,
            ttag: w.ttag,
            r2to: w.solicited,
            r2tl,
        };
        w.solicited += r2tl;
        self.send(Pdu::R2T(r2t));
    }

    fn h2c(&mut self, cid: u16, ttag: u16, datao: u32, data: &[u8]) {
        let Some(w) = self.writes.get_mut(&cid) else {
            self.closed = true;
            return;
        };
        let end = datao as usize + data.len();
        if ttag != w.ttag || datao != w.received || end > w.solicited as usize {
            self.closed = true;
            return;
        }
        w.buf[datao as usize..end].copy_from_slice(data);
        w.received = end as u32;
        if w.received < w.solicited {
            return;
        }
        if (w.received as usize) < w.buf.len() {
            self.next_r2t(cid);
            return;
        }
        let w = self.writes.remove(&cid).expect("exists");
        let rw = match IoCommand::parse(&w.sqe) {
            Ok(IoCommand::Write(rw)) => rw,
            _ => unreachable!("only writes are pending"),
        };
        let range = self.range(rw.slba, rw.block_count()).expect("checked");
        self.target.inner.lock().unwrap().data[range].copy_from_slice(&w.buf);
        self.complete_io(cid, None);
    }

    fn send_read(&mut self, cid: u16, bytes: &[u8], fault: Option<Fault>) {
        let chunk = self.target.cfg.c2h_chunk as usize;
        let success_flag = self.target.cfg.success_flag && self.target.cfg.credit.is_none();
        match fault {
            Some(Fault::C2HBeyondBuffer) => {
                let datao = bytes.len().saturating_sub(512) as u32;
                self.send(Pdu::C2HData(C2HData {
                    cccid: cid,
                    datao,
                    last: true,
                    success: false,
                    data: Cow::Owned(vec![0xEE; 1024]),
                }));
                return self.respond(Cqe::success(cid));
            }
            Some(Fault::C2HGap) => {
                self.send(Pdu::C2HData(C2HData {
                    cccid: cid,
                    datao: 512,
                    last: false,
                    success: false,
                    data: Cow::Owned(vec![0xEE; 512]),
                }));
                return self.respond(Cqe::success(cid));
            }
            Some(Fault::EarlySuccess) => return self.respond(Cqe::success(cid)),
            _ => {}
        }
        let n = bytes.len().div_ceil(chunk).max(1);
        for (i, piece) in bytes.chunks(chunk).enumerate() {
            let last = i + 1 == n;
            let pdu = Pdu::C2HData(C2HData {
                cccid: cid,
                datao: (i * chunk) as u32,
                last,
                success: last && success_flag && self.qid != Some(0),
                data: Cow::Borrowed(piece),
            });
            let mut b = Vec::new();
            pdu.encode(&self.enc, &mut b).expect("encodable");
            if last {
                match fault {
                    Some(Fault::DataDigestMismatch) => {
                        let l = b.len();
                        b[l - 1] ^= 0xFF;
                    }
                    Some(Fault::HeaderDigestMismatch) => b[24] ^= 0xFF,
                    _ => {}
                }
            }
            self.out.extend_from_slice(&b);
        }
        if !(success_flag && self.qid != Some(0)) {
            self.complete_io(cid, fault);
        } else if fault == Some(Fault::StaleCompletion) {
            self.respond(Cqe::success(cid));
        }
    }
}
