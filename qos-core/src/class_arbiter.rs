//! Arbitration between NVMe priority classes, run by the target before the
//! per-tenant Gimbal scheduler (ARCHITECTURE "Priority classes"; the ionice
//! paper §III-A/B).
//!
//! Commands wait in submission queues; each queue belongs to one class.
//! Urgent queues are served strictly first. The high, medium and low
//! classes are then visited in turn:
//!
//! - [`ArbitrationMode::Wrr`] (NVMe weighted round robin): a visit lets a
//!   class send up to its weight in **commands**.
//! - [`ArbitrationMode::Drr`] (the vendor-specific, size-aware scheme): a
//!   visit adds the class's quantum in **bytes** to its deficit; it sends
//!   while its head command fits in the deficit; an emptied class loses its
//!   deficit.
//!
//! Within a class, its non-empty queues take turns, each sending at most
//! `burst` commands per turn (the NVMe arbitration burst).
//!
//! Aging (not in NVMe; added so nothing starves, e.g. low commands under an
//! urgent flood): a command that has waited at least `aging_threshold` is
//! sent before anything else, oldest first. It does not use its class's
//! weight or deficit.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::error::{QosError, Result};
use crate::priority::NvmeClass;
use crate::time::{Nanos, NANOS_PER_MICRO};

/// Weighted round robin by command count, or deficit round robin by bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArbitrationMode {
    /// NVMe weighted round robin (commands).
    #[default]
    Wrr,
    /// Deficit round robin (bytes).
    Drr,
}

/// Bytes of DRR quantum per unit of arbitration weight: a class's quantum
/// is its weight (HPW/MPW/LPW + 1) times this, so the low class's default
/// weight of 1 gets 32 KiB per visit, the ionice paper's smallest quantum.
/// The target's vendor-specific DRR (CC.AMS 111b) and the client's
/// release of held requests both use it, so that the client releases
/// requests in the byte ratio the target serves them.
pub const DRR_QUANTUM_UNIT_BYTES: u64 = 32 * 1024;

/// Configuration of a class arbiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArbiterConfig {
    /// WRR or DRR.
    pub mode: ArbitrationMode,
    /// WRR commands per visit of the high class (HPW + 1). Default 8.
    pub high_weight: u32,
    /// WRR commands per visit of the medium class (MPW + 1). Default 4.
    pub medium_weight: u32,
    /// WRR commands per visit of the low class (LPW + 1). Default 1.
    pub low_weight: u32,
    /// DRR bytes per visit of the high class. Default 128 KiB.
    pub high_quantum_bytes: u64,
    /// DRR bytes per visit of the medium class. Default 64 KiB.
    pub medium_quantum_bytes: u64,
    /// DRR bytes per visit of the low class. Default 32 KiB (the ionice
    /// paper's validation used 32k/64k/128k).
    pub low_quantum_bytes: u64,
    /// Commands one queue may send per turn; 0 = no limit. Default 8.
    pub burst: u32,
    /// Wait after which a command is sent before all others; 0 = no aging.
    /// Default 100 000 µs (100 ms).
    pub aging_threshold_us: u64,
}

impl Default for ArbiterConfig {
    fn default() -> Self {
        ArbiterConfig {
            mode: ArbitrationMode::Wrr,
            high_weight: 8,
            medium_weight: 4,
            low_weight: 1,
            high_quantum_bytes: 128 * 1024,
            medium_quantum_bytes: 64 * 1024,
            low_quantum_bytes: 32 * 1024,
            burst: 8,
            aging_threshold_us: 100_000,
        }
    }
}

impl ArbiterConfig {
    /// Rejects out-of-range values, naming the field.
    pub fn validate(&self) -> Result<()> {
        for (field, v) in [
            ("high_weight", u64::from(self.high_weight)),
            ("medium_weight", u64::from(self.medium_weight)),
            ("low_weight", u64::from(self.low_weight)),
            ("high_quantum_bytes", self.high_quantum_bytes),
            ("medium_quantum_bytes", self.medium_quantum_bytes),
            ("low_quantum_bytes", self.low_quantum_bytes),
        ] {
            crate::config::check_nonzero(field, v)?;
        }
        if self.high_weight > 256 || self.medium_weight > 256 || self.low_weight > 256 {
            return Err(QosError::invalid(
                "high_weight",
                "WRR weights are at most 256 (HPW/MPW/LPW are 8-bit, 0's based)",
            ));
        }
        Ok(())
    }

