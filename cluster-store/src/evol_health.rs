//! Elastic volumes' per-extent health in etcd (issue 18): which copies of
//! a logical extent missed a write and must not serve reads until they
//! are repaired.
//!
//! | key | value | written |
//! |---|---|---|
//! | `PREFIX/evols/NAME/stale/L` | [`StaleRecord`] (extent L's stale copies) | by the eVol's owner, guarded by its attach epoch |
//!
//! The rules, each with its argument:
//!
//! 1. **A copy that missed a write is recorded before the write is
//!    acknowledged** (the client's fan-out holds the write until
//!    [`Store::put_stale`] returns): whoever serves the volume next,
//!    after a crash included, reads the record and never reads that copy
//!    before it is repaired.
//! 2. **Only the owner writes.** Every put and delete compares the
//!    volume's epoch key (`PREFIX/volumes/NAME/epoch`, bumped by every
//!    attach and takeover) with the writer's epoch, as cluster mode's
//!    health record does: a deposed owner, which may not know yet, can
//!    neither add nor clear a mark (a clear by it could otherwise make a
//!    copy the new owner is writing without look current).
//! 3. **A mark is cleared only after the repair**: the owner deletes the
//!    key (or rewrites it without the repaired copy) once the copy holds
//!    the extent's bytes again; a mark left behind is only conservative
//!    (the next owner repairs the copy once more).
//! 4. **Each write compares the mark's revision** as its writer last left
//!    it ([`Store::put_stale`]): an attempt that timed out yet commits
//!    late cannot erase a newer mark.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::evol::{EvolKeys, Placement};
use crate::records::{VolumeKeys, SCHEMA};
use crate::store::{decode, encode, Store, StoreError};

/// Logical extent `index` of eVol `evol` and its copies that missed a
/// write.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StaleRecord {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The eVol.
    pub evol: String,
    /// Its logical index.
    pub index: u64,
    /// The copies that missed a write (never empty: an extent with none
    /// has no key).
    pub copies: Vec<Placement>,
}

/// eVol `name`'s stale marks (prefix).
pub fn stale_prefix(keys: &EvolKeys, name: &str) -> String {
    // `spec` is `PREFIX/evols/NAME/spec`.
    let spec = keys.spec(name);
    format!("{}stale/", spec.strip_suffix("spec").unwrap_or(&spec))
}

/// Logical extent `l`'s stale mark (zero-padded, like the extent keys).
pub fn stale_key(keys: &EvolKeys, name: &str, l: u64) -> String {
    format!("{}{l:012}", stale_prefix(keys, name))
}

impl Store {
    /// Records `copies` as extent `index`'s stale copies (replacing the
    /// mark, if any; none: deletes it), if the volume's epoch is still
    /// `epoch` (rule 2) and the key is still at `expected` (its mod
    /// revision as this writer last left it, 0: absent; `None`: unknown,
    /// read first). Returns the revision to expect next.
    ///
    /// Why the revision: an attempt that timed out may still commit, late
    /// (`Store::run` retries on the next member; the caller retries
    /// after an error). Unguarded, a clear delayed so could land after a
    /// newer mark and erase it, and a write that missed that copy would
    /// have been acknowledged on a mark that is gone. With the guard the
    /// late attempt finds the key moved on and does nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn put_stale(
        &self,
        vkeys: &VolumeKeys,
        keys: &EvolKeys,
        evol: &str,
        epoch: u64,
        index: u64,
        copies: &[Placement],
        expected: Option<i64>,
    ) -> Result<i64, StoreError> {
        const ATTEMPTS: u32 = 4;
        let key = stale_key(keys, evol, index);
        let rec = (!copies.is_empty()).then(|| StaleRecord {
            schema: SCHEMA,
            evol: evol.to_owned(),
            index,
            copies: copies.to_vec(),
        });
        let want = rec.as_ref().map(encode);
        let mut expected = match expected {
            Some(r) => r,
            None => self
                .get(&key, None)?
                .kvs()
                .first()
                .map_or(0, |kv| kv.mod_revision()),
        };
        for _ in 0..ATTEMPTS {
            let op = match &want {
                None => TxnOp::delete(key.clone(), None),
                Some(v) => TxnOp::put(key.clone(), v.clone(), None),
            };
            let txn = Txn::new()
                .when([
                    Compare::value(vkeys.epoch(), CompareOp::Equal, epoch.to_string()),
                    Compare::mod_revision(key.clone(), CompareOp::Equal, expected),
                ])
                .and_then([op])
                .or_else([
                    TxnOp::get(vkeys.epoch(), None),
                    TxnOp::get(key.clone(), None),
                ]);
            let resp = self.txn(txn)?;
            if resp.succeeded() {
                return Ok(match want {
                    None => 0,
                    Some(_) => resp.header().map_or(0, |h| h.revision()),
                });
            }
            let r = resp.op_responses();
            let current = match r.first() {
                Some(etcd_client::TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
                    .unwrap_or(0),
                _ => 0,
            };
            if current != epoch {
                return Err(StoreError::NotOwner {
                    volume: evol.to_owned(),
                    mine: epoch,
                    current,
                    owner: None,
                });
            }
            let found = match r.get(1) {
                Some(etcd_client::TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
                _ => None,
            };
            match (found, &want) {
                // What this call writes is there: an attempt of it
                // committed whose answer was lost.
                (None, None) => return Ok(0),
                (Some((v, rev)), Some(w)) if v == w.as_bytes() => return Ok(rev),
                // Only this epoch's owner writes the key: what is there
                // is an earlier state of ours, landed late or unknown to
                // the caller. Ours is newer: write it over that one.
                (found, _) => expected = found.map_or(0, |(_, rev)| rev),
            }
        }
        Err(StoreError::Contended {
            volume: evol.to_owned(),
            what: "stale mark",
            attempts: ATTEMPTS,
        })
    }

    /// eVol `name`'s stale marks (what its next owner starts from).
    pub fn read_stale(&self, keys: &EvolKeys, name: &str) -> Result<Vec<StaleRecord>, StoreError> {
        let prefix = stale_prefix(keys, name);
        let resp = self.get(&prefix, Some(GetOptions::new().with_prefix()))?;
        resp.kvs()
            .iter()
            .map(|kv| {
                decode(kv.value()).map_err(|reason| StoreError::BadRecord {
                    volume: name.to_owned(),
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    reason,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sit_beside_the_extent_map() {
        let k = EvolKeys::new("/p/");
        assert_eq!(stale_prefix(&k, "v"), "/p/evols/v/stale/");
        assert_eq!(stale_key(&k, "v", 3), "/p/evols/v/stale/000000000003");
    }
}
