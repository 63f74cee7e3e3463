//! The connection fuzzer's driver, shared by the cargo-fuzz target
//! (`fuzz_targets/connection.rs`) and the bounded in-CI test
//! (`tests/fuzz_connection.rs`).
//!
//! One input is a script: every byte sequence means a sequence of
//! operations by up to four hosts against one in-process target (ICReq with
//! varied fields, admin and I/O Connects, admin and I/O commands with
//! arbitrary fields, R2T answers and stray H2CData, mutated PDUs, garbage,
//! PDUs split across TCP writes, Disconnect, half-close, close). Operations
//! are built with `nvmf-proto`'s encoders and then have fields changed, and
//! a new connection usually brings itself up first, so a script reaches
//! deep states instead of dying at the first length check.
//!
//! After each script [`Harness::run`] checks the target: no panic on any
//! of its threads (a panic in a tokio task only ends that task, so a hook
//! records it), every PDU it sent decodes, every controller and every
//! in-flight count it kept for the script's connections is released, heap
//! use stayed bounded (a counting global allocator), and a well-behaved
//! host can still connect, write and read back.

#![allow(dead_code)] // the fuzz target and the test use different parts

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use gimbal_target::config::TargetConfig;
use gimbal_target::server::{spawn, TargetHandle};
use nvmf_proto::command::{
    cns, dsm_attr, log_id, AdminCommand, DsmRange, GetFeatures, GetLogPage, Identify, SetFeatures,
    DSM_RANGE_LEN,
};
use nvmf_proto::fabrics::{
    property, Connect, ConnectData, ControllerConfiguration, Disconnect, PropertyGet, PropertySet,
    CNTLID_DYNAMIC, DISCOVERY_NQN,
};
use nvmf_proto::features::{feature_id, NumberOfQueues};
use nvmf_proto::pdu::{crc32c, pdu_type};
use nvmf_proto::sqe::{admin_opcode, io_opcode};
use nvmf_proto::{
    CapsuleCmd, Cqe, Decoded, DecoderConfig, EncodeConfig, FatalErrorStatus, H2CData, IcReq,
    IoCommand, Negotiated, Pdu, PduDecoder, Role, SglDescriptor, Sqe, TermReq, R2T,
};

#[path = "../../tests/fuzz/script.rs"]
#[macro_use]
pub mod script;
use script::{tracing, Input};

// ---- the target under test ----------------------------------------------

/// The subsystem most scripts use: two namespaces (one behind the Gimbal
/// switch), open to two host NQNs only.
pub const SUBNQN: &str = "nqn.2026-01.io.gimbal:fuzz";
/// A subsystem open to any host, with a `null` namespace.
pub const OPEN_NQN: &str = "nqn.2026-01.io.gimbal:fuzz-open";
/// Allowed on [`SUBNQN`].
pub const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
/// Allowed on [`SUBNQN`].
pub const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
/// Allowed only on [`OPEN_NQN`].
pub const HOST_STRANGER: &str =
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000c";

const NS1_BLOCKS: u64 = (8 << 20) / 512;
const NS2_BLOCKS: u64 = (4 << 20) / 4096;
const OPEN_BLOCKS: u64 = (1 << 30) / 4096;
/// Bytes the RAM namespaces may come to hold (they allocate on first write).
const RAM_BYTES: usize = (8 << 20) + (4 << 20);
const MDTS: u32 = 64 * 1024;
const IN_CAPSULE: u32 = 4096;
const MAX_QUEUE_SIZE: u16 = 32;
const MAX_IO_QUEUES: u16 = 4;

/// Small limits, so that scripts reach them: MDTS 64 KiB, 4 KiB in-capsule,
/// MAXH2CDATA 8 KiB, 32-entry queues, 4 I/O queues, KATO from 50 ms.
pub const CONFIG: &str = r#"
listen = ["127.0.0.1:0"]

[limits]
max_io_queues = 4
max_queue_size = 32
max_data_transfer_bytes = 65536
in_capsule_data_bytes = 4096
max_h2c_data_bytes = 8192

[keep_alive]
default_ms = 0
min_ms = 50
max_ms = 60000

[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:fuzz"
allowed_hosts = [
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a",
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b",
]

[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "8MiB"
block_size = 512
qos = "none"

[[subsystem.namespace]]
nsid = 2
backend = "ram"
size = "4MiB"
block_size = 4096
qos = "gimbal"

[[subsystem]]
nqn = "nqn.2026-01.io.gimbal:fuzz-open"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = "null"
size = "1GiB"
block_size = 4096
qos = "none"
"#;

// ---- heap accounting ----------------------------------------------------

/// Counts live heap bytes of the whole process (the target's threads
/// included), their peak, and the largest single allocation.
pub struct CountingAlloc;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);
static LARGEST_ALLOC_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A single allocation above this is reported with the stack that made it.
pub const ALLOC_REPORT_BYTES: usize = 64 << 20;

thread_local! {
    static REPORTING: Cell<bool> = const { Cell::new(false) };
}

fn grew(bytes: usize) {
    let now = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
    let before = LARGEST_ALLOC_BYTES.fetch_max(bytes, Ordering::Relaxed);
    if bytes > ALLOC_REPORT_BYTES && bytes > before {
        // Printing allocates: the flag keeps that from recursing.
        let first = REPORTING.try_with(|r| !r.replace(true)).unwrap_or(false);
        if first {
            let thread = std::thread::current();
            eprintln!(
                "fuzz: allocation of {bytes} bytes on thread {:?}:\n{}",
                thread.name().unwrap_or("?"),
                std::backtrace::Backtrace::force_capture()
            );
            let _ = REPORTING.try_with(|r| r.set(false));
        }
    }
}

// SAFETY: every call goes to `System` with the caller's arguments; the
// counters are only arithmetic on the side.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE_BYTES.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Live heap bytes of the process.
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

// ---- panics on the target's threads --------------------------------------

/// Panics seen on threads other than the harness's: (thread, message with
/// location, backtrace).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HARNESS_THREAD: Mutex<Option<ThreadId>> = Mutex::new(None);

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let me = std::thread::current();
            let harness = *HARNESS_THREAD.lock().unwrap_or_else(|e| e.into_inner());
            if harness != Some(me.id()) {
                let record = format!(
                    "panic on thread {:?}: {info}\n{}",
                    me.name().unwrap_or("?"),
                    std::backtrace::Backtrace::force_capture()
                );
                PANICS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(record);
            }
            previous(info);
        }));
    });
}

// ---- one host connection --------------------------------------------------

/// Largest data the harness accepts in one PDU from the target.
const HOST_MAX_DATA: u32 = 64 << 20;
/// How long a step waits for an answer the target owes.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// What a script step found wrong with the target's output.
type Violation = String;

