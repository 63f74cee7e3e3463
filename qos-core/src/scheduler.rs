//! Virtual-slot deficit round robin over tenants (Gimbal §3.5, Appendix C,
//! Algorithm 2), with per-tenant weighted priority queues.
//!
//! # Model
//!
//! Every tenant owns a set of priority queues. Tenants with queued requests
//! sit on one of two lists: *active* (they may dispatch) or *deferred* (all
//! their virtual slots are busy). The head of the active list is offered
//! the DRR quantum once per visit; it dispatches its requests while their
//! cost-weighted size (writes × write cost) fits in its deficit, then moves
//! to the tail.
//!
//! A *virtual slot* groups a tenant's dispatched I/Os up to `slot_size`
//! cost-weighted bytes. The slot a tenant adds I/Os to is its *open* slot;
//! it closes (becomes *full*) when its weighted bytes reach the slot size,
//! and it *completes* when it is full and every I/O in it has completed.
//! A tenant may hold at most `allotted_slots` slots (open or full and
//! incomplete), where `allotted_slots = max(1, single_tenant_slots /
//! contending_tenants)`. A tenant that fills a slot and may not open
//! another moves to the deferred list, its deficit reset to zero and frozen
//! there, and returns to the tail of the active list when a slot completes.
//!
//! Within a tenant, the non-empty priority queues are served round robin,
//! level 0 first, each for up to its weight in requests per turn.
//!
//! # Call order
//!
//! [`enqueue`](VirtualSlotScheduler::enqueue) whenever a request arrives;
//! [`next_candidate`](VirtualSlotScheduler::next_candidate) to learn which
//! request DRR would send next (the caller checks its token bucket), then
//! [`dispatch`](VirtualSlotScheduler::dispatch) to take it;
//! [`complete`](VirtualSlotScheduler::complete) when the device finishes it.
//! The scheduler never reorders around a candidate the caller cannot send
//! yet: like Gimbal, the egress waits for tokens for the head request.
//!
//! # Decisions where the paper is vague
//!
//! - A slot is full when its weighted bytes are **at least** the slot size
//!   (Algorithm 2 says "greater than", but §3.5 says a slot holds "up to
//!   128KB", e.g. exactly one 128 KiB I/O).
//! - The open slot is created lazily by the first I/O that needs it, so a
//!   tenant "can open a slot" iff it holds fewer than `allotted_slots`
//!   slots. A partly filled open slot stays open across idle periods.
//! - *Contending tenants* (for the slot allotment) are tenants with queued
//!   **or in-flight** I/O, so a tenant running at queue depth one does not
//!   flap in and out of the count. The allotment is re-evaluated on every
//!   call; a tenant holding more slots than a smaller allotment allows keeps
//!   them until they complete but opens no new one.
//! - A tenant whose queues run empty leaves the active list and its deficit
//!   resets to zero (classic DRR), so idle tenants bank no credit.
//! - Credits (§3.6) use an I/O count of 1 per slot until the tenant's first
//!   slot completes, so a new tenant starts with `allotted_slots` credits.
//! - Priority levels past the configured ones are served as the lowest.

use std::collections::{BTreeMap, VecDeque};

use crate::config::GimbalConfig;
use crate::error::{QosError, Result};
use crate::time::Nanos;
use crate::types::{IoKind, RequestId, RequestMap, TenantId};

/// Largest credit value reported; credits travel in 31 bits (see
/// [`crate::credit`]).
pub const CREDIT_MAX: u32 = (1 << 31) - 1;

/// A request waiting in a tenant's priority queue.
#[derive(Clone, Debug)]
struct Queued<T> {
    id: RequestId,
    kind: IoKind,
    bytes: u64,
    priority: u8,
    enqueued_at: Nanos,
    payload: T,
}

/// A group of up to `slot_size` weighted bytes of one tenant's I/O.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct VirtualSlot {
    submits: u32,
    completions: u32,
    weighted_bytes: u64,
    full: bool,
}

/// Which scheduler list a tenant is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListMembership {
    /// No queued requests.
    Idle,
    /// On the active list.
    Active,
    /// On the deferred list, waiting for a slot.
    Deferred,
}

/// A tenant's position in the scheduler's dense tenant table: what the
/// lists, the in-flight entries and candidates refer to, so that the hot
/// path indexes a vector instead of searching the id map.
type TenantIndex = u32;

#[derive(Clone, Debug)]
struct TenantState<T> {
    id: TenantId,
    queues: Vec<VecDeque<Queued<T>>>,
    priority_cursor: usize,
    priority_turn_left: u32,
    deficit_bytes: u64,
    list: ListMembership,
    /// Slots held, by sequence number. At most a few (the allotment), so
    /// a linear search beats a tree; the order is never observed.
    slots: Vec<(u64, VirtualSlot)>,
    open_slot: Option<u64>,
    next_slot_seq: u64,
    queued: usize,
    in_flight: usize,
    last_completed_slot_ios: u32,
    stats: TenantStats,
}

/// Counters of one tenant, for monitoring and fairness checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantStats {
    /// Requests dispatched so far.
    pub dispatched_ios: u64,
    /// Bytes dispatched so far.
    pub dispatched_bytes: u64,
    /// Cost-weighted bytes dispatched so far.
    pub dispatched_weighted_bytes: u64,
    /// Requests completed so far.
    pub completed_ios: u64,
    /// Virtual slots completed so far.
    pub completed_slots: u64,
}

