//! A mirrored volume's requests end to end, in process: the same
//! [`Requests`] core the engine runs (QoS stage, fan-out, the real intent
//! log and replica set), with each replica an initiator queue core talking
//! to a fake NVMe/TCP target in memory. Links are cut, and targets answer
//! with errors, at chosen points of a request's life; the tests check what
//! the volume answers, what every replica holds, and what the intent log
//! recorded.

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_store::testing::EtcdCluster;
use cluster_store::{AttachMode, StoreConfig, VolumeKeys};
use nvmf_initiator::fake_target::{FakeConnection, FakeTarget, Fault, Trigger};
use nvmf_initiator::{Command, Event, Queue, Request};
use qos_core::priority::NvmeClass;
use ublk_target::cluster::{self, ClusterLink};
use ublk_target::config::VolumeConfig;
use ublk_target::io::requests::{PartSink, Requests, Submission, TagBuf};
use ublk_target::qos::{LimitKind, QueueQos, VolumeQos};
use ublk_target::replication::intent_log::{Geometry, IntentLog, ReplicaSyncState};
use ublk_target::replication::Replication;
use ublk_target::volume::Stats;

mod common;
use common::{connect, events, fake_target, transfer, BS};

const HOST: &str = "nqn.2026-01.io.test:fanout-host";

/// Held by every test of this binary: the cluster tests start etcd
/// members (fork and exec), and a child between the two holds a copy of
/// every descriptor open at that moment, the intent log's flock included,
/// which makes a test that reopens its log see it "in use by another
/// process". One test at a time keeps opens and spawns apart.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
/// Volume (and every namespace) size.
const SIZE: u64 = 4 << 20;
const DEPTH: u16 = 8;
/// Bytes per test request.
const IO: usize = 8192;

/// One replica: its fake target and, while the link is up, the host's
/// queue core and the target's end of the connection.
struct Link {
    target: Arc<FakeTarget>,
    conn: Option<(Queue<TagBuf>, FakeConnection)>,
    /// Requests waiting for a connection (as the engine's path holds
    /// them).
    held: VecDeque<Request<TagBuf>>,
}

/// The paths of every replica: the [`PartSink`] of these tests.
struct Net {
    links: Vec<Link>,
    now: Instant,
    /// Replicas whose controller the core asked to reset.
    resets: Vec<usize>,
}

impl PartSink for Net {
    fn send(&mut self, replica: usize, _class: NvmeClass, req: Request<TagBuf>) {
        let link = &mut self.links[replica];
        match link.conn.as_mut() {
            Some((q, _)) => {
                if let Err(rej) = q.submit(self.now, req) {
                    link.held.push_back(rej.request);
                }
            }
            None => link.held.push_back(req),
        }
    }

    fn reset_replica(&mut self, replica: usize) {
        self.resets.push(replica);
    }
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..IO)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// A mirrored volume over `n` fake targets, every replica in sync.
struct Rig {
    req: Requests,
    net: Net,
    rep: Arc<Replication>,
    /// Per tag: its I/O buffer (the ublk queue's, in the engine).
    bufs: Vec<Box<[u8]>>,
    /// Cluster mode: the volume's link to etcd.
    cluster: Option<Arc<ClusterLink>>,
    _dir: Arc<tempfile::TempDir>,
}

/// Cluster mode for a [`Rig`]: etcd's endpoints, and who this host is.
struct ClusterRig<'a> {
    endpoints: &'a [String],
    host: &'a str,
    mode: AttachMode,
}

