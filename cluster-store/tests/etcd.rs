//! The guarded transactions against a real three-member etcd cluster on
//! loopback (Debian's etcd-server; these tests fail, never skip, without
//! it).

use std::sync::{Arc, Barrier};
use std::time::Duration;

use cluster_store::testing::EtcdCluster;
use cluster_store::{AttachMode, HealthRecord, Store, StoreError, VolumeKeys, VolumeSpec};

const OP: Duration = Duration::from_secs(3);

fn spec() -> VolumeSpec {
    VolumeSpec::new(vec![
        "a:4420 nqn.a nsid 1".into(),
        "b:4420 nqn.b nsid 1".into(),
    ])
}

fn store(c: &EtcdCluster) -> Store {
    c.store(OP).expect("a client")
}

#[test]
fn of_two_hosts_racing_to_attach_exactly_one_wins_and_the_other_is_told_who() {
    let c = EtcdCluster::start(3);
    let keys = VolumeKeys::new("/t", "race");
    let barrier = Arc::new(Barrier::new(2));
    let results: Vec<_> = ["nqn.host:a", "nqn.host:b"]
        .into_iter()
        .map(|host| {
            let s = store(&c);
            let keys = keys.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let lease = s.grant_lease(Duration::from_secs(10)).unwrap();
                barrier.wait();
                s.attach(&keys, "race", &spec(), host, lease, AttachMode::Attach)
                    .map(|a| (host, a.epoch))
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let won: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 1, "{results:?}");
    assert_eq!(won[0].1, 1, "the first epoch");
    let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    let msg = lost.to_string();
    assert!(
        matches!(lost, StoreError::Owned { .. }) && msg.contains(won[0].0),
        "the loser names the owner: {msg}"
    );
    // The spec was created once and is compared from now on.
    let s = store(&c);
    let view = s.read(&keys, "race").unwrap();
    assert_eq!(view.spec, Some(spec()));
    let other = VolumeSpec::new(vec!["x:1 nqn.x nsid 1".into()]);
    let lease = s.grant_lease(Duration::from_secs(5)).unwrap();
    let e = s
        .attach(
            &keys,
            "race",
            &other,
            "nqn.host:c",
            lease,
            AttachMode::Takeover,
        )
        .unwrap_err();
    assert!(e.to_string().contains("etcd has replicas"), "{e}");
}

#[test]
fn a_takeover_fences_the_old_owners_health_writes_and_a_lapsed_lease_frees_the_volume() {
    let c = EtcdCluster::start(3);
    let keys = VolumeKeys::new("/t", "v");
    let s = store(&c);
    let la = s.grant_lease(Duration::from_secs(2)).unwrap();
    let a = s
        .attach(&keys, "v", &spec(), "nqn.host:a", la, AttachMode::Attach)
        .unwrap();
    let h = HealthRecord::initial(&spec(), a.epoch);
    let rev = s.put_health(&keys, "v", a.epoch, 0, &h).unwrap();
    let h2 = h.next(a.epoch, &[true, true], false).unwrap();
    let rev2 = s.put_health(&keys, "v", a.epoch, rev, &h2).unwrap();
    assert!(rev2 > rev);
    // Host b may not attach while a's lease lives ...
    let lb = s.grant_lease(Duration::from_secs(10)).unwrap();
    assert!(matches!(
        s.attach(&keys, "v", &spec(), "nqn.host:b", lb, AttachMode::Attach),
        Err(StoreError::Owned { .. })
    ));
    // ... but may take over: a new epoch, and a's writes are refused.
    let b = s
        .attach(&keys, "v", &spec(), "nqn.host:b", lb, AttachMode::Takeover)
        .unwrap();
    assert_eq!(b.epoch, a.epoch + 1);
    assert_eq!(b.previous.as_ref().unwrap().host_nqn, "nqn.host:a");
    let h3 = h2.next(a.epoch, &[true, false], false).unwrap();
    match s.put_health(&keys, "v", a.epoch, rev2, &h3) {
        Err(StoreError::NotOwner { mine, current, .. }) => {
            assert_eq!((mine, current), (a.epoch, b.epoch))
        }
        other => panic!("{other:?}"),
    }
    let owner_a = a.view.owner.clone();
    assert!(owner_a.is_none(), "nobody owned it before a");
    // a cannot reclaim either.
    let mut rec = s.read(&keys, "v").unwrap().owner.unwrap();
    rec.host_nqn = "nqn.host:a".into();
    rec.epoch = a.epoch;
    rec.lease = la;
    assert!(matches!(
        s.reclaim(&keys, "v", &rec),
        Err(StoreError::NotOwner { .. })
    ));
    // b releases cleanly; then a lease that lapses frees the volume too.
    assert!(s.release(&keys, b.epoch).unwrap());
    let lc = s.grant_lease(Duration::from_secs(1)).unwrap();
    let c1 = s
        .attach(&keys, "v", &spec(), "nqn.host:c", lc, AttachMode::Attach)
        .unwrap();
    // etcd expires it on its own schedule (a loaded machine may delay it
    // by seconds): wait for it, never renewing it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s.read(&keys, "v").unwrap().owner.is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease never expired"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(s.lease_ttl(lc).unwrap(), -1, "the lease expired");
    // The same epoch may be reclaimed while nobody else attached.
    let lc2 = s.grant_lease(Duration::from_secs(10)).unwrap();
    let mut rec = c1.view.owner.clone().unwrap_or(rec);
    rec.host_nqn = "nqn.host:c".into();
    rec.epoch = c1.epoch;
    rec.lease = lc2;
    s.reclaim(&keys, "v", &rec).unwrap();
    assert_eq!(s.read(&keys, "v").unwrap().owner.unwrap().lease, lc2);
}

#[test]
fn one_member_down_changes_nothing_and_a_lost_quorum_is_reported_not_waited_on() {
    let mut c = EtcdCluster::start(3);
    let keys = VolumeKeys::new("/t", "q");
    let s = store(&c);
    let l = s.grant_lease(Duration::from_secs(30)).unwrap();
    let a = s
        .attach(&keys, "q", &spec(), "nqn.host:a", l, AttachMode::Attach)
        .unwrap();
    let h = HealthRecord::initial(&spec(), a.epoch);
    let mut rev = s.put_health(&keys, "q", a.epoch, 0, &h).unwrap();
    c.kill(0);
    // Requests that went to the dead member are retried on the others by
    // the caller; a few attempts always get through.
    let mut last = h.clone();
    for _ in 0..5 {
        let next = last.next(a.epoch, &[true, true], false).unwrap();
        let r = (0..10).find_map(|_| {
            s.put_health(&keys, "q", a.epoch, rev, &next)
                .map_err(|e| {
                    assert!(matches!(e, StoreError::Unreachable { .. }), "{e}");
                    std::thread::sleep(Duration::from_millis(300));
                })
                .ok()
        });
        rev = r.expect("a write with one member down");
        last = next;
        assert!(s.keep_alive(l).unwrap().is_some());
    }
    c.kill(1);
    let next = last.next(a.epoch, &[true, false], false).unwrap();
    let e = s.put_health(&keys, "q", a.epoch, rev, &next).unwrap_err();
    assert!(matches!(e, StoreError::Unreachable { .. }), "{e}");
    c.restart(0);
    c.restart(1);
    c.wait_ready(Duration::from_secs(60));
    let r = (0..20).find_map(|_| {
        s.put_health(&keys, "q", a.epoch, rev, &next)
            .map_err(|_| std::thread::sleep(Duration::from_millis(500)))
            .ok()
    });
    assert!(r.is_some(), "quorum back: the write goes through");
    assert_eq!(s.read(&keys, "q").unwrap().health, Some(next));
}

/// A guarded write sent again after its answer was lost (etcd committed
/// it; `Store::run` retried on the next member, or the caller retried)
/// finds its own commit instead of applying twice or reporting a
/// conflict.
#[test]
fn writes_sent_again_after_a_lost_answer_find_their_own_commit() {
    let c = EtcdCluster::start(3);
    let keys = VolumeKeys::new("/t", "again");
    let s = store(&c);
    let attach = |host: &str, lease, mode| {
        s.attach(&keys, "again", &spec(), host, lease, mode)
            .unwrap()
    };
    let la = s.grant_lease(Duration::from_secs(30)).unwrap();
    let a = attach("nqn.host:a", la, AttachMode::Attach);
    let again = attach("nqn.host:a", la, AttachMode::Attach);
    assert_eq!(again.epoch, a.epoch, "the epoch moves once");
    assert_eq!(s.read(&keys, "again").unwrap().epoch, a.epoch);
    // A takeover: once, and its predecessor is the other host.
    let lb = s.grant_lease(Duration::from_secs(30)).unwrap();
    let b = attach("nqn.host:b", lb, AttachMode::Takeover);
    let b2 = attach("nqn.host:b", lb, AttachMode::Takeover);
    assert_eq!((b.epoch, b2.epoch), (a.epoch + 1, a.epoch + 1));
    assert_eq!(b.previous.unwrap().host_nqn, "nqn.host:a");
    assert_eq!(s.read(&keys, "again").unwrap().epoch, b.epoch);
    // b's owner key gone (as when its lease lapses): a reclaim under a
    // new lease, then another under a third, which adopts the second's.
    assert!(s.release(&keys, b.epoch).unwrap());
    let mut rec = b.owner.clone();
    rec.lease = s.grant_lease(Duration::from_secs(30)).unwrap();
    assert_eq!(s.reclaim(&keys, "again", &rec).unwrap(), rec);
    let mut third = rec.clone();
    third.lease = s.grant_lease(Duration::from_secs(30)).unwrap();
    assert_eq!(
        s.reclaim(&keys, "again", &third).unwrap().lease,
        rec.lease,
        "the record in etcd, under the earlier reclaim's lease"
    );
    // Another host's record of the epoch is not ours.
    let mut other = third.clone();
    other.host_nqn = "nqn.host:c".into();
    assert!(matches!(
        s.reclaim(&keys, "again", &other),
        Err(StoreError::NotOwner { .. })
    ));
}

/// An eVol's stale marks are written against the mark's revision as their
/// writer last left it: a write sent again after a lost answer finds it,
/// a newer state replaces one the writer did not know of, and only the
/// epoch's owner writes.
#[test]
fn stale_marks_follow_the_revision_their_writer_last_left() {
    use cluster_store::evol::{EvolKeys, Placement};
    let c = EtcdCluster::start(1);
    let s = store(&c);
    let vkeys = VolumeKeys::new("/t", "m");
    let keys = EvolKeys::new("/t");
    let lease = s.grant_lease(Duration::from_secs(30)).unwrap();
    let a = s
        .attach(
            &vkeys,
            "m",
            &spec(),
            "nqn.host:a",
            lease,
            AttachMode::Attach,
        )
        .unwrap();
    let at = |pext| {
        vec![Placement {
            namespace: "n0".into(),
            pext,
        }]
    };
    let put = |copies: &[Placement], expected| {
        s.put_stale(&vkeys, &keys, "m", a.epoch, 0, copies, expected)
    };
    let r1 = put(&at(1), None).unwrap();
    assert!(r1 > 0);
    assert_eq!(
        put(&at(1), Some(0)).unwrap(),
        r1,
        "found, not written again"
    );
    let r2 = put(&at(2), Some(0)).unwrap();
    assert!(r2 > r1, "a newer state replaces an unknown one");
    assert_eq!(s.read_stale(&keys, "m").unwrap()[0].copies, at(2));
    for _ in 0..2 {
        assert_eq!(put(&[], Some(r2)).unwrap(), 0, "cleared, and found cleared");
    }
    assert!(s.read_stale(&keys, "m").unwrap().is_empty());
    let lb = s.grant_lease(Duration::from_secs(30)).unwrap();
    s.attach(&vkeys, "m", &spec(), "nqn.host:b", lb, AttachMode::Takeover)
        .unwrap();
    assert!(matches!(
        put(&at(3), Some(0)),
        Err(StoreError::NotOwner { .. })
    ));
    assert!(s.read_stale(&keys, "m").unwrap().is_empty());
}
