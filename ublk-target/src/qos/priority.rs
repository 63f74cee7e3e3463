//! I/O priority of a volume's requests (`[priority]` in its config): where
//! a request's NVMe class comes from, which I/O queues the volume opens,
//! and how the target (CC.AMS, Arbitration feature) and the client's own
//! held-request queue arbitrate between the classes.
//!
//! ```toml
//! [priority]
//! source = "ionice"        # ionice: per request, from the BPF side channel
//!                          # (falls back to `class` when it cannot load);
//!                          # fixed: every request is `class`
//! class = "medium"         # fallback / fixed class
//! realtime = "high"        # ionice class -> NVMe class (qos_core ClassMap)
//! best_effort = "medium"
//! none = "medium"
//! idle = "low"
//! urgent_realtime_levels = 0   # RT levels below this are urgent
//! arbitration = "auto"     # auto: WRR if the target offers it, else round
//!                          # robin; wrr; drr (gimbal-target's vendor DRR)
//! high_weight = 8          # commands (WRR) or x 32 KiB (DRR) per visit
//! medium_weight = 4
//! low_weight = 1
//! burst = 8
//! aging_ms = 100           # a held request older than this goes first
//! ```
//!
//! Decisions:
//! - One I/O queue per class **in use** per ublk queue: the classes the
//!   map can produce plus the fallback class, or only the fallback class
//!   when the side channel is off (`source = "fixed"` or it could not
//!   load). Under round robin the target ignores classes, so then every
//!   request shares one queue (the fallback class's) and only the client's
//!   held-request release still orders by class.
//! - DRR weights become byte quanta of `weight × 32 KiB`, the same unit
//!   gimbal-target uses for its vendor DRR, so the client releases held
//!   requests in the byte ratio the target serves them.

use qos_core::class_arbiter::{ArbiterConfig, ArbitrationMode};
use qos_core::priority::{ClassMap, NvmeClass};

/// Bytes of DRR quantum per unit of weight (the target's unit too).
pub use qos_core::class_arbiter::DRR_QUANTUM_UNIT_BYTES;

/// Where a request's class comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The request's ioprio, delivered by the BPF side channel.
    Ionice,
    /// Every request gets the configured class.
    Fixed,
}

/// The arbitration mechanism asked of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Weighted round robin with urgent when offered, else round robin.
    Auto,
    /// Weighted round robin with urgent (an error if not offered).
    Wrr,
    /// gimbal-target's vendor-specific DRR by bytes (an error if the
    /// target offers no vendor mechanism).
    Drr,
}

/// A volume's `[priority]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityConfig {
    /// Where classes come from.
    pub source: Source,
    /// The fallback (or fixed) class.
    pub class: NvmeClass,
    /// ionice class to NVMe class.
    pub map: ClassMap,
    /// What to ask of the target.
    pub mechanism: Mechanism,
    /// Weights (commands per visit), burst.
    pub high_weight: u32,
    /// Medium class weight.
    pub medium_weight: u32,
    /// Low class weight.
    pub low_weight: u32,
    /// Arbitration burst (commands per queue per turn, 0 = unlimited).
    pub burst: u32,
    /// Aging of held requests, ms (0 = none).
    pub aging_ms: u64,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        let a = ArbiterConfig::default();
        Self {
            source: Source::Ionice,
            class: NvmeClass::Medium,
            map: ClassMap::default(),
            mechanism: Mechanism::Auto,
            high_weight: a.high_weight,
            medium_weight: a.medium_weight,
            low_weight: a.low_weight,
            burst: a.burst,
            aging_ms: a.aging_threshold_us / 1000,
        }
    }
}

impl PriorityConfig {
    /// The classes whose queues the volume opens, most important first.
    /// `side_channel`: whether per-request priorities are available.
    pub fn classes_in_use(&self, side_channel: bool) -> Vec<NvmeClass> {
        let mut v = vec![self.class];
        if side_channel && self.source == Source::Ionice {
            let m = &self.map;
            v.extend([m.realtime, m.best_effort, m.none, m.idle]);
            if m.urgent_realtime_levels > 0 {
                v.push(NvmeClass::Urgent);
            }
        }
        v.sort();
        v.dedup();
        v
    }

