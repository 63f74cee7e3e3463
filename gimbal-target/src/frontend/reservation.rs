//! Reservations of one namespace (NVMe Base Specification 2.x,
//! "Reservations"), shared by every controller of the subsystem.
//!
//! [`ReservationState`] is the pure part: registrants keyed by host
//! identifier (the 128-bit HOSTID of the Fabrics Connect; a host with
//! several controllers is one registrant), the reservation and its type,
//! the generation, PTPL, and every command as a function of (state,
//! requesting host, command) returning a status and the effects
//! (notifications, hosts whose commands must be aborted, whether to
//! persist). [`NamespaceReservations`] wraps it for the connections: one
//! lock, a lock-free fast path for I/O when no reservation is held, the
//! per-controller in-flight counters preempt-and-abort drains, and the
//! sidecar file that keeps the state across a restart when PTPL is set.
//!
//! Semantics follow Linux nvmet (`drivers/nvme/target/pr.c`, 6.13) where
//! it and the specification agree, and the specification where nvmet
//! simplifies; each difference is named where it is decided:
//!
//! - Command access: Read is the read group; Write, Write Zeroes, Dataset
//!   Management and Flush are the write group (nvmet puts Flush there);
//!   the reservation commands are judged by their own rules. A host
//!   holding the reservation, or (Registrants Only / All Registrants) any
//!   registrant, passes; Write Exclusive refuses others' writes, Exclusive
//!   Access everything of others. Refusals are Reservation Conflict (DNR).
//! - All Registrants types: every registrant is a holder (reported with
//!   RCSTS bit 0, as nvmet), the reservation lasts while any registrant
//!   does, and any of them may release it (nvmet lets only its nominal
//!   holder; the specification any holder).
//! - Preempt compares PRKEY with the holder's key first (the
//!   specification's order): a holder preempting with another registrant's
//!   key unregisters that registrant and keeps its reservation (nvmet
//!   treats any preempt by the holder as a type change).
//! - Release with a type other than the reservation's is Invalid Field in
//!   Command, as the specification says (nvmet: Reservation Conflict).
//! - Register with a key already registered for the host succeeds (the
//!   same key) or conflicts; NRKEY/CRKEY are not otherwise restricted.
//!   Every successful Register, every successful preempt and every Clear
//!   increments the generation; plain Acquire and Release do not.
//! - Reservation Report requires the extended structure (EDS): host
//!   identifiers are 128-bit, so EDS = 0 is Host Identifier Inconsistent
//!   Format, as nvmet and the specification say; registrants are reported
//!   with CNTLID FFFFh (a host, not one of its controllers).
//! - Limits: at most [`MAX_REGISTRANTS`] registrants per namespace; one
//!   more is refused with Capacity Exceeded (the specification names no
//!   status for it; this is the NVM command set's "out of a resource").
//!
//! Preempt and Abort: nvmet does not abort commands; it waits until every
//! command the preempted hosts' controllers had on the namespace has
//! completed, refusing their new ones meanwhile, before the Acquire
//! completes. We do the same: when the Acquire completes, no command of a
//! preempted host that was admitted before it can still reach the backend,
//! and none admitted after it can (they see the new state). "Admitted" is
//! the reservation check made right before a command enters the
//! namespace's pipeline; the check counts the command in its controller's
//! in-flight counter for the namespace *before* it reads the state, so a
//! preempt that changed the state either is seen by the check or sees the
//! count (see [`NsInflight`]). While the drain runs, the preempted hosts'
//! new commands to the namespace fail with Command Aborted due to Preempt
//! and Abort (DNR). A drain can last as long as a backend takes to finish
//! what it was given, or until the preempted controller is torn down
//! (keep-alive) for commands still waiting for their data: those are not
//! admitted yet and are checked again when their data arrives.
//!
//! Plain Preempt waits for nothing (the specification's semantics): a
//! command admitted just before it may still land after it completes.
//! Fencing an old owner therefore uses Preempt and Abort.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use nvmf_proto::reservation::{
    acquire_action, cptpl, notification_type, register_action, release_action,
    RegisteredController, ReservationAcquire, ReservationNotification, ReservationRegister,
    ReservationRelease, ReservationStatus, ReservationType,
};
use nvmf_proto::Status;

/// A host identifier (Connect HOSTID).
pub type HostId = [u8; 16];

/// Most registrants one namespace keeps (hosts of a cluster sharing a
/// volume; each registers once per namespace). Register beyond it is
/// refused with Capacity Exceeded.
pub const MAX_REGISTRANTS: usize = 64;

/// Reservation notifications a controller keeps until the host reads them
/// (the log page returns one per read); older ones are kept and newer ones
/// dropped when it is full, the jump in Log Page Count telling the host.
pub const MAX_NOTIFICATIONS: usize = 64;

/// What a command asks of the namespace, for the conflict check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The read command group (Read).
    Read,
    /// The write command group (Write, Write Zeroes, Dataset Management,
    /// Flush).
    Write,
}

/// One registrant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// Its host.
    pub host: HostId,
    /// Its reservation key.
    pub key: u64,
}

/// The reservation held on the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Its type.
    pub rtype: ReservationType,
    /// The host that acquired it (for All Registrants types every
    /// registrant holds it; this one is only who acquired it).
    pub holder: HostId,
}

