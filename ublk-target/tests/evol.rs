//! An elastic volume's requests end to end, in process: the same
//! [`Requests`] core the engine runs, in eVol mode, over four fake
//! targets (one namespace each, the pool's members). The tests check
//! where each piece of a request lands (read back raw from each
//! namespace), that unmapped reads send nothing, that first writes wait
//! for the allocator (once per extent), that a failing or silent
//! allocator fails the write, and, against a real etcd, that an
//! allocator mapping through etcd and the extent watch feed the map.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_store::evol::{
    EvolKeys, ExtentRecord, LeaderRecord, Leadership, MapOutcome, Placement,
};
use cluster_store::records::SCHEMA;
use cluster_store::testing::EtcdCluster;
use cluster_store::watch::{ExtentEvent, ExtentWatch};
use cluster_store::{AttachMode, Store, StoreConfig, VolumeKeys, VolumeSpec};
use nvmf_initiator::fake_target::{FakeConnection, FakeTarget, Fault, Trigger};
use nvmf_initiator::{Command, Event, Queue, Request};
use qos_core::priority::NvmeClass;
use ublk_target::evol::{
    AllocatorThread, EtcdStaleStore, ExtentAllocator, ExtentMap, HealthThread, MemberIo, StaleStore,
};
use ublk_target::evol_qos::{AgentThread, EvolQos, FlintLink, FlintSettings};
use ublk_target::io::requests::{PartSink, Requests, Submission, TagBuf};
use ublk_target::qos::{LimitKind, QosConfig, QueueQos, VolumeQos};
use ublk_target::volume::Stats;

mod common;
use common::{connect, events, exchange, fake_target, transfer, BS};

const HOST: &str = "nqn.2026-01.io.test:evol-host";
/// Extent size of these tests (small, so requests span several).
const EXT: u64 = 64 * 1024;
/// Physical extents per namespace.
const PEXTS: u64 = 8;
/// The eVol: 16 extents.
const SIZE: u64 = 16 * EXT;
const DEPTH: u16 = 8;
const MEMBERS: usize = 4;
const BUF: usize = 256 * 1024;

/// The members' paths; counts what was sent.
struct Net {
    links: Vec<(Arc<FakeTarget>, Queue<TagBuf>, FakeConnection)>,
    held: VecDeque<(usize, Request<TagBuf>)>,
    /// A member whose path is down: its requests are held.
    down: Option<usize>,
    now: Instant,
    sent: Vec<u64>,
}

impl PartSink for Net {
    fn send(&mut self, m: usize, _class: NvmeClass, req: Request<TagBuf>) {
        self.sent[m] += 1;
        if self.down == Some(m) {
            self.held.push_back((m, req));
            return;
        }
        if let Err(rej) = self.links[m].1.submit(self.now, req) {
            self.held.push_back((m, rej.request));
        }
    }

    fn reset_replica(&mut self, _m: usize) {}
}

fn ns(m: usize) -> String {
    format!("ns{m}")
}

struct Rig {
    req: Requests,
    net: Net,
    map: Arc<ExtentMap>,
    bufs: Vec<Box<[u8]>>,
    _alloc: Option<AllocatorThread>,
}

impl Rig {
    fn new(faults: &[Option<(Fault, Trigger)>; MEMBERS], wait: Duration) -> Self {
        let now = Instant::now();
        let links = (0..MEMBERS)
            .map(|m| {
                let t = fake_target(
                    format!("nqn.2026-01.io.test:{}", ns(m)),
                    PEXTS * EXT,
                    faults[m],
                );
                let (q, c) = connect(&t, HOST, DEPTH * 4, now);
                (t, q, c)
            })
            .collect();
        let map =
            Arc::new(ExtentMap::new("ev", SIZE, EXT, (0..MEMBERS).map(ns).collect()).unwrap());
        let mut qc = QosConfig::new();
        qc.credits = qos_core::credit_gate::CreditMode::Off;
        let qos = QueueQos::new(
            Arc::new(VolumeQos::new(&qc, 1)),
            0,
            ublk_target::qos::priority::PriorityConfig::default().arbiter(),
        );
        let mut req = Requests::new(
            "ev".into(),
            vec![1; MEMBERS],
            None,
            Arc::new(Stats::default()),
            qos,
            DEPTH,
        );
        req.set_evol(Arc::clone(&map), BS, wait, None);
        Rig {
            req,
            net: Net {
                links,
                held: VecDeque::new(),
                down: None,
                now,
                sent: vec![0; MEMBERS],
            },
            map,
            bufs: (0..DEPTH)
                .map(|_| vec![0u8; BUF].into_boxed_slice())
                .collect(),
            _alloc: None,
        }
    }

    fn with_allocator(mut self, a: Arc<dyn ExtentAllocator>) -> Self {
        self._alloc = Some(
            AllocatorThread::start(Arc::clone(&self.map), a, Duration::from_secs(30)).unwrap(),
        );
        self
    }

    /// Flint's auction and eIO in front of the QoS stage (before any
    /// I/O).
    fn with_flint(mut self, flint: Arc<EvolQos>) -> Self {
        self.req.set_evol(
            Arc::clone(&self.map),
            BS,
            Duration::from_secs(30),
            Some(flint),
        );
        self
    }

