//! The etcd side: a blocking client over `etcd-client` and the guarded
//! transactions that read and change a volume's records
//! ([`crate::records`]).
//!
//! Every call is bounded by the store's operation timeout and fails with
//! [`StoreError::Unreachable`] when no member answers in time (no quorum,
//! no leader, no route): callers decide whether to wait or go on. Requests
//! carry etcd's "require leader" flag, so a member cut off from the quorum
//! refuses at once instead of hanging until the timeout.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::records::{HealthRecord, OwnerRecord, VolumeKeys, VolumeSpec, SCHEMA};

/// Something the store could not do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No member answered in time (or none has a leader).
    #[error("etcd unreachable ({endpoints}): {reason}")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// What failed.
        reason: String,
    },
    /// Another host owns the volume.
    #[error("volume {volume} is owned by {}; stop it there, wait for its lease to expire ({ttl_left_s} s left), or take it over (`ublk-nvmf takeover {volume}`)", .owner.describe())]
    Owned {
        /// The volume.
        volume: String,
        /// Its owner.
        owner: Box<OwnerRecord>,
        /// Seconds left on the owner's lease (-1: unknown).
        ttl_left_s: i64,
    },
    /// The volume's epoch moved on: this host no longer owns it.
    #[error("volume {volume}: no longer owned by this host (epoch {mine}, now {current}{})", .owner.as_ref().map(|o| format!(", owner {}", o.describe())).unwrap_or_default())]
    NotOwner {
        /// The volume.
        volume: String,
        /// The epoch this host attached with.
        mine: u64,
        /// The epoch in etcd.
        current: u64,
        /// The owner now, if any.
        owner: Option<Box<OwnerRecord>>,
    },
    /// The records disagree with this host's config or with each other.
    #[error("volume {volume}: {reason}")]
    Mismatch {
        /// The volume.
        volume: String,
        /// What disagrees.
        reason: String,
    },
    /// A record in etcd is not one this build reads.
    #[error("volume {volume}: key {key}: {reason}")]
    BadRecord {
        /// The volume.
        volume: String,
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// Several attempts lost a race with other writers.
    #[error("volume {volume}: {what}: lost {attempts} races with other writers; try again")]
    Contended {
        /// The volume.
        volume: String,
        /// What was tried.
        what: &'static str,
        /// How often.
        attempts: u32,
    },
}

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `host:port` or `http://host:port` of the members.
    pub endpoints: Vec<String>,
    /// Bound on every call.
    pub op_timeout: Duration,
}

/// A volume's records as read at one revision.
#[derive(Debug, Clone, Default)]
pub struct VolumeView {
    /// The spec, if written.
    pub spec: Option<VolumeSpec>,
    /// The epoch (0: never attached).
    pub epoch: u64,
    /// The epoch key's mod revision (0: absent).
    pub epoch_rev: i64,
    /// The owner, if its lease is alive.
    pub owner: Option<OwnerRecord>,
    /// The owner key's mod revision (0: absent).
    pub owner_rev: i64,
    /// The health record, if written.
    pub health: Option<HealthRecord>,
    /// The health key's mod revision (0: absent).
    pub health_rev: i64,
}

/// An attach that won.
#[derive(Debug, Clone)]
pub struct Attached {
    /// The new epoch.
    pub epoch: u64,
    /// The owner record written (this host).
    pub owner: OwnerRecord,
    /// The owner that held the volume before (a takeover), if any.
    pub previous: Option<OwnerRecord>,
    /// The records as they were just before, with the spec as now in etcd.
    pub view: VolumeView,
}

/// How to attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// Only if nobody owns the volume, or its owner is this very host
    /// (same host NQN: an earlier server of this host died and its lease
    /// has not expired yet; the state directory's lock guarantees that
    /// server is gone).
    Attach,
    /// Also when another host owns it: the new epoch fences it (the caller
    /// preempts its reservations at the targets).
    Takeover,
}