/// A read-only snapshot of one tenant's scheduling state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantSnapshot {
    /// Requests waiting in its queues.
    pub queued: usize,
    /// Requests dispatched and not completed.
    pub in_flight: usize,
    /// Current DRR deficit in weighted bytes.
    pub deficit_bytes: u64,
    /// Virtual slots held (open or full and incomplete).
    pub slots_in_use: usize,
    /// Whether the tenant is on the deferred list.
    pub deferred: bool,
    /// I/O count of its latest completed slot (1 before the first).
    pub last_completed_slot_ios: u32,
    /// Lifetime counters.
    pub stats: TenantStats,
}

/// The request DRR would dispatch next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The request.
    pub id: RequestId,
    /// Its tenant.
    pub tenant: TenantId,
    /// Its tenant's index in the dense table.
    index: TenantIndex,
    /// Read or write: which token bucket must admit it.
    pub kind: IoKind,
    /// Its size in bytes: what the token bucket charges.
    pub bytes: u64,
    /// Its cost-weighted size: what the deficit and the slot are charged.
    pub weighted_bytes: u64,
}

/// A request handed to the caller for submission to the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatched<T> {
    /// Scheduler-assigned id; pass it to `complete`.
    pub id: RequestId,
    /// The tenant it belongs to.
    pub tenant: TenantId,
    /// Read or write.
    pub kind: IoKind,
    /// Size in bytes.
    pub bytes: u64,
    /// Priority level it was queued at (after clamping).
    pub priority: u8,
    /// When it was enqueued.
    pub enqueued_at: Nanos,
    /// The caller's payload, given back.
    pub payload: T,
}

/// What a completion did to the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletedIo {
    /// The tenant of the completed request.
    pub tenant: TenantId,
    /// Read or write.
    pub kind: IoKind,
    /// Size in bytes.
    pub bytes: u64,
    /// Whether this completion completed (and freed) a virtual slot.
    pub slot_completed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InFlight {
    tenant: TenantIndex,
    slot_seq: u64,
    kind: IoKind,
    bytes: u64,
    /// The dispatch time the switch gave (zero through `dispatch`).
    dispatched_at: Nanos,
}

/// What [`VirtualSlotScheduler::immediate`] found: the request may leave
/// without queueing.
struct Immediate {
    index: TenantIndex,
    was_contending: bool,
    weighted_bytes: u64,
    granted: bool,
}

/// A request at the device whose in-flight entry its driver holds instead
/// of the switch's table (see [`crate::switch::GimbalSwitch::pass_through`]).
/// Completing it consumes it, so it completes once; dropping it instead
/// leaves the request in flight for good, as losing an id would.
#[derive(Debug, PartialEq, Eq)]
pub struct HeldInFlight {
    id: RequestId,
    io: InFlight,
}

impl HeldInFlight {
    /// The request's id (the one `submit` would have returned).
    pub fn id(&self) -> RequestId {
        self.id
    }
}

/// The requests at the device, by id. Ids are handed out in sequence and
/// requests complete roughly in order, so a direct-mapped table indexed by
/// the id's low bits finds nearly every one at its place without hashing;
/// an entry whose place is taken by a newer id (one request held at the
/// device while `capacity` later ones went by) moves to a hash map. The
/// table doubles, up to [`IN_FLIGHT_TABLE_MAX`] places, while it has fewer
/// places than twice the requests in it. Only looked up and counted, never
/// iterated: its layout cannot leak into decisions.
#[derive(Clone, Default)]
struct InFlightTable {
    places: Vec<Option<(RequestId, InFlight)>>,
    overflow: RequestMap<InFlight>,
    len: usize,
}

/// The entries by id, not the layout: two tables holding the same
/// requests print the same (states are compared through `Debug` in tests).
impl std::fmt::Debug for InFlightTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut entries: Vec<(RequestId, InFlight)> = self
            .places
            .iter()
            .flatten()
            .copied()
            .chain(self.overflow.iter().map(|(id, io)| (*id, *io)))
            .collect();
        entries.sort_by_key(|(id, _)| *id);
        f.debug_map().entries(entries).finish()
    }
}

/// Largest direct-mapped in-flight table (places); beyond it collisions
/// go to the hash map.
const IN_FLIGHT_TABLE_MAX: usize = 1 << 16;

