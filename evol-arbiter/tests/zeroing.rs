//! Freed physical extents are zeroed before reuse, across a leader
//! failover too, and an eVol a client host serves is not deleted: a real
//! etcd (cluster_store::testing), an in-process gimbal-target with a file
//! namespace (its data survives a target restart), arbiters as the real
//! binary, killed with SIGKILL. The test writes the physical extents
//! directly over NVMe/TCP, as a client would.
//!
//! No timing assertions: every wait is on a condition with a generous
//! deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use cluster_store::evol::{check, EvolKeys, PoolView};
use cluster_store::records::{VolumeKeys, VolumeSpec};
use cluster_store::testing::EtcdCluster;
use cluster_store::{AttachMode, Store};
use evol_arbiter::client::{ArbiterClient, ArbiterError};
use gimbal_target::server::TargetHandle;
use nvmf_initiator::blocking::Controller;
use tonic::Code;

mod common;
use common::{client, free_port, wait_for, Arb, LONG};

const NQN: &str = "nqn.2026-01.io.test:zeroing";
const EXTENT: u64 = 2 << 20;
/// Extents per eVol.
const EXTENTS: u64 = 4;
/// Extents of the namespace: two eVols' worth.
const NS_EXTENTS: u64 = 2 * EXTENTS;
const PREFIX: &str = "/zero";

fn target(port: u16, image: &Path) -> TargetHandle {
    common::file_target(port, NQN, image, NS_EXTENTS * EXTENT)
}

fn host(port: u16) -> Controller {
    common::host(port, NQN)
}

/// Physical extent `p` read back, whole.
fn read_extent(c: &Controller, p: u64) -> Vec<u8> {
    let mut buf = vec![0xffu8; EXTENT as usize];
    c.read(1, p * EXTENT / 512, &mut buf).unwrap();
    buf
}

fn sound(store: &Store) -> PoolView {
    let view = store.read_pool(&EvolKeys::new(PREFIX)).unwrap();
    let findings = check(&view);
    assert!(findings.is_empty(), "check found {findings:?} in {view:?}");
    view
}

