//! Elastic volumes' state in etcd (issue 18): the namespaces of the pool,
//! each eVol's spec and its extent map, and the arbiter's leadership, with
//! the transactions that keep the map sound.
//!
//! Keys, under the same prefix as the volumes of [`crate::records`]:
//!
//! | key | value | written |
//! |---|---|---|
//! | `PREFIX/arbiter/leader` | [`LeaderRecord`] | by the arbiter that wins the election, bound to its lease |
//! | `PREFIX/pool/NS` | [`NamespaceRecord`] | by the leader |
//! | `PREFIX/pool/NS/pext/P` | [`PextRecord`] (who uses physical extent P of NS, or that it waits for zeroing) | with the mapping that uses it; rewritten as *zeroing* by the unmap; deleted once zeroed |
//! | `PREFIX/evols/NAME/spec` | [`EvolSpec`] | by the leader, once |
//! | `PREFIX/evols/NAME/extents/L` | [`ExtentRecord`] (logical extent L's copies) | by the leader, created only if absent |
//!
//! The rules, each with its argument:
//!
//! 1. **No physical extent is mapped twice.** A mapping creates the
//!    extent key *and* one `pext` key per copy in one transaction that
//!    requires all of them absent: etcd serializes transactions, so of two
//!    that want the same physical extent one fails, whoever sent them
//!    (two leaders during a failover included).
//! 2. **A logical extent is mapped once.** The same transaction requires
//!    the extent key absent; the loser reads the winner's mapping and
//!    uses it ([`MapOutcome::AlreadyMapped`]): a client whose first write
//!    raced another's writes where the winner's map says.
//! 3. **Only the leader mutates.** Every mutation compares the leader
//!    key's create revision with the one the arbiter won with: an arbiter
//!    whose lease expired (its key deleted, another elected) can no longer
//!    write, even if it does not know yet.
//! 4. **The map is durable before the first write to the extent leaves the
//!    client**: the client sends that write only after the transaction
//!    returned (the arbiter answers the client only then).
//! 5. **A freed physical extent is zeroed before reuse.** Unmapping
//!    deletes the extent key and, in the same transaction, rewrites each
//!    copy's `pext` key as a *zeroing* record ([`PextRecord::zeroing`])
//!    instead of deleting it: rule 1's "absent" guard keeps the extent out
//!    of every mapping, and an arbiter elected later reads it as waiting
//!    for zeroing, not as free. Only [`Store::finish_zeroing`], after the
//!    extent was overwritten with zeros, deletes the key.
//!
//! [`check`] verifies rules 1 and 2 from the records alone (the fsck of
//! the issue's `check` command): every copy's `pext` key points back to
//! its extent, no `pext` key is orphaned, every copy lies within its
//! namespace's capacity, copies of one extent are on distinct namespaces,
//! no mapping uses a physical extent that waits for zeroing.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use crate::records::{OwnerRecord, VolumeSpec, SCHEMA};
use crate::store::{decode, encode, Store, StoreError};

/// Default extent: 2 MiB (the paper's; large enough that a map of 1 PiB
/// is 512 Mi entries spread over etcd keys only as data is written).
pub const DEFAULT_EXTENT_BYTES: u64 = 2 << 20;

/// The keys of the eVol layer under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvolKeys {
    prefix: String,
}

impl EvolKeys {
    /// Keys under `prefix` (a trailing `/` is ignored).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// The arbiter's leader key.
    pub fn leader(&self) -> String {
        format!("{}/arbiter/leader", self.prefix)
    }

    /// The pool's namespaces (prefix).
    pub fn pool(&self) -> String {
        format!("{}/pool/", self.prefix)
    }

    /// Namespace `ns`'s record.
    pub fn namespace(&self, ns: &str) -> String {
        format!("{}/pool/{ns}", self.prefix)
    }

    /// Physical extent `p` of namespace `ns`.
    pub fn pext(&self, ns: &str, p: u64) -> String {
        format!("{}/pool/{ns}/pext/{p:012}", self.prefix)
    }

    /// eVol `name`'s spec.
    pub fn spec(&self, name: &str) -> String {
        format!("{}/evols/{name}/spec", self.prefix)
    }

    /// eVol `name`'s extents (prefix).
    pub fn extents(&self, name: &str) -> String {
        format!("{}/evols/{name}/extents/", self.prefix)
    }

