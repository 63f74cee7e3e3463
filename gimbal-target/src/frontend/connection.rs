//! One NVMe/TCP connection (one queue of one controller).
//!
//! Two tasks per connection: the reader decodes PDUs, validates commands and
//! hands I/O to the namespace pipelines; the writer encodes everything the
//! connection sends, batching what is ready into one socket write.
//! Completions reach the writer through a channel from whatever thread
//! completed them, so a slow backend never blocks reading.
//!
//! Lifecycle: ICReq/ICResp, then a Fabrics Connect (admin queue: creates a
//! controller; I/O queue: joins one), then commands until the host
//! disconnects, the controller is torn down (keep-alive timeout, admin queue
//! gone, a fatal error on any of its queues) or the target shuts down.
//!
//! Anything malformed or out of order ends the connection with a
//! C2HTermReq carrying the fatal error status the specification names, and
//! affects no other connection. Bounds ([`crate::frontend::budget`]): data
//! buffers are allocated only for validated commands (at most MDTS each),
//! only once the queue's data budget holds them (else the command waits),
//! and never from a length the host sent without checking it against the
//! command; a host with more commands outstanding than its SQ has entries
//! is closed; a socket the host stops reading ends the connection after
//! `timeouts.send_ms`; a connection that does not finish ICReq and Connect
//! within `timeouts.handshake_ms` is closed. What a host can make us log is
//! rate-limited ([`crate::frontend::log_limit`]).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvmf_proto::auth::{CtrlAuth, CtrlAuthConfig, CtrlProgress};
use nvmf_proto::command::{DsmRange, IoCommand, ReadWrite};
use nvmf_proto::fabrics::{
    connect_data_offset, connect_sqe_offset, connect_success_dw0, fctype, AuthReq,
    AuthenticationReceive, AuthenticationSend, Connect, ConnectData, ConnectInvalidParameter,
    FabricsCommand, CNTLID_DYNAMIC, DISCOVERY_NQN,
};
use nvmf_proto::pdu::{
    C2HData, CapsuleResp, EncodeConfig, IcReq, IcResp, Negotiated, Pdu, Role, TermReq, R2T,
};
use nvmf_proto::reservation::{
    ReservationAcquire, ReservationCommandKind, ReservationRegister, ReservationRelease,
    ReservationReport, STATUS_EXT_HEADER_LEN,
};
use nvmf_proto::sqe::{admin_opcode, FLAGS_FUSE_MASK, FLAGS_PSDT_MASK, FLAGS_PSDT_SGL};
use nvmf_proto::{
    Cqe, Decoded, DecoderConfig, ErrorAction, PduDecoder, ProtoError, SglKind, Sqe, Status,
    Termination,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use crate::frontend::budget::{
    self, QueueBudget, Reservation, Short, ADMIN_IN_CAPSULE_BYTES, PRE_CONNECT_SQ_ENTRIES, ZEROS,
    ZEROS_LEN,
};
use crate::frontend::controller::{AdminOutcome, Controller, HostIdentity, IoQueueLease};
use crate::frontend::reservation::{Access, NamespaceReservations, NsInflight, Outcome};
use crate::frontend::target::{controllers_of_host, Namespace, Subsystem, Target};
use crate::limited;
use crate::pipeline::{ClassTag, Completion, CompletionSink, IoDone, IoOp};
use qos_core::priority::NvmeClass;

/// What the reader hands the writer.
#[derive(Debug)]
enum Outgoing {
    Pdu(Pdu<'static>),
    /// A read's data and, unless the data PDU's SUCCESS flag completes it,
    /// its CQE: one message per read instead of two (each costs the
    /// sender a channel push and possibly a wake-up).
    ReadDone {
        cid: u16,
        data: Cow<'static, [u8]>,
        cqe: Option<Cqe>,
        /// The read's share of the queue's data budget, released once the
        /// data has been written to the socket.
        hold: Reservation,
    },
    /// Digest settings for every PDU after this one.
    Encode(EncodeConfig),
    /// Flush and close the socket.
    Close,
}

/// Why a connection ended (the payloads are for the log line).
#[derive(Debug)]
#[allow(dead_code)] // fields are read through Debug only
enum End {
    PeerClosed,
    Disconnect,
    /// We sent a C2HTermReq, or closed on an error no status answers (an
    /// SQ overrun).
    Fatal(String),
    /// The host sent an H2CTermReq.
    HostTerminated(String),
    SocketError(std::io::Error),
    /// The writer stopped: a send made no progress for `timeouts.send_ms`
    /// (the host does not read), or the socket failed.
    SendStalled,
    /// No ICReq and accepted Connect within `timeouts.handshake_ms`.
    HandshakeTimeout,
    ControllerGone,
    /// The controller was reset (CC.EN 1 -> 0): this I/O queue is deleted.
    QueueReset,
    Shutdown,
}

impl End {
    /// Ends that mean the association is broken: like the Linux target, a
    /// fatal error on any queue tears the whole controller down so that the
    /// host resets and reconnects cleanly.
    fn is_fatal(&self) -> bool {
        matches!(
            self,
            End::Fatal(_) | End::HostTerminated(_) | End::SocketError(_) | End::SendStalled
        )
    }

    /// Ends after which nothing more is sent: the association is gone, or
    /// the host does not read. The writer stops at once, dropping what it
    /// still holds, rather than waiting to flush to a host that is gone.
    fn abandons_output(&self) -> bool {
        matches!(
            self,
            End::ControllerGone | End::QueueReset | End::SendStalled | End::HandshakeTimeout
        )
    }
}

/// Submission queue bookkeeping shared with completion callbacks.
#[derive(Debug)]
struct SqState {
    /// Entries in the queue (SQSIZE + 1), 0 before Connect.
    size: AtomicU16,
    /// The queue's ID (Connect QID): every CQE names it in SQID.
    qid: AtomicU16,
    head: AtomicU16,
    flow_control_disabled: std::sync::atomic::AtomicBool,
    /// Commands received on this connection and not yet completed.
    inflight: AtomicUsize,
    /// Commands received whose completion the writer has not taken yet:
    /// what the host may count as outstanding, at most the SQ's entries
    /// (see [`budget::sq_overrun`]).
    outstanding: AtomicUsize,
}

impl SqState {
    /// Entries the host may have outstanding now.
    fn entries(&self) -> u16 {
        match self.size.load(Ordering::Relaxed) {
            0 => PRE_CONNECT_SQ_ENTRIES,
            n => n,
        }
    }
}

/// Sends completions for one connection; cloned into pipeline callbacks.
#[derive(Clone)]
struct Responder {
    tx: UnboundedSender<Outgoing>,
    sq: Arc<SqState>,
    target: Arc<Target>,
    /// The queue's data budget (read data until sent, R2T write data until
    /// written).
    budget: Arc<QueueBudget>,
}

impl Responder {
    fn sqhd(&self) -> u16 {
        if self.sq.flow_control_disabled.load(Ordering::Relaxed) {
            nvmf_proto::cqe::SQHD_FLOW_CONTROL_DISABLED
        } else {
            self.sq.head.load(Ordering::Relaxed)
        }
    }

    fn finish_one(&self) {
        self.sq.inflight.fetch_sub(1, Ordering::AcqRel);
        self.target.inflight.fetch_sub(1, Ordering::AcqRel);
    }

    /// A CQE for `cid` on this queue.
    fn cqe(&self, cid: u16, status: Status) -> Cqe {
        let mut cqe = Cqe::new(cid, status).with_sqhd(self.sqhd());
        // NVMe Base 2.0, Common Completion Queue Entry: SQID names the
        // submission queue the command came from (nvmet sets it too).
        cqe.sqid = self.sq.qid.load(Ordering::Relaxed);
        cqe
    }

    /// Completes a command with a CQE (and optional data before it).
    fn complete(&self, cid: u16, status: Status, dw0: u32, dw1: u32, data: Vec<u8>) {
        self.reply(cid, status, dw0, dw1, data, 0);
    }

    /// Completes a command with `data` followed by `zeros` zero bytes
    /// (from a static page: never allocated), then a CQE.
    fn reply(&self, cid: u16, status: Status, dw0: u32, dw1: u32, data: Vec<u8>, zeros: usize) {
        let total = data.len() + zeros;
        let mut sent = data.len();
        if !data.is_empty() {
            let _ = self.tx.send(Outgoing::Pdu(Pdu::C2HData(C2HData {
                cccid: cid,
                datao: 0,
                last: zeros == 0,
                success: false,
                data: data.into(),
            })));
        }
        while sent < total {
            let n = (total - sent).min(ZEROS_LEN);
            let _ = self.tx.send(Outgoing::Pdu(Pdu::C2HData(C2HData {
                cccid: cid,
                datao: sent as u32,
                last: sent + n == total,
                success: false,
                data: Cow::Borrowed(&ZEROS[..n]),
            })));
            sent += n;
        }
        let mut cqe = self.cqe(cid, status).with_dw0(dw0);
        cqe.dw1 = dw1;
        let _ = self
            .tx
            .send(Outgoing::Pdu(Pdu::CapsuleResp(CapsuleResp { cqe })));
        self.finish_one();
    }

    fn status(&self, cid: u16, status: Status) {
        self.complete(cid, status, 0, 0, Vec::new());
    }

    /// Completes a read: data, then either the SUCCESS shortcut (only when
    /// the host turned SQ flow control off, since the CQE would carry SQHD,
    /// and never when a credit must travel in dword 1) or a CQE.
    fn complete_read(
        &self,
        cid: u16,
        data: Cow<'static, [u8]>,
        credit: Option<u32>,
        hold: Reservation,
    ) {
        let shortcut = credit.is_none() && self.sq.flow_control_disabled.load(Ordering::Relaxed);
        let cqe = (!shortcut).then(|| {
            let mut cqe = self.cqe(cid, Status::SUCCESS);
            cqe.dw1 = credit.map_or(0, credit_dw1);
            cqe
        });
        let _ = self.tx.send(Outgoing::ReadDone {
            cid,
            data,
            cqe,
            hold,
        });
        self.finish_one();
    }

    /// The completion tag of command `cid` (see the `CompletionSink`):
    /// bits 15:0 the CID, bit 16 set for a read, bits 63:32 the bytes it
    /// holds reserved from the queue's budget (at most MDTS, 16 MiB).
    fn tag(cid: u16, is_read: bool, reserved: usize) -> u64 {
        u64::from(cid) | u64::from(is_read) << 16 | (reserved as u64) << 32
    }

    /// Completes an I/O from the pipeline.
    fn complete_io(&self, cid: u16, is_read: bool, reserved: usize, done: IoDone) {
        let hold = self.budget.adopt(reserved);
        match done.result {
            Ok(data) if is_read => self.complete_read(cid, data, done.credit, hold),
            Ok(_) => self.complete(
                cid,
                Status::SUCCESS,
                0,
                done.credit.map_or(0, credit_dw1),
                Vec::new(),
            ),
            Err(e) => {
                limited!(
                    self.target.log_limiter,
                    log::Level::Warn,
                    "io-error",
                    "I/O error on command {cid:#06x}: {e}"
                );
                let status = match e.kind() {
                    std::io::ErrorKind::InvalidInput => Status::LBA_OUT_OF_RANGE.with_dnr(),
                    _ if is_read => Status::UNRECOVERED_READ_ERROR,
                    _ => Status::WRITE_FAULT,
                };
                self.complete(
                    cid,
                    status,
                    0,
                    done.credit.map_or(0, credit_dw1),
                    Vec::new(),
                );
            }
        }
    }
}

/// A read or write of this connection ended: see [`Responder::tag`].
impl CompletionSink for Responder {
    fn complete(&self, tag: u64, done: IoDone) {
        self.complete_io(tag as u16, tag & 1 << 16 != 0, (tag >> 32) as usize, done);
    }
}

fn credit_dw1(credit: u32) -> u32 {
    nvmf_proto::cqe::GIMBAL_CREDIT_VALID | (credit & !nvmf_proto::cqe::GIMBAL_CREDIT_VALID)
}

/// A command waiting for its data (R2T sent).
#[derive(Debug)]
struct PendingData {
    sqe: Sqe,
    /// The data so far: H2CData arrives in order (each PDU must start at
    /// `received`), so it is appended, and the buffer is never zeroed
    /// first (a 128 KiB memset per write was ~10 % of the target's CPU in
    /// the guest profile, `tests/vm/benches/ublk.sh` part 3). Its capacity,
    /// `len`, is allocated at the R2T, after the budget's reservation.
    buf: Vec<u8>,
    /// The transfer's length.
    len: usize,
    /// `buf`'s share of the queue's data budget.
    reservation: Reservation,
    received: usize,
    ttag: u16,
    /// A data digest error hit one of its PDUs: it fails once all data is in.
    poisoned: bool,
}

/// How a Connect is refused: its completion.
enum ConnectRefusal {
    /// This status, dword 0 clear.
    Status(Status),
    /// Connect Invalid Parameters (DNR), dword 0 naming the field.
    Invalid(ConnectInvalidParameter),
}

enum QueueState {
    AwaitIcReq,
    AwaitConnect,
    Admin(Arc<Controller>),
    /// An I/O queue: its controller, QID, priority class (Connect CATTR
    /// bits 1:0, used when the controller arbitrates by class) and its
    /// hold on the controller (ended by a controller reset).
    Io(Arc<Controller>, u16, NvmeClass, IoQueueLease),
}

struct Connection {
    target: Arc<Target>,
    peer: SocketAddr,
    /// The connection's socket, for its options; open while `serve`'s
    /// read half lives, which outlives the connection.
    fd: RawFd,
    state: QueueState,
    decoder: PduDecoder,
    max_h2c_data: u32,
    /// Shared with every request in flight (their completion sink).
    responder: Arc<Responder>,
    pending: HashMap<u16, PendingData>,
    next_ttag: u16,
    /// Requests decoded from the current receive for pipelines that take
    /// batches, in order; handed over before the next receive.
    batch: Vec<Batched>,
    /// Commands waiting for the data budget, in arrival order (their data
    /// is not in the capsule: reads, and writes solicited by R2T).
    deferred: VecDeque<Sqe>,
    /// Set while `deferred` is being worked off: a command that still does
    /// not fit goes back to the front, not the back.
    draining: bool,
    /// Which pool the head of `deferred` waits for.
    short: Short,
    redeferred: Option<Sqe>,
    /// When a connection that has not completed ICReq and Connect is
    /// closed.
    handshake_deadline: tokio::time::Instant,
    /// Cancelled when the writer stops (a stalled or failed send).
    writer_gone: CancellationToken,
    /// Cancelled to make the writer stop at once, dropping its output.
    abort_writer: CancellationToken,
    /// DH-HMAC-CHAP on this queue, when its host has a secret (`[[host]]`).
    auth: Option<QueueAuth>,
    /// Completion sinks per namespace this queue sent I/O to: each counts
    /// the controller's admitted commands down (see [`NsSink`]). A handful
    /// of entries at most (the subsystem's namespaces).
    ns_sinks: Vec<(u32, Arc<NsSink>)>,
}

/// Completes this connection's I/O to one namespace: first counts it out
/// of the controller's admitted commands on the namespace (what a Preempt
/// and Abort waits for), then completes it as the responder does.
struct NsSink {
    responder: Arc<Responder>,
    inflight: Arc<NsInflight>,
}

impl CompletionSink for NsSink {
    fn complete(&self, tag: u64, done: IoDone) {
        self.inflight.done();
        CompletionSink::complete(&*self.responder, tag, done);
    }
}

/// In-band authentication of one queue (NVMe Base Specification 2.x,
/// "Authentication"; `nvmf_proto::auth` for the protocol).
struct QueueAuth {
    /// The host's settings, to begin a fresh transaction after a failed one.
    config: Arc<CtrlAuthConfig>,
    ctrl: CtrlAuth,
    /// The last transaction failed: a new Negotiate starts over with a
    /// fresh state machine (the old one refuses anything more).
    failed: bool,
    /// The host proved its key on this queue and no transaction has failed
    /// since. A re-authentication in progress keeps the queue open, as
    /// nvmet does: only a failed one closes it to everything but
    /// authentication.
    authenticated: bool,
    /// Transactions begun (Negotiates) while not authenticated: each may
    /// cost a modular exponentiation, so a host that keeps failing is
    /// disconnected after [`MAX_AUTH_ATTEMPTS`].
    attempts: u32,
}

/// Authentication transactions an unauthenticated queue may begin before
/// its connection is closed. Linux retries a failed transaction never on
/// the same queue (it reconnects), so 3 is generous.
const MAX_AUTH_ATTEMPTS: u32 = 3;

/// A request held in [`Connection::batch`].
type Batched = (Arc<Namespace>, u32, Option<ClassTag>, IoOp, Completion);

/// Serves one accepted connection to its end.
pub async fn serve(stream: TcpStream, target: Arc<Target>) {
    let peer = match stream.peer_addr() {
        Ok(p) => p,
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = unbounded_channel();
    let sq = Arc::new(SqState {
        size: AtomicU16::new(0),
        qid: AtomicU16::new(0),
        head: AtomicU16::new(0),
        flow_control_disabled: Default::default(),
        inflight: AtomicUsize::new(0),
        outstanding: AtomicUsize::new(0),
    });
    let writer_gone = CancellationToken::new();
    let abort_writer = CancellationToken::new();
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        Writer {
            sq: sq.clone(),
            target: target.clone(),
            peer,
            send_timeout: Duration::from_millis(target.config.timeouts.send_ms.into()),
            abort: abort_writer.clone(),
            gone: writer_gone.clone(),
        },
    ));
    let limits = target.config.limits;
    let max_h2c_data = limits.max_h2c_data_bytes;
    let handshake_deadline = tokio::time::Instant::now()
        + Duration::from_millis(target.config.timeouts.handshake_ms.into());
    let mut conn = Connection {
        responder: Arc::new(Responder {
            tx,
            sq,
            target: target.clone(),
            budget: QueueBudget::new(
                limits.max_queue_data_bytes as usize,
                target.buffered.clone(),
            ),
        }),
        target,
        peer,
        fd,
        state: QueueState::AwaitIcReq,
        decoder: PduDecoder::new(DecoderConfig {
            // Before ICResp nothing larger than an ICReq may arrive.
            max_data_len: 0,
            ..DecoderConfig::new(Role::Controller)
        }),
        max_h2c_data,
        pending: HashMap::new(),
        next_ttag: 0,
        batch: Vec::new(),
        deferred: VecDeque::new(),
        draining: false,
        short: Short::Queue,
        redeferred: None,
        handshake_deadline,
        writer_gone,
        abort_writer,
        auth: None,
        ns_sinks: Vec::new(),
    };
    let end = conn.read_loop(&mut rd).await;
    conn.finish(end).await;
    drop(conn);
    let _ = writer.await;
}

/// Data at least this large is written from its own buffer (writev)
/// rather than copied behind its header.
const ZERO_COPY_MIN: usize = 4096;

/// Outgoing bytes gathered for one vectored write: small PDUs are encoded
/// into `bytes`; large data payloads stay in their own buffers.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    /// In order: a range of `bytes`, or a payload.
    parts: Vec<Part>,
    /// Budget held by the payloads, released once they are written.
    holds: Vec<Reservation>,
}

