//! The bandwidth auction (§4.6, Algorithms 3 and 4): the arbiter shares
//! each namespace's bandwidth among the sessions that use it, in slices,
//! epoch by epoch; a client admits an I/O only while it holds a slice with
//! room, and asks for the next one before it runs out.
//!
//! Arbiter side, [`Auction`] (sans-IO; call order):
//! 1. [`add_namespace`] / [`add_port`] with their capacities (re-add to
//!    update, e.g. from the view's estimate), [`add_session`],
//!    [`set_volume_weight`];
//! 2. [`handle_request`] for each slice request, [`handle_release`] when a
//!    client says its session went idle;
//! 3. [`handle_timeout`] when `now` reaches [`poll_timeout`] (epoch end);
//! 4. [`poll_grant`] until `None`, sending each grant to its client.
//!
//! Client side, [`ClientSlices`] (one per session and namespace):
//! [`ClientSlices::try_admit`] is the fast path (no network while the
//! slices have room); [`ClientSlices::poll_request`] says when to ask for
//! the next slice; [`ClientSlices::on_grant`] adds it.
//!
//! [`add_namespace`]: Auction::add_namespace
//! [`add_port`]: Auction::add_port
//! [`add_session`]: Auction::add_session
//! [`set_volume_weight`]: Auction::set_volume_weight
//! [`handle_request`]: Auction::handle_request
//! [`handle_release`]: Auction::handle_release
//! [`handle_timeout`]: Auction::handle_timeout
//! [`poll_timeout`]: Auction::poll_timeout
//! [`poll_grant`]: Auction::poll_grant
//!
//! Decisions where the paper is vague:
//! - **Currency.** Slices are in cost-weighted bytes, the device time an
//!   I/O takes at the namespace's profile ([`cost_bytes`]): a read of `b`
//!   bytes costs `max(b, bandwidth / IOPS)`, a write that times the view's
//!   write cost. So 4 KiB reads, 128 KiB reads and writes share a drive by
//!   the time they take from it, not by bytes or commands.
//! - **"reassign_quota" is weighted max-min (water-filling)** over two
//!   resources at once, every namespace and every port (the gang
//!   scheduling of §4.6: a session needs both its drive and its port).
//!   At each epoch's start every active flow (session, namespace) gets a
//!   quota: flows rise together in proportion to their weights until a
//!   flow reaches its demand or a namespace or port is full. The demand of
//!   a flow that was held back last epoch is unbounded; otherwise it is
//!   what it was granted last epoch plus `growth_slices`, so a light flow
//!   keeps what it needs and leaves the rest to others (Flint's "a small
//!   volume can still receive more bandwidth if it has more pending I/Os,
//!   whereas a large volume cannot take more than its (weighted) equal
//!   share").
//! - **The DRR** is the per-flow deficit: each epoch adds the flow's quota
//!   (its quantum, proportional to its weight); a slice is granted when
//!   the deficit covers it and the namespace and port still have budget.
//!   At most one slice of unused deficit carries over (no banking across
//!   idle epochs). Requests that cannot be granted wait on the deferred
//!   list and are served in round-robin order at the next epoch.
//!   Capacity no quota claimed (every flow satisfied) is granted first
//!   come first served within the epoch, so the auction is work-conserving.
//! - **Weights are per volume**: a flow's weight is its volume's weight
//!   divided among the volume's active flows on the namespace.
//! - **Idle**: a flow that made no request for `idle_epochs` epochs goes
//!   idle (Algorithm 4's idle list) and its share goes to the others; a
//!   client may also release at once ([`Auction::handle_release`]).
//! - **Slices expire** at the end of the epoch after the one that granted
//!   them, so bandwidth not used soon returns to the pool. A client may
//!   overdraw its slices by one I/O (an I/O larger than the room left
//!   still goes when there is some room), paid from the next slice: a
//!   slice smaller than an I/O must not block that I/O forever.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::error::{FlintError, Result};
use crate::ids::{NamespaceId, PortId, SessionId, VolumeId};
use crate::{IoKind, Nanos};

/// Parameters of the auction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuctionConfig {
    /// Length of an epoch, nanoseconds. Default 1 ms.
    pub epoch_ns: u64,
    /// Size of a slice in cost-weighted bytes. Default 256 KiB.
    pub slice_bytes: u64,
    /// Epochs without a request after which a flow is idle. Default 4.
    pub idle_epochs: u64,
    /// Slices of growth a satisfied flow's demand estimate allows. Default 2.
    pub growth_slices: u64,
    /// Most flows (session, namespace) the auction tracks. Default 65536.
    pub max_flows: usize,
}

