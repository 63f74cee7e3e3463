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
    /// `epoch` (rule 2).
    pub fn put_stale(
        &self,
        vkeys: &VolumeKeys,
        keys: &EvolKeys,
        evol: &str,
        epoch: u64,
        index: u64,
        copies: &[Placement],
    ) -> Result<(), StoreError> {
        let key = stale_key(keys, evol, index);
        let op = if copies.is_empty() {
            TxnOp::delete(key, None)
        } else {
            let rec = StaleRecord {
                schema: SCHEMA,
                evol: evol.to_owned(),
                index,
                copies: copies.to_vec(),
            };
            TxnOp::put(key, encode(&rec), None)
        };
        let txn = Txn::new()
            .when([Compare::value(
                vkeys.epoch(),
                CompareOp::Equal,
                epoch.to_string(),
            )])
            .and_then([op])
            .or_else([TxnOp::get(vkeys.epoch(), None)]);
        let resp = self.txn(txn)?;
        if resp.succeeded() {
            return Ok(());
        }
        let current = match resp.op_responses().first() {
            Some(etcd_client::TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
                .unwrap_or(0),
            _ => 0,
        };
        Err(StoreError::NotOwner {
            volume: evol.to_owned(),
            mine: epoch,
            current,
            owner: None,
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
