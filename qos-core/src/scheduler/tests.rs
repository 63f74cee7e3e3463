use super::*;
use proptest::prelude::*;

const K: u64 = 1024;
const A: TenantId = TenantId(1);
const B: TenantId = TenantId(2);

fn scheduler(tenants: &[TenantId]) -> VirtualSlotScheduler<u32> {
    let mut s = VirtualSlotScheduler::new(&GimbalConfig::default()).unwrap();
    for t in tenants {
        s.add_tenant(*t).unwrap();
    }
    s
}

fn fill(s: &mut VirtualSlotScheduler<u32>, t: TenantId, kind: IoKind, bytes: u64, n: u32) {
    for i in 0..n {
        s.enqueue(Nanos(0), t, kind, bytes, 0, i).unwrap();
    }
}

fn drain(s: &mut VirtualSlotScheduler<u32>, write_cost: f64) -> Vec<Dispatched<u32>> {
    let mut out = Vec::new();
    while let Some(d) = s.dispatch(write_cost) {
        out.push(d);
        s.check_invariants().unwrap();
    }
    out
}

#[test]
fn single_tenant_gets_eight_slots_of_128k() {
    let mut s = scheduler(&[A]);
    fill(&mut s, A, IoKind::Read, 128 * K, 20);
    let sent = drain(&mut s, 1.0);
    assert_eq!(sent.len(), 8);
    let snap = s.tenant_snapshot(A).unwrap();
    assert!(snap.deferred);
    assert_eq!(snap.deficit_bytes, 0);
    assert_eq!(snap.slots_in_use, 8);
    // One completion frees one slot: one more dispatch.
    let done = s.complete(sent[0].id).unwrap();
    assert!(done.slot_completed);
    assert_eq!(drain(&mut s, 1.0).len(), 1);
}

#[test]
fn small_ios_share_a_slot() {
    let mut s = scheduler(&[A]);
    fill(&mut s, A, IoKind::Read, 4 * K, 300);
    let sent = drain(&mut s, 1.0);
    assert_eq!(sent.len(), 8 * 32);
    // A slot completes only when all 32 of its I/Os do.
    for d in &sent[..31] {
        assert!(!s.complete(d.id).unwrap().slot_completed);
    }
    assert_eq!(s.credit(A), Some(8));
    assert!(s.complete(sent[31].id).unwrap().slot_completed);
    assert_eq!(s.credit(A), Some(8 * 32));
}

#[test]
fn slots_are_split_among_contending_tenants() {
    let mut s = scheduler(&[A, B]);
    fill(&mut s, A, IoKind::Read, 128 * K, 10);
    fill(&mut s, B, IoKind::Read, 128 * K, 10);
    assert_eq!(s.allotted_slots(), 4);
    let sent = drain(&mut s, 1.0);
    let a = sent.iter().filter(|d| d.tenant == A).count();
    let b = sent.iter().filter(|d| d.tenant == B).count();
    assert_eq!((a, b), (4, 4));
    // Alternation: one 128 KiB request per quantum.
    let order: Vec<_> = sent.iter().map(|d| d.tenant).collect();
    assert_eq!(order[..4], [A, B, A, B]);
    assert_eq!(s.credit(A), Some(4));
}

#[test]
fn at_least_one_slot_under_heavy_consolidation() {
    let tenants: Vec<_> = (0..20).map(TenantId).collect();
    let mut s = scheduler(&tenants);
    for t in &tenants {
        fill(&mut s, *t, IoKind::Read, 128 * K, 3);
    }
    assert_eq!(s.allotted_slots(), 1);
    assert_eq!(drain(&mut s, 1.0).len(), 20);
}

#[test]
fn write_waits_for_write_cost_rounds() {
    // §3.5 example: a 128 KiB write at write cost 3 goes out after three
    // rounds; a reader of 128 KiB meanwhile sends three.
    let mut s = scheduler(&[A, B]);
    fill(&mut s, A, IoKind::Write, 128 * K, 2);
    fill(&mut s, B, IoKind::Read, 128 * K, 4);
    let order: Vec<_> = drain(&mut s, 3.0).iter().map(|d| d.tenant).collect();
    assert_eq!(order[..4], [B, B, A, B]);
}

#[test]
fn candidate_is_stable_until_dispatched() {
    let mut s = scheduler(&[A, B]);
    fill(&mut s, A, IoKind::Write, 128 * K, 1);
    fill(&mut s, B, IoKind::Read, 4 * K, 1);
    let c1 = s.next_candidate(9.0).unwrap();
    let c2 = s.next_candidate(9.0).unwrap();
    assert_eq!(c1, c2);
    assert_eq!(s.dispatch(9.0).unwrap().id, c1.id);
}

#[test]
fn priority_queues_served_round_robin_by_weight() {
    let cfg = GimbalConfig {
        priority_weights: vec![2, 1],
        ..GimbalConfig::default()
    };
    let mut s = VirtualSlotScheduler::new(&cfg).unwrap();
    s.add_tenant(A).unwrap();
    for i in 0..4 {
        s.enqueue(Nanos(0), A, IoKind::Read, 4 * K, 1, 100 + i)
            .unwrap();
        s.enqueue(Nanos(0), A, IoKind::Read, 4 * K, 0, i).unwrap();
    }
    // Level 7 does not exist: served as the lowest level (1).
    let id = s.enqueue(Nanos(0), A, IoKind::Read, 4 * K, 7, 999).unwrap();
    let sent = drain(&mut s, 1.0);
    let levels: Vec<_> = sent.iter().map(|d| d.priority).collect();
    assert_eq!(levels, [0, 0, 1, 0, 0, 1, 1, 1, 1]);
    assert_eq!(sent.last().unwrap().id, id);
}