impl Default for AuctionConfig {
    fn default() -> Self {
        AuctionConfig {
            epoch_ns: 1_000_000,
            slice_bytes: 256 * 1024,
            idle_epochs: 4,
            growth_slices: 2,
            max_flows: 65_536,
        }
    }
}

impl AuctionConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<()> {
        if self.epoch_ns == 0 {
            return Err(FlintError::invalid("epoch_ns", "must be positive"));
        }
        if self.slice_bytes == 0 {
            return Err(FlintError::invalid("slice_bytes", "must be positive"));
        }
        if self.idle_epochs == 0 {
            return Err(FlintError::invalid("idle_epochs", "must be at least 1"));
        }
        if self.max_flows == 0 {
            return Err(FlintError::invalid("max_flows", "must be at least 1"));
        }
        Ok(())
    }
}

/// The cost of an I/O in the auction's currency: device time at the
/// namespace's profile, as bytes of large reads (see the module docs).
/// `min_cost_bytes` is the profile's bandwidth / IOPS.
pub fn cost_bytes(kind: IoKind, bytes: u64, min_cost_bytes: u64, write_cost: f64) -> u64 {
    let read_cost = bytes.max(min_cost_bytes);
    match kind {
        IoKind::Read => read_cost,
        IoKind::Write => (read_cost as f64 * write_cost.max(1.0)).ceil() as u64,
    }
}

/// A client's request for a slice of one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRequest {
    /// The session asking.
    pub session: SessionId,
    /// The namespace it wants bandwidth of.
    pub namespace: NamespaceId,
}

/// A slice granted to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The session.
    pub session: SessionId,
    /// The namespace.
    pub namespace: NamespaceId,
    /// Cost-weighted bytes it may send.
    pub bytes: u64,
    /// The epoch that granted it.
    pub epoch: u64,
    /// When it stops being valid.
    #[serde(with = "crate::ids::nanos_serde")]
    pub expires_at: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct FlowKey {
    namespace: NamespaceId,
    session: SessionId,
}

#[derive(Clone, Debug, PartialEq)]
struct Flow {
    deficit: u64,
    quota: u64,
    pending: bool,
    held_back: bool,
    granted_this_epoch: u64,
    granted_last_epoch: u64,
    held_back_last_epoch: bool,
    last_request_epoch: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct Budget {
    bytes_per_sec: u64,
    /// What is left of this epoch's budget.
    remaining: u64,
    /// What no quota claimed this epoch (first come, first served).
    unclaimed: u64,
}

impl Budget {
    fn per_epoch(&self, epoch_ns: u64) -> u64 {
        (u128::from(self.bytes_per_sec) * u128::from(epoch_ns) / 1_000_000_000) as u64
    }
}

#[derive(Clone, Debug, PartialEq)]
struct SessionInfo {
    port: PortId,
    volume: VolumeId,
}

/// What a flow got, for status and tests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowStatus {
    /// This epoch's quota, cost-weighted bytes.
    pub quota: u64,
    /// Deficit left, cost-weighted bytes.
    pub deficit: u64,
    /// Granted this epoch.
    pub granted_this_epoch: u64,
    /// A request is waiting.
    pub pending: bool,
}

/// The arbiter side of the auction.
#[derive(Clone, Debug, PartialEq)]
pub struct Auction {
    config: AuctionConfig,
    namespaces: BTreeMap<NamespaceId, Budget>,
    ports: BTreeMap<PortId, Budget>,
    sessions: BTreeMap<SessionId, SessionInfo>,
    weights: BTreeMap<VolumeId, u32>,
    flows: BTreeMap<FlowKey, Flow>,
    /// Flows with a request waiting, in round-robin order.
    deferred: VecDeque<FlowKey>,
    grants: VecDeque<Grant>,
    epoch: u64,
    epoch_start: Nanos,
}