/// The reservation state of one namespace: pure, no I/O.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReservationState {
    /// Registrants in registration order (at most [`MAX_REGISTRANTS`]).
    pub registrants: Vec<Registrant>,
    /// The reservation, if one is held.
    pub held: Option<Held>,
    /// PRGEN.
    pub generation: u32,
    /// Persist Through Power Loss.
    pub ptpl: bool,
}

/// What a reservation command did besides its status.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Notifications to log: (host, notification type).
    pub notify: Vec<(HostId, u8)>,
    /// Hosts whose commands to the namespace must be drained before the
    /// command completes (Preempt and Abort).
    pub abort: Vec<HostId>,
    /// The state changed (persist it when PTPL is set).
    pub changed: bool,
    /// PTPL changed to this (persist or forget the sidecar).
    pub ptpl_changed: Option<bool>,
}

const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr();
const INVALID: Status = Status::INVALID_FIELD.with_dnr();

impl ReservationState {
    fn find(&self, host: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| &r.host == host)
    }

    /// Whether `host` is a registrant.
    pub fn is_registered(&self, host: &HostId) -> bool {
        self.find(host).is_some()
    }

    /// Whether `host` holds the reservation.
    pub fn holds(&self, host: &HostId) -> bool {
        match self.held {
            Some(h) if h.rtype.all_registrants() => self.is_registered(host),
            Some(h) => &h.holder == host,
            None => false,
        }
    }

    /// The conflict check of the specification's "Command Behavior in the
    /// Presence of a Reservation" table for one I/O command.
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), Status> {
        let Some(held) = self.held else {
            return Ok(());
        };
        if self.holds(host) {
            return Ok(());
        }
        let refused = match access {
            Access::Write => true,
            Access::Read => held.rtype.excludes_reads(),
        };
        if !refused || (held.rtype.registrants_have_access() && self.is_registered(host)) {
            Ok(())
        } else {
            Err(CONFLICT)
        }
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Removes registrant `i`; the reservation goes with its holder (not
    /// for All Registrants types while others remain). Notifies the other
    /// registrants of a release of a Registrants Only type (as nvmet).
    fn unregister_at(&mut self, i: usize, fx: &mut Effects) {
        let gone = self.registrants.remove(i);
        let Some(held) = self.held else {
            return;
        };
        if held.rtype.all_registrants() {
            if self.registrants.is_empty() {
                self.held = None;
            } else if held.holder == gone.host {
                self.held = Some(Held {
                    holder: self.registrants[0].host,
                    ..held
                });
            }
        } else if held.holder == gone.host {
            self.held = None;
            if held.rtype.registrants_have_access() {
                self.notify_others(&gone.host, notification_type::RESERVATION_RELEASED, fx);
            }
        }
    }

    fn notify_others(&self, except: &HostId, log_type: u8, fx: &mut Effects) {
        fx.notify.extend(
            self.registrants
                .iter()
                .filter(|r| &r.host != except)
                .map(|r| (r.host, log_type)),
        );
    }

    /// Reservation Register. `ptpl_supported`: whether CPTPL may set PTPL.
    pub fn register(
        &mut self,
        host: &HostId,
        cmd: &ReservationRegister,
        ptpl_supported: bool,
    ) -> (Status, Effects) {
        let mut fx = Effects::default();
        let new_ptpl = match cmd.cptpl {
            cptpl::NO_CHANGE => None,
            cptpl::CLEAR => Some(false),
            cptpl::SET if ptpl_supported => Some(true),
            _ => return (INVALID, fx),
        };
        let found = self.find(host);
        let key_ok = |i: usize| cmd.iekey || self.registrants[i].key == cmd.crkey;
        let status = match (cmd.action, found) {
            (register_action::REGISTER, Some(i)) if self.registrants[i].key == cmd.nrkey => {
                Status::SUCCESS
            }
            (register_action::REGISTER, Some(_)) => CONFLICT,
            (register_action::REGISTER, None) if self.registrants.len() >= MAX_REGISTRANTS => {
                Status::CAPACITY_EXCEEDED.with_dnr()
            }
            (register_action::REGISTER, None) => {
                self.registrants.push(Registrant {
                    host: *host,
                    key: cmd.nrkey,
                });
                Status::SUCCESS
            }
            (register_action::UNREGISTER, Some(i)) if key_ok(i) => {
                self.unregister_at(i, &mut fx);
                Status::SUCCESS
            }
            (register_action::REPLACE, Some(i)) if key_ok(i) => {
                self.registrants[i].key = cmd.nrkey;
                Status::SUCCESS
            }
            (register_action::UNREGISTER | register_action::REPLACE, _) => CONFLICT,
            _ => INVALID,
        };
        if status.is_success() {
            self.bump();
            fx.changed = true;
            if let Some(p) = new_ptpl.filter(|&p| p != self.ptpl) {
                self.ptpl = p;
                fx.ptpl_changed = Some(p);
            }
        }
        (status, fx)
    }

    /// Reservation Acquire (acquire, preempt, preempt and abort).
    pub fn acquire(&mut self, host: &HostId, cmd: &ReservationAcquire) -> (Status, Effects) {
        let mut fx = Effects::default();
        // NVMe 1.3 and later: IEKEY is not for Acquire (RESCAP bit 7).
        if cmd.iekey {
            return (INVALID, fx);
        }
        let Some(rtype) = ReservationType::from_u8(cmd.rtype) else {
            return (INVALID, fx);
        };
        if !matches!(
            cmd.action,
            acquire_action::ACQUIRE | acquire_action::PREEMPT | acquire_action::PREEMPT_AND_ABORT
        ) {
            return (INVALID, fx);
        }
        match self.find(host) {
            Some(i) if self.registrants[i].key == cmd.crkey => {}
            _ => return (CONFLICT, fx),
        }
        if cmd.action == acquire_action::ACQUIRE {
            let status = match self.held {
                None => {
                    self.held = Some(Held {
                        rtype,
                        holder: *host,
                    });
                    fx.changed = true;
                    Status::SUCCESS
                }
                Some(h) if self.holds(host) && h.rtype == rtype => Status::SUCCESS,
                Some(_) => CONFLICT,
            };
            return (status, fx);
        }
        let abort = cmd.action == acquire_action::PREEMPT_AND_ABORT;
        let status = self.preempt(host, rtype, cmd.prkey, abort, &mut fx);
        if status.is_success() {
            self.bump();
            fx.changed = true;
        }
        (status, fx)
    }

    fn preempt(
        &mut self,
        host: &HostId,
        rtype: ReservationType,
        prkey: u64,
        abort: bool,
        fx: &mut Effects,
    ) -> Status {
        let Some(held) = self.held else {
            // No reservation: preempt unregisters the registrants holding
            // PRKEY (none: conflict).
            return self.unregister_by_key(host, prkey, abort, true, fx);
        };
        if held.rtype.all_registrants() {
            if prkey == 0 {
                // Take the reservation first, so no other host is ever
                // left holding access, then drop every other registrant.
                self.held = Some(Held {
                    rtype,
                    holder: *host,
                });
                let others: Vec<HostId> = self
                    .registrants
                    .iter()
                    .map(|r| r.host)
                    .filter(|h| h != host)
                    .collect();
                for h in others {
                    self.drop_preempted(&h, abort, fx);
                }
                return Status::SUCCESS;
            }
            return self.unregister_by_key(host, prkey, abort, true, fx);
        }
        let holder_key = self.find(&held.holder).map(|i| self.registrants[i].key);
        if holder_key == Some(prkey) {
            // The holder's key: the reservation moves to the requester
            // (the holder preempting itself changes the type), and the
            // other registrants holding that key are preempted.
            self.held = Some(Held {
                rtype,
                holder: *host,
            });
            let victims: Vec<HostId> = self
                .registrants
                .iter()
                .filter(|r| r.key == prkey && &r.host != host)
                .map(|r| r.host)
                .collect();
            for h in victims {
                self.drop_preempted(&h, abort, fx);
            }
            if held.rtype != rtype {
                self.notify_others(host, notification_type::RESERVATION_RELEASED, fx);
            }
            return Status::SUCCESS;
        }
        if prkey == 0 {
            return INVALID;
        }
        self.unregister_by_key(host, prkey, abort, false, fx)
    }

    /// Unregisters every registrant holding `prkey` (the requester too,
    /// when `include_self`, as nvmet); conflict when there is none.
    fn unregister_by_key(
        &mut self,
        host: &HostId,
        prkey: u64,
        abort: bool,
        include_self: bool,
        fx: &mut Effects,
    ) -> Status {
        let victims: Vec<HostId> = self
            .registrants
            .iter()
            .filter(|r| r.key == prkey && (include_self || &r.host != host))
            .map(|r| r.host)
            .collect();
        if victims.is_empty() {
            return CONFLICT;
        }
        for h in victims {
            if &h == host {
                if let Some(i) = self.find(&h) {
                    self.unregister_at(i, fx);
                }
            } else {
                self.drop_preempted(&h, abort, fx);
            }
        }
        Status::SUCCESS
    }

    fn drop_preempted(&mut self, victim: &HostId, abort: bool, fx: &mut Effects) {
        if let Some(i) = self.find(victim) {
            self.unregister_at(i, fx);
            fx.notify
                .push((*victim, notification_type::REGISTRATION_PREEMPTED));
            if abort {
                fx.abort.push(*victim);
            }
        }
    }

    /// Reservation Release (release, clear).
    pub fn release(&mut self, host: &HostId, cmd: &ReservationRelease) -> (Status, Effects) {
        let mut fx = Effects::default();
        if cmd.iekey {
            return (INVALID, fx);
        }
        match self.find(host) {
            Some(i) if self.registrants[i].key == cmd.crkey => {}
            _ => return (CONFLICT, fx),
        }
        match cmd.action {
            release_action::RELEASE => {
                let Some(held) = self.held.filter(|_| self.holds(host)) else {
                    // Not a holder: nothing to release, success (spec).
                    return (Status::SUCCESS, fx);
                };
                if held.rtype.to_u8() != cmd.rtype {
                    return (INVALID, fx);
                }
                self.held = None;
                fx.changed = true;
                if held.rtype.registrants_have_access() {
                    self.notify_others(host, notification_type::RESERVATION_RELEASED, &mut fx);
                }
                (Status::SUCCESS, fx)
            }
            release_action::CLEAR => {
                self.held = None;
                self.notify_others(host, notification_type::RESERVATION_PREEMPTED, &mut fx);
                self.registrants.clear();
                self.bump();
                fx.changed = true;
                (Status::SUCCESS, fx)
            }
            _ => (INVALID, fx),
        }
    }

    /// The Reservation Status data structure (extended layout: CNTLID
    /// FFFFh, 128-bit host identifiers).
    pub fn report(&self) -> ReservationStatus {
        ReservationStatus {
            generation: self.generation,
            rtype: self.held.map_or(0, |h| h.rtype.to_u8()),
            regctl: self.registrants.len() as u16,
            ptpls: self.ptpl,
            registrants: self
                .registrants
                .iter()
                .map(|r| RegisteredController {
                    cntlid: nvmf_proto::fabrics::CNTLID_DYNAMIC,
                    holds: self.holds(&r.host),
                    host_id: r.host,
                    rkey: r.key,
                })
                .collect(),
        }
    }
}

/// Commands of one controller on one namespace that passed the
/// reservation check and have not completed; what Preempt and Abort
/// drains.
///
/// Ordering: a command increments `count` and then reads `aborting` and
/// the reservation state; a preempt changes the state (under the lock),
/// sets `aborting` and then reads `count`, all sequentially consistent.
/// So either the command sees the preempt (and is refused) or the preempt
/// sees the command (and waits for it).
#[derive(Debug, Default)]
pub struct NsInflight {
    count: AtomicUsize,
    aborting: AtomicBool,
    drained: tokio::sync::Notify,
}

impl NsInflight {
    /// A command admitted by [`NamespaceReservations::admit`] completed.
    pub fn done(&self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 && self.aborting.load(Ordering::SeqCst) {
            self.drained.notify_waiters();
        }
    }

    /// Waits until every admitted command has completed, then lets the
    /// controller's commands in again.
    pub async fn drain(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count.load(Ordering::SeqCst) == 0 {
                break;
            }
            notified.await;
        }
        self.aborting.store(false, Ordering::SeqCst);
    }

    /// Commands admitted and not completed.
    pub fn in_flight(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

/// Where a namespace keeps its reservation state across restarts (PTPL):
/// a sidecar file, written whole to `PATH.tmp`, fsynced, renamed over
/// `PATH` and the directory fsynced, before the command that changed the
/// state completes. Layout (text, one item per line, so an operator can
/// read it):
///
/// ```text
/// gimbal-reservations 1
/// generation <u32>
/// reservation <type 1..6> <holder host id, 32 hex digits>   (or: reservation none)
/// registrant <host id, 32 hex digits> <key, 16 hex digits>  (0..=64 lines)
/// end
/// ```
///
/// PTPL is set by the file's existence: clearing PTPL removes it. A file
/// that does not parse stops the target from starting (naming the file):
/// serving without the reservations it records would unfence a fenced
/// host.
#[derive(Debug, Clone)]
pub struct Sidecar {
    path: PathBuf,
}

impl Sidecar {
    /// A sidecar at `path`.
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The state recorded, `None` when there is no file (PTPL off).
    pub fn load(&self) -> anyhow::Result<Option<ReservationState>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", self.path.display())),
        };
        parse_sidecar(&text)
            .map(Some)
            .map_err(|why| anyhow::anyhow!("{}: {why}", self.path.display()))
    }

    /// Records `state` durably.
    pub fn store(&self, state: &ReservationState) -> std::io::Result<()> {
        use std::io::Write;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(format_sidecar(state).as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        self.sync_dir()
    }

    /// Forgets the state (PTPL cleared).
    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => self.sync_dir(),
        }
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex16(s: &str) -> Option<HostId> {
    if s.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn format_sidecar(s: &ReservationState) -> String {
    let mut t = format!("gimbal-reservations 1\ngeneration {}\n", s.generation);
    match s.held {
        Some(h) => t.push_str(&format!(
            "reservation {} {}\n",
            h.rtype.to_u8(),
            hex(&h.holder)
        )),
        None => t.push_str("reservation none\n"),
    }
    for r in &s.registrants {
        t.push_str(&format!("registrant {} {:016x}\n", hex(&r.host), r.key));
    }
    t.push_str("end\n");
    t
}

fn parse_sidecar(text: &str) -> Result<ReservationState, String> {
    let mut lines = text.lines();
    if lines.next() != Some("gimbal-reservations 1") {
        return Err("not a reservation file of version 1".into());
    }
    let mut s = ReservationState {
        ptpl: true,
        ..Default::default()
    };
    let mut ended = false;
    for (n, line) in lines.enumerate() {
        let bad = || format!("line {}: cannot read {line:?}", n + 2);
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["generation", g] => s.generation = g.parse().map_err(|_| bad())?,
            ["reservation", "none"] => s.held = None,
            ["reservation", t, h] => {
                s.held = Some(Held {
                    rtype: t
                        .parse()
                        .ok()
                        .and_then(ReservationType::from_u8)
                        .ok_or_else(bad)?,
                    holder: unhex16(h).ok_or_else(bad)?,
                })
            }
            ["registrant", h, k] => {
                if s.registrants.len() >= MAX_REGISTRANTS {
                    return Err(format!("more than {MAX_REGISTRANTS} registrants"));
                }
                s.registrants.push(Registrant {
                    host: unhex16(h).ok_or_else(bad)?,
                    key: u64::from_str_radix(k, 16).map_err(|_| bad())?,
                });
            }
            ["end"] => {
                ended = true;
                break;
            }
            _ => return Err(bad()),
        }
    }
    if !ended {
        return Err("truncated (no end line)".into());
    }
    Ok(s)
}

/// One namespace's reservations as the connections use them.
#[derive(Debug)]
pub struct NamespaceReservations {
    nsid: u32,
    state: Mutex<ReservationState>,
    /// No reservation is held: every command is allowed without the lock.
    open: AtomicBool,
    /// Where the state persists (PTPL supported), if anywhere.
    sidecar: Option<Sidecar>,
    /// Serializes sidecar writes in state order (never held with `state`
    /// while waiting for the disk... `state` is taken inside it briefly).
    persist: Mutex<u64>,
    /// Bumped with every change, so a write of an older snapshot after a
    /// newer one is skipped.
    version: AtomicUsize,
}

/// The outcome of a reservation command, for the connection to finish:
/// persist (when `persist` is set), drain `abort`, log `notify`, then
/// complete with `status`.
#[derive(Debug)]
pub struct Outcome {
    /// Completion status.
    pub status: Status,
    /// The effects.
    pub effects: Effects,
    /// The state to write to the sidecar (version, snapshot; `None` for
    /// the snapshot: remove the file), when the change must be durable
    /// before the completion.
    pub persist: Option<(usize, Option<ReservationState>)>,
}

impl NamespaceReservations {
    /// Reservations of namespace `nsid`; with a sidecar, the state it
    /// records (if any) is loaded.
    pub fn new(nsid: u32, sidecar: Option<Sidecar>) -> anyhow::Result<Self> {
        let state = match &sidecar {
            Some(s) => s.load()?.unwrap_or_default(),
            None => ReservationState::default(),
        };
        Ok(Self {
            nsid,
            open: AtomicBool::new(state.held.is_none()),
            state: Mutex::new(state),
            sidecar,
            persist: Mutex::new(0),
            version: AtomicUsize::new(0),
        })
    }

    /// Whether PTPL can be set (the state has somewhere to persist).
    pub fn ptpl_supported(&self) -> bool {
        self.sidecar.is_some()
    }

    /// The namespace.
    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    fn lock(&self) -> MutexGuard<'_, ReservationState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the state.
    pub fn snapshot(&self) -> ReservationState {
        self.lock().clone()
    }

    /// Checks a command without admitting it (before soliciting a write's
    /// data, so a conflicting write moves no data).
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), Status> {
        if self.open.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.lock().check(host, access)
    }

    /// Admits a command about to enter the pipeline: counts it in
    /// `inflight` (the caller calls [`NsInflight::done`] when it
    /// completes) or refuses it. See [`NsInflight`] for the ordering.
    pub fn admit(
        &self,
        inflight: &NsInflight,
        host: &HostId,
        access: Access,
    ) -> Result<(), Status> {
        // A command the current state refuses is refused without being
        // counted, so a finished drain never sees it pass by.
        self.verdict(inflight, host, access)?;
        inflight.count.fetch_add(1, Ordering::SeqCst);
        // Again after counting: a preempt that changed the state since
        // is seen here, or sees the count (see `NsInflight`).
        let verdict = self.verdict(inflight, host, access);
        if verdict.is_err() {
            inflight.done();
        }
        verdict
    }

    fn verdict(&self, inflight: &NsInflight, host: &HostId, access: Access) -> Result<(), Status> {
        if inflight.aborting.load(Ordering::SeqCst) {
            Err(Status::ABORTED_PREEMPT.with_dnr())
        } else if self.open.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.lock().check(host, access)
        }
    }

    /// Marks `inflight` as being drained: its new commands are refused.
    pub fn start_abort(inflight: &NsInflight) {
        inflight.aborting.store(true, Ordering::SeqCst);
    }

    fn finish(&self, st: &mut ReservationState, status: Status, effects: Effects) -> Outcome {
        self.open.store(st.held.is_none(), Ordering::SeqCst);
        let persist =
            if self.sidecar.is_some() && (effects.changed || effects.ptpl_changed.is_some()) {
                let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
                if st.ptpl {
                    Some((v, Some(st.clone())))
                } else if effects.ptpl_changed == Some(false) {
                    Some((v, None))
                } else {
                    None
                }
            } else {
                None
            };
        Outcome {
            status,
            effects,
            persist,
        }
    }

    /// Reservation Register by `host`.
    pub fn register(&self, host: &HostId, cmd: &ReservationRegister) -> Outcome {
        let mut st = self.lock();
        let (status, fx) = st.register(host, cmd, self.ptpl_supported());
        self.finish(&mut st, status, fx)
    }

    /// Reservation Acquire by `host`. The preempted hosts to drain are in
    /// the outcome's effects; the caller marks their controllers with
    /// [`Self::start_abort`] before it releases nothing else: the state
    /// already refuses their conflicting commands.
    pub fn acquire(&self, host: &HostId, cmd: &ReservationAcquire) -> Outcome {
        let mut st = self.lock();
        let (status, fx) = st.acquire(host, cmd);
        self.finish(&mut st, status, fx)
    }

    /// Reservation Release by `host`.
    pub fn release(&self, host: &HostId, cmd: &ReservationRelease) -> Outcome {
        let mut st = self.lock();
        let (status, fx) = st.release(host, cmd);
        self.finish(&mut st, status, fx)
    }

    /// Set Features Reservation Persistence.
    pub fn set_ptpl(&self, ptpl: bool) -> Result<Outcome, Status> {
        if ptpl && !self.ptpl_supported() {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        let mut st = self.lock();
        let mut fx = Effects::default();
        if st.ptpl != ptpl {
            st.ptpl = ptpl;
            fx.ptpl_changed = Some(ptpl);
        }
        Ok(self.finish(&mut st, Status::SUCCESS, fx))
    }

    /// Writes an outcome's snapshot to the sidecar (blocking: call from a
    /// thread that may wait for the disk), unless a newer one was written.
    pub fn persist(
        &self,
        version: usize,
        snapshot: Option<&ReservationState>,
    ) -> std::io::Result<()> {
        let Some(sidecar) = &self.sidecar else {
            return Ok(());
        };
        let mut written = self.persist.lock().unwrap_or_else(|e| e.into_inner());
        if (*written as usize) >= version {
            return Ok(());
        }
        match snapshot {
            Some(s) => sidecar.store(s)?,
            None => sidecar.remove()?,
        }
        *written = version as u64;
        Ok(())
    }
}

