//! Host-side, noise-free cost of the ublk-nvmf client path per request:
//! instruction counts (callgrind) of what one ublk queue thread does for a
//! read or a write, from the ublk descriptor to the tag's completion.
//!
//! The code per request is the daemon's: `mapping::map_request` (the tag
//! task), the [`Requests`] core (QoS stage with the default volume config,
//! fan-out), the initiator's [`Queue`] core (capsule and H2CData headers
//! into the send buffer with large write data left in place,
//! C2HData/R2T/CapsuleResp decoding, read data copied into the tag's buffer
//! or received straight into it, as the engine's `rx_task` decides). The
//! engine's glue (`Engine::submit`, `drain_events`, `rx_place`,
//! `on_direct`, `tx_gather`, `on_sent`, `poll_result`, the tag task's
//! accounting) is mirrored below function by function, since an `Engine`
//! needs a live controller and an io_uring; its pure helpers
//! (`direct_place`, `buffered_len`, `gather`, `iovecs`) are called as they
//! are.
//!
//! The target is the initiator's sans-IO fake target
//! (`nvmf_initiator::fake_target`, already a dev-dependency through the
//! `test-support` feature), set up with gimbal-target's wire limits (MDTS
//! 1 MiB, 8 KiB in-capsule data, MAXH2CDATA 128 KiB, a read's data in one
//! C2HData PDU followed by a CapsuleResp, one R2T for a whole write), so
//! the client sees the PDU stream a gimbal-target `null` namespace sends.
//! gimbal-target itself would need tokio, its threads and TCP sockets (its
//! connection has no sans-IO core), which is neither one thread nor
//! deterministic. The "sockets" are two in-memory byte streams; copying
//! bytes through them stands for the kernel's copy and is not counted.
//!
//! QD 32 on one thread. Each loop: the tx task sends what the queue has
//! (one `gather` of up to `TX_LIMIT` per `SendMsg`), the target answers,
//! then the rx task receives everything the target sent, in receives of
//! the size the engine asks for (or straight into the tag buffer), and the
//! woken tag tasks complete their requests and submit the next ones at
//! once. The
//! socket is back-logged (a receive gets all it asks for, as when the
//! client is the bottleneck); `seg=BYTES` caps what one receive returns
//! (data arriving in segments, which lets more read data go direct).
//! Clocks are virtual (a 50 µs round trip per exchange, nothing else takes
//! time), so the QoS stage sees the same latencies every run.
//!
//! Only the client's functions are counted: run callgrind with collection
//! on inside the `host_*` functions below and nowhere else (they never call
//! each other, since each entry toggles collection).
//!
//! ```sh
//! cargo build --release -p ublk-target --example client_path_cost
//! T=target/release/examples/client_path_cost
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='client_path_cost::host_*' \
//!     --callgrind-out-file=cg.%p $T 20000 4k read
//! # and 40000: Ir per request = (Ir(40000) - Ir(20000)) / 20000
//! $T 20000 128k write [auto|off|target|estimate] [seg=65536]   # modes and options
//! ```

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_initiator::fake_target::{FakeConfig, FakeConnection, FakeTarget};
use nvmf_initiator::{Event, Queue, QueueConfig, Request};
use qos_core::priority::NvmeClass;
use qos_core::Nanos;
use ublk_target::config::VolumeConfig;
use ublk_target::io::engine::{
    buffered_len, direct_place, gather, iovecs, Placed, MAX_TX_IOVECS, RX_BYTES, TX_LIMIT,
};
use ublk_target::io::mapping::{self, Geometry, Op, Plan, ReqFlags};
use ublk_target::io::requests::{PartSink, Requests, Submission, TagBuf};
use ublk_target::qos::{parse_mode, LimitKind, QueueQos, VolumeQos};
use ublk_target::volume::Stats;