#[test]
fn deferred_tenant_returns_to_active_tail_with_zero_deficit() {
    let mut s = scheduler(&[A, B]);
    fill(&mut s, A, IoKind::Read, 128 * K, 6);
    fill(&mut s, B, IoKind::Read, 4 * K, 1000);
    let sent = drain(&mut s, 1.0);
    assert!(s.tenant_snapshot(A).unwrap().deferred);
    assert!(s.tenant_snapshot(B).unwrap().deferred);
    let first_a = sent.iter().find(|d| d.tenant == A).unwrap().id;
    s.complete(first_a).unwrap();
    let snap = s.tenant_snapshot(A).unwrap();
    assert!(!snap.deferred);
    assert_eq!(snap.deficit_bytes, 0);
    let next = s.dispatch(1.0).unwrap();
    assert_eq!(next.tenant, A);
}

#[test]
fn misuse_is_reported() {
    let mut s = scheduler(&[A]);
    assert_eq!(s.add_tenant(A), Err(QosError::DuplicateTenant(A)));
    assert_eq!(
        s.enqueue(Nanos(0), B, IoKind::Read, 1, 0, 0),
        Err(QosError::UnknownTenant(B))
    );
    assert_eq!(
        s.complete(RequestId(42)),
        Err(QosError::UnknownRequest(RequestId(42)))
    );
    fill(&mut s, A, IoKind::Read, 4 * K, 1);
    assert_eq!(s.remove_tenant(A), Err(QosError::TenantBusy(A)));
    let d = s.dispatch(1.0).unwrap();
    assert_eq!(s.remove_tenant(A), Err(QosError::TenantBusy(A)));
    s.complete(d.id).unwrap();
    assert_eq!(s.complete(d.id), Err(QosError::UnknownRequest(d.id)));
    s.remove_tenant(A).unwrap();
    assert!(!s.has_tenant(A));
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        tenant: u32,
        write: bool,
        blocks: u64,
        priority: u8,
    },
    Dispatch {
        write_cost_tenths: u8,
    },
    Complete {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u32..4, any::<bool>(), 1u64..64, 0u8..5).prop_map(|(tenant, write, blocks, priority)| Op::Enqueue {
            tenant,
            write,
            blocks,
            priority
        }),
        3 => (10u8..90).prop_map(|w| Op::Dispatch { write_cost_tenths: w }),
        2 => any::<usize>().prop_map(|pick| Op::Complete { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random enqueue/dispatch/complete sequences keep the lists, counts and
    /// slots consistent, deficits bounded and credits positive; afterwards
    /// every queued request is served once completions flow (no starvation).
    #[test]
    fn invariants_hold_and_nobody_starves(ops in proptest::collection::vec(op(), 1..300)) {
        let quantum = 128 * K;
        let mut s = scheduler(&[TenantId(0), TenantId(1), TenantId(2), TenantId(3)]);
        let mut in_flight: Vec<RequestId> = Vec::new();
        let mut max_weighted = 0u64;
        let mut enqueued = 0usize;
        let mut dispatched = 0usize;
        for op in ops {
            match op {
                Op::Enqueue { tenant, write, blocks, priority } => {
                    let kind = if write { IoKind::Write } else { IoKind::Read };
                    s.enqueue(Nanos(0), TenantId(tenant), kind, blocks * 4 * K, priority, 0).unwrap();
                    enqueued += 1;
                    max_weighted = max_weighted.max(blocks * 4 * K * 9);
                }
                Op::Dispatch { write_cost_tenths } => {
                    if let Some(d) = s.dispatch(f64::from(write_cost_tenths) / 10.0) {
                        in_flight.push(d.id);
                        dispatched += 1;
                    }
                }
                Op::Complete { pick } => {
                    if !in_flight.is_empty() {
                        let id = in_flight.swap_remove(pick % in_flight.len());
                        s.complete(id).unwrap();
                    }
                }
            }
            s.check_invariants().map_err(TestCaseError::fail)?;
            for t in 0..4 {
                let snap = s.tenant_snapshot(TenantId(t)).unwrap();
                prop_assert!(snap.deficit_bytes <= quantum + max_weighted);
                prop_assert!(s.credit(TenantId(t)).unwrap() >= 1);
            }
        }
        // Drain: complete everything in flight, dispatch, repeat.
        for _ in 0..10_000 {
            if s.queued_len() == 0 {
                break;
            }
            while let Some(d) = s.dispatch(9.0) {
                in_flight.push(d.id);
                dispatched += 1;
            }
            for id in in_flight.drain(..) {
                s.complete(id).unwrap();
            }
            s.check_invariants().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(s.queued_len(), 0);
        prop_assert_eq!(dispatched, enqueued);
    }
}