    fn map(&self, index: u64, copies: &[(usize, u64)]) {
        self.map.insert(&record(index, copies)).unwrap();
    }

    fn submit(
        &mut self,
        tag: u16,
        command: Command,
        len: usize,
        kind: LimitKind,
        write: Option<std::ops::Range<u64>>,
    ) {
        let b = &mut self.bufs[usize::from(tag)];
        // SAFETY: the rig owns the buffer; the test touches it only after
        // the tag completed.
        let buf = (len > 0).then(|| unsafe { TagBuf::exclusive(b.as_mut_ptr(), len) });
        let now = self.req.now(self.net.now);
        self.req.submit(
            now,
            Submission {
                tag,
                command,
                buf,
                kind,
                bytes: len as u64,
                class: NvmeClass::Medium,
                write,
            },
            &mut self.net,
        );
    }

    fn write(&mut self, tag: u16, at: u64, data: &[u8]) {
        self.bufs[usize::from(tag)][..data.len()].copy_from_slice(data);
        let cmd = Command::Write {
            nsid: 1,
            slba: at / u64::from(BS),
            block_size: BS,
            fua: false,
        };
        self.submit(
            tag,
            cmd,
            data.len(),
            LimitKind::Write,
            Some(at..at + data.len() as u64),
        );
    }

    fn read(&mut self, tag: u16, at: u64, len: usize) {
        self.bufs[usize::from(tag)].fill(0xee);
        let cmd = Command::Read {
            nsid: 1,
            slba: at / u64::from(BS),
            block_size: BS,
        };
        self.submit(tag, cmd, len, LimitKind::Read, None);
    }

    fn pump(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for m in 0..MEMBERS {
                let now = self.net.now;
                let (_, q, c) = &mut self.net.links[m];
                moved |= transfer(q, c, now);
                for e in events(q) {
                    if let Event::Completed(done) = e {
                        let qnow = self.req.now(self.net.now);
                        self.req.on_completion(qnow, m, &done, &mut self.net);
                    }
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
        panic!("pump did not settle");
    }

    fn tick(&mut self) {
        let now = self.req.now(Instant::now());
        self.req.evol_tick(now, &mut self.net);
        // What the engine's pacing timer does (an I/O waiting for a slice).
        if self.req.timer().is_some() {
            self.req.pump(now, &mut self.net);
        }
        self.pump();
    }

    /// Tick until tag `tag` has an outcome (generous deadline).
    fn wait(&mut self, tag: u16) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.tick();
            if let Some(ok) = self.req.take_result(tag) {
                return ok;
            }
            assert!(Instant::now() < deadline, "tag {tag} never completed");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The bytes of member `m`'s namespace at physical extent `pext`,
    /// offset `off`.
    fn raw(&self, m: usize, pext: u64, off: u64, len: usize) -> Vec<u8> {
        let d = self.net.links[m].0.data();
        let at = (pext * EXT + off) as usize;
        d[at..at + len].to_vec()
    }
}

fn record(index: u64, copies: &[(usize, u64)]) -> ExtentRecord {
    ExtentRecord {
        schema: SCHEMA,
        evol: "ev".into(),
        index,
        copies: copies
            .iter()
            .map(|&(m, p)| Placement {
                namespace: ns(m),
                pext: p,
            })
            .collect(),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i / 512) as u8)
                .wrapping_mul(31)
                .wrapping_add(i as u8)
                .wrapping_add(seed)
        })
        .collect()
}

const NONE: [Option<(Fault, Trigger)>; MEMBERS] = [None, None, None, None];