const HOST: &str = "nqn.2026-01.io.test:client-path-cost";
const SUBNQN: &str = "nqn.2026-01.io.test:null";
const BS: u32 = 512;
/// Namespace size: sequential requests wrap around in it.
const NS_BYTES: u64 = 64 << 20;
/// ublk tags (the volume's default `queue_depth`) and NVMe queue depth.
const TAGS: u16 = 64;
/// Requests in flight (fio's iodepth).
const QD: u16 = 32;
/// Virtual round trip (network and target) between a send and its
/// answers; receiving takes no virtual time (the client, not the link, is
/// the bottleneck). The default (`auto`) window then grows past QD 32
/// within a few rounds and the gate admits every request at once: the
/// counts are the QoS stage's code, not its waiting.
const RTT_NS: u64 = 50_000;

/// The engine's `Path`: one NVMe/TCP I/O queue and what waits for it.
struct Conn {
    queue: Queue<TagBuf>,
    held: VecDeque<Request<TagBuf>>,
    /// The tx task was woken.
    tx_woken: bool,
    /// `Path::rx_direct_tag`.
    rx_direct_tag: Option<u16>,
}

/// The engine's `PathSink` (one replica, one class).
struct Sink<'a> {
    conn: &'a mut Conn,
    now: Instant,
}

impl PartSink for Sink<'_> {
    fn send(&mut self, _replica: usize, _class: NvmeClass, req: Request<TagBuf>) {
        match self.conn.queue.submit(self.now, req) {
            Err(rej) => self.conn.held.push_back(rej.request),
            Ok(()) => self.conn.tx_woken = true,
        }
    }

    fn reset_replica(&mut self, _replica: usize) {}
}

/// One ublk queue thread's client side.
struct Host {
    requests: Requests,
    conn: Conn,
    stats: Arc<Stats>,
    geo: Geometry,
    op: Op,
    io_bytes: u32,
    bufs: Vec<Box<[u8]>>,
    /// Per tag: its task waits with a waker stored (`Engine::wakers`).
    waiting: Vec<bool>,
    /// Tags whose task was woken, to run next.
    woken: Vec<u16>,
    /// `Engine::tx_pins`.
    tx_pins: Vec<u32>,
    base: Instant,
    now_ns: u64,
    next_sector: u64,
    /// Requests still to start / completed.
    to_issue: u64,
    completed: u64,
    failed: u64,
}

impl Host {
    fn instant(&self) -> Instant {
        self.base + Duration::from_nanos(self.now_ns)
    }

    /// `Engine::split`.
    fn split(&mut self, now: Instant) -> (&mut Requests, Sink<'_>) {
        (
            &mut self.requests,
            Sink {
                conn: &mut self.conn,
                now,
            },
        )
    }

    /// `wake(&mut self.wakers[tag])`.
    fn wake(&mut self, tag: u16) {
        let w = &mut self.waiting[usize::from(tag)];
        if *w {
            *w = false;
            self.woken.push(tag);
        }
    }

    /// `Engine::after_requests`.
    fn after_requests(&mut self) {
        for tag in self.requests.take_finished() {
            let w = &mut self.waiting[usize::from(tag)];
            if *w {
                *w = false;
                self.woken.push(tag);
            }
        }
        // The pacing task would be woken here.
        std::hint::black_box(self.requests.timer());
    }

    /// `Engine::drain_events`.
    fn drain_events(&mut self) {
        let mut clock: Option<(Instant, Nanos)> = None;
        while let Some(ev) = self.conn.queue.poll_event() {
            match ev {
                Event::Connected { .. } => {}
                Event::Completed(done) => {
                    let (at, now) = *clock.get_or_insert_with(|| {
                        let at = self.instant();
                        (at, self.requests.now(at))
                    });
                    let (req, mut sink) = self.split(at);
                    req.on_completion(now, 0, &done, &mut sink);
                }
                Event::Failed(e) => panic!("queue failed: {e}"),
            }
        }
        if let Some((at, now)) = clock {
            let (req, mut sink) = self.split(at);
            req.pump_if_queued(now, &mut sink);
            self.after_requests();
        }
        if self.conn.queue.has_transmit() {
            self.conn.tx_woken = true;
        }
    }
}

/// The tag task from a new descriptor to `Engine::submit`.
#[inline(never)]
fn host_submit(h: &mut Host, tag: u16) {
    submit(h, tag);
}