struct Conn {
    stream: TcpStream,
    decoder: PduDecoder,
    enc: EncodeConfig,
    rx: Vec<u8>,
    /// The target closed (or reset) it, or we did.
    closed: bool,
    /// Output is no longer decoded (we sent something that desynchronises
    /// our view of the link settings, e.g. an ICReq the target may read
    /// differently than we built it).
    opaque: bool,
    ic_req: Option<IcReq>,
    ic_done: bool,
    maxh2cdata: u32,
    /// The controller this queue joined, and whether as its admin queue.
    cntlid: Option<u16>,
    admin: bool,
    qid: u16,
    host_nqn: &'static str,
    next_cid: u16,
    /// Commands sent and not yet answered (by a CQE, an R2T or the
    /// SUCCESS flag).
    unanswered: BTreeSet<u16>,
    cqes: BTreeMap<u16, Cqe>,
    r2ts: VecDeque<R2T>,
    /// We stopped reading what the target sends.
    stalled: bool,
    /// We sent bytes that may leave the target inside a PDU of its own
    /// reckoning: answers are no longer waited for.
    desynced: bool,
    /// Split the next PDUs sent at this byte offset.
    split_at: Option<usize>,
    term_received: bool,
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn, Violation> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("cannot connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            decoder: PduDecoder::new(DecoderConfig {
                max_data_len: HOST_MAX_DATA,
                ..DecoderConfig::new(Role::Host)
            }),
            enc: EncodeConfig::default(),
            rx: Vec::new(),
            closed: false,
            opaque: false,
            ic_req: None,
            ic_done: false,
            maxh2cdata: 4096,
            cntlid: None,
            admin: false,
            qid: 0,
            host_nqn: HOST_A,
            next_cid: 0,
            unanswered: BTreeSet::new(),
            cqes: BTreeMap::new(),
            r2ts: VecDeque::new(),
            split_at: None,
            desynced: false,
            stalled: false,
            term_received: false,
        })
    }

    fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    fn send(&mut self, bytes: &[u8], stats: &mut CaseStats) {
        if self.closed || bytes.is_empty() {
            return;
        }
        trace!(
            "  -> {} bytes: {:02x?}",
            bytes.len(),
            &bytes[..bytes.len().min(16)]
        );
        stats.bytes_sent += bytes.len() as u64;
        let cut = self.split_at.take().filter(|&c| c > 0 && c < bytes.len());
        let result = match cut {
            Some(c) if stats.split_sleeps < 16 => {
                stats.split_sleeps += 1;
                self.stream.write_all(&bytes[..c]).and_then(|_| {
                    // Long enough that the target's read usually returns
                    // the first piece alone.
                    std::thread::sleep(Duration::from_micros(300));
                    self.stream.write_all(&bytes[c..])
                })
            }
            _ => self.stream.write_all(bytes),
        };
        if result.is_err() {
            self.closed = true;
        }
    }

    fn send_pdu(&mut self, pdu: &Pdu<'_>, stats: &mut CaseStats) {
        match pdu.to_vec(&self.enc) {
            Ok(bytes) => self.send(&bytes, stats),
            Err(_) => stats.unencodable += 1,
        }
    }

    /// Sends a capsule; returns its CID.
    fn send_capsule(&mut self, sqe: Sqe, data: &[u8], stats: &mut CaseStats) -> u16 {
        let cid = sqe.cid;
        let held = self.admin && sqe.opcode == admin_opcode::ASYNC_EVENT_REQUEST;
        trace!(
            "  -> capsule opc {:#04x} cid {:#x} nsid {:#x} cdw10 {:#x} cdw11 {:#x} cdw12 {:#x} sgl {:?} data {}",
            sqe.opcode,
            sqe.cid,
            sqe.nsid,
            sqe.cdw10,
            sqe.cdw11,
            sqe.cdw12,
            sqe.dptr.kind(),
            data.len()
        );
        let capsule = CapsuleCmd {
            sqe,
            data: data.into(),
        };
        if !held {
            self.unanswered.insert(cid);
        }
        stats.commands += 1;
        self.send_pdu(&Pdu::CapsuleCmd(capsule), stats);
        cid
    }

    /// Reads what the target sent without waiting (`wait` = None), or
    /// until `done` holds, the connection closes or `wait` passes.
    fn pump(
        &mut self,
        wait: Option<Duration>,
        done: &dyn Fn(&Conn) -> bool,
        stats: &mut CaseStats,
    ) -> Result<(), Violation> {
        let started = Instant::now();
        let deadline = wait.map(|w| started + w);
        let result = self.pump_until(deadline, done, stats);
        stats.waited_us += started.elapsed().as_micros() as u64;
        result
    }

    fn pump_until(
        &mut self,
        deadline: Option<Instant>,
        done: &dyn Fn(&Conn) -> bool,
        stats: &mut CaseStats,
    ) -> Result<(), Violation> {
        loop {
            self.decode_all(stats)?;
            if self.closed || self.stalled || done(self) {
                return Ok(());
            }
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        trace!("  no answer in time; unanswered {:?}", self.unanswered);
                        stats.answer_timeouts += 1;
                        return Ok(());
                    }
                    Some((d - now).min(Duration::from_millis(100)))
                }
            };
            let _ = self.stream.set_nonblocking(timeout.is_none());
            if let Some(t) = timeout {
                let _ = self.stream.set_read_timeout(Some(t));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.closed = true,
                Ok(n) => {
                    stats.bytes_received += n as u64;
                    self.rx.extend_from_slice(&chunk[..n]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if timeout.is_none() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.closed = true,
            }
        }
    }

    fn decode_all(&mut self, stats: &mut CaseStats) -> Result<(), Violation> {
        if self.opaque {
            self.rx.clear();
            return Ok(());
        }
        let mut start = 0;
        let result = loop {
            match self.decoder.decode(&self.rx[start..]) {
                Ok(Decoded::NeedMore(_)) => break Ok(()),
                Ok(Decoded::Pdu { pdu, consumed }) => {
                    let pdu = pdu.into_owned();
                    start += consumed;
                    if let Err(v) = self.handle(pdu, stats) {
                        break Err(v);
                    }
                }
                Err(e) => {
                    break Err(format!(
                        "target sent bytes a host cannot decode: {e} (header {:02x?})",
                        &self.rx[start..self.rx.len().min(start + 24)]
                    ))
                }
            }
        };
        self.rx.drain(..start);
        result
    }

    fn handle(&mut self, pdu: Pdu<'static>, stats: &mut CaseStats) -> Result<(), Violation> {
        match &pdu {
            Pdu::C2HData(d) => trace!(
                "  <- C2HData cid {:#x} datao {} len {} last {} success {}",
                d.cccid,
                d.datao,
                d.data.len(),
                d.last,
                d.success
            ),
            other => trace!("  <- {other:?}"),
        }
        if self.term_received {
            // Completions of commands in flight may still follow; the
            // framing must stay valid, which decoding checks.
            stats.after_term_pdus += 1;
        }
        match pdu {
            Pdu::IcResp(resp) => {
                let Some(req) = self.ic_req else {
                    return Err("ICResp without an ICReq".into());
                };
                if self.ic_done {
                    return Err("second ICResp".into());
                }
                let n = Negotiated::new(&req, &resp)
                    .map_err(|e| format!("ICResp does not fit the ICReq: {e}"))?;
                self.enc = n.encode_config(Role::Host);
                self.decoder
                    .set_config(n.decoder_config(Role::Host, HOST_MAX_DATA));
                self.maxh2cdata = resp.maxh2cdata;
                self.ic_done = true;
                stats.ic_resps += 1;
            }
            Pdu::CapsuleResp(r) => {
                self.unanswered.remove(&r.cqe.cid);
                if r.cqe.status.is_success() {
                    stats.successes += 1;
                } else {
                    stats.errors += 1;
                }
                if self.cqes.len() > 256 {
                    self.cqes.clear();
                }
                self.cqes.insert(r.cqe.cid, r.cqe);
            }
            Pdu::C2HData(d) => {
                stats.c2h_bytes += d.data.len() as u64;
                if d.success {
                    self.unanswered.remove(&d.cccid);
                    stats.successes += 1;
                    self.cqes.insert(d.cccid, Cqe::success(d.cccid));
                }
            }
            Pdu::R2T(r) => {
                stats.r2ts += 1;
                self.unanswered.remove(&r.cccid);
                if self.r2ts.len() < 64 {
                    self.r2ts.push_back(r);
                }
            }
            Pdu::C2HTermReq(_) => {
                stats.term_reqs += 1;
                self.term_received = true;
            }
            other => {
                // The host-role decoder admits no other type.
                return Err(format!("unexpected PDU from the target: {other:?}"));
            }
        }
        Ok(())
    }

    /// Waits for the answer to `cid` (a CQE, an R2T or the SUCCESS flag).
    fn await_answer(&mut self, cid: u16, stats: &mut CaseStats) -> Result<Option<Cqe>, Violation> {
        let wait = (!self.desynced).then_some(ANSWER_TIMEOUT);
        self.pump(wait, &|c: &Conn| !c.unanswered.contains(&cid), stats)?;
        Ok(self.cqes.get(&cid).copied())
    }
}

// ---- statistics -----------------------------------------------------------

/// What scripts did, summed over a run (to see that they reach deep
/// states, not only the first length check).
#[derive(Debug, Default, Clone, Copy)]
pub struct CaseStats {
    /// Scripts run.
    pub cases: u64,
    /// Operations executed.
    pub ops: u64,
    /// Connections opened.
    pub connections: u64,
    /// Capsules sent.
    pub commands: u64,
    /// Successful completions received (CQE or SUCCESS flag).
    pub successes: u64,
    /// Error completions received.
    pub errors: u64,
    /// ICResps received.
    pub ic_resps: u64,
    /// Connects accepted (admin + I/O).
    pub connects_ok: u64,
    /// I/O queue Connects accepted.
    pub io_connects_ok: u64,
    /// R2Ts received.
    pub r2ts: u64,
    /// H2CData PDUs sent.
    pub h2c_pdus: u64,
    /// C2HTermReqs received.
    pub term_reqs: u64,
    /// C2HData payload bytes received.
    pub c2h_bytes: u64,
    /// Bytes sent / received.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Steps whose expected answer did not come in time.
    pub answer_timeouts: u64,
    /// PDUs the encoder refused (e.g. data too long for PLEN).
    pub unencodable: u64,
    /// Sends split in two with a pause between.
    pub split_sleeps: u64,
    /// Milliseconds slept by sleep operations.
    pub slept_ms: u64,
    /// Microseconds spent waiting for the target's answers.
    pub waited_us: u64,
    /// PDUs the target sent after its C2HTermReq on the same connection.
    pub after_term_pdus: u64,
    /// Highest heap growth during one script, in bytes.
    pub peak_growth_bytes: u64,
}