fn refused(r: Result<impl std::fmt::Debug, ArbiterError>) -> (Code, String) {
    match r {
        Err(ArbiterError::Refused { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Maps extents `range` of `evol`; the physical extents, in index order.
fn map(c: &ArbiterClient, evol: &str, range: std::ops::Range<u64>) -> Vec<u64> {
    range
        .map(|i| {
            let r = c.allocate(evol, i, Instant::now() + LONG).unwrap();
            assert_eq!(r.copies.len(), 1);
            r.copies[0].pext
        })
        .collect()
}

#[test]
fn freed_extents_are_zeroed_before_reuse_across_a_failover_and_owned_evols_stay() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("ns.img");
    let port = free_port();
    let t = target(port, &image);
    let store = etcd.store(Duration::from_secs(5)).unwrap();
    let a = Arb::start(dir.path(), "a", &etcd, PREFIX);
    let c = client(&etcd, PREFIX);
    common::add_ns0(&c, port, NQN, NS_EXTENTS);
    c.create_volume("v", EXTENTS * EXTENT, 1, 1).unwrap();
    c.create_volume("w", EXTENTS * EXTENT, 1, 1).unwrap();
    let pexts = map(&c, "v", 0..EXTENTS);
    // The client's data, written straight to the physical extents.
    let h = host(port);
    for (i, p) in pexts.iter().enumerate() {
        h.write(1, p * EXTENT / 512, &vec![0xa0 + i as u8; EXTENT as usize])
            .unwrap();
        assert!(read_extent(&h, *p).iter().all(|b| *b == 0xa0 + i as u8));
    }
    drop(h);
    sound(&store);

    // A host serving the eVol (cluster mode's owner key, under a device
    // name of its own): delete is refused, naming it.
    let lease = store.grant_lease(Duration::from_secs(60)).unwrap();
    store
        .attach(
            &VolumeKeys::new(PREFIX, "dev0"),
            "dev0",
            &VolumeSpec::new(vec!["evol v".into()]),
            "nqn.2026-01.io.test:host1",
            lease,
            AttachMode::Attach,
        )
        .unwrap();
    let (code, msg) = refused(c.delete_volume("v", false));
    assert_eq!(code, Code::FailedPrecondition, "{msg}");
    assert!(msg.contains("nqn.2026-01.io.test:host1"), "{msg}");
    assert_eq!(sound(&store).extents.len(), EXTENTS as usize);
    // The host stops (its owner key goes with its lease).
    store.revoke(lease).unwrap();

    // The target is down: the zeroing cannot happen yet.
    t.shutdown();
    assert_eq!(c.delete_volume("v", false).unwrap(), EXTENTS);
    let view = sound(&store);
    assert_eq!(
        (view.pexts.len(), view.zeroing.len()),
        (0, EXTENTS as usize)
    );
    let st = c.status().unwrap();
    assert_eq!(st.zeroing_extents, EXTENTS, "{st:?}");
    // Allocations get the never-used extents, none of the freed ones.
    let w_first = map(&c, "w", 0..2);
    assert!(
        w_first.iter().all(|p| !pexts.contains(p)),
        "{w_first:?} {pexts:?}"
    );
    sound(&store);

    // The leader dies; the next one reads the zeroing state from etcd.
    drop(a);
    let _b = Arb::start(dir.path(), "b", &etcd, PREFIX);
    wait_for("arbiter b to lead", || {
        store
            .leader(&EvolKeys::new(PREFIX))
            .ok()
            .flatten()
            .filter(|l| l.id == "b")
    });
    let st = c.status().unwrap();
    assert_eq!(
        (st.leader_id.as_str(), st.zeroing_extents),
        ("b", EXTENTS),
        "{st:?}"
    );
    let w_rest = map(&c, "w", 2..EXTENTS);
    assert!(
        w_rest.iter().all(|p| !pexts.contains(p)),
        "{w_rest:?} {pexts:?}"
    );
    // The pool is full but for the extents waiting for zeroing.
    c.create_volume("x", EXTENTS * EXTENT, 1, 1).unwrap_err();
    sound(&store);

    // The target is back (same file, old data on it): zeroed, then free.
    let _t = target(port, &image);
    wait_for("the zeroing to finish", || {
        (sound(&store).zeroing.is_empty()).then_some(())
    });
    let h = host(port);
    for p in &pexts {
        assert!(
            read_extent(&h, *p).iter().all(|b| *b == 0),
            "physical extent {p} reads old data"
        );
    }
    c.create_volume("x", EXTENTS * EXTENT, 1, 1).unwrap();
    let again = map(&c, "x", 0..EXTENTS);
    let mut sorted = again.clone();
    sorted.sort_unstable();
    let mut old = pexts.clone();
    old.sort_unstable();
    assert_eq!(sorted, old, "the zeroed extents are allocated again");
    for p in &again {
        assert!(read_extent(&h, *p).iter().all(|b| *b == 0));
    }
    sound(&store);

    // With the target up, the leader zeroes what a delete frees at once.
    for p in &again {
        h.write(1, p * EXTENT / 512, &vec![0x5a; EXTENT as usize])
            .unwrap();
    }
    assert_eq!(c.delete_volume("x", false).unwrap(), EXTENTS);
    wait_for("the zeroing to finish", || {
        let st = c.status().ok()?;
        (st.zeroing_extents == 0 && st.free_extents == EXTENTS).then_some(())
    });
    let view = sound(&store);
    assert!(view.zeroing.is_empty(), "{view:?}");
    assert_eq!(view.pexts.len(), EXTENTS as usize, "w's");
    for p in &again {
        assert!(read_extent(&h, *p).iter().all(|b| *b == 0));
    }

    // A mapping in etcd the leader does not hold (an allocation committed
    // whose answer was lost; the leader rolled it back): a delete still
    // unmaps it, so nothing of the eVol survives its spec.
    c.create_volume("o", EXTENTS * EXTENT, 1, 1).unwrap();
    let known = map(&c, "o", 0..1)[0];
    let orphan = *again.iter().find(|p| **p != known).unwrap();
    let (_, lead) = store
        .leadership(&EvolKeys::new(PREFIX))
        .unwrap()
        .expect("a leader");
    let ns = sound(&store).extents[0].copies[0].namespace.clone();
    let committed = store
        .map_extent(
            &EvolKeys::new(PREFIX),
            lead,
            "o",
            1,
            &[cluster_store::evol::Placement {
                namespace: ns,
                pext: orphan,
            }],
        )
        .unwrap();
    assert!(
        matches!(committed, cluster_store::evol::MapOutcome::Mapped(_)),
        "{committed:?}"
    );
    assert_eq!(c.delete_volume("o", false).unwrap(), 2);
    wait_for("the zeroing to finish", || {
        let st = c.status().ok()?;
        (st.zeroing_extents == 0 && st.free_extents == EXTENTS).then_some(())
    });
    let view = sound(&store);
    assert!(
        view.extents.iter().all(|e| e.evol != "o"),
        "a mapping of the deleted eVol survived: {view:?}"
    );
    assert_eq!(view.pexts.len(), EXTENTS as usize, "w's");
}