/// The body of [`host_submit`], also called from [`host_tag_woken`]:
/// callgrind's `--toggle-collect` toggles on every entry of a matching
/// function, so `host_*` functions must not call each other.
fn submit(h: &mut Host, tag: u16) {
    // The tag task awaits `TagWait` right after `Engine::submit`.
    h.waiting[usize::from(tag)] = true;
    let nr_sectors = h.io_bytes >> 9;
    let start_sector = h.next_sector;
    h.next_sector = (h.next_sector + u64::from(nr_sectors)) % (NS_BYTES >> 9);
    h.to_issue -= 1;
    let plan = mapping::map_request(&h.geo, h.op, start_sector, nr_sectors, ReqFlags::default());
    let Plan::Send {
        command, data_len, ..
    } = plan
    else {
        panic!("{plan:?}");
    };
    let b = &mut h.bufs[usize::from(tag)];
    // SAFETY: the buffers live as long as `h` and are not touched while
    // their tag's request is in the core.
    let data = Some(unsafe { TagBuf::exclusive(b.as_mut_ptr(), data_len as usize) });
    let kind = match h.op {
        Op::Read => LimitKind::Read,
        _ => LimitKind::Write,
    };
    let start = start_sector << 9;
    let write = (h.op == Op::Write).then(|| start..start + (u64::from(nr_sectors) << 9));
    // Engine::submit
    let at = h.instant();
    let now = h.requests.now(at);
    let (req, mut sink) = h.split(at);
    req.submit(
        now,
        Submission {
            tag,
            command,
            buf: data,
            kind,
            bytes: u64::from(nr_sectors) << 9,
            class: NvmeClass::Medium,
            write,
        },
        &mut sink,
    );
    h.after_requests();
}

/// The tx task's turn: `Engine::tx_gather` (one send's worth of PDUs,
/// tags pinned) and the iovecs of its `SendMsg`.
#[inline(never)]
fn host_tx(
    h: &mut Host,
    buf: &mut Vec<u8>,
    placed: &mut Vec<Placed>,
    iov: &mut Vec<libc::iovec>,
) -> usize {
    h.conn.tx_woken = false;
    let n = gather(&mut h.conn.queue, buf, placed, &|_| None);
    for d in placed.iter() {
        h.tx_pins[usize::from(d.tag)] += 1;
    }
    h.stats.sends.fetch_add(1, Ordering::Relaxed);
    iovecs(buf, placed, iov);
    n
}

/// `Engine::on_sent`: the send is done, its tags are unpinned.
#[inline(never)]
fn host_sent(h: &mut Host, placed: &[Placed]) {
    for d in placed {
        let t = usize::from(d.tag);
        h.tx_pins[t] -= 1;
        if h.tx_pins[t] == 0 {
            h.wake(d.tag);
        }
    }
}

/// What the rx task's next receive is (`Engine::rx_place`,
/// `Engine::rx_len`): straight into a tag's buffer, or this many bytes
/// into the thread's receive buffer.
enum RxNext {
    Direct(*mut u8, usize),
    Buffered(usize),
}

#[inline(never)]
fn host_rx_next(h: &mut Host) -> RxNext {
    match direct_place(&mut h.conn.queue) {
        Some((tag, ptr, len)) => {
            h.conn.rx_direct_tag = Some(tag);
            RxNext::Direct(ptr, len)
        }
        None => RxNext::Buffered(buffered_len(&h.conn.queue)),
    }
}

/// `Engine::on_direct`.
#[inline(never)]
fn host_on_direct(h: &mut Host, n: usize) {
    let tag = h.conn.rx_direct_tag.take();
    let now = h.instant();
    h.conn.queue.handle_direct(now, n);
    h.drain_events();
    if let Some(t) = tag {
        h.wake(t);
    }
}

/// `Engine::on_bytes`.
#[inline(never)]
fn host_on_bytes(h: &mut Host, bytes: &[u8]) {
    let now = h.instant();
    h.conn.queue.handle_bytes(now, bytes);
    h.drain_events();
}