    /// Logical extent `l` of eVol `name` (zero-padded, so that a prefix
    /// read returns them in order).
    pub fn extent(&self, name: &str, l: u64) -> String {
        format!("{}/evols/{name}/extents/{l:012}", self.prefix)
    }
}

/// The elected arbiter.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeaderRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Its name (unique per arbiter instance).
    pub id: String,
    /// Where it answers clients.
    pub address: String,
    /// Its lease.
    pub lease: i64,
}

/// What a won election lets the arbiter do: its mutations carry this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leadership {
    /// The leader key's create revision when this arbiter won.
    pub revision: i64,
}

/// A namespace of the pool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NamespaceRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Its name in keys (`[A-Za-z0-9_.-]`).
    pub id: String,
    /// The target it is on (copies prefer distinct targets).
    pub target: String,
    /// `ADDRESS:PORT`.
    pub address: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace ID.
    pub nsid: u32,
    /// Physical extents it holds.
    pub extents: u64,
    /// Bytes per extent (the pool's).
    pub extent_bytes: u64,
}

/// An elastic volume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EvolSpec {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Its name.
    pub name: String,
    /// Size in bytes (a multiple of `extent_bytes`).
    pub size_bytes: u64,
    /// Bytes per extent.
    pub extent_bytes: u64,
    /// Copies per extent (on distinct namespaces).
    pub copies: u32,
    /// Share of bandwidth against other eVols (the auction's weight).
    pub weight: u32,
}

/// One copy of an extent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placement {
    /// The namespace ([`NamespaceRecord::id`]).
    pub namespace: String,
    /// Its physical extent.
    pub pext: u64,
}

/// Logical extent `index` of eVol `evol` and where its copies are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExtentRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The eVol.
    pub evol: String,
    /// Its logical index.
    pub index: u64,
    /// Its copies, first the one reads prefer.
    pub copies: Vec<Placement>,
}

/// Who uses a physical extent (the back pointer [`check`] follows), or,
/// with `zeroing`, that it was freed and waits for zeroing (rule 5).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PextRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The eVol (with `zeroing`: the one it was freed from).
    pub evol: String,
    /// Its logical extent (with `zeroing`: the one it was freed from).
    pub index: u64,
    /// Freed, not yet zeroed: neither in use nor free. Absent in records
    /// of extents in use (and in those written before this field
    /// existed), so their bytes, which the transactions compare, are
    /// unchanged.
    #[serde(default, skip_serializing_if = "is_false")]
    pub zeroing: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl PextRecord {
    /// The back pointer of a copy of `evol`'s extent `index`.
    pub fn used_by(evol: &str, index: u64) -> Self {
        PextRecord {
            schema: SCHEMA,
            evol: evol.to_owned(),
            index,
            zeroing: false,
        }
    }

    /// The record of a physical extent freed from `evol`'s extent `index`.
    pub fn freed_from(evol: &str, index: u64) -> Self {
        PextRecord {
            zeroing: true,
            ..Self::used_by(evol, index)
        }
    }
}

/// What [`Store::finish_zeroing`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZeroingOutcome {
    /// The `pext` key is deleted: the physical extent is free.
    Freed,
    /// The key was absent already (an earlier attempt committed): free.
    AlreadyFree,
    /// The key holds another record: leave the extent alone and reread
    /// the pool.
    Changed,
    /// The caller is not the leader any more.
    NotLeader,
}

/// What [`Store::map_extent`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapOutcome {
    /// The mapping asked for is in etcd.
    Mapped(ExtentRecord),
    /// The extent was mapped already (by another request or leader): use
    /// this mapping.
    AlreadyMapped(ExtentRecord),
    /// A physical extent asked for is taken: the caller's free set is
    /// stale; choose again.
    PextTaken(Placement),
    /// The caller is not the leader any more.
    NotLeader,
}

/// What a guarded change ([`Store::unmap_extent`], [`Store::update_evol`],
/// [`Store::delete_evol`]) did. Each can be retried after an ambiguous
/// failure (a timeout after etcd committed): the retry reports
/// `AlreadyDone`, not `Changed`, so a lost answer never looks like a
/// conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// This call made the change.
    Done,
    /// The key already held what the change would leave (an earlier
    /// attempt committed).
    AlreadyDone,
    /// The key holds something else: the caller's copy is stale; reread.
    Changed,
    /// The caller is not the leader any more.
    NotLeader,
}