enum Part {
    Bytes(std::ops::Range<usize>),
    Data(Cow<'static, [u8]>),
}

impl Batch {
    fn mark_bytes(&mut self, start: usize) {
        let end = self.bytes.len();
        if start == end {
            return;
        }
        match self.parts.last_mut() {
            Some(Part::Bytes(r)) if r.end == start => r.end = end,
            _ => self.parts.push(Part::Bytes(start..end)),
        }
    }

    fn push(&mut self, pdu: Pdu<'static>, config: &EncodeConfig) -> Result<(), ProtoError> {
        let start = self.bytes.len();
        if pdu.data().len() < ZERO_COPY_MIN {
            pdu.encode(config, &mut self.bytes)?;
            self.mark_bytes(start);
            return Ok(());
        }
        let digest = pdu.encode_head(config, &mut self.bytes)?;
        self.mark_bytes(start);
        let data = match pdu {
            Pdu::C2HData(d) => d.data,
            other => Cow::Owned(other.data().to_vec()),
        };
        self.parts.push(Part::Data(data));
        if let Some(d) = digest {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(&d);
            self.mark_bytes(start);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Bytes(r) => r.len(),
                Part::Data(d) => d.len(),
            })
            .sum()
    }

    /// Writes the batch; fails when a send makes no progress for
    /// `send_timeout` or the writer is aborted.
    async fn write_to(&mut self, wr: &mut OwnedWriteHalf, w: &Writer) -> std::io::Result<()> {
        let mut slices: Vec<std::io::IoSlice<'_>> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Bytes(r) => std::io::IoSlice::new(&self.bytes[r.clone()]),
                Part::Data(d) => std::io::IoSlice::new(d),
            })
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = tokio::select! {
                biased;
                _ = w.abort.cancelled() => {
                    return Err(std::io::Error::other("output abandoned"));
                }
                r = tokio::time::timeout(w.send_timeout, wr.write_vectored(rest)) => match r {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no send progress for {:?}", w.send_timeout),
                        ))
                    }
                },
            };
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            std::io::IoSlice::advance_slices(&mut rest, n);
        }
        drop(slices);
        self.bytes.clear();
        self.parts.clear();
        self.holds.clear();
        Ok(())
    }
}