impl Rig {
    /// `faults[r]`: the fault replica r's target injects.
    fn new(faults: &[Option<(Fault, Trigger)>]) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        Self::build(faults, dir, None, true).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A rig in cluster mode, its intent log in `dir` (this "host"'s state
    /// directory; a fresh one stands for another host); `all_in_sync`: a
    /// log recording every replica in sync is prepared first.
    fn clustered(
        faults: &[Option<(Fault, Trigger)>],
        dir: Arc<tempfile::TempDir>,
        c: ClusterRig<'_>,
        all_in_sync: bool,
    ) -> Result<Self, ublk_target::error::Error> {
        Self::build(faults, dir, Some(c), all_in_sync)
    }

    fn build(
        faults: &[Option<(Fault, Trigger)>],
        dir: Arc<tempfile::TempDir>,
        cluster: Option<ClusterRig<'_>>,
        prepare: bool,
    ) -> Result<Self, ublk_target::error::Error> {
        let n = faults.len();
        let mut toml = String::from("name = \"fan\"\n");
        for r in 0..n {
            toml += &format!(
                "[[replica]]\naddress = \"127.0.0.1\"\nport = {}\nsubnqn = \"nqn.2026-01.io.test:r{r}\"\n",
                4420 + r
            );
        }
        toml += &format!(
            "[qos]\ncredits = \"off\"\n[replication]\nread_policy = \"primary\"\nregion_size = \"1m\"\nbitmap_dir = \"{}\"\n",
            dir.path().display()
        );
        if let Some(c) = &cluster {
            let eps: Vec<String> = c.endpoints.iter().map(|e| format!("{e:?}")).collect();
            toml += &format!(
                "[cluster]\nendpoints = [{}]\nprefix = \"/fanout\"\nlease_ttl = 3\nop_timeout_ms = 300\nhealth_wait = 120\n",
                eps.join(", ")
            );
        }
        let mut cfg = VolumeConfig::parse(Path::new("fan.toml"), &toml).expect("config");
        // A short fence, so a test can wait for a replica to return.
        cfg.keep_alive = Duration::from_millis(10);
        cfg.io_timeout = Duration::from_millis(10);
        let ids: Vec<String> = (0..n).map(|r| format!("r{r} nsid 1")).collect();
        if prepare {
            all_in_sync(&cfg, &ids);
        }
        let attachment = match &cluster {
            Some(c) => Some(cluster::attach(&cfg, c.host, c.mode)?),
            None => None,
        };
        let rep = Arc::new(Replication::open(
            &cfg,
            &ids,
            SIZE,
            false,
            attachment
                .as_ref()
                .map(|a| a.health.as_ref().map(|(h, _)| h)),
        )?);
        if cluster.is_none() {
            assert!(rep.status().iter().all(|s| s.state == "in-sync"));
        }
        let now = Instant::now();
        let links = faults
            .iter()
            .enumerate()
            .map(|(r, &fault)| {
                let target = fake_target(format!("nqn.2026-01.io.test:r{r}"), SIZE, fault);
                let conn = Some(connect(&target, HOST, DEPTH * 2, now));
                Link {
                    target,
                    conn,
                    held: VecDeque::new(),
                }
            })
            .collect();
        let shared = Arc::new(VolumeQos::new(&cfg.qos, 1));
        let qos = QueueQos::replicated(
            shared,
            0,
            cfg.priority.arbiter(),
            n,
            cfg.replication.read_policy,
        );
        let mut req = Requests::new(
            cfg.name.clone(),
            vec![1; n],
            Some(Arc::clone(&rep)),
            Arc::new(Stats::default()),
            qos,
            DEPTH,
        );
        let cluster = match attachment {
            Some(a) => {
                let link = a.start(Some(rep.in_sync()), &cluster::spec_of(&cfg))?;
                rep.set_cluster(Arc::clone(&link));
                req.set_cluster(Arc::clone(&link));
                Some(link)
            }
            None => None,
        };
        Ok(Rig {
            req,
            net: Net {
                links,
                now,
                resets: Vec::new(),
            },
            rep,
            bufs: (0..DEPTH)
                .map(|_| vec![0u8; IO].into_boxed_slice())
                .collect(),
            cluster,
            _dir: dir,
        })
    }

    fn now(&self) -> qos_core::Nanos {
        self.req.now(self.net.now)
    }

    /// A write of `data` at byte `at` on tag `tag` (sent, not yet pumped).
    fn write(&mut self, tag: u16, at: u64, data: &[u8]) {
        self.bufs[usize::from(tag)].copy_from_slice(data);
        let cmd = Command::Write {
            nsid: 1,
            slba: at / u64::from(BS),
            block_size: BS,
            fua: false,
        };
        self.submit(tag, cmd, LimitKind::Write, Some(at..at + IO as u64));
    }

    /// A read of `IO` bytes at `at` on tag `tag`.
    fn read(&mut self, tag: u16, at: u64) {
        self.bufs[usize::from(tag)].fill(0);
        let cmd = Command::Read {
            nsid: 1,
            slba: at / u64::from(BS),
            block_size: BS,
        };
        self.submit(tag, cmd, LimitKind::Read, None);
    }

    fn submit(&mut self, tag: u16, command: Command, kind: LimitKind, write: Option<Range<u64>>) {
        let b = &mut self.bufs[usize::from(tag)];
        // SAFETY: the buffer outlives the request (the rig owns both) and
        // the test touches it only after the tag completed.
        let buf = Some(unsafe { TagBuf::exclusive(b.as_mut_ptr(), b.len()) });
        let now = self.now();
        let s = Submission {
            tag,
            command,
            buf,
            kind,
            bytes: IO as u64,
            class: NvmeClass::Medium,
            write,
        };
        self.req.submit(now, s, &mut self.net);
    }

    /// Move bytes on every live link and hand completions to the core
    /// until nothing moves.
    fn pump(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for r in 0..self.net.links.len() {
                let now = self.net.now;
                let Some((q, c)) = self.net.links[r].conn.as_mut() else {
                    continue;
                };
                moved |= transfer(q, c, now);
                for e in events(q) {
                    match e {
                        Event::Completed(done) => {
                            let qnow = self.now();
                            self.req.on_completion(qnow, r, &done, &mut self.net);
                        }
                        Event::Failed(_) => self.cut(r),
                        Event::Connected { .. } => {}
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

    /// Replica `r`'s connection breaks (as the engine's `on_failure`): its
    /// unfinished parts are held, the replica set hears of it, and an
    /// out-of-sync replica's parts end.
    fn cut(&mut self, r: usize) {
        let Some((mut q, _)) = self.net.links[r].conn.take() else {
            return;
        };
        q.close();
        let mut held: VecDeque<_> = q.take_unfinished().into();
        held.extend(self.net.links[r].held.drain(..));
        self.req.path_failed(r);
        let now = self.now();
        self.req.drop_held_if_out(now, r, &mut held, &mut self.net);
        held.extend(self.net.links[r].held.drain(..));
        self.net.links[r].held = held;
    }

    /// Replica `r` connects again (once the replica set allows it) and
    /// its held parts go out.
    fn reconnect(&mut self, r: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.rep.may_connect(r) {
            assert!(Instant::now() < deadline, "replica {r} never allowed back");
            std::thread::sleep(Duration::from_millis(5));
        }
        let now = self.net.now;
        let target = Arc::clone(&self.net.links[r].target);
        self.net.links[r].conn = Some(connect(&target, HOST, DEPTH * 2, now));
        for req in std::mem::take(&mut self.net.links[r].held) {
            self.net.send(r, NvmeClass::Medium, req);
        }
    }

    fn result(&mut self, tag: u16) -> Option<bool> {
        self.req.take_result(tag)
    }

    fn holds(&self, r: usize, at: u64, data: &[u8]) -> bool {
        let d = self.net.links[r].target.data();
        &d[at as usize..at as usize + data.len()] == data
    }

    fn state(&self, r: usize) -> String {
        self.rep.status()[r].state.clone()
    }
}

/// A log recording every replica in sync after a clean stop.
fn all_in_sync(cfg: &VolumeConfig, ids: &[String]) {
    let geo = Geometry {
        volume_name: cfg.name.clone(),
        volume_size: SIZE,
        region_size: cfg.replication.region_size,
    };
    let path = cfg.replication.bitmap_path(&cfg.name);
    let (mut log, _) = IntentLog::open_or_create(&path, &geo, ids).unwrap();
    for r in 1..ids.len() {
        log.clear_all(r).unwrap();
        log.set_state(r, ReplicaSyncState::InSync).unwrap();
    }
    log.mark_clean_shutdown().unwrap();
    log.sync().unwrap();
}

#[test]
fn a_write_lands_on_every_replica_and_reads_back() {
    let _serial = serial();
    let mut rig = Rig::new(&[None, None, None]);
    let data = pattern(1);
    rig.write(0, 0, &data);
    rig.pump();
    assert_eq!(rig.result(0), Some(true));
    for r in 0..3 {
        assert!(rig.holds(r, 0, &data), "replica {r}");
    }
    rig.read(1, 0);
    rig.pump();
    assert_eq!(rig.result(1), Some(true));
    assert_eq!(&rig.bufs[1][..], &data[..]);
    assert_eq!(rig.req.fan_out().active(), 0);
}

#[test]
fn replica_lost_mid_write_completes_on_the_others_and_is_recorded() {
    let _serial = serial();
    let mut rig = Rig::new(&[None, None, None]);
    let data = pattern(2);
    rig.write(0, 1 << 20, &data);
    // The parts are on the queues; replica 1's link breaks before its
    // target sees anything.
    rig.cut(1);
    assert_eq!(rig.state(1), "fencing", "out of sync at once");
    assert!(
        rig.rep.status()[1].dirty_regions >= 1,
        "the missed write is recorded before any answer"
    );
    assert_eq!(rig.result(0), None, "the others have not answered");
    rig.pump();
    assert_eq!(rig.result(0), Some(true));
    assert!(rig.holds(0, 1 << 20, &data) && rig.holds(2, 1 << 20, &data));
    assert!(!rig.holds(1, 1 << 20, &data), "replica 1 never got it");
    // Writes now go to the in-sync replicas only, recorded for replica 1.
    let more = pattern(3);
    rig.write(1, 2 << 20, &more);
    rig.pump();
    assert_eq!(rig.result(1), Some(true));
    assert!(rig.rep.status()[1].dirty_regions >= 2);
}

#[test]
fn error_status_on_one_part_takes_that_replica_out() {
    let _serial = serial();
    let mut rig = Rig::new(&[None, Some((Fault::ErrorStatus, Trigger::NthIo(0))), None]);
    let data = pattern(4);
    rig.write(0, 0, &data);
    rig.pump();
    assert_eq!(rig.result(0), Some(true), "held by the two others");
    assert_eq!(rig.net.resets, vec![1], "its controller is reset");
    assert_ne!(rig.state(1), "in-sync");
    assert!(rig.rep.status()[1].dirty_regions >= 1);
    assert!(rig.holds(0, 0, &data) && rig.holds(2, 0, &data));
}

#[test]
fn error_status_on_the_only_replica_fails_the_write() {
    let _serial = serial();
    let mut rig = Rig::new(&[Some((Fault::ErrorStatus, Trigger::NthIo(0))), None]);
    rig.cut(1);
    rig.write(0, 0, &pattern(5));
    rig.pump();
    assert_eq!(rig.result(0), Some(false), "nowhere holds it");
    assert_eq!(rig.state(0), "in-sync", "the last in-sync replica stays so");
}

#[test]
fn read_is_retried_on_another_replica_after_an_error() {
    let _serial = serial();
    // Replica 0 (the primary, so reads go there) fails its second I/O:
    // the read after the write.
    let mut rig = Rig::new(&[Some((Fault::ErrorStatus, Trigger::NthIo(1))), None]);
    let data = pattern(6);
    rig.write(0, 0, &data);
    rig.pump();
    assert_eq!(rig.result(0), Some(true));
    rig.read(1, 0);
    rig.pump();
    assert_eq!(rig.result(1), Some(true));
    assert_eq!(&rig.bufs[1][..], &data[..], "read from replica 1");
    assert_eq!(rig.state(0), "in-sync", "a failed read changes no replica");
}

#[test]
fn read_on_a_dropped_replica_moves_to_another() {
    let _serial = serial();
    let mut rig = Rig::new(&[None, None]);
    let data = pattern(7);
    rig.write(0, 0, &data);
    rig.pump();
    rig.read(1, 0);
    // The read sits on replica 0's queue; its link breaks.
    rig.cut(0);
    rig.pump();
    assert_eq!(rig.result(1), Some(true));
    assert_eq!(&rig.bufs[1][..], &data[..]);
}

#[test]
fn last_in_sync_replica_holds_io_until_it_returns() {
    let _serial = serial();
    let mut rig = Rig::new(&[None, None]);
    rig.cut(1);
    let data = pattern(8);
    rig.write(0, 0, &data);
    rig.read(1, 0);
    // Replica 0, the last in sync, goes down with both parts on it.
    rig.cut(0);
    rig.pump();
    assert_eq!(rig.result(0), None, "held, not failed");
    assert_eq!(rig.result(1), None, "held, not failed");
    assert_eq!(rig.state(0), "in-sync");
    assert_eq!(rig.req.fan_out().active(), 2);
    rig.reconnect(0);
    rig.pump();
    assert_eq!(rig.result(0), Some(true));
    assert_eq!(rig.result(1), Some(true));
    assert!(rig.holds(0, 0, &data));
    assert_eq!(rig.req.fan_out().stale_events(), 0);
}

#[test]
fn many_requests_survive_a_replica_loss_between_any_two_steps() {
    let _serial = serial();
    // Eight writes of distinct data in flight; replica 2 is cut after
    // the first `k` link exchanges, for every k until all completed.
    for k in 0..6 {
        let mut rig = Rig::new(&[None, None, None]);
        for tag in 0..DEPTH {
            rig.write(tag, u64::from(tag) * IO as u64, &pattern(tag as u8 + 10));
        }
        for _ in 0..k {
            // One exchange per link.
            let once = |rig: &mut Rig| {
                for r in 0..3 {
                    let now = rig.net.now;
                    if let Some((q, c)) = rig.net.links[r].conn.as_mut() {
                        let mut out = Vec::new();
                        while q.poll_transmit(&mut out, 4096) > 0 {}
                        c.handle_bytes(&out);
                        let back = c.take_output();
                        q.handle_bytes(now, &back);
                        let mut ev = Vec::new();
                        while let Some(e) = q.poll_event() {
                            ev.push(e);
                        }
                        for e in ev {
                            if let Event::Completed(d) = e {
                                let qn = rig.now();
                                rig.req.on_completion(qn, r, &d, &mut rig.net);
                            }
                        }
                    }
                }
            };
            once(&mut rig);
        }
        rig.cut(2);
        rig.pump();
        for tag in 0..DEPTH {
            assert_eq!(rig.result(tag), Some(true), "k {k} tag {tag}");
            let at = u64::from(tag) * IO as u64;
            let data = pattern(tag as u8 + 10);
            assert!(rig.holds(0, at, &data) && rig.holds(1, at, &data));
            if !rig.holds(2, at, &data) {
                assert!(
                    rig.rep.status()[2].dirty_regions >= 1,
                    "k {k}: missed, not recorded"
                );
            }
        }
        assert_eq!(rig.req.fan_out().active(), 0);
    }
}

// Cluster mode: the same core with its health record in a real
// three-member etcd on loopback (cluster-store's test cluster; these tests
// fail, never skip, without Debian's etcd-server).

const HOST_A: &str = "nqn.2026-01.io.test:host-a";
const HOST_B: &str = "nqn.2026-01.io.test:host-b";

fn cluster_rig<'a>(endpoints: &'a [String], host: &'a str) -> ClusterRig<'a> {
    ClusterRig {
        endpoints,
        host,
        mode: AttachMode::Attach,
    }
}

/// Tick the rig (as the engine does every 50 ms) until `done`, for at most
/// `within`; whether `done` came.
fn tick_until(rig: &mut Rig, within: Duration, mut done: impl FnMut(&mut Rig) -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let now = rig.req.now(Instant::now());
        rig.req.cluster_tick(now, &mut rig.net);
        rig.pump();
        if done(rig) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn health_in_etcd(etcd: &EtcdCluster) -> cluster_store::HealthRecord {
    let store = cluster_store::Store::connect(StoreConfig {
        endpoints: etcd.endpoints(),
        op_timeout: Duration::from_secs(2),
    })
    .unwrap();
    store
        .read(&VolumeKeys::new("/fanout", "fan"), "fan")
        .unwrap()
        .health
        .expect("a health record")
}

#[test]
fn cluster_a_write_that_skips_a_replica_waits_for_etcd_and_a_lost_quorum_holds_only_those() {
    let _serial = serial();
    let mut etcd = EtcdCluster::start(3);
    let eps = etcd.endpoints();
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut rig = Rig::clustered(&[None, None], dir, cluster_rig(&eps, HOST_A), true).unwrap();
    let link = rig.cluster.clone().unwrap();
    assert_eq!(link.status().health_generation, 1);
    assert_eq!(health_in_etcd(&etcd).in_sync_set(), vec![true, true]);
    // Healthy: writes reach every replica and need nothing from etcd.
    rig.write(0, 0, &pattern(1));
    rig.pump();
    assert_eq!(rig.result(0), Some(true));

    // Quorum lost, then replica 1 fails: a write now skips it.
    etcd.kill(0);
    etcd.kill(1);
    rig.cut(1);
    rig.write(1, 1 << 20, &pattern(2));
    assert!(!tick_until(&mut rig, Duration::from_secs(2), |r| r
        .req
        .take_result(1)
        .is_some()));
    let st = link.status();
    assert_eq!(st.writes_waiting, 1, "{st:?}");
    assert!(
        st.pending_change.as_deref().unwrap_or("").contains("[1]"),
        "{st:?}"
    );
    assert!(!st.etcd_reachable, "{st:?}");
    assert!(
        !rig.holds(0, 1 << 20, &pattern(2)),
        "nothing was sent before etcd records replica 1 out of sync"
    );
    // A read needs no health change: it goes on.
    rig.read(2, 0);
    rig.pump();
    assert_eq!(rig.result(2), Some(true));
    assert_eq!(&rig.bufs[2][..], &pattern(1)[..]);

    // Quorum back: the record is written and the write completes.
    etcd.restart(0);
    etcd.restart(1);
    let mut result = None;
    assert!(tick_until(&mut rig, Duration::from_secs(60), |r| {
        result = r.req.take_result(1);
        result.is_some()
    }));
    assert_eq!(result, Some(true));
    assert!(rig.holds(0, 1 << 20, &pattern(2)));
    assert_eq!(health_in_etcd(&etcd).in_sync_set(), vec![true, false]);
    let st = link.status();
    assert_eq!((st.writes_waiting, st.pending_change), (0, None));
    assert_eq!(st.health_generation, 2);
    assert!(
        tick_until(&mut rig, Duration::from_secs(30), |_| link
            .status()
            .etcd_reachable),
        "keep-alives get through again"
    );
    link.stop_and_wait(true);
}

#[test]
fn cluster_the_next_owner_starts_from_etcds_record_and_the_same_host_from_its_bitmap() {
    let _serial = serial();
    let etcd = EtcdCluster::start(3);
    let eps = etcd.endpoints();
    let dir_a = Arc::new(tempfile::tempdir().unwrap());
    let a_again = |all_in_sync| {
        Rig::clustered(
            &[None, None],
            dir_a.clone(),
            cluster_rig(&eps, HOST_A),
            all_in_sync,
        )
    };
    let mut a = a_again(true).unwrap();
    a.cut(1);
    a.write(0, 1 << 20, &pattern(3));
    assert!(tick_until(&mut a, Duration::from_secs(30), |r| r
        .req
        .take_result(0)
        .is_some()));
    assert_eq!(a.rep.status()[1].dirty_regions, 1);
    // A clean stop; the same host returns and nobody came between: its
    // bitmap is trusted (one region to copy, not the whole volume).
    a.rep.close_clean();
    a.cluster.clone().unwrap().stop_and_wait(true);
    drop(a);
    let a2 = a_again(false).unwrap();
    assert_eq!(a2.rep.status()[1].dirty_regions, 1, "from the bitmap");
    // Now host a dies (its lease runs out by itself).
    a2.cluster.clone().unwrap().halt();
    drop(a2);

    // Host b, whose own log (a stale one) says every replica is in sync:
    // refused while a's lease lives, naming a; then it attaches and starts
    // from etcd's record: replica 0 the source, replica 1 copied in full.
    let dir_b = Arc::new(tempfile::tempdir().unwrap());
    let b_try = || {
        Rig::clustered(
            &[None, None],
            dir_b.clone(),
            cluster_rig(&eps, HOST_B),
            true,
        )
    };
    let e = b_try().err().expect("a still owns the volume");
    assert!(e.to_string().contains(HOST_A), "{e}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let b = loop {
        match b_try() {
            Ok(b) => break b,
            Err(e) if Instant::now() < deadline => {
                assert!(e.to_string().contains(HOST_A), "{e}");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("a's lease never ran out: {e}"),
        }
    };
    assert_eq!(b.state(0), "in-sync");
    assert_ne!(b.state(1), "in-sync");
    assert_eq!(
        b.rep.status()[1].dirty_regions,
        SIZE >> 20,
        "another host's bitmap is not here: a full copy"
    );
    let h = health_in_etcd(&etcd);
    assert!(h.epoch > 1 && !h.clean_shutdown);
    b.rep.close_clean();
    b.cluster.clone().unwrap().stop_and_wait(true);
    assert!(health_in_etcd(&etcd).clean_shutdown);
    drop(b);

    // Host a returns: b wrote the record since, so a's bitmap is not
    // trusted any more: a full copy.
    let a3 = a_again(false).unwrap();
    assert_eq!(a3.rep.status()[1].dirty_regions, SIZE >> 20);
    assert_eq!(health_in_etcd(&etcd).in_sync_set(), vec![true, false]);
    a3.cluster.clone().unwrap().stop_and_wait(true);
}

#[test]
fn cluster_a_reservation_conflict_fences_the_host_and_takes_no_replica_out() {
    let _serial = serial();
    let etcd = EtcdCluster::start(3);
    let eps = etcd.endpoints();
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut rig = Rig::clustered(
        &[None, Some((Fault::ReservationConflict, Trigger::NthIo(0)))],
        dir,
        cluster_rig(&eps, HOST_A),
        true,
    )
    .unwrap();
    let link = rig.cluster.clone().unwrap();
    rig.write(0, 0, &pattern(6));
    rig.pump();
    assert_eq!(rig.result(0), Some(false), "the write fails");
    assert!(link.is_fenced());
    assert!(link
        .status()
        .fenced
        .unwrap()
        .contains("Reservation Conflict"));
    assert_eq!(rig.state(1), "in-sync", "not a replica failure");
    assert!(rig.net.resets.is_empty(), "nothing is reset or retried");
    // From now on nothing reaches a target, reads included.
    let before = rig.net.links[0].target.data()[..IO].to_vec();
    rig.write(1, 0, &pattern(7));
    rig.read(2, 0);
    rig.pump();
    assert_eq!((rig.result(1), rig.result(2)), (Some(false), Some(false)));
    assert_eq!(rig.net.links[0].target.data()[..IO], before[..]);
    assert_eq!(health_in_etcd(&etcd).in_sync_set(), vec![true, true]);
}
