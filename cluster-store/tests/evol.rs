//! The eVol layer's transactions against a real three-member etcd on
//! loopback: leadership guards every mutation, a logical extent is mapped
//! once, a physical extent never twice (also across a leader failover),
//! and `check` finds what is broken.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use cluster_store::evol::{
    check, ChangeOutcome, EvolKeys, EvolSpec, Finding, LeaderRecord, Leadership, MapOutcome,
    NamespaceRecord, PextRecord, Placement, ZeroingOutcome, DEFAULT_EXTENT_BYTES,
};
use cluster_store::records::SCHEMA;
use cluster_store::testing::EtcdCluster;
use cluster_store::Store;

const OP: Duration = Duration::from_secs(3);

fn leader(s: &Store, id: &str) -> LeaderRecord {
    LeaderRecord {
        schema: SCHEMA,
        id: id.into(),
        address: "127.0.0.1:7000".into(),
        lease: s.grant_lease(Duration::from_secs(30)).unwrap(),
    }
}

fn ns(id: &str, target: &str, extents: u64) -> NamespaceRecord {
    NamespaceRecord {
        schema: SCHEMA,
        id: id.into(),
        target: target.into(),
        address: "127.0.0.1:4420".into(),
        subnqn: format!("nqn.2026-01.io.test:{id}"),
        nsid: 1,
        extents,
        extent_bytes: DEFAULT_EXTENT_BYTES,
    }
}

fn at(ns: &str, pext: u64) -> Placement {
    Placement {
        namespace: ns.into(),
        pext,
    }
}

fn spec(name: &str) -> EvolSpec {
    EvolSpec {
        schema: SCHEMA,
        name: name.into(),
        size_bytes: 64 * DEFAULT_EXTENT_BYTES,
        extent_bytes: DEFAULT_EXTENT_BYTES,
        copies: 2,
        weight: 1,
    }
}

#[test]
fn only_the_leader_mutates_and_a_deposed_leader_cannot() {
    let c = EtcdCluster::start(3);
    let s = c.store(OP).unwrap();
    let keys = EvolKeys::new("/ev");
    let a = leader(&s, "arbiter-a");
    let b = leader(&s, "arbiter-b");
    let la = s
        .campaign(&keys, &a)
        .unwrap()
        .expect("a wins a free election");
    assert_eq!(
        s.campaign(&keys, &a).unwrap(),
        Some(la),
        "a campaign sent again after a lost answer finds its own win"
    );
    assert_eq!(s.campaign(&keys, &b).unwrap(), None, "b stands by");
    assert_eq!(s.leader(&keys).unwrap().unwrap().id, "arbiter-a");
    assert!(s.put_namespace(&keys, la, &ns("n0", "t0", 16)).unwrap());
    assert_eq!(
        s.create_evol(&keys, la, &spec("v")).unwrap(),
        Some(spec("v"))
    );
    // a's lease ends (it died): b is elected; a's leadership is void even
    // though a does not know.
    s.revoke(a.lease).unwrap();
    let lb = s.campaign(&keys, &b).unwrap().expect("b wins");
    assert_ne!(la, lb);
    assert_eq!(
        s.map_extent(&keys, la, "v", 0, &[at("n0", 0)]).unwrap(),
        MapOutcome::NotLeader
    );
    assert!(!s.put_namespace(&keys, la, &ns("n1", "t1", 16)).unwrap());
    assert!(matches!(
        s.map_extent(&keys, lb, "v", 0, &[at("n0", 0)]).unwrap(),
        MapOutcome::Mapped(_)
    ));
    assert_eq!(
        s.create_evol(&keys, lb, &spec("v")).unwrap(),
        Some(spec("v")),
        "created once; the spec in etcd"
    );
}

