//! The fan-out machine alone: each rule on a hand-made case, then a
//! property test over random interleavings of every event.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const T0: Nanos = Nanos(0);

fn set(copies: &[usize]) -> ReplicaSet {
    copies.iter().copied().collect()
}

fn part(tag: u16, piece: u8, copy: u8) -> PartId {
    PartId { tag, piece, copy }
}

fn drain(f: &mut FanOut) -> Vec<Action> {
    std::iter::from_fn(|| f.poll_action()).collect()
}

fn whole(copies: &[usize]) -> [PieceSpec; 1] {
    [PieceSpec {
        range: 0..4096,
        copies: set(copies),
    }]
}

#[test]
fn user_data_round_trips() {
    let p = part(513, 3, 15);
    assert_eq!(PartId::from_user_data(p.user_data()), Some(p));
    assert_eq!(PartId::from_user_data(1 << 40), None);
}

#[test]
fn write_waits_for_its_record_then_goes_to_every_copy() {
    let mut f = FanOut::new(4);
    f.start(T0, 1, Op::Write, &whole(&[0, 1]));
    assert_eq!(
        drain(&mut f),
        vec![Action::BeforeWrite {
            tag: 1,
            piece: 0,
            range: 0..4096,
            to: set(&[0, 1])
        }]
    );
    f.prepared(1, 0, true);
    assert_eq!(
        drain(&mut f),
        vec![Action::Send(part(1, 0, 0)), Action::Send(part(1, 0, 1))]
    );
    f.answered(part(1, 0, 0), true, set(&[0, 1]));
    assert_eq!(drain(&mut f), vec![], "one copy still out");
    f.answered(part(1, 0, 1), true, set(&[0, 1]));
    assert_eq!(
        drain(&mut f),
        vec![
            Action::AfterWrite {
                tag: 1,
                range: 0..4096,
                sent: set(&[0, 1])
            },
            Action::Complete { tag: 1, ok: true }
        ]
    );
    assert!(!f.is_active(1));
}

#[test]
fn failed_record_sends_nothing_and_fails_the_write() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Write, &whole(&[0]));
    drain(&mut f);
    f.prepared(0, 0, false);
    let a = drain(&mut f);
    assert_eq!(a[0], Action::Release(part(0, 0, 0)));
    assert!(!a.iter().any(|a| matches!(a, Action::Send(_))));
    assert_eq!(a.last(), Some(&Action::Complete { tag: 0, ok: false }));
}

#[test]
fn replica_lost_mid_write_is_recorded_before_the_ack() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Write, &whole(&[0, 1]));
    f.prepared(0, 0, true);
    drain(&mut f);
    f.answered(part(0, 0, 0), true, set(&[0, 1]));
    // Replica 1's path failed and it is out of sync: the engine takes the
    // part back.
    f.dropped(part(0, 0, 1), set(&[0]));
    assert_eq!(
        drain(&mut f),
        vec![
            Action::Release(part(0, 0, 1)),
            Action::WriteMissed {
                part: part(0, 0, 1),
                range: 0..4096,
                out_of_sync: false
            }
        ],
        "no completion before the record holds"
    );
    f.recorded(part(0, 0, 1), true);
    let a = drain(&mut f);
    assert_eq!(a.last(), Some(&Action::Complete { tag: 0, ok: true }));
}

#[test]
fn missed_write_that_cannot_be_recorded_fails() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Write, &whole(&[0, 1]));
    f.prepared(0, 0, true);
    f.dropped(part(0, 0, 1), set(&[0]));
    f.answered(part(0, 0, 0), true, set(&[0]));
    drain(&mut f);
    f.recorded(part(0, 0, 1), false);
    assert_eq!(
        drain(&mut f).last(),
        Some(&Action::Complete { tag: 0, ok: false })
    );
}

