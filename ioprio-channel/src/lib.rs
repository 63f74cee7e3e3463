//! The ioprio side channel: delivers each block request's I/O priority
//! (`rq->ioprio`, set by `ionice`/`ioprio_set`) to the ublk server, keyed by
//! (device, hardware queue, tag), because the ublk I/O descriptor does not
//! carry it.
//!
//! A BTF tracing program on `tp_btf/block_rq_issue` (`bpf/ioprio.bpf.c`)
//! looks the request's disk up in a small hash map of registered devices and
//! stores the priority in an mmap-able BPF array; the server reads the array
//! directly, lock-free (layout and memory ordering: [`layout`]).
//!
//! Use:
//!
//! 1. At startup, [`PriorityChannel::open_or_fallback`] once. It returns the
//!    channel or the typed reason it is unavailable; log that reason once
//!    and use the volume's configured class. [`Mode`] is what `status`
//!    shows (`bpf` or `fallback: <reason>`).
//! 2. Per device, [`PriorityChannel::register`] with its `dev_t` and
//!    geometry; keep the [`Registration`] for the device's lifetime
//!    (dropping it unregisters).
//! 3. Per ublk queue thread, [`Registration::queue_reader`]; when a request
//!    arrives for a tag, [`QueueReader::take`] gives its [`Observation`],
//!    which [`Observation::class`] maps to an NVMe class with the volume's
//!    [`ClassMap`](qos_core::priority::ClassMap), or the fallback class when
//!    nothing was recorded for it.

pub mod layout;
mod loader;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use layout::{DevEntry, Observation as Obs, SlotAllocator, SLOT_BYTES};
pub use layout::{DevT, Observation};

/// Where the kernel exposes its BTF.
pub const DEFAULT_BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Default number of slots: 64 Ki × 8 bytes = 512 KiB of kernel memory,
/// room for e.g. 4 devices of 4 queues × 4096 tags or 64 of 1 × 1024.
pub const DEFAULT_SLOT_CAPACITY: u32 = 64 * 1024;

/// How to open the channel. The defaults are for production; tests change
/// them to exercise the fallback reasons without a special kernel.
#[derive(Clone, Debug)]
pub struct Options {
    /// BTF of the running kernel; needed for the typed tracepoint and the
    /// CO-RE relocations.
    pub btf_path: PathBuf,
    /// Slots in the shared array (registrations take nr_hw_queues ×
    /// queue_depth each).
    pub slot_capacity: u32,
    /// Behave as if the process lacked CAP_BPF/CAP_PERFMON/CAP_SYS_ADMIN.
    pub simulate_unprivileged: bool,
    /// The BTF tracepoint to attach to. Only tests change it: a name the
    /// kernel does not have makes the real kernel refuse the program, the
    /// path a kernel without `block_rq_issue`'s BTF type would take.
    pub tracepoint: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            btf_path: PathBuf::from(DEFAULT_BTF_PATH),
            slot_capacity: DEFAULT_SLOT_CAPACITY,
            simulate_unprivileged: false,
            tracepoint: loader::TRACEPOINT.to_owned(),
        }
    }
}

/// Why the side channel cannot be used; the caller falls back to the
/// volume's configured class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The crate was built without the BPF object (clang missing).
    NotBuilt,
    /// The kernel exposes no BTF (CONFIG_DEBUG_INFO_BTF off).
    NoBtf {
        /// Path looked at.
        path: PathBuf,
    },
    /// The BTF file is there but could not be parsed.
    BadBtf {
        /// Path read.
        path: PathBuf,
        /// Parser's message.
        detail: String,
    },
    /// The process may not load tracing programs.
    NoCapability {
        /// What is missing.
        detail: String,
    },
    /// The slot capacity option is out of range.
    BadCapacity(u32),
    /// The kernel refused the object or the program (verifier, no such
    /// tracepoint, map creation).
    Load {
        /// Loader's or verifier's message.
        detail: String,
    },
    /// The program loaded but could not be attached to the tracepoint.
    Attach {
        /// Kernel's message.
        detail: String,
    },
    /// The slot array could not be mapped into the process.
    Mmap {
        /// OS error.
        detail: String,
    },
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NotBuilt => write!(f, "BPF program not built (no clang at build time)"),
            Unavailable::NoBtf { path } => write!(f, "no kernel BTF at {}", path.display()),
            Unavailable::BadBtf { path, detail } => {
                write!(f, "kernel BTF at {} unreadable: {detail}", path.display())
            }
            Unavailable::NoCapability { detail } => write!(f, "missing capability: {detail}"),
            Unavailable::BadCapacity(n) => write!(f, "slot capacity {n} out of range"),
            Unavailable::Load { detail } => write!(f, "BPF load failed: {detail}"),
            Unavailable::Attach { detail } => {
                write!(f, "attach to tp_btf/block_rq_issue failed: {detail}")
            }
            Unavailable::Mmap { detail } => write!(f, "mmap of the slot array failed: {detail}"),
        }
    }
}