/// A woken tag task: `Engine::poll_result`, the tag task's accounting and
/// result, and its next request. Returns whether the tag had finished.
#[inline(never)]
fn host_tag_woken(h: &mut Host, tag: u16) -> bool {
    if h.conn.rx_direct_tag == Some(tag) || h.tx_pins[usize::from(tag)] > 0 {
        h.waiting[usize::from(tag)] = true;
        return false;
    }
    let Some(ok) = h.requests.take_result(tag) else {
        h.waiting[usize::from(tag)] = true;
        return false;
    };
    let nr_sectors = h.io_bytes >> 9;
    if ok {
        let bytes = u64::from(nr_sectors) << 9;
        let s = &h.stats;
        let (n, b) = match h.op {
            Op::Read => (&s.reads, &s.read_bytes),
            _ => (&s.writes, &s.write_bytes),
        };
        n.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes, Ordering::Relaxed);
        let c = NvmeClass::Medium.index();
        s.class_ios[c].fetch_add(1, Ordering::Relaxed);
        s.class_bytes[c].fetch_add(bytes, Ordering::Relaxed);
    } else {
        h.failed += 1;
    }
    std::hint::black_box(mapping::result_for(ok, nr_sectors));
    h.completed += 1;
    if h.to_issue > 0 {
        submit(h, tag);
    }
    true
}

/// Target → host bytes: what the socket holds.
#[derive(Default)]
struct Wire {
    buf: Vec<u8>,
    pos: usize,
}

impl Wire {
    fn push(&mut self, bytes: &[u8]) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn available(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A receive of at most `len` bytes into `dst` (the kernel's copy).
    #[inline(never)]
    fn recv(&mut self, dst: *mut u8, len: usize) -> usize {
        let n = len.min(self.available());
        // SAFETY: `dst` is valid for `len` bytes (a receive buffer or the
        // place `rx_direct` offered), distinct from `self.buf`.
        unsafe { std::ptr::copy_nonoverlapping(self.buf[self.pos..].as_ptr(), dst, n) };
        self.pos += n;
        n
    }
}

/// The kernel's side of a `SendMsg`: the iovecs' bytes, in order.
#[inline(never)]
fn wire_send(iov: &[libc::iovec], out: &mut Vec<u8>) {
    out.clear();
    for v in iov {
        // SAFETY: `iovecs` built them from the send buffer and pinned tag
        // buffers, untouched since.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
        });
    }
}

/// Admin Connect, then I/O queue 1, against `t`, in memory.
fn connect(t: &Arc<FakeTarget>, now: Instant) -> (Queue<TagBuf>, FakeConnection) {
    let admin_cfg = QueueConfig::admin(HOST, [7; 16], SUBNQN, 5000);
    let mut admin: Queue<Vec<u8>> = Queue::new(admin_cfg.clone(), now);
    let mut ac = t.connection();
    exchange(&mut admin, &mut ac, now);
    assert!(admin.is_live(), "admin queue up");
    let mut io = QueueConfig::io(&admin_cfg, 1, admin.cntlid(), TAGS);
    io.max_transfer_bytes = 1 << 20;
    io.in_capsule_bytes = t.config().ioccsz * 16 - 64;
    let mut q: Queue<TagBuf> = Queue::new(io, now);
    let mut c = t.connection();
    exchange(&mut q, &mut c, now);
    assert!(
        matches!(q.poll_event(), Some(Event::Connected { .. })),
        "I/O queue up"
    );
    (q, c)
}

fn exchange<B: AsRef<[u8]> + AsMut<[u8]>>(q: &mut Queue<B>, c: &mut FakeConnection, now: Instant) {
    for _ in 0..100 {
        let mut out = Vec::new();
        while q.poll_transmit(&mut out, 64 * 1024) > 0 {}
        if !out.is_empty() {
            c.handle_bytes(&out);
        }
        let back = c.take_output();
        if !back.is_empty() {
            q.handle_bytes(now, &back);
        }
        if out.is_empty() && back.is_empty() {
            return;
        }
    }
    panic!("exchange did not settle");
}

