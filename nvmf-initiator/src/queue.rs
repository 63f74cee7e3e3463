//! The sans-IO NVMe/TCP queue: one TCP connection carrying one admin or I/O
//! queue, from ICReq to close.
//!
//! [`Queue`] opens no socket and reads no clock. The driver that owns the
//! socket (the blocking driver in [`crate::blocking`], or an io_uring loop)
//! moves bytes and time through it:
//!
//! ```text
//! let mut q = Queue::new(config, now);        // queues ICReq
//! loop {
//!     q.submit(now, request)?;                 // any time, also before Live
//!     while q.poll_transmit(&mut buf, LIMIT) > 0 { socket.send_all(&buf); buf.clear(); }
//!     // wait for: socket readable, q.poll_timeout(), or new requests
//!     q.handle_bytes(now, &received);          // on data (0 bytes read: q.handle_closed())
//!     q.handle_timeout(now);                   // when poll_timeout() has passed
//!     while let Some(ev) = q.poll_event() { ... }
//! }
//! ```
//!
//! Call order: after every `handle_*` or `submit`, drain `poll_transmit`
//! (send everything it returned, in order) and `poll_event`, then re-read
//! `poll_timeout`. Nothing happens between calls.
//!
//! **Read data lands in place.** A C2HData PDU is taken by its header
//! ([`nvmf_proto::PduDecoder::decode_data_header`]): once the header is in
//! and checked against its command, its data is copied from the input
//! straight into the request's buffer, never gathered in the queue's own
//! reassembly buffer. A driver that can choose where the socket writes
//! asks [`Queue::rx_direct`] before each receive: while the data of such a
//! PDU is still due it is the exact part of the request's buffer the next
//! data bytes belong in; receive into it and report the count with
//! [`Queue::handle_direct`] (the data digest is computed there). Everything
//! else, including the digest after the data, goes through
//! [`Queue::handle_bytes`], which also accepts the data itself: a driver
//! may ignore the direct path entirely.
//!
//! Lifecycle: `Connecting` (ICReq sent, waiting for ICResp, then Connect
//! sent, waiting for its response) → `Live` ([`Event::Connected`]) →
//! `Closed` ([`Event::Failed`] once, or after [`Queue::close`]). A closed
//! queue is never reused: the driver opens a new socket and a new
//! [`Queue`], and moves the requests [`Queue::take_unfinished`] returns to
//! it (or fails them) as its reconnect policy says.
//!
//! **Never wrong data.** Every PDU from the target is checked against the
//! command it names: a completion for a command ID that is not outstanding
//! (stale or duplicated: each slot's generation is part of the CID), data
//! outside the command's buffer or out of order, an R2T for a read, a
//! successful completion before all data arrived, a digest mismatch, a
//! TermReq: each closes the queue with [`Event::Failed`]. Requests in
//! flight are then returned by [`Queue::take_unfinished`], never completed
//! with partial data.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_proto::auth::{HostAuth, HostAuthConfig, HostNext, HostStep};
use nvmf_proto::command::{IoCommand, ReadWrite, WriteZeroes};
use nvmf_proto::decoder::{DataHeader, DataHeaderDecoded, Decoded, DecoderConfig, PduDecoder};
use nvmf_proto::fabrics::{AuthReq, AuthenticationReceive, AuthenticationSend};
use nvmf_proto::fabrics::{Connect, ConnectData, PriorityClass, CNTLID_DYNAMIC};
use nvmf_proto::pdu::{
    crc32c_append, pdu_type, CapsuleCmd, EncodeConfig, H2CData, IcReq, Negotiated, Pdu, Role,
    TermReq, CAPSULE_RESP_HLEN, DATA_PDU_HLEN, DIGEST_LEN, R2T_HLEN, TERM_REQ_HLEN,
};
use nvmf_proto::sqe::{admin_opcode, DataDirection, SglDescriptor, Sqe};
use nvmf_proto::{ProtoError, Status};

use crate::error::{ConnectRefusal, Error};

/// Most blocks one Read/Write can name (NLB is 16 bits, 0's based).
const MAX_BLOCKS_PER_COMMAND: u64 = 1 << 16;

/// Settings of one queue connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Queue ID: 0 for the admin queue.
    pub qid: u16,
    /// Entries in the submission queue (Connect SQSIZE + 1); also the most
    /// commands outstanding at once.
    pub depth: u16,
    /// Priority class sent in Connect CATTR bits 1:0 (I/O queues only; the
    /// target uses it when weighted round robin arbitration is on).
    pub priority: PriorityClass,
    /// Keep alive timeout in milliseconds sent in the admin Connect.
    pub kato_ms: u32,
    /// Controller ID: [`CNTLID_DYNAMIC`] for the admin queue, the one the
    /// admin Connect returned for I/O queues.
    pub cntlid: u16,
    /// Host NQN (the tenant identity at a Gimbal target).
    pub host_nqn: String,
    /// Host identifier.
    pub host_id: [u8; 16],
    /// Subsystem NQN.
    pub subnqn: String,
    /// Ask for header digests in ICReq.
    pub header_digest: bool,
    /// Ask for data digests in ICReq.
    pub data_digest: bool,
    /// Bound on ICReq → Connect response.
    pub connect_timeout: Duration,
    /// Bound on each command (issue → completion); expiry closes the queue,
    /// as the kernel host resets the controller on an I/O timeout.
    pub command_timeout: Duration,
    /// Largest data transfer of one NVMe command (from MDTS, capped by the
    /// host); larger Read/Write requests are split.
    pub max_transfer_bytes: u32,
    /// Largest write carried in the command capsule (from IOCCSZ; 8 KiB on
    /// the admin queue); larger writes wait for R2T.
    pub in_capsule_bytes: u32,
    /// DH-HMAC-CHAP keys: when the target asks (Connect AUTHREQ.ATR), the
    /// queue authenticates before it is Live; with a controller secret it
    /// also makes the target prove its key, and refuses a target that does
    /// not ask.
    pub auth: Option<Arc<HostAuthConfig>>,
}

impl QueueConfig {
    /// The admin queue of a new (dynamic) controller.
    pub fn admin(host_nqn: &str, host_id: [u8; 16], subnqn: &str, kato_ms: u32) -> Self {
        Self {
            qid: 0,
            depth: 32,
            priority: PriorityClass::Urgent,
            kato_ms,
            cntlid: CNTLID_DYNAMIC,
            host_nqn: host_nqn.to_owned(),
            host_id,
            subnqn: subnqn.to_owned(),
            header_digest: false,
            data_digest: false,
            connect_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(30),
            max_transfer_bytes: 1 << 20,
            // NVMe-oF: the admin queue takes 8 KiB of in-capsule data.
            in_capsule_bytes: 8192,
            auth: None,
        }
    }

    /// I/O queue `qid` of controller `cntlid`, otherwise like `admin`.
    pub fn io(admin: &QueueConfig, qid: u16, cntlid: u16, depth: u16) -> Self {
        Self {
            qid,
            depth,
            priority: PriorityClass::Medium,
            kato_ms: 0,
            cntlid,
            ..admin.clone()
        }
    }
}

/// What a request asks the controller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Read `buf.len()` bytes from `slba` (split at the transfer limit).
    Read {
        /// Namespace.
        nsid: u32,
        /// First block.
        slba: u64,
        /// The namespace's block size; `buf.len()` must be a multiple.
        block_size: u32,
    },
    /// Write `buf` at `slba` (split at the transfer limit).
    Write {
        /// Namespace.
        nsid: u32,
        /// First block.
        slba: u64,
        /// The namespace's block size; `buf.len()` must be a multiple.
        block_size: u32,
        /// Force Unit Access.
        fua: bool,
    },
    /// Flush the volatile write cache.
    Flush {
        /// Namespace (FFFFFFFFh: all).
        nsid: u32,
    },
    /// Write Zeroes (no data).
    WriteZeroes {
        /// Namespace.
        nsid: u32,
        /// First block.
        slba: u64,
        /// Number of blocks (1..=65536).
        blocks: u32,
        /// Deallocate the blocks if the namespace can.
        deallocate: bool,
    },
    /// Any other command as an SQE (admin commands, Dataset Management,
    /// Fabrics): sent as one command; CID and data pointer are filled in,
    /// the direction comes from the opcode (or FCTYPE). The reservation
    /// commands go this way: `Raw(cmd.to_sqe(0))` with `cmd.data()` as the
    /// buffer (Register, Acquire, Release) or a buffer of the report's
    /// length (Report); see `nvmf_proto::reservation`.
    Raw(Sqe),
}

