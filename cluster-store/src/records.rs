//! The per-volume records kept in etcd, and the pure rules that change
//! them. Nothing here talks to etcd: [`crate::store`] reads and writes
//! these records with guarded transactions; the rules (which replica may
//! be recorded out of sync, where a new owner starts from) are plain
//! functions so that they can be tested without a cluster.
//!
//! Keys, under a configurable prefix (default `/ublk-nvmf`):
//!
//! | key | value | written |
//! |---|---|---|
//! | `PREFIX/volumes/NAME/spec` | [`VolumeSpec`] | once, by the first attach (created only if absent) |
//! | `PREFIX/volumes/NAME/epoch` | the attach epoch, decimal | +1 by every attach and takeover |
//! | `PREFIX/volumes/NAME/owner` | [`OwnerRecord`] | by every attach, bound to the owner's lease |
//! | `PREFIX/volumes/NAME/health` | [`HealthRecord`] | by the owner, guarded by its epoch |
//!
//! The epoch is the fencing token: every write of the health record
//! compares the epoch key with the writer's epoch in the same
//! transaction, so an owner that lost the volume (its lease expired, a
//! takeover) can never change the record again; the same epoch names the
//! owner's NVMe reservation key at the targets ([`reservation_key`]).

use serde::{Deserialize, Serialize};

/// The version of the records' layout; a reader refuses another one.
pub const SCHEMA: u32 = 1;

/// The etcd keys of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeKeys {
    base: String,
}

impl VolumeKeys {
    /// The keys of volume `name` under `prefix` (a trailing `/` is
    /// ignored).
    pub fn new(prefix: &str, name: &str) -> Self {
        Self {
            base: format!("{}/volumes/{name}/", prefix.trim_end_matches('/')),
        }
    }

    /// Every key of the volume starts with this.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The volume's spec.
    pub fn spec(&self) -> String {
        format!("{}spec", self.base)
    }

    /// The attach epoch.
    pub fn epoch(&self) -> String {
        format!("{}epoch", self.base)
    }

    /// The current owner (leased).
    pub fn owner(&self) -> String {
        format!("{}owner", self.base)
    }

    /// The replica health record.
    pub fn health(&self) -> String {
        format!("{}health", self.base)
    }
}

/// What a volume is: written once, compared by every later attach so that
/// two hosts with different configs for one name do not both believe they
/// serve it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeSpec {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The replicas, in config order: `ADDRESS:PORT SUBNQN nsid N`.
    pub replicas: Vec<String>,
}

impl VolumeSpec {
    /// A spec of `replicas`.
    pub fn new(replicas: Vec<String>) -> Self {
        Self {
            schema: SCHEMA,
            replicas,
        }
    }

    /// Why `self` (in etcd) and `local` (this host's config) disagree, if
    /// they do.
    pub fn mismatch(&self, local: &VolumeSpec) -> Option<String> {
        if self.schema != SCHEMA {
            return Some(format!(
                "its record has schema {} (this build reads {SCHEMA})",
                self.schema
            ));
        }
        (self.replicas != local.replicas).then(|| {
            format!(
                "etcd has replicas [{}], this config has [{}]",
                self.replicas.join(", "),
                local.replicas.join(", ")
            )
        })
    }
}

/// Who serves the volume now. The key holding it is bound to the owner's
/// lease: it disappears when the owner stops renewing it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OwnerRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The owner's host NQN (what the targets know it by).
    pub host_nqn: String,
    /// The machine's hostname, for people.
    pub hostname: String,
    /// The server's process id, for people.
    pub pid: u32,
    /// The epoch this owner attached with.
    pub epoch: u64,
    /// Its etcd lease.
    pub lease: i64,
    /// When it attached, seconds since the Unix epoch.
    pub since_unix: u64,
}

impl OwnerRecord {
    /// "host NQN (hostname, pid P, epoch E)", for errors and `status`.
    pub fn describe(&self) -> String {
        format!(
            "{} (host {}, pid {}, epoch {})",
            self.host_nqn, self.hostname, self.pid, self.epoch
        )
    }
}

/// One replica in the health record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaRecord {
    /// The replica (as in [`VolumeSpec::replicas`]).
    pub id: String,
    /// Whether it holds every acknowledged write.
    pub in_sync: bool,
}

