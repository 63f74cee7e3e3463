//! The eIO scheduler (§4.5, Algorithm 2): a client-side priority queue
//! ordered by each I/O's cost, keeping order within a stream.
//!
//! Call order: [`EioScheduler::enqueue`] each I/O as it arrives (the rank
//! is computed then, Algorithm 2's `compute_rank` and `binary_insert`);
//! [`EioScheduler::dequeue`] when the device side can take one more
//! (`admit` decides per I/O, e.g. the auction's slice for its namespace
//! has room); [`EioScheduler::set_namespace_cost`] when the view's write
//! cost or the auction's allocation changes;
//! [`EioScheduler::on_bottleneck_report`] when the view reports victims.
//!
//! **Composition with the class arbiter.** ionice classes still rule
//! between classes: the ublk server keeps one `EioScheduler` per priority
//! class (per queue), and `qos_core::class_arbiter::ClassArbiter` (urgent
//! first, then WRR/DRR with aging) decides which class sends next; eIO
//! only orders the I/Os inside that class. So a low-priority I/O never
//! overtakes a high one because it is cheaper, and the class weights keep
//! their meaning.
//!
//! Decisions where the paper is vague:
//! - **Rank** = arrival time + cost time (+ a penalty for victims), all in
//!   nanoseconds; lower goes first. The cost time is the I/O's
//!   cost-weighted bytes ([`crate::auction::cost_bytes`]: size, kind, the
//!   view's write cost) over the bandwidth the auction allocated to its
//!   session on that namespace. So the rank is the I/O's finish time if it
//!   were served alone at its allocation: cheap I/Os (small reads) pass
//!   expensive ones (large or costly writes, I/Os to a namespace with
//!   little bandwidth), which is how §5.4's head-of-line blocking is
//!   avoided, and queueing time counts because an expensive I/O is only
//!   passed by I/Os that arrive less than its cost time after it.
//! - **Aging**: that bound is the aging built into the rank; in addition
//!   an I/O that waited `aging_threshold` is sent before any rank order,
//!   oldest first (Algorithm 2's `aging()`), like the class arbiter.
//! - **Victims** (§4.5: "all victim I/Os will experience a rank
//!   increase"): an I/O whose session the latest bottleneck report names
//!   gets `victim_penalty` added to its rank, also when already queued,
//!   and loses it when a later report clears the session.
//! - **Streams**: an I/O is sent only when it is the oldest of its stream
//!   (Algorithm 2, L7). The caller picks streams; the ublk server uses one
//!   per (queue, extent), so writes to the same extent keep their order
//!   while different extents reorder freely.
//! - The window holds at most `max_window` I/Os; `enqueue` hands an I/O
//!   back when full (the caller applies back-pressure).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::auction::cost_bytes;
use crate::error::{FlintError, Result};
use crate::ids::{NamespaceId, SessionId};
use crate::{IoKind, Nanos};

/// Parameters of the eIO scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EioConfig {
    /// Most I/Os in the sort window. Default 1024.
    pub max_window: usize,
    /// An I/O waiting this long goes first, nanoseconds. Default 10 ms.
    pub aging_threshold_ns: u64,
    /// Added to a victim I/O's rank, nanoseconds. Default 1 ms.
    pub victim_penalty_ns: u64,
    /// Bandwidth assumed for a namespace without a cost entry, bytes per
    /// second. Default 1 GB/s.
    pub default_bandwidth_bytes_per_sec: u64,
}

impl Default for EioConfig {
    fn default() -> Self {
        EioConfig {
            max_window: 1024,
            aging_threshold_ns: 10_000_000,
            victim_penalty_ns: 1_000_000,
            default_bandwidth_bytes_per_sec: 1_000_000_000,
        }
    }
}

impl EioConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if self.max_window == 0 {
            return Err(FlintError::invalid("max_window", "must be at least 1"));
        }
        if self.default_bandwidth_bytes_per_sec == 0 {
            return Err(FlintError::invalid(
                "default_bandwidth_bytes_per_sec",
                "must be positive",
            ));
        }
        Ok(())
    }
}

/// A stream whose I/Os keep their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StreamId(pub u64);

/// What the scheduler knows of a namespace's cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamespaceCost {
    /// The profile's bandwidth / IOPS: the least an I/O costs, bytes.
    pub min_cost_bytes: u64,
    /// The view's write cost (≥ 1).
    pub write_cost: f64,
    /// The bandwidth the auction allocated to this client there, bytes
    /// per second.
    pub bandwidth_bytes_per_sec: f64,
}