/// A request: a command, its data buffer, and a value the caller chooses
/// to recognise the completion (a ublk tag, a job slot, ...).
#[derive(Debug)]
pub struct Request<B> {
    /// What to do.
    pub command: Command,
    /// Data: the source of a write, the destination of a read. `None` for
    /// commands without data. Held by the queue until completion.
    pub buf: Option<B>,
    /// Returned in the completion.
    pub user_data: u64,
}

/// A finished request.
#[derive(Debug)]
pub struct Completion<B> {
    /// The request's `user_data`.
    pub user_data: u64,
    /// NVMe status (of the first failing piece, if the request was split).
    pub status: Status,
    /// Completion dword 0 (command specific) of the last piece.
    pub dw0: u32,
    /// Completion dword 1 of the last piece: a Gimbal target's credit total
    /// (bit 31 set) travels here; see `nvmf_proto::Cqe::gimbal_credit`.
    pub dw1: u32,
    /// The buffer, holding the read data after a successful read.
    pub buf: Option<B>,
}

impl<B> Completion<B> {
    /// Whether the command completed with Reservation Conflict: the
    /// namespace is reserved by another host. The queue never retries or
    /// requeues a completed command, this one included; a caller fencing
    /// on reservations must stop writing rather than retry elsewhere.
    pub fn is_reservation_conflict(&self) -> bool {
        self.status.is_reservation_conflict()
    }

    /// The Gimbal credit total, if DW1 carries one.
    pub fn gimbal_credit(&self) -> Option<u32> {
        (self.dw1 & nvmf_proto::cqe::GIMBAL_CREDIT_VALID != 0)
            .then_some(self.dw1 & !nvmf_proto::cqe::GIMBAL_CREDIT_VALID)
    }
}

/// A request [`Queue::submit`] did not accept, handed back with the reason.
#[derive(Debug)]
pub struct Rejected<B> {
    /// Why.
    pub error: Error,
    /// The request, untouched.
    pub request: Request<B>,
}

/// What a queue reports to its driver.
#[derive(Debug)]
pub enum Event<B> {
    /// Connect succeeded: the queue is live. `cntlid` is the controller ID
    /// (what I/O queues of this controller must send in their Connect).
    Connected {
        /// Controller ID from the Connect response.
        cntlid: u16,
    },
    /// A request finished (successfully or with an NVMe error status).
    Completed(Completion<B>),
    /// The connection is unusable; reported once. Unfinished requests are
    /// in [`Queue::take_unfinished`]. Send what `poll_transmit` still
    /// returns (a TermReq), then close the socket.
    Failed(Error),
}

/// Where the queue is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueState {
    /// ICReq sent, ICResp not yet received.
    AwaitIcResp,
    /// Connect sent, its response not yet received.
    AwaitConnect,
    /// Commands flow.
    Live,
    /// Failed or closed; takes no more requests.
    Closed,
}

/// Counters of one queue (cheap to read at any time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// NVMe commands sent (after MDTS splitting).
    pub commands: u64,
    /// Requests completed (events delivered).
    pub completions: u64,
    /// Writes sent with in-capsule data.
    pub in_capsule_writes: u64,
    /// R2Ts received.
    pub r2ts: u64,
    /// C2HData PDUs that completed a command via the SUCCESS flag.
    pub success_shortcuts: u64,
    /// Keep Alive commands sent.
    pub keep_alives: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Internal {
    Connect,
    KeepAlive,
    /// An Authentication Send of the transaction in `Queue::auth`.
    AuthSend,
    /// An Authentication Receive of that transaction.
    AuthReceive,
}