/// Which source of priorities is active, for `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Per-request priorities from the BPF side channel.
    Bpf,
    /// The volume's configured class, for this reason.
    Fallback(Unavailable),
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Bpf => write!(f, "bpf"),
            Mode::Fallback(why) => write!(f, "fallback: {why}"),
        }
    }
}

/// The crate's error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The channel cannot be opened.
    #[error("ioprio side channel unavailable: {0}")]
    Unavailable(Unavailable),
    /// The device is registered already.
    #[error("device {0} is registered already")]
    AlreadyRegistered(DevT),
    /// nr_hw_queues or queue_depth is 0.
    #[error("device {dev}: empty geometry ({nr_hw_queues} queues × {queue_depth} tags)")]
    EmptyGeometry {
        /// Device.
        dev: DevT,
        /// Queues asked for.
        nr_hw_queues: u16,
        /// Tags asked for.
        queue_depth: u16,
    },
    /// No free range of slots large enough.
    #[error("device {dev}: no room for {needed} slots ({free} free)")]
    NoSlots {
        /// Device.
        dev: DevT,
        /// Slots the geometry needs.
        needed: u32,
        /// Slots free in total (possibly fragmented).
        free: u32,
    },
    /// The device table is full.
    #[error("device table full ({} devices)", layout::MAX_DEVICES)]
    TooManyDevices,
    /// A BPF map operation failed.
    #[error("BPF map {op}: {detail}")]
    Map {
        /// Operation.
        op: &'static str,
        /// Kernel's message.
        detail: String,
    },
    /// A device's `dev_t` could not be found.
    #[error("cannot find dev_t of {what}: {detail}")]
    NoDevT {
        /// Device path or name.
        what: String,
        /// Why.
        detail: String,
    },
}

impl From<Unavailable> for Error {
    fn from(u: Unavailable) -> Self {
        Error::Unavailable(u)
    }
}

/// Result with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The slot array as mapped into this process.
struct SlotMap {
    ptr: *mut AtomicU64,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics; it
// lives until SlotMap is dropped.
unsafe impl Send for SlotMap {}
// SAFETY: as above.
unsafe impl Sync for SlotMap {}

impl SlotMap {
    fn slot(&self, index: u32) -> &AtomicU64 {
        let i = index as usize;
        assert!(i < self.len, "slot {i} outside the array of {}", self.len);
        // SAFETY: in bounds, 8-byte aligned (page-aligned base), and the
        // memory stays mapped while &self lives.
        unsafe { &*self.ptr.add(i) }
    }
}

impl Drop for SlotMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap in the loader.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len * SLOT_BYTES);
        }
    }
}

struct Registry {
    devices: loader::DeviceTable,
    alloc: SlotAllocator,
    next_generation: u16,
}

struct Inner {
    slots: SlotMap,
    registry: Mutex<Registry>,
    // Keeps the program loaded and attached; detached on drop.
    _program: loader::Attached,
}

/// The loaded, attached side channel. Cheap to clone; all clones share one
/// program and one slot array.
#[derive(Clone)]
pub struct PriorityChannel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PriorityChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorityChannel")
            .field("slots", &self.inner.slots.len)
            .finish()
    }
}

impl PriorityChannel {
    /// Checks the prerequisites (object built, BTF, capabilities), loads the
    /// program, attaches it and maps the slot array.
    pub fn open(options: &Options) -> Result<PriorityChannel, Unavailable> {
        if options.slot_capacity == 0 || options.slot_capacity > (1 << 24) {
            return Err(Unavailable::BadCapacity(options.slot_capacity));
        }
        let object = loader::object().ok_or(Unavailable::NotBuilt)?;
        if !options.btf_path.exists() {
            return Err(Unavailable::NoBtf {
                path: options.btf_path.clone(),
            });
        }
        let caps = if options.simulate_unprivileged {
            0
        } else {
            effective_capabilities()
        };
        check_capabilities(caps)?;
        let loaded = loader::load(
            object,
            &options.btf_path,
            options.slot_capacity,
            &options.tracepoint,
        )?;
        let inner = Inner {
            slots: SlotMap {
                ptr: loaded.slots_ptr.cast(),
                len: options.slot_capacity as usize,
            },
            registry: Mutex::new(Registry {
                devices: loaded.devices,
                alloc: SlotAllocator::new(options.slot_capacity),
                next_generation: 1,
            }),
            _program: loaded.attached,
        };
        Ok(PriorityChannel {
            inner: Arc::new(inner),
        })
    }