/// One inconsistency [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A copy whose `pext` key is missing or names another extent.
    BrokenBackPointer {
        /// The extent.
        evol: String,
        /// Its index.
        index: u64,
        /// The copy.
        copy: Placement,
        /// What the `pext` key says (None: absent).
        found: Option<(String, u64)>,
    },
    /// A physical extent that waits for zeroing, yet a mapping uses it
    /// (its `pext` key says zeroing): the client may read another
    /// volume's old data, and the zeroing would wipe this one's.
    MappedWhileZeroing {
        /// The physical extent.
        copy: Placement,
        /// The extents that use it.
        users: Vec<(String, u64)>,
    },
    /// A physical extent used by two copies.
    MappedTwice {
        /// The physical extent.
        copy: Placement,
        /// The extents that use it.
        users: Vec<(String, u64)>,
    },
    /// A `pext` key no extent uses.
    Orphan {
        /// The physical extent.
        copy: Placement,
    },
    /// A copy beyond its namespace's capacity, or on an unknown namespace.
    OutOfRange {
        /// The extent.
        evol: String,
        /// Its index.
        index: u64,
        /// The copy.
        copy: Placement,
    },
    /// Two copies of one extent on the same namespace.
    SameNamespace {
        /// The extent.
        evol: String,
        /// Its index.
        index: u64,
    },
}

/// Every record of the eVol layer, as read at one revision.
#[derive(Debug, Clone, Default)]
pub struct PoolView {
    /// The namespaces by id.
    pub namespaces: BTreeMap<String, NamespaceRecord>,
    /// The `pext` keys of extents in use: (namespace, pext) -> (evol,
    /// index).
    pub pexts: BTreeMap<(String, u64), (String, u64)>,
    /// The `pext` keys of freed extents waiting for zeroing: (namespace,
    /// pext) -> the record, as stored ([`Store::finish_zeroing`] compares
    /// it).
    pub zeroing: BTreeMap<(String, u64), PextRecord>,
    /// The eVols by name.
    pub evols: BTreeMap<String, EvolSpec>,
    /// Every extent mapping.
    pub extents: Vec<ExtentRecord>,
    /// The revision it was read at (a watch continues from here).
    pub revision: i64,
}

/// Checks the map (see the module documentation); an empty list: sound.
pub fn check(view: &PoolView) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut users: BTreeMap<Placement, Vec<(String, u64)>> = BTreeMap::new();
    for e in &view.extents {
        let namespaces: BTreeSet<&str> = e.copies.iter().map(|c| c.namespace.as_str()).collect();
        if namespaces.len() != e.copies.len() {
            out.push(Finding::SameNamespace {
                evol: e.evol.clone(),
                index: e.index,
            });
        }
        for c in &e.copies {
            users
                .entry(c.clone())
                .or_default()
                .push((e.evol.clone(), e.index));
            let in_range = view
                .namespaces
                .get(&c.namespace)
                .is_some_and(|n| c.pext < n.extents);
            if !in_range {
                out.push(Finding::OutOfRange {
                    evol: e.evol.clone(),
                    index: e.index,
                    copy: c.clone(),
                });
            }
            let at = (c.namespace.clone(), c.pext);
            if view.zeroing.contains_key(&at) {
                // Reported once per physical extent below.
                continue;
            }
            let found = view.pexts.get(&at).cloned();
            if found.as_ref() != Some(&(e.evol.clone(), e.index)) {
                out.push(Finding::BrokenBackPointer {
                    evol: e.evol.clone(),
                    index: e.index,
                    copy: c.clone(),
                    found,
                });
            }
        }
    }
    for (copy, u) in &users {
        if view
            .zeroing
            .contains_key(&(copy.namespace.clone(), copy.pext))
        {
            out.push(Finding::MappedWhileZeroing {
                copy: copy.clone(),
                users: u.clone(),
            });
        } else if u.len() > 1 {
            out.push(Finding::MappedTwice {
                copy: copy.clone(),
                users: u.clone(),
            });
        }
    }
    for (ns, p) in view.pexts.keys() {
        let copy = Placement {
            namespace: ns.clone(),
            pext: *p,
        };
        if !users.contains_key(&copy) {
            out.push(Finding::Orphan { copy });
        }
    }
    out
}