enum ReqBuf<B> {
    None,
    User(B),
    Internal(Vec<u8>),
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> ReqBuf<B> {
    fn bytes(&self) -> &[u8] {
        match self {
            ReqBuf::None => &[],
            ReqBuf::User(b) => b.as_ref(),
            ReqBuf::Internal(v) => v,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            ReqBuf::None => &mut [],
            ReqBuf::User(b) => b.as_mut(),
            ReqBuf::Internal(v) => v,
        }
    }
}

struct ReqState<B> {
    user_data: u64,
    command: Command,
    buf: ReqBuf<B>,
    internal: Option<Internal>,
    /// Submission order, so unfinished requests are handed back in order.
    seq: u64,
    total_len: u32,
    /// Byte offset of the next piece to issue.
    next_offset: u32,
    /// Pieces issued and not yet completed.
    pieces_out: u32,
    /// Whether every piece has been issued.
    all_issued: bool,
    status: Status,
    dw0: u32,
    dw1: u32,
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    req: usize,
    /// Offset of this piece in the request's buffer.
    offset: u32,
    len: u32,
    dir: DataDirection,
    in_capsule: bool,
    /// Reads: bytes received. Writes via R2T: bytes solicited.
    done: u32,
    deadline: Instant,
}

struct Slot {
    generation: u16,
    /// Times the slot was taken: tells its commands apart even when their
    /// CIDs are equal (no generation bits above 32768 slots).
    uses: u32,
    piece: Option<Piece>,
}

/// A PDU waiting to be sent. Capsules and data name their command by slot
/// and by the slot's `uses`: if the command completed meanwhile (the target
/// may complete a command before its data went out) and the slot went to
/// another one, they no longer match and the PDU is dropped.
enum Out {
    Bytes(Vec<u8>),
    Capsule {
        slot: u16,
        uses: u32,
        sqe: Sqe,
    },
    H2C {
        slot: u16,
        uses: u32,
        cid: u16,
        ttag: u16,
        datao: u32,
        len: u32,
        last: bool,
    },
}

/// One NVMe/TCP queue connection, sans-IO; see the module documentation.
///
/// `B` is the data buffer type: `Vec<u8>` for the blocking driver, a
/// handle to a ublk I/O buffer for the ublk server.
pub struct Queue<B> {
    cfg: QueueConfig,
    state: QueueState,
    ic_req: IcReq,
    decoder: PduDecoder,
    encode: EncodeConfig,
    maxh2cdata: u32,
    connect_deadline: Instant,
    /// Bytes of a PDU that straddled two `handle_bytes` calls: a whole
    /// PDU without data for a command buffer, or the header of a C2HData
    /// PDU (never its data).
    rx: Vec<u8>,
    /// The C2HData PDU whose header was accepted and whose data (and
    /// digest) are still arriving.
    rx_data: Option<RxData>,
    /// The last PDU in was the last data of a read, without the SUCCESS
    /// flag: its CapsuleResp usually comes next ([`Queue::rx_header_len`]).
    rx_resp_next: bool,
    slots: Vec<Slot>,
    free_slots: Vec<u16>,
    slot_bits: u32,
    reqs: Vec<Option<ReqState<B>>>,
    free_reqs: Vec<usize>,
    next_seq: u64,
    /// Requests with pieces left to issue, oldest first.
    waiting: VecDeque<usize>,
    out: VecDeque<Out>,
    events: VecDeque<Event<B>>,
    keep_alive: Option<KeepAlive>,
    cntlid: u16,
    stats: QueueStats,
    /// The DH-HMAC-CHAP transaction between the Connect response and Live.
    auth: Option<HostAuth>,
    /// What follows the Authentication Send in flight (a failure is
    /// reported once its Failure2 was sent).
    auth_next: Option<HostNext>,
}

/// Transaction IDs for DH-HMAC-CHAP: distinct across the process's queues
/// (the spec asks only that a transaction's messages share one).
static NEXT_AUTH_TID: AtomicU16 = AtomicU16::new(1);

/// A C2HData PDU between its header and the end of its data digest.
struct RxData {
    header: DataHeader,
    slot: u16,
    /// The request whose buffer the data goes to.
    req: usize,
    /// Where in that buffer the next data byte goes.
    at: usize,
    /// Data bytes still due.
    left: usize,
    /// CRC32C of the data received so far (data digests on).
    crc: u32,
    /// The data digest, as far as it has arrived.
    digest: [u8; DIGEST_LEN],
    digest_len: usize,
}

struct KeepAlive {
    period: Duration,
    timeout: Duration,
    next_send: Instant,
    outstanding: bool,
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Queue<B> {
    /// A queue that starts by sending ICReq (see [`Queue::poll_transmit`]).
    pub fn new(cfg: QueueConfig, now: Instant) -> Self {
        let depth = cfg.depth.max(1);
        let slot_bits = u32::from(depth).next_power_of_two().trailing_zeros().max(1);
        let ic_req = IcReq {
            hpda: 0,
            header_digest: cfg.header_digest,
            data_digest: cfg.data_digest,
            maxr2t: 0,
        };
        let mut out = VecDeque::new();
        let mut bytes = Vec::with_capacity(128);
        // Encoding a fixed-size ICReq cannot fail.
        let _ = Pdu::IcReq(ic_req).encode(&EncodeConfig::default(), &mut bytes);
        out.push_back(Out::Bytes(bytes));
        let mut dec = DecoderConfig::new(Role::Host);
        dec.max_data_len = cfg.max_transfer_bytes.clamp(64 * 1024, 64 << 20);
        let connect_deadline = now + cfg.connect_timeout;
        Self {
            slots: (0..depth)
                .map(|_| Slot {
                    generation: 0,
                    uses: 0,
                    piece: None,
                })
                .collect(),
            // Popped from the end: slot 0 first.
            free_slots: (0..depth).rev().collect(),
            slot_bits,
            cfg,
            state: QueueState::AwaitIcResp,
            ic_req,
            decoder: PduDecoder::new(dec),
            encode: EncodeConfig::default(),
            maxh2cdata: nvmf_proto::pdu::MIN_MAXH2CDATA,
            connect_deadline,
            rx: Vec::new(),
            rx_data: None,
            rx_resp_next: false,
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            next_seq: 0,
            waiting: VecDeque::new(),
            out,
            events: VecDeque::new(),
            keep_alive: None,
            auth: None,
            auth_next: None,
            cntlid: 0,
            stats: QueueStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// Where the queue is in its life.
    pub fn state(&self) -> QueueState {
        self.state
    }

    /// Whether the queue is live (Connect done, not closed).
    pub fn is_live(&self) -> bool {
        self.state == QueueState::Live
    }

    /// Whether the queue is closed.
    pub fn is_closed(&self) -> bool {
        self.state == QueueState::Closed
    }

    /// Controller ID from the Connect response (0 before).
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// MAXH2CDATA the target granted (4096 before ICResp).
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Requests accepted and not yet completed (including split pieces
    /// not yet issued).
    pub fn outstanding(&self) -> usize {
        self.reqs.len() - self.free_reqs.len()
    }

    /// Change the transfer limits once Identify has told them (the admin
    /// queue connects before MDTS and IOCCSZ are known).
    pub fn set_limits(&mut self, max_transfer_bytes: u32, in_capsule_bytes: u32) {
        self.cfg.max_transfer_bytes = max_transfer_bytes;
        self.cfg.in_capsule_bytes = in_capsule_bytes;
        let mut dec = *self.decoder.config();
        dec.max_data_len = max_transfer_bytes.clamp(64 * 1024, 64 << 20);
        self.decoder.set_config(dec);
    }

    /// Send Keep Alive every `period` from now on, each bounded by
    /// `timeout` (use KATO/2 and KATO). Call on the admin queue once the
    /// controller is enabled: targets reject Keep Alive before CC.EN.
    pub fn start_keep_alive(&mut self, now: Instant, period: Duration, timeout: Duration) {
        self.keep_alive = Some(KeepAlive {
            period,
            timeout,
            next_send: now + period,
            outstanding: false,
        });
    }

    /// When the next Keep Alive is due, if keep-alive runs and none is in
    /// flight (a driver that pumps the admin queue only now and then sleeps
    /// until this instant).
    pub fn next_keep_alive(&self) -> Option<Instant> {
        self.keep_alive
            .as_ref()
            .filter(|k| !k.outstanding)
            .map(|k| k.next_send)
    }

    /// Accept a request. It is issued as soon as the queue is live and has
    /// a free command slot; Read/Write larger than the transfer limit are
    /// split into several commands and complete once, when all have.
    pub fn submit(&mut self, now: Instant, request: Request<B>) -> Result<(), Box<Rejected<B>>> {
        if self.state == QueueState::Closed {
            return Err(Box::new(Rejected {
                error: Error::QueueClosed,
                request,
            }));
        }
        let len = request.buf.as_ref().map_or(0, |b| b.as_ref().len());
        if let Err(e) = self.validate(&request.command, len) {
            return Err(Box::new(Rejected { error: e, request }));
        }
        let buf = match request.buf {
            Some(b) => ReqBuf::User(b),
            None => ReqBuf::None,
        };
        let id = self.alloc_req(ReqState {
            user_data: request.user_data,
            command: request.command,
            buf,
            internal: None,
            seq: 0,
            total_len: len as u32,
            next_offset: 0,
            pieces_out: 0,
            all_issued: false,
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
        });
        self.waiting.push_back(id);
        self.issue(now);
        Ok(())
    }

    fn validate(&self, command: &Command, len: usize) -> Result<(), Error> {
        if len > u32::MAX as usize {
            return Err(Error::InvalidRequest("buffer larger than 4 GiB"));
        }
        match *command {
            Command::Read {
                block_size, slba, ..
            }
            | Command::Write {
                block_size, slba, ..
            } => {
                if block_size == 0 || !block_size.is_power_of_two() {
                    return Err(Error::InvalidRequest("block size must be a power of two"));
                }
                if len == 0 || len % block_size as usize != 0 {
                    return Err(Error::InvalidRequest(
                        "buffer must be a non-zero multiple of the block size",
                    ));
                }
                // Every piece's first LBA (slba + offset / block size) must
                // exist: a wrapped one would address the wrong blocks.
                if slba
                    .checked_add((len / block_size as usize) as u64)
                    .is_none()
                {
                    return Err(Error::InvalidRequest("LBA range past 2^64"));
                }
                if self.cfg.max_transfer_bytes < block_size {
                    return Err(Error::InvalidRequest(
                        "transfer limit smaller than one block",
                    ));
                }
            }
            Command::Flush { .. } | Command::WriteZeroes { .. } if len != 0 => {
                return Err(Error::InvalidRequest("command carries no data"));
            }
            Command::WriteZeroes { blocks, .. }
                if blocks == 0 || u64::from(blocks) > MAX_BLOCKS_PER_COMMAND =>
            {
                return Err(Error::InvalidRequest("Write Zeroes of 1..=65536 blocks"));
            }
            Command::Raw(sqe) => match sqe.data_direction() {
                DataDirection::None if len != 0 => {
                    return Err(Error::InvalidRequest("opcode transfers no data"))
                }
                DataDirection::Bidirectional => {
                    return Err(Error::InvalidRequest("bidirectional commands unsupported"))
                }
                _ => {}
            },
            _ => {}
        }
        Ok(())
    }

    fn alloc_req(&mut self, mut r: ReqState<B>) -> usize {
        r.seq = self.next_seq;
        self.next_seq += 1;
        match self.free_reqs.pop() {
            Some(id) => {
                self.reqs[id] = Some(r);
                id
            }
            None => {
                self.reqs.push(Some(r));
                self.reqs.len() - 1
            }
        }
    }

    fn cid(&self, slot: u16) -> u16 {
        // In u32: with more than 32768 slots `slot_bits` is 16 and no bit
        // is left for the generation (it stays 0).
        ((u32::from(self.slots[slot as usize].generation) << self.slot_bits) | u32::from(slot))
            as u16
    }

    fn take_slot(&mut self) -> Option<u16> {
        let slot = self.free_slots.pop()?;
        let s = &mut self.slots[slot as usize];
        let gen_mask = (1u32 << (16 - self.slot_bits)) - 1;
        s.generation = ((u32::from(s.generation) + 1) & gen_mask) as u16;
        s.uses = s.uses.wrapping_add(1);
        Some(slot)
    }

    /// Issue pieces of waiting requests while slots are free.
    fn issue(&mut self, now: Instant) {
        if self.state != QueueState::Live {
            return;
        }
        while let Some(&id) = self.waiting.front() {
            let Some(slot) = self.take_slot() else { return };
            let (piece, sqe, done) = self.next_piece(id, now);
            let cid = self.cid(slot);
            let mut sqe = sqe;
            sqe.cid = cid;
            self.slots[slot as usize].piece = Some(piece);
            let uses = self.slots[slot as usize].uses;
            self.out.push_back(Out::Capsule { slot, uses, sqe });
            self.stats.commands += 1;
            if piece.in_capsule {
                self.stats.in_capsule_writes += 1;
            }
            if done {
                self.waiting.pop_front();
            }
        }
    }

    /// The next piece of request `id` and its SQE (CID not yet set); `true`
    /// when it is the last one.
    fn next_piece(&mut self, id: usize, now: Instant) -> (Piece, Sqe, bool) {
        let max_transfer = self.cfg.max_transfer_bytes;
        let in_capsule_limit = self.cfg.in_capsule_bytes;
        let deadline = now + self.cfg.command_timeout;
        let r = self.reqs[id].as_mut().expect("waiting request exists");
        let offset = r.next_offset;
        let (len, dir, sqe) = match r.command {
            Command::Read {
                nsid,
                slba,
                block_size,
            }
            | Command::Write {
                nsid,
                slba,
                block_size,
                ..
            } => {
                let limit =
                    u64::from(max_transfer).min(MAX_BLOCKS_PER_COMMAND * u64::from(block_size));
                let limit = (limit / u64::from(block_size)) * u64::from(block_size);
                let len = u64::from(r.total_len - offset).min(limit) as u32;
                let blocks = len / block_size;
                let lba = slba + u64::from(offset / block_size);
                let is_write = matches!(r.command, Command::Write { .. });
                let sgl = if is_write && len <= in_capsule_limit {
                    SglDescriptor::in_capsule(0, len)
                } else {
                    SglDescriptor::transport(len)
                };
                let mut rw = ReadWrite::new(nsid, lba, blocks, sgl).expect("block count checked");
                let cmd = if let Command::Write { fua, .. } = r.command {
                    rw.fua = fua;
                    IoCommand::Write(rw)
                } else {
                    IoCommand::Read(rw)
                };
                let dir = if is_write {
                    DataDirection::HostToController
                } else {
                    DataDirection::ControllerToHost
                };
                (len, dir, cmd.to_sqe(0))
            }
            Command::Flush { nsid } => {
                (0, DataDirection::None, IoCommand::Flush { nsid }.to_sqe(0))
            }
            Command::WriteZeroes {
                nsid,
                slba,
                blocks,
                deallocate,
            } => {
                let wz = WriteZeroes {
                    nsid,
                    slba,
                    nlb: (blocks - 1) as u16,
                    deallocate,
                    fua: false,
                    limited_retry: false,
                };
                (0, DataDirection::None, IoCommand::WriteZeroes(wz).to_sqe(0))
            }
            Command::Raw(mut sqe) => {
                let len = r.total_len;
                let dir = if len == 0 {
                    DataDirection::None
                } else {
                    sqe.data_direction()
                };
                sqe.dptr = match dir {
                    DataDirection::None => SglDescriptor::null(),
                    // Connect and authentication messages always travel in
                    // the capsule (targets expect them there; both are
                    // small).
                    DataDirection::HostToController
                        if len <= in_capsule_limit
                            || matches!(
                                r.internal,
                                Some(Internal::Connect | Internal::AuthSend)
                            ) =>
                    {
                        SglDescriptor::in_capsule(0, len)
                    }
                    _ => SglDescriptor::transport(len),
                };
                (len, dir, sqe)
            }
        };
        let in_capsule = dir == DataDirection::HostToController
            && sqe.dptr.kind()
                == nvmf_proto::SglKind::InCapsule {
                    offset: 0,
                    length: len,
                };
        r.next_offset = offset + len;
        r.pieces_out += 1;
        let last = r.next_offset >= r.total_len;
        if last {
            r.all_issued = true;
        }
        let piece = Piece {
            req: id,
            offset,
            len,
            dir,
            in_capsule,
            done: 0,
            deadline,
        };
        (piece, sqe, last)
    }

    /// Append PDUs to send to `buf`, whole PDUs only, until `buf` holds at
    /// least `limit` bytes or nothing is left; returns the bytes appended.
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>, limit: usize) -> usize {
        self.transmit(
            buf,
            limit,
            |_| usize::MAX,
            |_, _, _| unreachable!("nothing is left in place below usize::MAX bytes"),
        )
    }

    /// [`Queue::poll_transmit`] without copying large data: the data of an
    /// in-capsule write or an H2CData PDU of at least `min_in_place` bytes
    /// is not appended to `buf` but handed to `in_place(head, data,
    /// user_data)`, where `head` is where the PDU's header (with its
    /// digest and padding, up to its PDO) is in `buf`, so `head.end` is
    /// the index in `buf` the data belongs at (its data digest, if any,
    /// starts `buf[head.end..]`), and `user_data` names the request whose
    /// buffer it is. (A driver that sends the header by reference, from
    /// memory of its own that stays put, needs to know which bytes it is.)
    /// Sending `buf` with each piece of data spliced in at its `at`, in
    /// order, sends the same bytes as `poll_transmit` would have appended.
    /// `limit` counts the data left in place too; the return value is the
    /// bytes appended plus the bytes left in place. At most `limit /
    /// min_in_place + 1` pieces are left in place per call.
    ///
    /// `data` borrows the request's buffer only for the call; a driver
    /// that sends it later (an io_uring `SendMsg`) must itself keep that
    /// buffer alive and unchanged until the send is done, even if the
    /// request completes or the queue closes meanwhile (the engine of
    /// `ublk-target` pins the tag). Internal requests' data (Connect) is
    /// always copied.
    pub fn poll_transmit_vectored(
        &mut self,
        buf: &mut Vec<u8>,
        limit: usize,
        min_in_place: usize,
        in_place: impl FnMut(Range<usize>, &[u8], u64),
    ) -> usize {
        self.transmit(buf, limit, |_| min_in_place, in_place)
    }

    /// [`Queue::poll_transmit_vectored`] with the threshold chosen per
    /// request: `min_in_place(user_data)` (at least 1). A driver whose
    /// buffer for some requests does not hold their data (it sends that
    /// data from elsewhere, such as ublk's registered request pages)
    /// returns 1 for them, so none of it is copied from the buffer. The
    /// pieces left in place per call are then bounded by the PDUs sent,
    /// not by `limit / min_in_place`.
    pub fn poll_transmit_placed(
        &mut self,
        buf: &mut Vec<u8>,
        limit: usize,
        min_in_place: impl Fn(u64) -> usize,
        in_place: impl FnMut(Range<usize>, &[u8], u64),
    ) -> usize {
        self.transmit(buf, limit, min_in_place, in_place)
    }

    fn transmit(
        &mut self,
        buf: &mut Vec<u8>,
        limit: usize,
        min_in_place: impl Fn(u64) -> usize,
        mut in_place: impl FnMut(Range<usize>, &[u8], u64),
    ) -> usize {
        let start = buf.len();
        // Bytes handed to `in_place` (they count towards `limit`).
        let mut placed = 0;
        while buf.len() + placed < limit.max(start + 1) {
            let Some(out) = self.out.pop_front() else {
                break;
            };
            match out {
                Out::Bytes(b) => buf.extend_from_slice(&b),
                Out::Capsule { slot, uses, sqe } => {
                    let Some(p) = self.slots[slot as usize].piece else {
                        continue;
                    };
                    if self.slots[slot as usize].uses != uses {
                        continue;
                    }
                    let Some(r) = self.reqs[p.req].as_ref() else {
                        continue;
                    };
                    let data: &[u8] = if p.in_capsule {
                        &r.buf.bytes()[p.offset as usize..(p.offset + p.len) as usize]
                    } else {
                        &[]
                    };
                    let capsule = CapsuleCmd {
                        sqe,
                        data: Cow::Borrowed(data),
                    };
                    let pdu = Pdu::CapsuleCmd(capsule);
                    if leave_in_place(data, &min_in_place, r) {
                        placed += put_in_place(&pdu, data, &self.encode, r, buf, &mut in_place);
                    } else {
                        // Lengths are bounded by u32 checks at submit;
                        // encoding can only fail on a PLEN overflow, which
                        // they exclude.
                        let _ = pdu.encode(&self.encode, buf);
                    }
                }
                Out::H2C {
                    slot,
                    uses,
                    cid,
                    ttag,
                    datao,
                    len,
                    last,
                } => {
                    let Some(p) = self.slots[slot as usize].piece else {
                        continue;
                    };
                    if self.slots[slot as usize].uses != uses {
                        continue;
                    }
                    let Some(r) = self.reqs[p.req].as_ref() else {
                        continue;
                    };
                    let from = (p.offset + datao) as usize;
                    let data = &r.buf.bytes()[from..from + len as usize];
                    let pdu = Pdu::H2CData(H2CData {
                        cccid: cid,
                        ttag,
                        datao,
                        last,
                        data: Cow::Borrowed(data),
                    });
                    if leave_in_place(data, &min_in_place, r) {
                        placed += put_in_place(&pdu, data, &self.encode, r, buf, &mut in_place);
                    } else {
                        // Lengths are bounded by u32 checks at submit;
                        // encoding can only fail on a PLEN overflow, which
                        // they exclude.
                        let _ = pdu.encode(&self.encode, buf);
                    }
                }
            }
        }
        buf.len() - start + placed
    }

    /// Whether `poll_transmit` has something to send.
    pub fn has_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    /// Whether `poll_event` has something (a driver must not sleep then).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<B>> {
        self.events.pop_front()
    }

    /// When `handle_timeout` must be called next (connect bound, the
    /// earliest command deadline, the next Keep Alive), if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            QueueState::Closed => None,
            QueueState::AwaitIcResp | QueueState::AwaitConnect => Some(self.connect_deadline),
            QueueState::Live => {
                let slots = self
                    .slots
                    .iter()
                    .filter_map(|s| s.piece.map(|p| p.deadline))
                    .min();
                let ka = self
                    .keep_alive
                    .as_ref()
                    .filter(|k| !k.outstanding)
                    .map(|k| k.next_send);
                match (slots, ka) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        }
    }

    /// Act on time: connect and command timeouts close the queue; a due
    /// Keep Alive is queued for sending.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            QueueState::Closed => {}
            QueueState::AwaitIcResp | QueueState::AwaitConnect => {
                if now >= self.connect_deadline {
                    self.fail(Error::ConnectTimeout(self.cfg.connect_timeout), None);
                }
            }
            QueueState::Live => {
                let expired = self.slots.iter().find_map(|s| {
                    s.piece
                        .filter(|p| p.deadline <= now)
                        .map(|p| self.reqs[p.req].as_ref().and_then(|r| r.internal))
                });
                if let Some(internal) = expired {
                    let err = match (internal, &self.keep_alive) {
                        (Some(Internal::KeepAlive), Some(k)) => Error::KeepAliveTimeout(k.timeout),
                        _ => Error::CommandTimeout(self.cfg.command_timeout),
                    };
                    self.fail(err, None);
                    return;
                }
                self.maybe_keep_alive(now);
            }
        }
    }

