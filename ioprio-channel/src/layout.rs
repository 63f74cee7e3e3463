//! The memory layout shared with the BPF program (`bpf/ioprio.bpf.c`), and
//! its decoding. Pure: no kernel needed, so every rule here is unit-tested.
//!
//! # Slots
//!
//! The array map `slots` holds one `u64` per (registered device, hardware
//! queue, tag): slot index = `base + hwq * queue_depth + tag`, where `base`,
//! `queue_depth` and the device's `generation` come from its [`DevEntry`].
//! A slot's value is
//!
//! ```text
//!  63            32 31          16 15           0
//! +----------------+--------------+--------------+
//! |      seq       |  generation  |  ioprio      |
//! +----------------+--------------+--------------+
//! ```
//!
//! * `ioprio` is the kernel's `rq->ioprio` (class in bits 15:13, level in
//!   bits 2:0), decoded by [`qos_core::priority::Ioprio::from_raw`].
//! * `generation` is the registration that owns the slot; a write left over
//!   from a device that had the range before is recognised by it.
//! * `seq` is incremented by every write. The reader remembers the last seq
//!   it consumed per tag: an unchanged seq means the program did not see
//!   this request (registered too late, program detached), so the slot is
//!   stale and the caller uses its fallback class.
//!
//! Value 0 (generation 0 is never handed out) means "never written".
//!
//! # Memory ordering
//!
//! The program writes the slot with one aligned 8-byte store, so a reader
//! sees either the old or the new value, never a mix: no seqlock is needed.
//! Only one writer exists per slot at a time, because a tag belongs to one
//! request until it completes and `block_rq_issue` runs once per dispatch
//! of it (again on a requeue, which only overwrites). The store happens in
//! `blk_mq_start_request`, inside ublk's `queue_rq`, strictly before
//! `ublk_queue_cmd` hands the request to the server: that hand-off goes
//! through task-work queueing (a fully ordered atomic) and the io_uring
//! completion (a release store of the CQ tail that the server reads with
//! acquire). So once the server has the completion for tag T, the slot's
//! new value is visible to it; the reader's `Acquire` load adds nothing the
//! hand-off lacks but states the intent. The next write to the same slot
//! needs the next request on tag T, which cannot be issued before the
//! server commits the current one, so reading the slot when the request
//! arrives (before committing it) always reads this request's value.

use qos_core::priority::{ClassMap, Ioprio, NvmeClass};

/// Size of one slot in bytes (the array's value size).
pub const SLOT_BYTES: usize = 8;

/// Capacity of the device table (`devices` map in the BPF program).
pub const MAX_DEVICES: usize = 64;

/// Value of the `devices` hash map, keyed by the kernel `dev_t` of the
/// whole disk. Must match `struct dev_entry` in `bpf/ioprio.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevEntry {
    /// First slot of the device.
    pub base: u32,
    /// Hardware queues covered; requests on other queues are not recorded.
    pub nr_hw_queues: u16,
    /// Tags per hardware queue covered.
    pub queue_depth: u16,
    /// Written into every slot of this device; never 0.
    pub generation: u16,
    /// Keeps the size a multiple of 4 with no implicit padding.
    pub _pad: u16,
}

// SAFETY: repr(C), only integer fields, no implicit padding (12 bytes).
unsafe impl aya::Pod for DevEntry {}

impl DevEntry {
    /// Slots the device needs.
    pub fn slot_count(&self) -> u32 {
        u32::from(self.nr_hw_queues) * u32::from(self.queue_depth)
    }

    /// Index of the slot of (hwq, tag), or `None` outside the geometry
    /// (the program records nothing there either).
    pub fn slot_index(&self, hwq: u16, tag: u16) -> Option<u32> {
        if hwq >= self.nr_hw_queues || tag >= self.queue_depth {
            return None;
        }
        Some(self.base + u32::from(hwq) * u32::from(self.queue_depth) + u32::from(tag))
    }
}

/// A kernel `dev_t` in the kernel's own encoding (`MAJOR << 20 | MINOR`,
/// as `disk_devt()` builds it), which is what the program computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevT(pub u32);