/// A controller's reservation notifications (log page 80h), oldest first.
#[derive(Debug, Default)]
pub struct NotificationLog {
    queue: VecDeque<ReservationNotification>,
    counter: u64,
}

impl NotificationLog {
    /// Logs a notification of `log_type` for `nsid`. Every notification
    /// takes the next count, also one dropped because the log is full, so
    /// the host sees the gap.
    pub fn push(&mut self, log_type: u8, nsid: u32) {
        self.counter = self.counter.wrapping_add(1).max(1);
        if self.queue.len() < MAX_NOTIFICATIONS {
            self.queue.push_back(ReservationNotification {
                count: self.counter,
                log_type,
                available: 0,
                nsid,
            });
        }
    }

    /// The next page: the oldest notification (taken off the log), with
    /// how many more wait; an empty page when there is none.
    pub fn take(&mut self) -> ReservationNotification {
        match self.queue.pop_front() {
            Some(mut n) => {
                n.available = self.queue.len().min(255) as u8;
                n
            }
            None => ReservationNotification::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_proto::reservation::ReservationType as T;

    const A: HostId = [0xA; 16];
    const B: HostId = [0xB; 16];
    const C: HostId = [0xC; 16];

    fn reg(st: &mut ReservationState, h: &HostId, key: u64) -> Status {
        st.register(h, &ReservationRegister::register(1, key), true)
            .0
    }

    #[test]
    fn every_type_grants_the_access_the_table_says() {
        // (holder, registrant, other) x (read, write): allowed?
        let table: [(T, [bool; 6]); 6] = [
            (T::WriteExclusive, [true, true, true, false, true, false]),
            (T::ExclusiveAccess, [true, true, false, false, false, false]),
            (
                T::WriteExclusiveRegistrantsOnly,
                [true, true, true, true, true, false],
            ),
            (
                T::ExclusiveAccessRegistrantsOnly,
                [true, true, true, true, false, false],
            ),
            (
                T::WriteExclusiveAllRegistrants,
                [true, true, true, true, true, false],
            ),
            (
                T::ExclusiveAccessAllRegistrants,
                [true, true, true, true, false, false],
            ),
        ];
        for (t, expect) in table {
            let mut st = ReservationState::default();
            reg(&mut st, &A, 1);
            reg(&mut st, &B, 2);
            let (s, _) = st.acquire(&A, &ReservationAcquire::acquire(1, t, 1));
            assert!(s.is_success(), "{t:?}");
            let mut got = [false; 6];
            for (i, h) in [A, B, C].iter().enumerate() {
                got[2 * i] = st.check(h, Access::Read).is_ok();
                got[2 * i + 1] = st.check(h, Access::Write).is_ok();
            }
            assert_eq!(got, expect, "{t:?}");
        }
    }

    #[test]
    fn register_unregister_replace_and_iekey() {
        let mut st = ReservationState::default();
        assert!(reg(&mut st, &A, 5).is_success());
        assert!(reg(&mut st, &A, 5).is_success(), "same key again");
        assert!(reg(&mut st, &A, 6).same_code(Status::RESERVATION_CONFLICT));
        assert_eq!(st.generation, 2);
        let (s, _) = st.register(&A, &ReservationRegister::replace(1, 9, 7), true);
        assert!(s.same_code(Status::RESERVATION_CONFLICT), "wrong CRKEY");
        let mut r = ReservationRegister::replace(1, 9, 7);
        r.iekey = true;
        assert!(st.register(&A, &r, true).0.is_success());
        assert_eq!(st.registrants[0].key, 7);
        let (s, _) = st.register(&B, &ReservationRegister::unregister(1, 7), true);
        assert!(s.same_code(Status::RESERVATION_CONFLICT), "not registered");
        assert!(st
            .register(&A, &ReservationRegister::unregister(1, 7), true)
            .0
            .is_success());
        assert!(st.registrants.is_empty());
        assert_eq!(st.generation, 4);
        let mut bad = ReservationRegister::register(1, 1);
        bad.action = 5;
        assert!(st
            .register(&A, &bad, true)
            .0
            .same_code(Status::INVALID_FIELD));
    }

    #[test]
    fn the_registrant_limit_is_capacity_exceeded() {
        let mut st = ReservationState::default();
        for i in 0..MAX_REGISTRANTS {
            let mut h = [0u8; 16];
            h[..8].copy_from_slice(&(i as u64).to_le_bytes());
            assert!(reg(&mut st, &h, 1).is_success());
        }
        assert!(reg(&mut st, &[0xFF; 16], 1).same_code(Status::CAPACITY_EXCEEDED));
        assert_eq!(st.registrants.len(), MAX_REGISTRANTS);
    }

    #[test]
    fn acquire_rules() {
        let mut st = ReservationState::default();
        let ea = ReservationAcquire::acquire(1, T::ExclusiveAccess, 1);
        assert!(
            st.acquire(&A, &ea)
                .0
                .same_code(Status::RESERVATION_CONFLICT),
            "unregistered"
        );
        reg(&mut st, &A, 1);
        reg(&mut st, &B, 2);
        let mut wrong = ea;
        wrong.crkey = 9;
        assert!(st
            .acquire(&A, &wrong)
            .0
            .same_code(Status::RESERVATION_CONFLICT));
        assert!(st.acquire(&A, &ea).0.is_success());
        assert!(st.acquire(&A, &ea).0.is_success(), "again, same type");
        let we = ReservationAcquire::acquire(1, T::WriteExclusive, 1);
        assert!(
            st.acquire(&A, &we)
                .0
                .same_code(Status::RESERVATION_CONFLICT),
            "other type"
        );
        let b = ReservationAcquire::acquire(1, T::ExclusiveAccess, 2);
        assert!(st.acquire(&B, &b).0.same_code(Status::RESERVATION_CONFLICT));
        let mut bad = ea;
        bad.rtype = 7;
        assert!(st.acquire(&A, &bad).0.same_code(Status::INVALID_FIELD));
        bad = ea;
        bad.iekey = true;
        assert!(st.acquire(&A, &bad).0.same_code(Status::INVALID_FIELD));
        assert_eq!(st.generation, 2, "acquire does not bump the generation");
    }

    #[test]
    fn preempt_takes_over_and_unregisters_the_old_holder() {
        let mut st = ReservationState::default();
        reg(&mut st, &A, 1);
        reg(&mut st, &B, 2);
        st.acquire(&A, &ReservationAcquire::acquire(1, T::WriteExclusive, 1));
        let gen = st.generation;
        let p = ReservationAcquire::preempt(1, T::WriteExclusive, 2, 1, true);
        let (s, fx) = st.acquire(&B, &p);
        assert!(s.is_success());
        assert!(st.holds(&B) && !st.is_registered(&A));
        assert_eq!(fx.abort, vec![A]);
        assert_eq!(
            fx.notify,
            vec![(A, notification_type::REGISTRATION_PREEMPTED)]
        );
        assert_eq!(st.generation, gen + 1);
        assert!(st.check(&A, Access::Write).is_err());
        assert!(st.check(&A, Access::Read).is_ok());
        // PRKEY 0 with a holder of another key is Invalid Field.
        reg(&mut st, &C, 3);
        let p0 = ReservationAcquire::preempt(1, T::WriteExclusive, 3, 0, false);
        assert!(st.acquire(&C, &p0).0.same_code(Status::INVALID_FIELD));
        // PRKEY of a registrant that does not hold: unregister it only.
        let pc = ReservationAcquire::preempt(1, T::WriteExclusive, 2, 3, false);
        let (s, fx) = st.acquire(&B, &pc);
        assert!(s.is_success() && fx.abort.is_empty());
        assert!(!st.is_registered(&C) && st.holds(&B));
        // No such key: conflict.
        let px = ReservationAcquire::preempt(1, T::WriteExclusive, 2, 42, false);
        assert!(st
            .acquire(&B, &px)
            .0
            .same_code(Status::RESERVATION_CONFLICT));
    }

    #[test]
    fn all_registrants_types() {
        let mut st = ReservationState::default();
        reg(&mut st, &A, 1);
        reg(&mut st, &B, 2);
        st.acquire(
            &A,
            &ReservationAcquire::acquire(1, T::ExclusiveAccessAllRegistrants, 1),
        );
        assert!(st.holds(&A) && st.holds(&B));
        assert!(st.report().registrants.iter().all(|r| r.holds));
        // The acquirer leaves: the reservation stays with the others.
        st.register(&A, &ReservationRegister::unregister(1, 1), true);
        assert!(st.held.is_some() && st.holds(&B));
        // Preempt with PRKEY 0 takes it alone.
        reg(&mut st, &C, 3);
        let p = ReservationAcquire::preempt(1, T::WriteExclusive, 3, 0, false);
        let (s, fx) = st.acquire(&C, &p);
        assert!(s.is_success());
        assert_eq!(st.registrants.len(), 1);
        assert_eq!(st.held.map(|h| h.rtype), Some(T::WriteExclusive));
        assert_eq!(
            fx.notify,
            vec![(B, notification_type::REGISTRATION_PREEMPTED)]
        );
    }

    #[test]
    fn release_and_clear() {
        let mut st = ReservationState::default();
        reg(&mut st, &A, 1);
        reg(&mut st, &B, 2);
        st.acquire(
            &A,
            &ReservationAcquire::acquire(1, T::WriteExclusiveRegistrantsOnly, 1),
        );
        let wrong = ReservationRelease::release(1, T::WriteExclusive, 1);
        assert!(st.release(&A, &wrong).0.same_code(Status::INVALID_FIELD));
        let not_holder = ReservationRelease::release(1, T::WriteExclusiveRegistrantsOnly, 2);
        assert!(st.release(&B, &not_holder).0.is_success());
        assert!(st.held.is_some());
        let r = ReservationRelease::release(1, T::WriteExclusiveRegistrantsOnly, 1);
        let (s, fx) = st.release(&A, &r);
        assert!(s.is_success() && st.held.is_none());
        assert_eq!(
            fx.notify,
            vec![(B, notification_type::RESERVATION_RELEASED)]
        );
        st.acquire(&A, &ReservationAcquire::acquire(1, T::WriteExclusive, 1));
        let gen = st.generation;
        let (s, fx) = st.release(&B, &ReservationRelease::clear(1, 2));
        assert!(s.is_success());
        assert!(st.registrants.is_empty() && st.held.is_none());
        assert_eq!(
            fx.notify,
            vec![(A, notification_type::RESERVATION_PREEMPTED)]
        );
        assert_eq!(st.generation, gen + 1);
        assert!(st
            .release(&B, &ReservationRelease::clear(1, 2))
            .0
            .same_code(Status::RESERVATION_CONFLICT));
    }

    #[test]
    fn cptpl_needs_a_sidecar() {
        let mut st = ReservationState::default();
        let mut r = ReservationRegister::register(1, 1);
        r.cptpl = cptpl::SET;
        assert!(st
            .register(&A, &r, false)
            .0
            .same_code(Status::INVALID_FIELD));
        let (s, fx) = st.register(&A, &r, true);
        assert!(s.is_success() && st.ptpl);
        assert_eq!(fx.ptpl_changed, Some(true));
        r.cptpl = 1;
        assert!(st.register(&A, &r, true).0.same_code(Status::INVALID_FIELD));
    }

    #[test]
    fn sidecar_round_trip_and_bad_files() {
        let dir = std::env::temp_dir().join(format!("gimbal-resv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sc = Sidecar::new(dir.join("ns1.resv"));
        assert_eq!(sc.load().unwrap(), None);
        let mut st = ReservationState {
            ptpl: true,
            ..Default::default()
        };
        reg(&mut st, &A, u64::MAX);
        reg(&mut st, &B, 0);
        st.acquire(
            &A,
            &ReservationAcquire::acquire(1, T::ExclusiveAccess, u64::MAX),
        );
        sc.store(&st).unwrap();
        assert_eq!(sc.load().unwrap(), Some(st.clone()));
        for bad in [
            "",
            "gimbal-reservations 2\nend\n",
            "gimbal-reservations 1\ngeneration x\nend\n",
            "gimbal-reservations 1\nreservation 9 00\nend\n",
            "gimbal-reservations 1\ngeneration 1\n",
        ] {
            std::fs::write(sc.path(), bad).unwrap();
            assert!(sc.load().is_err(), "{bad:?}");
        }
        sc.remove().unwrap();
        assert_eq!(sc.load().unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn notification_log_counts_and_bounds() {
        let mut log = NotificationLog::default();
        assert!(log.take().is_empty());
        for _ in 0..MAX_NOTIFICATIONS + 2 {
            log.push(notification_type::RESERVATION_RELEASED, 1);
        }
        let first = log.take();
        assert_eq!((first.count, first.available), (1, 63));
        for _ in 1..MAX_NOTIFICATIONS {
            log.take();
        }
        assert!(log.take().is_empty());
        log.push(notification_type::REGISTRATION_PREEMPTED, 2);
        let n = log.take();
        assert_eq!(
            n.count,
            MAX_NOTIFICATIONS as u64 + 3,
            "the gap shows the loss"
        );
    }

    #[test]
    fn admission_refuses_during_a_drain_and_counts() {
        let ns = NamespaceReservations::new(1, None).unwrap();
        let inflight = NsInflight::default();
        ns.admit(&inflight, &A, Access::Write).unwrap();
        assert_eq!(inflight.in_flight(), 1);
        NamespaceReservations::start_abort(&inflight);
        let e = ns.admit(&inflight, &A, Access::Read).unwrap_err();
        assert!(e.same_code(Status::ABORTED_PREEMPT));
        assert_eq!(inflight.in_flight(), 1);
        inflight.done();
        assert_eq!(inflight.in_flight(), 0);
    }
}