    fn maybe_keep_alive(&mut self, now: Instant) {
        let Some(k) = self.keep_alive.as_mut() else {
            return;
        };
        if k.outstanding || now < k.next_send {
            return;
        }
        k.outstanding = true;
        k.next_send = now + k.period;
        let timeout = k.timeout;
        let id = self.alloc_req(ReqState {
            user_data: 0,
            command: Command::Raw(Sqe::new(admin_opcode::KEEP_ALIVE, 0)),
            buf: ReqBuf::None,
            internal: Some(Internal::KeepAlive),
            seq: 0,
            total_len: 0,
            next_offset: 0,
            pieces_out: 0,
            all_issued: false,
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
        });
        // Keep Alive goes ahead of waiting requests: it proves liveness.
        self.waiting.push_front(id);
        self.stats.keep_alives += 1;
        self.issue(now);
        // Its deadline is KATO, not the command timeout.
        for s in &mut self.slots {
            if let Some(p) = s.piece.as_mut() {
                if p.req == id {
                    p.deadline = now + timeout;
                }
            }
        }
    }

    /// The peer closed the connection (a read returned 0 bytes).
    pub fn handle_closed(&mut self) {
        self.fail(Error::ConnectionClosed, None);
    }

    /// A socket error: the connection is gone.
    pub fn handle_io_error(&mut self, e: std::io::Error) {
        self.fail(Error::io(e), None);
    }