impl DevT {
    /// From a major and minor number (minor below 2^20).
    pub fn new(major: u32, minor: u32) -> DevT {
        DevT((major << 20) | (minor & 0xf_ffff))
    }

    /// Major number.
    pub fn major(self) -> u32 {
        self.0 >> 20
    }

    /// Minor number.
    pub fn minor(self) -> u32 {
        self.0 & 0xf_ffff
    }

    /// Parses sysfs's `MAJOR:MINOR` (as in `/sys/block/NAME/dev`).
    pub fn parse_sysfs(s: &str) -> Option<DevT> {
        let (ma, mi) = s.trim().split_once(':')?;
        let (ma, mi) = (ma.parse::<u32>().ok()?, mi.parse::<u32>().ok()?);
        (ma < (1 << 12) && mi < (1 << 20)).then(|| DevT::new(ma, mi))
    }
}

impl std::fmt::Display for DevT {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major(), self.minor())
    }
}

/// One decoded slot value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotValue {
    /// Write counter.
    pub seq: u32,
    /// Registration that wrote it.
    pub generation: u16,
    /// Raw `rq->ioprio`.
    pub ioprio: u16,
}

impl SlotValue {
    /// Splits a raw slot.
    pub const fn decode(raw: u64) -> SlotValue {
        SlotValue {
            seq: (raw >> 32) as u32,
            generation: (raw >> 16) as u16,
            ioprio: raw as u16,
        }
    }

    /// The raw slot (what the program stores).
    pub const fn encode(self) -> u64 {
        ((self.seq as u64) << 32) | ((self.generation as u64) << 16) | self.ioprio as u64
    }
}

/// What the server learns about one request from its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The program recorded this request: its raw `rq->ioprio`.
    Fresh(u16),
    /// Nothing new was recorded for this tag (or the slot belongs to an
    /// earlier registration): use the fallback class.
    Stale,
}

impl Observation {
    /// Decodes a slot read for a request, given the seq consumed last time
    /// on this tag and the reader's generation. Returns the observation and
    /// the seq to remember.
    pub fn from_slot(raw: u64, last_seq: u32, generation: u16) -> (Observation, u32) {
        let v = SlotValue::decode(raw);
        if v.generation != generation || v.seq == last_seq {
            return (Observation::Stale, last_seq);
        }
        (Observation::Fresh(v.ioprio), v.seq)
    }

    /// The decoded ioprio, when fresh.
    pub fn ioprio(self) -> Option<Ioprio> {
        match self {
            Observation::Fresh(raw) => Some(Ioprio::from_raw(raw)),
            Observation::Stale => None,
        }
    }

    /// The request's NVMe class: by `map` when fresh, else `fallback` (the
    /// volume's configured class).
    pub fn class(self, map: &ClassMap, fallback: NvmeClass) -> NvmeClass {
        match self {
            Observation::Fresh(raw) => map.class_of_raw(raw),
            Observation::Stale => fallback,
        }
    }
}

/// First-fit allocator of slot ranges for registrations. Ranges are handed
/// out lowest first and merged on release.
#[derive(Debug)]
pub struct SlotAllocator {
    /// Free ranges (start, len), sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
}

impl SlotAllocator {
    /// All of `capacity` slots free.
    pub fn new(capacity: u32) -> SlotAllocator {
        SlotAllocator {
            free: if capacity > 0 {
                vec![(0, capacity)]
            } else {
                Vec::new()
            },
        }
    }