/// One I/O to schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EioRequest<T> {
    /// Its stream.
    pub stream: StreamId,
    /// The session it will go through.
    pub session: SessionId,
    /// The namespace it goes to.
    pub namespace: NamespaceId,
    /// Read or write.
    pub kind: IoKind,
    /// Its size in bytes.
    pub bytes: u64,
    /// The caller's handle (a tag, a request).
    pub payload: T,
}

/// An I/O the scheduler released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched<T> {
    /// The I/O.
    pub request: EioRequest<T>,
    /// How long it waited, nanoseconds.
    pub waited_ns: u64,
    /// Whether aging released it rather than its rank.
    pub aged: bool,
}

#[derive(Clone, Debug)]
struct Entry<T> {
    request: EioRequest<T>,
    arrival: Nanos,
    base_rank: u64,
    penalized: bool,
}

/// The eIO scheduler of one priority class.
#[derive(Clone, Debug)]
pub struct EioScheduler<T> {
    config: EioConfig,
    costs: BTreeMap<NamespaceId, NamespaceCost>,
    victims: BTreeSet<SessionId>,
    /// Sequence → entry; sequence order is arrival order.
    entries: BTreeMap<u64, Entry<T>>,
    /// (rank, sequence): the sort window.
    window: BTreeSet<(u64, u64)>,
    streams: BTreeMap<StreamId, VecDeque<u64>>,
    next_seq: u64,
}

impl<T> EioScheduler<T> {
    /// An empty scheduler.
    pub fn new(config: EioConfig) -> Result<Self> {
        config.validate()?;
        Ok(EioScheduler {
            config,
            costs: BTreeMap::new(),
            victims: BTreeSet::new(),
            entries: BTreeMap::new(),
            window: BTreeSet::new(),
            streams: BTreeMap::new(),
            next_seq: 0,
        })
    }

    /// I/Os waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No I/O waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sets what a namespace's I/Os cost (used for I/Os enqueued from now).
    pub fn set_namespace_cost(&mut self, namespace: NamespaceId, cost: NamespaceCost) {
        self.costs.insert(namespace, cost);
    }

    /// The rank an I/O arriving at `now` would get, without its penalty.
    pub fn base_rank(&self, now: Nanos, namespace: NamespaceId, kind: IoKind, bytes: u64) -> u64 {
        let (cost, bandwidth) = match self.costs.get(&namespace) {
            Some(c) => (
                cost_bytes(kind, bytes, c.min_cost_bytes, c.write_cost),
                c.bandwidth_bytes_per_sec,
            ),
            None => (bytes, self.config.default_bandwidth_bytes_per_sec as f64),
        };
        let bandwidth = if bandwidth.is_finite() && bandwidth >= 1.0 {
            bandwidth
        } else {
            1.0
        };
        let cost_ns = (cost as f64 * 1e9 / bandwidth).min(u64::MAX as f64 / 4.0) as u64;
        now.as_nanos().saturating_add(cost_ns)
    }

    /// Adds an I/O; hands it back when the window is full.
    pub fn enqueue(&mut self, now: Nanos, request: EioRequest<T>) -> Result<(), EioRequest<T>> {
        if self.entries.len() >= self.config.max_window {
            return Err(request);
        }
        let base_rank = self.base_rank(now, request.namespace, request.kind, request.bytes);
        let penalized = self.victims.contains(&request.session);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.window.insert((self.rank(base_rank, penalized), seq));
        self.streams
            .entry(request.stream)
            .or_default()
            .push_back(seq);
        self.entries.insert(
            seq,
            Entry {
                request,
                arrival: now,
                base_rank,
                penalized,
            },
        );
        Ok(())
    }

    fn rank(&self, base_rank: u64, penalized: bool) -> u64 {
        if penalized {
            base_rank.saturating_add(self.config.victim_penalty_ns)
        } else {
            base_rank
        }
    }

    fn is_stream_front(&self, seq: u64, stream: StreamId) -> bool {
        self.streams.get(&stream).and_then(|q| q.front()) == Some(&seq)
    }