impl Store {
    /// Campaigns for leadership with `me` (bound to `me.lease`): the
    /// leadership if the key was free (or already holds `me`: an earlier
    /// attempt committed whose answer was lost), `None` if another arbiter
    /// leads.
    pub fn campaign(
        &self,
        keys: &EvolKeys,
        me: &LeaderRecord,
    ) -> Result<Option<Leadership>, StoreError> {
        let key = keys.leader();
        let mine = encode(me);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                mine.clone(),
                Some(PutOptions::new().with_lease(me.lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = self.txn(txn)?;
        if !resp.succeeded() {
            // Same record, same lease: this instance's own win.
            let won = match resp.op_responses().first() {
                Some(TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .filter(|kv| kv.value() == mine.as_bytes() && kv.lease() == me.lease)
                    .map(|kv| Leadership {
                        revision: kv.create_revision(),
                    }),
                _ => None,
            };
            return Ok(won);
        }
        // The create revision of the key just put is the transaction's
        // revision.
        Ok(Some(Leadership {
            revision: resp.header().map_or(0, |h| h.revision()),
        }))
    }

    /// The current leader, if any.
    pub fn leader(&self, keys: &EvolKeys) -> Result<Option<LeaderRecord>, StoreError> {
        let key = keys.leader();
        let resp = self.get(&key, None)?;
        resp.kvs()
            .first()
            .map(|kv| decode(kv.value()).map_err(|r| bad(&key, r)))
            .transpose()
    }

    /// The current leader with its leadership (the leader key's create
    /// revision, what guarded writes compare): for tools acting on the
    /// leader's behalf, and tests.
    pub fn leadership(
        &self,
        keys: &EvolKeys,
    ) -> Result<Option<(LeaderRecord, Leadership)>, StoreError> {
        let key = keys.leader();
        let resp = self.get(&key, None)?;
        resp.kvs()
            .first()
            .map(|kv| {
                let rec = decode(kv.value()).map_err(|r| bad(&key, r))?;
                Ok((
                    rec,
                    Leadership {
                        revision: kv.create_revision(),
                    },
                ))
            })
            .transpose()
    }

    /// Adds `rec` to the pool, or updates it (as the leader). An update
    /// may move the namespace (address) or grow it, never change what a
    /// physical extent index means (extent size, subsystem, NSID) nor
    /// shrink it: mapped extents would then name other bytes.
    pub fn put_namespace(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        rec: &NamespaceRecord,
    ) -> Result<bool, StoreError> {
        let key = keys.namespace(&rec.id);
        let resp = self.get(&key, None)?;
        let (guard, old) = match resp.kvs().first() {
            None => (
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                None,
            ),
            Some(kv) => (
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
                Some(decode::<NamespaceRecord>(kv.value()).map_err(|e| bad(&key, e))?),
            ),
        };
        if let Some(o) = old {
            if o.extent_bytes != rec.extent_bytes
                || o.subnqn != rec.subnqn
                || o.nsid != rec.nsid
                || rec.extents < o.extents
            {
                return Err(bad(
                    &key,
                    "a namespace's extent size, subsystem and NSID never change and it never shrinks".into(),
                ));
            }
        }
        let txn = Txn::new()
            .when([leader_guard(keys, lead), guard])
            .and_then([TxnOp::put(key, encode(rec), None)]);
        Ok(self.txn(txn)?.succeeded())
    }

    /// Creates eVol `spec` if absent (as the leader); the spec in etcd.
    pub fn create_evol(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        spec: &EvolSpec,
    ) -> Result<Option<EvolSpec>, StoreError> {
        let key = keys.spec(&spec.name);
        let txn = Txn::new()
            .when([
                leader_guard(keys, lead),
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(key.clone(), encode(spec), None)])
            .or_else([
                TxnOp::get(keys.leader(), None),
                TxnOp::get(key.clone(), None),
            ]);
        let resp = self.txn(txn)?;
        if resp.succeeded() {
            return Ok(Some(spec.clone()));
        }
        let r = resp.op_responses();
        if !got_any(&r, 0) {
            return Ok(None);
        }
        match r.get(1) {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .map(|kv| decode(kv.value()).map_err(|e| bad(&key, e)))
                .transpose(),
            _ => Ok(None),
        }
    }

    /// Maps logical extent `index` of `evol` to `copies` (as the leader),
    /// in one transaction with every `pext` key (rules 1 to 3).
    pub fn map_extent(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        evol: &str,
        index: u64,
        copies: &[Placement],
    ) -> Result<MapOutcome, StoreError> {
        let ekey = keys.extent(evol, index);
        let rec = ExtentRecord {
            schema: SCHEMA,
            evol: evol.to_owned(),
            index,
            copies: copies.to_vec(),
        };
        let back = PextRecord::used_by(evol, index);
        let mut when = vec![
            leader_guard(keys, lead),
            Compare::create_revision(ekey.clone(), CompareOp::Equal, 0),
        ];
        let mut ops = vec![TxnOp::put(ekey.clone(), encode(&rec), None)];
        for c in copies {
            let k = keys.pext(&c.namespace, c.pext);
            when.push(Compare::create_revision(k.clone(), CompareOp::Equal, 0));
            ops.push(TxnOp::put(k, encode(&back), None));
        }
        let mut or_else = vec![
            TxnOp::get(keys.leader(), None),
            TxnOp::get(ekey.clone(), None),
        ];
        for c in copies {
            or_else.push(TxnOp::get(keys.pext(&c.namespace, c.pext), None));
        }
        let txn = Txn::new().when(when).and_then(ops).or_else(or_else);
        let resp = self.txn(txn)?;
        if resp.succeeded() {
            return Ok(MapOutcome::Mapped(rec));
        }
        let r = resp.op_responses();
        if let Some(TxnOpResponse::Get(g)) = r.get(1) {
            if let Some(kv) = g.kvs().first() {
                return Ok(MapOutcome::AlreadyMapped(
                    decode(kv.value()).map_err(|e| bad(&ekey, e))?,
                ));
            }
        }
        if !leader_is(&r, lead) {
            return Ok(MapOutcome::NotLeader);
        }
        for (i, c) in copies.iter().enumerate() {
            if got_any(&r, 2 + i) {
                return Ok(MapOutcome::PextTaken(c.clone()));
            }
        }
        Err(StoreError::Contended {
            volume: evol.to_owned(),
            what: "extent map",
            attempts: 1,
        })
    }

    /// Unmaps logical extent `index` of `evol` (a discard of the whole
    /// extent), as the leader, if it is still mapped as `rec`. Its physical
    /// extents are not freed: their `pext` keys become zeroing records
    /// ([`PextRecord::freed_from`]) in the same transaction (rule 5), and
    /// [`Store::finish_zeroing`] frees each once it reads as zeros. The
    /// caller must also make sure no client still writes to the extent
    /// under the old map (the arbiter refuses to delete an eVol a host
    /// owns; clients' map epochs are not built yet).
    pub fn unmap_extent(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        rec: &ExtentRecord,
    ) -> Result<ChangeOutcome, StoreError> {
        let ekey = keys.extent(&rec.evol, rec.index);
        let back = encode(&PextRecord::used_by(&rec.evol, rec.index));
        let freed = encode(&PextRecord::freed_from(&rec.evol, rec.index));
        let mut when = vec![Compare::value(ekey.clone(), CompareOp::Equal, encode(rec))];
        let mut ops = vec![TxnOp::delete(ekey.clone(), None)];
        for c in &rec.copies {
            // Only back pointers to this extent: never free a physical
            // extent another mapping uses.
            let k = keys.pext(&c.namespace, c.pext);
            when.push(Compare::value(k.clone(), CompareOp::Equal, back.clone()));
            ops.push(TxnOp::put(k, freed.clone(), None));
        }
        // Gone: whoever removed the mapping made its physical extents
        // zeroing records in the same transaction (this call's earlier
        // attempt, or a leader before).
        self.guarded_change(keys, lead, &ekey, when, ops, |v| v.is_none())
    }

    /// The record in physical extent `copy`'s `pext` key (None: free).
    pub fn pext_record(
        &self,
        keys: &EvolKeys,
        copy: &Placement,
    ) -> Result<Option<PextRecord>, StoreError> {
        let k = keys.pext(&copy.namespace, copy.pext);
        let resp = self.get(&k, None)?;
        resp.kvs()
            .first()
            .map(|kv| decode(kv.value()).map_err(|e| bad(&k, e)))
            .transpose()
    }

    /// Physical extent `copy` was overwritten with zeros: deletes its
    /// zeroing record `rec` (as the leader, if the key still holds `rec`),
    /// which frees it for mappings.
    pub fn finish_zeroing(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        copy: &Placement,
        rec: &PextRecord,
    ) -> Result<ZeroingOutcome, StoreError> {
        let k = keys.pext(&copy.namespace, copy.pext);
        let outcome = self.delete_if_holds(keys, lead, &k, encode(rec))?;
        Ok(match outcome {
            ChangeOutcome::Done => ZeroingOutcome::Freed,
            ChangeOutcome::AlreadyDone => ZeroingOutcome::AlreadyFree,
            ChangeOutcome::Changed => ZeroingOutcome::Changed,
            ChangeOutcome::NotLeader => ZeroingOutcome::NotLeader,
        })
    }

    /// The owners of eVol `evol` (a client host serving it, as cluster
    /// mode records them): (volume name, owner) for every volume under
    /// `PREFIX/volumes/` whose spec names the eVol (`evol NAME`, what
    /// ublk-nvmf writes for an eVol, whatever the device's name) and whose
    /// owner key exists (its lease alive), plus the owner of a volume
    /// named `evol` without a spec.
    pub fn evol_owners(
        &self,
        keys: &EvolKeys,
        evol: &str,
    ) -> Result<Vec<(String, OwnerRecord)>, StoreError> {
        let prefix = format!("{}/volumes/", keys.prefix);
        let resp = self.get(&prefix, Some(GetOptions::new().with_prefix()))?;
        let mut specs: BTreeMap<String, VolumeSpec> = BTreeMap::new();
        let mut owners: BTreeMap<String, OwnerRecord> = BTreeMap::new();
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some((name, what)) = key.strip_prefix(&prefix).and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            match what {
                "spec" => {
                    if let Ok(s) = decode(kv.value()) {
                        specs.insert(name.to_owned(), s);
                    }
                }
                "owner" => {
                    owners.insert(
                        name.to_owned(),
                        decode(kv.value()).map_err(|e| bad(&key, e))?,
                    );
                }
                _ => {}
            }
        }
        let mine = VolumeSpec::new(vec![format!("evol {evol}")]);
        Ok(owners
            .into_iter()
            .filter(|(name, _)| match specs.get(name) {
                Some(s) => *s == mine,
                None => name == evol,
            })
            .collect())
    }

    /// Replaces eVol `old`'s spec with `new` (as the leader), if the spec
    /// in etcd is still `old` (`AlreadyDone` if it is `new`). The caller
    /// keeps what an index means (extent size) and never shrinks (mapped
    /// extents beyond the new end would dangle).
    pub fn update_evol(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        old: &EvolSpec,
        new: &EvolSpec,
    ) -> Result<ChangeOutcome, StoreError> {
        let key = keys.spec(&old.name);
        let want = encode(new);
        self.guarded_change(
            keys,
            lead,
            &key,
            vec![Compare::value(key.clone(), CompareOp::Equal, encode(old))],
            vec![TxnOp::put(key.clone(), want.clone(), None)],
            |v| v == Some(want.as_bytes()),
        )
    }

    /// Deletes eVol `spec`'s spec key (as the leader), if it is still
    /// `spec` (`AlreadyDone` if it is absent). Unmap its extents first
    /// ([`Store::unmap_extent`]): a mapping left behind would hold its
    /// physical extents for a volume nobody can name.
    pub fn delete_evol(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        spec: &EvolSpec,
    ) -> Result<ChangeOutcome, StoreError> {
        self.delete_if_holds(keys, lead, &keys.spec(&spec.name), encode(spec))
    }

    /// [`Self::guarded_change`] deleting `key` if it still holds `value`;
    /// done once the key is gone.
    fn delete_if_holds(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        key: &str,
        value: String,
    ) -> Result<ChangeOutcome, StoreError> {
        self.guarded_change(
            keys,
            lead,
            key,
            vec![Compare::value(key.to_owned(), CompareOp::Equal, value)],
            vec![TxnOp::delete(key.to_owned(), None)],
            |v| v.is_none(),
        )
    }

    /// One transaction: `ops` if this instance leads and `when` holds;
    /// else, from `key`'s value as read in the same transaction, whether
    /// the change is there already (`done`) or something else is.
    fn guarded_change(
        &self,
        keys: &EvolKeys,
        lead: Leadership,
        key: &str,
        when: Vec<Compare>,
        ops: Vec<TxnOp>,
        done: impl FnOnce(Option<&[u8]>) -> bool,
    ) -> Result<ChangeOutcome, StoreError> {
        let mut guards = vec![leader_guard(keys, lead)];
        guards.extend(when);
        let txn = Txn::new()
            .when(guards)
            .and_then(ops)
            .or_else([TxnOp::get(keys.leader(), None), TxnOp::get(key, None)]);
        let resp = self.txn(txn)?;
        if resp.succeeded() {
            return Ok(ChangeOutcome::Done);
        }
        let r = resp.op_responses();
        if !leader_is(&r, lead) {
            return Ok(ChangeOutcome::NotLeader);
        }
        let value = match r.get(1) {
            Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.value()),
            _ => None,
        };
        Ok(if done(value) {
            ChangeOutcome::AlreadyDone
        } else {
            ChangeOutcome::Changed
        })
    }

    /// Reads the whole eVol layer at one revision (for [`check`], and for
    /// an arbiter taking over: its free sets come from the `pext` keys).
    pub fn read_pool(&self, keys: &EvolKeys) -> Result<PoolView, StoreError> {
        let prefix = format!("{}/", keys.prefix);
        let resp = self.get(&prefix, Some(GetOptions::new().with_prefix()))?;
        let mut v = PoolView {
            revision: resp.header().map_or(0, |h| h.revision()),
            ..PoolView::default()
        };
        let pool = keys.pool();
        let evols = format!("{}/evols/", keys.prefix);
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if let Some(rest) = key.strip_prefix(&pool) {
                match rest.split_once("/pext/") {
                    Some((ns, p)) => {
                        let b: PextRecord = decode(kv.value()).map_err(|e| bad(&key, e))?;
                        let p = p
                            .parse()
                            .map_err(|_| bad(&key, "not an extent index".into()))?;
                        if b.zeroing {
                            v.zeroing.insert((ns.to_owned(), p), b);
                        } else {
                            v.pexts.insert((ns.to_owned(), p), (b.evol, b.index));
                        }
                    }
                    None => {
                        let n: NamespaceRecord = decode(kv.value()).map_err(|e| bad(&key, e))?;
                        v.namespaces.insert(n.id.clone(), n);
                    }
                }
            } else if let Some(rest) = key.strip_prefix(&evols) {
                if rest.ends_with("/spec") {
                    let s: EvolSpec = decode(kv.value()).map_err(|e| bad(&key, e))?;
                    v.evols.insert(s.name.clone(), s);
                } else if rest.contains("/extents/") {
                    v.extents
                        .push(decode(kv.value()).map_err(|e| bad(&key, e))?);
                }
            }
        }
        Ok(v)
    }