    /// Close the queue without an error (after Disconnect, or on shutdown);
    /// unfinished requests stay available in `take_unfinished`.
    pub fn close(&mut self) {
        if self.state != QueueState::Closed {
            self.state = QueueState::Closed;
            self.out.clear();
            self.rx_data = None;
            self.clear_slots();
        }
    }

    /// Bytes received from the socket, in order, split anywhere. Data of
    /// a C2HData PDU among them is copied into its request's buffer (also
    /// when [`Queue::rx_direct`] would have offered that place).
    pub fn handle_bytes(&mut self, now: Instant, mut input: &[u8]) {
        while self.state != QueueState::Closed {
            if self.rx_data.is_some() {
                input = self.rx_data_bytes(now, input);
                if self.rx_data.is_some() {
                    // All of the input went to the data PDU.
                    return;
                }
            } else if !self.rx.is_empty() {
                // Complete the PDU (or data PDU header) that straddled the
                // previous call, taking only as many bytes as it still
                // needs.
                let mut rx = std::mem::take(&mut self.rx);
                let need = match self.decode_data_header(&rx) {
                    Ok(DataHeaderDecoded::NeedMore(n)) => Some(n),
                    Ok(DataHeaderDecoded::Header(h)) => {
                        self.begin_data(h, &rx);
                        None
                    }
                    Ok(DataHeaderDecoded::NotData) => match self.decoder.decode(&rx) {
                        Ok(Decoded::NeedMore(n)) => Some(n),
                        Ok(Decoded::Pdu { pdu, .. }) => {
                            if let Err(e) = self.handle_pdu(now, pdu) {
                                self.pdu_error(e, &rx);
                            }
                            None
                        }
                        Err(e) => {
                            self.pdu_error(Error::Protocol(e), &rx);
                            return;
                        }
                    },
                    Err(e) => {
                        self.pdu_error(Error::Protocol(e), &rx);
                        return;
                    }
                };
                match need {
                    Some(_) if input.is_empty() => {
                        self.rx = rx;
                        return;
                    }
                    Some(n) => {
                        let take = n.min(input.len());
                        rx.extend_from_slice(&input[..take]);
                        input = &input[take..];
                    }
                    None => rx.clear(),
                }
                self.rx = rx;
            } else {
                if input.is_empty() {
                    return;
                }
                match self.decode_data_header(input) {
                    Ok(DataHeaderDecoded::NeedMore(_)) => {
                        self.rx.extend_from_slice(input);
                        return;
                    }
                    Ok(DataHeaderDecoded::Header(h)) => {
                        let (head, rest) = input.split_at(h.data_offset);
                        self.begin_data(h, head);
                        input = rest;
                    }
                    Ok(DataHeaderDecoded::NotData) => match self.decoder.decode(input) {
                        Ok(Decoded::NeedMore(_)) => {
                            self.rx.extend_from_slice(input);
                            return;
                        }
                        Ok(Decoded::Pdu { pdu, consumed }) => {
                            if let Err(e) = self.handle_pdu(now, pdu) {
                                self.pdu_error(e, &input[..consumed]);
                            }
                            input = &input[consumed..];
                        }
                        Err(e) => {
                            self.pdu_error(Error::Protocol(e), input);
                            return;
                        }
                    },
                    Err(e) => {
                        self.pdu_error(Error::Protocol(e), input);
                        return;
                    }
                }
            }
        }
    }

    /// The decoder's `decode_data_header` for a PDU whose type byte names
    /// a data PDU, else `NotData` at once: the caller then runs `decode`,
    /// which checks the common header the same way, so a CapsuleResp or
    /// R2T has its header checked once instead of twice. The outcome is
    /// the decoder's either way: for another type `decode_data_header`
    /// would check the header and return `NotData`, or the very error (or
    /// "need more") `decode` returns from the same check.
    fn decode_data_header(&self, pdu: &[u8]) -> Result<DataHeaderDecoded, ProtoError> {
        match pdu.first() {
            Some(&t) if t != pdu_type::C2H_DATA && t != pdu_type::H2C_DATA => {
                Ok(DataHeaderDecoded::NotData)
            }
            _ => self.decoder.decode_data_header(pdu),
        }
    }