/// Which replicas hold the volume's data: the record a new owner, on any
/// host, starts from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HealthRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// +1 by every change; a host's intent log remembers the generation it
    /// last wrote, so that the same host returning can trust its bitmap
    /// (see [`start_plan`]).
    pub generation: u64,
    /// The epoch of the owner that wrote it.
    pub epoch: u64,
    /// The owner stopped in order (every request answered): the in-sync
    /// replicas hold the same data.
    pub clean_shutdown: bool,
    /// Per replica, in spec order.
    pub replicas: Vec<ReplicaRecord>,
}

/// A health change the rules refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Recording the last in-sync replica out of sync would leave nobody
    /// knowing where the data is.
    #[error("replica {0} is the last in-sync replica; it is never recorded out of sync")]
    LastInSync(usize),
    /// No such replica.
    #[error("no replica {0} (the volume has {1})")]
    NoReplica(usize, usize),
    /// A record with no in-sync replica (it cannot be written).
    #[error("a health record needs at least one in-sync replica")]
    NoneInSync,
    /// The record names other replicas than the spec.
    #[error("the health record names replicas [{0}], the spec [{1}]")]
    Replicas(String, String),
}

impl HealthRecord {
    /// The record of a new volume: replica 0 is the source, every other
    /// replica gets a full copy from it (as md's initial resync, and as
    /// the single-host intent log does).
    pub fn initial(spec: &VolumeSpec, epoch: u64) -> Self {
        Self {
            schema: SCHEMA,
            generation: 1,
            epoch,
            clean_shutdown: false,
            replicas: spec
                .replicas
                .iter()
                .enumerate()
                .map(|(i, id)| ReplicaRecord {
                    id: id.clone(),
                    in_sync: i == 0,
                })
                .collect(),
        }
    }

    /// Whether replica `r` is recorded in sync.
    pub fn in_sync(&self, r: usize) -> bool {
        self.replicas.get(r).is_some_and(|x| x.in_sync)
    }

    /// The replicas recorded in sync.
    pub fn in_sync_set(&self) -> Vec<bool> {
        self.replicas.iter().map(|r| r.in_sync).collect()
    }

    /// Checks the record is one that may be written and read back: the
    /// spec's replicas, at least one in sync.
    pub fn validate(&self, spec: &VolumeSpec) -> Result<(), RuleError> {
        let ids: Vec<&str> = self.replicas.iter().map(|r| r.id.as_str()).collect();
        if ids != spec.replicas.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(RuleError::Replicas(
                ids.join(", "),
                spec.replicas.join(", "),
            ));
        }
        if !self.replicas.iter().any(|r| r.in_sync) {
            return Err(RuleError::NoneInSync);
        }
        Ok(())
    }

    /// The next record, written by the owner of `epoch`: the replicas in
    /// sync are `in_sync` (the owner's current knowledge), the generation
    /// one more. Refused if it would record the last in-sync replica out
    /// of sync: an owner only ever takes a replica out while another one
    /// still holds the data (the local health rules guarantee it; this is
    /// the check at the store's door).
    pub fn next(
        &self,
        epoch: u64,
        in_sync: &[bool],
        clean_shutdown: bool,
    ) -> Result<Self, RuleError> {
        let n = self.replicas.len();
        if in_sync.len() != n {
            return Err(RuleError::NoReplica(in_sync.len(), n));
        }
        if !in_sync.iter().any(|&s| s) {
            let last = self.replicas.iter().position(|r| r.in_sync).unwrap_or(0);
            return Err(RuleError::LastInSync(last));
        }
        Ok(Self {
            schema: SCHEMA,
            generation: self.generation + 1,
            epoch,
            clean_shutdown,
            replicas: self
                .replicas
                .iter()
                .zip(in_sync)
                .map(|(r, &s)| ReplicaRecord {
                    id: r.id.clone(),
                    in_sync: s,
                })
                .collect(),
        })
    }

    /// Whether every replica outside `sent_to` (a write's destinations,
    /// by index) is recorded out of sync: then a write that skipped them
    /// may be acknowledged.
    pub fn covers_skipped(&self, sent_to: impl Fn(usize) -> bool) -> bool {
        self.replicas
            .iter()
            .enumerate()
            .all(|(i, r)| sent_to(i) || !r.in_sync)
    }
}