impl InFlightTable {
    fn place(&self, id: RequestId) -> usize {
        // Truncation intended: the low bits pick the place.
        (id.0 as usize) & (self.places.len() - 1)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn insert(&mut self, id: RequestId, io: InFlight) {
        if self.places.len() < IN_FLIGHT_TABLE_MAX && self.places.len() < 2 * (self.len + 1) {
            self.grow();
        }
        let place = self.place(id);
        if let Some((old_id, old)) = self.places[place].replace((id, io)) {
            self.overflow.insert(old_id, old);
        }
        self.len += 1;
    }

    fn grow(&mut self) {
        let size = (self.places.len() * 2).max(64);
        let old = std::mem::replace(&mut self.places, vec![None; size]);
        for (id, io) in old.into_iter().flatten() {
            let place = self.place(id);
            if let Some((other_id, other)) = self.places[place].replace((id, io)) {
                self.overflow.insert(other_id, other);
            }
        }
    }

    fn remove(&mut self, id: RequestId) -> Option<InFlight> {
        let io = match self.places.is_empty() {
            true => None,
            false => {
                let place = self.place(id);
                match self.places[place] {
                    Some((held, _)) if held == id => self.places[place].take().map(|(_, io)| io),
                    _ => None,
                }
            }
        };
        let io = match io {
            Some(io) => Some(io),
            None if self.overflow.is_empty() => None,
            None => self.overflow.remove(&id),
        };
        self.len -= usize::from(io.is_some());
        io
    }
}

/// Deficit round robin over tenants with virtual slots (Algorithm 2).
/// `T` is the caller's per-request payload, returned on dispatch.
#[derive(Clone, Debug)]
pub struct VirtualSlotScheduler<T> {
    slot_size_bytes: u64,
    quantum_bytes: u64,
    single_tenant_slots: u32,
    priority_weights: Vec<u32>,
    /// Tenant states by [`TenantIndex`]; `None` for a removed tenant's
    /// index until a new tenant reuses it.
    tenants: Vec<Option<TenantState<T>>>,
    /// Tenant id to index: looked up once per enqueue, iterated in id
    /// order wherever order is observable.
    index: BTreeMap<TenantId, TenantIndex>,
    /// Indices of removed tenants, for reuse.
    free: Vec<TenantIndex>,
    active: VecDeque<TenantIndex>,
    deferred: VecDeque<TenantIndex>,
    head_quantum_granted: bool,
    in_flight: InFlightTable,
    /// Requests in flight whose entries their callers hold
    /// ([`HeldInFlight`]), not the table.
    held_in_flight: usize,
    next_request_id: u64,
    contending_tenants: usize,
    /// `allotment(single_tenant_slots, contending_tenants)`, kept with the
    /// count: asked several times per request, and it divides.
    allotted: u32,
    queued_total: usize,
}

impl<T> TenantState<T> {
    fn new(id: TenantId, levels: usize) -> Self {
        TenantState {
            id,
            queues: (0..levels).map(|_| VecDeque::new()).collect(),
            // The first turn search starts after the cursor: start at the
            // last level so that level 0 is served first.
            priority_cursor: levels - 1,
            priority_turn_left: 0,
            deficit_bytes: 0,
            list: ListMembership::Idle,
            slots: Vec::new(),
            open_slot: None,
            next_slot_seq: 0,
            queued: 0,
            in_flight: 0,
            last_completed_slot_ios: 1,
            stats: TenantStats::default(),
        }
    }

    fn is_contending(&self) -> bool {
        self.queued > 0 || self.in_flight > 0
    }

    /// Whether the tenant may add an I/O to a slot now.
    fn has_slot_room(&self, allotted_slots: u32) -> bool {
        self.open_slot.is_some() || self.slots.len() < allotted_slots as usize
    }

    /// The held slot with sequence number `seq`.
    fn slot_mut(&mut self, seq: u64) -> Option<&mut VirtualSlot> {
        self.slots
            .iter_mut()
            .find(|(s, _)| *s == seq)
            .map(|(_, slot)| slot)
    }

    /// The priority level to serve next and whether that starts a new turn.
    fn select_level(&self) -> Option<(usize, bool)> {
        let levels = self.queues.len();
        if !self.queues[self.priority_cursor].is_empty() && self.priority_turn_left > 0 {
            return Some((self.priority_cursor, false));
        }
        (1..=levels)
            .map(|step| {
                // (cursor + step) mod levels without a division: both
                // terms are at most `levels`.
                let level = self.priority_cursor + step;
                if level >= levels {
                    level - levels
                } else {
                    level
                }
            })
            .find(|&level| !self.queues[level].is_empty())
            .map(|level| (level, true))
    }

    fn head(&self) -> Option<&Queued<T>> {
        let (level, _) = self.select_level()?;
        self.queues[level].front()
    }

    fn pop_head(&mut self, weights: &[u32]) -> Option<Queued<T>> {
        let (level, new_turn) = self.select_level()?;
        if new_turn {
            self.priority_cursor = level;
            self.priority_turn_left = weights[level];
        }
        self.priority_turn_left -= 1;
        let request = self.queues[level].pop_front()?;
        self.queued -= 1;
        Some(request)
    }
}

impl<T> VirtualSlotScheduler<T> {
    /// An empty scheduler configured from the Gimbal parameters.
    pub fn new(config: &GimbalConfig) -> Result<Self> {
        config.validate()?;
        Ok(VirtualSlotScheduler {
            slot_size_bytes: config.slot_size_bytes,
            quantum_bytes: config.drr_quantum_bytes,
            single_tenant_slots: config.single_tenant_slots,
            priority_weights: config.priority_weights.clone(),
            tenants: Vec::new(),
            index: BTreeMap::new(),
            free: Vec::new(),
            active: VecDeque::new(),
            deferred: VecDeque::new(),
            head_quantum_granted: false,
            in_flight: InFlightTable::default(),
            held_in_flight: 0,
            next_request_id: 0,
            contending_tenants: 0,
            allotted: Self::allotment(config.single_tenant_slots, 0),
            queued_total: 0,
        })
    }

    /// Registers a tenant.
    pub fn add_tenant(&mut self, tenant: TenantId) -> Result<()> {
        if self.index.contains_key(&tenant) {
            return Err(QosError::DuplicateTenant(tenant));
        }
        let state = TenantState::new(tenant, self.priority_weights.len());
        let index = match self.free.pop() {
            Some(i) => {
                self.tenants[i as usize] = Some(state);
                i
            }
            None => {
                self.tenants.push(Some(state));
                TenantIndex::try_from(self.tenants.len() - 1).expect("fewer than 2^32 tenants")
            }
        };
        self.index.insert(tenant, index);
        Ok(())
    }

