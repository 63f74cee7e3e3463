//! I/O priority classes: the NVMe submission-queue classes and the mapping
//! from Linux `ionice` classes to them (ARCHITECTURE "ionice"; the ionice
//! paper §V).
//!
//! Default mapping: real-time → high, best-effort and none → medium,
//! idle → low. Urgent is used only when configured: real-time requests
//! whose level (0 is the most important) is below
//! `urgent_realtime_levels` map to urgent.

use serde::{Deserialize, Serialize};

use crate::error::{QosError, Result};

/// NVMe submission-queue priority class (NVMe base spec, weighted round
/// robin with urgent priority class arbitration). Ordered most important
/// first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NvmeClass {
    /// Served strictly before the weighted classes.
    Urgent,
    /// Weighted class with weight HPW.
    High,
    /// Weighted class with weight MPW.
    Medium,
    /// Weighted class with weight LPW.
    Low,
}

impl NvmeClass {
    /// All classes, most important first.
    pub const ALL: [NvmeClass; 4] = [
        NvmeClass::Urgent,
        NvmeClass::High,
        NvmeClass::Medium,
        NvmeClass::Low,
    ];

    /// 0 for urgent … 3 for low.
    pub const fn index(self) -> usize {
        match self {
            NvmeClass::Urgent => 0,
            NvmeClass::High => 1,
            NvmeClass::Medium => 2,
            NvmeClass::Low => 3,
        }
    }

    /// The NVMe QPRIO encoding (Create I/O SQ CDW11 bits 2:1): urgent 0,
    /// high 1, medium 2, low 3.
    pub const fn qprio(self) -> u8 {
        self.index() as u8
    }

    /// The class of a QPRIO value (only the two low bits are used).
    pub const fn from_qprio(qprio: u8) -> NvmeClass {
        match qprio & 0b11 {
            0 => NvmeClass::Urgent,
            1 => NvmeClass::High,
            2 => NvmeClass::Medium,
            _ => NvmeClass::Low,
        }
    }
}

/// Linux I/O priority class (`ioprio_get(2)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoprioClass {
    /// IOPRIO_CLASS_NONE: no explicit priority.
    None,
    /// IOPRIO_CLASS_RT, with level 0 (highest) to 7.
    RealTime,
    /// IOPRIO_CLASS_BE, with level 0 (highest) to 7.
    BestEffort,
    /// IOPRIO_CLASS_IDLE.
    Idle,
}

/// Bit position of the class in a Linux ioprio value.
pub const IOPRIO_CLASS_SHIFT: u16 = 13;
/// Mask of the level in a Linux ioprio value.
pub const IOPRIO_LEVEL_MASK: u16 = 0x7;

/// A decoded Linux ioprio value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ioprio {
    /// Scheduling class.
    pub class: IoprioClass,
    /// Level within the class, 0 (highest) to 7.
    pub level: u8,
}

impl Ioprio {
    /// Decodes the 16-bit value the kernel keeps in `rq->ioprio`
    /// (class in bits 15:13, level in bits 2:0; hint bits are ignored).
    /// Unknown classes (4–7) decode as none.
    pub const fn from_raw(raw: u16) -> Ioprio {
        let class = match raw >> IOPRIO_CLASS_SHIFT {
            1 => IoprioClass::RealTime,
            2 => IoprioClass::BestEffort,
            3 => IoprioClass::Idle,
            _ => IoprioClass::None,
        };
        Ioprio {
            class,
            level: (raw & IOPRIO_LEVEL_MASK) as u8,
        }
    }
}

/// How ioprio classes map to NVMe classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassMap {
    /// Class of real-time requests not promoted to urgent. Default high.
    pub realtime: NvmeClass,
    /// Class of best-effort requests. Default medium.
    pub best_effort: NvmeClass,
    /// Class of requests without a priority. Default medium.
    pub none: NvmeClass,
    /// Class of idle requests. Default low.
    pub idle: NvmeClass,
    /// Real-time levels below this map to urgent (0 to 8). Default 0:
    /// nothing is urgent unless configured.
    pub urgent_realtime_levels: u8,
}

impl Default for ClassMap {
    fn default() -> Self {
        ClassMap {
            realtime: NvmeClass::High,
            best_effort: NvmeClass::Medium,
            none: NvmeClass::Medium,
            idle: NvmeClass::Low,
            urgent_realtime_levels: 0,
        }
    }
}

impl ClassMap {
    /// Rejects out-of-range values, naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.urgent_realtime_levels > 8 {
            return Err(QosError::invalid(
                "urgent_realtime_levels",
                "must be at most 8",
            ));
        }
        Ok(())
    }

    /// The NVMe class of a request with this ioprio.
    pub fn class_of(&self, ioprio: Ioprio) -> NvmeClass {
        match ioprio.class {
            IoprioClass::RealTime if ioprio.level < self.urgent_realtime_levels => {
                NvmeClass::Urgent
            }
            IoprioClass::RealTime => self.realtime,
            IoprioClass::BestEffort => self.best_effort,
            IoprioClass::None => self.none,
            IoprioClass::Idle => self.idle,
        }
    }

    /// The NVMe class of a raw kernel ioprio value.
    pub fn class_of_raw(&self, raw: u16) -> NvmeClass {
        self.class_of(Ioprio::from_raw(raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(class: u16, level: u16) -> u16 {
        (class << IOPRIO_CLASS_SHIFT) | level
    }

    #[test]
    fn default_mapping() {
        let m = ClassMap::default();
        assert_eq!(m.class_of_raw(0), NvmeClass::Medium);
        assert_eq!(m.class_of_raw(raw(1, 0)), NvmeClass::High);
        assert_eq!(m.class_of_raw(raw(2, 4)), NvmeClass::Medium);
        assert_eq!(m.class_of_raw(raw(3, 0)), NvmeClass::Low);
        assert_eq!(m.class_of_raw(raw(7, 0)), NvmeClass::Medium);
    }

    #[test]
    fn urgent_only_when_configured() {
        let m = ClassMap {
            urgent_realtime_levels: 2,
            ..ClassMap::default()
        };
        assert_eq!(m.class_of_raw(raw(1, 0)), NvmeClass::Urgent);
        assert_eq!(m.class_of_raw(raw(1, 1)), NvmeClass::Urgent);
        assert_eq!(m.class_of_raw(raw(1, 2)), NvmeClass::High);
        assert!(ClassMap {
            urgent_realtime_levels: 9,
            ..ClassMap::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn decode_ignores_hint_bits() {
        let p = Ioprio::from_raw(raw(2, 3) | (5 << 3));
        assert_eq!(
            p,
            Ioprio {
                class: IoprioClass::BestEffort,
                level: 3
            }
        );
        for c in NvmeClass::ALL {
            assert_eq!(NvmeClass::from_qprio(c.qprio()), c);
        }
    }
}