    /// Applies the NVMe Arbitration feature (FID 01h) dword 11: HPW in bits
    /// 31:24, MPW 23:16, LPW 15:08 (0's based), arbitration burst in bits
    /// 2:0 as a power of two, 111b meaning no limit.
    pub fn with_arbitration_feature(mut self, dw11: u32) -> Self {
        self.high_weight = (dw11 >> 24 & 0xff) + 1;
        self.medium_weight = (dw11 >> 16 & 0xff) + 1;
        self.low_weight = (dw11 >> 8 & 0xff) + 1;
        let ab = dw11 & 0b111;
        self.burst = if ab == 0b111 { 0 } else { 1 << ab };
        self
    }

    /// The NVMe Arbitration feature dword 11 for these weights; the burst
    /// is rounded down to a power of two (no limit → 111b).
    pub fn arbitration_feature(&self) -> u32 {
        let w = |v: u32| (v.clamp(1, 256) - 1) & 0xff;
        let ab = if self.burst == 0 {
            0b111
        } else {
            (31 - self.burst.leading_zeros()).min(6)
        };
        w(self.high_weight) << 24 | w(self.medium_weight) << 16 | w(self.low_weight) << 8 | ab
    }
}

/// A submission queue, as the caller numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueId(pub u32);

#[derive(Clone, Debug)]
struct Waiting<T> {
    seq: u64,
    bytes: u64,
    enqueued_at: Nanos,
    payload: T,
}

#[derive(Clone, Debug)]
struct ClassQueues<T> {
    queues: BTreeMap<QueueId, VecDeque<Waiting<T>>>,
    /// Non-empty queues in turn order; the front one is being served.
    turn_order: VecDeque<QueueId>,
    front_burst_used: u32,
    /// WRR: commands left in this visit. DRR: deficit in bytes.
    allowance: u64,
    visit_open: bool,
    waiting: usize,
}

impl<T> ClassQueues<T> {
    fn new() -> Self {
        ClassQueues {
            queues: BTreeMap::new(),
            turn_order: VecDeque::new(),
            front_burst_used: 0,
            allowance: 0,
            visit_open: false,
            waiting: 0,
        }
    }

    fn head(&self) -> Option<&Waiting<T>> {
        let q = self.turn_order.front()?;
        self.queues.get(q)?.front()
    }

    /// Pops from `queue` (the front of the turn order unless aging picked
    /// another one), keeping the turn order and burst accounting right.
    fn pop_from(&mut self, queue: QueueId, burst: u32) -> Option<Waiting<T>> {
        let items = self.queues.get_mut(&queue)?;
        let item = items.pop_front()?;
        let now_empty = items.is_empty();
        self.waiting -= 1;
        let is_front = self.turn_order.front() == Some(&queue);
        if now_empty {
            self.queues.remove(&queue);
            self.turn_order.retain(|q| *q != queue);
            if is_front {
                self.front_burst_used = 0;
            }
        } else if is_front {
            self.front_burst_used += 1;
            if burst != 0 && self.front_burst_used >= burst {
                self.turn_order.rotate_left(1);
                self.front_burst_used = 0;
            }
        }
        Some(item)
    }
}

/// A command chosen by the arbiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arbitrated<T> {
    /// Its submission queue.
    pub queue: QueueId,
    /// Its class.
    pub class: NvmeClass,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was queued.
    pub enqueued_at: Nanos,
    /// Whether aging, not the weights, chose it.
    pub aged: bool,
    /// The caller's payload.
    pub payload: T,
}

/// Arbiter between NVMe priority classes. `T` is the caller's payload.
#[derive(Clone, Debug)]
pub struct ClassArbiter<T> {
    config: ArbiterConfig,
    classes: [ClassQueues<T>; 4],
    /// Weighted class being visited: 1 (high), 2 (medium) or 3 (low).
    visiting: usize,
    next_seq: u64,
}