#[test]
fn a_write_across_extents_lands_on_each_extents_namespace_at_its_physical_lba() {
    let mut r = Rig::new(&NONE, Duration::from_secs(30));
    r.map(1, &[(2, 5)]);
    r.map(2, &[(0, 3)]);
    r.map(3, &[(3, 0)]);
    // From 8 KiB before the end of extent 1, through extent 2, 8 KiB into 3.
    let at = 2 * EXT - 8192;
    let data = pattern(EXT as usize + 16384, 7);
    r.write(0, at, &data);
    assert!(r.wait(0));
    assert_eq!(r.raw(2, 5, EXT - 8192, 8192), data[..8192]);
    assert_eq!(
        r.raw(0, 3, 0, EXT as usize),
        data[8192..8192 + EXT as usize]
    );
    assert_eq!(r.raw(3, 0, 0, 8192), data[8192 + EXT as usize..]);
    assert_eq!(r.net.sent, [1, 0, 1, 1]);
    // Read back through the volume, with an unmapped extent (4) after it.
    r.read(1, at, data.len() + 4096);
    assert!(r.wait(1));
    assert_eq!(&r.bufs[1][..data.len()], &data[..]);
    assert!(r.bufs[1][data.len()..data.len() + 4096]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn reads_of_unmapped_extents_are_zeros_and_send_nothing() {
    let mut r = Rig::new(&NONE, Duration::from_secs(30));
    r.read(0, 5 * EXT - 4096, 3 * 4096);
    // Done at once: nothing to wait for.
    assert_eq!(r.req.take_result(0), Some(true));
    assert!(r.bufs[0][..3 * 4096].iter().all(|&b| b == 0));
    assert_eq!(r.net.sent, [0; MEMBERS]);
    // A discard and a write-zeroes of unmapped extents: nothing either.
    let dsm = nvmf_proto::sqe::Sqe::new(nvmf_proto::sqe::io_opcode::DATASET_MANAGEMENT, 0);
    r.submit(1, Command::Raw(dsm), 4096, LimitKind::Other, Some(0..EXT));
    assert_eq!(r.req.take_result(1), Some(true));
    let wz = Command::WriteZeroes {
        nsid: 1,
        slba: 0,
        blocks: 16,
        deallocate: false,
    };
    r.submit(2, wz, 0, LimitKind::Other, Some(0..8192));
    assert_eq!(r.req.take_result(2), Some(true));
    // A flush before any extent is mapped: nothing was written.
    r.submit(3, Command::Flush { nsid: 1 }, 0, LimitKind::Other, None);
    assert_eq!(r.req.take_result(3), Some(true));
    assert_eq!(r.net.sent, [0; MEMBERS]);
    // Once mapped, a flush goes to the members that hold extents.
    r.map(0, &[(1, 0), (3, 2)]);
    r.submit(3, Command::Flush { nsid: 1 }, 0, LimitKind::Other, None);
    assert!(r.wait(3));
    assert_eq!(r.net.sent, [0, 1, 0, 1]);
}

/// Maps extent i on member i % 4 at physical extent i / 4, after the
/// test opens its gate; counts calls.
struct GatedAllocator {
    open: Mutex<bool>,
    cv: std::sync::Condvar,
    calls: AtomicU64,
    fail: bool,
}

impl GatedAllocator {
    fn new(open: bool, fail: bool) -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(open),
            cv: std::sync::Condvar::new(),
            calls: AtomicU64::new(0),
            fail,
        })
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl ExtentAllocator for GatedAllocator {
    fn allocate(&self, evol: &str, index: u64, deadline: Instant) -> Result<ExtentRecord, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut g = self.open.lock().unwrap();
        while !*g {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("deadline".into());
            }
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
        if self.fail {
            return Err("the pool is full".into());
        }
        assert_eq!(evol, "ev");
        Ok(record(index, &[((index % 4) as usize, index / 4)]))
    }
}

#[test]
fn first_writes_wait_for_one_allocation_per_extent_then_proceed() {
    let alloc = GatedAllocator::new(false, false);
    let mut r = Rig::new(&NONE, Duration::from_secs(60)).with_allocator(alloc.clone());
    let a = pattern(8192, 1);
    let b = pattern(8192, 2);
    // Two writes to extent 6, one to extents 6 and 7.
    r.write(0, 6 * EXT, &a);
    r.write(1, 6 * EXT + 8192, &b);
    let c = pattern(16384, 3);
    r.write(2, 7 * EXT - 8192, &c);
    r.tick();
    assert_eq!(r.req.evol_parked(), 3);
    assert_eq!(r.map.waiting(Instant::now()).0, 3);
    assert!(r.req.take_result(0).is_none());
    assert_eq!(r.net.sent, [0; MEMBERS], "nothing goes before the mapping");
    alloc.open();
    assert!(r.wait(0));
    assert!(r.wait(1));
    assert!(r.wait(2));
    assert_eq!(
        alloc.calls.load(Ordering::SeqCst),
        2,
        "one allocation per extent"
    );
    assert_eq!(r.map.waiting(Instant::now()).0, 0);
    // Extent 6: member 2, pext 1; extent 7: member 3, pext 1.
    assert_eq!(r.raw(2, 1, 0, 8192), a);
    assert_eq!(r.raw(2, 1, 8192, 8192), b);
    assert_eq!(r.raw(2, 1, EXT - 8192, 8192), c[..8192]);
    assert_eq!(r.raw(3, 1, 0, 8192), c[8192..]);
}

#[test]
fn a_failing_allocator_fails_the_write_and_the_wait_is_bounded() {
    let alloc = GatedAllocator::new(true, true);
    let mut r = Rig::new(&NONE, Duration::from_secs(60)).with_allocator(alloc);
    r.write(0, 0, &pattern(4096, 1));
    assert!(!r.wait(0), "not acknowledged");
    assert_eq!(r.net.sent, [0; MEMBERS]);
    // An allocator that never answers in time: the write fails after the
    // configured wait, not later.
    let silent = GatedAllocator::new(false, false);
    let mut r = Rig::new(&NONE, Duration::from_millis(200)).with_allocator(silent.clone());
    r.write(0, 0, &pattern(4096, 1));
    assert!(!r.wait(0));
    assert_eq!(r.req.evol_parked(), 0);
    assert_eq!(r.map.waiting(Instant::now()).0, 0);
    silent.open();
}