impl Auction {
    /// An auction whose first epoch starts at `now`.
    pub fn new(config: AuctionConfig, now: Nanos) -> Result<Self> {
        config.validate()?;
        Ok(Auction {
            config,
            namespaces: BTreeMap::new(),
            ports: BTreeMap::new(),
            sessions: BTreeMap::new(),
            weights: BTreeMap::new(),
            flows: BTreeMap::new(),
            deferred: VecDeque::new(),
            grants: VecDeque::new(),
            epoch: 0,
            epoch_start: now,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AuctionConfig {
        &self.config
    }

    /// Adds a namespace, or updates its capacity (cost-weighted bytes per
    /// second) from the next epoch on.
    pub fn add_namespace(&mut self, namespace: NamespaceId, bytes_per_sec: u64) {
        self.namespaces
            .entry(namespace)
            .and_modify(|b| b.bytes_per_sec = bytes_per_sec)
            .or_insert(Budget {
                bytes_per_sec,
                remaining: 0,
                unclaimed: 0,
            });
    }

    /// Adds a port, or updates its capacity (bytes per second).
    pub fn add_port(&mut self, port: PortId, bytes_per_sec: u64) {
        self.ports
            .entry(port)
            .and_modify(|b| b.bytes_per_sec = bytes_per_sec)
            .or_insert(Budget {
                bytes_per_sec,
                remaining: 0,
                unclaimed: 0,
            });
    }

    /// Adds a session of `volume` through a known port.
    pub fn add_session(
        &mut self,
        session: SessionId,
        port: PortId,
        volume: VolumeId,
    ) -> Result<()> {
        if !self.ports.contains_key(&port) {
            return Err(FlintError::UnknownPort(port));
        }
        self.sessions.insert(session, SessionInfo { port, volume });
        Ok(())
    }

    /// Removes a session and its flows.
    pub fn remove_session(&mut self, session: SessionId) {
        self.sessions.remove(&session);
        self.flows.retain(|k, _| k.session != session);
        self.deferred.retain(|k| k.session != session);
    }

    /// Sets a volume's weight (default 1; 0 is treated as 1).
    pub fn set_volume_weight(&mut self, volume: VolumeId, weight: u32) {
        self.weights.insert(volume, weight.max(1));
    }

    /// The epoch in progress (0 until the first [`handle_timeout`](Self::handle_timeout)).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// When the epoch in progress ends.
    pub fn poll_timeout(&self) -> Nanos {
        self.epoch_start.saturating_add_nanos(self.config.epoch_ns)
    }

    fn expires_at(&self) -> Nanos {
        self.epoch_start
            .saturating_add_nanos(2 * self.config.epoch_ns)
    }

    /// A session asks for a slice of `namespace`. Granted at once when its
    /// deficit (or unclaimed capacity) and the budgets allow, else at a
    /// later epoch; see [`poll_grant`](Self::poll_grant).
    pub fn handle_request(&mut self, _now: Nanos, request: SliceRequest) -> Result<()> {
        if !self.namespaces.contains_key(&request.namespace) {
            return Err(FlintError::UnknownNamespace(request.namespace));
        }
        if !self.sessions.contains_key(&request.session) {
            return Err(FlintError::UnknownSession(request.session));
        }
        let key = FlowKey {
            namespace: request.namespace,
            session: request.session,
        };
        if !self.flows.contains_key(&key) {
            if self.flows.len() >= self.config.max_flows {
                return Err(FlintError::NoRoom(format!(
                    "the auction tracks at most {} flows",
                    self.config.max_flows
                )));
            }
            self.flows.insert(
                key,
                Flow {
                    deficit: 0,
                    quota: 0,
                    pending: false,
                    held_back: false,
                    granted_this_epoch: 0,
                    granted_last_epoch: 0,
                    held_back_last_epoch: true,
                    last_request_epoch: self.epoch,
                },
            );
        }
        let flow = self.flows.get_mut(&key).expect("inserted above");
        flow.last_request_epoch = self.epoch;
        if flow.pending {
            // One outstanding request per flow: a repeat changes nothing.
            return Ok(());
        }
        flow.pending = true;
        if !self.try_grant(key) {
            self.flows.get_mut(&key).expect("exists").held_back = true;
            self.deferred.push_back(key);
        }
        Ok(())
    }

    /// A client's session no longer needs `namespace`: its flow goes idle
    /// now (Algorithm 3's release), its share to the others next epoch.
    pub fn handle_release(&mut self, session: SessionId, namespace: NamespaceId) {
        let key = FlowKey { namespace, session };
        self.flows.remove(&key);
        self.deferred.retain(|k| *k != key);
    }

    /// Grants a slice to `key` if its deficit or the unclaimed capacity
    /// and both budgets allow.
    fn try_grant(&mut self, key: FlowKey) -> bool {
        let slice = self.config.slice_bytes;
        let port = self.sessions[&key.session].port;
        let ns_budget = &self.namespaces[&key.namespace];
        let port_budget = &self.ports[&port];
        if ns_budget.remaining < slice || port_budget.remaining < slice {
            return false;
        }
        let flow = &self.flows[&key];
        let from_unclaimed = flow.deficit < slice;
        if from_unclaimed && (ns_budget.unclaimed < slice || port_budget.unclaimed < slice) {
            return false;
        }
        let ns_budget = self.namespaces.get_mut(&key.namespace).expect("checked");
        ns_budget.remaining -= slice;
        if from_unclaimed {
            ns_budget.unclaimed -= slice;
        }
        let port_budget = self.ports.get_mut(&port).expect("checked");
        port_budget.remaining -= slice;
        if from_unclaimed {
            port_budget.unclaimed -= slice;
        }
        let flow = self.flows.get_mut(&key).expect("checked");
        if !from_unclaimed {
            flow.deficit -= slice;
        }
        flow.pending = false;
        flow.granted_this_epoch += slice;
        let grant = Grant {
            session: key.session,
            namespace: key.namespace,
            bytes: slice,
            epoch: self.epoch,
            expires_at: self.expires_at(),
        };
        self.grants.push_back(grant);
        true
    }

    /// Ends every epoch that ended by `now` and starts the next: idle
    /// flows drop out, quotas are reassigned, deferred requests served.
    pub fn handle_timeout(&mut self, now: Nanos) {
        // A long silence is one epoch boundary: the quotas depend on the
        // last epoch's grants only.
        if now < self.poll_timeout() {
            return;
        }
        let epochs = now.nanos_since(self.epoch_start) / self.config.epoch_ns;
        self.epoch_start = Nanos(self.epoch_start.as_nanos() + epochs * self.config.epoch_ns);
        self.epoch += 1;
        let epoch = self.epoch;
        let idle_epochs = self.config.idle_epochs;
        self.flows
            .retain(|_, f| f.pending || epoch.saturating_sub(f.last_request_epoch) <= idle_epochs);
        let flows = &self.flows;
        self.deferred.retain(|k| flows.contains_key(k));
        for f in self.flows.values_mut() {
            f.granted_last_epoch = f.granted_this_epoch;
            f.held_back_last_epoch = f.held_back || f.pending;
            f.granted_this_epoch = 0;
            f.held_back = f.pending;
        }
        self.reassign_quota();
        // Serve the deferred requests round-robin: one slice per flow per
        // pass, so a flow with a large deficit cannot take every slice
        // before the others got one.
        let mut waiting: VecDeque<FlowKey> = std::mem::take(&mut self.deferred);
        let mut still = VecDeque::new();
        while let Some(key) = waiting.pop_front() {
            let Some(flow) = self.flows.get(&key) else {
                continue;
            };
            if !flow.pending {
                continue;
            }
            if !self.try_grant(key) {
                still.push_back(key);
            }
        }
        self.deferred = still;
    }

    /// Weighted max-min over namespaces and ports (see the module docs).
    fn reassign_quota(&mut self) {
        let epoch_ns = self.config.epoch_ns;
        let slice = self.config.slice_bytes;
        for b in self.namespaces.values_mut().chain(self.ports.values_mut()) {
            b.remaining = b.per_epoch(epoch_ns);
        }
        let keys: Vec<FlowKey> = self.flows.keys().copied().collect();
        let mut per_volume_ns: BTreeMap<(VolumeId, NamespaceId), u32> = BTreeMap::new();
        for k in &keys {
            *per_volume_ns
                .entry((self.sessions[&k.session].volume, k.namespace))
                .or_insert(0) += 1;
        }
        let weight = |k: &FlowKey| {
            let volume = self.sessions[&k.session].volume;
            let w = f64::from(self.weights.get(&volume).copied().unwrap_or(1));
            w / f64::from(per_volume_ns[&(volume, k.namespace)])
        };
        let weights: Vec<f64> = keys.iter().map(weight).collect();
        let demands: Vec<f64> = keys
            .iter()
            .map(|k| {
                let f = &self.flows[k];
                if f.held_back_last_epoch {
                    f64::INFINITY
                } else {
                    (f.granted_last_epoch + self.config.growth_slices * slice) as f64
                }
            })
            .collect();
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        enum Resource {
            Namespace(NamespaceId),
            Port(PortId),
        }
        let resources_of = |k: &FlowKey| {
            [
                Resource::Namespace(k.namespace),
                Resource::Port(self.sessions[&k.session].port),
            ]
        };
        let mut capacity: BTreeMap<Resource, f64> = BTreeMap::new();
        for (id, b) in &self.namespaces {
            capacity.insert(Resource::Namespace(*id), b.per_epoch(epoch_ns) as f64);
        }
        for (id, b) in &self.ports {
            capacity.insert(Resource::Port(*id), b.per_epoch(epoch_ns) as f64);
        }
        let mut rate = vec![0.0f64; keys.len()];
        let mut frozen = vec![false; keys.len()];
        // Each pass freezes at least one flow: at most `keys.len()` passes.
        for _ in 0..keys.len() {
            let mut used: BTreeMap<Resource, f64> = BTreeMap::new();
            let mut live_weight: BTreeMap<Resource, f64> = BTreeMap::new();
            for (i, k) in keys.iter().enumerate() {
                for r in resources_of(k) {
                    if frozen[i] {
                        *used.entry(r).or_insert(0.0) += rate[i];
                    } else {
                        *live_weight.entry(r).or_insert(0.0) += weights[i];
                    }
                }
            }
            if live_weight.is_empty() {
                break;
            }
            // The level (rate per unit of weight) at which the first
            // resource fills or the first flow is satisfied.
            let mut level = f64::INFINITY;
            for (r, w) in &live_weight {
                let left = (capacity[r] - used.get(r).copied().unwrap_or(0.0)).max(0.0);
                level = level.min(left / w);
            }
            for i in 0..keys.len() {
                if !frozen[i] {
                    level = level.min(demands[i] / weights[i]);
                }
            }
            let full: BTreeSet<Resource> = live_weight
                .iter()
                .filter(|(r, w)| {
                    let left = (capacity[*r] - used.get(*r).copied().unwrap_or(0.0)).max(0.0);
                    left / **w <= level * (1.0 + 1e-9)
                })
                .map(|(r, _)| *r)
                .collect();
            for (i, k) in keys.iter().enumerate() {
                if frozen[i] {
                    continue;
                }
                let satisfied = demands[i] / weights[i] <= level * (1.0 + 1e-9);
                if satisfied || resources_of(k).iter().any(|r| full.contains(r)) {
                    rate[i] = (weights[i] * level).min(demands[i]);
                    frozen[i] = true;
                }
            }
        }
        let mut claimed: BTreeMap<Resource, u64> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            let quota = rate[i].floor() as u64;
            for r in resources_of(k) {
                *claimed.entry(r).or_insert(0) += quota;
            }
            let f = self.flows.get_mut(k).expect("key from the map");
            f.quota = quota;
            // DRR: the quantum is the quota; at most one slice carries over.
            f.deficit = f.deficit.min(slice) + quota;
        }
        for (id, b) in self.namespaces.iter_mut() {
            let c = claimed.get(&Resource::Namespace(*id)).copied().unwrap_or(0);
            b.unclaimed = b.remaining.saturating_sub(c);
        }
        for (id, b) in self.ports.iter_mut() {
            let c = claimed.get(&Resource::Port(*id)).copied().unwrap_or(0);
            b.unclaimed = b.remaining.saturating_sub(c);
        }
    }

    /// The next grant to send.
    pub fn poll_grant(&mut self) -> Option<Grant> {
        self.grants.pop_front()
    }

    /// Flows tracked (active or deferred).
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// The state of a flow.
    pub fn flow(&self, session: SessionId, namespace: NamespaceId) -> Option<FlowStatus> {
        self.flows
            .get(&FlowKey { namespace, session })
            .map(|f| FlowStatus {
                quota: f.quota,
                deficit: f.deficit,
                granted_this_epoch: f.granted_this_epoch,
                pending: f.pending,
            })
    }
}

/// What [`ClientSlices::try_admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The slices had room: send the I/O (fast path, no network).
    Admitted,
    /// No room: wait for a grant (see [`ClientSlices::poll_request`]).
    Wait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HeldSlice {
    bytes: u64,
    expires_at: Nanos,
}

/// The client side of the auction for one session and namespace
/// (Algorithm 3): the slices it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSlices {
    session: SessionId,
    namespace: NamespaceId,
    /// Ask for the next slice when the room falls below this.
    low_water_bytes: u64,
    slices: VecDeque<HeldSlice>,
    /// Overdraw to pay from the next slice.
    debt: u64,
    requested: bool,
    admitted: u64,
    waited: u64,
}

impl ClientSlices {
    /// No slices yet; asks for the next one when fewer than
    /// `low_water_bytes` are left (e.g. one slice, so the next grant
    /// arrives while the current slice drains).
    pub fn new(session: SessionId, namespace: NamespaceId, low_water_bytes: u64) -> Self {
        ClientSlices {
            session,
            namespace,
            low_water_bytes,
            slices: VecDeque::new(),
            debt: 0,
            requested: false,
            admitted: 0,
            waited: 0,
        }
    }