impl CaseStats {
    /// Adds `o` into `self` (peaks take the maximum).
    pub fn add(&mut self, o: &CaseStats) {
        self.cases += o.cases;
        self.ops += o.ops;
        self.connections += o.connections;
        self.commands += o.commands;
        self.successes += o.successes;
        self.errors += o.errors;
        self.ic_resps += o.ic_resps;
        self.connects_ok += o.connects_ok;
        self.io_connects_ok += o.io_connects_ok;
        self.r2ts += o.r2ts;
        self.h2c_pdus += o.h2c_pdus;
        self.term_reqs += o.term_reqs;
        self.c2h_bytes += o.c2h_bytes;
        self.bytes_sent += o.bytes_sent;
        self.bytes_received += o.bytes_received;
        self.answer_timeouts += o.answer_timeouts;
        self.unencodable += o.unencodable;
        self.split_sleeps += o.split_sleeps;
        self.slept_ms += o.slept_ms;
        self.after_term_pdus += o.after_term_pdus;
        self.waited_us += o.waited_us;
        self.peak_growth_bytes = self.peak_growth_bytes.max(o.peak_growth_bytes);
    }
}

// ---- the harness ----------------------------------------------------------

/// Heap growth allowed during one script (the target's buffers for up to
/// four connections plus the harness's own receive buffers).
pub const CASE_HEAP_GROWTH_MAX_BYTES: usize = 256 << 20;
/// Heap growth allowed over a whole run, once the target is idle again:
/// what the RAM namespaces may hold plus slack.
pub const RUN_HEAP_GROWTH_MAX_BYTES: usize = RAM_BYTES + (64 << 20);
/// How long a closed script's controllers and in-flight commands may take
/// to be released (the target waits for in-flight commands on close).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_OPS: usize = 96;
const MAX_CONNS: usize = 4;

/// An in-process target and the checks made around each script.
pub struct Harness {
    target: TargetHandle,
    addr: SocketAddr,
    baseline_live_bytes: usize,
    health_round: u32,
}

impl Harness {
    /// Starts the target (see [`CONFIG`]) and checks it serves.
    pub fn start() -> Harness {
        install_panic_hook();
        *HARNESS_THREAD.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::thread::current().id());
        let cfg = TargetConfig::parse(Path::new("fuzz.toml"), CONFIG).expect("fuzz config");
        let target = spawn(cfg).expect("target starts");
        let addr = target.local_addrs()[0];
        let mut h = Harness {
            target,
            addr,
            baseline_live_bytes: 0,
            health_round: 0,
        };
        h.check_healthy()
            .expect("a fresh target serves a good host");
        h.settle().expect("a fresh target settles");
        h.baseline_live_bytes = live_bytes();
        h
    }

    /// Runs one script and checks the target afterwards.
    pub fn run(&mut self, input: &[u8]) -> Result<CaseStats, Violation> {
        *HARNESS_THREAD.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(std::thread::current().id());
        let start_live = live_bytes();
        PEAK_BYTES.store(start_live, Ordering::Relaxed);
        LARGEST_ALLOC_BYTES.store(0, Ordering::Relaxed);

        let mut script = Script {
            addr: self.addr,
            conns: Default::default(),
            cur: 0,
            stats: CaseStats {
                cases: 1,
                ..Default::default()
            },
            last_op: None,
            qids: BTreeMap::new(),
        };
        let mut inp = Input::new(input);
        let outcome = script.run(&mut inp);
        let mut stats = script.stats;
        drop(script);
        outcome?;

        self.settle()?;
        self.check_panics()?;
        let peak = PEAK_BYTES.load(Ordering::Relaxed);
        let growth = peak.saturating_sub(start_live);
        stats.peak_growth_bytes = growth as u64;
        let largest = LARGEST_ALLOC_BYTES.load(Ordering::Relaxed);
        if largest > ALLOC_REPORT_BYTES {
            return Err(format!(
                "one allocation of {largest} bytes during the script (stack on stderr)"
            ));
        }
        if growth > CASE_HEAP_GROWTH_MAX_BYTES {
            return Err(format!(
                "heap grew by {growth} bytes during the script (bound {CASE_HEAP_GROWTH_MAX_BYTES})"
            ));
        }
        self.check_healthy()?;
        self.settle()?;
        self.check_panics()?;
        let live = live_bytes();
        if live > self.baseline_live_bytes + RUN_HEAP_GROWTH_MAX_BYTES {
            return Err(format!(
                "idle target holds {} bytes more heap than at start (bound {RUN_HEAP_GROWTH_MAX_BYTES})",
                live - self.baseline_live_bytes
            ));
        }
        Ok(stats)
    }

    /// Once every connection of a script is closed, the target must drop
    /// their controllers and in-flight counts.
    fn settle(&self) -> Result<(), Violation> {
        let t = self.target.target();
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let ctrls = t.controllers().len();
            let inflight = t.inflight.load(Ordering::Acquire);
            if ctrls == 0 && inflight == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{SETTLE_TIMEOUT:?} after every connection closed the target still has \
                     {ctrls} controllers and {inflight} commands in flight"
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn check_panics(&self) -> Result<(), Violation> {
        let mut p = PANICS.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_empty() {
            return Ok(());
        }
        let all = p.join("\n");
        p.clear();
        Err(all)
    }

    /// A well-behaved host brings a controller up, opens an I/O queue,
    /// writes in-capsule and through R2T, and reads it back.
    fn check_healthy(&mut self) -> Result<(), Violation> {
        self.health_round += 1;
        let round = self.health_round;
        let mut stats = CaseStats::default();
        let s = &mut stats;
        let fail = |what: &str| format!("healthy host after the script: {what}");
        let mut admin = Conn::open(self.addr).map_err(|e| fail(&e))?;
        ic(&mut admin, IcReq::default(), s)?;
        if !admin.ic_done {
            return Err(fail("no ICResp"));
        }
        let cqe = connect(
            &mut admin,
            0,
            32,
            10_000,
            CNTLID_DYNAMIC,
            SUBNQN,
            HOST_A,
            0,
            s,
        )?;
        let cntlid = match cqe {
            Some(c) if c.status.is_success() => c.dw0 as u16,
            other => return Err(fail(&format!("admin Connect: {other:?}"))),
        };
        for sqe in [
            PropertySet::new(property::CC, enable_cc(0) as u64).to_sqe(admin.cid()),
            AdminCommand::SetFeatures(SetFeatures::new(
                feature_id::NUMBER_OF_QUEUES,
                NumberOfQueues::with_count(1).to_dword(),
            ))
            .to_sqe(admin.cid()),
        ] {
            let cid = admin.send_capsule(sqe, &[], s);
            match admin.await_answer(cid, s)? {
                Some(c) if c.status.is_success() => {}
                other => return Err(fail(&format!("admin command {sqe:?}: {other:?}"))),
            }
        }
        let mut io = Conn::open(self.addr).map_err(|e| fail(&e))?;
        ic(&mut io, IcReq::default(), s)?;
        match connect(&mut io, 1, 32, 0, cntlid, SUBNQN, HOST_A, 0, s)? {
            Some(c) if c.status.is_success() => {}
            other => return Err(fail(&format!("I/O Connect: {other:?}"))),
        }
        let slba = u64::from(round % 64) * 64;
        let data = pattern(32 * 512, round);
        // The first 4 KiB in the capsule, the other 12 KiB through R2T
        // (two H2CData PDUs of at most MAXH2CDATA = 8 KiB).
        let cid = io.cid();
        let w =
            IoCommand::write(1, slba, 8, SglDescriptor::in_capsule(0, 4096)).expect("valid write");
        io.send_capsule(w.to_sqe(cid), &data[..4096], s);
        match io.await_answer(cid, s)? {
            Some(c) if c.status.is_success() => {}
            other => return Err(fail(&format!("in-capsule write: {other:?}"))),
        }
        let cid = io.cid();
        let w = IoCommand::write(1, slba + 8, 24, SglDescriptor::transport(12 * 1024))
            .expect("valid write");
        io.send_capsule(w.to_sqe(cid), &[], s);
        io.await_answer(cid, s)?;
        let Some(r2t) = io.r2ts.pop_front() else {
            return Err(fail("no R2T for a write"));
        };
        send_h2c_all(&mut io, &r2t, &data[4096..], s);
        io.pump(
            Some(ANSWER_TIMEOUT),
            &|c: &Conn| c.cqes.contains_key(&cid),
            s,
        )?;
        match io.cqes.get(&cid) {
            Some(c) if c.status.is_success() => {}
            other => return Err(fail(&format!("R2T write: {other:?}"))),
        }
        let cid = io.cid();
        let r = IoCommand::read(1, slba, 32, 32 * 512).expect("valid read");
        io.send_capsule(r.to_sqe(cid), &[], s);
        // Gather the data ourselves: the decoder only counts it.
        let got = read_back(&mut io, cid, s)?;
        if got != data {
            return Err(fail("read back different data"));
        }
        // Orderly end: Disconnect the I/O queue, close the admin queue.
        let cid = io.cid();
        io.send_capsule(Disconnect::default().to_sqe(cid), &[], s);
        io.await_answer(cid, s)?;
        drop(io);
        drop(admin);
        Ok(())
    }
}