fn parse_size(s: &str) -> u32 {
    let s = s.to_ascii_lowercase();
    let (num, mult) = match s.as_bytes().last() {
        Some(b'k') => (&s[..s.len() - 1], 1024),
        Some(b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (&s[..], 1),
    };
    num.parse::<u32>().expect("size: N, Nk or Nm") * mult
}

#[derive(Default, Debug)]
struct Counters {
    /// Bytes handed to `handle_bytes` (copied out of the receive buffer).
    rx_bytes: u64,
    rx_calls: u64,
    /// Bytes received straight into tag buffers.
    direct_bytes: u64,
    direct_calls: u64,
    /// Bytes gathered into the send buffer, bytes sent from tag buffers in
    /// place, and sends.
    tx_bytes: u64,
    tx_in_place: u64,
    tx_calls: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let io_bytes = args.get(1).map_or(4096, |s| parse_size(s));
    let op = match args.get(2).map(String::as_str) {
        None | Some("read") => Op::Read,
        Some("write") => Op::Write,
        Some(o) => panic!("mode {o}: read or write"),
    };
    let mut credits = None;
    let mut seg = usize::MAX;
    for a in args.iter().skip(3) {
        if let Some(v) = a.strip_prefix("seg=") {
            seg = parse_size(v) as usize;
        } else {
            credits = Some(parse_mode(a).expect("auto, target, estimate or off"));
        }
    }
    assert!(io_bytes % BS == 0 && io_bytes <= 1 << 20);

    // The default volume config (`credits = "auto"`), one target.
    let toml = format!(
        "name = \"cost\"\n[target]\naddress = \"127.0.0.1\"\nport = 4420\nsubnqn = \"{SUBNQN}\"\nnsid = 1\n"
    );
    let mut cfg = VolumeConfig::parse(Path::new("cost.toml"), &toml).expect("config");
    if let Some(c) = credits {
        cfg.qos.credits = c;
    }
    let target = FakeTarget::new(FakeConfig {
        subnqn: SUBNQN.into(),
        blocks: NS_BYTES / u64::from(BS),
        block_size: BS,
        // gimbal-target's defaults (`[limits]`): MDTS 1 MiB, 8 KiB of
        // in-capsule data, MAXH2CDATA 128 KiB; a read's data in one
        // C2HData PDU and a CapsuleResp after it (the host keeps SQ flow
        // control on, so no SUCCESS shortcut); one R2T per write.
        mdts: 8,
        ioccsz: (8192 + 64) / 16,
        maxh2cdata: 128 * 1024,
        c2h_chunk: 1 << 20,
        r2t_chunk: 1 << 20,
        success_flag: false,
        max_queue_depth: 128,
        ..FakeConfig::default()
    });
    let stats = Arc::new(Stats::default());
    let shared = Arc::new(VolumeQos::new(&cfg.qos, 1));
    // After the QoS clock's epoch: virtual instants map to distinct QoS
    // times (the QoS clock saturates at its epoch).
    let base = Instant::now();
    let (queue, mut tconn) = connect(&target, base);
    // As `Engine::new`.
    let qos = QueueQos::replicated(
        Arc::clone(&shared),
        0,
        cfg.priority.arbiter(),
        1,
        cfg.replication.read_policy,
    );
    let requests = Requests::new(
        cfg.name.clone(),
        vec![1],
        None,
        Arc::clone(&stats),
        qos,
        TAGS,
    );
    let geo = Geometry {
        nsid: 1,
        block_size: BS,
        blocks: NS_BYTES / u64::from(BS),
        max_io_bytes: 1 << 20,
        volatile_cache: false,
        discard: false,
        write_zeroes: false,
    };
    let mut h = Host {
        requests,
        conn: Conn {
            queue,
            held: VecDeque::new(),
            tx_woken: false,
            rx_direct_tag: None,
        },
        stats: Arc::clone(&stats),
        geo,
        op,
        io_bytes,
        bufs: (0..TAGS)
            .map(|t| vec![t as u8; io_bytes as usize].into_boxed_slice())
            .collect(),
        waiting: vec![false; usize::from(TAGS)],
        woken: Vec::with_capacity(usize::from(TAGS)),
        tx_pins: vec![0; usize::from(TAGS)],
        base,
        now_ns: 0,
        next_sector: 0,
        to_issue: n,
        completed: 0,
        failed: 0,
    };

    let mut txbuf: Vec<u8> = Vec::with_capacity(2 * TX_LIMIT);
    let mut placed: Vec<Placed> = Vec::with_capacity(MAX_TX_IOVECS / 2);
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(MAX_TX_IOVECS);
    let mut sent_bytes: Vec<u8> = Vec::with_capacity(2 * TX_LIMIT);
    let mut rxbuf = vec![0u8; RX_BYTES];
    let mut wire = Wire::default();
    let mut k = Counters::default();
    let wall = Instant::now();
    for tag in 0..QD.min(n as u16) {
        host_submit(&mut h, tag);
    }
    while h.completed < n {
        // tx task: one send per wake while the queue has PDUs.
        let mut sent = false;
        while h.conn.queue.has_transmit() {
            let len = host_tx(&mut h, &mut txbuf, &mut placed, &mut iov);
            k.tx_bytes += txbuf.len() as u64;
            k.tx_in_place += (len - txbuf.len()) as u64;
            k.tx_calls += 1;
            wire_send(&iov, &mut sent_bytes);
            assert_eq!(sent_bytes.len(), len);
            tconn.handle_bytes(&sent_bytes);
            host_sent(&mut h, &placed);
            sent = true;
        }
        wire.push(&tconn.take_output());
        // The answers travel (and the target works) for one round trip.
        h.now_ns += RTT_NS;
        assert!(
            sent || wire.available() > 0,
            "stuck: {} completed, {} held",
            h.completed,
            h.conn.held.len()
        );
        // rx task, and the tag tasks it wakes.
        while wire.available() > 0 {
            let got = match host_rx_next(&mut h) {
                RxNext::Direct(ptr, len) => {
                    let got = wire.recv(ptr, len.min(seg));
                    host_on_direct(&mut h, got);
                    k.direct_bytes += got as u64;
                    k.direct_calls += 1;
                    got
                }
                RxNext::Buffered(len) => {
                    let got = wire.recv(rxbuf.as_mut_ptr(), len.min(RX_BYTES).min(seg));
                    host_on_bytes(&mut h, &rxbuf[..got]);
                    k.rx_bytes += got as u64;
                    k.rx_calls += 1;
                    got
                }
            };
            assert!(got > 0);
            while let Some(tag) = h.woken.pop() {
                host_tag_woken(&mut h, tag);
            }
        }
    }
    let wall_ns = wall.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(h.failed, 0, "requests failed");
    let qs = shared.snapshot();
    let st = h.conn.queue.stats();
    let per = |x: u64| x as f64 / n as f64;
    println!(
        "CLIENT-PATH n={n} size={io_bytes} op={} credits={} seg={} wall_ns_per_io={wall_ns:.0}",
        if op == Op::Read { "read" } else { "write" },
        qs.credits_mode,
        if seg == usize::MAX {
            "all".to_string()
        } else {
            seg.to_string()
        },
    );
    println!(
        "  per request: rx via buffer {:.0} B in {:.3} recvs, rx direct {:.0} B in {:.3} recvs, tx {:.0} B gathered + {:.0} B in place in {:.3} sends",
        per(k.rx_bytes),
        per(k.rx_calls),
        per(k.direct_bytes),
        per(k.direct_calls),
        per(k.tx_bytes),
        per(k.tx_in_place),
        per(k.tx_calls),
    );
    println!(
        "  queue: commands {} r2ts {} in-capsule writes {}; qos: window {} ({}, {} B/s x {} us) in_flight_max {} waited {} credit_waits {}",
        st.commands,
        st.r2ts,
        st.in_capsule_writes,
        qs.window,
        qs.window_source,
        qs.estimate_bandwidth_bps,
        qs.estimate_base_us,
        qs.in_flight_max,
        qs.waited,
        qs.credit_waits,
    );
}