#[test]
fn without_a_stale_recorder_a_copy_that_fails_a_write_fails_it_and_serves_no_more_reads() {
    // Member 1 answers its first I/O with an error.
    let faults = [
        None,
        Some((Fault::ErrorStatus, Trigger::NthIo(0))),
        None,
        None,
    ];
    let mut r = Rig::new(&faults, Duration::from_secs(30));
    r.map(0, &[(1, 0), (2, 0)]);
    let d = pattern(8192, 9);
    r.write(0, 0, &d);
    assert!(
        !r.wait(0),
        "a write one copy missed is not acknowledged until etcd records the copy stale"
    );
    assert_eq!(r.map.stale_copies(), 1);
    assert_eq!(r.raw(2, 0, 0, 8192), d, "the other copy got it");
    // Reads go to the copy that holds it, not to the preferred stale one.
    let before = r.net.sent.clone();
    r.read(1, 0, 8192);
    assert!(r.wait(1));
    assert_eq!(&r.bufs[1][..8192], &d[..]);
    assert_eq!(r.net.sent[1], before[1]);
    assert_eq!(r.net.sent[2], before[2] + 1);
}

/// Maps through etcd as a leader would (tests only: production asks the
/// arbiter): the next free physical extent, round robin over members.
struct StoreAllocator {
    store: Mutex<Store>,
    keys: EvolKeys,
    lead: Leadership,
    next: AtomicU64,
}

impl ExtentAllocator for StoreAllocator {
    fn allocate(&self, evol: &str, index: u64, _deadline: Instant) -> Result<ExtentRecord, String> {
        let s = self.store.lock().unwrap();
        loop {
            let n = self.next.fetch_add(1, Ordering::SeqCst);
            let at = Placement {
                namespace: ns((n % MEMBERS as u64) as usize),
                pext: n / MEMBERS as u64,
            };
            match s
                .map_extent(&self.keys, self.lead, evol, index, &[at])
                .map_err(|e| e.to_string())?
            {
                MapOutcome::Mapped(r) | MapOutcome::AlreadyMapped(r) => return Ok(r),
                MapOutcome::PextTaken(_) => continue,
                MapOutcome::NotLeader => return Err("not the leader".into()),
            }
        }
    }
}

