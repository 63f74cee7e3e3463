//! The queue-core fuzzer's driver, shared by the cargo-fuzz target
//! (`fuzz_targets/queue.rs`) and the bounded in-CI test
//! (`tests/fuzz_queue.rs`).
//!
//! One input is a script for a hostile target: it configures a
//! `Queue<Vec<u8>>`, submits requests, and writes what a target would send
//! (ICResp, Connect and command completions with arbitrary CIDs and
//! status, C2HData with arbitrary offsets, lengths and flags, R2Ts, TermReqs,
//! mutated PDUs, garbage), delivered split anywhere, through
//! `handle_bytes` or the in-place path (`rx_direct`/`handle_direct`), with
//! timeouts and closes in between. Everything the queue sends is decoded
//! as a target would, so the script can name the real CIDs and reach deep
//! states.
//!
//! Checks, after every step:
//! - no panic (the caller sees one);
//! - everything the queue sends decodes, and its H2CData answers an R2T we
//!   sent, inside that R2T's range, with the request's own bytes;
//! - every accepted request comes back exactly once: as a completion, or
//!   from `take_unfinished` after the queue closed (a rejected one at once);
//!   nothing completes after `Event::Failed`;
//! - a request's buffer is only written where its own commands' data goes:
//!   write buffers never change, and every byte of a read buffer is either
//!   untouched or the byte the target sent for that position of that
//!   command (all of them for a successful read);
//! - the queue's heap stays within its documented bounds: a PDU header or a
//!   whole small PDU in its receive buffer, never data; per request
//!   bookkeeping; nothing that grows with the bytes received.

#![allow(dead_code)] // the fuzz target and the test use different parts

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nvmf_initiator::{Command, Event, Queue, QueueConfig, QueueState, Request};
use nvmf_proto::fabrics::{fctype, PriorityClass};
use nvmf_proto::pdu::crc32c;
use nvmf_proto::sqe::{admin_opcode, io_opcode, DataDirection};
use nvmf_proto::{
    C2HData, CapsuleResp, Cqe, Decoded, DecoderConfig, EncodeConfig, FatalErrorStatus, IcReq,
    IcResp, Negotiated, Pdu, PduDecoder, Role, SglKind, Sqe, Status, TermReq, R2T,
};

#[path = "../../tests/fuzz/script.rs"]
#[macro_use]
pub mod script;
use script::{tracing, Input};

// ---- heap accounting (this thread only) ---------------------------------

/// Counts the heap bytes the current thread holds (allocated minus freed
/// by it), so a step's cost can be measured around one call.
pub struct ThreadCountingAlloc;