    /// Start of a free range of `len` slots, or `None` when none is large
    /// enough.
    pub fn alloc(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    /// Returns a range from [`SlotAllocator::alloc`].
    pub fn release(&mut self, start: u32, len: u32) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the next, then with the previous range.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Free slots in total.
    pub fn free_slots(&self) -> u32 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_core::priority::IOPRIO_CLASS_SHIFT;

    #[test]
    fn dev_entry_matches_the_c_struct() {
        // struct dev_entry: u32 base, u16 x4.
        assert_eq!(std::mem::size_of::<DevEntry>(), 12);
        assert_eq!(std::mem::offset_of!(DevEntry, nr_hw_queues), 4);
        assert_eq!(std::mem::offset_of!(DevEntry, queue_depth), 6);
        assert_eq!(std::mem::offset_of!(DevEntry, generation), 8);
    }

    #[test]
    fn slot_index_covers_the_geometry_exactly() {
        let e = DevEntry {
            base: 100,
            nr_hw_queues: 2,
            queue_depth: 4,
            generation: 1,
            _pad: 0,
        };
        assert_eq!(e.slot_count(), 8);
        assert_eq!(e.slot_index(0, 0), Some(100));
        assert_eq!(e.slot_index(1, 3), Some(107));
        assert_eq!(e.slot_index(2, 0), None);
        assert_eq!(e.slot_index(0, 4), None);
    }

    #[test]
    fn slot_value_round_trips_and_matches_the_program() {
        let v = SlotValue {
            seq: 0xdead_beef,
            generation: 7,
            ioprio: (1 << IOPRIO_CLASS_SHIFT) | 3,
        };
        // Same expression as the program's store.
        let c = (0xdead_beef_u64 << 32) | (7 << 16) | u64::from(v.ioprio);
        assert_eq!(v.encode(), c);
        assert_eq!(SlotValue::decode(c), v);
    }

    #[test]
    fn stale_and_fresh_slots() {
        let rt0 = 1 << IOPRIO_CLASS_SHIFT;
        let raw = SlotValue {
            seq: 5,
            generation: 3,
            ioprio: rt0,
        }
        .encode();
        // New seq, our generation: fresh, and seq 5 is remembered.
        assert_eq!(
            Observation::from_slot(raw, 4, 3),
            (Observation::Fresh(rt0), 5)
        );
        // Same seq as last time: the program did not see this request.
        assert_eq!(Observation::from_slot(raw, 5, 3), (Observation::Stale, 5));
        // Written under another registration: stale, seq not taken.
        assert_eq!(Observation::from_slot(raw, 0, 4), (Observation::Stale, 0));
        // Never written.
        assert_eq!(Observation::from_slot(0, 0, 1), (Observation::Stale, 0));
        // A wrapped seq is still a change.
        let wrapped = SlotValue {
            seq: 0,
            generation: 3,
            ioprio: rt0,
        }
        .encode();
        assert_eq!(
            Observation::from_slot(wrapped, u32::MAX, 3),
            (Observation::Fresh(rt0), 0)
        );
    }

    #[test]
    fn classes_from_observations() {
        let m = ClassMap::default();
        let idle = 3 << IOPRIO_CLASS_SHIFT;
        let rt = 1 << IOPRIO_CLASS_SHIFT;
        assert_eq!(
            Observation::Fresh(rt).class(&m, NvmeClass::Low),
            NvmeClass::High
        );
        assert_eq!(
            Observation::Fresh(idle).class(&m, NvmeClass::High),
            NvmeClass::Low
        );
        assert_eq!(
            Observation::Fresh(0).class(&m, NvmeClass::Low),
            NvmeClass::Medium
        );
        assert_eq!(
            Observation::Stale.class(&m, NvmeClass::Urgent),
            NvmeClass::Urgent
        );
        assert_eq!(Observation::Stale.ioprio(), None);
    }

    #[test]
    fn dev_t_encoding() {
        let d = DevT::new(259, 3);
        assert_eq!(d.0, (259 << 20) | 3);
        assert_eq!((d.major(), d.minor()), (259, 3));
        assert_eq!(DevT::parse_sysfs("7:0\n"), Some(DevT::new(7, 0)));
        assert_eq!(DevT::parse_sysfs("7"), None);
        assert_eq!(DevT::parse_sysfs("7:1048576"), None);
        assert_eq!(d.to_string(), "259:3");
    }

    #[test]
    fn allocator_first_fit_and_merge() {
        let mut a = SlotAllocator::new(100);
        assert_eq!(a.alloc(0), None);
        assert_eq!(a.alloc(40), Some(0));
        assert_eq!(a.alloc(40), Some(40));
        assert_eq!(a.alloc(40), None);
        a.release(0, 40);
        assert_eq!(a.alloc(30), Some(0));
        a.release(40, 40);
        a.release(0, 30);
        assert_eq!(a.free_slots(), 100);
        assert_eq!(a.alloc(100), Some(0));
    }
}