    /// Where the data of the C2HData PDU being received goes next, if
    /// data is still due: the rest of that PDU's data, as the part of the
    /// request's own buffer it belongs in. A driver may receive from the
    /// socket straight into (a prefix of) it, then must call
    /// [`Queue::handle_direct`] with the byte count before any other
    /// `handle_*` call. `None` between data PDUs, once a PDU's data is in
    /// (its digest comes through `handle_bytes`), and once closed.
    pub fn rx_direct(&mut self) -> Option<&mut [u8]> {
        if self.state == QueueState::Closed {
            return None;
        }
        let d = self.rx_data.as_ref().filter(|d| d.left > 0)?;
        let r = self.reqs[d.req].as_mut()?;
        r.buf.bytes_mut().get_mut(d.at..d.at + d.left)
    }

    /// Whether an outstanding read command still expects at least `min`
    /// bytes of C2HData data. A driver that receives into its own buffer
    /// between data PDUs can then ask for less than usual, so that its
    /// receive does not swallow the data of that read: the rest is offered
    /// by [`Queue::rx_direct`] and lands in place instead of being copied
    /// out of the driver's buffer. Looks at every command slot.
    pub fn expects_read_data(&self, min: u32) -> bool {
        self.state != QueueState::Closed
            && self.slots.iter().any(|s| {
                s.piece.is_some_and(|p| {
                    p.dir == DataDirection::ControllerToHost && p.len - p.done >= min
                })
            })
    }

    /// How many bytes a receive into the driver's own buffer should ask
    /// for to end exactly where the next data-bearing PDU's header does,
    /// when the queue is at a PDU boundary (live, no data due, nothing of
    /// a PDU held back): every PDU a host receives once connected
    /// (C2HData, CapsuleResp, R2T, C2HTermReq) has a header of the same
    /// length, plus a header digest where one was negotiated; and right
    /// after a read's last data without the SUCCESS flag, two of them,
    /// since its CapsuleResp usually comes next (a target sends a read's
    /// data and then its response). A C2HData PDU's data then stays in
    /// the socket for [`Queue::rx_direct`], instead of its first bytes
    /// arriving with the header and having to be copied into place, at
    /// one receive per read's headers. `None` anywhere else; a driver
    /// then receives as usual (the queue takes bytes split anywhere, so
    /// a wrong guess only costs a copy).
    pub fn rx_header_len(&self) -> Option<usize> {
        // One length for all four (checked at compile time below).
        const _: () = assert!(
            CAPSULE_RESP_HLEN == DATA_PDU_HLEN
                && R2T_HLEN == DATA_PDU_HLEN
                && TERM_REQ_HLEN == DATA_PDU_HLEN
        );
        if self.state != QueueState::Live || self.rx_data.is_some() || !self.rx.is_empty() {
            return None;
        }
        let digest = if self.encode.header_digest {
            DIGEST_LEN
        } else {
            0
        };
        let one = DATA_PDU_HLEN + digest;
        Some(if self.rx_resp_next { 2 * one } else { one })
    }

    /// The `user_data` of the request [`Queue::rx_direct`] points into, so
    /// a driver can keep that request's buffer alive while a receive into
    /// it is outstanding.
    pub fn rx_direct_user_data(&self) -> Option<u64> {
        if self.state == QueueState::Closed {
            return None;
        }
        let d = self.rx_data.as_ref().filter(|d| d.left > 0)?;
        self.reqs[d.req].as_ref().map(|r| r.user_data)
    }

    /// `n` bytes were received into the start of the slice
    /// [`Queue::rx_direct`] last returned. Ignored once the queue has
    /// closed (the request went back whole to `take_unfinished`) or when
    /// `n` is 0.
    ///
    /// # Panics
    /// If `n` is larger than that slice: the driver broke the contract.
    pub fn handle_direct(&mut self, now: Instant, n: usize) {
        if self.state == QueueState::Closed || n == 0 {
            return;
        }
        let Some(d) = self.rx_data.as_mut() else {
            return;
        };
        assert!(
            n <= d.left,
            "handle_direct: {n} bytes reported, {} were offered",
            d.left
        );
        if d.header.data_digest {
            if let Some(r) = self.reqs[d.req].as_ref() {
                d.crc = crc32c_append(d.crc, &r.buf.bytes()[d.at..d.at + n]);
            }
        }
        d.at += n;
        d.left -= n;
        if d.left == 0 && !d.header.data_digest {
            self.finish_data(now);
        }
    }

    /// The header of a C2HData PDU is in (`head`: its bytes, for a
    /// TermReq): check it against its command as a whole PDU would be,
    /// and get ready for its data.
    fn begin_data(&mut self, h: DataHeader, head: &[u8]) {
        self.rx_resp_next = false;
        match self.accept_c2h(h.pdu_type, h.cccid, h.datao, h.datal, h.last) {
            Ok((slot, piece)) => {
                self.rx_data = Some(RxData {
                    header: h,
                    slot,
                    req: piece.req,
                    at: (piece.offset + h.datao) as usize,
                    left: h.datal as usize,
                    crc: 0,
                    digest: [0; DIGEST_LEN],
                    digest_len: 0,
                });
            }
            Err(e) => self.pdu_error(e, head),
        }
    }

