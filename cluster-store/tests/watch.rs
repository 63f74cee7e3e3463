//! The extent watch against a real three-member etcd on loopback: a
//! mapping made after the client's read reaches it, in order, and so does
//! one made between the read and the start of the watch (it continues from
//! the read's revision).

use std::sync::mpsc;
use std::time::Duration;

use cluster_store::evol::{ChangeOutcome, EvolKeys, LeaderRecord, MapOutcome, Placement};
use cluster_store::records::SCHEMA;
use cluster_store::testing::EtcdCluster;
use cluster_store::watch::{ExtentEvent, ExtentWatch};
use cluster_store::StoreConfig;

const OP: Duration = Duration::from_secs(3);

#[test]
fn the_watch_sees_mappings_made_after_the_read_and_before_it_started() {
    let c = EtcdCluster::start(3);
    let s = c.store(OP).unwrap();
    let keys = EvolKeys::new("/w");
    let me = LeaderRecord {
        schema: SCHEMA,
        id: "arb".into(),
        address: "127.0.0.1:7000".into(),
        lease: s.grant_lease(Duration::from_secs(30)).unwrap(),
    };
    let lead = s.campaign(&keys, &me).unwrap().expect("leader");
    let at = |ns: &str, p| Placement {
        namespace: ns.into(),
        pext: p,
    };
    let m = |i, ns, p| s.map_extent(&keys, lead, "v", i, &[at(ns, p)]).unwrap();
    assert!(matches!(m(0, "a", 0), MapOutcome::Mapped(_)));
    let snap = s.read_extents_at(&keys, "v").unwrap();
    assert_eq!(snap.extents.len(), 1);
    assert!(snap.revision > 0);
    // Between the read and the watch: must not be missed.
    assert!(matches!(m(1, "b", 0), MapOutcome::Mapped(_)));
    // Another eVol: must not be seen.
    assert!(matches!(
        s.map_extent(&keys, lead, "other", 0, &[at("c", 0)])
            .unwrap(),
        MapOutcome::Mapped(_)
    ));
    let (tx, rx) = mpsc::channel();
    let w = ExtentWatch::start(
        StoreConfig {
            endpoints: c.endpoints(),
            op_timeout: OP,
        },
        &keys,
        "v",
        snap.revision,
        move |e| {
            let _ = tx.send(e);
        },
    )
    .unwrap();
    let next = || rx.recv_timeout(Duration::from_secs(30)).expect("an event");
    match next() {
        ExtentEvent::Mapped(r) => assert_eq!((r.index, r.copies[0].namespace.as_str()), (1, "b")),
        e => panic!("{e:?}"),
    }
    assert!(matches!(m(7, "d", 3), MapOutcome::Mapped(_)));
    match next() {
        ExtentEvent::Mapped(r) => assert_eq!((r.index, r.copies[0].pext), (7, 3)),
        e => panic!("{e:?}"),
    }
    let rec = s.read_extents_at(&keys, "v").unwrap().extents[0].clone();
    assert_eq!(
        s.unmap_extent(&keys, lead, &rec).unwrap(),
        ChangeOutcome::Done
    );
    assert_eq!(next(), ExtentEvent::Unmapped(0));
    w.stop();
}