/// What this host's intent log knows of the volume, for [`start_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLog {
    /// The health generation this host last wrote to etcd (0: none).
    pub generation: u64,
    /// The log's own clean-shutdown flag.
    pub clean_shutdown: bool,
}

/// How one replica starts under a new owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaStart {
    /// In sync: serves reads and writes at once.
    InSync,
    /// Out of sync; the local intent log's bits say exactly what it
    /// misses (this host wrote the last record and nobody came between).
    FromBitmap,
    /// Out of sync; copied in full from the source.
    FullCopy,
}

/// Where a new owner starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartPlan {
    /// The replica every copy comes from (recorded in sync).
    pub source: usize,
    /// Per replica.
    pub replicas: Vec<ReplicaStart>,
}

impl StartPlan {
    /// The replicas in sync once the plan is applied.
    pub fn in_sync(&self) -> Vec<bool> {
        self.replicas
            .iter()
            .map(|r| *r == ReplicaStart::InSync)
            .collect()
    }
}

/// Where the next owner of a volume starts, from etcd's `record` and what
/// this host's intent log remembers (`local`; `None` when it has no log
/// for the volume, e.g. another host).
///
/// The rules, each with its argument:
///
/// 1. The source is the first replica etcd records in sync. Every write
///    acknowledged by any owner reached every replica recorded in sync at
///    the time (a replica is recorded out of sync before a write that
///    skipped it is acknowledged), and nobody records the last in-sync
///    replica out of sync, so the source holds every acknowledged write.
/// 2. Replicas etcd records out of sync are copied: from the local bitmap
///    if this host wrote the record's generation and the record says the
///    stop was clean (nobody owned the volume since, so the bitmap's bits
///    cover every write they missed: bits are made durable before a write
///    that skips a replica is sent), else in full: another host's bitmap
///    is not here, and after an unclean stop a replica that was resyncing
///    (out of sync in etcd, yet taking writes) may hold unacknowledged
///    writes its source lacks, which no bit records. (Stricter than
///    issue 17's text, which allowed the bitmap after an unclean stop.)
/// 3. After an unclean stop (the record's `clean_shutdown` is false),
///    writes may have been in flight to every in-sync replica and landed
///    on some only; nothing records where (the bitmap records only what a
///    replica was known to miss), so every in-sync replica but the source
///    is copied in full, as md without a bitmap does. A write that was not
///    acknowledged may read as old or new data afterwards; acknowledged
///    ones are on the source (rule 1).
/// 4. `recovering` (the same host takes over a live device from its
///    crashed server, `ublk-nvmf recover`): the kernel reissues every
///    request that was in flight, to every replica, so the in-sync
///    replicas converge without a copy; rule 3 does not apply.
pub fn start_plan(record: &HealthRecord, local: Option<LocalLog>, recovering: bool) -> StartPlan {
    let source = record.replicas.iter().position(|r| r.in_sync).unwrap_or(0);
    let bitmap_current =
        record.clean_shutdown && local.is_some_and(|l| l.generation == record.generation);
    let unclean = !record.clean_shutdown && !recovering;
    let replicas = record
        .replicas
        .iter()
        .enumerate()
        .map(|(i, r)| match (r.in_sync, i == source) {
            (true, true) => ReplicaStart::InSync,
            (true, false) if unclean => ReplicaStart::FullCopy,
            (true, false) => ReplicaStart::InSync,
            (false, _) if bitmap_current => ReplicaStart::FromBitmap,
            (false, _) => ReplicaStart::FullCopy,
        })
        .collect();
    StartPlan { source, replicas }
}

/// The NVMe reservation key of the owner of `epoch` for volume `name`:
/// the upper 32 bits a hash of the name (so that two volumes sharing a
/// namespace by mistake do not take each other's keys for their own), the
/// lower 32 bits the epoch. Never zero (zero means "no key" to NVMe).
pub fn reservation_key(name: &str, epoch: u64) -> u64 {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let key = (u64::from(h) << 32) | (epoch & 0xffff_ffff);
    if key == 0 {
        1
    } else {
        key
    }
}