    /// Feed `input` to the data PDU being received: data into the
    /// request's buffer, then the digest. Returns what is left of `input`
    /// after that PDU.
    fn rx_data_bytes<'a>(&mut self, now: Instant, mut input: &'a [u8]) -> &'a [u8] {
        let Some(d) = self.rx_data.as_mut() else {
            return input;
        };
        if d.left > 0 {
            let n = d.left.min(input.len());
            let (data, rest) = input.split_at(n);
            if let Some(r) = self.reqs[d.req].as_mut() {
                r.buf.bytes_mut()[d.at..d.at + n].copy_from_slice(data);
            }
            if d.header.data_digest {
                d.crc = crc32c_append(d.crc, data);
            }
            d.at += n;
            d.left -= n;
            input = rest;
        }
        if d.left == 0 {
            let n = (d.header.trailer_len() - d.digest_len).min(input.len());
            d.digest[d.digest_len..d.digest_len + n].copy_from_slice(&input[..n]);
            d.digest_len += n;
            input = &input[n..];
            if d.digest_len == d.header.trailer_len() {
                self.finish_data(now);
            }
        }
        input
    }

    /// All of the data PDU is in: check the data digest, count the data,
    /// and complete the command if the PDU said SUCCESS.
    fn finish_data(&mut self, now: Instant) {
        let Some(d) = self.rx_data.take() else {
            return;
        };
        if d.header.data_digest {
            let received = u32::from_le_bytes(d.digest);
            if let Err(e) = d.header.check_data_digest(d.crc, received) {
                // Not answered with a TermReq (ProtoError::action): the
                // queue closes and the request is redone whole elsewhere.
                self.pdu_error(Error::Protocol(e), &[]);
                return;
            }
        }
        let slot = d.slot;
        // Nothing else can have touched the slot while its data arrived:
        // the stream carried only that data, and closing drops `rx_data`.
        let Some(mut piece) = self.slots[slot as usize].piece else {
            return;
        };
        piece.done += d.header.datal;
        self.slots[slot as usize].piece = Some(piece);
        self.rx_resp_next = !d.header.success && piece.done == piece.len;
        if d.header.success {
            self.stats.success_shortcuts += 1;
            if let Err(e) = self.complete_piece(now, slot, piece, Status::SUCCESS, 0, 0) {
                self.pdu_error(e, &[]);
            }
        }
    }

    /// The checks a C2HData PDU passes before any of its data is taken:
    /// the command it names is outstanding and reads, and the data is the
    /// next part of its buffer (all of the rest if `last`).
    fn accept_c2h(
        &self,
        t: u8,
        cccid: u16,
        datao: u32,
        datal: u32,
        last: bool,
    ) -> Result<(u16, Piece), Error> {
        if t != pdu_type::C2H_DATA {
            // The decoder admits only controller-to-host types for a host.
            return Err(Self::violation(ProtoError::SequenceError {
                reason: "PDU type a host never receives",
            }));
        }
        if self.state != QueueState::Live && self.state != QueueState::AwaitConnect {
            return Err(Self::violation(ProtoError::SequenceError {
                reason: "C2HData before ICResp",
            }));
        }
        let (slot, piece) = self.lookup(cccid)?;
        if piece.dir != DataDirection::ControllerToHost {
            return Err(Self::violation(ProtoError::SequenceError {
                reason: "C2HData for a command that reads no data",
            }));
        }
        let len = u64::from(datal);
        if u64::from(datao) != u64::from(piece.done) {
            return Err(Self::violation(ProtoError::DataOutOfRange {
                command_id: cccid,
                reason: "C2HData offset is not where the previous data ended",
            }));
        }
        if u64::from(datao) + len > u64::from(piece.len) {
            return Err(Self::violation(ProtoError::DataOutOfRange {
                command_id: cccid,
                reason: "C2HData beyond the command's buffer",
            }));
        }
        if last && u64::from(datao) + len != u64::from(piece.len) {
            return Err(Self::violation(ProtoError::DataOutOfRange {
                command_id: cccid,
                reason: "last C2HData before all data was sent",
            }));
        }
        Ok((slot, piece))
    }

    /// Close on a bad PDU; a protocol violation is answered with an
    /// H2CTermReq naming it (and carrying the offending header).
    fn pdu_error(&mut self, e: Error, offending: &[u8]) {
        let term = match &e {
            Error::Protocol(pe) => pe.termination(),
            _ => None,
        };
        let term = term.map(|t| {
            let mut b = Vec::new();
            let _ = Pdu::term_req(Role::Host, TermReq::for_error(t, offending))
                .encode(&EncodeConfig::default(), &mut b);
            b
        });
        self.fail(e, term);
    }

    fn violation(e: ProtoError) -> Error {
        Error::Protocol(e)
    }

    fn handle_pdu(&mut self, now: Instant, pdu: Pdu<'_>) -> Result<(), Error> {
        self.rx_resp_next = false;
        match pdu {
            Pdu::IcResp(resp) => {
                if self.state != QueueState::AwaitIcResp {
                    return Err(Self::violation(ProtoError::SequenceError {
                        reason: "ICResp after initialization",
                    }));
                }
                let n = Negotiated::new(&self.ic_req, &resp).map_err(Self::violation)?;
                self.decoder.set_digests(n.header_digest, n.data_digest);
                self.decoder.set_rx_pda(n.hpda);
                self.encode = n.encode_config(Role::Host);
                self.maxh2cdata = n.maxh2cdata;
                self.send_connect(now);
                Ok(())
            }
            Pdu::C2HTermReq(t) => Err(Error::TargetTerminated {
                fes: t.fes.0,
                fei: t.fei,
            }),
            Pdu::CapsuleResp(resp) => {
                if self.state == QueueState::AwaitIcResp {
                    return Err(Self::violation(ProtoError::SequenceError {
                        reason: "CapsuleResp before ICResp",
                    }));
                }
                let (slot, piece) = self.lookup(resp.cqe.cid)?;
                if resp.cqe.status.is_success() && piece.dir != DataDirection::None {
                    let complete = piece.in_capsule || piece.done == piece.len;
                    if !complete {
                        return Err(Self::violation(ProtoError::DataOutOfRange {
                            command_id: resp.cqe.cid,
                            reason: "successful completion before all data was transferred",
                        }));
                    }
                }
                self.complete_piece(
                    now,
                    slot,
                    piece,
                    resp.cqe.status,
                    resp.cqe.dw0,
                    resp.cqe.dw1,
                )
            }
            Pdu::R2T(r2t) => {
                if self.state != QueueState::Live {
                    return Err(Self::violation(ProtoError::SequenceError {
                        reason: "R2T before the queue is live",
                    }));
                }
                let (slot, mut piece) = self.lookup(r2t.cccid)?;
                if piece.dir != DataDirection::HostToController || piece.in_capsule {
                    return Err(Self::violation(ProtoError::SequenceError {
                        reason: "R2T for a command with no data to solicit",
                    }));
                }
                if r2t.r2to != piece.done
                    || u64::from(r2t.r2to) + u64::from(r2t.r2tl) > u64::from(piece.len)
                {
                    return Err(Self::violation(ProtoError::DataOutOfRange {
                        command_id: r2t.cccid,
                        reason: "R2T range not the next unsent part of the buffer",
                    }));
                }
                self.stats.r2ts += 1;
                let end = r2t.r2to + r2t.r2tl;
                let mut off = r2t.r2to;
                while off < end {
                    let len = (end - off).min(self.maxh2cdata);
                    self.out.push_back(Out::H2C {
                        slot,
                        uses: self.slots[slot as usize].uses,
                        cid: r2t.cccid,
                        ttag: r2t.ttag,
                        datao: off,
                        len,
                        last: off + len == end,
                    });
                    off += len;
                }
                piece.done = end;
                self.slots[slot as usize].piece = Some(piece);
                Ok(())
            }
            // The decoder admits only controller-to-host types for a host,
            // and handle_bytes takes C2HData by its header (begin_data).
            _ => Err(Self::violation(ProtoError::SequenceError {
                reason: "PDU type a host never receives",
            })),
        }
    }

    /// The outstanding piece a CID names, or a protocol violation.
    fn lookup(&self, cid: u16) -> Result<(u16, Piece), Error> {
        let mask = ((1u32 << self.slot_bits) - 1) as u16;
        let slot = cid & mask;
        let stale = || {
            Self::violation(ProtoError::SequenceError {
                reason: "PDU for a command ID that is not outstanding (stale or duplicate)",
            })
        };
        let s = self.slots.get(slot as usize).ok_or_else(stale)?;
        match s.piece {
            Some(p) if (u32::from(cid) >> self.slot_bits) as u16 == s.generation => Ok((slot, p)),
            _ => Err(stale()),
        }
    }

    fn complete_piece(
        &mut self,
        now: Instant,
        slot: u16,
        piece: Piece,
        status: Status,
        dw0: u32,
        dw1: u32,
    ) -> Result<(), Error> {
        self.slots[slot as usize].piece = None;
        self.free_slots.push(slot);
        let id = piece.req;
        let r = self.reqs[id].as_mut().expect("piece's request exists");
        r.pieces_out -= 1;
        if r.status.is_success() {
            r.status = status;
        }
        r.dw0 = dw0;
        r.dw1 = dw1;
        if !status.is_success() && !r.all_issued {
            // Stop splitting a request that already failed.
            r.all_issued = true;
            self.waiting.retain(|&w| w != id);
        }
        if r.all_issued && r.pieces_out == 0 {
            let r = self.reqs[id].take().expect("exists");
            self.free_reqs.push(id);
            match r.internal {
                Some(Internal::Connect) => {
                    if !r.status.is_success() {
                        let refusal = ConnectRefusal::from_completion(r.status, r.dw0);
                        return Err(Error::ConnectRefused(refusal));
                    }
                    self.cntlid = r.dw0 as u16;
                    let authreq = AuthReq::from_connect_dw0(r.dw0);
                    if authreq.secure_channel_required() {
                        return Err(Error::Unsupported(
                            "secure channel concatenation (Connect AUTHREQ.ASCR)",
                        ));
                    }
                    let qid = self.cfg.qid;
                    match (&self.cfg.auth, authreq.transaction_required()) {
                        (None, true) => return Err(Error::AuthenticationRequired { qid }),
                        // Only the admin queue must prove the controller's
                        // key: an I/O queue's Connect names that controller
                        // (CNTLID), already authenticated, and Linux's nvmet
                        // authenticates only the admin queue since 6.15
                        // ("Do not authenticate I/O queues" in
                        // nvmet_connect_result), as its host expects (it
                        // authenticates a queue only when ATR asks).
                        (Some(cfg), false) if cfg.ctrl_secret.is_some() && qid == 0 => {
                            return Err(Error::ControllerNotAuthenticated { qid })
                        }
                        (Some(cfg), true) => {
                            let tid = NEXT_AUTH_TID.fetch_add(1, Ordering::Relaxed);
                            let mut auth = HostAuth::new(Arc::clone(cfg), qid, tid)
                                .map_err(|source| Error::AuthenticationFailed { qid, source })?;
                            let step = auth.start();
                            self.auth = Some(auth);
                            return self.auth_step(now, step);
                        }
                        _ => {}
                    }
                    self.go_live();
                }
                Some(Internal::AuthSend) => {
                    if !r.status.is_success() {
                        return Err(Error::CommandFailed {
                            what: "Authentication Send",
                            status: r.status,
                        });
                    }
                    if let Some(next) = self.auth_next.take() {
                        return self.auth_next_step(now, next);
                    }
                }
                Some(Internal::AuthReceive) => {
                    if !r.status.is_success() {
                        return Err(Error::CommandFailed {
                            what: "Authentication Receive",
                            status: r.status,
                        });
                    }
                    let ReqBuf::Internal(data) = r.buf else {
                        unreachable!("an Authentication Receive has its own buffer")
                    };
                    let Some(auth) = self.auth.as_mut() else {
                        unreachable!("a Receive belongs to a transaction")
                    };
                    let step = auth.receive(&data);
                    return self.auth_step(now, step);
                }
                Some(Internal::KeepAlive) => {
                    if let Some(k) = self.keep_alive.as_mut() {
                        k.outstanding = false;
                    }
                    if !r.status.is_success() {
                        return Err(Error::KeepAliveFailed(r.status));
                    }
                }
                None => {
                    self.stats.completions += 1;
                    let buf = match r.buf {
                        ReqBuf::User(b) => Some(b),
                        _ => None,
                    };
                    self.events.push_back(Event::Completed(Completion {
                        user_data: r.user_data,
                        status: r.status,
                        dw0: r.dw0,
                        dw1: r.dw1,
                        buf,
                    }));
                }
            }
        }
        self.issue(now);
        Ok(())
    }

    /// The queue is connected (and authenticated, if asked): commands flow.
    fn go_live(&mut self) {
        self.auth = None;
        self.state = QueueState::Live;
        self.events.push_back(Event::Connected {
            cntlid: self.cntlid,
        });
    }

    /// Carries out one step of the DH-HMAC-CHAP transaction: its message
    /// in an Authentication Send, and once that completed, what comes
    /// next (a Receive, Live, or the failure).
    fn auth_step(&mut self, now: Instant, step: HostStep) -> Result<(), Error> {
        let Some(msg) = step.send else {
            return self.auth_next_step(now, step.next);
        };
        self.auth_next = Some(step.next);
        let sqe = AuthenticationSend::dhchap(msg.len() as u32).to_sqe(0);
        self.issue_internal(now, Internal::AuthSend, sqe, msg);
        Ok(())
    }

    fn auth_next_step(&mut self, now: Instant, next: HostNext) -> Result<(), Error> {
        match next {
            HostNext::Receive { al } => {
                // `al` is the protocol crate's fixed 4096, not the peer's.
                let sqe = AuthenticationReceive::dhchap(al).to_sqe(0);
                self.issue_internal(now, Internal::AuthReceive, sqe, vec![0; al as usize]);
                Ok(())
            }
            HostNext::Done(done) => {
                log::debug!(
                    "queue {}: authenticated ({}, {}{})",
                    self.cfg.qid,
                    done.hash,
                    done.dh_group,
                    if done.bidirectional {
                        ", controller authenticated too"
                    } else {
                        ""
                    }
                );
                self.go_live();
                Ok(())
            }
            HostNext::Failed(source) => Err(Error::AuthenticationFailed {
                qid: self.cfg.qid,
                source,
            }),
        }
    }

    /// Issues one internal command carrying `data` (to send, or the buffer
    /// to receive into) ahead of any user request, which keeps waiting
    /// until the queue is Live (the state is kept: `issue` sends only on a
    /// Live queue, so it is Live just for this command).
    fn issue_internal(&mut self, now: Instant, what: Internal, sqe: Sqe, data: Vec<u8>) {
        let id = self.alloc_req(ReqState {
            user_data: 0,
            command: Command::Raw(sqe),
            total_len: data.len() as u32,
            buf: ReqBuf::Internal(data),
            internal: Some(what),
            seq: 0,
            next_offset: 0,
            pieces_out: 0,
            all_issued: false,
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
        });
        let state = self.state;
        self.state = QueueState::Live;
        self.waiting.push_front(id);
        let rest: VecDeque<usize> = self.waiting.drain(1..).collect();
        self.issue(now);
        self.waiting = rest;
        self.state = state;
    }

    fn send_connect(&mut self, now: Instant) {
        let connect = if self.cfg.qid == 0 {
            Connect::admin(self.cfg.depth, self.cfg.kato_ms)
        } else {
            Connect::io(self.cfg.qid, self.cfg.depth, self.cfg.priority)
        };
        let data = ConnectData {
            host_id: self.cfg.host_id,
            cntlid: self.cfg.cntlid,
            subnqn: self.cfg.subnqn.clone(),
            hostnqn: self.cfg.host_nqn.clone(),
        };
        let data = match data.to_bytes() {
            Ok(d) => d.to_vec(),
            Err(e) => {
                self.fail(
                    Error::BadData {
                        what: "Connect data (NQN too long?)",
                        source: e,
                    },
                    None,
                );
                return;
            }
        };
        // Issue just the Connect: user requests wait for its answer.
        self.state = QueueState::AwaitConnect;
        self.issue_internal(now, Internal::Connect, connect.to_sqe(0), data);
    }

    fn clear_slots(&mut self) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(p) = s.piece.take() {
                self.free_slots.push(i as u16);
                if let Some(r) = self.reqs[p.req].as_mut() {
                    r.pieces_out = r.pieces_out.saturating_sub(1);
                }
            }
        }
    }

    fn fail(&mut self, err: Error, term: Option<Vec<u8>>) {
        if self.state == QueueState::Closed {
            return;
        }
        log::debug!("queue {}: closed: {err}", self.cfg.qid);
        self.state = QueueState::Closed;
        self.out.clear();
        // Data still due for a request goes nowhere: the request is
        // handed back whole by take_unfinished.
        self.rx_data = None;
        if let Some(t) = term {
            self.out.push_back(Out::Bytes(t));
        }
        self.clear_slots();
        self.events.push_back(Event::Failed(err));
    }

    /// After the queue closed: every user request that did not complete, in
    /// submission order, with its buffer, to resubmit on a new connection or
    /// to fail. A request split into several commands comes back whole (its
    /// completed pieces are redone: reads and writes are idempotent).
    pub fn take_unfinished(&mut self) -> Vec<Request<B>> {
        if self.state != QueueState::Closed {
            return Vec::new();
        }
        self.waiting.clear();
        let mut v: Vec<(u64, Request<B>)> = Vec::new();
        for (id, r) in self.reqs.iter_mut().enumerate() {
            if let Some(r) = r.take() {
                self.free_reqs.push(id);
                if r.internal.is_some() {
                    continue;
                }
                let buf = match r.buf {
                    ReqBuf::User(b) => Some(b),
                    _ => None,
                };
                v.push((
                    r.seq,
                    Request {
                        command: r.command,
                        buf,
                        user_data: r.user_data,
                    },
                ));
            }
        }
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, r)| r).collect()
    }
}