impl<T> ClassArbiter<T> {
    /// An empty arbiter.
    pub fn new(config: ArbiterConfig) -> Result<Self> {
        config.validate()?;
        Ok(ClassArbiter {
            config,
            classes: [
                ClassQueues::new(),
                ClassQueues::new(),
                ClassQueues::new(),
                ClassQueues::new(),
            ],
            visiting: 1,
            next_seq: 0,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> ArbiterConfig {
        self.config
    }

    /// Changes weights, burst or mode at run time (e.g. on Set Features
    /// Arbitration); queued commands are kept, visits restart.
    pub fn set_config(&mut self, config: ArbiterConfig) -> Result<()> {
        config.validate()?;
        self.config = config;
        for c in &mut self.classes {
            c.allowance = 0;
            c.visit_open = false;
        }
        Ok(())
    }

    /// Commands waiting in `class`.
    pub fn waiting(&self, class: NvmeClass) -> usize {
        self.classes[class.index()].waiting
    }

    /// Commands waiting in all classes.
    pub fn len(&self) -> usize {
        self.classes.iter().map(|c| c.waiting).sum()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a command of `bytes` on submission queue `queue` of `class`.
    pub fn enqueue(
        &mut self,
        now: Nanos,
        queue: QueueId,
        class: NvmeClass,
        bytes: u64,
        payload: T,
    ) {
        let c = &mut self.classes[class.index()];
        let seq = self.next_seq;
        self.next_seq += 1;
        let items = c.queues.entry(queue).or_default();
        if items.is_empty() {
            c.turn_order.push_back(queue);
        }
        items.push_back(Waiting {
            seq,
            bytes,
            enqueued_at: now,
            payload,
        });
        c.waiting += 1;
    }

    fn weight(&self, class: usize) -> u64 {
        match (self.config.mode, class) {
            (ArbitrationMode::Wrr, 1) => u64::from(self.config.high_weight),
            (ArbitrationMode::Wrr, 2) => u64::from(self.config.medium_weight),
            (ArbitrationMode::Wrr, _) => u64::from(self.config.low_weight),
            (ArbitrationMode::Drr, 1) => self.config.high_quantum_bytes,
            (ArbitrationMode::Drr, 2) => self.config.medium_quantum_bytes,
            (ArbitrationMode::Drr, _) => self.config.low_quantum_bytes,
        }
    }

    fn take(&mut self, class: usize, queue: QueueId, aged: bool) -> Option<Arbitrated<T>> {
        let item = self.classes[class].pop_from(queue, self.config.burst)?;
        Some(Arbitrated {
            queue,
            class: NvmeClass::ALL[class],
            bytes: item.bytes,
            enqueued_at: item.enqueued_at,
            aged,
            payload: item.payload,
        })
    }

    /// The oldest command that has waited at least the aging threshold.
    fn oldest_aged(&self, now: Nanos) -> Option<(usize, QueueId)> {
        let threshold_ns = self
            .config
            .aging_threshold_us
            .saturating_mul(NANOS_PER_MICRO);
        if threshold_ns == 0 {
            return None;
        }
        self.classes
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| {
                c.queues.iter().filter_map(move |(q, items)| {
                    items.front().map(|w| (w.enqueued_at, w.seq, ci, *q))
                })
            })
            .filter(|(at, ..)| now.nanos_since(*at) >= threshold_ns)
            .min_by_key(|(at, seq, ..)| (*at, *seq))
            .map(|(_, _, ci, q)| (ci, q))
    }

    /// The next command to execute, or `None` when nothing waits.
    pub fn dequeue(&mut self, now: Nanos) -> Option<Arbitrated<T>> {
        if let Some((class, queue)) = self.oldest_aged(now) {
            return self.take(class, queue, true);
        }
        if let Some(&queue) = self.classes[0].turn_order.front() {
            return self.take(0, queue, false);
        }
        if self.classes[1..].iter().all(|c| c.waiting == 0) {
            return None;
        }
        // Each visit either sends or grants one more weight; a DRR head of
        // b bytes needs at most b / quantum + 1 visits of its class.
        let largest_head = self.classes[1..]
            .iter()
            .filter_map(|c| c.head().map(|w| w.bytes))
            .max()
            .unwrap_or(0);
        let smallest_weight = (1..4).map(|c| self.weight(c)).min().unwrap_or(1).max(1);
        let limit = 3 * (largest_head / smallest_weight + 3);
        for _ in 0..limit {
            let class = self.visiting;
            let weight = self.weight(class);
            let mode = self.config.mode;
            let c = &mut self.classes[class];
            let Some(head_bytes) = c.head().map(|w| w.bytes) else {
                c.allowance = 0;
                c.visit_open = false;
                self.visiting = class % 3 + 1;
                continue;
            };
            let opened_now = !c.visit_open;
            if opened_now {
                c.visit_open = true;
                c.allowance = match mode {
                    ArbitrationMode::Wrr => weight,
                    ArbitrationMode::Drr => c.allowance.saturating_add(weight),
                };
            }
            let cost = match mode {
                ArbitrationMode::Wrr => 1,
                ArbitrationMode::Drr => head_bytes,
            };
            if cost <= c.allowance {
                c.allowance -= cost;
                let queue = *c.turn_order.front().expect("head exists");
                return self.take(class, queue, false);
            }
            c.visit_open = false;
            if mode == ArbitrationMode::Wrr {
                c.allowance = 0;
            }
            self.visiting = class % 3 + 1;
        }
        debug_assert!(false, "class arbitration loop bound reached");
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn no_aging(mode: ArbitrationMode) -> ArbiterConfig {
        ArbiterConfig {
            mode,
            aging_threshold_us: 0,
            ..ArbiterConfig::default()
        }
    }

    fn backlog(a: &mut ClassArbiter<()>, class: NvmeClass, queue: u32, bytes: u64, n: usize) {
        for _ in 0..n {
            a.enqueue(Nanos(0), QueueId(queue), class, bytes, ());
        }
    }

    fn counts(a: &mut ClassArbiter<()>, n: usize) -> [u64; 4] {
        let mut out = [0; 4];
        for _ in 0..n {
            let d = a.dequeue(Nanos(0)).unwrap();
            out[d.class.index()] += 1;
        }
        out
    }

    #[test]
    fn urgent_goes_strictly_first() {
        let mut a = ClassArbiter::new(no_aging(ArbitrationMode::Wrr)).unwrap();
        backlog(&mut a, NvmeClass::High, 1, 4096, 10);
        backlog(&mut a, NvmeClass::Urgent, 0, 4096, 5);
        assert_eq!(counts(&mut a, 5), [5, 0, 0, 0]);
        assert_eq!(counts(&mut a, 10), [0, 10, 0, 0]);
        assert!(a.dequeue(Nanos(0)).is_none());
    }

    #[test]
    fn wrr_shares_commands_by_weight() {
        let mut a = ClassArbiter::new(no_aging(ArbitrationMode::Wrr)).unwrap();
        backlog(&mut a, NvmeClass::High, 1, 4096, 1000);
        backlog(&mut a, NvmeClass::Medium, 2, 128 * 1024, 1000);
        backlog(&mut a, NvmeClass::Low, 3, 4096, 1000);
        assert_eq!(counts(&mut a, 130), [0, 80, 40, 10]);
    }

    #[test]
    fn drr_shares_bytes_by_quantum() {
        let mut a = ClassArbiter::new(no_aging(ArbitrationMode::Drr)).unwrap();
        // High sends 4 KiB, low 32 KiB: per round 128 KiB vs 32 KiB.
        backlog(&mut a, NvmeClass::High, 1, 4096, 10_000);
        backlog(&mut a, NvmeClass::Low, 3, 32 * 1024, 10_000);
        let c = counts(&mut a, 33 * 10);
        assert_eq!(c, [0, 320, 0, 10]);
    }

    #[test]
    fn drr_large_command_waits_several_visits() {
        let mut a = ClassArbiter::new(no_aging(ArbitrationMode::Drr)).unwrap();
        backlog(&mut a, NvmeClass::Low, 3, 128 * 1024, 1);
        backlog(&mut a, NvmeClass::High, 1, 128 * 1024, 100);
        let order: Vec<_> = (0..5).map(|_| a.dequeue(Nanos(0)).unwrap().class).collect();
        // Low needs four visits of 32 KiB.
        assert_eq!(
            order,
            [
                NvmeClass::High,
                NvmeClass::High,
                NvmeClass::High,
                NvmeClass::High,
                NvmeClass::Low
            ]
        );
    }

    #[test]
    fn burst_limits_one_queue_per_turn() {
        let mut a = ClassArbiter::new(ArbiterConfig {
            burst: 2,
            ..no_aging(ArbitrationMode::Wrr)
        })
        .unwrap();
        backlog(&mut a, NvmeClass::High, 1, 4096, 4);
        backlog(&mut a, NvmeClass::High, 2, 4096, 4);
        let queues: Vec<_> = (0..8)
            .map(|_| a.dequeue(Nanos(0)).unwrap().queue.0)
            .collect();
        assert_eq!(queues, [1, 1, 2, 2, 1, 1, 2, 2]);
    }

    #[test]
    fn aging_rescues_low_from_an_urgent_flood() {
        let mut a = ClassArbiter::new(ArbiterConfig {
            aging_threshold_us: 1000,
            ..ArbiterConfig::default()
        })
        .unwrap();
        a.enqueue(Nanos(0), QueueId(3), NvmeClass::Low, 4096, ());
        backlog(&mut a, NvmeClass::Urgent, 0, 4096, 100);
        assert_eq!(
            a.dequeue(Nanos::from_micros(999)).unwrap().class,
            NvmeClass::Urgent
        );
        let d = a.dequeue(Nanos::from_micros(1000)).unwrap();
        assert_eq!((d.class, d.aged), (NvmeClass::Low, true));
    }

    #[test]
    fn arbitration_feature_round_trips() {
        let cfg = ArbiterConfig::default().with_arbitration_feature(0x0703_0102);
        assert_eq!(
            (
                cfg.high_weight,
                cfg.medium_weight,
                cfg.low_weight,
                cfg.burst
            ),
            (8, 4, 2, 4)
        );
        assert_eq!(cfg.arbitration_feature(), 0x0703_0102);
        let unlimited = ArbiterConfig::default().with_arbitration_feature(0x7);
        assert_eq!(unlimited.burst, 0);
        assert_eq!(unlimited.arbitration_feature() & 0x7, 0x7);
    }

    #[test]
    fn invalid_weights_name_the_field() {
        let cfg = ArbiterConfig {
            low_weight: 0,
            ..ArbiterConfig::default()
        };
        assert!(matches!(
            ClassArbiter::<()>::new(cfg),
            Err(QosError::InvalidConfig {
                field: "low_weight",
                ..
            })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// With aging on, no command waits much longer than the aging
        /// threshold plus the time to send what was ahead of it, whatever
        /// the class mix (urgent floods included); and every command comes
        /// out exactly once.
        #[test]
        fn nothing_starves_with_aging(
            mode in prop_oneof![Just(ArbitrationMode::Wrr), Just(ArbitrationMode::Drr)],
            arrivals in proptest::collection::vec((0usize..4, 0u32..3, 1u64..64), 1..400),
        ) {
            let threshold_us = 200;
            let mut a = ClassArbiter::new(ArbiterConfig { mode, aging_threshold_us: threshold_us, ..ArbiterConfig::default() }).unwrap();
            let mut now = Nanos(0);
            let mut sent = 0usize;
            let total = arrivals.len();
            let mut max_wait_ns = 0u64;
            // Two arrivals per microsecond, one departure: a growing backlog.
            for chunk in arrivals.chunks(2) {
                for &(class, queue, pages) in chunk {
                    a.enqueue(now, QueueId(queue), NvmeClass::ALL[class], pages * 4096, ());
                }
                let d = a.dequeue(now).unwrap();
                max_wait_ns = max_wait_ns.max(now.nanos_since(d.enqueued_at));
                sent += 1;
                now = now.saturating_add_nanos(1000);
            }
            while let Some(d) = a.dequeue(now) {
                max_wait_ns = max_wait_ns.max(now.nanos_since(d.enqueued_at));
                sent += 1;
                now = now.saturating_add_nanos(1000);
            }
            prop_assert_eq!(sent, total);
            // Commands that aged are served oldest first, one per µs, so a
            // command waits at most the threshold plus one µs for each
            // command older than it.
            prop_assert!(max_wait_ns <= (threshold_us + total as u64) * 1000);
        }
    }
}