/// What the writer task needs besides the socket and its channel.
struct Writer {
    sq: Arc<SqState>,
    target: Arc<Target>,
    peer: SocketAddr,
    /// A send that makes no progress for this long ends the connection.
    send_timeout: Duration,
    /// Stop at once, dropping what is not sent.
    abort: CancellationToken,
    /// Cancelled when the writer stops, for whatever reason.
    gone: CancellationToken,
}

impl Writer {
    /// A completion left for the socket: the host may reuse its SQ slot.
    fn completion_taken(&self) {
        release_slot(&self.sq);
    }
}

async fn write_loop(mut wr: OwnedWriteHalf, mut rx: UnboundedReceiver<Outgoing>, w: Writer) {
    let _gone = w.gone.clone().drop_guard();
    let mut config = EncodeConfig::default();
    let mut batch = Batch::default();
    loop {
        let first = tokio::select! {
            biased;
            _ = w.abort.cancelled() => return,
            m = rx.recv() => match m {
                Some(m) => m,
                None => return,
            },
        };
        let mut close = false;
        let mut msg = Some(first);
        // Batch whatever is already queued into one write.
        while let Some(m) = msg.take() {
            match m {
                Outgoing::Pdu(p) => {
                    if matches!(p, Pdu::CapsuleResp(_)) {
                        w.completion_taken();
                    }
                    let pdu_type = p.pdu_type();
                    if let Err(e) = batch.push(p, &config) {
                        log::error!("cannot encode PDU type {pdu_type:#04x}: {e}");
                    }
                }
                Outgoing::ReadDone {
                    cid,
                    data,
                    cqe,
                    hold,
                } => {
                    w.completion_taken();
                    batch.holds.push(hold);
                    let c2h = Pdu::C2HData(C2HData {
                        cccid: cid,
                        datao: 0,
                        last: true,
                        success: cqe.is_none(),
                        data,
                    });
                    let pdus = std::iter::once(c2h)
                        .chain(cqe.map(|cqe| Pdu::CapsuleResp(CapsuleResp { cqe })));
                    for p in pdus {
                        if let Err(e) = batch.push(p, &config) {
                            log::error!("cannot encode a read's completion: {e}");
                        }
                    }
                }
                Outgoing::Encode(c) => config = c,
                Outgoing::Close => {
                    close = true;
                    break;
                }
            }
            if batch.len() < 1 << 20 && batch.parts.len() < 512 {
                msg = rx.try_recv().ok();
            }
        }
        if !batch.parts.is_empty() {
            if let Err(e) = batch.write_to(&mut wr, &w).await {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    limited!(
                        w.target.log_limiter,
                        log::Level::Warn,
                        "send-stalled",
                        "{}: {e}: the host does not read; closing the connection",
                        w.peer
                    );
                }
                return;
            }
        }
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

/// A command no longer counts against the SQ's entries. Saturating: a
/// miscount must never make every later command look like an overrun.
fn release_slot(sq: &SqState) {
    let _ = sq
        .outstanding
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

/// How often deferred commands waiting for the target-wide pool retry, in
/// case a wake-up came between their failed reservation and their wait.
const DEFERRED_RETRY: Duration = Duration::from_millis(50);

/// Resolves when `token` is cancelled; never without one.
async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Offsets in the H2CData PDU header (NVMe/TCP 1.0, 7.4.6).
const H2C_DATAO_OFFSET: usize = 12;
const H2C_DATAL_OFFSET: usize = 16;

impl Connection {
    fn controller(&self) -> Option<&Arc<Controller>> {
        match &self.state {
            QueueState::Admin(c) | QueueState::Io(c, ..) => Some(c),
            _ => None,
        }
    }

    /// Reads and handles PDUs until the connection ends; requests held
    /// for a batch are handed over however it ends, as they would have
    /// been one by one.
    async fn read_loop(&mut self, rd: &mut tokio::net::tcp::OwnedReadHalf) -> End {
        let end = self.read_pdus(rd).await;
        self.submit_batch();
        end
    }

    async fn read_pdus(&mut self, rd: &mut tokio::net::tcp::OwnedReadHalf) -> End {
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut start = 0usize;
        loop {
            let need = loop {
                match self.decoder.decode(&buf[start..]) {
                    Ok(Decoded::NeedMore(n)) => break n,
                    Ok(Decoded::Pdu { pdu, consumed }) => {
                        let result = self.handle_pdu(pdu);
                        start += consumed;
                        if let Err(end) = result {
                            return end;
                        }
                    }
                    Err(e) => match e.action() {
                        ErrorAction::FailCommand {
                            command_id,
                            consumed,
                        } => {
                            let raw = buf[start..start + consumed].to_vec();
                            start += consumed;
                            if let Err(end) = self.data_digest_error(command_id, &raw, &e) {
                                return end;
                            }
                        }
                        ErrorAction::Terminate(t) => {
                            let header = &buf[start..buf.len().min(start + 128)];
                            return self.terminate(t, header, e.to_string());
                        }
                        ErrorAction::Close | ErrorAction::CommandStatus => {
                            return End::Fatal(format!("closing: {e}"));
                        }
                    },
                }
            };
            // Everything this receive brought is decoded: hand the held
            // requests over before waiting for more.
            self.submit_batch();
            if start == buf.len() {
                buf.clear();
                start = 0;
            } else if start > 0 && buf.capacity() - buf.len() < need {
                buf.drain(..start);
                start = 0;
            }
            buf.reserve(need.max(16 * 1024));
            let teardown = self.controller().map(|c| c.teardown.clone());
            let reset = match &self.state {
                QueueState::Io(.., lease) => Some(lease.reset.clone()),
                _ => None,
            };
            // A queue that must authenticate is still in its handshake
            // until the first transaction succeeds: a host cannot hold a
            // controller open by connecting and never proving its key.
            let handshake = (matches!(
                self.state,
                QueueState::AwaitIcReq | QueueState::AwaitConnect
            ) || self.auth.as_ref().is_some_and(|a| !a.authenticated))
            .then_some(self.handshake_deadline);
            let shutdown = self.target.shutdown.clone();
            let writer_gone = self.writer_gone.clone();
            let budget = self.responder.budget.clone();
            let waiting = !self.deferred.is_empty();
            let waiting_on_target = waiting && self.short == Short::Target;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return End::Shutdown,
                _ = writer_gone.cancelled() => return End::SendStalled,
                _ = cancelled(teardown.as_ref()) => return End::ControllerGone,
                _ = cancelled(reset.as_ref()) => return End::QueueReset,
                _ = async {
                    match handshake {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => return End::HandshakeTimeout,
                // Deferred commands retry when this queue releases budget,
                // or, when the target-wide pool is short, when any queue
                // does (with a slow retry for a wake-up missed between the
                // failed reservation and this wait). A host that does not
                // read costs no wake-ups until its own data goes out.
                _ = budget.freed.notified(), if waiting => {
                    if let Err(end) = self.run_deferred() {
                        return end;
                    }
                }
                _ = budget.target.freed.notified(), if waiting_on_target => {
                    if let Err(end) = self.run_deferred() {
                        return end;
                    }
                }
                _ = tokio::time::sleep(DEFERRED_RETRY), if waiting_on_target => {
                    if let Err(end) = self.run_deferred() {
                        return end;
                    }
                }
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) => return End::PeerClosed,
                    Ok(_) => {}
                    Err(e) => return End::SocketError(e),
                },
            }
        }
    }

    /// Works off deferred commands, in order, while the budget holds them.
    fn run_deferred(&mut self) -> Result<(), End> {
        let QueueState::Io(ctrl, ..) = &self.state else {
            return Ok(());
        };
        let ctrl = ctrl.clone();
        while let Some(sqe) = self.deferred.pop_front() {
            self.draining = true;
            let result = self.handle_io(&ctrl, sqe, &[]);
            self.draining = false;
            result?;
            if let Some(sqe) = self.redeferred.take() {
                self.deferred.push_front(sqe);
                break;
            }
        }
        self.submit_batch();
        Ok(())
    }

    /// Reserves `bytes` of the queue's data budget for a command, unless
    /// earlier commands are still waiting for it (they go first).
    fn reserve(&mut self, bytes: usize) -> Option<Reservation> {
        if !self.draining && !self.deferred.is_empty() {
            return None;
        }
        match self.responder.budget.try_reserve(bytes) {
            Ok(r) => Some(r),
            Err(short) => {
                self.short = short;
                None
            }
        }
    }

    /// Holds a command that does not fit the data budget until it does.
    /// Bounded: a deferred command is outstanding, and the SQ size bounds
    /// those.
    fn defer(&mut self, sqe: Sqe) {
        if self.draining {
            self.redeferred = Some(sqe);
        } else {
            self.deferred.push_back(sqe);
        }
    }

    /// Hands a request to its namespace's pipeline: at once, or, if the
    /// pipeline takes batches (the Gimbal switch in front of a memory
    /// backend), with the other requests of the same receive, so that
    /// they share one hold of the switch's lock and one clock read each.
    fn submit_io(
        &mut self,
        ns: Arc<Namespace>,
        tenant: u32,
        class: Option<ClassTag>,
        op: IoOp,
        done: Completion,
    ) {
        if ns.pipeline.takes_batches() {
            self.batch.push((ns, tenant, class, op, done));
        } else {
            ns.pipeline.submit(tenant, class, op, done);
        }
    }

    /// Submits the held requests, in order, one batch per run of one
    /// namespace and tenant.
    fn submit_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        let mut held = batch.drain(..).peekable();
        while let Some((ns, tenant, class, op, done)) = held.next() {
            let more = std::iter::from_fn(|| {
                held.next_if(|(n, t, ..)| Arc::ptr_eq(n, &ns) && *t == tenant)
                    .map(|(_, _, class, op, done)| (class, op, done))
            });
            ns.pipeline
                .submit_batch(tenant, std::iter::once((class, op, done)).chain(more));
        }
        drop(held);
        // Keeps the allocation for the next receive.
        self.batch = batch;
    }

    /// Sends a C2HTermReq and ends the connection.
    fn terminate(&self, t: Termination, header: &[u8], why: String) -> End {
        limited!(
            self.target.log_limiter,
            log::Level::Warn,
            "protocol-error",
            "{}: fatal protocol error, terminating connection: {why}",
            self.peer
        );
        let term = TermReq::for_error(t, header);
        let _ = self
            .responder
            .tx
            .send(Outgoing::Pdu(Pdu::C2HTermReq(term.into_owned())));
        End::Fatal(why)
    }

    fn fatal(&self, fes: nvmf_proto::FatalErrorStatus, fei: u32, why: &str) -> End {
        self.terminate(Termination { fes, fei }, &[], why.to_string())
    }

    fn handle_pdu(&mut self, pdu: Pdu<'_>) -> Result<(), End> {
        use nvmf_proto::FatalErrorStatus as Fes;
        match pdu {
            Pdu::IcReq(req) => {
                if !matches!(self.state, QueueState::AwaitIcReq) {
                    return Err(self.fatal(Fes::PDU_SEQUENCE_ERROR, 0, "second ICReq"));
                }
                self.initialize(req);
                Ok(())
            }
            _ if matches!(self.state, QueueState::AwaitIcReq) => {
                Err(self.fatal(Fes::PDU_SEQUENCE_ERROR, 0, "PDU before ICReq"))
            }
            Pdu::H2CTermReq(t) => {
                let why = format!(
                    "host terminated the connection (FES {:#x}, FEI {:#x})",
                    t.fes.0, t.fei
                );
                limited!(
                    self.target.log_limiter,
                    log::Level::Warn,
                    "host-termreq",
                    "{}: {why}",
                    self.peer
                );
                Err(End::HostTerminated(why))
            }
            Pdu::CapsuleCmd(c) => self.handle_capsule(c.sqe, &c.data),
            Pdu::H2CData(d) => self.handle_h2c_data(d.cccid, d.ttag, d.datao, d.last, &d.data),
            // The decoder rejects controller-to-host PDU types for this role.
            _ => Err(self.fatal(Fes::PDU_SEQUENCE_ERROR, 0, "unexpected PDU type")),
        }
    }

    fn initialize(&mut self, req: IcReq) {
        let resp = IcResp {
            cpda: 0,
            header_digest: req.header_digest,
            data_digest: req.data_digest,
            maxh2cdata: self.max_h2c_data,
        };
        let negotiated =
            Negotiated::new(&req, &resp).expect("controller mirrors the host's digests");
        let limits = &self.target.config.limits;
        // Largest data one PDU may carry towards us: H2CData up to
        // MAXH2CDATA, or in-capsule data (admin capsules are 8 KiB even
        // when IOCCSZ is smaller). Capsules within this but beyond their
        // queue's in-capsule limit are answered with a status
        // (`check_capsule`); larger PDUs end the connection.
        let max_data = self
            .max_h2c_data
            .max(limits.in_capsule_data_bytes)
            .max(ADMIN_IN_CAPSULE_BYTES as u32);
        let _ = self.responder.tx.send(Outgoing::Pdu(Pdu::IcResp(resp)));
        let _ = self
            .responder
            .tx
            .send(Outgoing::Encode(negotiated.encode_config(Role::Controller)));
        self.decoder
            .set_config(negotiated.decoder_config(Role::Controller, max_data));
        self.state = QueueState::AwaitConnect;
    }

    /// Counts a new command: SQ head moves, in-flight grows. A command
    /// beyond the SQ's entries is an overrun: the connection closes.
    fn accept_command(&self) -> Result<(), End> {
        let sq = &self.responder.sq;
        let entries = sq.entries();
        if budget::sq_overrun(sq.outstanding.load(Ordering::Acquire), entries) {
            limited!(
                self.target.log_limiter,
                log::Level::Warn,
                "sq-overrun",
                "{}: host has more commands outstanding than its {entries}-entry submission queue; closing the connection",
                self.peer
            );
            return Err(End::Fatal(format!("SQ overrun ({entries} entries)")));
        }
        sq.outstanding.fetch_add(1, Ordering::AcqRel);
        let size = sq.size.load(Ordering::Relaxed).max(1);
        let head = sq.head.load(Ordering::Relaxed);
        sq.head.store((head + 1) % size, Ordering::Relaxed);
        sq.inflight.fetch_add(1, Ordering::AcqRel);
        self.target.inflight.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The most in-capsule data a command on this queue may carry: IOCCSZ
    /// on an I/O queue; on the admin queue (and before Connect) the 8 KiB
    /// capsule NVMe/TCP gives it.
    fn in_capsule_max(&self) -> usize {
        match self.state {
            QueueState::Io(..) => self.target.config.limits.in_capsule_data_bytes as usize,
            _ => ADMIN_IN_CAPSULE_BYTES,
        }
    }

    /// What every command must pass before it is parsed, in Linux nvmet's
    /// order (`nvmet_req_init`, then `nvmet_tcp_map_data`).
    fn check_capsule(&self, sqe: &Sqe, data: &[u8]) -> Result<(), Status> {
        // NVMe Base 2.0, Common Command Format, FUSE: fused operations are
        // optional and this controller has none (Identify Controller FUSES
        // is 0): Invalid Field in Command, as nvmet.
        if sqe.flags & FLAGS_FUSE_MASK != 0 {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        // NVMe over Fabrics 1.1, "Submission Queue Entry" (Fabrics
        // command and capsule format): PSDT is 01b, SGLs with a single
        // metadata buffer; PRPs do not exist on a fabric. Invalid Field in
        // Command, as nvmet.
        if sqe.flags & FLAGS_PSDT_MASK != FLAGS_PSDT_SGL {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        // NVMe/TCP 1.0, "Command Capsule" / Identify Controller IOCCSZ:
        // in-capsule data never exceeds the capsule size; nvmet-tcp
        // answers a larger in-capsule SGL with SGL Offset Invalid.
        let sgl_len = match sqe.dptr.kind() {
            SglKind::InCapsule { length, .. } => length as usize,
            _ => 0,
        };
        if data.len().max(sgl_len) > self.in_capsule_max() {
            return Err(Status::SGL_OFFSET_INVALID.with_dnr());
        }
        Ok(())
    }

    fn handle_capsule(&mut self, sqe: Sqe, data: &[u8]) -> Result<(), End> {
        self.accept_command()?;
        let r = self.responder.clone();
        if let Some(c) = self.controller() {
            c.touch(self.target.now_ms());
        }
        if let Err(status) = self.check_capsule(&sqe, data) {
            r.status(sqe.cid, status);
            return Ok(());
        }
        let connected = matches!(self.state, QueueState::Admin(_) | QueueState::Io(..));
        if connected && sqe.opcode == admin_opcode::FABRICS {
            match sqe.fctype() {
                fctype::AUTHENTICATION_SEND => return self.auth_send(&sqe, data),
                fctype::AUTHENTICATION_RECEIVE => {
                    self.auth_receive(&sqe);
                    return Ok(());
                }
                _ => {}
            }
        }
        // NVMe Base 2.x, "Authentication": until the queue is
        // authenticated, every other command fails with Authentication
        // Required (nvmet: NVME_SC_AUTH_REQUIRED, DNR).
        if connected && self.auth.as_ref().is_some_and(|a| !a.authenticated) {
            r.status(sqe.cid, Status::AUTHENTICATION_REQUIRED.with_dnr());
            return Ok(());
        }
        match &self.state {
            QueueState::AwaitIcReq => unreachable!("checked in handle_pdu"),
            QueueState::AwaitConnect => {
                match (sqe.opcode, FabricsCommand::parse(&sqe)) {
                    (admin_opcode::FABRICS, Ok(FabricsCommand::Connect(c))) => {
                        self.handle_connect(sqe, c, data);
                    }
                    _ => r.status(sqe.cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
                }
                Ok(())
            }
            QueueState::Admin(ctrl) => {
                let ctrl = ctrl.clone();
                match ctrl.handle_admin(&self.target, &sqe, data) {
                    AdminOutcome::Reply {
                        status,
                        dw0,
                        dw1,
                        data,
                        zeros,
                    } => {
                        r.reply(sqe.cid, status, dw0, dw1, data, zeros);
                        Ok(())
                    }
                    // Held until an event; it does not count as in flight,
                    // so shutdown does not wait for it, nor against the SQ
                    // (the AER limit bounds it).
                    AdminOutcome::Held => {
                        r.finish_one();
                        release_slot(&r.sq);
                        Ok(())
                    }
                    AdminOutcome::Disconnect => {
                        r.status(sqe.cid, Status::SUCCESS);
                        Err(End::Disconnect)
                    }
                }
            }
            QueueState::Io(ctrl, .., lease) => {
                // A reset controller's I/O queues serve nothing more, even
                // before this reader notices the reset.
                if lease.reset.is_cancelled() {
                    r.finish_one();
                    return Err(End::QueueReset);
                }
                let ctrl = ctrl.clone();
                self.handle_io(&ctrl, sqe, data)
            }
        }
    }

    /// Answers the Fabrics Connect that opens a queue: checks what an admin
    /// and an I/O queue share, then creates a controller (QID 0) or joins
    /// one, and sets the queue up the same way for both.
    fn handle_connect(&mut self, sqe: Sqe, c: Connect, data: &[u8]) {
        debug_assert!(matches!(self.state, QueueState::AwaitConnect));
        let joined = self.check_connect(&c, data).and_then(|(cd, subsystem)| {
            let auth = self.auth_for(&c, &cd, subsystem.as_deref())?;
            let state = if c.qid == 0 {
                self.connect_admin(&c, &cd, subsystem)
            } else {
                self.connect_io(&c, &cd)
            }?;
            Ok((state, auth))
        });
        match joined {
            Ok((state, auth)) => {
                self.auth = auth;
                self.accept_connect(sqe.cid, &c, state)
            }
            Err(ConnectRefusal::Status(status)) => self.responder.status(sqe.cid, status),
            Err(ConnectRefusal::Invalid(p)) => self.responder.complete(
                sqe.cid,
                Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
                p.to_dw0(),
                0,
                Vec::new(),
            ),
        }
    }

    /// The checks every Connect passes: record format, the Connect data
    /// (in the capsule, whole), the queue size, and the subsystem (`None`:
    /// discovery), which must exist and allow the host.
    fn check_connect(
        &self,
        c: &Connect,
        data: &[u8],
    ) -> Result<(ConnectData, Option<Arc<Subsystem>>), ConnectRefusal> {
        use ConnectRefusal::{Invalid, Status as Refuse};
        if c.recfmt != 0 {
            return Err(Refuse(Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr()));
        }
        let in_capsule_ok = matches!(c.sgl.kind(), SglKind::InCapsule { offset: 0, length } if length as usize == nvmf_proto::fabrics::CONNECT_DATA_LEN)
            && data.len() == nvmf_proto::fabrics::CONNECT_DATA_LEN;
        if !in_capsule_ok {
            return Err(Refuse(Status::DATA_SGL_LENGTH_INVALID.with_dnr()));
        }
        let cd = match ConnectData::from_bytes(data) {
            Ok(cd) => cd,
            Err(ProtoError::InvalidField { offset, .. }) => {
                limited!(
                    self.target.log_limiter,
                    log::Level::Warn,
                    "connect-refused",
                    "{}: Connect data malformed at byte {offset}",
                    self.peer
                );
                return Err(Invalid(ConnectInvalidParameter::Data(offset as u16)));
            }
            Err(_) => return Err(Invalid(ConnectInvalidParameter::Data(0))),
        };
        // NVMe over Fabrics 1.1, Connect command data: HOSTNQN names the
        // host; an empty one names nobody (no tenant, no access control).
        // Connect Invalid Parameters pointing at the field.
        if cd.hostnqn.is_empty() {
            limited!(
                self.target.log_limiter,
                log::Level::Warn,
                "connect-refused",
                "{}: Connect with an empty host NQN",
                self.peer
            );
            return Err(Invalid(ConnectInvalidParameter::Data(
                connect_data_offset::HOSTNQN,
            )));
        }
        let limits = self.target.config.limits;
        if c.sqsize == 0 || c.queue_depth() > limits.max_queue_size as u32 {
            return Err(Invalid(ConnectInvalidParameter::Command(
                connect_sqe_offset::SQSIZE,
            )));
        }
        if cd.subnqn == DISCOVERY_NQN {
            return Ok((cd, None));
        }
        let Some(subsystem) = self.target.subsystems.get(&cd.subnqn).cloned() else {
            limited!(
                self.target.log_limiter,
                log::Level::Warn,
                "connect-refused",
                "{}: host {} asked for unknown subsystem {}",
                self.peer,
                cd.hostnqn,
                cd.subnqn
            );
            return Err(Invalid(ConnectInvalidParameter::Data(
                connect_data_offset::SUBNQN,
            )));
        };
        if !subsystem.config.host_allowed(&cd.hostnqn) {
            limited!(
                self.target.log_limiter,
                log::Level::Warn,
                "connect-refused",
                "{}: host {} is not allowed on {}",
                self.peer,
                cd.hostnqn,
                cd.subnqn
            );
            return Err(Refuse(Status::CONNECT_INVALID_HOST.with_dnr()));
        }
        Ok((cd, Some(subsystem)))
    }

    /// An admin queue's Connect: a new controller (dynamic model) with
    /// its keep-alive monitor.
    fn connect_admin(
        &self,
        c: &Connect,
        cd: &ConnectData,
        subsystem: Option<Arc<Subsystem>>,
    ) -> Result<QueueState, ConnectRefusal> {
        if cd.cntlid != CNTLID_DYNAMIC {
            return Err(ConnectRefusal::Invalid(ConnectInvalidParameter::Data(
                connect_data_offset::CNTLID,
            )));
        }
        let kato = Controller::kato_for(&self.target, subsystem.is_none(), c.kato_ms);
        let tenant = self.target.tenant_of(&cd.hostnqn);
        let now = self.target.now_ms();
        let ctrl = self.target.register_controller(|id| {
            Arc::new(Controller::new(
                id,
                subsystem,
                HostIdentity {
                    nqn: cd.hostnqn.clone(),
                    id: cd.host_id,
                    tenant,
                },
                c.queue_depth(),
                kato,
                now,
            ))
        });
        let Some(ctrl) = ctrl else {
            return Err(ConnectRefusal::Status(Status::CONNECT_CONTROLLER_BUSY));
        };
        limited!(
            self.target.log_limiter,
            log::Level::Info,
            "controller-created",
            "{}: host {} connected to {} as controller {} (KATO {} ms)",
            self.peer,
            cd.hostnqn,
            ctrl.subnqn(),
            ctrl.cntlid,
            kato
        );
        spawn_keep_alive_monitor(self.target.clone(), ctrl.clone());
        Ok(QueueState::Admin(ctrl))
    }

    /// An I/O queue's Connect: joins the live, non-discovery controller
    /// the host names, on the same subsystem and for the same host (NQN
    /// and host identifier).
    fn connect_io(&self, c: &Connect, cd: &ConnectData) -> Result<QueueState, ConnectRefusal> {
        let ctrl = match self.target.controller(cd.cntlid) {
            Some(ctrl)
                if ctrl.subnqn() == cd.subnqn
                    && ctrl.host_nqn == cd.hostnqn
                    && !ctrl.is_discovery() =>
            {
                ctrl
            }
            _ => {
                return Err(ConnectRefusal::Invalid(ConnectInvalidParameter::Data(
                    connect_data_offset::CNTLID,
                )))
            }
        };
        // NVMe over Fabrics 1.1, Connect command data: an I/O queue joins
        // the association of the host that created the controller; the
        // same NQN with another host identifier is another host (Linux
        // nvmet finds no controller for it: Connect Invalid Parameters).
        if cd.host_id != ctrl.host_id {
            limited!(
                self.target.log_limiter,
                log::Level::Warn,
                "connect-refused",
                "{}: I/O queue {} refused: host identifier differs from the admin queue's",
                self.peer,
                c.qid
            );
            return Err(ConnectRefusal::Invalid(ConnectInvalidParameter::Data(
                connect_data_offset::HOSTID,
            )));
        }
        let lease = match ctrl.attach_io_queue(c.qid) {
            Ok(lease) => lease,
            Err(why) => {
                limited!(
                    self.target.log_limiter,
                    log::Level::Warn,
                    "connect-refused",
                    "{}: I/O queue {} refused: {why}",
                    self.peer,
                    c.qid
                );
                return Err(ConnectRefusal::Invalid(ConnectInvalidParameter::Command(
                    connect_sqe_offset::QID,
                )));
            }
        };
        let class = NvmeClass::ALL[c.priority_class() as usize];
        Ok(QueueState::Io(ctrl, c.qid, class, lease))
    }

    /// Sets the queue up as its Connect asks (size; SQ flow control; the
    /// head past the Connect itself), enters `state` and answers with the
    /// controller ID.
    fn accept_connect(&mut self, cid: u16, c: &Connect, state: QueueState) {
        let cntlid = match &state {
            QueueState::Admin(ctrl) | QueueState::Io(ctrl, ..) => ctrl.cntlid,
            QueueState::AwaitIcReq | QueueState::AwaitConnect => {
                unreachable!("a Connect is accepted into an admin or I/O queue")
            }
        };
        // `check_connect` bounded it by `max_queue_size` (at most 1024):
        // it fits the register, and the head's modulus is not zero.
        let depth = c.queue_depth() as u16;
        debug_assert!(depth >= 2 && u32::from(depth) == c.queue_depth());
        let sq = &self.responder.sq;
        sq.size.store(depth, Ordering::Relaxed);
        sq.qid.store(c.qid, Ordering::Relaxed);
        sq.flow_control_disabled
            .store(c.sq_flow_control_disabled(), Ordering::Relaxed);
        sq.head.store(1 % depth, Ordering::Relaxed);
        if c.qid != 0 {
            self.grow_receive_buffer(depth);
        }
        self.state = state;
        // The Connect's own CQE names the new queue, and asks for
        // authentication (AUTHREQ.ATR) when the host has a key: on the
        // admin queue and on every I/O queue, as nvmet up to Linux 6.14
        // does and as the specification allows (each queue proves the key
        // by its own transaction).
        let authreq = if self.auth.is_some() {
            AuthReq::ATR
        } else {
            AuthReq::NONE
        };
        self.responder.complete(
            cid,
            Status::SUCCESS,
            connect_success_dw0(cntlid, authreq.0),
            0,
            Vec::new(),
        );
    }

    /// Let an I/O queue's socket hold what its host may send before we
    /// read it ([`budget::receive_window`]): with autotuning alone one
    /// connection's buffer can settle at a quarter of the data its R2Ts
    /// solicit and keep that host's writes waiting for the window
    /// (issue 14). The admin queue carries no bulk data and keeps the
    /// kernel's default.
    fn grow_receive_buffer(&self, depth: u16) {
        let want = budget::receive_window(&self.target.config.limits, depth);
        match sock_tune::grow_receive_buffer(self.fd, want) {
            Ok(n) => log::debug!("{}: receive buffer {n} bytes for {want}", self.peer),
            Err(e) => log::debug!("{}: receive buffer left to TCP: {e}", self.peer),
        }
    }

    /// Whether the queue a Connect opens must authenticate: when the host
    /// has a `[[host]]` secret (never on the discovery controller, as
    /// nvmet); a subsystem with `require_auth` refuses a host without one.
    fn auth_for(
        &self,
        c: &Connect,
        cd: &ConnectData,
        subsystem: Option<&Subsystem>,
    ) -> Result<Option<QueueAuth>, ConnectRefusal> {
        let Some(subsystem) = subsystem else {
            return Ok(None);
        };
        let Some(host) = self.target.config.host(&cd.hostnqn) else {
            if subsystem.config.require_auth {
                limited!(
                    self.target.log_limiter,
                    log::Level::Warn,
                    "auth-refused",
                    "{}: host {} refused on {}: the subsystem requires authentication and the host has no DH-HMAC-CHAP secret ([[host]])",
                    self.peer,
                    cd.hostnqn,
                    cd.subnqn
                );
                return Err(ConnectRefusal::Status(
                    Status::CONNECT_INVALID_HOST.with_dnr(),
                ));
            }
            return Ok(None);
        };
        let config = CtrlAuthConfig {
            host_nqn: cd.hostnqn.clone(),
            subsys_nqn: cd.subnqn.clone(),
            host_secret: host.dhchap_secret.clone(),
            ctrl_secret: host.dhchap_ctrl_secret.clone(),
            hashes: host.dhchap_hashes.clone(),
            dh_groups: host.dhchap_dhgroups.clone(),
        };
        let config = Arc::new(config);
        match CtrlAuth::new(Arc::clone(&config), c.qid) {
            Ok(ctrl) => Ok(Some(QueueAuth {
                config,
                ctrl,
                failed: false,
                authenticated: false,
                attempts: 0,
            })),
            Err(e) => {
                log::error!(
                    "{}: host {}: authentication not set up: {e}",
                    self.peer,
                    cd.hostnqn
                );
                Err(ConnectRefusal::Status(Status::INTERNAL_ERROR))
            }
        }
    }

    /// Authentication Send: one message from the host, in-capsule, TL
    /// bytes long (the budget: TL <= `auth::MAX_MESSAGE_LEN`, checked
    /// before anything is kept).
    fn auth_send(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), End> {
        let r = self.responder.clone();
        let Some(auth) = self.auth.as_mut() else {
            // nvmet without a key for the host has no transaction to run.
            r.status(sqe.cid, Status::INVALID_FIELD.with_dnr());
            return Ok(());
        };
        let cmd = match AuthenticationSend::from_sqe(sqe).and_then(|c| c.check_dhchap().map(|()| c))
        {
            Ok(c) => c,
            Err(_) => {
                r.status(sqe.cid, Status::INVALID_FIELD.with_dnr());
                return Ok(());
            }
        };
        // The message travels in the capsule (Linux always sends it so: a
        // few hundred bytes); its length must be TL.
        let in_capsule =
            matches!(cmd.sgl.kind(), SglKind::InCapsule { offset: 0, length } if length == cmd.tl);
        if !in_capsule || data.len() != cmd.tl as usize {
            r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            return Ok(());
        }
        let negotiate = data.first() == Some(&nvmf_proto::auth::message::auth_type::COMMON)
            && data.get(1) == Some(&nvmf_proto::auth::message::auth_id::NEGOTIATE);
        if negotiate && !auth.authenticated {
            auth.attempts += 1;
            if auth.attempts > MAX_AUTH_ATTEMPTS {
                r.finish_one();
                return Err(End::Fatal(format!(
                    "more than {MAX_AUTH_ATTEMPTS} authentication attempts on one queue"
                )));
            }
        }
        if negotiate && auth.failed {
            // The configuration was accepted when the queue connected.
            if let Ok(fresh) = CtrlAuth::new(Arc::clone(&auth.config), auth.ctrl.qid()) {
                auth.ctrl = fresh;
                auth.failed = false;
            }
        }
        let progress = auth.ctrl.on_send(data);
        r.status(sqe.cid, Status::SUCCESS);
        self.auth_progress(progress);
        Ok(())
    }

    /// Authentication Receive: the controller's next message in AL bytes
    /// (zero-padded from a static page past the message, as nvmet pads;
    /// AL is bounded by MDTS so the padding is too).
    fn auth_receive(&mut self, sqe: &Sqe) {
        let r = self.responder.clone();
        let mdts = self.target.config.limits.max_data_transfer_bytes;
        let Some(auth) = self.auth.as_mut() else {
            r.status(sqe.cid, Status::INVALID_FIELD.with_dnr());
            return;
        };
        let cmd =
            match AuthenticationReceive::from_sqe(sqe).and_then(|c| c.check_dhchap().map(|()| c)) {
                Ok(c) if c.al <= mdts => c,
                _ => {
                    r.status(sqe.cid, Status::INVALID_FIELD.with_dnr());
                    return;
                }
            };
        if !matches!(cmd.sgl.kind(), SglKind::Transport { length } if length == cmd.al) {
            r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            return;
        }
        match auth.ctrl.on_receive(cmd.al) {
            Ok(reply) => {
                let zeros = cmd.al as usize - reply.data.len();
                r.reply(sqe.cid, Status::SUCCESS, 0, 0, reply.data, zeros);
                self.auth_progress(reply.progress);
            }
            // AL too small for the pending message: it stays pending.
            Err(_) => r.status(sqe.cid, Status::INVALID_FIELD.with_dnr()),
        }
    }

    /// Where the queue's authentication stands after a message.
    fn auth_progress(&mut self, progress: CtrlProgress) {
        let host = self
            .controller()
            .map(|c| c.host_nqn.clone())
            .unwrap_or_default();
        let Some(auth) = self.auth.as_mut() else {
            return;
        };
        match progress {
            CtrlProgress::InProgress | CtrlProgress::FailureQueued(_) => {}
            CtrlProgress::Authenticated(a) => {
                if !auth.authenticated {
                    log::debug!(
                        "{}: host {host} authenticated on queue {} ({}, {}{})",
                        self.peer,
                        auth.ctrl.qid(),
                        a.hash,
                        a.dh_group,
                        if a.bidirectional {
                            ", bidirectional"
                        } else {
                            ""
                        }
                    );
                }
                auth.authenticated = true;
                self.target.note_auth_success(&host);
            }
            CtrlProgress::Failed(e) => {
                if auth.authenticated {
                    // A failed re-authentication: the queue gets the time a
                    // new connection gets to prove the key again.
                    self.handshake_deadline = tokio::time::Instant::now()
                        + Duration::from_millis(self.target.config.timeouts.handshake_ms.into());
                }
                auth.authenticated = false;
                auth.failed = true;
                // A wrong key fails on every queue and every reconnect:
                // warn once per host until it succeeds again (and at most
                // at the log limiter's rate across hosts).
                let qid = auth.ctrl.qid();
                if self.target.note_auth_failure(&host) {
                    limited!(
                        self.target.log_limiter,
                        log::Level::Warn,
                        "auth-failed",
                        "{}: host {host} failed DH-HMAC-CHAP authentication on queue {qid}: {e} \
                         (further failures of this host are logged at debug level)",
                        self.peer
                    );
                } else {
                    log::debug!(
                        "{}: host {host} failed authentication on queue {qid}: {e}",
                        self.peer
                    );
                }
            }
        }
    }

    /// The class tag of this queue's requests to `ns`: `None` (round
    /// robin, today's path) unless the controller enabled WRR or DRR.
    fn class_tag(&self, ctrl: &Controller, ns: &Namespace) -> Option<ClassTag> {
        let QueueState::Io(_, qid, class, _) = &self.state else {
            return None;
        };
        let mut arbiter = ctrl.arbiter_config()?;
        arbiter.aging_threshold_us = ns.config.class_aging_us;
        Some(ClassTag {
            arbiter,
            class: *class,
            queue: ClassTag::queue_id(ctrl.cntlid, *qid),
            device_queue_depth: ns.config.device_queue_depth,
        })
    }

    /// This queue's completion sink for I/O to `nsid`.
    fn ns_sink(&mut self, ctrl: &Controller, nsid: u32) -> Arc<NsSink> {
        if let Some((_, s)) = self.ns_sinks.iter().find(|(n, _)| *n == nsid) {
            return s.clone();
        }
        let sink = Arc::new(NsSink {
            responder: self.responder.clone(),
            // Every namespace of the subsystem has a counter; a fresh one
            // would only mean a drain cannot see this queue's commands.
            inflight: ctrl.ns_inflight.get(&nsid).cloned().unwrap_or_default(),
        });
        self.ns_sinks.push((nsid, sink.clone()));
        sink
    }

    /// The reservation check right before a command enters `ns`'s
    /// pipeline: on success the command is counted as admitted and must be
    /// completed through the returned sink (or counted out with
    /// `inflight.done()` if it ends before the pipeline).
    fn admit(
        &mut self,
        ctrl: &Controller,
        ns: &Namespace,
        access: Access,
    ) -> Result<Arc<NsSink>, Status> {
        let sink = self.ns_sink(ctrl, ns.nsid);
        ns.reservations
            .admit(&sink.inflight, &ctrl.host_id, access)?;
        Ok(sink)
    }

    /// A reservation command arrived: Report answers at once; Register,
    /// Acquire and Release first get their data (in the capsule, or by
    /// R2T like a write) and run in [`Self::reservation_execute`].
    fn reservation_command(&mut self, ctrl: &Arc<Controller>, sqe: Sqe, data: &[u8]) {
        let r = self.responder.clone();
        let Some(ns) = self.namespace(ctrl, sqe.nsid) else {
            return r.status(sqe.cid, Status::INVALID_NAMESPACE.with_dnr());
        };
        match ReservationCommandKind::of_opcode(sqe.opcode) {
            Some(ReservationCommandKind::Report) => self.reservation_report(&ns, &sqe),
            Some(kind) => self.receive_data(ctrl, sqe, kind.host_data_len(), data),
            None => r.status(sqe.cid, Status::INVALID_OPCODE.with_dnr()),
        }
    }

    /// Reservation Report, in nvmet's order of checks: the extended
    /// structure only (128-bit host identifiers: Host Identifier
    /// Inconsistent Format otherwise), at least its 64-byte header
    /// (Invalid Field), at most MDTS, the data pointer describing exactly
    /// NUMD's length. The report is at most 64 + 64 x 64 bytes; the rest of
    /// a longer buffer is zeros from the static page.
    fn reservation_report(&mut self, ns: &Namespace, sqe: &Sqe) {
        let r = self.responder.clone();
        let cmd = match ReservationReport::from_sqe(sqe) {
            Ok(c) => c,
            Err(_) => return r.status(sqe.cid, Status::INVALID_FIELD.with_dnr()),
        };
        if !cmd.eds {
            return r.status(sqe.cid, Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr());
        }
        let len = cmd.data_len();
        if len < STATUS_EXT_HEADER_LEN as u64
            || len > u64::from(self.target.config.limits.max_data_transfer_bytes)
        {
            return r.status(sqe.cid, Status::INVALID_FIELD.with_dnr());
        }
        match sqe.dptr.kind() {
            SglKind::Transport { length } if u64::from(length) == len => {}
            SglKind::Transport { .. } => {
                return r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr())
            }
            _ => return r.status(sqe.cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr()),
        }
        let report = ns.reservations.snapshot().report();
        let mut data = match report.to_vec(true) {
            Ok(d) => d,
            Err(_) => return r.status(sqe.cid, Status::INTERNAL_ERROR),
        };
        let len = len as usize;
        data.truncate(len);
        let zeros = len - data.len();
        r.reply(sqe.cid, Status::SUCCESS, 0, 0, data, zeros);
    }

    /// Register, Acquire or Release with its data: the state changes
    /// under the namespace's lock at once (every later command sees it);
    /// then notifications are logged, and the command completes once the
    /// change is durable (PTPL) and the preempted hosts' admitted commands
    /// are drained (Preempt and Abort).
    fn reservation_execute(&mut self, ctrl: &Arc<Controller>, sqe: Sqe, data: &[u8]) {
        let r = self.responder.clone();
        let cid = sqe.cid;
        let Some(ns) = self.namespace(ctrl, sqe.nsid) else {
            return r.status(cid, Status::INVALID_NAMESPACE.with_dnr());
        };
        let Some(subsystem) = ctrl.subsystem.clone() else {
            return r.status(cid, Status::INVALID_OPCODE.with_dnr());
        };
        let host = ctrl.host_id;
        let res = &ns.reservations;
        let outcome = match ReservationCommandKind::of_opcode(sqe.opcode) {
            Some(ReservationCommandKind::Register) => {
                ReservationRegister::parse(&sqe, data).map(|c| res.register(&host, &c))
            }
            Some(ReservationCommandKind::Acquire) => {
                ReservationAcquire::parse(&sqe, data).map(|c| res.acquire(&host, &c))
            }
            Some(ReservationCommandKind::Release) => {
                ReservationRelease::parse(&sqe, data).map(|c| res.release(&host, &c))
            }
            _ => return r.status(cid, Status::INVALID_OPCODE.with_dnr()),
        };
        let Outcome {
            status,
            effects,
            persist,
        } = match outcome {
            Ok(o) => o,
            Err(_) => return r.status(cid, Status::INVALID_FIELD.with_dnr()),
        };
        for (h, log_type) in &effects.notify {
            for c in controllers_of_host(&self.target, &subsystem, h) {
                c.notify_reservation(ns.nsid, *log_type);
            }
        }
        let mut drains = Vec::new();
        for h in &effects.abort {
            for c in controllers_of_host(&self.target, &subsystem, h) {
                if let Some(inflight) = c.ns_inflight.get(&ns.nsid) {
                    NamespaceReservations::start_abort(inflight);
                    drains.push(inflight.clone());
                }
            }
        }
        if persist.is_none() && drains.is_empty() {
            return r.status(cid, status);
        }
        // The preempted hosts' admitted commands drain and the sidecar is
        // written off this connection's reader; the command stays in
        // flight (shutdown waits for it) until both are done.
        tokio::spawn(async move {
            let mut status = status;
            if let Some((version, snapshot)) = persist {
                let ns2 = ns.clone();
                let written = tokio::task::spawn_blocking(move || {
                    ns2.reservations.persist(version, snapshot.as_ref())
                })
                .await;
                if !matches!(written, Ok(Ok(()))) {
                    log::error!(
                        "namespace {}: the reservation change could not be made durable: {:?}",
                        ns.nsid,
                        written
                    );
                    status = Status::INTERNAL_ERROR;
                }
            }
            for d in drains {
                d.drain().await;
            }
            r.status(cid, status);
        });
    }

    fn namespace(&self, ctrl: &Controller, nsid: u32) -> Option<Arc<Namespace>> {
        ctrl.subsystem.as_ref()?.namespaces.get(&nsid).cloned()
    }

    fn handle_io(&mut self, ctrl: &Arc<Controller>, sqe: Sqe, data: &[u8]) -> Result<(), End> {
        let r = self.responder.clone();
        let cmd = match IoCommand::parse(&sqe) {
            Ok(c) => c,
            Err(_) => {
                r.status(sqe.cid, Status::INVALID_FIELD.with_dnr());
                return Ok(());
            }
        };
        if self.pending.contains_key(&sqe.cid) {
            r.status(sqe.cid, Status::COMMAND_ID_CONFLICT.with_dnr());
            return Ok(());
        }
        match cmd {
            IoCommand::Fabrics(FabricsCommand::Disconnect(_)) => {
                r.status(sqe.cid, Status::SUCCESS);
                return Err(End::Disconnect);
            }
            IoCommand::Other(s) if ReservationCommandKind::of_opcode(s.opcode).is_some() => {
                self.reservation_command(ctrl, sqe, data);
            }
            IoCommand::Fabrics(_) | IoCommand::Other(_) => {
                r.status(sqe.cid, Status::INVALID_OPCODE.with_dnr());
            }
            IoCommand::Read(rw) => {
                let (ns, len) = match self.check_rw(ctrl, &rw) {
                    Ok(v) => v,
                    Err(s) => {
                        r.status(sqe.cid, s);
                        return Ok(());
                    }
                };
                match rw.sgl.kind() {
                    SglKind::Transport { length } if length as usize == len => {}
                    SglKind::Transport { .. } => {
                        r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                        return Ok(());
                    }
                    _ => {
                        r.status(sqe.cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr());
                        return Ok(());
                    }
                }
                // The data will be held until it is sent: take it from the
                // queue's budget first, or wait.
                let Some(reservation) = self.reserve(len) else {
                    self.defer(sqe);
                    return Ok(());
                };
                let offset = rw.slba << ns.block_shift;
                let cid = sqe.cid;
                let sink = match self.admit(ctrl, &ns, Access::Read) {
                    Ok(sink) => sink,
                    Err(status) => {
                        drop(reservation);
                        r.status(cid, status);
                        return Ok(());
                    }
                };
                let class = self.class_tag(ctrl, &ns);
                self.submit_io(
                    ns,
                    ctrl.tenant,
                    class,
                    IoOp::Read { offset, len },
                    Completion::Sink(sink, Responder::tag(cid, true, reservation.into_raw())),
                );
            }
            IoCommand::Write(rw) => {
                // A conflicting write is refused before its data moves
                // (nvmet checks at parse time too); it is checked again,
                // and admitted, when its data is in.
                let checked = self.check_rw(ctrl, &rw).and_then(|(ns, len)| {
                    ns.reservations.check(&ctrl.host_id, Access::Write)?;
                    Ok(len)
                });
                let len = match checked {
                    Ok(len) => len,
                    Err(s) => {
                        r.status(sqe.cid, s);
                        return Ok(());
                    }
                };
                self.receive_data(ctrl, sqe, len, data);
            }
            IoCommand::DatasetManagement(dsm) => {
                let Some(ns) = self.namespace(ctrl, dsm.nsid) else {
                    r.status(sqe.cid, Status::INVALID_NAMESPACE.with_dnr());
                    return Ok(());
                };
                if let Err(s) = ns.reservations.check(&ctrl.host_id, Access::Write) {
                    r.status(sqe.cid, s);
                    return Ok(());
                }
                // The Linux host always sends a buffer of the maximum 256
                // ranges whatever NR says: accept any length from NR+1
                // ranges up to that, and read only NR+1 of them.
                let needed = dsm.range_count() * nvmf_proto::command::DSM_RANGE_LEN;
                let max = nvmf_proto::command::DSM_MAX_RANGES * nvmf_proto::command::DSM_RANGE_LEN;
                let len = match sqe.dptr.kind() {
                    SglKind::InCapsule { length, .. } | SglKind::Transport { length } => {
                        length as usize
                    }
                    SglKind::Unsupported { .. } => needed,
                };
                if len < needed || len > max {
                    r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                    return Ok(());
                }
                self.receive_data(ctrl, sqe, len, data);
            }
            IoCommand::WriteZeroes(wz) => {
                let Some(ns) = self.namespace(ctrl, wz.nsid) else {
                    r.status(sqe.cid, Status::INVALID_NAMESPACE.with_dnr());
                    return Ok(());
                };
                let blocks = wz.nlb as u64 + 1;
                if wz
                    .slba
                    .checked_add(blocks)
                    .is_none_or(|end| end > ns.size_blocks)
                {
                    r.status(sqe.cid, Status::LBA_OUT_OF_RANGE.with_dnr());
                    return Ok(());
                }
                let cid = sqe.cid;
                let sink = match self.admit(ctrl, &ns, Access::Write) {
                    Ok(sink) => sink,
                    Err(status) => {
                        r.status(cid, status);
                        return Ok(());
                    }
                };
                let class = self.class_tag(ctrl, &ns);
                let op = IoOp::WriteZeroes {
                    offset: wz.slba << ns.block_shift,
                    len: blocks << ns.block_shift,
                };
                self.submit_io(
                    ns,
                    ctrl.tenant,
                    class,
                    op,
                    Completion::Sink(sink, Responder::tag(cid, false, 0)),
                );
            }
            IoCommand::Flush { nsid } => self.flush(ctrl, sqe.cid, nsid),
        }
        Ok(())
    }

    /// Checks a Read/Write against its namespace and MDTS; returns the
    /// namespace and the transfer length in bytes.
    fn check_rw(
        &self,
        ctrl: &Controller,
        rw: &ReadWrite,
    ) -> Result<(Arc<Namespace>, usize), Status> {
        let ns = self
            .namespace(ctrl, rw.nsid)
            .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
        let blocks = rw.block_count() as u64;
        if rw
            .slba
            .checked_add(blocks)
            .is_none_or(|end| end > ns.size_blocks)
        {
            return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        let len = blocks << ns.block_shift;
        if len > self.target.config.limits.max_data_transfer_bytes as u64 {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        Ok((ns, len as usize))
    }

    /// Gets a host-to-controller command's data: in-capsule, or solicited
    /// with an R2T (then the command waits in `pending`). One R2T per
    /// command, for all its data (MAXR2T = 1), and only once the queue's
    /// data budget holds the buffer: until then the command waits.
    fn receive_data(&mut self, ctrl: &Arc<Controller>, sqe: Sqe, len: usize, data: &[u8]) {
        let r = self.responder.clone();
        match sqe.dptr.kind() {
            SglKind::InCapsule { offset, length } => {
                if offset != 0 {
                    return r.status(sqe.cid, Status::SGL_OFFSET_INVALID.with_dnr());
                }
                if length as usize != len || data.len() != len {
                    return r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                }
                self.execute_with_data(ctrl, sqe, data.to_vec(), None);
            }
            SglKind::Transport { length } => {
                if length as usize != len || !data.is_empty() {
                    return r.status(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                }
                let Some(reservation) = self.reserve(len) else {
                    return self.defer(sqe);
                };
                let ttag = self.next_ttag;
                self.next_ttag = self.next_ttag.wrapping_add(1);
                self.pending.insert(
                    sqe.cid,
                    PendingData {
                        sqe,
                        buf: Vec::with_capacity(len),
                        len,
                        reservation,
                        received: 0,
                        ttag,
                        poisoned: false,
                    },
                );
                let _ = r.tx.send(Outgoing::Pdu(Pdu::R2T(R2T {
                    cccid: sqe.cid,
                    ttag,
                    r2to: 0,
                    r2tl: len as u32,
                })));
            }
            SglKind::Unsupported { .. } => {
                r.status(sqe.cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr())
            }
        }
    }

    fn handle_h2c_data(
        &mut self,
        cccid: u16,
        ttag: u16,
        datao: u32,
        last: bool,
        data: &[u8],
    ) -> Result<(), End> {
        use nvmf_proto::FatalErrorStatus as Fes;
        // H2CData before Connect, for a read, or for an unknown command all
        // land here: no pending transfer has that CCCID.
        let Some(p) = self.pending.get_mut(&cccid) else {
            return Err(self.fatal(
                Fes::INVALID_HEADER_FIELD,
                8,
                "H2CData for a command that solicited no data",
            ));
        };
        if p.ttag != ttag {
            return Err(self.fatal(
                Fes::INVALID_HEADER_FIELD,
                10,
                "H2CData with a wrong transfer tag",
            ));
        }
        if data.len() > self.max_h2c_data as usize {
            return Err(self.fatal(
                Fes::DATA_TRANSFER_LIMIT_EXCEEDED,
                0,
                "H2CData above MAXH2CDATA",
            ));
        }
        let end = datao as usize + data.len();
        if datao as usize != p.received || end > p.len {
            return Err(self.fatal(
                Fes::DATA_TRANSFER_OUT_OF_RANGE,
                0,
                "H2CData outside the solicited range",
            ));
        }
        if last != (end == p.len) {
            return Err(self.fatal(
                Fes::PDU_SEQUENCE_ERROR,
                0,
                "H2CData LAST_PDU flag does not match the transfer",
            ));
        }
        if !p.poisoned {
            // In order, so this lands at `datao` (a poisoned transfer's
            // data is never used: it is not kept).
            p.buf.extend_from_slice(data);
        }
        p.received = end;
        if end == p.len {
            self.data_complete(cccid);
        }
        Ok(())
    }

    fn data_complete(&mut self, cccid: u16) {
        let Some(p) = self.pending.remove(&cccid) else {
            return;
        };
        if p.poisoned {
            self.responder
                .status(cccid, Status::TRANSIENT_TRANSPORT_ERROR);
            return;
        }
        debug_assert_eq!(p.buf.len(), p.len, "all data appended, in order");
        if let Some(ctrl) = self.controller().cloned() {
            self.execute_with_data(&ctrl, p.sqe, p.buf, Some(p.reservation));
        }
    }

    /// A data digest mismatch: the command fails, the connection stays (the
    /// data is damaged, not the framing). For H2CData the transfer goes on
    /// until its end, so the framing of later PDUs stays in step.
    fn data_digest_error(&mut self, cid: u16, raw: &[u8], e: &ProtoError) -> Result<(), End> {
        use nvmf_proto::FatalErrorStatus as Fes;
        limited!(
            self.target.log_limiter,
            log::Level::Warn,
            "data-digest",
            "{}: {e}",
            self.peer
        );
        let is_h2c = raw.first() == Some(&nvmf_proto::pdu::pdu_type::H2C_DATA);
        if !is_h2c {
            // A capsule whose in-capsule data is damaged: fail it unexecuted.
            self.accept_command()?;
            self.responder
                .status(cid, Status::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        let word =
            |o: usize| u32::from_le_bytes([raw[o], raw[o + 1], raw[o + 2], raw[o + 3]]) as usize;
        if raw.len() < H2C_DATAL_OFFSET + 4 {
            return Err(self.fatal(Fes::INVALID_HEADER_FIELD, 0, "short H2CData"));
        }
        let (datao, datal) = (word(H2C_DATAO_OFFSET), word(H2C_DATAL_OFFSET));
        let Some(p) = self.pending.get_mut(&cid) else {
            return Err(self.fatal(
                Fes::INVALID_HEADER_FIELD,
                8,
                "H2CData for a command that solicited no data",
            ));
        };
        if datao != p.received || datao + datal > p.len {
            return Err(self.fatal(
                Fes::DATA_TRANSFER_OUT_OF_RANGE,
                0,
                "H2CData outside the solicited range",
            ));
        }
        p.poisoned = true;
        p.received = datao + datal;
        if p.received == p.len {
            self.data_complete(cid);
        }
        Ok(())
    }

    /// Executes a command whose data has arrived; `reservation` is the
    /// data's share of the budget (R2T data), held until it completes.
    fn execute_with_data(
        &mut self,
        ctrl: &Arc<Controller>,
        sqe: Sqe,
        data: Vec<u8>,
        reservation: Option<Reservation>,
    ) {
        let r = self.responder.clone();
        let cid = sqe.cid;
        let reserved = reservation.map_or(0, Reservation::into_raw);
        // Completions below that end before the pipeline release it.
        let hold = r.budget.adopt(reserved);
        match IoCommand::parse(&sqe) {
            Ok(IoCommand::Write(rw)) => {
                let Some(ns) = self.namespace(ctrl, rw.nsid) else {
                    return r.status(cid, Status::INVALID_NAMESPACE.with_dnr());
                };
                let sink = match self.admit(ctrl, &ns, Access::Write) {
                    Ok(sink) => sink,
                    Err(status) => return r.status(cid, status),
                };
                let class = self.class_tag(ctrl, &ns);
                let op = IoOp::Write {
                    offset: rw.slba << ns.block_shift,
                    data,
                    fua: rw.fua,
                };
                self.submit_io(
                    ns,
                    ctrl.tenant,
                    class,
                    op,
                    Completion::Sink(sink, Responder::tag(cid, false, hold.into_raw())),
                );
            }
            Ok(IoCommand::Other(s)) if ReservationCommandKind::of_opcode(s.opcode).is_some() => {
                drop(hold);
                self.reservation_execute(ctrl, sqe, &data);
            }
            Ok(IoCommand::DatasetManagement(dsm)) => {
                let Some(ns) = self.namespace(ctrl, dsm.nsid) else {
                    return r.status(cid, Status::INVALID_NAMESPACE.with_dnr());
                };
                let ranges = match DsmRange::decode_list(&data, dsm.range_count()) {
                    Ok(r) => r,
                    Err(_) => return r.status(cid, Status::INVALID_FIELD.with_dnr()),
                };
                // Dataset Management is in the write group even as a hint.
                let sink = match self.admit(ctrl, &ns, Access::Write) {
                    Ok(sink) => sink,
                    Err(status) => return r.status(cid, status),
                };
                if !dsm.deallocate() || !ns.info.discard {
                    // Hints only: nothing to do.
                    sink.inflight.done();
                    return r.status(cid, Status::SUCCESS);
                }
                let mut byte_ranges = Vec::with_capacity(ranges.len());
                for range in ranges {
                    let blocks = range.block_count as u64;
                    if range
                        .slba
                        .checked_add(blocks)
                        .is_none_or(|end| end > ns.size_blocks)
                    {
                        sink.inflight.done();
                        return r.status(cid, Status::LBA_OUT_OF_RANGE.with_dnr());
                    }
                    if blocks > 0 {
                        byte_ranges.push((range.slba << ns.block_shift, blocks << ns.block_shift));
                    }
                }
                // The range list is parsed: its buffer is not held further.
                drop(hold);
                let class = self.class_tag(ctrl, &ns);
                self.submit_io(
                    ns,
                    ctrl.tenant,
                    class,
                    IoOp::Discard {
                        ranges: byte_ranges,
                    },
                    Completion::Sink(sink, Responder::tag(cid, false, 0)),
                );
            }
            _ => r.status(cid, Status::INTERNAL_ERROR),
        }
    }

    /// Flush one namespace, or all of them (NSID FFFFFFFFh); completes when
    /// every backend has flushed, with the first error if any.
    fn flush(&mut self, ctrl: &Arc<Controller>, cid: u16, nsid: u32) {
        let r = self.responder.clone();
        let targets: Vec<Arc<Namespace>> = match (&ctrl.subsystem, nsid) {
            (Some(s), 0xFFFF_FFFF) => s.namespaces.values().cloned().collect(),
            _ => match self.namespace(ctrl, nsid) {
                Some(ns) => vec![ns],
                None => return r.status(cid, Status::INVALID_NAMESPACE.with_dnr()),
            },
        };
        if targets.is_empty() {
            return r.status(cid, Status::SUCCESS);
        }
        // Flush is in the write group (as nvmet): every namespace it
        // names must admit it, else none is flushed.
        let mut sinks = Vec::with_capacity(targets.len());
        for ns in &targets {
            match self.admit(ctrl, ns, Access::Write) {
                Ok(sink) => sinks.push(sink),
                Err(status) => {
                    for s in sinks {
                        s.inflight.done();
                    }
                    return r.status(cid, status);
                }
            }
        }
        let remaining = Arc::new(AtomicUsize::new(targets.len()));
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for (ns, sink) in targets.into_iter().zip(sinks) {
            let (r, remaining, failed) = (r.clone(), remaining.clone(), failed.clone());
            let class = self.class_tag(ctrl, &ns);
            self.submit_io(
                ns,
                ctrl.tenant,
                class,
                IoOp::Flush,
                Completion::callback(move |done| {
                    sink.inflight.done();
                    if let Err(e) = &done.result {
                        limited!(
                            r.target.log_limiter,
                            log::Level::Warn,
                            "io-error",
                            "flush failed: {e}"
                        );
                        failed.store(true, Ordering::Relaxed);
                    }
                    if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        let status = if failed.load(Ordering::Relaxed) {
                            Status::WRITE_FAULT
                        } else {
                            Status::SUCCESS
                        };
                        r.complete(
                            cid,
                            status,
                            0,
                            done.credit.map_or(0, credit_dw1),
                            Vec::new(),
                        );
                    }
                }),
            );
        }
    }

    async fn finish(&mut self, end: End) {
        // Commands waiting for data or for budget will never get it; their
        // buffers and reservations go now.
        for (_, _p) in self.pending.drain() {
            self.responder.finish_one();
        }
        for _ in self.deferred.drain(..) {
            self.responder.finish_one();
        }
        match &end {
            End::PeerClosed
            | End::Disconnect
            | End::Shutdown
            | End::ControllerGone
            | End::QueueReset => {
                log::debug!("{}: connection ended: {end:?}", self.peer)
            }
            _ => limited!(
                self.target.log_limiter,
                log::Level::Warn,
                "connection-ended",
                "{}: connection ended: {end:?}",
                self.peer
            ),
        }
        match &self.state {
            QueueState::Admin(ctrl) => {
                // The admin queue is the association: without it the
                // controller is gone.
                ctrl.drop_pending_aers();
                teardown(&self.target, ctrl, "admin queue closed");
            }
            QueueState::Io(ctrl, qid, _, lease) => {
                ctrl.detach_io_queue(*qid, lease.epoch);
                if end.is_fatal() {
                    teardown(&self.target, ctrl, "fatal error on an I/O queue");
                }
            }
            _ => {}
        }
        if end.abandons_output() {
            // Nobody to send to: close now. Commands still at a backend
            // complete into a closed channel.
            self.abort_writer.cancel();
            return;
        }
        // Let in-flight commands complete (their completions go out before
        // the close) unless the socket is already broken. Bounded: a backend
        // stuck for longer is not worth hanging shutdown for, and a host
        // that does not read is cut off by the writer's send timeout.
        if !matches!(end, End::SocketError(_)) {
            for _ in 0..1000 {
                if self.responder.sq.inflight.load(Ordering::Acquire) == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let _ = self.responder.tx.send(Outgoing::Close);
    }
}

/// Tears a controller down once: every connection of it closes.
fn teardown(target: &Target, ctrl: &Controller, why: &str) {
    if !ctrl.teardown.is_cancelled() {
        ctrl.teardown.cancel();
        target.unregister_controller(ctrl.cntlid);
        limited!(
            target.log_limiter,
            log::Level::Info,
            "controller-torn-down",
            "controller {} of host {} on {} torn down: {why}",
            ctrl.cntlid,
            ctrl.host_nqn,
            ctrl.subnqn()
        );
    }
}

/// Watches a controller's keep-alive timer; tears it down when the host
/// stays silent for longer than KATO.
fn spawn_keep_alive_monitor(target: Arc<Target>, ctrl: Arc<Controller>) {
    tokio::spawn(async move {
        loop {
            let kato = ctrl.kato_ms() as u64;
            // Check several times per KATO so expiry is noticed promptly.
            let tick = if kato == 0 {
                1000
            } else {
                (kato / 4).clamp(10, 1000)
            };
            tokio::select! {
                _ = ctrl.teardown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(tick)) => {}
            }
            if ctrl.keep_alive_expired(target.now_ms()) {
                // Every queue of the controller, admin and I/O, closes: they
                // all watch `teardown`.
                limited!(
                    target.log_limiter,
                    log::Level::Warn,
                    "keep-alive",
                    "controller {} of host {}: keep-alive timeout ({} ms)",
                    ctrl.cntlid,
                    ctrl.host_nqn,
                    kato
                );
                teardown(&target, &ctrl, "keep-alive timeout");
                return;
            }
        }
    });
}