    /// Reads eVol `name`'s extent map (what a client caches).
    pub fn read_extents(
        &self,
        keys: &EvolKeys,
        name: &str,
    ) -> Result<Vec<ExtentRecord>, StoreError> {
        let prefix = keys.extents(name);
        let resp = self.get(&prefix, Some(GetOptions::new().with_prefix()))?;
        resp.kvs()
            .iter()
            .map(|kv| decode(kv.value()).map_err(|e| bad(&prefix, e)))
            .collect()
    }
}

fn leader_guard(keys: &EvolKeys, lead: Leadership) -> Compare {
    Compare::create_revision(keys.leader(), CompareOp::Equal, lead.revision)
}

/// Whether the `i`th response of a failed transaction's `or_else` found a key.
fn got_any(r: &[TxnOpResponse], i: usize) -> bool {
    matches!(r.get(i), Some(TxnOpResponse::Get(g)) if !g.kvs().is_empty())
}

/// Whether the leader key in response 0 is still `lead`'s.
fn leader_is(r: &[TxnOpResponse], lead: Leadership) -> bool {
    matches!(r.first(), Some(TxnOpResponse::Get(g))
        if g.kvs().first().is_some_and(|kv| kv.create_revision() == lead.revision))
}

fn bad(key: &str, reason: String) -> StoreError {
    StoreError::BadRecord {
        volume: String::new(),
        key: key.to_owned(),
        reason,
    }
}