    fn expire(&mut self, now: Nanos) {
        self.slices.retain(|s| s.expires_at > now);
    }

    /// Cost-weighted bytes left in unexpired slices (after the debt).
    pub fn room(&mut self, now: Nanos) -> u64 {
        self.expire(now);
        let held: u64 = self.slices.iter().map(|s| s.bytes).sum();
        held.saturating_sub(self.debt)
    }

    /// The fast path: admits an I/O of `cost` cost-weighted bytes if the
    /// slices have any room (the overdraw is paid from the next slice).
    pub fn try_admit(&mut self, now: Nanos, cost: u64) -> Admission {
        if self.room(now) == 0 {
            self.waited += 1;
            return Admission::Wait;
        }
        let mut owed = cost + self.debt;
        self.debt = 0;
        while owed > 0 {
            match self.slices.front_mut() {
                Some(s) if s.bytes > owed => {
                    s.bytes -= owed;
                    owed = 0;
                }
                Some(s) => {
                    owed -= s.bytes;
                    self.slices.pop_front();
                }
                None => {
                    self.debt = owed;
                    owed = 0;
                }
            }
        }
        self.admitted += 1;
        Admission::Admitted
    }

    /// The request to send, if the room is below the low-water mark and no
    /// request is outstanding.
    pub fn poll_request(&mut self, now: Nanos) -> Option<SliceRequest> {
        if self.requested || self.room(now) >= self.low_water_bytes.max(1) {
            return None;
        }
        self.requested = true;
        Some(SliceRequest {
            session: self.session,
            namespace: self.namespace,
        })
    }