/// A blocking etcd client with its own current-thread runtime.
///
/// One client per member, tried in turn: a request that fails on one
/// member (refused, no leader, no answer in time) goes to the next, and
/// the member that answered is tried first next time. etcd-client's own
/// balanced channel keeps sending to a dead member, so one member down
/// would fail a share of the requests.
pub struct Store {
    rt: tokio::runtime::Runtime,
    clients: Vec<Client>,
    preferred: std::cell::Cell<usize>,
    config: StoreConfig,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Store {
    /// Builds a client per endpoint. Connections are made by the first
    /// request, so this fails only on a malformed endpoint or when no
    /// runtime can be started.
    pub fn connect(config: StoreConfig) -> Result<Self, StoreError> {
        let bad = |reason: String| StoreError::Unreachable {
            endpoints: config.endpoints.join(","),
            reason,
        };
        if config.endpoints.is_empty() {
            return Err(bad("no endpoints".into()));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bad(format!("cannot start the client's runtime: {e}")))?;
        let mut clients = Vec::new();
        for ep in &config.endpoints {
            let opts = ConnectOptions::new()
                .with_connect_timeout(config.op_timeout)
                .with_timeout(config.op_timeout)
                .with_require_leader(true);
            let client = rt
                .block_on(async {
                    tokio::time::timeout(config.op_timeout, Client::connect([ep], Some(opts))).await
                })
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map_err(|e| bad(format!("{ep}: {e}")))?;
            clients.push(client);
        }
        Ok(Self {
            rt,
            clients,
            preferred: std::cell::Cell::new(0),
            config,
        })
    }

    fn unreachable(&self, reason: impl ToString) -> StoreError {
        StoreError::Unreachable {
            endpoints: self.config.endpoints.join(","),
            reason: reason.to_string(),
        }
    }

    /// Runs `f` with each member's client in turn until one answers, each
    /// attempt bounded by the operation timeout.
    fn run<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let first = self.preferred.get();
        let mut errors = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let fut = f(self.clients[i].clone());
            match self
                .rt
                .block_on(async { tokio::time::timeout(self.config.op_timeout, fut).await })
            {
                Ok(Ok(v)) => {
                    self.preferred.set(i);
                    return Ok(v);
                }
                Ok(Err(e)) => errors.push(format!("{}: {e}", self.config.endpoints[i])),
                Err(_) => errors.push(format!(
                    "{}: no answer within {} ms",
                    self.config.endpoints[i],
                    self.config.op_timeout.as_millis()
                )),
            }
        }
        Err(self.unreachable(errors.join("; ")))
    }

    /// One transaction, on whichever member answers.
    pub(crate) fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        self.run(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
    }

    /// One read, on whichever member answers.
    pub(crate) fn get(
        &self,
        key: &str,
        opts: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        self.run(|mut c| {
            let opts = opts.clone();
            async move { c.get(key, opts).await }
        })
    }

    /// Grants a lease of `ttl` (whole seconds, at least 1).
    pub fn grant_lease(&self, ttl: Duration) -> Result<i64, StoreError> {
        let secs = ttl.as_secs().max(1) as i64;
        self.run(|mut c| async move { c.lease_grant(secs, None).await })
            .map(|r| r.id())
    }

    /// Renews `lease` once: the seconds it has left, or `None` if it
    /// expired (etcd forgot it).
    pub fn keep_alive(&self, lease: i64) -> Result<Option<i64>, StoreError> {
        use etcd_client::Error::LeaseKeepAliveError;
        // etcd answers an expired lease with TTL 0 or, through this
        // client, with a "lease not found" keep-alive error: both Some(0).
        let resp = self.run(|mut c| async move {
            let (mut keeper, mut stream) = match c.lease_keep_alive(lease).await {
                Err(LeaseKeepAliveError(_)) => return Ok(Some(0)),
                r => r?,
            };
            keeper.keep_alive().await?;
            match stream.message().await {
                Ok(r) => Ok(r.map(|r| r.ttl())),
                Err(LeaseKeepAliveError(_)) => Ok(Some(0)),
                Err(e) => Err(e),
            }
        })?;
        match resp {
            Some(ttl) if ttl > 0 => Ok(Some(ttl)),
            Some(_) => Ok(None),
            None => Err(self.unreachable("the keep-alive stream closed")),
        }
    }

    /// Seconds left on `lease` (-1: expired or unknown).
    pub fn lease_ttl(&self, lease: i64) -> Result<i64, StoreError> {
        self.run(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .map(|r| r.ttl())
    }

    /// Revokes `lease` (its keys go with it).
    pub fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.run(|mut c| async move { c.lease_revoke(lease).await })
            .map(|_| ())
    }

    /// Reads every record of the volume at one revision.
    pub fn read(&self, keys: &VolumeKeys, volume: &str) -> Result<VolumeView, StoreError> {
        let base = keys.base();
        let resp = self
            .run(|mut c| async move { c.get(base, Some(GetOptions::new().with_prefix())).await })?;
        let mut v = VolumeView::default();
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let bad = |reason: String| StoreError::BadRecord {
                volume: volume.to_owned(),
                key: key.clone(),
                reason,
            };
            if key == keys.spec() {
                v.spec = Some(decode(kv.value()).map_err(bad)?);
            } else if key == keys.epoch() {
                v.epoch = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| bad("not a decimal epoch".into()))?;
                v.epoch_rev = kv.mod_revision();
            } else if key == keys.owner() {
                v.owner = Some(decode(kv.value()).map_err(bad)?);
                v.owner_rev = kv.mod_revision();
            } else if key == keys.health() {
                v.health = Some(decode(kv.value()).map_err(bad)?);
                v.health_rev = kv.mod_revision();
            }
        }
        Ok(v)
    }

    /// Makes this host (`host_nqn`) the volume's owner with a new epoch,
    /// bound to `lease`, creating the spec if absent (else it must match
    /// `spec`). One transaction: the epoch and owner keys are compared
    /// with what was read, so of two hosts racing exactly one wins; the
    /// loser re-reads and gets [`StoreError::Owned`] (or retries, if it
    /// lost to a change that left the volume free).
    pub fn attach(
        &self,
        keys: &VolumeKeys,
        volume: &str,
        spec: &VolumeSpec,
        host_nqn: &str,
        lease: i64,
        mode: AttachMode,
    ) -> Result<Attached, StoreError> {
        const ATTEMPTS: u32 = 5;
        // The owner before this call, as its first read saw it.
        let mut before: Option<Option<OwnerRecord>> = None;
        for _ in 0..ATTEMPTS {
            let view = self.read(keys, volume)?;
            if let Some(o) = view.owner.as_ref().filter(|o| o.lease == lease) {
                if o.host_nqn == host_nqn {
                    // Owned under this call's lease: an attempt committed
                    // whose answer was lost (`run` retried it on another
                    // member, or the caller retried). Taking it again
                    // would bump the epoch a second time and name this
                    // host as its own predecessor.
                    let mut view = view.clone();
                    view.spec = Some(spec.clone());
                    return Ok(Attached {
                        epoch: o.epoch,
                        owner: o.clone(),
                        previous: before.flatten(),
                        view,
                    });
                }
            }
            before.get_or_insert_with(|| view.owner.clone());
            if let Some(s) = &view.spec {
                if let Some(reason) = s.mismatch(spec) {
                    return Err(StoreError::Mismatch {
                        volume: volume.to_owned(),
                        reason,
                    });
                }
            }
            if let Some(o) = &view.owner {
                if o.host_nqn != host_nqn && mode == AttachMode::Attach {
                    let ttl_left_s = self.lease_ttl(o.lease).unwrap_or(-1);
                    return Err(StoreError::Owned {
                        volume: volume.to_owned(),
                        owner: Box::new(o.clone()),
                        ttl_left_s,
                    });
                }
            }
            let epoch = view.epoch + 1;
            let owner = OwnerRecord {
                schema: SCHEMA,
                host_nqn: host_nqn.to_owned(),
                hostname: hostname(),
                pid: std::process::id(),
                epoch,
                lease,
                since_unix: unix_now(),
            };
            let mut when = vec![
                Compare::mod_revision(keys.epoch(), CompareOp::Equal, view.epoch_rev),
                Compare::mod_revision(keys.owner(), CompareOp::Equal, view.owner_rev),
            ];
            let mut ops = vec![
                TxnOp::put(keys.epoch(), epoch.to_string(), None),
                TxnOp::put(
                    keys.owner(),
                    encode(&owner),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ];
            if view.spec.is_none() {
                when.push(Compare::create_revision(keys.spec(), CompareOp::Equal, 0));
                ops.push(TxnOp::put(keys.spec(), encode(spec), None));
            }
            let txn = Txn::new().when(when).and_then(ops);
            let resp = self.run(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })?;
            if resp.succeeded() {
                let previous = view.owner.clone();
                let mut view = view;
                view.spec = Some(spec.clone());
                return Ok(Attached {
                    epoch,
                    owner,
                    previous,
                    view,
                });
            }
        }
        Err(StoreError::Contended {
            volume: volume.to_owned(),
            what: "attach",
            attempts: ATTEMPTS,
        })
    }

    /// Writes `record` if this host still owns the volume at `epoch` and
    /// the record is still the one at `expected_rev` (0: absent); the new
    /// revision. [`StoreError::NotOwner`] if the epoch moved on; a record
    /// changed under us by the same epoch cannot happen (one writer per
    /// epoch) and is reported as [`StoreError::Contended`].
    pub fn put_health(
        &self,
        keys: &VolumeKeys,
        volume: &str,
        epoch: u64,
        expected_rev: i64,
        record: &HealthRecord,
    ) -> Result<i64, StoreError> {
        let txn = Txn::new()
            .when([
                Compare::value(keys.epoch(), CompareOp::Equal, epoch.to_string()),
                Compare::mod_revision(keys.health(), CompareOp::Equal, expected_rev),
            ])
            .and_then([TxnOp::put(keys.health(), encode(record), None)])
            .or_else([TxnOp::get(
                keys.base(),
                Some(GetOptions::new().with_prefix()),
            )]);
        let resp = self.run(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        if resp.succeeded() {
            return Ok(resp.header().map_or(0, |h| h.revision()));
        }
        let view = self.read(keys, volume)?;
        if view.epoch != epoch {
            return Err(StoreError::NotOwner {
                volume: volume.to_owned(),
                mine: epoch,
                current: view.epoch,
                owner: view.owner.map(Box::new),
            });
        }
        if view.health.as_ref() == Some(record) {
            // An earlier attempt committed but its answer was lost (a
            // member timed out after applying it; `run` retried on the
            // next one, whose compare then failed): it is written.
            return Ok(view.health_rev);
        }
        Err(StoreError::Contended {
            volume: volume.to_owned(),
            what: "health record",
            attempts: 1,
        })
    }

    /// Puts the owner record again under `owner.lease` if the epoch is
    /// still `owner.epoch` and nobody owns the volume (this host's lease
    /// expired while it was paused, and nobody took over meanwhile). The
    /// owner record now in etcd: `owner`, or this host's record of the
    /// same epoch under another lease (an earlier reclaim committed whose
    /// answer was lost): the caller keeps that lease alive instead.
    pub fn reclaim(
        &self,
        keys: &VolumeKeys,
        volume: &str,
        owner: &OwnerRecord,
    ) -> Result<OwnerRecord, StoreError> {
        let txn = Txn::new()
            .when([
                Compare::value(keys.epoch(), CompareOp::Equal, owner.epoch.to_string()),
                Compare::create_revision(keys.owner(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                keys.owner(),
                encode(owner),
                Some(PutOptions::new().with_lease(owner.lease)),
            )]);
        let resp = self.run(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        if resp.succeeded() {
            return Ok(owner.clone());
        }
        let view = self.read(keys, volume)?;
        if let Some(o) = view.owner.as_ref().filter(|o| {
            view.epoch == owner.epoch && o.epoch == owner.epoch && o.host_nqn == owner.host_nqn
        }) {
            // An earlier attempt committed (see `put_health`), maybe one
            // of an earlier reclaim under another lease: one server per
            // host serves a volume (its state directory's lock), so a
            // record of this host and epoch is this server's.
            return Ok(o.clone());
        }
        Err(StoreError::NotOwner {
            volume: volume.to_owned(),
            mine: owner.epoch,
            current: view.epoch,
            owner: view.owner.map(Box::new),
        })
    }

    /// Gives the volume up: deletes the owner key if it is still this
    /// epoch's (a clean stop; the next attach need not wait for the lease).
    pub fn release(&self, keys: &VolumeKeys, epoch: u64) -> Result<bool, StoreError> {
        let txn = Txn::new()
            .when([Compare::value(
                keys.epoch(),
                CompareOp::Equal,
                epoch.to_string(),
            )])
            .and_then([TxnOp::delete(keys.owner(), None)]);
        let resp = self.run(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })?;
        Ok(resp.succeeded()
            && resp
                .op_responses()
                .iter()
                .any(|r| matches!(r, TxnOpResponse::Delete(d) if d.deleted() > 0)))
    }

    /// The endpoints, for messages.
    pub fn endpoints(&self) -> String {
        self.config.endpoints.join(",")
    }
}

pub(crate) fn encode<T: Serialize>(v: &T) -> String {
    // Records are plain structs of strings, numbers and booleans.
    serde_json::to_string(v).unwrap_or_default()
}

pub(crate) fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, String> {
    let v: serde_json::Value = serde_json::from_slice(b).map_err(|e| e.to_string())?;
    let schema = v.get("schema").and_then(serde_json::Value::as_u64);
    if schema != Some(u64::from(SCHEMA)) {
        return Err(format!(
            "record schema {schema:?}; this build reads schema {SCHEMA}"
        ));
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}