#[test]
fn error_status_on_one_write_part_takes_that_replica_out() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Write, &whole(&[0, 1, 2]));
    f.prepared(0, 0, true);
    drain(&mut f);
    f.answered(part(0, 0, 2), false, set(&[0, 1, 2]));
    assert_eq!(
        drain(&mut f),
        vec![Action::WriteMissed {
            part: part(0, 0, 2),
            range: 0..4096,
            out_of_sync: true
        }]
    );
    f.answered(part(0, 0, 0), true, set(&[0, 1]));
    f.answered(part(0, 0, 1), true, set(&[0, 1]));
    assert!(
        !drain(&mut f)
            .iter()
            .any(|a| matches!(a, Action::Complete { .. })),
        "waits for the record"
    );
    f.recorded(part(0, 0, 2), true);
    assert_eq!(
        drain(&mut f).last(),
        Some(&Action::Complete { tag: 0, ok: true })
    );
}

#[test]
fn error_status_on_the_last_in_sync_copy_fails_the_write() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Write, &whole(&[0]));
    f.prepared(0, 0, true);
    drain(&mut f);
    f.answered(part(0, 0, 0), false, set(&[0]));
    assert_eq!(
        drain(&mut f).last(),
        Some(&Action::Complete { tag: 0, ok: false })
    );
}

#[test]
fn read_retries_on_each_other_copy_once() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Read, &whole(&[1]));
    assert_eq!(drain(&mut f), vec![Action::Send(part(0, 0, 1))]);
    f.answered(part(0, 0, 1), false, set(&[0, 1, 2]));
    assert_eq!(drain(&mut f), vec![Action::Retry(part(0, 0, 0))]);
    f.answered(part(0, 0, 0), false, set(&[0, 1, 2]));
    assert_eq!(drain(&mut f), vec![Action::Retry(part(0, 0, 2))]);
    f.answered(part(0, 0, 2), false, set(&[0, 1, 2]));
    assert_eq!(
        drain(&mut f),
        vec![Action::Complete { tag: 0, ok: false }],
        "every copy tried: no ping-pong"
    );
}

#[test]
fn dropped_read_moves_with_its_charge() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Read, &whole(&[0]));
    drain(&mut f);
    f.dropped(part(0, 0, 0), set(&[1]));
    assert_eq!(
        drain(&mut f),
        vec![Action::Reroute {
            from: part(0, 0, 0),
            to: part(0, 0, 1)
        }]
    );
    f.answered(part(0, 0, 1), true, set(&[1]));
    assert_eq!(drain(&mut f), vec![Action::Complete { tag: 0, ok: true }]);
}

#[test]
fn dropped_read_with_nowhere_to_go_fails() {
    let mut f = FanOut::new(1);
    f.start(T0, 0, Op::Read, &whole(&[0]));
    drain(&mut f);
    f.dropped(part(0, 0, 0), set(&[0]));
    assert_eq!(
        drain(&mut f),
        vec![
            Action::Release(part(0, 0, 0)),
            Action::Complete { tag: 0, ok: false }
        ]
    );
}

#[test]
fn flush_is_not_needed_on_a_dropped_replica_but_fails_on_an_error() {
    let mut f = FanOut::new(2);
    f.start(T0, 0, Op::Flush, &whole(&[0, 1]));
    f.dropped(part(0, 0, 1), set(&[0]));
    f.answered(part(0, 0, 0), true, set(&[0]));
    let a = drain(&mut f);
    assert!(a.contains(&Action::Release(part(0, 0, 1))));
    assert_eq!(a.last(), Some(&Action::Complete { tag: 0, ok: true }));
    f.start(T0, 1, Op::Flush, &whole(&[0, 1]));
    f.answered(part(1, 0, 1), false, set(&[0, 1]));
    f.answered(part(1, 0, 0), true, set(&[0, 1]));
    assert_eq!(
        drain(&mut f).last(),
        Some(&Action::Complete { tag: 1, ok: false })
    );
}

#[test]
fn a_held_part_keeps_the_tag_and_late_events_are_stale() {
    let mut f = FanOut::new(1);
    f.start(Nanos(5), 0, Op::Read, &whole(&[0]));
    drain(&mut f);
    // The last in-sync replica's path is down: nothing arrives; the tag
    // waits (the engine resends the part on the next connection).
    assert!(f.is_active(0));
    assert_eq!(f.oldest_age(Nanos(105)), Some(Nanos(100)));
    f.answered(part(0, 0, 0), true, set(&[0]));
    assert_eq!(drain(&mut f), vec![Action::Complete { tag: 0, ok: true }]);
    f.answered(part(0, 0, 0), true, set(&[0]));
    f.failed(part(0, 0, 0));
    assert_eq!(drain(&mut f), vec![]);
    assert_eq!(f.stale_events(), 2);
    assert_eq!(f.oldest_age(Nanos(200)), None);
}