/// Sends ICReq and waits for ICResp (or the close).
fn ic(c: &mut Conn, req: IcReq, s: &mut CaseStats) -> Result<(), Violation> {
    c.ic_req = Some(req);
    c.send_pdu(&Pdu::IcReq(req), s);
    c.pump(Some(ANSWER_TIMEOUT), &|c: &Conn| c.ic_done, s)
}

#[allow(clippy::too_many_arguments)]
fn connect(
    c: &mut Conn,
    qid: u16,
    depth: u16,
    kato_ms: u32,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &'static str,
    cattr: u8,
    s: &mut CaseStats,
) -> Result<Option<Cqe>, Violation> {
    let mut cmd = if qid == 0 {
        Connect::admin(depth, kato_ms)
    } else {
        Connect::io(qid, depth, nvmf_proto::fabrics::PriorityClass::Medium)
    };
    cmd.cattr |= cattr;
    let cid = c.cid();
    let data = ConnectData {
        host_id: [0x42; 16],
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    }
    .to_bytes()
    .expect("valid connect data");
    c.send_capsule(cmd.to_sqe(cid), &data, s);
    let cqe = c.await_answer(cid, s)?;
    if let Some(cqe) = cqe.filter(|c| c.status.is_success()) {
        c.cntlid = Some(cqe.dw0 as u16);
        c.admin = qid == 0;
        c.qid = qid;
        c.host_nqn = hostnqn;
        s.connects_ok += 1;
        if qid != 0 {
            s.io_connects_ok += 1;
        }
    }
    Ok(cqe)
}

fn enable_cc(ams: u8) -> u32 {
    let mut cc = ControllerConfiguration::from_u32(0);
    cc.enable = true;
    cc.iosqes = 6;
    cc.iocqes = 4;
    cc.ams = ams;
    cc.to_u32()
}

/// Answers an R2T with all its data, in MAXH2CDATA pieces.
fn send_h2c_all(c: &mut Conn, r2t: &R2T, data: &[u8], s: &mut CaseStats) {
    let piece = c.maxh2cdata.max(4) as usize;
    let end = (r2t.r2to as usize + r2t.r2tl as usize).min(data.len());
    let mut off = r2t.r2to as usize;
    while off < end {
        let n = piece.min(end - off);
        s.h2c_pdus += 1;
        c.send_pdu(
            &Pdu::H2CData(H2CData {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                datao: off as u32,
                last: off + n == end,
                data: data[off..off + n].to_vec().into(),
            }),
            s,
        );
        off += n;
    }
}

/// Reads the C2HData of `cid` until its completion, keeping the data.
fn read_back(c: &mut Conn, cid: u16, s: &mut CaseStats) -> Result<Vec<u8>, Violation> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut data = Vec::new();
    let mut buf = Vec::new();
    let _ = c.stream.set_nonblocking(false);
    loop {
        match c.decoder.decode(&buf) {
            Ok(Decoded::Pdu { pdu, consumed }) => {
                let pdu = pdu.into_owned();
                buf.drain(..consumed);
                match pdu {
                    Pdu::C2HData(d) if d.cccid == cid => {
                        if d.datao as usize != data.len() {
                            return Err(format!("C2HData at {} after {}", d.datao, data.len()));
                        }
                        data.extend_from_slice(&d.data);
                        if d.success {
                            return Ok(data);
                        }
                    }
                    Pdu::CapsuleResp(r) if r.cqe.cid == cid => {
                        if !r.cqe.status.is_success() {
                            return Err(format!("read failed: {:?}", r.cqe));
                        }
                        return Ok(data);
                    }
                    other => return Err(format!("unexpected {other:?} during a read")),
                }
            }
            Ok(Decoded::NeedMore(_)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("read timed out".into());
                }
                let _ = c.stream.set_read_timeout(Some(left));
                let mut chunk = [0u8; 64 * 1024];
                match c.stream.read(&mut chunk) {
                    Ok(0) => return Err("connection closed during a read".into()),
                    Ok(n) => {
                        s.bytes_received += n as u64;
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("read: {e}")),
                }
            }
            Err(e) => return Err(format!("undecodable PDU from the target: {e}")),
        }
    }
}

/// Deterministic data.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

// ---- the script -----------------------------------------------------------

/// Commands one [`Op::Stall`] sends after it stops reading: enough to
/// overrun any SQ and the target's per-queue data budget many times over
/// (the flood that, before the memory budget, grew the target without
/// bound; Get Log Page NUMD is left unbounded for the same reason).
const FLOOD_COMMANDS: usize = 6000;

struct Script {
    addr: SocketAddr,
    conns: [Option<Conn>; MAX_CONNS],
    cur: usize,
    stats: CaseStats,
    /// The last operation, for repeats.
    last_op: Option<Op>,
    /// I/O queue IDs handed out per controller.
    qids: BTreeMap<u16, u16>,
}

/// What a newly opened connection should become.
#[derive(Clone, Copy)]
enum Role2 {
    /// Chosen by the script.
    Any,
    /// An enabled controller's admin queue.
    Admin,
    /// An I/O queue of the controller another slot brought up.
    Io,
}

/// Operations by weight (out of 256): mostly commands, some damage.
const OP_WEIGHTS: [(Op, u8); 22] = [
    (Op::Switch, 12),
    (Op::IcReq, 6),
    (Op::ConnectAdmin, 6),
    (Op::ConnectIo, 8),
    (Op::Admin, 30),
    (Op::Property, 12),
    (Op::Read, 30),
    (Op::Write, 42),
    (Op::AnswerR2t, 14),
    (Op::StrayH2c, 5),
    (Op::MiscIo, 14),
    (Op::Dsm, 10),
    (Op::RawSqe, 8),
    (Op::Garbage, 5),
    (Op::Mutated, 8),
    (Op::Split, 8),
    (Op::TermReq, 3),
    (Op::End, 8),
    (Op::Sync, 10),
    (Op::Sleep, 2),
    (Op::Stall, 1),
    (Op::Repeat, 14),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Switch,
    IcReq,
    ConnectAdmin,
    ConnectIo,
    Admin,
    Property,
    Read,
    Write,
    AnswerR2t,
    StrayH2c,
    MiscIo,
    Dsm,
    RawSqe,
    Garbage,
    Mutated,
    Split,
    TermReq,
    End,
    Sync,
    Sleep,
    Stall,
    Repeat,
}

fn pick_op(b: u8) -> Op {
    let mut left = u32::from(b);
    for (op, w) in OP_WEIGHTS {
        if left < u32::from(w) {
            return op;
        }
        left -= u32::from(w);
    }
    Op::Sync
}

impl Script {
    fn run(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        if inp.chance(192) {
            // Most scripts start with a controller and one I/O queue.
            for (slot, role) in [(0, Role2::Admin), (1, Role2::Io)] {
                self.cur = slot;
                let c = self.open(inp, role)?;
                self.conns[slot] = Some(c);
            }
        }
        let mut ops = 0;
        while !inp.is_empty() && ops < MAX_OPS {
            let code = pick_op(inp.u8());
            if code == Op::Repeat {
                // Repeat the previous operation a few times (floods).
                if let Some(prev) = self.last_op {
                    let times = 2 + inp.below(30);
                    for _ in 0..times {
                        self.op(prev, inp)?;
                        self.stats.ops += 1;
                    }
                }
            } else {
                self.op(code, inp)?;
                self.last_op = Some(code);
            }
            self.stats.ops += 1;
            ops += 1;
            // Keep every connection's output flowing, so the target's
            // writers never stall on us.
            for c in self.conns.iter_mut().flatten() {
                let stats = &mut self.stats;
                c.pump(None, &|_: &Conn| false, stats)?;
            }
        }
        // Let answers in flight arrive and be checked before closing.
        for c in self.conns.iter_mut().flatten() {
            let stats = &mut self.stats;
            c.pump(
                Some(Duration::from_millis(200)),
                &|c: &Conn| c.unanswered.is_empty(),
                stats,
            )?;
        }
        Ok(())
    }

