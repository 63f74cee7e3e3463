//! The arbiter against a real 3-member etcd (cluster_store::testing):
//! election, failover under allocation load, one mapping per extent,
//! refusals by a standby and over budget. Arbiters are the real binary,
//! killed with SIGKILL. These tests fail (never skip) without etcd.
//!
//! No timing assertions: every wait is on a condition with a generous
//! deadline.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_store::evol::{check, EvolKeys, ExtentRecord};
use cluster_store::testing::EtcdCluster;
use evol_arbiter::client::{ArbiterClient, ArbiterError, ClientOptions};
use evol_arbiter::pb::arbiter_client::ArbiterClient as Rpc;
use evol_arbiter::{limits, pb};

mod common;
use common::{client, wait_for, Arb, BIN, LONG};

/// The leader's id, once one leads.
fn leader(etcd: &EtcdCluster, prefix: &str) -> String {
    let store = etcd.store(Duration::from_secs(2)).unwrap();
    wait_for("a leader", || {
        store
            .leader(&EvolKeys::new(prefix))
            .ok()
            .flatten()
            .map(|l| l.id)
    })
}

/// A pool of 4 namespaces on 2 targets and eVol `v` with 2 copies.
fn setup_pool(c: &ArbiterClient, extents: u64) {
    for i in 0..4 {
        c.add_namespace(&pb::AddNamespaceRequest {
            id: format!("ns{i}"),
            target: format!("t{}", i / 2),
            address: format!("127.0.0.1:{}", 4420 + i / 2),
            subnqn: format!("nqn.2026-01.io.test:t{}", i / 2),
            nsid: 1 + i % 2,
            extents,
            capacity_bytes: 0,
        })
        .unwrap();
    }
    let v = c.create_volume("v", 512 * (2 << 20), 2, 1).unwrap();
    assert_eq!((v.copies, v.size_bytes), (2, 512 * (2 << 20)));
}

fn assert_sound(etcd: &EtcdCluster, prefix: &str) -> cluster_store::evol::PoolView {
    let store = etcd.store(Duration::from_secs(5)).unwrap();
    let view = store.read_pool(&EvolKeys::new(prefix)).unwrap();
    let findings = check(&view);
    assert!(findings.is_empty(), "check found {findings:?}");
    view
}