#[test]
fn pieces_of_one_request_complete_together() {
    // Two extents, two copies each: a write across the boundary.
    let mut f = FanOut::new(1);
    let pieces = [
        PieceSpec {
            range: 0..4096,
            copies: set(&[0, 1]),
        },
        PieceSpec {
            range: 4096..8192,
            copies: set(&[0, 1]),
        },
    ];
    f.start(T0, 0, Op::Write, &pieces);
    f.prepared(0, 0, true);
    f.prepared(0, 1, true);
    let sends = drain(&mut f)
        .into_iter()
        .filter(|a| matches!(a, Action::Send(_)))
        .count();
    assert_eq!(sends, 4);
    for (p, c) in [(0, 0), (0, 1), (1, 0)] {
        f.answered(part(0, p, c), true, set(&[0, 1]));
    }
    assert_eq!(drain(&mut f), vec![]);
    f.answered(part(0, 1, 1), true, set(&[0, 1]));
    let a = drain(&mut f);
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a, Action::AfterWrite { .. }))
            .count(),
        2
    );
    assert_eq!(a.last(), Some(&Action::Complete { tag: 0, ok: true }));
}

/// What the random driver may do next.
#[derive(Debug, Clone)]
enum Step {
    /// Answer, drop or fail the i-th live part (mod their count).
    Part { i: usize, how: u8 },
    /// Confirm the i-th pending record (mod their count).
    Record { i: usize, ok: bool },
    /// An event for a part that may not be live.
    Stale { tag: u16, copy: u8, how: u8 },
    /// The readable set changes (a replica goes out or comes back).
    Readable(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..6).prop_map(|(i, how)| Step::Part { i, how }),
        2 => (any::<usize>(), prop::bool::weighted(0.85)).prop_map(|(i, ok)| Step::Record { i, ok }),
        1 => (0u16..4, 0u8..3, 0u8..3).prop_map(|(tag, copy, how)| Step::Stale { tag, copy, how }),
        1 => (1u8..8).prop_map(Step::Readable),
    ]
}