    /// Forgets a tenant; it must have nothing queued or in flight.
    pub fn remove_tenant(&mut self, tenant: TenantId) -> Result<()> {
        let &index = self
            .index
            .get(&tenant)
            .ok_or(QosError::UnknownTenant(tenant))?;
        let state = self.state(index);
        if state.is_contending() {
            return Err(QosError::TenantBusy(tenant));
        }
        debug_assert_eq!(state.list, ListMembership::Idle);
        self.index.remove(&tenant);
        self.tenants[index as usize] = None;
        self.free.push(index);
        Ok(())
    }

    /// Whether `tenant` is registered.
    pub fn has_tenant(&self, tenant: TenantId) -> bool {
        self.index.contains_key(&tenant)
    }

    /// Registered tenants in id order.
    pub fn tenant_ids(&self) -> impl Iterator<Item = TenantId> + '_ {
        self.index.keys().copied()
    }

    /// The state of a registered tenant's index.
    fn state(&self, index: TenantIndex) -> &TenantState<T> {
        self.tenants[index as usize]
            .as_ref()
            .expect("index of a registered tenant")
    }

    /// The state of a registered tenant's index, mutably.
    fn state_mut(&mut self, index: TenantIndex) -> &mut TenantState<T> {
        Self::state_in(&mut self.tenants, index)
    }

    /// [`state_mut`](Self::state_mut) borrowing only the table, so that
    /// other fields stay usable.
    fn state_in(tenants: &mut [Option<TenantState<T>>], index: TenantIndex) -> &mut TenantState<T> {
        tenants[index as usize]
            .as_mut()
            .expect("index of a registered tenant")
    }

    /// The state of `tenant`, if registered.
    fn state_of(&self, tenant: TenantId) -> Option<&TenantState<T>> {
        self.index.get(&tenant).map(|&i| self.state(i))
    }

    /// Virtual slots each contending tenant may hold now.
    pub fn allotted_slots(&self) -> u32 {
        self.allotted
    }

    fn allotment(single_tenant_slots: u32, contending: usize) -> u32 {
        // One tenant alone is the common case: no division (which takes
        // tens of cycles) to learn that it gets everything.
        if contending <= 1 {
            return single_tenant_slots.max(1);
        }
        let contending = u32::try_from(contending).unwrap_or(u32::MAX);
        (single_tenant_slots / contending).max(1)
    }

    fn set_contending(&mut self, contending: usize) {
        self.contending_tenants = contending;
        self.allotted = Self::allotment(self.single_tenant_slots, contending);
    }

    /// Tenants with queued or in-flight I/O.
    pub fn contending_tenants(&self) -> usize {
        self.contending_tenants
    }

    /// Requests queued across all tenants.
    pub fn queued_len(&self) -> usize {
        self.queued_total
    }