    /// The current connection, opened (and usually brought up) if the
    /// slot is empty or the target closed it. Opening reads the same
    /// number of script bytes whatever happens, so a script stays aligned
    /// even where timing decides whether a close was seen yet.
    fn conn(&mut self, inp: &mut Input<'_>) -> Result<(&mut Conn, &mut CaseStats), Violation> {
        if self.conns[self.cur].as_ref().is_none_or(|c| c.closed) {
            self.conns[self.cur] = None;
            let c = self.open(inp, Role2::Any)?;
            self.conns[self.cur] = Some(c);
        }
        let c = self.conns[self.cur].as_mut().expect("just opened");
        Ok((c, &mut self.stats))
    }

    /// The connection for an I/O (`io`) or admin command: mostly one
    /// connected as such, if any, else the current one.
    fn conn_for(
        &mut self,
        io: bool,
        inp: &mut Input<'_>,
    ) -> Result<(&mut Conn, &mut CaseStats), Violation> {
        let prefer = inp.chance(208);
        let found = self.conns.iter().position(|c| {
            c.as_ref()
                .is_some_and(|c| c.cntlid.is_some() && c.admin != io)
        });
        match found {
            Some(i) if prefer => {
                let c = self.conns[i].as_mut().expect("found");
                Ok((c, &mut self.stats))
            }
            _ => self.conn(inp),
        }
    }

    /// A new connection: mostly brought up as an admin queue or as an I/O
    /// queue of a controller another slot brought up, sometimes left raw or
    /// after ICReq. Reads the same number of script bytes whatever happens.
    fn open(&mut self, inp: &mut Input<'_>, role: Role2) -> Result<Conn, Violation> {
        self.stats.connections += 1;
        let mode = match role {
            Role2::Any => inp.u8(),
            Role2::Admin => inp.u8() % 192,
            Role2::Io => inp.u8() % 128,
        };
        let digests = inp.u8();
        let hpda = inp.pick(&[1, 3]);
        let cattr = inp.u8() & 0x7;
        let host = inp.pick(&[HOST_A, HOST_A, HOST_B]);
        let kato = inp.pick(&[0, 0, 10_000, 50]);
        let ams = inp.pick(&[0, 0, 0, 1, 7]);
        let mut c = Conn::open(self.addr)?;
        let s = &mut self.stats;
        if mode >= 224 {
            return Ok(c);
        }
        let req = IcReq {
            hpda: if digests & 0x10 != 0 { hpda } else { 0 },
            header_digest: digests & 1 != 0,
            data_digest: digests & 2 != 0,
            maxr2t: 0,
        };
        ic(&mut c, req, s)?;
        if mode >= 192 || !c.ic_done {
            return Ok(c);
        }
        let admin = self
            .conns
            .iter()
            .flatten()
            .find(|c| c.admin && c.cntlid.is_some())
            .map(|c| (c.cntlid.unwrap_or(0), c.host_nqn));
        match admin {
            Some((cntlid, host)) if mode < 160 => {
                let qid = self.qids.entry(cntlid).or_insert(0);
                *qid = *qid % MAX_IO_QUEUES + 1;
                let qid = *qid;
                connect(&mut c, qid, 32, 0, cntlid, SUBNQN, host, cattr, s)?;
            }
            _ => {
                let cqe = connect(&mut c, 0, 32, kato, CNTLID_DYNAMIC, SUBNQN, host, 0, s)?;
                if cqe.is_some_and(|c| c.status.is_success()) {
                    for sqe in [
                        PropertySet::new(property::CC, enable_cc(ams) as u64).to_sqe(c.cid()),
                        AdminCommand::SetFeatures(SetFeatures::new(
                            feature_id::NUMBER_OF_QUEUES,
                            NumberOfQueues::with_count(MAX_IO_QUEUES).to_dword(),
                        ))
                        .to_sqe(c.cid()),
                    ] {
                        let cid = c.send_capsule(sqe, &[], s);
                        c.await_answer(cid, s)?;
                    }
                }
            }
        }
        Ok(c)
    }