    /// [`PriorityChannel::open`], with the outcome as the [`Mode`] to show
    /// in `status`. The caller logs a fallback reason once.
    pub fn open_or_fallback(options: &Options) -> (Option<PriorityChannel>, Mode) {
        match PriorityChannel::open(options) {
            Ok(c) => (Some(c), Mode::Bpf),
            Err(why) => (None, Mode::Fallback(why)),
        }
    }

    /// Starts recording priorities of requests to `dev` (the whole disk)
    /// on hardware queues below `nr_hw_queues` with tags below
    /// `queue_depth`. Requests issued before this returns are not recorded
    /// (their slots read as stale).
    pub fn register(&self, dev: DevT, nr_hw_queues: u16, queue_depth: u16) -> Result<Registration> {
        if nr_hw_queues == 0 || queue_depth == 0 {
            return Err(Error::EmptyGeometry {
                dev,
                nr_hw_queues,
                queue_depth,
            });
        }
        let mut reg = self
            .inner
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if reg.devices.contains(dev)? {
            return Err(Error::AlreadyRegistered(dev));
        }
        let needed = u32::from(nr_hw_queues) * u32::from(queue_depth);
        let base = reg.alloc.alloc(needed).ok_or(Error::NoSlots {
            dev,
            needed,
            free: reg.alloc.free_slots(),
        })?;
        let generation = reg.next_generation;
        reg.next_generation = reg.next_generation.checked_add(1).unwrap_or(1);
        let entry = DevEntry {
            base,
            nr_hw_queues,
            queue_depth,
            generation,
            _pad: 0,
        };
        // Clear before publishing the entry so the readers' "last seq 0"
        // matches; a late write of a previous owner carries its own
        // generation and reads as stale.
        for i in base..base + needed {
            self.inner.slots.slot(i).store(0, Ordering::Relaxed);
        }
        if let Err(e) = reg.devices.insert(dev, entry) {
            reg.alloc.release(base, needed);
            return Err(e);
        }
        Ok(Registration {
            channel: self.inner.clone(),
            dev,
            entry,
        })
    }

    /// Registers the block device at `path` (e.g. `/dev/ublkb0`).
    pub fn register_path(
        &self,
        path: &Path,
        nr_hw_queues: u16,
        queue_depth: u16,
    ) -> Result<Registration> {
        self.register(dev_t_of_path(path)?, nr_hw_queues, queue_depth)
    }
}

/// One registered device. Dropping it stops the recording and frees its
/// slots.
pub struct Registration {
    channel: Arc<Inner>,
    dev: DevT,
    entry: DevEntry,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("dev", &self.dev)
            .field("entry", &self.entry)
            .finish()
    }
}

impl Registration {
    /// The registered device.
    pub fn dev(&self) -> DevT {
        self.dev
    }

    /// Hardware queues covered.
    pub fn nr_hw_queues(&self) -> u16 {
        self.entry.nr_hw_queues
    }

    /// Tags per queue covered.
    pub fn queue_depth(&self) -> u16 {
        self.entry.queue_depth
    }

    /// A reader for hardware queue `hwq` (panics outside the geometry: a
    /// programming error). Create it right after registering, before the
    /// queue serves requests; one reader per queue thread.
    pub fn queue_reader(&self, hwq: u16) -> QueueReader {
        assert!(
            hwq < self.entry.nr_hw_queues,
            "hwq {hwq} outside the registration"
        );
        QueueReader {
            channel: self.channel.clone(),
            first_slot: self.entry.slot_index(hwq, 0).expect("in range"),
            generation: self.entry.generation,
            last_seq: vec![0; usize::from(self.entry.queue_depth)],
        }
    }

    /// The raw slot of (hwq, tag), for diagnostics (`ioprio-probe`); the
    /// server uses [`QueueReader::take`].
    pub fn peek(&self, hwq: u16, tag: u16) -> Option<layout::SlotValue> {
        let i = self.entry.slot_index(hwq, tag)?;
        let v = layout::SlotValue::decode(self.channel.slots.slot(i).load(Ordering::Acquire));
        (v.generation == self.entry.generation).then_some(v)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = self
            .channel
            .registry
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // If removal fails the entry stays and the range is leaked rather
        // than handed to another device while the program still writes it.
        if reg.devices.remove(self.dev).is_ok() {
            reg.alloc.release(self.entry.base, self.entry.slot_count());
        }
    }
}

/// Reads the priorities of one hardware queue's requests. Not shared
/// between threads: it remembers the last seq seen per tag.
pub struct QueueReader {
    channel: Arc<Inner>,
    first_slot: u32,
    generation: u16,
    last_seq: Vec<u32>,
}