    /// A grant arrived (a stale or expired one is ignored).
    pub fn on_grant(&mut self, now: Nanos, grant: &Grant) {
        if grant.session != self.session || grant.namespace != self.namespace {
            return;
        }
        self.requested = false;
        if grant.expires_at > now {
            // An overdraw is paid from the next slice as it arrives: a
            // debt larger than the slices one answer brings must not keep
            // the room at zero while those slices expire unused.
            let pay = self.debt.min(grant.bytes);
            self.debt -= pay;
            if grant.bytes > pay {
                self.slices.push_back(HeldSlice {
                    bytes: grant.bytes - pay,
                    expires_at: grant.expires_at,
                });
            }
        }
    }

    /// The session goes idle: drops its slices; tell the arbiter with
    /// [`Auction::handle_release`].
    pub fn release(&mut self) {
        self.slices.clear();
        self.debt = 0;
        self.requested = false;
    }

    /// I/Os admitted and admissions refused so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.admitted, self.waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SLICE: u64 = 256 * 1024;

    /// One namespace, a port that never limits, sessions 0..n of volumes
    /// 0..n; 100 ms epochs so a namespace of 1 GB/s has 381 slices each.
    fn auction(sessions: u32, ns_bytes_per_sec: u64) -> Auction {
        let mut a = Auction::new(
            AuctionConfig {
                epoch_ns: 100 * MS,
                ..AuctionConfig::default()
            },
            Nanos::ZERO,
        )
        .unwrap();
        a.add_namespace(NamespaceId(0), ns_bytes_per_sec);
        a.add_port(PortId(0), 100 * ns_bytes_per_sec);
        for s in 0..sessions {
            a.add_session(SessionId(s), PortId(0), VolumeId(s)).unwrap();
        }
        a
    }