    /// Requests dispatched and not yet completed.
    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len() + self.held_in_flight
    }

    /// The credit of `tenant` (§3.6): its allotted virtual slots times the
    /// I/O count of its latest completed slot, counting the tenant itself
    /// as contending. Always at least 1, at most [`CREDIT_MAX`].
    pub fn credit(&self, tenant: TenantId) -> Option<u32> {
        Some(self.credit_of(self.state_of(tenant)?))
    }

    /// [`credit`](Self::credit) of a tenant's state.
    fn credit_of(&self, state: &TenantState<T>) -> u32 {
        let slots = if state.is_contending() {
            self.allotted
        } else {
            Self::allotment(self.single_tenant_slots, self.contending_tenants + 1)
        };
        slots
            .saturating_mul(state.last_completed_slot_ios.max(1))
            .min(CREDIT_MAX)
    }

    /// A snapshot of one tenant's state.
    pub fn tenant_snapshot(&self, tenant: TenantId) -> Option<TenantSnapshot> {
        let s = self.state_of(tenant)?;
        Some(TenantSnapshot {
            queued: s.queued,
            in_flight: s.in_flight,
            deficit_bytes: s.deficit_bytes,
            slots_in_use: s.slots.len(),
            deferred: s.list == ListMembership::Deferred,
            last_completed_slot_ios: s.last_completed_slot_ios,
            stats: s.stats,
        })
    }

    /// Queues a request of `tenant` at priority level `priority` (0 is
    /// served first; levels past the configured ones count as the lowest).
    pub fn enqueue(
        &mut self,
        now: Nanos,
        tenant: TenantId,
        kind: IoKind,
        bytes: u64,
        priority: u8,
        payload: T,
    ) -> Result<RequestId> {
        let allotted = self.allotted_slots();
        let levels = self.priority_weights.len();
        let &index = self
            .index
            .get(&tenant)
            .ok_or(QosError::UnknownTenant(tenant))?;
        let state = Self::state_in(&mut self.tenants, index);
        let id = RequestId(self.next_request_id);
        self.next_request_id += 1;
        let level = usize::from(priority).min(levels - 1);
        let was_contending = state.is_contending();
        state.queues[level].push_back(Queued {
            id,
            kind,
            bytes,
            priority: level as u8,
            enqueued_at: now,
            payload,
        });
        state.queued += 1;
        self.queued_total += 1;
        if state.list == ListMembership::Idle {
            if state.has_slot_room(allotted) {
                state.list = ListMembership::Active;
                self.active.push_back(index);
            } else {
                state.list = ListMembership::Deferred;
                self.deferred.push_back(index);
            }
        }
        if !was_contending {
            self.set_contending(self.contending_tenants + 1);
        }
        Ok(id)
    }

    fn pop_active_front(&mut self) -> Option<TenantIndex> {
        self.head_quantum_granted = false;
        self.active.pop_front()
    }

    /// Moves deferred tenants that may now open a slot to the active tail,
    /// in deferred-list order.
    fn promote_deferred(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let allotted = self.allotted_slots();
        let tenants = &mut self.tenants;
        let active = &mut self.active;
        self.deferred.retain(|&index| {
            let state = Self::state_in(tenants, index);
            if state.has_slot_room(allotted) {
                state.list = ListMembership::Active;
                active.push_back(index);
                false
            } else {
                true
            }
        });
    }

    fn weighted(kind: IoKind, bytes: u64, write_cost: f64) -> u64 {
        match kind {
            IoKind::Read => bytes,
            IoKind::Write => (bytes as f64 * write_cost.max(1.0)).ceil() as u64,
        }
    }

    /// The request DRR serves next given the current `write_cost`, or
    /// `None` when no tenant with queued requests has a free slot.
    ///
    /// Advances the round robin (grants quanta, rotates tenants whose head
    /// does not fit) but is idempotent: calling it again without another
    /// call in between returns the same candidate.
    pub fn next_candidate(&mut self, write_cost: f64) -> Option<Candidate> {
        self.promote_deferred();
        let allotted = self.allotted_slots();
        // Fast path, the common case: the first pass of the loop below
        // returns the active head's request. Same result, without the
        // loop bound's walk over every active tenant.
        let &index = self.active.front()?;
        let state = Self::state_in(&mut self.tenants, index);
        if state.queued > 0 && state.has_slot_room(allotted) {
            let head = state.head().expect("queued > 0");
            let weighted_bytes = Self::weighted(head.kind, head.bytes, write_cost);
            let candidate = Candidate {
                id: head.id,
                tenant: state.id,
                index,
                kind: head.kind,
                bytes: head.bytes,
                weighted_bytes,
            };
            if weighted_bytes <= state.deficit_bytes {
                return Some(candidate);
            }
            if !self.head_quantum_granted
                && weighted_bytes <= state.deficit_bytes.saturating_add(self.quantum_bytes)
            {
                self.head_quantum_granted = true;
                state.deficit_bytes = state.deficit_bytes.saturating_add(self.quantum_bytes);
                return Some(candidate);
            }
        }
        self.next_candidate_slow(allotted, write_cost)
    }

    /// The general case of [`next_candidate`](Self::next_candidate), from
    /// the state the fast path left untouched.
    fn next_candidate_slow(&mut self, allotted: u32, write_cost: f64) -> Option<Candidate> {
        // Each rotation grants one quantum, so every head fits after at most
        // max_weighted / quantum visits of its tenant: bound the loop by that.
        let max_weighted = self
            .active
            .iter()
            .filter_map(|&i| self.state(i).head())
            .map(|q| Self::weighted(q.kind, q.bytes, write_cost))
            .max()
            .unwrap_or(0);
        let visits_per_tenant = max_weighted / self.quantum_bytes + 2;
        let limit = (self.active.len() as u64).saturating_mul(visits_per_tenant) + 1;
        for _ in 0..limit {
            let index = *self.active.front()?;
            let state = Self::state_in(&mut self.tenants, index);
            if state.queued == 0 {
                state.list = ListMembership::Idle;
                state.deficit_bytes = 0;
                self.pop_active_front();
                continue;
            }
            if !state.has_slot_room(allotted) {
                state.list = ListMembership::Deferred;
                state.deficit_bytes = 0;
                self.pop_active_front();
                self.deferred.push_back(index);
                continue;
            }
            let head = state.head().expect("queued > 0");
            let weighted_bytes = Self::weighted(head.kind, head.bytes, write_cost);
            let candidate = Candidate {
                id: head.id,
                tenant: state.id,
                index,
                kind: head.kind,
                bytes: head.bytes,
                weighted_bytes,
            };
            if weighted_bytes <= state.deficit_bytes {
                return Some(candidate);
            }
            if !self.head_quantum_granted {
                self.head_quantum_granted = true;
                state.deficit_bytes = state.deficit_bytes.saturating_add(self.quantum_bytes);
                if weighted_bytes <= state.deficit_bytes {
                    return Some(candidate);
                }
            }
            self.pop_active_front();
            self.active.push_back(index);
        }
        debug_assert!(false, "DRR loop bound reached");
        None
    }

    /// Takes the current candidate (see [`next_candidate`](Self::next_candidate))
    /// out of its queue, charges its tenant's deficit and virtual slot, and
    /// records it as in flight.
    pub fn dispatch(&mut self, write_cost: f64) -> Option<Dispatched<T>> {
        let candidate = self.next_candidate(write_cost)?;
        Some(self.dispatch_candidate(candidate, Nanos(0)))
    }

    /// [`dispatch`](Self::dispatch) of a `candidate` that
    /// [`next_candidate`](Self::next_candidate) just returned, with no call
    /// in between: the same outcome without choosing it again. Keeps
    /// `dispatched_at` with the in-flight request for
    /// [`complete_dispatched`](Self::complete_dispatched).
    pub(crate) fn dispatch_candidate(
        &mut self,
        candidate: Candidate,
        dispatched_at: Nanos,
    ) -> Dispatched<T> {
        let state = Self::state_in(&mut self.tenants, candidate.index);
        let request = state
            .pop_head(&self.priority_weights)
            .expect("candidate is queued");
        debug_assert_eq!(request.id, candidate.id);
        self.queued_total -= 1;
        self.charge_dispatch(
            candidate.index,
            request.id,
            request.kind,
            request.bytes,
            candidate.weighted_bytes,
            dispatched_at,
        );
        Dispatched {
            id: request.id,
            tenant: candidate.tenant,
            kind: request.kind,
            bytes: request.bytes,
            priority: request.priority,
            enqueued_at: request.enqueued_at,
            payload: request.payload,
        }
    }

    /// What dispatching a request taken off tenant `index`'s queues does
    /// besides the queues (its `queued` count already lowered): charges
    /// the deficit and the open virtual slot, counts it in flight, moves
    /// the tenant off the active list if it has nothing left or no slot.
    fn charge_dispatch(
        &mut self,
        index: TenantIndex,
        id: RequestId,
        kind: IoKind,
        bytes: u64,
        weighted_bytes: u64,
        dispatched_at: Nanos,
    ) {
        let io = self.charge(index, kind, bytes, weighted_bytes, dispatched_at);
        self.in_flight.insert(id, io);
    }

    /// [`charge_dispatch`](Self::charge_dispatch) but for the in-flight
    /// table: returns the entry instead of inserting it.
    fn charge(
        &mut self,
        index: TenantIndex,
        kind: IoKind,
        bytes: u64,
        weighted_bytes: u64,
        dispatched_at: Nanos,
    ) -> InFlight {
        let allotted = self.allotted_slots();
        let slot_size = self.slot_size_bytes;
        let state = Self::state_in(&mut self.tenants, index);
        state.deficit_bytes -= weighted_bytes;
        let slot_seq = match state.open_slot {
            Some(seq) => seq,
            None => {
                let seq = state.next_slot_seq;
                state.next_slot_seq += 1;
                state.slots.push((seq, VirtualSlot::default()));
                state.open_slot = Some(seq);
                seq
            }
        };
        let slot = state.slot_mut(slot_seq).expect("open slot exists");
        slot.submits += 1;
        slot.weighted_bytes = slot.weighted_bytes.saturating_add(weighted_bytes);
        if slot.weighted_bytes >= slot_size {
            slot.full = true;
            state.open_slot = None;
        }
        state.in_flight += 1;
        state.stats.dispatched_ios += 1;
        state.stats.dispatched_bytes += bytes;
        state.stats.dispatched_weighted_bytes += weighted_bytes;
        if state.queued == 0 {
            state.list = ListMembership::Idle;
            state.deficit_bytes = 0;
            self.pop_active_front();
        } else if !state.has_slot_room(allotted) {
            state.list = ListMembership::Deferred;
            state.deficit_bytes = 0;
            self.pop_active_front();
            self.deferred.push_back(index);
        }
        InFlight {
            tenant: index,
            slot_seq,
            kind,
            bytes,
            dispatched_at,
        }
    }

    /// [`enqueue`](Self::enqueue) and, when no other request is queued
    /// (both lists empty), what [`next_candidate`](Self::next_candidate),
    /// `admit` (the caller's token bucket check) and
    /// [`dispatch_candidate`](Self::dispatch_candidate) would do next:
    /// the same state and the same request handed back, but a request
    /// that goes out at once never enters a queue, and the tenant never
    /// enters the active list it would leave right away. That is the
    /// common case of a switch in front of a fast device (every request
    /// finds the switch empty), and it skips most of a request's moves.
    /// With other requests queued it only enqueues (`None`): the caller
    /// polls as after [`enqueue`](Self::enqueue).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_dispatch(
        &mut self,
        now: Nanos,
        tenant: TenantId,
        kind: IoKind,
        bytes: u64,
        priority: u8,
        payload: T,
        write_cost: f64,
        admit: impl FnOnce(IoKind, u64) -> bool,
    ) -> Result<(RequestId, Option<Dispatched<T>>)> {
        if !self.active.is_empty() || !self.deferred.is_empty() {
            let id = self.enqueue(now, tenant, kind, bytes, priority, payload)?;
            return Ok((id, None));
        }
        let Some(go) = self.immediate(tenant, kind, bytes, write_cost)? else {
            // The general case (no slot, or a request larger than a
            // quantum): the long way, with the same outcome.
            let id = self.enqueue(now, tenant, kind, bytes, priority, payload)?;
            let Some(candidate) = self.next_candidate(write_cost) else {
                return Ok((id, None));
            };
            debug_assert_eq!(candidate.id, id);
            if !admit(candidate.kind, candidate.bytes) {
                return Ok((id, None));
            }
            return Ok((id, Some(self.dispatch_candidate(candidate, now))));
        };
        let Immediate {
            index,
            was_contending,
            weighted_bytes,
            granted,
        } = go;
        let id = self.begin_immediate(index, was_contending, granted);
        let levels = self.priority_weights.len();
        let level = usize::from(priority).min(levels - 1);
        if !admit(kind, bytes) {
            // Held back by the tokens: queued and at the head of the
            // active list, as `enqueue` and `next_candidate` leave it.
            let state = Self::state_in(&mut self.tenants, index);
            state.queues[level].push_back(Queued {
                id,
                kind,
                bytes,
                priority: level as u8,
                enqueued_at: now,
                payload,
            });
            state.queued += 1;
            self.queued_total += 1;
            state.list = ListMembership::Active;
            self.active.push_back(index);
            return Ok((id, None));
        }
        let io = self.finish_immediate(index, kind, bytes, level, weighted_bytes, now);
        self.in_flight.insert(id, io);
        Ok((
            id,
            Some(Dispatched {
                id,
                tenant,
                kind,
                bytes,
                priority: level as u8,
                enqueued_at: now,
                payload,
            }),
        ))
    }

    /// Whether a request of `tenant` would leave at once without
    /// queueing if its token bucket admits it, and what that takes; `None`
    /// for the general case (other requests queued, no slot room, larger
    /// than the deficit and the quantum). Changes nothing.
    fn immediate(
        &self,
        tenant: TenantId,
        kind: IoKind,
        bytes: u64,
        write_cost: f64,
    ) -> Result<Option<Immediate>> {
        if !self.active.is_empty() || !self.deferred.is_empty() {
            return Ok(None);
        }
        let &index = self
            .index
            .get(&tenant)
            .ok_or(QosError::UnknownTenant(tenant))?;
        let state = self.state(index);
        let was_contending = state.is_contending();
        // The allotment `next_candidate` would use after the enqueue
        // counted the tenant (never more than the one before it, which
        // `enqueue` checks for the active list: room now means room then).
        let allotted = if was_contending {
            self.allotted
        } else {
            Self::allotment(self.single_tenant_slots, self.contending_tenants + 1)
        };
        let weighted_bytes = Self::weighted(kind, bytes, write_cost);
        let fits = weighted_bytes <= state.deficit_bytes;
        let granted = !fits
            && !self.head_quantum_granted
            && weighted_bytes <= state.deficit_bytes.saturating_add(self.quantum_bytes);
        if state.list != ListMembership::Idle
            || !state.has_slot_room(allotted)
            || !(fits || granted)
        {
            return Ok(None);
        }
        Ok(Some(Immediate {
            index,
            was_contending,
            weighted_bytes,
            granted,
        }))
    }

    /// The first steps of an [`immediate`](Self::immediate) request, as
    /// `enqueue` and `next_candidate` take them: its id, the tenant
    /// counted as contending, the quantum granted if it needs one.
    fn begin_immediate(
        &mut self,
        index: TenantIndex,
        was_contending: bool,
        granted: bool,
    ) -> RequestId {
        let id = RequestId(self.next_request_id);
        self.next_request_id += 1;
        if !was_contending {
            self.set_contending(self.contending_tenants + 1);
        }
        if granted {
            self.head_quantum_granted = true;
            let state = Self::state_in(&mut self.tenants, index);
            state.deficit_bytes = state.deficit_bytes.saturating_add(self.quantum_bytes);
        }
        id
    }

    /// The rest of an [`immediate`](Self::immediate) request that its
    /// bucket admitted: `pop_head` with this request alone in the queues
    /// (the level's turn goes on if it holds the cursor with turns left,
    /// else a new turn starts there), then the dispatch's charges. The
    /// in-flight entry is the caller's to keep.
    fn finish_immediate(
        &mut self,
        index: TenantIndex,
        kind: IoKind,
        bytes: u64,
        level: usize,
        weighted_bytes: u64,
        now: Nanos,
    ) -> InFlight {
        let state = Self::state_in(&mut self.tenants, index);
        if !(state.priority_cursor == level && state.priority_turn_left > 0) {
            state.priority_cursor = level;
            state.priority_turn_left = self.priority_weights[level];
        }
        state.priority_turn_left -= 1;
        self.charge(index, kind, bytes, weighted_bytes, now)
    }

    /// [`enqueue_dispatch`](Self::enqueue_dispatch) of a request that
    /// leaves at once, or nothing at all: when the request would go to the
    /// device without queueing and `admit` (the caller's token check,
    /// called last and only then) lets it, the same state as
    /// `enqueue_dispatch` followed by its dispatch, except that the
    /// in-flight entry is handed to the caller (complete it with
    /// [`complete_held`](Self::complete_held)); otherwise `None` and no
    /// change, and the caller submits the ordinary way. For a driver that
    /// runs the request and completes it before it touches the scheduler
    /// again (an inline backend): the entry never enters the table.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pass_through(
        &mut self,
        now: Nanos,
        tenant: TenantId,
        kind: IoKind,
        bytes: u64,
        priority: u8,
        write_cost: f64,
        admit: impl FnOnce(IoKind, u64) -> bool,
    ) -> Result<Option<HeldInFlight>> {
        let Some(go) = self.immediate(tenant, kind, bytes, write_cost)? else {
            return Ok(None);
        };
        if !admit(kind, bytes) {
            return Ok(None);
        }
        let id = self.begin_immediate(go.index, go.was_contending, go.granted);
        let level = usize::from(priority).min(self.priority_weights.len() - 1);
        let io = self.finish_immediate(go.index, kind, bytes, level, go.weighted_bytes, now);
        self.held_in_flight += 1;
        Ok(Some(HeldInFlight { id, io }))
    }

    /// Completes a request [`pass_through`](Self::pass_through) let go, as
    /// [`complete_dispatched`](Self::complete_dispatched) completes one
    /// from the table.
    pub(crate) fn complete_held(&mut self, held: HeldInFlight) -> (CompletedIo, Nanos, u32) {
        self.held_in_flight -= 1;
        self.complete_entry(held.io)
    }

    /// Records the completion of a dispatched request (Algorithm 2
    /// `SCHED_COMPLETE`): frees its slot when that was the slot's last I/O.
    pub fn complete(&mut self, id: RequestId) -> Result<CompletedIo> {
        self.complete_dispatched(id).map(|(done, _, _)| done)
    }

    /// [`complete`](Self::complete), also returning the dispatch time given
    /// to [`dispatch_candidate`](Self::dispatch_candidate) and the tenant's
    /// credit after the completion (what [`credit`](Self::credit) would
    /// say, without looking the tenant up again).
    pub(crate) fn complete_dispatched(
        &mut self,
        id: RequestId,
    ) -> Result<(CompletedIo, Nanos, u32)> {
        let io = self
            .in_flight
            .remove(id)
            .ok_or(QosError::UnknownRequest(id))?;
        Ok(self.complete_entry(io))
    }

    /// What completing the in-flight request `io` does (Algorithm 2
    /// `SCHED_COMPLETE`), its entry already out of the table.
    fn complete_entry(&mut self, io: InFlight) -> (CompletedIo, Nanos, u32) {
        let state = Self::state_in(&mut self.tenants, io.tenant);
        state.in_flight -= 1;
        state.stats.completed_ios += 1;
        let position = state
            .slots
            .iter()
            .position(|(seq, _)| *seq == io.slot_seq)
            .expect("in-flight slot exists");
        let slot = &mut state.slots[position].1;
        slot.completions += 1;
        let slot_completed = slot.full && slot.completions == slot.submits;
        if slot_completed {
            state.last_completed_slot_ios = slot.submits;
            state.stats.completed_slots += 1;
            state.slots.swap_remove(position);
        }
        let tenant = state.id;
        let deferred = state.list == ListMembership::Deferred;
        if !state.is_contending() {
            self.set_contending(self.contending_tenants - 1);
        }
        if slot_completed && deferred {
            let allotted = self.allotted_slots();
            let state = self.state_mut(io.tenant);
            if state.has_slot_room(allotted) {
                state.list = ListMembership::Active;
                self.deferred.retain(|t| *t != io.tenant);
                self.active.push_back(io.tenant);
            }
        }
        let credit = self.credit_of(self.state(io.tenant));
        (
            CompletedIo {
                tenant,
                kind: io.kind,
                bytes: io.bytes,
                slot_completed,
            },
            io.dispatched_at,
            credit,
        )
    }

    /// Checks internal invariants; for tests and debug builds.
    pub fn check_invariants(&self) -> core::result::Result<(), String> {
        let mut contending = 0;
        let mut queued = 0;
        for (id, &index) in &self.index {
            let s = self.state(index);
            let on_active = self.active.iter().filter(|&&t| t == index).count();
            let on_deferred = self.deferred.iter().filter(|&&t| t == index).count();
            let expected = match s.list {
                ListMembership::Idle => (0, 0),
                ListMembership::Active => (1, 0),
                ListMembership::Deferred => (0, 1),
            };
            if (on_active, on_deferred) != expected {
                return Err(format!(
                    "{id}: list membership {:?} but on lists {on_active}/{on_deferred}",
                    s.list
                ));
            }
            let q: usize = s.queues.iter().map(VecDeque::len).sum();
            if q != s.queued {
                return Err(format!("{id}: queued count {} but {q} in queues", s.queued));
            }
            if s.queued == 0 && s.list != ListMembership::Idle {
                // Allowed transiently only for the active head before the next candidate pass.
                if !(s.list == ListMembership::Active && self.active.front() == Some(&index)) {
                    return Err(format!("{id}: empty but on a list"));
                }
            }
            if s.list == ListMembership::Deferred && s.deficit_bytes != 0 {
                return Err(format!("{id}: deferred with deficit {}", s.deficit_bytes));
            }
            let in_slots: u32 = s.slots.iter().map(|(_, v)| v.submits - v.completions).sum();
            if in_slots as usize != s.in_flight {
                return Err(format!(
                    "{id}: {} in flight but {in_slots} in slots",
                    s.in_flight
                ));
            }
            if let Some(open) = s.open_slot {
                let slot = s.slots.iter().find(|(seq, _)| *seq == open).map(|(_, v)| v);
                if slot.is_none_or_full() {
                    return Err(format!("{id}: open slot missing or full"));
                }
            }
            contending += usize::from(s.is_contending());
            queued += s.queued;
        }
        if contending != self.contending_tenants {
            return Err(format!(
                "contending {} != {contending}",
                self.contending_tenants
            ));
        }
        if queued != self.queued_total {
            return Err(format!("queued {} != {queued}", self.queued_total));
        }
        Ok(())
    }
}

trait SlotOptionExt {
    fn is_none_or_full(&self) -> bool;
}

impl SlotOptionExt for Option<&VirtualSlot> {
    fn is_none_or_full(&self) -> bool {
        self.is_none_or(|s| s.full)
    }
}

#[cfg(test)]
mod tests;
