//! The host-local shadow view: every volume served on this host publishes,
//! per target namespace, the running totals its gates' probes read
//! (qos-core `neighbours`, which says why and how they are used).
//!
//! One file per namespace, `RUN_DIR/neighbours/<hash>.v2` (`RUN_DIR` is
//! `/run/ublk-nvmf` or `UBLK_NVMF_RUN_DIR`), where `<hash>` is the FNV-1a
//! of `address:port/subnqn/nsid` with the address as resolved and `v2`
//! the layout (servers of another layout use other files, so an upgrade
//! never reads a file it would misread). Volumes are separate processes
//! (one `ublk-nvmf` per volume, as systemd runs them), so the view is a
//! small shared mapping, not a channel:
//!
//! - A 64-byte header (magic and layout version), then [`SLOTS`] slots
//!   of 64 bytes: owner token, pid, group (the volume), completions,
//!   latency sum. Every field is an atomic `u64`; the file's size is
//!   fixed, and nothing read from it is a length or an index, so a
//!   corrupt file can skew a probe's decision but never our memory.
//! - A gate claims a free slot (owner 0), or one whose pid is gone (a
//!   server killed with `kill -9` never released it), by compare-and-swap
//!   through a "claiming" marker, so a reader never pairs a new token
//!   with old totals. The marker carries the claimer's pid, so a slot
//!   whose claimer died between its two stores is free again too. It
//!   publishes with two relaxed adds per completion and frees the slot
//!   when dropped.
//! - A reader skips its own volume's slots (its queues are one tenant;
//!   their probes must not judge each other), free ones and those being
//!   claimed.
//! - The directory is created 0700 and the files 0600: only root (the
//!   servers) can write them. When the file cannot be opened (a read-only
//!   `/run`), the volume runs without neighbours and says so in the log;
//!   a full file (more than 64 gates on one namespace on one host) leaves
//!   the extra gates unseen.
//!
//! Not covered: a tenant on another host, or a kernel NVMe/TCP host on
//! this one. Only the target sees those (a Gimbal target's credits).

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use qos_core::neighbours::NeighbourTotals;

/// Gates one namespace's file holds.
pub const SLOTS: usize = 64;
const SLOT_WORDS: usize = 8;
const HEADER_WORDS: usize = 8;
const WORDS: usize = HEADER_WORDS + SLOTS * SLOT_WORDS;
/// The file's size.
pub const FILE_BYTES: usize = WORDS * 8;
/// "UBLKNBR" and the layout version 2 (1 had a claiming marker without
/// the claimer's pid).
const MAGIC: u64 = 0x5542_4c4b_4e42_5202;
/// The top bit of an owner word marks a slot being claimed, by the pid
/// in the low bits; a token never has it.
const CLAIMING: u64 = 1 << 63;

/// Word offsets inside a slot.
const OWNER: usize = 0;
const PID: usize = 1;
const GROUP: usize = 2;
const COMPLETIONS: usize = 3;
const LATENCY: usize = 4;

/// One namespace's shared file, mapped.
#[derive(Debug)]
pub struct NamespaceView {
    map: *mut AtomicU64,
    path: PathBuf,
}

// SAFETY: the mapping is only accessed through `AtomicU64`s, which are
// `Sync`, and it lives until `Drop` unmaps it.
unsafe impl Send for NamespaceView {}
// SAFETY: as above.
unsafe impl Sync for NamespaceView {}

/// The file name of a namespace: FNV-1a of its key, in hex.
pub fn file_name(addr: &str, subnqn: &str, nsid: u32) -> String {
    let key = format!("{addr}/{subnqn}/{nsid}");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}.v2")
}