    /// Every session keeps one request outstanding (greedy clients) for
    /// `epochs` epochs; returns bytes granted per session.
    fn run_greedy(a: &mut Auction, sessions: u32, epochs: u64) -> Vec<u64> {
        let mut granted = vec![0u64; sessions as usize];
        let req = |s| SliceRequest {
            session: SessionId(s),
            namespace: NamespaceId(0),
        };
        for s in 0..sessions {
            a.handle_request(Nanos::ZERO, req(s)).unwrap();
        }
        for e in 1..=epochs {
            let now = Nanos(e * 100 * MS);
            a.handle_timeout(now);
            // Each grant is answered by a new request at once, until the
            // auction stops granting within this epoch.
            while let Some(g) = a.poll_grant() {
                granted[g.session.0 as usize] += g.bytes;
                a.handle_request(now, req(g.session.0)).unwrap();
            }
        }
        granted
    }

    #[test]
    fn cost_charges_small_reads_by_iops_and_writes_by_cost() {
        assert_eq!(cost_bytes(IoKind::Read, 4096, 8000, 3.0), 8000);
        assert_eq!(cost_bytes(IoKind::Read, 131072, 8000, 3.0), 131072);
        assert_eq!(cost_bytes(IoKind::Write, 131072, 8000, 2.5), 327680);
    }

