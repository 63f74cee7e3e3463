//! Fencing at the targets: the owner of attach epoch E holds an NVMe
//! reservation keyed `reservation_key(volume, E)` on every replica's
//! namespace, so an older owner, paused or cut off from etcd, cannot
//! change the data any more when it resumes (its commands fail with
//! Reservation Conflict and it stops, see `Requests::on_completion`).
//!
//! Decisions:
//! - **Exclusive Access** (type 2), not Write Exclusive: a deposed owner's
//!   reads fail too. It may still have applications reading through its
//!   device, and what it would return is data the new owner is changing;
//!   failing them is the honest answer. Only the owner uses the
//!   namespace, so nothing else loses access.
//! - The key is replaced with "ignore existing key" (IEKEY): this host may
//!   be registered under an older epoch's key (an earlier server of its
//!   own); only if it is not registered at all does it register.
//! - Persist Through Power Loss is asked for, so that a restarted target
//!   still fences the old owner; a target that cannot persist (a volatile
//!   namespace) is used without it, with a warning.
//! - The holder is preempted *and aborted*: the target completes the
//!   acquire only once the old holder's admitted commands have drained,
//!   so none of its writes lands after this host starts writing.

use nvmf_initiator::blocking::Controller;
use nvmf_initiator::Error as InitError;
use nvmf_proto::identify::oncs;
use nvmf_proto::reservation::{
    acquire_action, cptpl, register_action, ReservationAcquire, ReservationRegister,
    ReservationStatus, ReservationType,
};

use crate::error::Error;

/// The reservation type the owner holds.
pub const OWNER_TYPE: ReservationType = ReservationType::ExclusiveAccess;

/// What fencing did at one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Nobody held the namespace; now this host does.
    Acquired,
    /// This host already held it with this epoch's key (a reconnect).
    AlreadyHeld,
    /// Another key held it (an older owner): preempted and aborted.
    Preempted {
        /// The key that held it.
        previous_key: u64,
    },
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Usage(format!("{what}: fencing with an NVMe reservation: {e}"))
}

/// Make this host (`key`) the holder of `nsid`'s reservation behind
/// `ctrl`; `what` names the replica in errors.
///
/// A holder whose key carries a newer epoch of this volume is never
/// preempted: that owner attached after this host (this host's attach is
/// stale, e.g. its lease ran out while it was connecting).
pub fn fence(
    ctrl: &Controller,
    nsid: u32,
    volume: &str,
    epoch: u64,
    what: &str,
) -> Result<Fenced, Error> {
    let key = cluster_store::reservation_key(volume, epoch);
    if ctrl.info().identify.oncs & oncs::RESERVATIONS == 0 {
        return Err(Error::Usage(format!(
            "{what}: the target does not support reservations (Identify ONCS bit 5); cluster mode fences older owners with them: use a target that does (gimbal-target; Linux nvmet from 6.13 with resv_enable), or set [cluster] fencing = \"none\""
        )));
    }
    register(ctrl, nsid, key, what)?;
    let before = ctrl.reservation_report(nsid).map_err(|e| err(what, e))?;
    let outcome = match holder(&before) {
        Some(k) if k == key && before.rtype == OWNER_TYPE.to_u8() => Fenced::AlreadyHeld,
        None => {
            ctrl.reservation_acquire(&ReservationAcquire::acquire(nsid, OWNER_TYPE, key))
                .map_err(|e| err(what, e))?;
            Fenced::Acquired
        }
        Some(previous_key)
            if cluster_store::reservation_epoch(volume, previous_key)
                .is_some_and(|e| e > (epoch & 0xffff_ffff)) =>
        {
            return Err(Error::Usage(format!(
                "{what}: a newer owner (epoch {}) holds the volume's reservation; this attach (epoch {epoch}) is stale",
                cluster_store::reservation_epoch(volume, previous_key).unwrap_or(0)
            )));
        }
        Some(previous_key) => {
            let cmd = ReservationAcquire {
                nsid,
                action: acquire_action::PREEMPT_AND_ABORT,
                iekey: false,
                rtype: OWNER_TYPE.to_u8(),
                crkey: key,
                prkey: previous_key,
            };
            ctrl.reservation_acquire(&cmd).map_err(|e| err(what, e))?;
            Fenced::Preempted { previous_key }
        }
    };
    let after = ctrl.reservation_report(nsid).map_err(|e| err(what, e))?;
    if holder(&after) != Some(key) || after.rtype != OWNER_TYPE.to_u8() {
        return Err(err(
            what,
            format!(
                "the target reports holder {:?} type {} after the acquire, not this host's key {key:#x}",
                holder(&after),
                after.rtype
            ),
        ));
    }
    Ok(outcome)
}

/// The key of the registrant that holds the reservation, if one is held.
fn holder(s: &ReservationStatus) -> Option<u64> {
    if s.rtype == 0 {
        return None;
    }
    s.registrants.iter().find(|r| r.holds).map(|r| r.rkey)
}

/// Register `key` for this host: replace whatever key it has, else
/// register anew; with Persist Through Power Loss if the target can.
fn register(ctrl: &Controller, nsid: u32, key: u64, what: &str) -> Result<(), Error> {
    let attempt = |action: u8, ptpl: u8| {
        ctrl.reservation_register(&ReservationRegister {
            nsid,
            action,
            iekey: action == register_action::REPLACE,
            cptpl: ptpl,
            crkey: 0,
            nrkey: key,
        })
    };
    let with = |ptpl: u8| match attempt(register_action::REPLACE, ptpl) {
        // Not registered at all: register.
        Err(e) if e.is_reservation_conflict() => attempt(register_action::REGISTER, ptpl),
        r => r,
    };
    match with(cptpl::SET) {
        Ok(()) => Ok(()),
        Err(InitError::CommandFailed { .. }) => {
            // Most likely Invalid Field: the namespace cannot persist
            // reservations (a volatile backend). Fence without it.
            log::warn!(
                "{what}: the target does not keep reservations across a restart for this namespace; a restarted target would not fence an older owner"
            );
            with(cptpl::NO_CHANGE).map_err(|e| err(what, e))
        }
        Err(e) => Err(err(what, e)),
    }
}