thread_local! {
    static THREAD_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn account(delta: isize) {
    let _ = THREAD_BYTES.try_with(|b| b.set(b.get() + delta));
}

/// Heap bytes the current thread allocated and has not freed.
pub fn thread_bytes() -> isize {
    THREAD_BYTES.try_with(|b| b.get()).unwrap_or(0)
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// counter is only arithmetic on the side.
unsafe impl GlobalAlloc for ThreadCountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            account(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            account(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        account(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            account(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: ThreadCountingAlloc = ThreadCountingAlloc;

// ---- the model ------------------------------------------------------------

/// What a script found wrong.
pub type Violation = String;

/// Byte `x` of the data the fake target sends for command `cid`.
fn c2h_byte(cid: u16, x: u32) -> u8 {
    let h = (u32::from(cid) ^ 0x5bd1_e995)
        .wrapping_mul(0x9E37_79B1)
        .wrapping_add(x.wrapping_mul(0x85EB_CA6B));
    (h ^ h >> 15) as u8
}

/// What a read buffer holds where nothing was written.
fn canary(user: u64, pos: usize) -> u8 {
    (user as u8).wrapping_mul(37) ^ (pos as u8).wrapping_mul(101) ^ 0xA5
}

/// What a write buffer holds.
fn write_byte(user: u64, pos: usize) -> u8 {
    (user as u8).wrapping_mul(13) ^ (pos as u8).wrapping_mul(7) ^ 0x3C
}

/// Namespace IDs carry the request's `user_data`, so every capsule names
/// its request.
const NSID_BASE: u32 = 0x1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
    WriteZeroes,
    /// A raw admin-style command (Identify-like read, Set Features-like
    /// write, or no data).
    Raw(DataDirection),
}

#[derive(Debug)]
struct ReqModel {
    kind: Kind,
    slba: u64,
    block_size: u32,
    len: usize,
    /// Commands sent for it: (cid, offset in the buffer, length).
    pieces: Vec<(u16, u32, u32)>,
}

/// A command as the fake target saw it arrive.
#[derive(Debug, Clone, Copy)]
struct Cmd {
    /// `None`: the queue's own (Connect, Keep Alive).
    user: Option<u64>,
    fabrics_connect: bool,
    dir: DataDirection,
    in_capsule: bool,
    offset: u32,
    len: u32,
    /// C2H bytes sent so far (reads), bytes solicited so far (writes).
    done: u32,
    /// Answered with a CQE or the SUCCESS flag by the script.
    answered: bool,
}

/// Counts over a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct CaseStats {
    /// Scripts run.
    pub cases: u64,
    /// Steps executed.
    pub ops: u64,
    /// Requests accepted by `submit`.
    pub accepted: u64,
    /// Requests `submit` handed back.
    pub rejected: u64,
    /// Completions with success status.
    pub completed_ok: u64,
    /// Completions with an error status.
    pub completed_err: u64,
    /// Requests handed back by `take_unfinished`.
    pub unfinished: u64,
    /// Queues that became live.
    pub connected: u64,
    /// Queues that failed.
    pub failed: u64,
    /// Capsules the queue sent.
    pub capsules: u64,
    /// H2CData PDUs the queue sent.
    pub h2c: u64,
    /// C2HData PDUs the script sent.
    pub c2h: u64,
    /// R2Ts the script sent.
    pub r2ts: u64,
    /// Bytes delivered through `handle_direct`.
    pub direct_bytes: u64,
    /// Bytes delivered through `handle_bytes`.
    pub bytes_delivered: u64,
    /// Largest heap the queue held beyond its initial footprint.
    pub queue_heap_max: u64,
}

impl CaseStats {
    /// Adds `o` into `self` (maxima take the maximum).
    pub fn add(&mut self, o: &CaseStats) {
        self.cases += o.cases;
        self.ops += o.ops;
        self.accepted += o.accepted;
        self.rejected += o.rejected;
        self.completed_ok += o.completed_ok;
        self.completed_err += o.completed_err;
        self.unfinished += o.unfinished;
        self.connected += o.connected;
        self.failed += o.failed;
        self.capsules += o.capsules;
        self.h2c += o.h2c;
        self.c2h += o.c2h;
        self.r2ts += o.r2ts;
        self.direct_bytes += o.direct_bytes;
        self.bytes_delivered += o.bytes_delivered;
        self.queue_heap_max = self.queue_heap_max.max(o.queue_heap_max);
    }
}

/// Heap the queue may hold beyond its footprint after `Queue::new`: a fixed
/// allowance (receive buffer: at most one PDU header or small PDU; queued
/// PDUs to send), per request accepted and not yet finished, and per 4 KiB
/// of write data (H2CData entries queued after an R2T). Nothing for bytes
/// received.
const QUEUE_HEAP_FIXED_BYTES: isize = 32 * 1024;
const QUEUE_HEAP_PER_REQUEST_BYTES: isize = 1024;
const QUEUE_HEAP_PER_WRITE_PAGE_BYTES: isize = 256;
const MAX_OPS: usize = 160;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Submit,
    IcResp,
    AnswerConnect,
    Serve,
    Complete,
    C2h,
    R2t,
    Deliver,
    Timeout,
    KeepAlive,
    TermReq,
    Garbage,
    Mutated,
    Misc,
    Repeat,
}

/// Steps by weight (out of 256): a target that mostly behaves, with
/// lies, damage and timeouts now and then.
const OP_WEIGHTS: [(Op, u8); 15] = [
    (Op::Submit, 50),
    (Op::IcResp, 1),
    (Op::AnswerConnect, 2),
    (Op::Serve, 53),
    (Op::Complete, 20),
    (Op::C2h, 20),
    (Op::R2t, 14),
    (Op::Deliver, 50),
    (Op::Timeout, 10),
    (Op::KeepAlive, 5),
    (Op::TermReq, 2),
    (Op::Garbage, 3),
    (Op::Mutated, 6),
    (Op::Misc, 6),
    (Op::Repeat, 14),
];

fn pick_op(b: u8) -> Op {
    let mut left = u32::from(b);
    for (op, w) in OP_WEIGHTS {
        if left < u32::from(w) {
            return op;
        }
        left -= u32::from(w);
    }
    Op::Deliver
}
const MAX_REQUESTS: u64 = 64;

struct Harness {
    q: Queue<Vec<u8>>,
    now: Instant,
    /// The host's ICReq, once seen.
    ic_req: Option<IcReq>,
    /// Our ICResp, once the queue took it.
    negotiated: Option<Negotiated>,
    /// What we send as the target.
    enc: EncodeConfig,
    /// Decodes what the queue sends.
    host_out: PduDecoder,
    host_out_buf: Vec<u8>,
    /// Bytes we (the target) sent, not yet delivered.
    wire: Vec<u8>,
    cmds: BTreeMap<u16, Cmd>,
    /// R2T windows sent per CID: (ttag, start, end, where the R2T ends in
    /// the stream we send). An R2T still on the wire when the queue reuses
    /// its CID applies to the new command.
    r2t_windows: BTreeMap<u16, Vec<(u16, u32, u32, u64)>>,
    /// Bytes of `wire` handed to the queue so far.
    delivered: u64,
    /// Where the chunk being handed over starts: a capsule the queue sends
    /// meanwhile may come before any PDU of the chunk.
    chunk_start: u64,
    /// Where each answer (CQE, SUCCESS flag) we sent for a CID ends in our
    /// stream: one still on the wire when the CID is reused answers the
    /// new command.
    answers: BTreeMap<u16, Vec<u64>>,
    /// CIDs in the order they were first seen (for picking).
    cid_order: Vec<u16>,
    reqs: BTreeMap<u64, ReqModel>,
    /// Accepted and not yet back.
    open: BTreeSet<u64>,
    back: BTreeSet<u64>,
    next_user: u64,
    connected: bool,
    failed: bool,
    /// Garbage or mutated PDUs were sent: data may have landed where a
    /// lying header said, so read contents are not checked.
    chaos: bool,
    /// Heap the queue holds beyond its start, as measured around calls.
    queue_heap: isize,
    write_bytes_submitted: usize,
    tx_buf: Vec<u8>,
    stats: CaseStats,
    /// The step being run (for traces).
    last_op: Option<Op>,
}

/// Runs one script; `Err` describes the first violation.
pub fn run(input: &[u8]) -> Result<CaseStats, Violation> {
    let mut inp = Input::new(input);
    let depth = inp.pick(&[1u16, 2, 3, 4, 8, 32, 128, 32768, 32769, 65535]);
    let qid = inp.pick(&[0u16, 1, 1]);
    let digests = inp.u8();
    let mut cfg = QueueConfig::admin(
        "nqn.2026-01.io.fuzz:host",
        [9; 16],
        "nqn.2026-01.io.fuzz:subsystem",
        inp.pick(&[0, 5000]),
    );
    if qid != 0 {
        cfg = QueueConfig::io(&cfg, qid, 1, depth);
    }
    cfg.depth = depth;
    cfg.header_digest = digests & 1 != 0;
    cfg.data_digest = digests & 2 != 0;
    cfg.max_transfer_bytes = inp.pick(&[4096, 8192, 65536]);
    cfg.in_capsule_bytes = inp.pick(&[0, 4096, 8192]);
    cfg.command_timeout = Duration::from_secs(inp.pick(&[1, 30]));
    cfg.priority = PriorityClass::from_bits(inp.u8());

    let now = Instant::now();
    let before = thread_bytes();
    let q = Queue::new(cfg, now);
    let _ = before;
    let mut h = Harness {
        q,
        now,
        ic_req: None,
        negotiated: None,
        enc: EncodeConfig::default(),
        host_out: PduDecoder::new(DecoderConfig {
            max_data_len: 1 << 20,
            ..DecoderConfig::new(Role::Controller)
        }),
        host_out_buf: Vec::new(),
        wire: Vec::new(),
        cmds: BTreeMap::new(),
        r2t_windows: BTreeMap::new(),
        delivered: 0,
        chunk_start: 0,
        answers: BTreeMap::new(),
        cid_order: Vec::new(),
        reqs: BTreeMap::new(),
        open: BTreeSet::new(),
        back: BTreeSet::new(),
        next_user: 1,
        connected: false,
        failed: false,
        chaos: false,
        queue_heap: 0,
        write_bytes_submitted: 0,
        tx_buf: Vec::with_capacity(1 << 20),
        last_op: None,
        stats: CaseStats {
            cases: 1,
            ..Default::default()
        },
    };
    h.after_step()?;
    h.script(&mut inp)?;
    h.finish(&mut inp)?;
    Ok(h.stats)
}

impl Harness {
    /// Runs `f` on the queue and charges the heap it kept to the queue.
    fn measured<R>(&mut self, f: impl FnOnce(&mut Queue<Vec<u8>>, Instant) -> R) -> R {
        let before = thread_bytes();
        let r = f(&mut self.q, self.now);
        self.queue_heap += thread_bytes() - before;
        r
    }

    fn check_heap(&mut self) -> Result<(), Violation> {
        let allowed = QUEUE_HEAP_FIXED_BYTES
            + QUEUE_HEAP_PER_REQUEST_BYTES * (self.stats.accepted as isize + 2)
            + QUEUE_HEAP_PER_WRITE_PAGE_BYTES * (self.write_bytes_submitted as isize / 4096 + 1);
        self.stats.queue_heap_max = self.stats.queue_heap_max.max(self.queue_heap.max(0) as u64);
        if self.queue_heap > allowed {
            return Err(format!(
                "the queue holds {} bytes of heap beyond its start (allowed {allowed}: {} requests \
                 accepted, {} bytes of writes, {} bytes delivered)",
                self.queue_heap,
                self.stats.accepted,
                self.write_bytes_submitted,
                self.stats.bytes_delivered + self.stats.direct_bytes
            ));
        }
        Ok(())
    }

    /// After every call: collect what the queue sends and reports.
    fn after_step(&mut self) -> Result<(), Violation> {
        loop {
            let limit = 64 * 1024;
            let cap_before = self.tx_buf.capacity();
            let mut buf = std::mem::take(&mut self.tx_buf);
            let n = self.measured(|q, _| q.poll_transmit(&mut buf, limit));
            // Growth of our own buffer is not the queue's.
            self.queue_heap -= buf.capacity() as isize - cap_before as isize;
            if n > 0 {
                self.host_out_buf.extend_from_slice(&buf);
            }
            buf.clear();
            self.tx_buf = buf;
            if n == 0 {
                break;
            }
        }
        self.decode_host_output()?;
        while let Some(ev) = self.measured(|q, _| q.poll_event()) {
            self.event(ev)?;
        }
        self.check_heap()
    }

    fn decode_host_output(&mut self) -> Result<(), Violation> {
        let mut start = 0;
        let result = loop {
            match self.host_out.decode(&self.host_out_buf[start..]) {
                Ok(Decoded::NeedMore(_)) => break Ok(()),
                Ok(Decoded::Pdu { pdu, consumed }) => {
                    let pdu = pdu.into_owned();
                    start += consumed;
                    if let Err(v) = self.host_pdu(pdu) {
                        break Err(v);
                    }
                }
                Err(e) => {
                    break Err(format!(
                        "the queue sent bytes a target cannot decode: {e} ({:02x?})",
                        &self.host_out_buf[start..self.host_out_buf.len().min(start + 24)]
                    ))
                }
            }
        };
        self.host_out_buf.drain(..start);
        result
    }

    fn host_pdu(&mut self, pdu: Pdu<'static>) -> Result<(), Violation> {
        match pdu {
            Pdu::IcReq(r) => {
                if self.ic_req.is_some() {
                    return Err("the queue sent a second ICReq".into());
                }
                self.ic_req = Some(r);
            }
            Pdu::CapsuleCmd(c) => {
                self.stats.capsules += 1;
                self.capsule(c.sqe, &c.data)?;
            }
            Pdu::H2CData(d) => {
                self.stats.h2c += 1;
                let Some(cmd) = self.cmds.get(&d.cccid).copied() else {
                    return Err(format!("H2CData for CID {:#x} it never sent", d.cccid));
                };
                let datal = d.data.len() as u32;
                let windows = self.r2t_windows.get(&d.cccid).cloned().unwrap_or_default();
                let inside = windows.iter().any(|&(ttag, start, end, _)| {
                    d.ttag == ttag && d.datao >= start && d.datao.saturating_add(datal) <= end
                });
                // A mutated R2T the queue took may have asked for anything.
                if !inside && !self.chaos {
                    return Err(format!(
                        "H2CData for CID {:#x} (ttag {}, {}+{datal}) outside every R2T sent for it \
                         since its capsule: {windows:?}",
                        d.cccid, d.ttag, d.datao
                    ));
                }
                let maxh2c = self.negotiated.map_or(4096, |n| n.maxh2cdata);
                if datal > maxh2c {
                    return Err(format!(
                        "H2CData of {datal} bytes above MAXH2CDATA {maxh2c}"
                    ));
                }
                if let Some(user) = cmd.user {
                    for (i, &b) in d.data.iter().enumerate() {
                        let pos = (cmd.offset + d.datao) as usize + i;
                        if b != write_byte(user, pos) {
                            return Err(format!(
                                "H2CData for request {user} carries a wrong byte at {pos}"
                            ));
                        }
                    }
                }
            }
            Pdu::H2CTermReq(_) => {}
            other => return Err(format!("the queue sent a {:#04x} PDU", other.pdu_type())),
        }
        Ok(())
    }

    fn capsule(&mut self, sqe: Sqe, data: &[u8]) -> Result<(), Violation> {
        trace!(
            "  -> capsule cid {:#x} opc {:#x} nsid {:#x} {:?}",
            sqe.cid,
            sqe.opcode,
            sqe.nsid,
            sqe.dptr.kind()
        );
        let fabrics_connect =
            sqe.opcode == admin_opcode::FABRICS && sqe.fctype() == fctype::CONNECT;
        let user =
            (sqe.nsid >= NSID_BASE && !sqe.is_fabrics() && sqe.opcode != admin_opcode::KEEP_ALIVE)
                .then(|| u64::from(sqe.nsid - NSID_BASE));
        if let Some(prev) = self.cmds.get(&sqe.cid) {
            // (Garbage can complete a command behind our back.)
            if !prev.answered && !self.chaos {
                // The queue reuses a CID only after its command completed,
                // which needs an answer from us.
                return Err(format!("CID {:#x} reused while outstanding", sqe.cid));
            }
        }
        let (len, in_capsule) = match sqe.dptr.kind() {
            SglKind::InCapsule { length, .. } => (length, true),
            SglKind::Transport { length } => (length, false),
            SglKind::Unsupported { .. } => (0, false),
        };
        let dir = if len == 0 {
            DataDirection::None
        } else {
            sqe.data_direction()
        };
        let mut offset = 0;
        if let Some(u) = user {
            let Some(r) = self.reqs.get_mut(&u) else {
                return Err(format!("a capsule for request {u}, never submitted"));
            };
            if matches!(r.kind, Kind::Read | Kind::Write) {
                let lba = u64::from(sqe.cdw10) | u64::from(sqe.cdw11) << 32;
                let Some(blocks) = lba.checked_sub(r.slba) else {
                    return Err(format!(
                        "a command for request {u} starts before its first LBA"
                    ));
                };
                offset = (blocks * u64::from(r.block_size)) as u32;
            }
            if offset as usize + len as usize > r.len {
                return Err(format!(
                    "a command for request {u} covers {offset}+{len}, past its {} bytes",
                    r.len
                ));
            }
            r.pieces.push((sqe.cid, offset, len));
            if in_capsule {
                for (i, &b) in data.iter().enumerate() {
                    if b != write_byte(u, offset as usize + i) {
                        return Err(format!("in-capsule data of request {u} is wrong at {i}"));
                    }
                }
            }
        }
        if in_capsule && data.len() != len as usize && !fabrics_connect {
            return Err(format!(
                "in-capsule SGL of {len} bytes with {} bytes of data",
                data.len()
            ));
        }
        if !self.cmds.contains_key(&sqe.cid) {
            self.cid_order.push(sqe.cid);
        }
        // R2Ts delivered before this capsule were for the CID's previous
        // command; those still on the wire (or in the chunk being handed
        // over) are for this one.
        let delivered = self.chunk_start;
        if let Some(w) = self.r2t_windows.get_mut(&sqe.cid) {
            w.retain(|&(.., at)| at > delivered);
        }
        let answered = self.answers.get_mut(&sqe.cid).is_some_and(|a| {
            a.retain(|&at| at > delivered);
            !a.is_empty()
        });
        self.cmds.insert(
            sqe.cid,
            Cmd {
                user,
                fabrics_connect,
                dir,
                in_capsule,
                offset,
                len,
                done: 0,
                answered,
            },
        );
        Ok(())
    }

    fn event(&mut self, ev: Event<Vec<u8>>) -> Result<(), Violation> {
        match ev {
            Event::Connected { .. } => {
                if self.connected {
                    return Err("Connected twice".into());
                }
                self.connected = true;
                self.stats.connected += 1;
            }
            Event::Failed(e) => {
                trace!("queue failed: {e} (last step {:?})", self.last_op);
                if self.failed {
                    return Err("Failed twice".into());
                }
                self.failed = true;
                self.stats.failed += 1;
            }
            Event::Completed(c) => {
                if self.failed {
                    return Err(format!("request {} completed after Failed", c.user_data));
                }
                if c.status.is_success() {
                    self.stats.completed_ok += 1;
                } else {
                    self.stats.completed_err += 1;
                }
                self.returned(c.user_data, c.buf.as_deref(), c.status.is_success())?;
            }
        }
        Ok(())
    }

    /// A request came back (completed, or unfinished after a close).
    fn returned(&mut self, user: u64, buf: Option<&[u8]>, success: bool) -> Result<(), Violation> {
        if !self.open.remove(&user) {
            return Err(if self.back.contains(&user) {
                format!("request {user} came back twice")
            } else {
                format!("request {user} came back but was never accepted")
            });
        }
        self.back.insert(user);
        let r = &self.reqs[&user];
        let Some(buf) = buf else {
            if r.len != 0 {
                return Err(format!("request {user} came back without its buffer"));
            }
            return Ok(());
        };
        if buf.len() != r.len {
            return Err(format!("request {user}'s buffer changed length"));
        }
        let reads = matches!(
            r.kind,
            Kind::Read | Kind::Raw(DataDirection::ControllerToHost)
        );
        if !reads {
            if buf
                .iter()
                .enumerate()
                .any(|(i, &b)| b != write_byte(user, i))
            {
                return Err(format!("write request {user}'s buffer was modified"));
            }
            return Ok(());
        }
        if self.chaos {
            return Ok(());
        }
        // Which command's data belongs at each position (a later command
        // for the same bytes wins: there is none within one queue).
        let mut owner: Vec<Option<(u16, u32)>> = vec![None; buf.len()];
        for &(cid, off, len) in &r.pieces {
            let end = (off as usize + len as usize).min(buf.len());
            for slot in owner.iter_mut().take(end).skip(off as usize) {
                *slot = Some((cid, off));
            }
        }
        for (pos, (&b, owner)) in buf.iter().zip(&owner).enumerate() {
            let sent = owner.map(|(cid, off)| c2h_byte(cid, pos as u32 - off));
            let ok = if success {
                sent == Some(b)
            } else {
                b == canary(user, pos) || sent == Some(b)
            };
            if !ok {
                return Err(format!(
                    "read request {user} (success {success}) holds {b:#04x} at {pos}, \
                     which no C2HData put there (pieces {:?})",
                    r.pieces
                ));
            }
        }
        Ok(())
    }

    // ---- the script -------------------------------------------------------

    fn script(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let mut last = Op::Deliver;
        let mut ops = 0;
        // Most scripts start well: ICResp and a successful Connect.
        if inp.chance(200) {
            self.icresp(inp, true)?;
            self.deliver_all(inp)?;
            self.answer_connect(inp, true)?;
            self.deliver_all(inp)?;
        }
        while !inp.is_empty() && ops < MAX_OPS {
            let mut code = pick_op(inp.u8());
            let times = if code == Op::Repeat {
                2 + inp.below(15)
            } else {
                1
            };
            if code == Op::Repeat {
                code = last;
            }
            for _ in 0..times {
                self.op(code, inp)?;
                self.stats.ops += 1;
            }
            last = code;
            ops += 1;
            if self.q.state() == QueueState::Closed {
                // Nothing more can happen but the hand-back in `finish`.
                break;
            }
        }
        Ok(())
    }

    fn op(&mut self, code: Op, inp: &mut Input<'_>) -> Result<(), Violation> {
        trace!("op {code:?}");
        if !matches!(code, Op::Deliver) {
            self.last_op = Some(code);
        }
        match code {
            Op::Submit => self.submit(inp)?,
            Op::IcResp => self.icresp(inp, false)?,
            Op::AnswerConnect => self.answer_connect(inp, false)?,
            Op::Serve => self.serve(inp)?,
            Op::Complete => self.complete(inp)?,
            Op::C2h => self.c2h(inp)?,
            Op::R2t => self.r2t(inp)?,
            Op::Deliver => self.deliver(inp)?,
            Op::Timeout => self.timeout(inp)?,
            Op::KeepAlive => {
                let (period, timeout) = (inp.pick(&[1u64, 10]), inp.pick(&[2u64, 20]));
                self.measured(|q, now| {
                    q.start_keep_alive(
                        now,
                        Duration::from_secs(period),
                        Duration::from_secs(timeout),
                    )
                });
                self.after_step()?;
            }
            Op::TermReq => self.term_req(inp)?,
            Op::Garbage => self.garbage(inp)?,
            Op::Mutated => self.mutated(inp)?,
            Op::Misc | Op::Repeat => match inp.u8() % 16 {
                0 => {
                    self.measured(|q, _| q.handle_closed());
                    self.after_step()?;
                }
                1 => {
                    self.measured(|q, _| {
                        q.handle_io_error(std::io::ErrorKind::ConnectionReset.into())
                    });
                    self.after_step()?;
                }
                2 => {
                    self.measured(|q, _| q.close());
                    self.after_step()?;
                }
                3..=9 => {
                    let (mdts, icd) = (inp.pick(&[4096, 8192, 65536]), inp.pick(&[0, 4096, 8192]));
                    self.measured(|q, _| q.set_limits(mdts, icd));
                    self.after_step()?;
                }
                _ => self.take_unfinished()?,
            },
        }
        Ok(())
    }

    /// Answers every outstanding command as a good target would, as far
    /// as it can now: data for reads, R2Ts for writes, completions for
    /// what has all its data.
    fn serve(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let chunk = inp.pick(&[4096u32, 512, 65536, 1 << 20]);
        let use_success_flag = inp.chance(64);
        let credit = inp.chance(64).then(|| inp.u32() >> 1);
        let deliver = inp.chance(160);
        let direct = inp.chance(128);
        let live: Vec<u16> = self
            .cid_order
            .iter()
            .copied()
            .filter(|cid| !self.cmds[cid].answered)
            .collect();
        for cid in live {
            let c = self.cmds[&cid];
            match c.dir {
                DataDirection::ControllerToHost => {
                    let mut done = c.done;
                    while done < c.len {
                        let n = chunk.min(c.len - done);
                        let last = done + n == c.len;
                        let success = last && use_success_flag;
                        let data: Vec<u8> = (0..n).map(|i| c2h_byte(cid, done + i)).collect();
                        let _ = Pdu::C2HData(C2HData {
                            cccid: cid,
                            datao: done,
                            last,
                            success,
                            data: data.into(),
                        })
                        .encode(&self.enc, &mut self.wire);
                        self.stats.c2h += 1;
                        done += n;
                    }
                    let cmd = self.cmds.get_mut(&cid).expect("live");
                    cmd.done = done;
                    if use_success_flag && c.len > 0 {
                        cmd.answered = true;
                        self.sent_answer(cid);
                        continue;
                    }
                }
                DataDirection::HostToController if !c.in_capsule && c.done < c.len => {
                    let ttag = cid ^ 0x5A5A;
                    let _ = Pdu::R2T(R2T {
                        cccid: cid,
                        ttag,
                        r2to: c.done,
                        r2tl: c.len - c.done,
                    })
                    .encode(&self.enc, &mut self.wire);
                    self.stats.r2ts += 1;
                    let at = self.delivered + self.wire.len() as u64;
                    self.r2t_windows
                        .entry(cid)
                        .or_default()
                        .push((ttag, c.done, c.len, at));
                    self.cmds.get_mut(&cid).expect("live").done = c.len;
                    // Completed on a later serve, once its data is sent.
                    continue;
                }
                _ => {}
            }
            let mut cqe = Cqe::success(cid).with_dw0(if c.fabrics_connect { 7 } else { 0 });
            if let Some(credit) = credit {
                cqe.dw1 = 0x8000_0000 | credit;
            }
            self.send_cqe(cqe);
        }
        if deliver {
            self.deliver_n(usize::MAX, direct)?;
        }
        Ok(())
    }

    fn submit(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let user = self.next_user;
        let kind = match inp.u8() % 8 {
            0..=2 => Kind::Read,
            3..=5 => Kind::Write,
            6 => inp.pick(&[Kind::Flush, Kind::WriteZeroes]),
            _ => Kind::Raw(inp.pick(&[
                DataDirection::ControllerToHost,
                DataDirection::HostToController,
                DataDirection::None,
            ])),
        };
        let block_size = inp.pick(&[512u32, 4096, 512, 3]);
        let blocks = inp.pick(&[1usize, 1, 2, 8, 16, 33]);
        let slba = inp.pick(&[0u64, 100, u64::MAX - 8]);
        let mut len = match kind {
            Kind::Read | Kind::Write => blocks * block_size as usize,
            Kind::Raw(DataDirection::None) | Kind::Flush | Kind::WriteZeroes => 0,
            Kind::Raw(_) => inp.pick(&[4096, 512, 16, 8192, 12288]),
        };
        if inp.chance(8) {
            len += 1; // not a multiple of the block size
        }
        if self.stats.accepted >= MAX_REQUESTS {
            return Ok(());
        }
        let nsid = NSID_BASE + user as u32;
        let command = match kind {
            Kind::Read => Command::Read {
                nsid,
                slba,
                block_size,
            },
            Kind::Write => Command::Write {
                nsid,
                slba,
                block_size,
                fua: inp.chance(64),
            },
            Kind::Flush => Command::Flush { nsid },
            Kind::WriteZeroes => Command::WriteZeroes {
                nsid,
                slba,
                blocks: inp.pick(&[1, 8, 0, 65537]),
                deallocate: inp.chance(128),
            },
            Kind::Raw(dir) => {
                let opcode = match dir {
                    DataDirection::ControllerToHost => admin_opcode::IDENTIFY,
                    DataDirection::HostToController => admin_opcode::SET_FEATURES,
                    _ => inp.pick(&[admin_opcode::KEEP_ALIVE, io_opcode::FLUSH, 0x80]),
                };
                let mut sqe = Sqe::new(opcode, 0);
                sqe.nsid = nsid;
                sqe.cdw10 = inp.u32();
                Command::Raw(sqe)
            }
        };
        let reads = matches!(
            kind,
            Kind::Read | Kind::Raw(DataDirection::ControllerToHost)
        );
        let buf: Option<Vec<u8>> = (len > 0 || inp.chance(16)).then(|| {
            (0..len)
                .map(|i| {
                    if reads {
                        canary(user, i)
                    } else {
                        write_byte(user, i)
                    }
                })
                .collect()
        });
        let len = buf.as_ref().map_or(0, Vec::len);
        self.next_user += 1;
        self.reqs.insert(
            user,
            ReqModel {
                kind,
                slba,
                block_size,
                len,
                pieces: Vec::new(),
            },
        );
        let request = Request {
            command,
            buf,
            user_data: user,
        };
        let r = self.measured(|q, now| q.submit(now, request));
        match r {
            Ok(()) => {
                self.open.insert(user);
                self.stats.accepted += 1;
                if !reads {
                    self.write_bytes_submitted += len;
                }
            }
            Err(rejected) => {
                self.stats.rejected += 1;
                let size = std::mem::size_of_val(&*rejected) as isize;
                let back = rejected.request;
                if back.user_data != user || back.buf.as_ref().map_or(0, Vec::len) != len {
                    return Err(format!(
                        "submit handed back something else for request {user}"
                    ));
                }
                // The box it came in was the queue's allocation; it is gone.
                self.queue_heap -= size;
            }
        }
        self.after_step()
    }

    /// Our ICResp: mirrors the digests asked for (or not), with a PDA and
    /// MAXH2CDATA from the script.
    fn icresp(&mut self, inp: &mut Input<'_>, good: bool) -> Result<(), Violation> {
        let req = self.ic_req.unwrap_or_default();
        let v = inp.u8();
        let resp = IcResp {
            cpda: if good || v & 1 == 0 { 0 } else { inp.u8() % 4 },
            header_digest: if good || v & 2 == 0 {
                req.header_digest
            } else {
                !req.header_digest
            },
            data_digest: if good || v & 4 == 0 {
                req.data_digest
            } else {
                !req.data_digest
            },
            maxh2cdata: inp.pick(&[4096, 8192, 131072, 4100]),
        };
        let raw = Pdu::IcResp(resp)
            .to_vec(&EncodeConfig::default())
            .unwrap_or_default();
        self.wire.extend_from_slice(&raw);
        if self.negotiated.is_none() {
            if let Ok(n) = Negotiated::new(&req, &resp) {
                // Takes effect for our PDUs after this one; the queue's
                // output is decoded with it once the queue took the ICResp.
                self.negotiated = Some(n);
                self.enc = n.encode_config(Role::Controller);
            }
        }
        Ok(())
    }

    fn answer_connect(&mut self, inp: &mut Input<'_>, good: bool) -> Result<(), Violation> {
        let connect = self
            .cmds
            .iter()
            .find(|(_, c)| c.fabrics_connect)
            .map(|(&cid, c)| (cid, c.answered));
        let v = inp.u8();
        let made_up = inp.u16();
        let cid = match connect {
            Some((cid, false)) => cid,
            // Answered already: a duplicate now and then, else nothing.
            Some((cid, true)) if !good && v % 16 == 0 => cid,
            None if !good && v % 16 == 1 => made_up,
            _ => return Ok(()),
        };
        let status = if good || v & 0x10 == 0 {
            Status::SUCCESS
        } else {
            Status::from_field(inp.u16() & 0xFFFE)
        };
        let dw0 = if good || v & 0x20 == 0 { 7 } else { inp.u32() };
        self.send_cqe(Cqe::new(cid, status).with_dw0(dw0));
        Ok(())
    }

    fn send_cqe(&mut self, cqe: Cqe) {
        trace!("  <- CQE cid {:#x} {:?}", cqe.cid, cqe.status);
        if let Some(c) = self.cmds.get_mut(&cqe.cid) {
            c.answered = true;
        }
        let _ = Pdu::CapsuleResp(CapsuleResp { cqe }).encode(&self.enc, &mut self.wire);
        self.sent_answer(cqe.cid);
    }

    /// An outstanding CID (mostly); now and then a stale or made-up one;
    /// `None` (do nothing) when nothing is outstanding, mostly.
    fn pick_cid(&mut self, inp: &mut Input<'_>, want: Option<DataDirection>) -> Option<u16> {
        let v = inp.u8();
        let k = inp.u8() as usize;
        let made_up = inp.u16();
        let live: Vec<u16> = self
            .cid_order
            .iter()
            .copied()
            .filter(|cid| {
                let c = &self.cmds[cid];
                !c.answered && want.is_none_or(|d| c.dir == d)
            })
            .collect();
        match (v, live.is_empty(), self.cid_order.len()) {
            (0..=1, _, n) if n > 0 => Some(self.cid_order[k % n]),
            (0..=3, _, _) => Some(made_up),
            (_, true, _) => None,
            _ => Some(live[k % live.len()]),
        }
    }

    fn complete(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let Some(cid) = self.pick_cid(inp, None) else {
            return Ok(());
        };
        let v = inp.u8();
        let ready = self
            .cmds
            .get(&cid)
            .is_some_and(|c| c.in_capsule || c.dir == DataDirection::None || c.done >= c.len);
        let status = match v % 8 {
            0 => Status::from_field(inp.u16() & 0xFFFE),
            1 => Status::LBA_OUT_OF_RANGE.with_dnr(),
            // A success for a command whose data is not all in is a lie
            // the queue must catch; mostly tell the truth.
            2 | 3 if !ready => Status::INTERNAL_ERROR,
            _ => Status::SUCCESS,
        };
        let dw1 = if v & 0x40 != 0 { inp.u32() } else { 0 };
        let mut cqe = Cqe::new(cid, status);
        cqe.dw1 = dw1;
        self.send_cqe(cqe);
        Ok(())
    }

    fn c2h(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let Some(cid) = self.pick_cid(inp, Some(DataDirection::ControllerToHost)) else {
            return Ok(());
        };
        let v = inp.u8();
        let chunk = inp.pick(&[1u32, 512, 4096, 7, 100_000]);
        let cmd = self.cmds.get(&cid).copied();
        let (done, len) = cmd.map_or((0, 4096), |c| (c.done, c.len));
        let datao = match v % 16 {
            0 => done.wrapping_add(inp.pick(&[1, 512, u32::MAX])),
            1 => inp.u32(),
            _ => done,
        };
        let rest = len.saturating_sub(datao).max(1);
        let datal = match (v >> 4) % 4 {
            0 => rest.min(chunk),
            1 => rest + inp.pick(&[1, 4096]),
            _ => rest,
        }
        .min(1 << 20);
        let ends = datao.saturating_add(datal) >= len;
        let last = if v & 0x40 != 0 { !ends } else { ends };
        let success = last && inp.chance(64);
        let data: Vec<u8> = (0..datal)
            .map(|i| c2h_byte(cid, datao.wrapping_add(i)))
            .collect();
        self.stats.c2h += 1;
        if let Some(c) = self.cmds.get_mut(&cid) {
            if datao == c.done {
                c.done = c.done.saturating_add(datal);
            }
            if success {
                c.answered = true;
            }
        }
        let pdu = Pdu::C2HData(C2HData {
            cccid: cid,
            datao,
            last,
            success,
            data: data.into(),
        });
        let mut bytes = pdu.to_vec(&self.enc).unwrap_or_default();
        if self.enc.data_digest && inp.chance(16) {
            if let Some(b) = bytes.last_mut() {
                *b ^= 0x5A;
            }
        }
        self.wire.extend_from_slice(&bytes);
        if success {
            self.sent_answer(cid);
        }
        Ok(())
    }

    /// Notes that an answer for `cid` ends at the current end of our stream.
    fn sent_answer(&mut self, cid: u16) {
        let at = self.delivered + self.wire.len() as u64;
        self.answers.entry(cid).or_default().push(at);
    }

    fn r2t(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let Some(cid) = self.pick_cid(inp, Some(DataDirection::HostToController)) else {
            return Ok(());
        };
        let v = inp.u8();
        let chunk = inp.pick(&[4096u32, 512, 8192, 1]);
        let ttag = inp.u16();
        let cmd = self.cmds.get(&cid).copied();
        let (done, len) = cmd.map_or((0, 4096), |c| (c.done, c.len));
        let r2to = match v % 16 {
            0 => done.wrapping_add(inp.pick(&[1, 4096])),
            1 => inp.u32(),
            _ => done,
        };
        let rest = len.saturating_sub(r2to).max(1);
        let r2tl = match (v >> 4) % 4 {
            0 => rest.min(chunk),
            1 => rest + 1,
            _ => rest,
        };
        self.stats.r2ts += 1;
        if let Some(c) = self.cmds.get_mut(&cid) {
            if r2to == c.done && r2to.saturating_add(r2tl) <= c.len && !c.in_capsule {
                c.done += r2tl;
            }
        }
        let _ = Pdu::R2T(R2T {
            cccid: cid,
            ttag,
            r2to,
            r2tl,
        })
        .encode(&self.enc, &mut self.wire);
        // Whatever the queue makes of it, H2CData may answer it only
        // inside this window.
        if let Some(end) = r2to.checked_add(r2tl) {
            let at = self.delivered + self.wire.len() as u64;
            self.r2t_windows
                .entry(cid)
                .or_default()
                .push((ttag, r2to, end, at));
        }
        Ok(())
    }

    fn term_req(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let t = TermReq {
            fes: FatalErrorStatus(inp.pick(&[1, 2, 5, 0xFF])),
            fei: inp.u32(),
            data: vec![0u8; inp.pick(&[0, 8, 128])].into(),
        };
        let _ = Pdu::term_req(Role::Controller, t).encode(&self.enc, &mut self.wire);
        Ok(())
    }

    fn garbage(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        self.chaos = true;
        let len = inp.pick(&[1usize, 8, 24, 100, 2000]);
        let mut x = inp.u32() | 1;
        for i in 0..len {
            let b = if i < 16 {
                inp.u8()
            } else {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            };
            self.wire.push(b);
        }
        Ok(())
    }

    /// A valid C2HData, R2T or CapsuleResp with header bytes changed.
    fn mutated(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        self.chaos = true;
        let at = self.wire.len();
        match inp.u8() % 3 {
            0 => self.c2h(inp)?,
            1 => self.r2t(inp)?,
            _ => self.complete(inp)?,
        }
        let pdu_len = self.wire.len() - at;
        for _ in 0..1 + inp.below(3) {
            let field = inp.u8() % 8;
            let value = inp.u8();
            let plen = inp.pick(&[0u32, 8, 24, 28, 1 << 30, u32::MAX]);
            let i = at + inp.below(pdu_len.max(1) as u64) as usize;
            if pdu_len < 8 {
                break;
            }
            match field {
                0 => self.wire[at] = value % 12,
                1 => self.wire[at + 1] = value,
                2 => self.wire[at + 2] = value,
                3 => self.wire[at + 3] = value,
                4 => self.wire[at + 4..at + 8].copy_from_slice(&plen.to_le_bytes()),
                5 | 6 => {
                    if let Some(b) = self.wire.get_mut(i) {
                        *b ^= 1 << (value % 8);
                    }
                }
                _ => {
                    let hlen = usize::from(self.wire[at + 2]);
                    if self.enc.header_digest && hlen >= 8 && pdu_len >= hlen + 4 {
                        let d = crc32c(&self.wire[at..at + hlen]).to_le_bytes();
                        self.wire[at + hlen..at + hlen + 4].copy_from_slice(&d);
                    }
                }
            }
        }
        Ok(())
    }

    /// Hands the queue the next bytes on the wire, split where the script
    /// says, through `handle_bytes` or (when offered) `rx_direct`.
    fn deliver(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let n = inp.pick(&[1usize, 3, 7, 8, 9, 23, 24, 25, 72, 100, 4096, usize::MAX]);
        let direct = inp.chance(128);
        self.deliver_n(n, direct)
    }

    fn deliver_n(&mut self, n: usize, direct: bool) -> Result<(), Violation> {
        let n = n.min(self.wire.len());
        if n == 0 {
            return Ok(());
        }
        let chunk: Vec<u8> = self.wire.drain(..n).collect();
        self.chunk_start = self.delivered;
        self.delivered += n as u64;
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            let took = if direct {
                let before = thread_bytes();
                let took = match self.q.rx_direct() {
                    Some(slot) => {
                        let k = slot.len().min(rest.len());
                        slot[..k].copy_from_slice(&rest[..k]);
                        Some(k)
                    }
                    None => None,
                };
                self.queue_heap += thread_bytes() - before;
                if let Some(k) = took {
                    self.measured(|q, now| q.handle_direct(now, k));
                    self.stats.direct_bytes += k as u64;
                }
                took
            } else {
                None
            };
            let took = match took {
                Some(k) if k > 0 => k,
                _ => {
                    // Up to the next place the direct path might open.
                    let k = if direct {
                        rest.len().min(24)
                    } else {
                        rest.len()
                    };
                    let piece = &rest[..k];
                    self.measured(|q, now| q.handle_bytes(now, piece));
                    self.stats.bytes_delivered += k as u64;
                    k
                }
            };
            rest = &rest[took..];
            if self.negotiated.is_some() && self.q.state() != QueueState::AwaitIcResp {
                if let Some(n) = self.negotiated {
                    self.host_out
                        .set_config(n.decoder_config(Role::Controller, 1 << 20));
                }
            }
            self.after_step()?;
        }
        // All of it is in: later capsules come after every PDU of it.
        self.chunk_start = self.delivered;
        Ok(())
    }

    fn deliver_all(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let direct = inp.chance(128);
        self.deliver_n(usize::MAX, direct)
    }

    fn timeout(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let d = inp.pick(&[1u64, 1, 1, 1, 1, 100, 1000, 5000, 31_000, 61_000]);
        self.now += Duration::from_millis(d);
        self.measured(|q, now| q.handle_timeout(now));
        self.after_step()
    }

    fn take_unfinished(&mut self) -> Result<(), Violation> {
        let closed = self.q.state() == QueueState::Closed;
        let v = self.measured(|q, _| q.take_unfinished());
        self.queue_heap -= (v.capacity() * std::mem::size_of::<Request<Vec<u8>>>()) as isize;
        if !closed && !v.is_empty() {
            return Err("take_unfinished returned requests from an open queue".into());
        }
        let mut last = None;
        for r in v {
            if last.is_some_and(|l| l > r.user_data) {
                return Err("take_unfinished out of submission order".into());
            }
            last = Some(r.user_data);
            self.stats.unfinished += 1;
            self.returned(r.user_data, r.buf.as_deref(), false)?;
        }
        self.after_step()
    }

    /// Delivers what is left, closes, and checks every request came back.
    fn finish(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        self.deliver_all(inp)?;
        self.measured(|q, _| q.close());
        self.after_step()?;
        self.take_unfinished()?;
        if !self.open.is_empty() {
            return Err(format!("requests never came back: {:?}", self.open));
        }
        // A closed queue takes nothing and says nothing more.
        self.measured(|q, now| q.handle_bytes(now, &[0xFF; 64]));
        self.after_step()?;
        if self.q.has_events() || self.q.has_transmit() {
            return Err("a closed queue still has events or bytes to send".into());
        }
        Ok(())
    }
}