    /// Releases the next I/O that `admit` accepts: the oldest if it waited
    /// past the aging threshold, else the lowest rank that is the front of
    /// its stream. `None` when nothing eligible is accepted.
    pub fn dequeue(
        &mut self,
        now: Nanos,
        mut admit: impl FnMut(&EioRequest<T>) -> bool,
    ) -> Option<Dispatched<T>> {
        // The oldest entry is always the front of its stream.
        if let Some((&seq, oldest)) = self.entries.first_key_value() {
            if now.nanos_since(oldest.arrival) >= self.config.aging_threshold_ns
                && admit(&oldest.request)
            {
                return Some(self.remove(now, seq, true));
            }
        }
        let mut chosen = None;
        // Bounded by the window size.
        for &(_, seq) in &self.window {
            let entry = &self.entries[&seq];
            if self.is_stream_front(seq, entry.request.stream) && admit(&entry.request) {
                chosen = Some(seq);
                break;
            }
        }
        chosen.map(|seq| self.remove(now, seq, false))
    }

    fn remove(&mut self, now: Nanos, seq: u64, aged: bool) -> Dispatched<T> {
        let entry = self.entries.remove(&seq).expect("seq from the maps");
        self.window
            .remove(&(self.rank(entry.base_rank, entry.penalized), seq));
        let stream = entry.request.stream;
        let q = self
            .streams
            .get_mut(&stream)
            .expect("every entry has its stream");
        debug_assert_eq!(q.front(), Some(&seq));
        q.pop_front();
        if q.is_empty() {
            self.streams.remove(&stream);
        }
        Dispatched {
            waited_ns: now.nanos_since(entry.arrival),
            request: entry.request,
            aged,
        }
    }