    fn op(&mut self, code: Op, inp: &mut Input<'_>) -> Result<(), Violation> {
        trace!(
            "op {code:?} on slot {} ({})",
            self.cur,
            match &self.conns[self.cur] {
                None => "empty".to_string(),
                Some(c) => format!(
                    "cntlid {:?} admin {} qid {} closed {} desynced {}",
                    c.cntlid, c.admin, c.qid, c.closed, c.desynced
                ),
            }
        );
        match code {
            Op::Switch => {
                // Switch to another connection, or open a fresh one in
                // its place.
                self.cur = inp.below(MAX_CONNS as u64) as usize;
                if inp.chance(112) {
                    self.conns[self.cur] = None;
                }
                self.conn(inp)?;
            }
            Op::IcReq => self.op_icreq(inp)?,
            Op::ConnectAdmin => self.op_connect(inp, true)?,
            Op::ConnectIo => self.op_connect(inp, false)?,
            Op::Admin => self.op_admin(inp)?,
            Op::Property => self.op_property(inp)?,
            Op::Read => self.op_read(inp)?,
            Op::Write => self.op_write(inp)?,
            Op::AnswerR2t => self.op_answer_r2t(inp)?,
            Op::StrayH2c => self.op_stray_h2c(inp)?,
            Op::MiscIo => self.op_misc_io(inp)?,
            Op::Dsm => self.op_dsm(inp)?,
            Op::RawSqe => self.op_raw_sqe(inp)?,
            Op::Garbage => self.op_garbage(inp)?,
            Op::Mutated => self.op_mutated_pdu(inp)?,
            Op::Split => {
                // Split the next PDUs sent on this connection.
                let at = inp.pick(&[1, 4, 7, 8, 9, 23, 24, 25, 71, 72, 73, 100]);
                self.conn(inp)?.0.split_at = Some(at);
            }
            Op::TermReq => self.op_term_req(inp)?,
            Op::End => self.op_end(inp)?,
            Op::Sync => {
                // Wait for what is outstanding.
                let s = &mut self.stats;
                if let Some(c) = self.conns[self.cur].as_mut() {
                    c.pump(
                        Some(Duration::from_millis(300)),
                        &|c: &Conn| c.unanswered.is_empty(),
                        s,
                    )?;
                }
            }
            Op::Sleep => {
                // Sleep, so that short keep-alive timeouts expire.
                let ms = inp.pick(&[1u64, 2, 5, 60]);
                if self.stats.slept_ms + ms <= 70 {
                    self.stats.slept_ms += ms;
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
            Op::Stall => self.op_stall(inp)?,
            Op::Repeat => {}
        }
        Ok(())
    }

    fn op_icreq(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let v = inp.u8();
        let req = IcReq {
            hpda: match v % 8 {
                0 => 32 + inp.u8() % 224,
                1 | 2 => inp.u8() % 32,
                _ => 0,
            },
            header_digest: v & 0x10 != 0,
            data_digest: v & 0x20 != 0,
            maxr2t: if v & 0x40 != 0 { inp.u32() } else { 0 },
        };
        let raw = inp.chance(40);
        if self.conns[self.cur].is_none() {
            self.stats.connections += 1;
            self.conns[self.cur] = Some(Conn::open(self.addr)?);
        }
        let c = self.conns[self.cur].as_mut().expect("just opened");
        let s = &mut self.stats;
        if raw || (c.ic_req.is_some() && !c.ic_done) {
            // Field changes the encoder would not make (PFV, reserved
            // bytes, a wrong PLEN), or an ICReq while one is unanswered.
            let mut bytes = Pdu::IcReq(req)
                .to_vec(&EncodeConfig::default())
                .unwrap_or_default();
            if raw {
                let at = 8 + inp.below(120) as usize;
                if let Some(b) = bytes.get_mut(at) {
                    *b = inp.u8();
                }
                if inp.chance(64) {
                    let plen = inp.pick(&[0u32, 8, 127, 129, 0xFFFF]);
                    bytes[4..8].copy_from_slice(&plen.to_le_bytes());
                }
            }
            // The target may read this otherwise than we built it: stop
            // interpreting its output on this connection.
            c.opaque = true;
            c.desynced = true;
            c.send(&bytes, s);
            return Ok(());
        }
        if c.ic_done {
            // A second ICReq: the target must end the connection.
            c.send_pdu(&Pdu::IcReq(req), s);
            return Ok(());
        }
        ic(c, req, s)
    }

    fn op_connect(&mut self, inp: &mut Input<'_>, admin: bool) -> Result<(), Violation> {
        let live: Vec<(u16, &'static str)> = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.admin)
            .filter_map(|c| c.cntlid.map(|id| (id, c.host_nqn)))
            .collect();
        let depth = inp.pick(&[32u16, 32, 2, 1, 0, 33, 1024, 0xFFFF]);
        let qid = if admin {
            if inp.chance(16) {
                inp.u16()
            } else {
                0
            }
        } else {
            inp.pick(&[1u16, 1, 2, 3, 4, 5, 0xFFFF])
        };
        let made_up = inp.u16();
        let (ctrl, ctrl_host) = match live.first() {
            Some(&(id, host)) if !admin => (id, host),
            _ => (made_up, HOST_A),
        };
        let cntlid = match inp.u8() % 8 {
            0 => inp.u16(),
            1 => CNTLID_DYNAMIC,
            _ if admin => CNTLID_DYNAMIC,
            _ => ctrl,
        };
        let subnqn = inp.pick(&[
            SUBNQN,
            SUBNQN,
            SUBNQN,
            OPEN_NQN,
            DISCOVERY_NQN,
            "nqn.x:none",
            "",
        ]);
        let hostnqn: &'static str = match inp.u8() % 8 {
            0 => HOST_B,
            1 => HOST_STRANGER,
            2 => "",
            _ if admin => HOST_A,
            _ => ctrl_host,
        };
        let mut cmd = if admin {
            Connect::admin(depth, inp.pick(&[0, 10_000, 50, 1, u32::MAX]))
        } else {
            Connect::io(
                qid,
                depth,
                nvmf_proto::fabrics::PriorityClass::from_bits(inp.u8()),
            )
        };
        cmd.qid = qid;
        let tweak = inp.u8();
        if tweak & 0x01 != 0 {
            cmd.cattr = inp.u8();
        }
        if tweak & 0x02 != 0 {
            cmd.recfmt = inp.u16();
        }
        if tweak & 0x04 != 0 {
            cmd.sgl = inp.pick(&[
                SglDescriptor::in_capsule(0, 512),
                SglDescriptor::in_capsule(16, 1024),
                SglDescriptor::transport(1024),
                SglDescriptor::null(),
            ]);
        }
        let mut data = ConnectData {
            host_id: [inp.u8(); 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .to_bytes()
        .map(|b| b.to_vec())
        .unwrap_or_else(|_| vec![0; 1024]);
        if tweak & 0x08 != 0 {
            // Any byte of the Connect data, e.g. an NQN without its NUL.
            let at = inp.below(1024) as usize;
            data[at] = inp.u8();
        }
        if tweak & 0x10 != 0 {
            data.truncate(inp.pick(&[0, 16, 512, 1000, 1023]));
        }
        let (c, s) = self.conn(inp)?;
        let cid = c.cid();
        c.send_capsule(cmd.to_sqe(cid), &data, s);
        if let Some(cqe) = c.await_answer(cid, s)? {
            if cqe.status.is_success() {
                c.cntlid = Some(cqe.dw0 as u16);
                c.admin = qid == 0;
                c.qid = qid;
                c.host_nqn = hostnqn;
                s.connects_ok += 1;
                if !c.admin {
                    s.io_connects_ok += 1;
                }
            }
        }
        Ok(())
    }

    fn op_admin(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let nsid = inp.pick(&[0u32, 1, 1, 2, 3, 0xFFFF_FFFF, 0xFFFF_FFFE]);
        let sgl_len = |inp: &mut Input<'_>, natural: u32| -> SglDescriptor {
            match inp.u8() % 10 {
                0 => SglDescriptor::transport(inp.pick(&[0, 4, 511, 8192, 65536, 1 << 20])),
                1 => SglDescriptor::in_capsule(0, natural),
                2 => SglDescriptor::null(),
                _ => SglDescriptor::transport(natural),
            }
        };
        let sqe = match inp.u8() % 9 {
            0 | 1 => {
                let mut id = Identify::new(
                    inp.pick(&[
                        cns::NAMESPACE,
                        cns::CONTROLLER,
                        cns::ACTIVE_NAMESPACE_LIST,
                        cns::NAMESPACE_ID_DESCRIPTORS,
                        0x10,
                        0xFF,
                    ]),
                    nsid,
                );
                id.sgl = sgl_len(inp, 4096);
                AdminCommand::Identify(id).to_sqe(0)
            }
            2 | 3 => {
                let lid = inp.pick(&[
                    log_id::ERROR_INFORMATION,
                    log_id::SMART_HEALTH,
                    log_id::FIRMWARE_SLOT,
                    log_id::DISCOVERY,
                    log_id::GIMBAL_VIRTUAL_VIEW,
                    log_id::CHANGED_NAMESPACE_LIST,
                    0xFF,
                ]);
                let mut glp = GetLogPage::new(lid, nsid, 512, 0).expect("valid log page");
                glp.numd = match inp.u8() % 6 {
                    0 => 0,
                    1 => 127,
                    2 => 1023,
                    3 => inp.u32() % (1 << 18),
                    // NUMD is 32 bits: up to 16 GiB asked for.
                    4 => inp.u32() | 0x8000_0000,
                    _ => inp.u32(),
                };

                glp.offset = inp.pick(&[0u64, 0, 4, 512, 4096, u64::MAX - 3]);
                glp.offset_is_index = inp.chance(16);
                glp.rae = inp.chance(64);
                let natural = u32::try_from(glp.data_len())
                    .unwrap_or(u32::MAX)
                    .min(1 << 20);
                glp.sgl = sgl_len(inp, natural);
                AdminCommand::GetLogPage(glp).to_sqe(0)
            }
            4 => {
                let fid = inp.pick(&[
                    feature_id::NUMBER_OF_QUEUES,
                    feature_id::KEEP_ALIVE_TIMER,
                    feature_id::ARBITRATION,
                    feature_id::ASYNC_EVENT_CONFIGURATION,
                    feature_id::VOLATILE_WRITE_CACHE,
                    feature_id::HOST_IDENTIFIER,
                    0,
                    0xFF,
                ]);
                let cdw11 = match inp.u8() % 4 {
                    0 => 0xFFFF_FFFF,
                    1 => NumberOfQueues::with_count(1 + inp.u16() % 8).to_dword(),
                    _ => inp.u32(),
                };
                AdminCommand::SetFeatures(SetFeatures::new(fid, cdw11)).to_sqe(0)
            }
            5 => {
                let mut gf = GetFeatures::new(inp.pick(&[
                    feature_id::NUMBER_OF_QUEUES,
                    feature_id::KEEP_ALIVE_TIMER,
                    feature_id::ARBITRATION,
                    feature_id::ASYNC_EVENT_CONFIGURATION,
                    feature_id::VOLATILE_WRITE_CACHE,
                    0x42,
                ]));
                gf.select = inp.u8() & 7;
                AdminCommand::GetFeatures(gf).to_sqe(0)
            }
            6 => Sqe::new(admin_opcode::KEEP_ALIVE, 0),
            7 => Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, 0),
            _ => {
                let mut sqe = Sqe::new(
                    inp.pick(&[
                        admin_opcode::CREATE_IO_SQ,
                        admin_opcode::DELETE_IO_SQ,
                        admin_opcode::ABORT,
                        0x80,
                        0xC1,
                    ]),
                    0,
                );
                sqe.cdw10 = inp.u32();
                sqe.cdw11 = inp.u32();
                sqe
            }
        };
        let mut sqe = sqe;
        if inp.chance(24) {
            sqe.flags = inp.u8();
        }
        let (c, s) = self.conn_for(false, inp)?;
        sqe.cid = c.cid();
        c.send_capsule(sqe, &[], s);
        if sqe.opcode != admin_opcode::ASYNC_EVENT_REQUEST {
            c.await_answer(sqe.cid, s)?;
        }
        Ok(())
    }

    fn op_property(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let offset = inp.pick(&[
            property::CAP,
            property::VS,
            property::CC,
            property::CC,
            property::CSTS,
            property::NSSR,
            0x1000,
        ]);
        let mut sqe = if inp.chance(96) {
            PropertyGet::new(offset).to_sqe(0)
        } else {
            let value = match inp.u8() % 6 {
                0 => u64::from(enable_cc(inp.pick(&[0, 1, 2, 7]))),
                1 => 0,
                2 => u64::from(enable_cc(0) | 1 << 14),
                3 => u64::from(enable_cc(0) | 2 << 14),
                4 => u64::from(inp.u32()),
                _ => inp.u64(),
            };
            PropertySet::new(property::CC, value).to_sqe(0)
        };
        if inp.chance(32) {
            // Another access size or reserved ATTRIB bits.
            sqe.cdw10 = u32::from(inp.u8());
        }
        if inp.chance(16) {
            sqe.cdw11 = offset;
        }
        let (c, s) = self.conn_for(false, inp)?;
        sqe.cid = c.cid();
        c.send_capsule(sqe, &[], s);
        c.await_answer(sqe.cid, s)?;
        Ok(())
    }

    /// A namespace, an LBA range and a block size, mostly valid.
    fn io_target(inp: &mut Input<'_>) -> (u32, u64, u32, u32) {
        let nsid = inp.pick(&[1u32, 1, 1, 1, 2, 2, 2, 0, 3, 0xFFFF_FFFF]);
        let (blocks, bs) = match nsid {
            2 => (NS2_BLOCKS, 4096),
            _ => (NS1_BLOCKS, 512),
        };
        let max_blocks = u64::from(MDTS / bs);
        let (slba, count) = match inp.u8() % 12 {
            0 => (blocks - 1, 1 + inp.below(4)),
            1 => (inp.u64(), 1 + inp.below(max_blocks)),
            2 => (u64::MAX - inp.below(4), 1 + inp.below(8)),
            3 => (inp.below(blocks), 1 + inp.below(65536)),
            _ => {
                let count = 1 + inp.below(max_blocks);
                (inp.below(blocks - count), count)
            }
        };
        (nsid, slba, count as u32, bs)
    }

    fn op_read(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let (nsid, slba, count, bs) = Self::io_target(inp);
        let len = count.saturating_mul(bs);
        let mut rw = nvmf_proto::command::ReadWrite::new(
            nsid,
            slba,
            count.clamp(1, 65536),
            SglDescriptor::transport(len),
        )
        .expect("count in range");
        match inp.u8() % 12 {
            0 => rw.sgl = SglDescriptor::transport(len.wrapping_add(inp.pick(&[1, 512, u32::MAX]))),
            1 => rw.sgl = SglDescriptor::in_capsule(0, len),
            2 => rw.sgl = SglDescriptor::from_bytes(&[inp.u8(); 16]),
            3 => rw.fua = true,
            _ => {}
        }
        let wait = inp.chance(128);
        let (c, s) = self.conn_for(true, inp)?;
        let cid = c.cid();
        c.send_capsule(IoCommand::Read(rw).to_sqe(cid), &[], s);
        if wait {
            c.await_answer(cid, s)?;
        }
        Ok(())
    }

    fn op_write(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let (nsid, slba, count, bs) = Self::io_target(inp);
        let len = count.saturating_mul(bs);
        // 0-2: in the capsule when it fits, 3: in the capsule anyway, 4: at
        // a non-zero SGL offset, 5: transport SGL with capsule data, 6: a
        // transport SGL half as long, 7-9: transport (R2T).
        let mode = inp.u8() % 10;
        let in_capsule = match mode {
            0..=2 => len <= IN_CAPSULE,
            3 | 4 => len <= IN_CAPSULE * 4,
            _ => false,
        };
        let sgl = if in_capsule {
            SglDescriptor::in_capsule(if mode == 4 { 16 } else { 0 }, len)
        } else {
            SglDescriptor::transport(if mode == 6 { len / 2 } else { len })
        };
        let rw = nvmf_proto::command::ReadWrite::new(nsid, slba, count.clamp(1, 65536), sgl)
            .expect("count in range");
        let data_len = if in_capsule {
            match inp.u8() % 8 {
                0 => len as usize / 2,
                1 => len as usize + 4,
                _ => len as usize,
            }
        } else if mode == 5 {
            512
        } else {
            0
        };
        let data = pattern(data_len, inp.u32());
        let answer = inp.u8();
        let (c, s) = self.conn_for(true, inp)?;
        let cid = c.cid();
        c.send_capsule(IoCommand::Write(rw).to_sqe(cid), &data, s);
        if answer < 160 {
            c.await_answer(cid, s)?;
            // Answer our own R2T at once, in full: the common path.
            if answer < 128 {
                if let Some(pos) = c.r2ts.iter().position(|r| r.cccid == cid) {
                    let r2t = c.r2ts.remove(pos).expect("found");
                    let data = pattern(r2t.r2tl as usize, u32::from(cid));
                    let full: Vec<u8> = std::iter::repeat_n(0, r2t.r2to as usize)
                        .chain(data)
                        .collect();
                    send_h2c_all(c, &r2t, &full, s);
                }
            }
        }
        Ok(())
    }

    /// Answers a pending R2T, in full or with one thing wrong.
    fn op_answer_r2t(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let fault = inp.u8() % 16;
        let odd_piece = 1 + inp.below(4096) as usize;
        let bad_offset = inp.pick(&[1, 4, 4096, 0x8000_0000]);
        let (c, s) = self.conn(inp)?;
        // Wait for an R2T only while a command is still unanswered.
        let wait = (c.r2ts.is_empty() && !c.unanswered.is_empty() && !c.desynced)
            .then_some(Duration::from_millis(50));
        c.pump(wait, &|c: &Conn| !c.r2ts.is_empty(), s)?;
        let Some(r2t) = c.r2ts.pop_front() else {
            return Ok(());
        };
        let total = r2t.r2tl as usize;
        let piece = match fault {
            0 => c.maxh2cdata as usize + 4,
            1 => 4,
            2 => odd_piece,
            _ => c.maxh2cdata.max(4) as usize,
        };
        let mut off = 0usize;
        let mut sent = 0;
        while off < total && sent < 64 {
            let n = piece.min(total - off);
            let mut h = H2CData {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                datao: r2t.r2to + off as u32,
                last: off + n == total,
                data: pattern(n, u32::from(r2t.cccid) + off as u32).into(),
            };
            let first = sent == 0;
            match fault {
                3 if first => h.ttag = h.ttag.wrapping_add(1),
                4 if first => h.cccid = h.cccid.wrapping_add(1),
                5 if first => h.datao = h.datao.wrapping_add(bad_offset),
                6 if first => h.last = !h.last,
                7 if off + n == total => h.last = false,
                8 if first => {
                    // A duplicate of the first piece.
                    s.h2c_pdus += 1;
                    c.send_pdu(&Pdu::H2CData(h.clone()), s);
                }
                9 if off + n == total => break, // stop short: the command stays pending
                _ => {}
            }
            s.h2c_pdus += 1;
            if fault == 10 && first && c.enc.data_digest {
                let mut bytes = Pdu::H2CData(h).to_vec(&c.enc).unwrap_or_default();
                if let Some(last) = bytes.last_mut() {
                    *last ^= 0xFF;
                }
                c.send(&bytes, s);
            } else {
                c.send_pdu(&Pdu::H2CData(h), s);
            }
            off += n;
            sent += 1;
        }
        Ok(())
    }

    /// An H2CData nobody asked for, or with made-up fields.
    fn op_stray_h2c(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let cccid_pick = inp.u8();
        let ttag = inp.u16();
        let datao = inp.pick(&[0u32, 0, 512, 4096, u32::MAX - 511, 0x7FFF_FFFF]);
        let len = inp.pick(&[1usize, 4, 512, 4096, 8192, 8196, 65536]);
        let last = inp.chance(128);
        let (c, s) = self.conn(inp)?;
        let cccid = match (cccid_pick % 4, c.unanswered.iter().next_back()) {
            (0, Some(&cid)) => cid,
            (1, _) => c.next_cid,
            _ => u16::from(cccid_pick) << 8 | u16::from(cccid_pick),
        };
        s.h2c_pdus += 1;
        c.send_pdu(
            &Pdu::H2CData(H2CData {
                cccid,
                ttag,
                datao,
                last,
                data: pattern(len, 7).into(),
            }),
            s,
        );
        Ok(())
    }

    fn op_misc_io(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let (nsid, slba, count, _) = Self::io_target(inp);
        let mut sqe = match inp.u8() % 3 {
            0 => IoCommand::Flush { nsid }.to_sqe(0),
            1 => IoCommand::WriteZeroes(nvmf_proto::command::WriteZeroes {
                nsid,
                slba,
                nlb: (count.max(1) - 1) as u16,
                deallocate: inp.chance(128),
                fua: inp.chance(64),
                limited_retry: false,
            })
            .to_sqe(0),
            _ => {
                let mut s = Sqe::new(inp.pick(&[0x04, 0x05, 0x0C, 0x11, 0x80, 0xFE]), 0);
                s.nsid = nsid;
                s.cdw10 = inp.u32();
                s
            }
        };
        if inp.chance(16) {
            sqe.dptr = SglDescriptor::transport(inp.u32());
        }
        let (c, s) = self.conn_for(true, inp)?;
        sqe.cid = c.cid();
        c.send_capsule(sqe, &[], s);
        Ok(())
    }

    fn op_dsm(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let nsid = inp.pick(&[1u32, 1, 2, 3]);
        let nr = inp.pick(&[0u8, 0, 1, 3, 255]);
        let ranges: Vec<DsmRange> = (0..=usize::from(nr).min(7))
            .map(|_| DsmRange {
                context_attributes: 0,
                block_count: inp.pick(&[1u32, 8, 64, 0, u32::MAX]),
                slba: inp.pick(&[0u64, 100, NS2_BLOCKS - 1, NS1_BLOCKS - 8, u64::MAX - 1]),
            })
            .collect();
        let mut list = DsmRange::encode_list(&ranges).unwrap_or_default();
        match inp.u8() % 6 {
            0 => list.resize(256 * DSM_RANGE_LEN, 0), // as Linux sends
            1 => list.truncate(list.len().saturating_sub(8)),
            _ => {}
        }
        let attributes = inp.pick(&[dsm_attr::DEALLOCATE, 0, dsm_attr::IDR, u32::MAX]);
        let r2t = inp.chance(64) || list.len() > IN_CAPSULE as usize;
        let mut sqe = IoCommand::DatasetManagement(nvmf_proto::command::DatasetManagement {
            nsid,
            nr,
            attributes,
            sgl: if r2t {
                SglDescriptor::transport(list.len() as u32)
            } else {
                SglDescriptor::in_capsule(0, list.len() as u32)
            },
        })
        .to_sqe(0);
        let (c, s) = self.conn_for(true, inp)?;
        sqe.cid = c.cid();
        c.send_capsule(sqe, if r2t { &[] } else { &list }, s);
        c.await_answer(sqe.cid, s)?;
        if let Some(pos) = c.r2ts.iter().position(|r| r.cccid == sqe.cid) {
            let r2t = c.r2ts.remove(pos).expect("found");
            send_h2c_all(c, &r2t, &list, s);
        }
        Ok(())
    }

    /// Any SQE at all, with or without in-capsule data.
    fn op_raw_sqe(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let mut raw = [0u8; 64];
        for b in raw.iter_mut() {
            *b = inp.u8();
        }
        let mut sqe = Sqe::from_bytes(&raw);
        if inp.chance(128) {
            sqe.opcode = inp.pick(&[
                io_opcode::READ,
                io_opcode::WRITE,
                io_opcode::WRITE_ZEROES,
                io_opcode::DATASET_MANAGEMENT,
                admin_opcode::GET_LOG_PAGE,
                admin_opcode::IDENTIFY,
                admin_opcode::FABRICS,
            ]);
            sqe.nsid = inp.pick(&[1, 2, sqe.nsid]);
        }
        let data = if inp.chance(64) {
            pattern(inp.pick(&[1, 16, 1024, 4096, 4100]), 3)
        } else {
            Vec::new()
        };
        let (c, s) = self.conn(inp)?;
        c.send_capsule(sqe, &data, s);
        Ok(())
    }

    fn op_garbage(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let len = inp.pick(&[1usize, 7, 8, 24, 72, 128, 1000, 4096]);
        let mut bytes = inp.bytes(len);
        if len >= 8 && inp.chance(128) {
            // A plausible common header, so the garbage gets past byte 0.
            bytes[0] = inp.below(10) as u8;
            bytes[1] &= 0x0F;
            bytes[2] = inp.pick(&[8, 24, 72, 128]);
            bytes[3] = inp.pick(&[0, 24, 72, 76]);
            let plen = inp.pick(&[len as u32, 24, 72, 0x7FFF_FFFF, 9000]);
            bytes[4..8].copy_from_slice(&plen.to_le_bytes());
        }
        let (c, s) = self.conn(inp)?;
        c.desynced = true;
        c.send(&bytes, s);
        Ok(())
    }

    /// A valid PDU with header fields changed.
    fn op_mutated_pdu(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let kind = inp.u8() % 4;
        let (c, s) = self.conn(inp)?;
        let cid = c.cid();
        let pdu = match kind {
            0 => Pdu::CapsuleCmd(CapsuleCmd::new(IoCommand::Flush { nsid: 1 }.to_sqe(cid))),
            1 => Pdu::CapsuleCmd(
                CapsuleCmd::with_data(
                    IoCommand::write(1, 0, 1, SglDescriptor::in_capsule(0, 512))
                        .expect("valid")
                        .to_sqe(cid),
                    pattern(512, 9),
                )
                .expect("valid"),
            ),
            2 => Pdu::H2CData(H2CData {
                cccid: c.r2ts.front().map_or(cid, |r| r.cccid),
                ttag: c.r2ts.front().map_or(0, |r| r.ttag),
                datao: 0,
                last: true,
                data: pattern(512, 5).into(),
            }),
            _ => Pdu::IcReq(IcReq::default()),
        };
        let mut bytes = pdu.to_vec(&c.enc).unwrap_or_default();
        for _ in 0..1 + inp.below(3) {
            let op = inp.u8() % 8;
            let value = inp.u8();
            let plen = inp.pick(&[0u32, 8, 24, 71, 72, 73, 600, 0xFFFF_FFFF]);
            let at = inp.below(bytes.len().max(1) as u64) as usize;
            if bytes.len() < 8 {
                break;
            }
            match op {
                0 => bytes[0] = value % 12,
                1 => bytes[1] = value,
                2 => bytes[2] = [0, 8, 23, 24, 72, 128, 255][usize::from(value) % 7],
                3 => bytes[3] = [0, 8, 24, 28, 72, 76, 80, 255][usize::from(value) % 8],
                4 => bytes[4..8].copy_from_slice(&plen.to_le_bytes()),
                5 => bytes[at] ^= 1 << (value % 8),
                6 => bytes.truncate(at),
                _ => {
                    // Refresh the header digest so the change gets past it.
                    let hlen = usize::from(bytes[2]);
                    if c.enc.header_digest && bytes.len() >= hlen + 4 && hlen >= 8 {
                        let d = crc32c(&bytes[..hlen]).to_le_bytes();
                        bytes[hlen..hlen + 4].copy_from_slice(&d);
                    }
                }
            }
        }
        if bytes.first() == Some(&pdu_type::IC_REQ) {
            c.opaque = true;
        }
        c.desynced = true;
        c.unanswered.insert(cid);
        c.send(&bytes, s);
        Ok(())
    }

    /// Stop reading this connection's answers, then flood it with
    /// MDTS-sized Reads and transport Writes.
    fn op_stall(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let writes = inp.chance(128);
        let (c, s) = self.conn_for(true, inp)?;
        c.stalled = true;
        let mut bytes = Vec::new();
        for i in 0..FLOOD_COMMANDS {
            let cid = c.cid();
            let blocks = MDTS / 512;
            let lba = (i as u64 * u64::from(blocks)) % (NS1_BLOCKS - u64::from(blocks));
            let cmd = if writes && i % 2 == 1 {
                IoCommand::write(1, lba, blocks, SglDescriptor::transport(MDTS))
            } else {
                IoCommand::read(1, lba, blocks, MDTS)
            };
            let sqe = cmd.expect("valid").to_sqe(cid);
            let _ = Pdu::CapsuleCmd(CapsuleCmd::new(sqe)).encode(&c.enc, &mut bytes);
        }
        s.commands += FLOOD_COMMANDS as u64;
        c.send(&bytes, s);
        // Give the target time to take them in.
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }

    fn op_term_req(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        let fes = FatalErrorStatus(inp.pick(&[1, 2, 3, 4, 5, 6, 0, 0xFF]));
        let len = inp.pick(&[0usize, 8, 128, 129]);
        let (c, s) = self.conn(inp)?;
        let term = TermReq {
            fes,
            fei: 0,
            data: pattern(len.min(128), 1).into(),
        };
        let mut bytes = Pdu::term_req(Role::Host, term)
            .to_vec(&c.enc)
            .unwrap_or_default();
        if len > 128 && bytes.len() >= 8 {
            // One byte more than a TermReq may carry.
            bytes.push(0);
            let plen = bytes.len() as u32;
            bytes[4..8].copy_from_slice(&plen.to_le_bytes());
        }
        c.send(&bytes, s);
        Ok(())
    }

    fn op_end(&mut self, inp: &mut Input<'_>) -> Result<(), Violation> {
        match inp.u8() % 4 {
            0 => {
                let (c, s) = self.conn(inp)?;
                let cid = c.cid();
                c.send_capsule(Disconnect::default().to_sqe(cid), &[], s);
                c.await_answer(cid, s)?;
            }
            1 => {
                // Half-close: the target sees EOF and may still answer.
                let (c, s) = self.conn(inp)?;
                let _ = c.stream.shutdown(Shutdown::Write);
                c.pump(Some(Duration::from_millis(100)), &|c: &Conn| c.closed, s)?;
                c.closed = true;
            }
            _ => self.conns[self.cur] = None,
        }
        Ok(())
    }
}