#[test]
fn an_extent_is_mapped_once_and_a_physical_extent_never_twice() {
    let c = EtcdCluster::start(3);
    let s = c.store(OP).unwrap();
    let keys = EvolKeys::new("/ev");
    let l = s.campaign(&keys, &leader(&s, "a")).unwrap().unwrap();
    for (n, t) in [("n0", "t0"), ("n1", "t1"), ("n2", "t1")] {
        s.put_namespace(&keys, l, &ns(n, t, 8)).unwrap();
    }
    s.create_evol(&keys, l, &spec("v")).unwrap();
    s.create_evol(&keys, l, &spec("w")).unwrap();

    // Two first writes to logical extent 3 race with different choices:
    // one mapping wins, the other request is told to use it.
    let barrier = Arc::new(Barrier::new(2));
    let outcomes: Vec<MapOutcome> = [
        vec![at("n0", 1), at("n1", 1)],
        vec![at("n0", 2), at("n2", 2)],
    ]
    .into_iter()
    .map(|copies| {
        let s = c.store(OP).unwrap();
        let keys = keys.clone();
        let barrier = barrier.clone();
        std::thread::spawn(move || {
            barrier.wait();
            s.map_extent(&keys, l, "v", 3, &copies).unwrap()
        })
    })
    .collect::<Vec<_>>()
    .into_iter()
    .map(|t| t.join().unwrap())
    .collect();
    let won: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            MapOutcome::Mapped(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(won.len(), 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .any(|o| *o == MapOutcome::AlreadyMapped(won[0].clone())),
        "{outcomes:?}"
    );
    // Another extent (of another eVol) wanting a taken physical extent.
    let taken = won[0].copies[0].clone();
    assert_eq!(
        s.map_extent(&keys, l, "w", 0, &[taken.clone(), at("n2", 5)])
            .unwrap(),
        MapOutcome::PextTaken(taken)
    );
    let pool = s.read_pool(&keys).unwrap();
    assert_eq!(check(&pool), vec![], "sound: {pool:?}");
    assert_eq!(pool.extents.len(), 1);
    assert_eq!(pool.pexts.len(), 2, "the losers took nothing");
    assert_eq!(s.read_extents(&keys, "v").unwrap(), won);

    // A discard of the whole extent leaves its physical extents waiting
    // for zeroing (rule 5): in etcd, not free, not orphans. Only the
    // mapping held is unmapped, only by the leader.
    let mut stale = won[0].clone();
    stale.copies[1] = at("n2", 7);
    assert_eq!(
        s.unmap_extent(&keys, l, &stale).unwrap(),
        ChangeOutcome::Changed
    );
    let other = Leadership {
        revision: l.revision + 1000,
    };
    assert_eq!(
        s.unmap_extent(&keys, other, &won[0]).unwrap(),
        ChangeOutcome::NotLeader
    );
    assert_eq!(
        s.unmap_extent(&keys, l, &won[0]).unwrap(),
        ChangeOutcome::Done
    );
    // A retry whose first attempt committed (its answer lost) is told so.
    assert_eq!(
        s.unmap_extent(&keys, l, &won[0]).unwrap(),
        ChangeOutcome::AlreadyDone
    );
    let pool = s.read_pool(&keys).unwrap();
    assert!(pool.extents.is_empty() && pool.pexts.is_empty());
    assert_eq!(check(&pool), vec![], "zeroing is no finding: {pool:?}");
    let freed = PextRecord::freed_from(&won[0].evol, won[0].index);
    let zeroing: Vec<_> = pool.zeroing.iter().collect();
    assert_eq!(zeroing.len(), 2, "{pool:?}");
    assert!(zeroing.iter().all(|(_, r)| **r == freed));
    let first = won[0].copies[0].clone();
    assert_eq!(
        s.map_extent(&keys, l, "w", 0, &[first.clone(), at("n2", 5)])
            .unwrap(),
        MapOutcome::PextTaken(first.clone()),
        "never mapped before it is zeroed"
    );
    // Only the leader frees it, and only from the record it read.
    assert_eq!(
        s.finish_zeroing(&keys, other, &first, &freed).unwrap(),
        ZeroingOutcome::NotLeader
    );
    assert_eq!(
        s.finish_zeroing(&keys, l, &first, &PextRecord::freed_from("x", 0))
            .unwrap(),
        ZeroingOutcome::Changed
    );
    assert_eq!(
        s.finish_zeroing(&keys, l, &first, &freed).unwrap(),
        ZeroingOutcome::Freed
    );
    assert_eq!(
        s.finish_zeroing(&keys, l, &first, &freed).unwrap(),
        ZeroingOutcome::AlreadyFree
    );
    assert!(matches!(
        s.map_extent(&keys, l, "w", 0, &[first, at("n2", 5)])
            .unwrap(),
        MapOutcome::Mapped(_)
    ));
    let pool = s.read_pool(&keys).unwrap();
    assert_eq!(check(&pool), vec![], "{pool:?}");
    assert_eq!((pool.pexts.len(), pool.zeroing.len()), (2, 1));

    // Spec changes: from the spec held only, retries told they committed.
    let w = spec("w");
    let grown = EvolSpec {
        size_bytes: 2 * w.size_bytes,
        ..w.clone()
    };
    assert_eq!(
        s.update_evol(&keys, other, &w, &grown).unwrap(),
        ChangeOutcome::NotLeader
    );
    let bigger = EvolSpec {
        size_bytes: 3 * w.size_bytes,
        ..w.clone()
    };
    assert_eq!(
        s.update_evol(&keys, l, &grown, &bigger).unwrap(),
        ChangeOutcome::Changed,
        "the spec is not the one held"
    );
    for want in [ChangeOutcome::Done, ChangeOutcome::AlreadyDone] {
        assert_eq!(s.update_evol(&keys, l, &w, &grown).unwrap(), want);
    }
    assert_eq!(
        s.delete_evol(&keys, l, &w).unwrap(),
        ChangeOutcome::Changed,
        "the spec is the grown one"
    );
    for want in [ChangeOutcome::Done, ChangeOutcome::AlreadyDone] {
        assert_eq!(s.delete_evol(&keys, l, &grown).unwrap(), want);
    }
}

#[test]
fn first_writes_across_a_failover_map_nothing_twice() {
    let c = EtcdCluster::start(3);
    let s = c.store(OP).unwrap();
    let keys = EvolKeys::new("/ev");
    let a = leader(&s, "a");
    let la = s.campaign(&keys, &a).unwrap().unwrap();
    for n in 0..4 {
        s.put_namespace(&keys, la, &ns(&format!("n{n}"), &format!("t{}", n / 2), 64))
            .unwrap();
    }
    s.create_evol(&keys, la, &spec("v")).unwrap();
    // Both arbiters hand out physical extents from their own view of what
    // is free: extent l wants physical extent l on two namespaces. The
    // new leader's view is stale (built before the old one's last
    // mappings landed): etcd is what keeps them apart.
    let copies = |l: u64| {
        [
            at(&format!("n{}", l % 4), l),
            at(&format!("n{}", (l + 1) % 4), l),
        ]
    };
    let map = |lead, l: u64| s.map_extent(&keys, lead, "v", l, &copies(l)).unwrap();
    for l in 0..12 {
        assert!(matches!(map(la, l), MapOutcome::Mapped(_)), "extent {l}");
    }
    // a's lease ends (it died); b is elected.
    s.revoke(a.lease).unwrap();
    let lb = s.campaign(&keys, &leader(&s, "b")).unwrap().unwrap();
    // a does not know yet: every mapping it still sends is refused.
    for l in 12..24 {
        assert_eq!(map(la, l), MapOutcome::NotLeader, "extent {l}");
    }
    // b serves first writes to extents a mapped (answered with a's
    // mapping), and with a stale free set asks for physical extents a
    // took for other extents (refused: taken), and for free ones (mapped).
    for l in 6..18 {
        match map(lb, l) {
            MapOutcome::AlreadyMapped(r) => assert!(l < 12 && r.copies == copies(l)),
            MapOutcome::Mapped(_) => assert!(l >= 12, "extent {l}"),
            other => panic!("extent {l}: {other:?}"),
        }
    }
    let stale = [at("n1", 4), at("n2", 40)];
    assert_eq!(
        s.map_extent(&keys, lb, "v", 40, &stale).unwrap(),
        MapOutcome::PextTaken(at("n1", 4))
    );
    let pool = s.read_pool(&keys).unwrap();
    assert_eq!(check(&pool), vec![], "no physical extent mapped twice");
    assert_eq!(pool.extents.len(), 18);
    assert_eq!(pool.pexts.len(), 36);
}

#[test]
fn check_finds_orphans_broken_back_pointers_and_out_of_range_copies() {
    let c = EtcdCluster::start(3);
    let s = c.store(OP).unwrap();
    let keys = EvolKeys::new("/ev");
    let l = s.campaign(&keys, &leader(&s, "a")).unwrap().unwrap();
    s.put_namespace(&keys, l, &ns("n0", "t0", 4)).unwrap();
    s.put_namespace(&keys, l, &ns("n1", "t1", 4)).unwrap();
    let MapOutcome::Mapped(rec) = s
        .map_extent(&keys, l, "v", 0, &[at("n0", 0), at("n1", 0)])
        .unwrap()
    else {
        panic!("mapped")
    };
    // Damage the records behind the store's back, as a bug or a hand
    // edit would.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut raw = rt
        .block_on(etcd_client::Client::connect(c.endpoints(), None))
        .unwrap();
    let back = |evol: &str, index: u64| {
        format!("{{\"schema\":{SCHEMA},\"evol\":\"{evol}\",\"index\":{index}}}")
    };
    rt.block_on(raw.put(keys.pext("n0", 3), back("ghost", 9), None))
        .unwrap();
    rt.block_on(raw.put(keys.pext("n1", 0), back("v", 7), None))
        .unwrap();
    let far = format!(
        "{{\"schema\":{SCHEMA},\"evol\":\"v\",\"index\":1,\"copies\":[{{\"namespace\":\"n0\",\"pext\":0}},{{\"namespace\":\"n0\",\"pext\":99}}]}}"
    );
    rt.block_on(raw.put(keys.extent("v", 1), far, None))
        .unwrap();
    // A physical extent waiting for zeroing that a mapping uses.
    let zeroing = format!("{{\"schema\":{SCHEMA},\"evol\":\"old\",\"index\":4,\"zeroing\":true}}");
    rt.block_on(raw.put(keys.pext("n0", 2), zeroing.clone(), None))
        .unwrap();
    let reuse = format!(
        "{{\"schema\":{SCHEMA},\"evol\":\"v\",\"index\":2,\"copies\":[{{\"namespace\":\"n0\",\"pext\":2}}]}}"
    );
    rt.block_on(raw.put(keys.extent("v", 2), reuse, None))
        .unwrap();
    // And one nobody maps: no finding.
    rt.block_on(raw.put(keys.pext("n1", 3), zeroing, None))
        .unwrap();
    let pool = s.read_pool(&keys).unwrap();
    assert_eq!(pool.zeroing.len(), 2, "{pool:?}");
    let found = check(&pool);
    assert!(has_mapped_while_zeroing(&found, "n0", 2), "{found:?}");
    assert!(
        !found.iter().any(|f| matches!(f,
            Finding::Orphan { copy } | Finding::BrokenBackPointer { copy, .. } if copy.pext == 2 || copy.namespace == "n1" && copy.pext == 3)),
        "{found:?}"
    );
    let has = |f: &dyn Fn(&Finding) -> bool| found.iter().any(f);
    assert!(
        has(&|f| matches!(f, Finding::Orphan { copy } if copy.pext == 3)),
        "{found:?}"
    );
    assert!(
        has(
            &|f| matches!(f, Finding::BrokenBackPointer { index: 0, copy, .. } if copy.namespace == "n1")
        ),
        "{found:?}"
    );
    assert!(
        has(&|f| matches!(f, Finding::OutOfRange { index: 1, .. })),
        "{found:?}"
    );
    assert!(
        has(&|f| matches!(f, Finding::SameNamespace { index: 1, .. })),
        "{found:?}"
    );
    assert!(
        has(&|f| matches!(f, Finding::MappedTwice { copy, .. } if *copy == rec.copies[0])),
        "{found:?}"
    );
}

fn has_mapped_while_zeroing(found: &[Finding], ns: &str, pext: u64) -> bool {
    found.iter().any(|f| {
        matches!(f, Finding::MappedWhileZeroing { copy, users }
            if copy.namespace == ns && copy.pext == pext && users == &[("v".to_owned(), 2)])
    })
}

#[test]
fn evol_owners_are_the_hosts_whose_volume_spec_names_the_evol() {
    let c = EtcdCluster::start(1);
    let s = c.store(OP).unwrap();
    let keys = EvolKeys::new("/eo");
    assert!(s.evol_owners(&keys, "ev").unwrap().is_empty());
    // A device named otherwise serving eVol "ev", as ublk-nvmf attaches it.
    let attach = |device: &str, replicas: Vec<String>, host: &str| {
        let vk = cluster_store::records::VolumeKeys::new("/eo", device);
        let lease = s.grant_lease(Duration::from_secs(30)).unwrap();
        s.attach(
            &vk,
            device,
            &cluster_store::records::VolumeSpec::new(replicas),
            host,
            lease,
            cluster_store::AttachMode::Attach,
        )
        .unwrap();
    };
    attach("dev0", vec!["evol ev".into()], "nqn.2026-01.io.test:h1");
    // A replicated volume named like the eVol is not its owner.
    attach(
        "other",
        vec!["127.0.0.1:4420 nqn.x nsid 1".into()],
        "nqn.2026-01.io.test:h2",
    );
    let owners = s.evol_owners(&keys, "ev").unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].0, "dev0");
    assert_eq!(owners[0].1.host_nqn, "nqn.2026-01.io.test:h1");
    assert!(s.evol_owners(&keys, "other").unwrap().is_empty());
}