    #[test]
    fn equal_weights_share_equally_and_weights_proportionally() {
        // 100 ms epochs of 1 GB/s: 100 MB per epoch, 381 slices.
        let mut a = auction(3, 1_000_000_000);
        let g = run_greedy(&mut a, 3, 10);
        let (min, max) = (g.iter().min().unwrap(), g.iter().max().unwrap());
        assert!(max - min <= 2 * SLICE, "{g:?}");
        let total: u64 = g.iter().sum();
        assert!(
            total <= 10 * 100_000_000 + SLICE,
            "never more than the budget: {g:?}"
        );
        assert!(total >= 9 * 100_000_000, "{g:?}");

        let mut a = auction(3, 1_000_000_000);
        a.set_volume_weight(VolumeId(1), 2);
        a.set_volume_weight(VolumeId(2), 4);
        let g = run_greedy(&mut a, 3, 10);
        let total: f64 = g.iter().sum::<u64>() as f64;
        for (i, want) in [1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0].iter().enumerate() {
            let share = g[i] as f64 / total;
            assert!((share - want).abs() / want < 0.05, "{g:?}");
        }
    }

    #[test]
    fn a_light_flow_keeps_its_demand_and_the_rest_goes_to_the_greedy() {
        let mut a = auction(2, 1_000_000_000);
        let req = |s| SliceRequest {
            session: SessionId(s),
            namespace: NamespaceId(0),
        };
        let mut granted = [0u64; 2];
        a.handle_request(Nanos::ZERO, req(0)).unwrap();
        a.handle_request(Nanos::ZERO, req(1)).unwrap();
        for e in 1..=10u64 {
            let now = Nanos(e * 100 * MS);
            a.handle_timeout(now);
            // Session 1 wants 10 slices per epoch, session 0 all it can get.
            let mut light = 0;
            if e > 1 {
                a.handle_request(now, req(1)).unwrap();
            }
            while let Some(g) = a.poll_grant() {
                granted[g.session.0 as usize] += g.bytes;
                if g.session.0 == 0 {
                    a.handle_request(now, req(0)).unwrap();
                } else {
                    light += 1;
                    if light < 10 {
                        a.handle_request(now, req(1)).unwrap();
                    }
                }
            }
        }
        // The light one got its 10 slices per epoch, the greedy one the
        // rest of 381 per epoch: max-min, work-conserving.
        let light_slices = granted[1] / SLICE;
        assert!((90..=101).contains(&light_slices), "{granted:?}");
        assert!(granted[0] / SLICE > 10 * 381 * 8 / 10, "{granted:?}");
    }

    #[test]
    fn idle_flows_drop_out_and_release_is_immediate() {
        let mut a = auction(2, 1_000_000_000);
        a.handle_request(
            Nanos::ZERO,
            SliceRequest {
                session: SessionId(0),
                namespace: NamespaceId(0),
            },
        )
        .unwrap();
        while a.poll_grant().is_some() {}
        assert_eq!(a.flows(), 1);
        for e in 1..=6 {
            a.handle_timeout(Nanos(e * 100 * MS));
        }
        assert_eq!(a.flows(), 0, "idle after idle_epochs without requests");
        a.handle_request(
            Nanos(600 * MS),
            SliceRequest {
                session: SessionId(1),
                namespace: NamespaceId(0),
            },
        )
        .unwrap();
        a.handle_release(SessionId(1), NamespaceId(0));
        assert_eq!(a.flows(), 0);
        assert!(a
            .handle_request(
                Nanos(600 * MS),
                SliceRequest {
                    session: SessionId(9),
                    namespace: NamespaceId(0)
                }
            )
            .is_err());
    }