    /// The latest bottleneck report's victim sessions: their I/Os (queued
    /// and future) rank down, others' lose an earlier penalty.
    pub fn on_bottleneck_report(&mut self, victims: impl IntoIterator<Item = SessionId>) {
        self.victims = victims.into_iter().collect();
        let changed: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.penalized != self.victims.contains(&e.request.session))
            .map(|(seq, _)| *seq)
            .collect();
        for seq in changed {
            let (base, old) = {
                let e = &self.entries[&seq];
                (e.base_rank, e.penalized)
            };
            self.window.remove(&(self.rank(base, old), seq));
            self.window.insert((self.rank(base, !old), seq));
            self.entries.get_mut(&seq).expect("listed above").penalized = !old;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(stream: u64, session: u32, kind: IoKind, bytes: u64, tag: u32) -> EioRequest<u32> {
        EioRequest {
            stream: StreamId(stream),
            session: SessionId(session),
            namespace: NamespaceId(0),
            kind,
            bytes,
            payload: tag,
        }
    }

    fn scheduler() -> EioScheduler<u32> {
        let mut s = EioScheduler::new(EioConfig::default()).unwrap();
        s.set_namespace_cost(
            NamespaceId(0),
            NamespaceCost {
                min_cost_bytes: 8000,
                write_cost: 4.0,
                bandwidth_bytes_per_sec: 1e9,
            },
        );
        s
    }

    fn drain(s: &mut EioScheduler<u32>, now: Nanos) -> Vec<u32> {
        std::iter::from_fn(|| s.dequeue(now, |_| true).map(|d| d.request.payload)).collect()
    }

    #[test]
    fn cheap_ios_pass_expensive_ones_of_other_streams() {
        let mut s = scheduler();
        // 1 MiB write: 4 MiB of cost at 1 GB/s = 4.2 ms.
        s.enqueue(Nanos(0), req(1, 0, IoKind::Write, 1 << 20, 1))
            .unwrap();
        s.enqueue(Nanos(1000), req(2, 0, IoKind::Read, 4096, 2))
            .unwrap();
        s.enqueue(Nanos(2000), req(3, 0, IoKind::Read, 128 * 1024, 3))
            .unwrap();
        assert_eq!(drain(&mut s, Nanos(3000)), vec![2, 3, 1]);
    }

    #[test]
    fn order_within_a_stream_is_kept() {
        let mut s = scheduler();
        s.enqueue(Nanos(0), req(1, 0, IoKind::Write, 1 << 20, 1))
            .unwrap();
        s.enqueue(Nanos(1000), req(1, 0, IoKind::Read, 4096, 2))
            .unwrap();
        s.enqueue(Nanos(2000), req(2, 0, IoKind::Read, 4096, 3))
            .unwrap();
        assert_eq!(drain(&mut s, Nanos(3000)), vec![3, 1, 2]);
    }

    #[test]
    fn the_expensive_io_is_passed_only_for_its_cost_time() {
        let mut s = scheduler();
        s.enqueue(Nanos(0), req(1, 0, IoKind::Read, 1 << 20, 1))
            .unwrap(); // ~1.05 ms
        s.enqueue(Nanos(2_000_000), req(2, 0, IoKind::Read, 4096, 2))
            .unwrap();
        assert_eq!(drain(&mut s, Nanos(2_000_000)), vec![1, 2]);
    }

    #[test]
    fn aging_releases_the_oldest_first() {
        let mut s = EioScheduler::new(EioConfig {
            aging_threshold_ns: 1_000,
            ..EioConfig::default()
        })
        .unwrap();
        s.enqueue(Nanos(0), req(1, 0, IoKind::Read, 1 << 30, 1))
            .unwrap();
        s.enqueue(Nanos(500), req(2, 0, IoKind::Read, 4096, 2))
            .unwrap();
        let d = s.dequeue(Nanos(1_000), |_| true).unwrap();
        assert_eq!((d.request.payload, d.aged, d.waited_ns), (1, true, 1_000));
    }

    #[test]
    fn victims_rank_down_and_recover() {
        let mut s = scheduler();
        s.enqueue(Nanos(0), req(1, 7, IoKind::Read, 4096, 1))
            .unwrap();
        s.enqueue(Nanos(10), req(2, 8, IoKind::Read, 4096, 2))
            .unwrap();
        s.on_bottleneck_report([SessionId(7)]);
        s.enqueue(Nanos(20), req(3, 7, IoKind::Read, 4096, 3))
            .unwrap();
        s.enqueue(Nanos(30), req(4, 8, IoKind::Read, 4096, 4))
            .unwrap();
        let first = s.dequeue(Nanos(40), |_| true).unwrap().request.payload;
        assert_eq!(first, 2);
        s.on_bottleneck_report([]);
        assert_eq!(drain(&mut s, Nanos(50)), vec![1, 3, 4]);
    }

    #[test]
    fn admit_skips_and_the_window_is_bounded() {
        let mut s = EioScheduler::new(EioConfig {
            max_window: 2,
            ..EioConfig::default()
        })
        .unwrap();
        s.enqueue(Nanos(0), req(1, 0, IoKind::Read, 4096, 1))
            .unwrap();
        let mut other = req(2, 0, IoKind::Read, 1 << 20, 2);
        other.namespace = NamespaceId(5);
        s.enqueue(Nanos(0), other).unwrap();
        assert!(s.enqueue(Nanos(0), req(3, 0, IoKind::Read, 1, 3)).is_err());
        let d = s
            .dequeue(Nanos(1), |r| r.namespace == NamespaceId(5))
            .unwrap();
        assert_eq!(d.request.payload, 2);
        assert!(s.dequeue(Nanos(1), |_| false).is_none());
        assert_eq!(s.len(), 1);
    }

    proptest! {
        /// Whatever arrives, every I/O leaves exactly once, each stream in
        /// its arrival order, and the internal indexes stay consistent.
        #[test]
        fn every_io_leaves_once_in_stream_order(
            ios in proptest::collection::vec((0u64..4, 0u32..3, any::<bool>(), 1u64..2_000_000), 1..60),
            victims in proptest::collection::vec(0u32..3, 0..3),
        ) {
            let mut s = scheduler();
            for (i, (stream, session, write, bytes)) in ios.iter().enumerate() {
                let kind = if *write { IoKind::Write } else { IoKind::Read };
                s.enqueue(Nanos(i as u64 * 1000), req(*stream, *session, kind, *bytes, i as u32)).unwrap();
                if i == ios.len() / 2 {
                    s.on_bottleneck_report(victims.iter().map(|v| SessionId(*v)));
                }
            }
            let out = drain(&mut s, Nanos(ios.len() as u64 * 1000));
            prop_assert_eq!(out.len(), ios.len());
            prop_assert!(s.is_empty() && s.window.is_empty() && s.streams.is_empty());
            let mut last: BTreeMap<u64, u32> = BTreeMap::new();
            for tag in out {
                let stream = ios[tag as usize].0;
                if let Some(prev) = last.insert(stream, tag) {
                    prop_assert!(prev < tag);
                }
            }
        }
    }
}