impl std::fmt::Debug for QueueReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueReader")
            .field("first_slot", &self.first_slot)
            .field("generation", &self.generation)
            .field("depth", &self.last_seq.len())
            .finish()
    }
}

impl QueueReader {
    /// The priority of the request that just arrived on `tag`. Call once
    /// per request, when its descriptor is read and before it is committed.
    /// Tags outside the registration read as stale.
    pub fn take(&mut self, tag: u16) -> Observation {
        let Some(last) = self.last_seq.get_mut(usize::from(tag)) else {
            return Obs::Stale;
        };
        let raw = self
            .channel
            .slots
            .slot(self.first_slot + u32::from(tag))
            .load(Ordering::Acquire);
        let (obs, seq) = Obs::from_slot(raw, *last, self.generation);
        *last = seq;
        obs
    }
}

/// The `dev_t` of a block device node, in the kernel's encoding.
pub fn dev_t_of_path(path: &Path) -> Result<DevT> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let err = |detail: String| Error::NoDevT {
        what: path.display().to_string(),
        detail,
    };
    let md = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if !md.file_type().is_block_device() {
        return Err(err("not a block device".into()));
    }
    let rdev = md.rdev();
    Ok(DevT::new(libc::major(rdev), libc::minor(rdev)))
}

/// The `dev_t` of a disk by its kernel name (`ublkb0`), from sysfs; works
/// before udev has created the node.
pub fn dev_t_of_name(name: &str) -> Result<DevT> {
    let p = format!("/sys/block/{name}/dev");
    let err = |detail: String| Error::NoDevT {
        what: name.to_string(),
        detail,
    };
    let s = std::fs::read_to_string(&p).map_err(|e| err(format!("{p}: {e}")))?;
    DevT::parse_sysfs(&s).ok_or_else(|| err(format!("{p}: unexpected {s:?}")))
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set of this process (0 when unreadable).
fn effective_capabilities() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Loading and attaching a tracing program needs CAP_BPF and CAP_PERFMON
/// (kernel 5.8+), or CAP_SYS_ADMIN.
fn check_capabilities(eff: u64) -> Result<(), Unavailable> {
    let has = |c: u32| eff & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let mut missing = Vec::new();
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    Err(Unavailable::NoCapability {
        detail: format!("{} (or CAP_SYS_ADMIN)", missing.join(" and ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_rules() {
        assert!(check_capabilities(1 << CAP_SYS_ADMIN).is_ok());
        assert!(check_capabilities((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_ok());
        let e = check_capabilities(1 << CAP_BPF).unwrap_err();
        assert_eq!(
            e.to_string(),
            "missing capability: CAP_PERFMON (or CAP_SYS_ADMIN)"
        );
        let e = check_capabilities(0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "missing capability: CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)"
        );
    }

    #[test]
    fn fallback_without_btf() {
        let opts = Options {
            btf_path: "/nonexistent/btf/vmlinux".into(),
            ..Options::default()
        };
        let (ch, mode) = PriorityChannel::open_or_fallback(&opts);
        assert!(ch.is_none());
        let expected = if loader::object().is_some() {
            "fallback: no kernel BTF at /nonexistent/btf/vmlinux"
        } else {
            "fallback: BPF program not built (no clang at build time)"
        };
        assert_eq!(mode.to_string(), expected);
    }

    #[test]
    fn fallback_when_unprivileged() {
        let opts = Options {
            simulate_unprivileged: true,
            ..Options::default()
        };
        let (ch, mode) = PriorityChannel::open_or_fallback(&opts);
        assert!(ch.is_none());
        match mode {
            Mode::Fallback(Unavailable::NoCapability { .. })
            | Mode::Fallback(Unavailable::NotBuilt)
            | Mode::Fallback(Unavailable::NoBtf { .. }) => {}
            other => panic!("unexpected mode {other}"),
        }
    }

    #[test]
    fn fallback_on_bad_capacity() {
        let opts = Options {
            slot_capacity: 0,
            ..Options::default()
        };
        assert_eq!(
            PriorityChannel::open(&opts).unwrap_err(),
            Unavailable::BadCapacity(0)
        );
    }

    #[test]
    fn bpf_object_is_built_when_clang_is_there() {
        // CI has clang: a silently missing object would make every VM test
        // meaningless, so say so here.
        if std::process::Command::new(std::env::var("CLANG").unwrap_or("clang".into()))
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
            && std::env::var_os("IOPRIO_CHANNEL_NO_BPF").is_none()
        {
            assert!(loader::object().is_some());
        }
    }

    #[test]
    fn mode_strings() {
        assert_eq!(Mode::Bpf.to_string(), "bpf");
        assert_eq!(
            Mode::Fallback(Unavailable::NotBuilt).to_string(),
            "fallback: BPF program not built (no clang at build time)"
        );
    }
}