    #[test]
    fn a_full_port_limits_the_flows_through_it() {
        // Two namespaces of 1 GB/s behind one port of 1 GB/s, one session
        // per namespace: the port halves both.
        let mut a = Auction::new(
            AuctionConfig {
                epoch_ns: 100 * MS,
                ..AuctionConfig::default()
            },
            Nanos::ZERO,
        )
        .unwrap();
        a.add_namespace(NamespaceId(0), 1_000_000_000);
        a.add_namespace(NamespaceId(1), 1_000_000_000);
        a.add_port(PortId(0), 1_000_000_000);
        a.add_session(SessionId(0), PortId(0), VolumeId(0)).unwrap();
        a.add_session(SessionId(1), PortId(0), VolumeId(1)).unwrap();
        let mut granted = [0u64; 2];
        let req = |s: u32| SliceRequest {
            session: SessionId(s),
            namespace: NamespaceId(s),
        };
        a.handle_request(Nanos::ZERO, req(0)).unwrap();
        a.handle_request(Nanos::ZERO, req(1)).unwrap();
        for e in 1..=5 {
            let now = Nanos(e * 100 * MS);
            a.handle_timeout(now);
            while let Some(g) = a.poll_grant() {
                granted[g.session.0 as usize] += g.bytes;
                a.handle_request(now, req(g.session.0)).unwrap();
            }
        }
        let total = granted[0] + granted[1];
        assert!(total <= 5 * 100_000_000, "{granted:?}");
        assert!(granted[0].abs_diff(granted[1]) <= 2 * SLICE, "{granted:?}");
        assert_eq!(
            a.flow(SessionId(0), NamespaceId(0)).unwrap().quota,
            50_000_000
        );
    }

    #[test]
    fn client_fast_path_needs_no_request_while_room_remains() {
        let mut c = ClientSlices::new(SessionId(0), NamespaceId(0), SLICE);
        assert_eq!(c.try_admit(Nanos(0), 4096), Admission::Wait);
        let r = c.poll_request(Nanos(0)).unwrap();
        assert_eq!(r.namespace, NamespaceId(0));
        assert_eq!(c.poll_request(Nanos(0)), None, "one outstanding request");
        let grant = |expires| Grant {
            session: SessionId(0),
            namespace: NamespaceId(0),
            bytes: SLICE,
            epoch: 1,
            expires_at: Nanos(expires),
        };
        c.on_grant(Nanos(10), &grant(1000));
        c.on_grant(Nanos(10), &grant(1000));
        // Two slices: 2 × 256 KiB; low water is one slice.
        for _ in 0..32 {
            assert_eq!(c.try_admit(Nanos(20), 8192), Admission::Admitted);
        }
        assert_eq!(c.poll_request(Nanos(20)), None, "still one slice of room");
        assert_eq!(c.try_admit(Nanos(20), 8192), Admission::Admitted);
        assert!(c.poll_request(Nanos(20)).is_some());
        // An I/O larger than the room overdraws once.
        assert_eq!(c.try_admit(Nanos(20), 10 * SLICE), Admission::Admitted);
        assert_eq!(c.room(Nanos(20)), 0);
        assert_eq!(c.try_admit(Nanos(20), 4096), Admission::Wait);
        c.on_grant(Nanos(30), &grant(1000));
        assert_eq!(c.room(Nanos(30)), 0, "the debt eats the new slice");
        // The debt is paid as slices arrive, not only by the next I/O:
        // slices that expire before their sum covers it are not lost to it.
        c.on_grant(Nanos(2000), &grant(3000));
        assert_eq!(c.room(Nanos(2000)), 0);
        // (The overdraw left a debt of just over nine slices.)
        for _ in 0..7 {
            c.on_grant(Nanos(2000), &grant(3000));
        }
        assert_eq!(c.room(Nanos(2000)), 0, "nine slices paid");
        c.on_grant(Nanos(2000), &grant(3000));
        let room = c.room(Nanos(2000));
        assert!(room > 0 && room < SLICE, "the tenth pays the rest: {room}");
        assert_eq!(c.try_admit(Nanos(2000), 4096), Admission::Admitted);
        // Slices expire.
        let mut c = ClientSlices::new(SessionId(0), NamespaceId(0), SLICE);
        c.on_grant(Nanos(10), &grant(1000));
        assert_eq!(c.room(Nanos(999)), SLICE);
        assert_eq!(c.room(Nanos(1000)), 0);
        assert_eq!(c.counts(), (0, 0));
    }
}