fn request() -> impl Strategy<Value = (Op, usize, u8)> {
    (
        prop_oneof![Just(Op::Read), Just(Op::Write), Just(Op::Flush)],
        1usize..3,
        1u8..8,
    )
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Pending {
    Prepare(u16, u8),
    Missed(PartId),
}

/// What the random driver knows: the parts live and the records asked
/// for, from the actions; what completed and what must have failed.
#[derive(Default)]
struct Model {
    live: BTreeSet<PartId>,
    pending: BTreeSet<Pending>,
    prepared: BTreeSet<(u16, u8)>,
    completed: BTreeMap<u16, bool>,
    must_fail: BTreeSet<u16>,
    ops: BTreeMap<u16, Op>,
}

impl Model {
    /// Carry out the machine's actions, checking each against the rules.
    fn apply(&mut self, f: &mut FanOut) -> Result<(), TestCaseError> {
        while let Some(a) = f.poll_action() {
            match a {
                Action::BeforeWrite { tag, piece, .. } => {
                    self.pending.insert(Pending::Prepare(tag, piece));
                }
                Action::Send(p) => {
                    prop_assert!(
                        self.ops[&p.tag] != Op::Write || self.prepared.contains(&(p.tag, p.piece)),
                        "write part sent before its record"
                    );
                    prop_assert!(self.live.insert(p), "part sent twice");
                }
                Action::Retry(p) => prop_assert!(self.live.insert(p)),
                Action::Reroute { from, to } => {
                    prop_assert!(!self.live.contains(&from));
                    prop_assert!(self.live.insert(to));
                }
                Action::WriteMissed { part, .. } => {
                    self.pending.insert(Pending::Missed(part));
                }
                Action::Release(_) | Action::AfterWrite { .. } => {}
                Action::Complete { tag, ok } => {
                    prop_assert!(self.completed.insert(tag, ok).is_none(), "completed twice");
                    prop_assert!(!self.live.iter().any(|p| p.tag == tag), "part still live");
                    prop_assert!(
                        !self.pending.iter().any(|p| match p {
                            Pending::Prepare(t, _) => *t == tag,
                            Pending::Missed(p) => p.tag == tag,
                        }),
                        "record still pending"
                    );
                    if self.must_fail.contains(&tag) {
                        prop_assert!(!ok, "a lost write or failed part reported success");
                    }
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever order parts end in, each started tag completes exactly
    /// once, never while a part it sent is unanswered or a record it asked
    /// for is unconfirmed, no write part leaves before its record, and a
    /// request that lost data reports failure.
    #[test]
    fn each_tag_completes_once_after_every_live_part(
        reqs in prop::collection::vec(request(), 1..5),
        steps in prop::collection::vec(step(), 0..200),
    ) {
        let mut f = FanOut::new(4);
        let mut readable = ReplicaSet::first_n(3);
        let mut m = Model::default();
        for (tag, &(op, pieces, copies)) in reqs.iter().enumerate() {
            let tag = tag as u16;
            let copies = ReplicaSet::from_bits(u32::from(copies) & 7);
            let copies = if op == Op::Read {
                ReplicaSet::one(copies.first().unwrap_or(0))
            } else {
                copies
            };
            let specs: Vec<PieceSpec> = (0..pieces)
                .map(|i| PieceSpec { range: (i as u64 * 4096)..((i as u64 + 1) * 4096), copies })
                .collect();
            m.ops.insert(tag, op);
            f.start(T0, tag, op, &specs);
        }
        m.apply(&mut f)?;
        let mut steps = steps.into_iter();
        // The random steps, then answer everything still live so every
        // run ends.
        loop {
            let s = match steps.next() {
                Some(s) => s,
                None if !m.live.is_empty() => Step::Part { i: 0, how: 0 },
                None if !m.pending.is_empty() => Step::Record { i: 0, ok: true },
                None => break,
            };
            match s {
                Step::Part { i, how } => {
                    let Some(&p) = m.live.iter().nth(i % m.live.len().max(1)) else { continue };
                    m.live.remove(&p);
                    match how {
                        0..=2 => f.answered(p, true, readable),
                        3 => {
                            if m.ops[&p.tag] != Op::Read && readable.without(p.copy()).is_empty() {
                                m.must_fail.insert(p.tag);
                            }
                            f.answered(p, false, readable)
                        }
                        4 => f.dropped(p, readable),
                        _ => {
                            m.must_fail.insert(p.tag);
                            f.failed(p)
                        }
                    }
                }
                Step::Record { i, ok } => {
                    let Some(r) = m.pending.iter().nth(i % m.pending.len().max(1)).cloned() else {
                        continue;
                    };
                    m.pending.remove(&r);
                    match r {
                        Pending::Prepare(tag, piece) => {
                            if ok {
                                m.prepared.insert((tag, piece));
                            } else {
                                m.must_fail.insert(tag);
                            }
                            f.prepared(tag, piece, ok)
                        }
                        Pending::Missed(p) => {
                            if !ok {
                                m.must_fail.insert(p.tag);
                            }
                            f.recorded(p, ok)
                        }
                    }
                }
                Step::Stale { tag, copy, how } => {
                    let p = part(tag, 0, copy);
                    if m.live.contains(&p) || (tag as usize) < reqs.len() && !m.completed.contains_key(&tag) {
                        continue;
                    }
                    match how {
                        0 => f.answered(p, true, readable),
                        1 => f.dropped(p, readable),
                        _ => f.failed(p),
                    }
                }
                Step::Readable(bits) => readable = ReplicaSet::from_bits(u32::from(bits)),
            }
            m.apply(&mut f)?;
        }
        prop_assert_eq!(m.completed.len(), reqs.len(), "every tag completed");
        prop_assert_eq!(f.active(), 0);
    }
}