    /// The client-side arbiter that releases held requests by class: the
    /// same weights as the target's, by bytes under DRR, by commands
    /// otherwise.
    pub fn arbiter(&self) -> ArbiterConfig {
        let unit = DRR_QUANTUM_UNIT_BYTES;
        ArbiterConfig {
            mode: match self.mechanism {
                Mechanism::Drr => ArbitrationMode::Drr,
                Mechanism::Auto | Mechanism::Wrr => ArbitrationMode::Wrr,
            },
            high_weight: self.high_weight,
            medium_weight: self.medium_weight,
            low_weight: self.low_weight,
            high_quantum_bytes: u64::from(self.high_weight) * unit,
            medium_quantum_bytes: u64::from(self.medium_weight) * unit,
            low_quantum_bytes: u64::from(self.low_weight) * unit,
            burst: self.burst,
            aging_threshold_us: self.aging_ms * 1000,
        }
    }

    /// The initiator's CC.AMS request.
    pub fn arbitration(&self) -> nvmf_initiator::controller::Arbitration {
        use nvmf_initiator::controller::Arbitration;
        match self.mechanism {
            Mechanism::Auto => Arbitration::PreferWeighted,
            Mechanism::Wrr => Arbitration::WeightedRoundRobin,
            Mechanism::Drr => Arbitration::VendorSpecific,
        }
    }

    /// The Arbitration feature dword 11 (HPW, MPW, LPW, burst).
    pub fn arbitration_feature(&self) -> u32 {
        self.arbiter().arbitration_feature()
    }
}

/// The name of a class as configs and `status` spell it.
pub fn class_name(c: NvmeClass) -> &'static str {
    match c {
        NvmeClass::Urgent => "urgent",
        NvmeClass::High => "high",
        NvmeClass::Medium => "medium",
        NvmeClass::Low => "low",
    }
}

/// Parse a class name.
pub fn parse_class(s: &str) -> Option<NvmeClass> {
    NvmeClass::ALL.into_iter().find(|c| class_name(*c) == s)
}

/// The fabrics Connect CATTR class of an NVMe class: both use the NVMe
/// QPRIO encoding (urgent 0 .. low 3).
pub fn connect_class(c: NvmeClass) -> nvmf_proto::fabrics::PriorityClass {
    nvmf_proto::fabrics::PriorityClass::from_bits(c.qprio())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_in_use_follow_the_map_and_the_side_channel() {
        let c = PriorityConfig::default();
        use NvmeClass::*;
        assert_eq!(c.classes_in_use(true), vec![High, Medium, Low]);
        assert_eq!(c.classes_in_use(false), vec![Medium]);
        let fixed = PriorityConfig {
            source: Source::Fixed,
            class: Low,
            ..c
        };
        assert_eq!(fixed.classes_in_use(true), vec![Low]);
        let urgent = PriorityConfig {
            map: ClassMap {
                urgent_realtime_levels: 1,
                ..ClassMap::default()
            },
            ..c
        };
        assert_eq!(urgent.classes_in_use(true), vec![Urgent, High, Medium, Low]);
    }

    #[test]
    fn drr_quanta_are_weight_units_and_the_feature_carries_the_weights() {
        let c = PriorityConfig {
            mechanism: Mechanism::Drr,
            high_weight: 4,
            medium_weight: 2,
            low_weight: 1,
            ..PriorityConfig::default()
        };
        let a = c.arbiter();
        assert_eq!(a.mode, ArbitrationMode::Drr);
        assert_eq!(a.high_quantum_bytes, 4 * 32 * 1024);
        assert_eq!(a.low_quantum_bytes, 32 * 1024);
        let back = ArbiterConfig::default().with_arbitration_feature(c.arbitration_feature());
        assert_eq!(
            (
                back.high_weight,
                back.medium_weight,
                back.low_weight,
                back.burst
            ),
            (4, 2, 1, 8)
        );
        for n in ["urgent", "high", "medium", "low"] {
            assert_eq!(class_name(parse_class(n).unwrap()), n);
        }
        use nvmf_proto::fabrics::PriorityClass as P;
        assert_eq!(connect_class(NvmeClass::Urgent), P::Urgent);
        assert_eq!(connect_class(NvmeClass::High), P::High);
        assert_eq!(connect_class(NvmeClass::Medium), P::Medium);
        assert_eq!(connect_class(NvmeClass::Low), P::Low);
        assert!(parse_class("rt").is_none());
    }
}