impl NamespaceView {
    /// Opens (creating it if needed) the view of a namespace in `dir`.
    pub fn open(dir: &Path, name: &str) -> std::io::Result<Arc<Self>> {
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)?;
        let len = file.metadata()?.len();
        if len != FILE_BYTES as u64 {
            if len != 0 {
                return Err(std::io::Error::other(format!(
                    "{}: {len} bytes, not the {FILE_BYTES} of this layout",
                    path.display()
                )));
            }
            // Two servers may both extend a new file: same size, zeros.
            file.set_len(FILE_BYTES as u64)?;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a shared read-write mapping of a file of FILE_BYTES
        // bytes (checked or set above); the fd may be closed after.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let view = Arc::new(Self {
            map: map.cast(),
            path,
        });
        let magic = view.word(0);
        match magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(m) if m == MAGIC => {}
            Err(m) => {
                return Err(std::io::Error::other(format!(
                    "{}: magic {m:#x}, not {MAGIC:#x} (another layout)",
                    view.path.display()
                )))
            }
        }
        Ok(view)
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS);
        // SAFETY: in bounds of the mapping (asserted), which is
        // page-aligned and lives as long as `self`; AtomicU64 has the
        // layout of u64.
        unsafe { &*self.map.add(i) }
    }

    fn slot(&self, s: usize, field: usize) -> &AtomicU64 {
        self.word(HEADER_WORDS + s * SLOT_WORDS + field)
    }

    /// Claims a slot for one gate of volume `group`; `None` when all
    /// [`SLOTS`] are held by live processes.
    pub fn claim(self: &Arc<Self>, group: u64) -> Option<NeighbourSlot> {
        let pid = u64::from(std::process::id());
        for s in 0..SLOTS {
            let owner = self.slot(s, OWNER).load(Ordering::Acquire);
            let holder = if owner & CLAIMING != 0 {
                owner & !CLAIMING
            } else {
                self.slot(s, PID).load(Ordering::Relaxed)
            };
            let free = owner == 0 || !alive(holder);
            if !free
                || self
                    .slot(s, OWNER)
                    .compare_exchange(owner, CLAIMING | pid, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            self.slot(s, PID).store(pid, Ordering::Relaxed);
            self.slot(s, GROUP).store(group, Ordering::Relaxed);
            self.slot(s, COMPLETIONS).store(0, Ordering::Relaxed);
            self.slot(s, LATENCY).store(0, Ordering::Relaxed);
            let id = token();
            self.slot(s, OWNER).store(id, Ordering::Release);
            return Some(NeighbourSlot {
                view: Arc::clone(self),
                index: s,
                id,
                group,
            });
        }
        None
    }
}

impl Drop for NamespaceView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe {
            libc::munmap(self.map.cast(), FILE_BYTES);
        }
    }
}

/// Whether process `pid` exists (a claimed slot of a dead one is free).
fn alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH))
}

/// A token no other live slot holds: the pid, the time and a counter,
/// mixed; never 0, and never with the claiming bit.
fn token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = (u64::from(std::process::id()) << 40) ^ t ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser, so nearby inputs give far-apart tokens.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x & !CLAIMING).max(1)
}

/// A volume's token for [`NamespaceView::claim`]: its queues' gates
/// share it, so they do not count each other.
pub fn group_token() -> u64 {
    token()
}

/// One gate's slot in a namespace's view.
#[derive(Debug)]
pub struct NeighbourSlot {
    view: Arc<NamespaceView>,
    index: usize,
    id: u64,
    group: u64,
}

impl NeighbourSlot {
    /// Publishes one completion that took `latency_ns`.
    pub fn publish(&self, latency_ns: u64) {
        let v = &self.view;
        v.slot(self.index, LATENCY)
            .fetch_add(latency_ns, Ordering::Relaxed);
        v.slot(self.index, COMPLETIONS)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Reads the other volumes' slots into `out` (cleared first).
    pub fn read(&self, out: &mut Vec<NeighbourTotals>) {
        out.clear();
        let v = &self.view;
        for s in 0..SLOTS {
            let id = v.slot(s, OWNER).load(Ordering::Acquire);
            if id == 0
                || id & CLAIMING != 0
                || v.slot(s, GROUP).load(Ordering::Relaxed) == self.group
            {
                continue;
            }
            let latency_ns = v.slot(s, LATENCY).load(Ordering::Relaxed);
            let completions = v.slot(s, COMPLETIONS).load(Ordering::Relaxed);
            // A slot freed and claimed again while we read it.
            if v.slot(s, OWNER).load(Ordering::Acquire) != id {
                continue;
            }
            out.push(NeighbourTotals {
                id,
                completions,
                latency_ns,
            });
        }
    }

    /// The slot's token.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for NeighbourSlot {
    fn drop(&mut self) {
        let _ = self.view.slot(self.index, OWNER).compare_exchange(
            self.id,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn volumes_see_each_other_and_not_their_own_queues() {
        let d = dir();
        let name = file_name("127.0.0.1:4420", "nqn.x", 1);
        // Two servers map the same file.
        let (a, b) = (
            NamespaceView::open(d.path(), &name).unwrap(),
            NamespaceView::open(d.path(), &name).unwrap(),
        );
        let (ga, gb) = (group_token(), group_token());
        let (a0, a1, b0) = (
            a.claim(ga).unwrap(),
            a.claim(ga).unwrap(),
            b.claim(gb).unwrap(),
        );
        a0.publish(100);
        a1.publish(300);
        b0.publish(1_000);
        b0.publish(3_000);
        let mut seen = Vec::new();
        a0.read(&mut seen);
        assert_eq!(
            seen,
            [NeighbourTotals {
                id: b0.id(),
                completions: 2,
                latency_ns: 4_000
            }]
        );
        b0.read(&mut seen);
        let mut ids: Vec<_> = seen
            .iter()
            .map(|t| (t.id, t.completions, t.latency_ns))
            .collect();
        ids.sort();
        let mut want = vec![(a0.id(), 1, 100), (a1.id(), 1, 300)];
        want.sort();
        assert_eq!(ids, want);
        // A dropped gate leaves the view, and its slot is reused.
        drop(b0);
        a0.read(&mut seen);
        assert!(seen.is_empty());
        let b1 = b.claim(gb).unwrap();
        b1.publish(7);
        a0.read(&mut seen);
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].completions, seen[0].latency_ns), (1, 7));
    }