/// Whether [`Queue::poll_transmit_vectored`] leaves `data` of request `r`
/// in place: at least `min_in_place(user_data)` bytes (and at least one),
/// and the caller's buffer (the queue's own requests, Connect, are always
/// copied).
#[inline(always)]
fn leave_in_place<B>(data: &[u8], min_in_place: impl Fn(u64) -> usize, r: &ReqState<B>) -> bool {
    r.internal.is_none() && data.len() >= min_in_place(r.user_data).max(1)
}

/// Append `pdu`'s header to `buf`, hand its `data` to `in_place` at the
/// index it belongs at, then append its data digest, if any; returns the
/// bytes left in place. Encoding can only fail on a PLEN overflow, which
/// the u32 checks at submit exclude.
fn put_in_place<B>(
    pdu: &Pdu<'_>,
    data: &[u8],
    encode: &EncodeConfig,
    r: &ReqState<B>,
    buf: &mut Vec<u8>,
    in_place: &mut impl FnMut(Range<usize>, &[u8], u64),
) -> usize {
    let head = buf.len();
    let Ok(digest) = pdu.encode_head(encode, buf) else {
        return 0;
    };
    in_place(head..buf.len(), data, r.user_data);
    if let Some(d) = digest {
        buf.extend_from_slice(&d);
    }
    data.len()
}