#[test]
fn failover_under_allocation_load_maps_every_extent_once() {
    let etcd = EtcdCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let prefix = "/failover";
    let mut arbs = [
        Arb::start(dir.path(), "a", &etcd, prefix),
        Arb::start(dir.path(), "b", &etcd, prefix),
    ];
    let first = leader(&etcd, prefix);
    let c = client(&etcd, prefix);
    setup_pool(&c, 1000);

    // Four threads allocate extents 0..200; ranges overlap pairwise, so
    // the same extent is asked for concurrently, before and after the
    // failover.
    let results: Arc<Mutex<Vec<ExtentRecord>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (results, done) = (Arc::clone(&results), Arc::clone(&done));
            let endpoints = etcd.endpoints();
            std::thread::spawn(move || {
                let mut o = ClientOptions::new(endpoints, prefix);
                o.rpc_timeout = Duration::from_secs(3);
                let c = ArbiterClient::connect(o).unwrap();
                let start = (t / 2) * 100;
                for i in start..start + 100 {
                    let rec = c
                        .allocate("v", i, Instant::now() + LONG)
                        .unwrap_or_else(|e| panic!("allocate {i}: {e}"));
                    assert_eq!((rec.evol.as_str(), rec.index), ("v", i));
                    results.lock().unwrap().push(rec);
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    wait_for("allocations before the kill", || {
        (done.load(std::sync::atomic::Ordering::Relaxed) >= 40).then_some(())
    });
    let killed = arbs.iter().position(|a| a.id == first).unwrap();
    arbs[killed].kill();
    for t in threads {
        t.join().expect("an allocating thread failed");
    }
    let second = leader(&etcd, prefix);
    assert_ne!(second, first, "the standby took over");

    // One mapping per extent, whoever asked and whichever leader answered.
    let mut by_index: BTreeMap<u64, ExtentRecord> = BTreeMap::new();
    for r in results.lock().unwrap().iter() {
        if let Some(prev) = by_index.insert(r.index, r.clone()) {
            assert_eq!(&prev, r, "extent {} answered two ways", r.index);
        }
    }
    assert_eq!(by_index.len(), 200);
    let view = assert_sound(&etcd, prefix);
    assert_eq!(view.extents.len(), 200);
    for e in &view.extents {
        assert_eq!(
            Some(e),
            by_index.get(&e.index),
            "etcd holds what was answered"
        );
        assert_eq!(e.copies.len(), 2);
        assert_ne!(e.copies[0].namespace, e.copies[1].namespace);
    }
    // The new leader loaded the catalog: asking again returns the same.
    let again = c.allocate("v", 7, Instant::now() + LONG).unwrap();
    assert_eq!(Some(&again), by_index.get(&7));
    let st = c.status().unwrap();
    assert!(st.leading);
    assert_eq!(st.leader_id, second);
    assert_eq!(st.mapped_extents, 200);
}

#[test]
fn standby_refuses_naming_the_leader_and_budgets_are_enforced() {
    let etcd = EtcdCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let prefix = "/refusals";
    let arbs = [
        Arb::start(dir.path(), "a", &etcd, prefix),
        Arb::start(dir.path(), "b", &etcd, prefix),
    ];
    let lead_id = leader(&etcd, prefix);
    let lead = arbs.iter().find(|a| a.id == lead_id).unwrap();
    let standby = arbs.iter().find(|a| a.id != lead_id).unwrap();
    let c = client(&etcd, prefix);
    setup_pool(&c, 400);

    // Concurrent Allocate of one extent: one mapping.
    let answers: Vec<ExtentRecord> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    client(&etcd, prefix)
                        .allocate("v", 42, Instant::now() + LONG)
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    assert_eq!(assert_sound(&etcd, prefix).extents.len(), 1);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The standby refuses mutations, naming the leader and its address.
        let mut sb = Rpc::connect(format!("http://{}", standby.addr))
            .await
            .unwrap();
        let st = wait_for_async(|| {
            let mut sb = sb.clone();
            async move {
                let e = sb
                    .allocate(pb::AllocateRequest {
                        evol: "v".into(),
                        index: 1,
                    })
                    .await
                    .unwrap_err();
                (e.code() == tonic::Code::FailedPrecondition).then_some(e)
            }
        })
        .await;
        assert!(st.message().contains(&lead.addr), "{st:?}");
        assert!(st.message().contains(&lead_id), "{st:?}");
        assert_eq!(
            st.metadata()
                .get(evol_arbiter::LEADER_METADATA)
                .unwrap()
                .to_str()
                .unwrap(),
            lead.addr
        );
        let e = sb
            .create_volume(pb::CreateVolumeRequest {
                name: "w".into(),
                size_bytes: 1 << 30,
                copies: 1,
                weight: 1,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        let s = sb.status(pb::StatusRequest {}).await.unwrap().into_inner();
        assert!(!s.leading);
        assert_eq!(s.leader_address, lead.addr);

        // Budgets at the leader.
        let mut l = Rpc::connect(format!("http://{}", lead.addr)).await.unwrap();
        let too_many = pb::ReportIoRequest {
            client: "host1".into(),
            evol: "v".into(),
            vectors: vec![pb::IoVector::default(); 4097],
        };
        let e = l.report_io(too_many).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("limit of 4096"), "{e:?}");
        let e = l
            .allocate(pb::AllocateRequest {
                evol: "x".repeat(65),
                index: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("limit of 64"), "{e:?}");
        let e = l
            .allocate(pb::AllocateRequest {
                evol: "../etc".into(),
                index: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        // A message over 4 MiB is refused before it is decoded.
        let huge = pb::CreateVolumeRequest {
            name: "y".repeat(5 << 20),
            size_bytes: 1,
            copies: 1,
            weight: 1,
        };
        let e = l.create_volume(huge).await.unwrap_err();
        assert!(
            e.message().contains("message length too large")
                || e.code() == tonic::Code::OutOfRange
                || e.code() == tonic::Code::ResourceExhausted,
            "{e:?}"
        );
        let e = l
            .request_slices(pb::RequestSlicesRequest {
                client: "host1".into(),
                evol: "v".into(),
                namespaces: vec!["ns0".into()],
                wait_ms: 5000,
                slices: 1,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = l
            .request_slices(pb::RequestSlicesRequest {
                client: "host1".into(),
                evol: "v".into(),
                namespaces: vec!["ns0".into()],
                wait_ms: 0,
                slices: limits::MAX_SLICES_PER_REQUEST + 1,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let e = l
            .report_io(pb::ReportIoRequest {
                client: "host1".into(),
                evol: "v".into(),
                vectors: vec![pb::IoVector {
                    namespace: "ns0".into(),
                    kind: pb::IoKind::Read as i32,
                    bytes: 4096,
                    latency_ns: 1,
                    age_ns: 0,
                    count: limits::MAX_VECTOR_COUNT + 1,
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        // An extent beyond the eVol's end.
        let e = l
            .allocate(pb::AllocateRequest {
                evol: "v".into(),
                index: 512,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    });

    // The view and the auction answer through the blocking client.
    let ack = c
        .report_io(
            "host1",
            "v",
            &[
                pb::IoVector {
                    namespace: "ns0".into(),
                    kind: pb::IoKind::Write as i32,
                    bytes: 4096,
                    latency_ns: 100_000,
                    age_ns: 0,
                    count: 0,
                },
                // An agent's aggregate: 64 reads of one size class.
                pb::IoVector {
                    namespace: "ns0".into(),
                    kind: pb::IoKind::Read as i32,
                    bytes: 64 * 4096,
                    latency_ns: 64 * 90_000,
                    age_ns: 0,
                    count: 64,
                },
            ],
        )
        .unwrap();
    assert_eq!((ack.accepted, ack.stale, ack.unknown), (2, 0, 0), "{ack:?}");
    let grants = wait_for("a slice grant", || {
        let g = c
            .request_slices("host1", "v", &["ns0".into()], 1, Duration::from_millis(200))
            .unwrap();
        (!g.is_empty()).then_some(g)
    });
    assert_eq!(grants[0].namespace, "ns0");
    assert!(grants[0].bytes > 0);
    // Once the flow has a quota, one round trip carries several slices.
    let grants = wait_for("several slices in one request", || {
        let g = c
            .request_slices("host1", "v", &["ns0".into()], 4, Duration::from_millis(200))
            .unwrap();
        (g.len() > 1).then_some(g)
    });
    assert!(grants.len() <= 4, "{grants:?}");
    c.release_slices("host1", "v", &["ns0".into()]).unwrap();
    let v = c.query_view(&[]).unwrap();
    assert_eq!(v.namespaces.len(), 4);
    // Clients aggregate over the view's epoch: the arbiter's default.
    assert_eq!(v.epoch_ns, evol_arbiter::config::DEFAULT_VIEW_EPOCH_NS);
    // Refusals retrying cannot cure end the call at once.
    match c.allocate("nope", 0, Instant::now() + LONG) {
        Err(ArbiterError::Refused { code, .. }) => assert_eq!(code, tonic::Code::NotFound),
        other => panic!("{other:?}"),
    }
    // Grow, then delete: the extents go back, the map stays sound.
    let g = c.grow_volume("v", 600 * (2 << 20)).unwrap();
    assert_eq!(g.size_bytes, 600 * (2 << 20));
    c.allocate("v", 599, Instant::now() + LONG).unwrap();
    assert_eq!(c.delete_volume("v", false).unwrap(), 4);
    let view = assert_sound(&etcd, prefix);
    assert!(view.extents.is_empty() && view.evols.is_empty() && view.pexts.is_empty());
    // `check` reads etcd alone.
    let out = Command::new(BIN)
        .args([
            "check",
            "--endpoints",
            &etcd.endpoints().join(","),
            "--prefix",
            prefix,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("no findings"));
}

/// tonic drops a handler's future when its caller goes away. A delete cut
/// there between an unmap's commit in etcd and the catalog's update would
/// lose that extent from its count and from the zeroing queue (found by
/// the zeroing test on a slow CI machine, whose first attempt outlived the
/// client's RPC timeout). Deletes are cut here at growing deadlines from
/// 1 ms until one stops mid-way; the retry must still count every physical
/// extent, and the leader must hold every one for zeroing.
#[test]
fn a_delete_whose_caller_gave_up_runs_to_its_end_and_its_retry_gets_the_count() {
    const MAPPED: u64 = 48;
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let prefix = "/cut";
    let arb = Arb::start(dir.path(), "a", &etcd, prefix);
    leader(&etcd, prefix);
    let c = client(&etcd, prefix);
    // Namespaces at ports nothing listens on: zeroing waits, so the
    // leader's zeroing queue can be counted.
    for i in 0..2 {
        c.add_namespace(&pb::AddNamespaceRequest {
            id: format!("ns{i}"),
            target: format!("t{i}"),
            address: format!("127.0.0.1:{}", common::free_port()),
            subnqn: format!("nqn.2026-01.io.test:t{i}"),
            nsid: 1,
            extents: 200,
            capacity_bytes: 0,
        })
        .unwrap();
    }
    c.create_volume("v", MAPPED * (2 << 20), 2, 1).unwrap();
    for i in 0..MAPPED {
        c.allocate("v", i, Instant::now() + LONG).unwrap();
    }
    let store = etcd.store(Duration::from_secs(5)).unwrap();
    let keys = EvolKeys::new(prefix);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rpc = rt
        .block_on(Rpc::connect(format!("http://{}", arb.addr)))
        .unwrap();
    let cut = (1..=500)
        .find_map(|ms| {
            let mut l = rpc.clone();
            let answer = rt.block_on(async {
                let call = l.delete_volume(pb::DeleteVolumeRequest {
                    name: "v".into(),
                    force: false,
                });
                tokio::time::timeout(Duration::from_millis(ms), call).await
            });
            if let Ok(answer) = answer {
                panic!("the delete finished within {ms} ms, never cut: {answer:?}");
            }
            let left = store.read_extents(&keys, "v").unwrap().len() as u64;
            (left < MAPPED).then_some(left)
        })
        .expect("no delete cut short at deadlines up to 500 ms reached etcd");
    assert!(cut < MAPPED, "{cut}");
    // The retry: every copy of every mapped extent, once.
    assert_eq!(c.delete_volume("v", false).unwrap(), 2 * MAPPED);
    let view = assert_sound(&etcd, prefix);
    assert!(view.extents.is_empty() && view.evols.is_empty());
    assert_eq!(view.zeroing.len() as u64, 2 * MAPPED);
    let st = c.status().unwrap();
    assert_eq!(st.zeroing_extents, 2 * MAPPED, "{st:?}");
    // Sent again (its answer lost), a finished delete answers the same.
    assert_eq!(c.delete_volume("v", false).unwrap(), 2 * MAPPED);
    // A new eVol of the name is a new one: its own delete, its own count.
    c.create_volume("v", 4 * (2 << 20), 1, 1).unwrap();
    c.allocate("v", 0, Instant::now() + LONG).unwrap();
    assert_eq!(c.delete_volume("v", false).unwrap(), 1);
    match c.delete_volume("never", false) {
        Err(ArbiterError::Refused { code, .. }) => assert_eq!(code, tonic::Code::NotFound),
        other => panic!("{other:?}"),
    }
}

async fn wait_for_async<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + LONG;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn config_errors_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "id = \"a\"\nlisten = \"127.0.0.1:0\"\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = 1\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:6:", path.display())) && err.contains("lease_ttl"),
        "{err}"
    );
    std::fs::write(
        &path,
        "id = \"a\"\nlisten = \"127.0.0.1:0\"\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\n[placement]\nbusy = -2.0\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:7:") && err.contains("placement.busy"),
        "{err}"
    );
}

/// The config the package installs as /etc/evol-arbiter/arbiter.toml, as
/// the operator checks it (packaging/check-debs runs the same command on
/// the installed file).
#[test]
fn the_shipped_config_passes_check_config() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/arbiter.toml");
    let out = Command::new(BIN)
        .args(["check-config", "--config", path])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "arbiter arbiter-1 on 127.0.0.1:7450, etcd http://127.0.0.1:2379 (prefix /ublk-nvmf, lease 5 s), extents of 2097152 bytes\n"
    );
}