    #[test]
    fn a_dead_servers_slots_are_reclaimed_and_a_full_view_says_so() {
        let d = dir();
        let v = NamespaceView::open(d.path(), "ns").unwrap();
        let g = group_token();
        let held: Vec<_> = (0..SLOTS).map(|_| v.claim(g).unwrap()).collect();
        assert!(v.claim(g).is_none(), "all {SLOTS} slots are held");
        // A server killed with -9 leaves its slots claimed by a pid that
        // no longer exists.
        let gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        let mut gone = gone;
        gone.wait().unwrap();
        v.slot(5, PID).store(u64::from(pid), Ordering::Relaxed);
        let again = v.claim(g).expect("the dead pid's slot");
        assert_eq!(again.index, 5);
        assert!(v.claim(g).is_none());
        // A claimer that died between its compare-and-swap and its
        // token's store leaves the claiming marker with its pid: free.
        v.slot(9, OWNER)
            .store(CLAIMING | u64::from(pid), Ordering::Release);
        let third = v.claim(g).expect("the dead claimer's slot");
        assert_eq!(third.index, 9);
        // One being claimed by a live process is not taken.
        v.slot(9, OWNER)
            .store(CLAIMING | u64::from(std::process::id()), Ordering::Release);
        drop(third);
        assert!(v.claim(g).is_none(), "a live claimer keeps its slot");
        drop(held);
    }

    #[test]
    fn a_slot_being_claimed_is_not_read() {
        let d = dir();
        let v = NamespaceView::open(d.path(), "ns").unwrap();
        let me = v.claim(group_token()).unwrap();
        let other = group_token();
        v.slot(1, GROUP).store(other, Ordering::Relaxed);
        v.slot(1, OWNER)
            .store(CLAIMING | u64::from(std::process::id()), Ordering::Release);
        let mut seen = Vec::new();
        me.read(&mut seen);
        assert!(seen.is_empty(), "{seen:?}");
        v.slot(1, OWNER).store(42, Ordering::Release);
        me.read(&mut seen);
        assert_eq!(seen.len(), 1, "the same slot once claimed");
    }

    #[test]
    fn a_file_of_another_size_or_layout_is_refused_with_its_name() {
        let d = dir();
        std::fs::write(d.path().join("short"), [1u8; 100]).unwrap();
        let e = NamespaceView::open(d.path(), "short")
            .unwrap_err()
            .to_string();
        assert!(e.contains("short") && e.contains("100 bytes"), "{e}");
        std::fs::write(d.path().join("other"), vec![0xffu8; FILE_BYTES]).unwrap();
        let e = NamespaceView::open(d.path(), "other")
            .unwrap_err()
            .to_string();
        assert!(e.contains("other") && e.contains("another layout"), "{e}");
    }

    #[test]
    fn file_names_differ_by_every_part_of_the_key() {
        let n = file_name("127.0.0.1:4420", "nqn.a", 1);
        assert_eq!(n.len(), 19);
        assert!(n.ends_with(".v2"), "{n}");
        for other in [
            file_name("127.0.0.1:4421", "nqn.a", 1),
            file_name("127.0.0.1:4420", "nqn.b", 1),
            file_name("127.0.0.1:4420", "nqn.a", 2),
        ] {
            assert_ne!(n, other);
        }
    }
}