#[test]
fn allocations_go_through_etcd_and_the_watch_brings_others_mappings() {
    let c = EtcdCluster::start(3);
    let s = c.store(Duration::from_secs(3)).unwrap();
    let keys = EvolKeys::new("/evol-test");
    let me = LeaderRecord {
        schema: SCHEMA,
        id: "test".into(),
        address: "127.0.0.1:1".into(),
        lease: s.grant_lease(Duration::from_secs(60)).unwrap(),
    };
    let lead = s.campaign(&keys, &me).unwrap().expect("leader");
    let mut r = Rig::new(&NONE, Duration::from_secs(60));
    // Another party mapped extent 9 before we started: the read sees it.
    assert!(matches!(
        s.map_extent(
            &keys,
            lead,
            "ev",
            9,
            &[Placement {
                namespace: ns(3),
                pext: 7
            }]
        )
        .unwrap(),
        MapOutcome::Mapped(_)
    ));
    let snap = s.read_extents_at(&keys, "ev").unwrap();
    r.map.replace(&snap.extents);
    let m = Arc::clone(&r.map);
    let watch = ExtentWatch::start(
        StoreConfig {
            endpoints: c.endpoints(),
            op_timeout: Duration::from_secs(3),
        },
        &keys,
        "ev",
        snap.revision,
        move |e| match e {
            ExtentEvent::Mapped(rec) => m.insert(&rec).unwrap(),
            ExtentEvent::Unmapped(i) => m.remove(i),
            ExtentEvent::Resync(s) => m.replace(&s.extents),
        },
    )
    .unwrap();
    assert_eq!(r.map.get(9).unwrap().copies().collect::<Vec<_>>(), [(3, 7)]);
    // Another party maps extent 10 now: the watch brings it.
    assert!(matches!(
        s.map_extent(
            &keys,
            lead,
            "ev",
            10,
            &[Placement {
                namespace: ns(1),
                pext: 6
            }]
        )
        .unwrap(),
        MapOutcome::Mapped(_)
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while r.map.get(10).is_none() {
        assert!(
            Instant::now() < deadline,
            "the watch never brought extent 10"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let d = pattern(4096, 4);
    r.write(0, 10 * EXT + 4096, &d);
    assert!(r.wait(0));
    assert_eq!(r.raw(1, 6, 4096, 4096), d);
    // A first write allocates through etcd.
    let r2 = Rig::new(&NONE, Duration::from_secs(60));
    let alloc = Arc::new(StoreAllocator {
        store: Mutex::new(c.store(Duration::from_secs(3)).unwrap()),
        keys: keys.clone(),
        lead,
        next: AtomicU64::new(0),
    });
    drop(r2);
    r._alloc =
        Some(AllocatorThread::start(Arc::clone(&r.map), alloc, Duration::from_secs(30)).unwrap());
    let d2 = pattern(8192, 5);
    r.write(1, 2 * EXT, &d2);
    assert!(r.wait(1));
    let rec = s
        .read_extents_at(&keys, "ev")
        .unwrap()
        .extents
        .into_iter()
        .find(|e| e.index == 2)
        .expect("extent 2 in etcd");
    let (member, pext) = r.map.get(2).unwrap().copies().next().unwrap();
    assert_eq!(rec.copies[0].namespace, ns(member));
    assert_eq!(rec.copies[0].pext, pext);
    assert_eq!(r.raw(member, pext, 0, 8192), d2);
    watch.stop();
}

/// The repair's I/O to the fake targets (real NVMe/TCP commands over an
/// in-memory connection of its own); a member is reachable when the test
/// says so.
struct FakeIo {
    links: Vec<Mutex<(Queue<Vec<u8>>, FakeConnection)>>,
    up: Vec<std::sync::atomic::AtomicBool>,
    /// Flushes per member.
    flushes: Vec<AtomicU64>,
}

impl FakeIo {
    fn new(r: &Rig) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            links: r
                .net
                .links
                .iter()
                .map(|(t, _, _)| Mutex::new(connect(t, HOST, DEPTH * 4, now)))
                .collect(),
            up: (0..MEMBERS)
                .map(|_| std::sync::atomic::AtomicBool::new(true))
                .collect(),
            flushes: (0..MEMBERS).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn io(&self, m: usize, command: Command, buf: Vec<u8>) -> Result<Vec<u8>, String> {
        let mut g = self.links[m].lock().unwrap();
        let (q, c) = &mut *g;
        let now = Instant::now();
        q.submit(
            now,
            Request {
                command,
                buf: Some(buf),
                user_data: 1,
            },
        )
        .map_err(|_| "refused".to_string())?;
        exchange(q, c, now);
        while let Some(e) = q.poll_event() {
            if let Event::Completed(done) = e {
                if !done.status.is_success() {
                    return Err(format!("status {:?}", done.status));
                }
                return Ok(done.buf.unwrap_or_default());
            }
        }
        Err("no completion".into())
    }
}

impl MemberIo for FakeIo {
    fn reachable(&self, m: usize) -> bool {
        self.up[m].load(Ordering::SeqCst)
    }

    fn max_io(&self, _m: usize) -> usize {
        32 * 1024
    }

    fn read(&self, m: usize, at: u64, buf: &mut [u8]) -> Result<(), String> {
        let cmd = Command::Read {
            nsid: 1,
            slba: at / u64::from(BS),
            block_size: BS,
        };
        let d = self.io(m, cmd, vec![0; buf.len()])?;
        buf.copy_from_slice(&d);
        Ok(())
    }

    fn write(&self, m: usize, at: u64, data: &[u8]) -> Result<(), String> {
        let cmd = Command::Write {
            nsid: 1,
            slba: at / u64::from(BS),
            block_size: BS,
            fua: false,
        };
        self.io(m, cmd, data.to_vec()).map(|_| ())
    }

    fn flush(&self, m: usize) -> Result<(), String> {
        self.flushes[m].fetch_add(1, Ordering::SeqCst);
        self.io(m, Command::Flush { nsid: 1 }, Vec::new())
            .map(|_| ())
    }
}

/// The eVol "ev" attached in etcd as cluster mode does (its owner's
/// epoch guards the stale marks): (volume keys, epoch).
fn attach(s: &Store, prefix: &str, mode: AttachMode) -> (VolumeKeys, u64) {
    let vkeys = VolumeKeys::new(prefix, "ev");
    let lease = s.grant_lease(Duration::from_secs(60)).unwrap();
    let spec = VolumeSpec::new(vec!["evol ev".into()]);
    let a = s
        .attach(&vkeys, "ev", &spec, HOST, lease, mode)
        .expect("attach");
    (vkeys, a.epoch)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_copy_that_fails_a_write_is_recorded_stale_in_etcd_then_repaired() {
    let c = EtcdCluster::start(1);
    let s = c.store(Duration::from_secs(3)).unwrap();
    let keys = EvolKeys::new("/evol-stale");
    let (vkeys, epoch) = attach(&s, "/evol-stale", AttachMode::Attach);
    // Member 1 answers its first I/O with an error, then recovers.
    let faults = [
        None,
        Some((Fault::ErrorStatus, Trigger::NthIo(0))),
        None,
        None,
    ];
    let mut r = Rig::new(&faults, Duration::from_secs(30));
    r.map(0, &[(1, 0), (2, 3)]);
    let io = FakeIo::new(&r);
    // The member is down for the repair until the test says otherwise.
    io.up[1].store(false, Ordering::SeqCst);
    let store: Arc<dyn StaleStore> = Arc::new(EtcdStaleStore::new(
        c.store(Duration::from_secs(3)).unwrap(),
        vkeys,
        keys.clone(),
        "ev",
        epoch,
    ));
    let _health = HealthThread::start(
        Arc::clone(&r.map),
        store,
        Some(io.clone() as Arc<dyn MemberIo>),
        0,
    )
    .unwrap();
    let d = pattern(8192, 9);
    r.write(0, 4096, &d);
    assert!(r.wait(0), "acknowledged with the other copy's success");
    assert_eq!(r.raw(2, 3, 4096, 8192), d);
    assert_ne!(r.raw(1, 0, 4096, 8192), d, "the failing copy missed it");
    // The mark is in etcd (it was before the acknowledgement).
    let marks = s.read_stale(&keys, "ev").unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].index, 0);
    assert_eq!(
        marks[0].copies,
        [Placement {
            namespace: ns(1),
            pext: 0
        }]
    );
    // Reads come from the good copy.
    let before = r.net.sent.clone();
    r.read(1, 4096, 8192);
    assert!(r.wait(1));
    assert_eq!(&r.bufs[1][..8192], &d[..]);
    assert_eq!(r.net.sent[1], before[1], "no read from the stale copy");
    // More writes while it is stale: they go on (the stale copy takes
    // them too, the repair redoes what they overlap).
    let d2 = pattern(4096, 11);
    r.write(2, EXT - 4096, &d2);
    assert!(r.wait(2));
    // The member is back: the repair copies the extent and clears the mark.
    io.up[1].store(true, Ordering::SeqCst);
    wait_for("the copy repaired", || r.map.stale_copies() == 0);
    assert_eq!(
        r.raw(1, 0, 0, EXT as usize),
        r.raw(2, 3, 0, EXT as usize),
        "both copies byte-identical"
    );
    // The local mark goes first, then the repair deletes the one in etcd
    // (a mark left behind only makes the next owner repair again).
    wait_for("the mark deleted in etcd", || {
        s.read_stale(&keys, "ev").unwrap().is_empty()
    });
    assert_eq!(r.map.repaired(), 1);
    // Reads may use the repaired copy again.
    let x = r.map.get(0).unwrap();
    assert_eq!(r.map.readable(0, &x).bits(), 0b110);
}

#[test]
fn a_new_owner_loads_the_stale_marks_and_a_deposed_one_cannot_write_them() {
    let c = EtcdCluster::start(1);
    let s = c.store(Duration::from_secs(3)).unwrap();
    let keys = EvolKeys::new("/evol-owner");
    let (vkeys, epoch) = attach(&s, "/evol-owner", AttachMode::Attach);
    let faults = [
        None,
        Some((Fault::ErrorStatus, Trigger::NthIo(0))),
        None,
        None,
    ];
    let mut r = Rig::new(&faults, Duration::from_secs(30));
    r.map(0, &[(1, 0), (2, 0)]);
    let old = Arc::new(EtcdStaleStore::new(
        c.store(Duration::from_secs(3)).unwrap(),
        vkeys.clone(),
        keys.clone(),
        "ev",
        epoch,
    ));
    // No repair (no member I/O): the mark stays.
    let health = HealthThread::start(
        Arc::clone(&r.map),
        Arc::clone(&old) as Arc<dyn StaleStore>,
        None,
        0,
    )
    .unwrap();
    r.write(0, 0, &pattern(4096, 3));
    assert!(r.wait(0));
    assert_eq!(s.read_stale(&keys, "ev").unwrap().len(), 1);
    // Another host takes the volume over (a new epoch).
    let (_, epoch2) = attach(&s, "/evol-owner", AttachMode::Takeover);
    assert!(epoch2 > epoch);
    // The deposed owner can neither clear nor add a mark...
    let e = old.put(0, &[]).unwrap_err();
    assert!(e.contains("no longer owned"), "{e}");
    assert_eq!(s.read_stale(&keys, "ev").unwrap().len(), 1);
    // ...so a write that misses a copy there is not acknowledged.
    let faults3 = [
        None,
        None,
        Some((Fault::ErrorStatus, Trigger::NthIo(0))),
        None,
    ];
    let mut r3 = Rig::new(&faults3, Duration::from_secs(30));
    r3.map(5, &[(3, 1), (2, 1)]);
    let _h3 = HealthThread::start(
        Arc::clone(&r3.map),
        Arc::clone(&old) as Arc<dyn StaleStore>,
        None,
        0,
    )
    .unwrap();
    r3.write(0, 5 * EXT, &pattern(4096, 4));
    assert!(!r3.wait(0), "a deposed owner's missed write fails");
    drop(health);
    // The new owner loads the marks and never reads the stale copy.
    let mut r2 = Rig::new(&NONE, Duration::from_secs(30));
    r2.map(0, &[(1, 0), (2, 0)]);
    r2.map.load_stale(&s.read_stale(&keys, "ev").unwrap());
    assert_eq!(r2.map.stale_copies(), 1);
    for tag in 0..4 {
        r2.read(tag, u64::from(tag) * 4096, 4096);
        assert!(r2.wait(tag));
    }
    assert_eq!(r2.net.sent[1], 0, "no read from the stale copy");
    assert_eq!(r2.net.sent[2], 4);
}

#[test]
fn a_write_no_copy_takes_fails() {
    let c = EtcdCluster::start(1);
    let s = c.store(Duration::from_secs(3)).unwrap();
    let keys = EvolKeys::new("/evol-none");
    let (vkeys, epoch) = attach(&s, "/evol-none", AttachMode::Attach);
    let err = Some((Fault::ErrorStatus, Trigger::NthIo(0)));
    let mut r = Rig::new(&[None, err, err, None], Duration::from_secs(30));
    r.map(0, &[(1, 0), (2, 0)]);
    let store = Arc::new(EtcdStaleStore::new(
        c.store(Duration::from_secs(3)).unwrap(),
        vkeys,
        keys,
        "ev",
        epoch,
    ));
    let _health = HealthThread::start(Arc::clone(&r.map), store, None, 0).unwrap();
    r.write(0, 0, &pattern(4096, 5));
    assert!(!r.wait(0), "no copy holds it: not acknowledged");
}

#[test]
fn writes_held_for_a_member_whose_path_is_down_complete_on_the_other_copy() {
    let c = EtcdCluster::start(1);
    let s = c.store(Duration::from_secs(3)).unwrap();
    let keys = EvolKeys::new("/evol-down");
    let (vkeys, epoch) = attach(&s, "/evol-down", AttachMode::Attach);
    let mut r = Rig::new(&NONE, Duration::from_secs(30));
    r.map(0, &[(1, 0), (2, 0)]);
    r.map(1, &[(1, 1)]);
    let store = Arc::new(EtcdStaleStore::new(
        c.store(Duration::from_secs(3)).unwrap(),
        vkeys,
        keys.clone(),
        "ev",
        epoch,
    ));
    let _health = HealthThread::start(Arc::clone(&r.map), store, None, 0).unwrap();
    // Member 1's path is down: what is sent to it is held.
    r.net.down = Some(1);
    let d = pattern(4096, 6);
    r.write(0, 0, &d);
    // Extent 1 has its only copy there: that write waits for the path.
    r.write(1, EXT, &pattern(4096, 7));
    r.pump();
    assert_eq!(r.net.held.len(), 2);
    // The engine's tick drops what another copy can take.
    let mut held: VecDeque<Request<TagBuf>> = r.net.held.drain(..).map(|(_, q)| q).collect();
    let now = r.req.now(Instant::now());
    r.req.drop_held_if_out(now, 1, &mut held, &mut r.net);
    assert_eq!(held.len(), 1, "the only copy's write stays held");
    assert!(r.wait(0), "completed on the other copy");
    assert_eq!(r.raw(2, 0, 0, 4096), d);
    assert_eq!(s.read_stale(&keys, "ev").unwrap().len(), 1);
    assert!(r.req.take_result(1).is_none());
}

/// A fake arbiter for Flint's client side: grants `grant` slices of
/// 16 KiB per request, records the view reports.
#[derive(Clone, Default)]
struct FakeArbiter(Arc<Mutex<(u64, Vec<evol_arbiter::pb::IoVector>)>>);

impl FlintLink for FakeArbiter {
    fn report_io(
        &mut self,
        _: &str,
        _: &str,
        v: &[evol_arbiter::pb::IoVector],
    ) -> Result<u32, String> {
        self.0.lock().unwrap().1.extend_from_slice(v);
        Ok(v.len() as u32)
    }
    fn request_slices(
        &mut self,
        _: &str,
        _: &str,
        ns: &[String],
        slices: u32,
        _: Duration,
    ) -> Result<Vec<evol_arbiter::pb::SliceGrant>, String> {
        let grant = self.0.lock().unwrap().0.min(u64::from(slices));
        if grant == 0 {
            // As the arbiter does when nothing is available: wait, answer none.
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(ns
            .iter()
            .flat_map(|n| {
                (0..grant).map(|_| evol_arbiter::pb::SliceGrant {
                    namespace: n.clone(),
                    bytes: 16 * 1024,
                    epoch: 1,
                    valid_for_ns: 600_000_000_000,
                })
            })
            .collect())
    }
    fn release_slices(&mut self, _: &str, _: &str, _: &[String]) -> Result<(), String> {
        Ok(())
    }
    fn query_view(&mut self, _: &[String]) -> Result<evol_arbiter::pb::QueryViewResponse, String> {
        Ok(evol_arbiter::pb::QueryViewResponse::default())
    }
}

#[test]
fn the_auction_holds_a_mapped_write_until_a_slice_arrives_and_the_view_counts_it() {
    let flint = EvolQos::new(
        "host1",
        "ev",
        (0..MEMBERS).map(ns).collect(),
        &["a:1".into(), "a:1".into(), "b:1".into(), "b:1".into()],
        FlintSettings {
            report_interval: Some(Duration::from_millis(10)),
            ..FlintSettings::default()
        },
    );
    let arb = FakeArbiter::default();
    arb.0.lock().unwrap().0 = 1;
    let _agent = AgentThread::start(Arc::clone(&flint), Box::new(arb.clone())).unwrap();
    let mut r = Rig::new(&NONE, Duration::from_secs(30)).with_flint(Arc::clone(&flint));
    r.map(1, &[(2, 5)]);
    // Before the first grant the auction does not gate (fails open); the
    // demand makes the agent ask, and the grant makes it gate.
    let d = pattern(4096, 1);
    r.write(0, EXT, &d);
    assert!(r.wait(0));
    wait_for("the auction to gate", || flint.status().auction_enforced);
    // With no more grants, writes go while the slices have room, then
    // one waits in eIO: nothing of it reaches the member.
    arb.0.lock().unwrap().0 = 0;
    let big = pattern(8192, 2);
    let mut tag = 1;
    loop {
        let sent = r.net.sent[2];
        r.write(tag, EXT + 8192 * u64::from(tag), &big);
        r.pump();
        if r.net.sent[2] == sent {
            break;
        }
        assert!(r.wait(tag));
        tag += 1;
        assert!(tag < DEPTH, "the slices never ran out");
    }
    assert!(
        r.req.timer().is_some(),
        "a slice wait arms the pacing timer"
    );
    for _ in 0..5 {
        r.tick();
    }
    assert!(r.req.take_result(tag).is_none(), "held for want of a slice");
    assert!(flint.status().slice_waits >= 1);
    // A grant lets it go.
    arb.0.lock().unwrap().0 = 4;
    assert!(r.wait(tag));
    let at = (5 * EXT + 8192 * u64::from(tag)) as usize;
    assert_eq!(r.net.links[2].0.data()[at..at + 8192], big[..]);
    // The view agent reported the member's writes, aggregated.
    wait_for("the view reports", || {
        let g = arb.0.lock().unwrap();
        let writes: u64 = g
            .1
            .iter()
            .filter(|v| v.namespace == ns(2) && v.kind == evol_arbiter::pb::IoKind::Write as i32)
            .map(|v| v.count)
            .sum();
        writes == u64::from(tag) + 1
    });
}

/// A stale store whose records wait until the test opens it.
#[derive(Default)]
struct GatedStore {
    open: Mutex<bool>,
    puts: Mutex<Vec<(u64, Vec<Placement>)>>,
}

impl StaleStore for GatedStore {
    fn put(&self, index: u64, copies: &[Placement]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !*self.open.lock().unwrap() {
            assert!(Instant::now() < deadline, "the store was never opened");
            std::thread::sleep(Duration::from_millis(2));
        }
        self.puts.lock().unwrap().push((index, copies.to_vec()));
        Ok(())
    }
}

#[test]
fn a_member_lost_with_unflushed_writes_is_marked_stale_and_flushes_wait_for_the_mark() {
    let mut r = Rig::new(&NONE, Duration::from_secs(30));
    r.map(0, &[(0, 0), (1, 0)]);
    r.map(1, &[(0, 1), (1, 1)]);
    let store = Arc::new(GatedStore::default());
    let _health = HealthThread::start(
        Arc::clone(&r.map),
        Arc::clone(&store) as Arc<dyn StaleStore>,
        None,
        0,
    )
    .unwrap();
    let d = pattern(4096, 3);
    r.write(0, 0, &d);
    assert!(r.wait(0));
    // A flush covers extent 0 on both members; extent 1 is written after.
    r.submit(1, Command::Flush { nsid: 1 }, 0, LimitKind::Other, None);
    assert!(r.wait(1));
    r.write(2, EXT, &d);
    assert!(r.wait(2));
    assert_eq!((r.map.unflushed(0), r.map.unflushed(1)), (1, 1));
    // Member 0's controller goes away (its target may have lost its
    // cache): only extent 1's copy there is suspect.
    assert_eq!(r.map.member_lost(0, 1), 1);
    let reads = r.net.sent.clone();
    r.read(3, EXT, 4096);
    assert!(r.wait(3));
    assert_eq!(r.bufs[3][..4096], d[..]);
    assert_eq!(
        (r.net.sent[0] - reads[0], r.net.sent[1] - reads[1]),
        (0, 1),
        "the suspect copy serves no reads"
    );
    // A flush completes on every member, yet is acknowledged only once
    // the mark is durable.
    r.submit(4, Command::Flush { nsid: 1 }, 0, LimitKind::Other, None);
    for _ in 0..20 {
        r.tick();
        assert!(
            r.req.take_result(4).is_none(),
            "acknowledged before the mark"
        );
    }
    *store.open.lock().unwrap() = true;
    assert!(r.wait(4));
    let puts = store.puts.lock().unwrap().clone();
    assert_eq!(puts.len(), 1, "{puts:?}");
    assert_eq!(
        puts[0],
        (
            1,
            vec![Placement {
                namespace: ns(0),
                pext: 1
            }]
        )
    );
}

#[test]
fn a_repaired_copy_is_flushed_before_its_mark_is_cleared() {
    let faults = [
        Some((Fault::ErrorStatus, Trigger::NthIo(0))),
        None,
        None,
        None,
    ];
    let mut r = Rig::new(&faults, Duration::from_secs(30));
    r.map(0, &[(0, 0), (1, 0)]);
    let io = FakeIo::new(&r);
    let store = Arc::new(GatedStore::default());
    *store.open.lock().unwrap() = true;
    let _health = HealthThread::start(
        Arc::clone(&r.map),
        Arc::clone(&store) as Arc<dyn StaleStore>,
        Some(io.clone() as Arc<dyn MemberIo>),
        0,
    )
    .unwrap();
    let d = pattern(4096, 5);
    r.write(0, 0, &d);
    assert!(r.wait(0), "acknowledged with the other copy's success");
    wait_for("the repair", || r.map.stale_copies() == 0);
    assert!(
        io.flushes[0].load(Ordering::SeqCst) >= 1,
        "the repaired copy was flushed"
    );
    assert_eq!(r.raw(0, 0, 0, 4096), d);
    // The store's clear follows the local one.
    wait_for("the mark cleared in the store", || {
        let puts = store.puts.lock().unwrap();
        puts.last().is_some_and(|p| p.1.is_empty())
    });
}