/// The epoch a key from [`reservation_key`] for `name` carries, if it is
/// one of `name`'s keys.
pub fn reservation_epoch(name: &str, key: u64) -> Option<u64> {
    (reservation_key(name, 0) >> 32 == key >> 32).then_some(key & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize) -> VolumeSpec {
        VolumeSpec::new((0..n).map(|i| format!("r{i}")).collect())
    }

    #[test]
    fn keys_live_under_the_prefix() {
        let k = VolumeKeys::new("/ublk-nvmf/", "v1");
        assert_eq!(k.owner(), "/ublk-nvmf/volumes/v1/owner");
        assert_eq!(k.epoch(), "/ublk-nvmf/volumes/v1/epoch");
        assert!(k.health().starts_with(k.base()));
    }

    #[test]
    fn a_new_volume_copies_replica_0_to_the_others() {
        let h = HealthRecord::initial(&spec(3), 1);
        assert_eq!(h.in_sync_set(), vec![true, false, false]);
        h.validate(&spec(3)).unwrap();
        assert!(h.validate(&spec(2)).is_err());
    }

    #[test]
    fn the_last_in_sync_replica_is_never_recorded_out_of_sync() {
        let h = HealthRecord::initial(&spec(2), 1);
        let h2 = h.next(1, &[true, true], false).unwrap();
        assert_eq!(h2.generation, 2);
        let h3 = h2.next(1, &[false, true], false).unwrap();
        assert_eq!(
            h3.next(1, &[false, false], false),
            Err(RuleError::LastInSync(1))
        );
        assert!(h3.next(1, &[true], false).is_err(), "replica count");
    }

    #[test]
    fn a_write_that_skipped_a_replica_waits_for_its_record() {
        let h = HealthRecord::initial(&spec(2), 1)
            .next(1, &[true, true], false)
            .unwrap();
        assert!(h.covers_skipped(|_| true));
        assert!(!h.covers_skipped(|i| i == 0), "replica 1 still in sync");
        let h = h.next(1, &[true, false], false).unwrap();
        assert!(h.covers_skipped(|i| i == 0));
    }

    #[test]
    fn start_plans() {
        let all = HealthRecord::initial(&spec(3), 1)
            .next(1, &[true, true, true], false)
            .unwrap();
        // Unclean, another host: copy every in-sync replica but the source.
        let p = start_plan(&all, None, false);
        assert_eq!(p.source, 0);
        assert_eq!(
            p.replicas,
            vec![
                ReplicaStart::InSync,
                ReplicaStart::FullCopy,
                ReplicaStart::FullCopy
            ]
        );
        // Recovering a live device: the kernel reissues; no copy.
        assert_eq!(start_plan(&all, None, true).in_sync(), vec![true; 3]);
        // Clean stop: nothing to copy.
        let clean = all.next(1, &[true, true, true], true).unwrap();
        assert_eq!(start_plan(&clean, None, false).in_sync(), vec![true; 3]);
        // Replica 0 out: replica 1 is the source; replica 0 from the
        // bitmap only if this host wrote the generation.
        let degraded = all.next(1, &[false, true, true], true).unwrap();
        let p = start_plan(&degraded, None, false);
        assert_eq!(p.source, 1);
        assert_eq!(p.replicas[0], ReplicaStart::FullCopy);
        let mine = LocalLog {
            generation: degraded.generation,
            clean_shutdown: true,
        };
        assert_eq!(
            start_plan(&degraded, Some(mine), false).replicas[0],
            ReplicaStart::FromBitmap
        );
        let stale = LocalLog {
            generation: degraded.generation - 1,
            clean_shutdown: true,
        };
        assert_eq!(
            start_plan(&degraded, Some(stale), false).replicas[0],
            ReplicaStart::FullCopy
        );
    }

    #[test]
    fn reservation_keys_carry_the_epoch() {
        let k = reservation_key("vol", 7);
        assert_ne!(k, 0);
        assert_eq!(reservation_epoch("vol", k), Some(7));
        assert_eq!(reservation_epoch("other", k), None);
        assert_ne!(reservation_key("vol", 8), k);
    }

    #[test]
    fn records_round_trip_as_json() {
        let h = HealthRecord::initial(&spec(2), 3);
        let s = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<HealthRecord>(&s).unwrap(), h);
    }
}
