//! Elastic volumes (eVol, §4.2): fixed-size extents, each volume's extent
//! map, one allocator per namespace, and the catalog that ties them
//! together for the arbiter's volume manager.
//!
//! The arbiter owns one [`ExtentCatalog`]. A first write to an unmapped
//! extent asks it for an [`AllocationPlan`] ([`ExtentCatalog::plan_allocation`],
//! which mutates nothing); the arbiter makes the plan durable (in etcd: the
//! mapping key created only if absent, together with the allocator's
//! update, in one transaction) and only then calls
//! [`ExtentCatalog::apply`]. A standby rebuilds the same catalog from the
//! stored mappings with `apply` too. So the catalog never holds a mapping
//! that is not durable, and a plan that lost a race (the extent was mapped
//! meanwhile, or the physical extent taken) is refused by `apply`.
//!
//! Decisions where the paper is vague:
//! - **Extent size**: 2 MiB by default (§4.2), any power of two from 4 KiB
//!   ([`ExtentGeometry`]); every volume of a catalog uses one size, so a
//!   physical extent index means the same bytes on every namespace.
//! - **Lazy allocation** (§4.2): `create_volume` only reserves capacity
//!   (extents × copies); a physical extent is taken at the first write. A
//!   read of an unmapped extent is zeros and needs nobody
//!   ([`VolumeExtentMap::resolve`] says "unmapped").
//! - **Discard frees whole extents only.** A discard that covers a whole
//!   mapped extent unmaps it ([`ExtentCatalog::unmap`]); partial discards
//!   are the namespace's business (NVMe Deallocate) and keep the mapping.
//!   Freed (and deleted volumes') physical extents are not reusable at
//!   once: they wait in a *zeroing* state until the arbiter reports that a
//!   Write Zeroes (or a Deallocate that reads back zeros) of the range
//!   finished ([`ExtentCatalog::zeroed`]). Otherwise a new volume's read of
//!   a part of a fresh extent it has not written yet would return another
//!   volume's data. A namespace is assumed zeroed when it is added.
//! - **Allocation order** within a namespace: the lowest free index, then
//!   the never-used tail. The allocator keeps a high-water mark plus the
//!   set of freed indexes, so its memory is proportional to the extents
//!   freed, not to the namespace's capacity.
//! - **Copies**: a mapping lists its copies in order; copy 0 is the first
//!   the client writes and the one the placement liked best. All copies
//!   are on distinct namespaces (checked).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{FlintError, Result};
use crate::ids::{NamespaceId, TargetId, VolumeId};
use crate::placement::{self, Candidate, NamespaceLoad, PlacementWeights};

/// The default extent size: 2 MiB, as in the paper (§4.2).
pub const DEFAULT_EXTENT_BYTES: u64 = 2 * 1024 * 1024;

/// Index of an extent inside a volume's logical address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LogicalExtent(pub u64);

/// Index of an extent inside a namespace (its byte offset is the index
/// times the extent size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PhysicalExtent(pub u64);

impl fmt::Display for LogicalExtent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

impl fmt::Display for PhysicalExtent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "P{}", self.0)
    }
}

/// The extent size shared by every volume of a catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentGeometry {
    extent_bytes: u64,
}

impl Default for ExtentGeometry {
    fn default() -> Self {
        ExtentGeometry {
            extent_bytes: DEFAULT_EXTENT_BYTES,
        }
    }
}

/// A piece of an I/O that lies inside one extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The extent.
    pub logical: LogicalExtent,
    /// Byte offset of the piece inside the extent.
    pub offset_in_extent: u64,
    /// Length of the piece in bytes.
    pub len: u64,
}

impl ExtentGeometry {
    /// Extents of `extent_bytes`: a power of two of at least 4 KiB, so an
    /// extent holds whole logical blocks of any common block size.
    pub fn new(extent_bytes: u64) -> Result<Self> {
        if extent_bytes < 4096 || !extent_bytes.is_power_of_two() {
            return Err(FlintError::invalid(
                "extent_bytes",
                format!("must be a power of two of at least 4096, not {extent_bytes}"),
            ));
        }
        Ok(ExtentGeometry { extent_bytes })
    }

    /// The extent size in bytes.
    pub fn extent_bytes(&self) -> u64 {
        self.extent_bytes
    }

    /// Extents needed to hold `bytes` (rounded up).
    pub fn extents_for(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.extent_bytes)
    }

    /// The extent holding byte `offset` of a volume.
    pub fn extent_of(&self, offset: u64) -> LogicalExtent {
        LogicalExtent(offset / self.extent_bytes)
    }

    /// Byte offset of `physical` on its namespace.
    pub fn physical_offset(&self, physical: PhysicalExtent) -> u64 {
        physical.0.saturating_mul(self.extent_bytes)
    }

    /// The pieces of the byte range `offset..offset + len`, one per extent
    /// it touches, in order.
    pub fn segments(&self, offset: u64, len: u64) -> impl Iterator<Item = Segment> + '_ {
        let end = offset.saturating_add(len);
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let logical = self.extent_of(at);
            let offset_in_extent = at % self.extent_bytes;
            let piece = (self.extent_bytes - offset_in_extent).min(end - at);
            at += piece;
            Some(Segment {
                logical,
                offset_in_extent,
                len: piece,
            })
        })
    }
}

/// One copy of an extent: where its bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// The namespace.
    pub namespace: NamespaceId,
    /// The extent inside it.
    pub physical: PhysicalExtent,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.physical)
    }
}

/// Where one logical extent lives: its copies, copy 0 first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentMapping {
    /// The copies, on distinct namespaces.
    pub copies: Vec<Placement>,
}

/// How a volume is created.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeSpec {
    /// Size in bytes (rounded up to whole extents).
    pub size_bytes: u64,
    /// Copies per extent, on distinct namespaces (1 = no replication).
    pub copies: u8,
    /// Only these namespaces may hold the volume's extents (`None`: any).
    pub allowed_namespaces: Option<BTreeSet<NamespaceId>>,
    /// The user's preference per namespace in [-1, 1] (§4.2's
    /// "Preference"): positive prefers, negative avoids; absent is 0.
    pub preference: BTreeMap<NamespaceId, f64>,
}

/// What a byte range of a volume resolves to: a piece and its mapping, if
/// the extent is mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    /// The piece.
    pub segment: Segment,
    /// Its mapping; `None` means unmapped: a read returns zeros, a write
    /// needs an allocation first.
    pub mapping: Option<&'a ExtentMapping>,
}

/// One volume's logical → physical map, as the arbiter holds it and the
/// client caches it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeExtentMap {
    volume: VolumeId,
    geometry: ExtentGeometry,
    size_extents: u64,
    copies: u8,
    map: BTreeMap<LogicalExtent, ExtentMapping>,
    /// Copies of this volume's extents per namespace (the placement's
    /// "Extent#").
    per_namespace: BTreeMap<NamespaceId, u64>,
}

impl VolumeExtentMap {
    /// An empty map of a volume of `size_extents` extents with `copies`
    /// copies each.
    pub fn new(volume: VolumeId, geometry: ExtentGeometry, size_extents: u64, copies: u8) -> Self {
        VolumeExtentMap {
            volume,
            geometry,
            size_extents,
            copies,
            map: BTreeMap::new(),
            per_namespace: BTreeMap::new(),
        }
    }

    /// The volume.
    pub fn volume(&self) -> VolumeId {
        self.volume
    }

    /// The extent size.
    pub fn geometry(&self) -> ExtentGeometry {
        self.geometry
    }

    /// The volume's size in extents.
    pub fn size_extents(&self) -> u64 {
        self.size_extents
    }

    /// Copies per extent.
    pub fn copies(&self) -> u8 {
        self.copies
    }

    /// Mapped extents.
    pub fn mapped_extents(&self) -> u64 {
        self.map.len() as u64
    }

    /// Copies of this volume's extents on `namespace`.
    pub fn extents_on(&self, namespace: NamespaceId) -> u64 {
        self.per_namespace.get(&namespace).copied().unwrap_or(0)
    }

    /// The mapping of `logical`, if mapped.
    pub fn lookup(&self, logical: LogicalExtent) -> Option<&ExtentMapping> {
        self.map.get(&logical)
    }

    /// Every mapping, in logical order.
    pub fn iter(&self) -> impl Iterator<Item = (LogicalExtent, &ExtentMapping)> {
        self.map.iter().map(|(l, m)| (*l, m))
    }

    /// The pieces of `offset..offset + len` with their mappings. The data
    /// path's question: which extents are mapped (send there), which are
    /// not (reads: zeros; writes: allocate first).
    pub fn resolve(&self, offset: u64, len: u64) -> Vec<Resolved<'_>> {
        self.geometry
            .segments(offset, len)
            .map(|segment| Resolved {
                segment,
                mapping: self.map.get(&segment.logical),
            })
            .collect()
    }

    /// The extents wholly covered by `offset..offset + len` that are
    /// mapped: what a discard of that range frees.
    pub fn whole_extents_in(&self, offset: u64, len: u64) -> Vec<LogicalExtent> {
        let extent = self.geometry.extent_bytes();
        let first = offset.div_ceil(extent);
        let end = offset.saturating_add(len) / extent;
        self.map
            .range(LogicalExtent(first)..LogicalExtent(end.max(first)))
            .map(|(l, _)| *l)
            .collect()
    }

    /// Adds a mapping if `logical` has none (the only way a mapping is
    /// created, so two writers can never map one extent twice).
    pub fn insert_if_absent(
        &mut self,
        logical: LogicalExtent,
        mapping: ExtentMapping,
    ) -> Result<()> {
        if logical.0 >= self.size_extents {
            return Err(FlintError::OutOfRange {
                volume: self.volume,
                logical,
                size_extents: self.size_extents,
            });
        }
        if self.map.contains_key(&logical) {
            return Err(FlintError::AlreadyMapped {
                volume: self.volume,
                logical,
            });
        }
        for copy in &mapping.copies {
            *self.per_namespace.entry(copy.namespace).or_insert(0) += 1;
        }
        self.map.insert(logical, mapping);
        Ok(())
    }

    /// Removes and returns the mapping of `logical`.
    pub fn remove(&mut self, logical: LogicalExtent) -> Result<ExtentMapping> {
        let mapping = self.map.remove(&logical).ok_or(FlintError::NotMapped {
            volume: self.volume,
            logical,
        })?;
        for copy in &mapping.copies {
            if let Some(n) = self.per_namespace.get_mut(&copy.namespace) {
                *n -= 1;
                if *n == 0 {
                    self.per_namespace.remove(&copy.namespace);
                }
            }
        }
        Ok(mapping)
    }
}

/// State of one physical extent in its namespace's allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhysicalState {
    /// Never used or zeroed since freed: can be allocated.
    Free,
    /// Allocated (mapped, or about to be).
    Allocated,
    /// Freed, waiting for its zeroing to finish.
    Zeroing,
    /// Beyond the namespace's capacity.
    OutOfRange,
}

/// The free physical extents of one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceAllocator {
    namespace: NamespaceId,
    target: TargetId,
    capacity_extents: u64,
    /// Every index at or above this was never allocated.
    high_water: u64,
    /// Indexes below `high_water` that are free again.
    free: BTreeSet<u64>,
    /// Indexes below `high_water` that wait for zeroing.
    zeroing: BTreeSet<u64>,
}

impl NamespaceAllocator {
    /// An allocator for a (zeroed) namespace of `capacity_extents` extents
    /// on `target`.
    pub fn new(namespace: NamespaceId, target: TargetId, capacity_extents: u64) -> Self {
        NamespaceAllocator {
            namespace,
            target,
            capacity_extents,
            high_water: 0,
            free: BTreeSet::new(),
            zeroing: BTreeSet::new(),
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> NamespaceId {
        self.namespace
    }

    /// The target it is on.
    pub fn target(&self) -> TargetId {
        self.target
    }

    /// Capacity in extents.
    pub fn capacity_extents(&self) -> u64 {
        self.capacity_extents
    }

    /// Extents allocated or waiting for zeroing.
    pub fn used_extents(&self) -> u64 {
        self.high_water - self.free.len() as u64
    }

    /// Extents that can be allocated now.
    pub fn free_extents(&self) -> u64 {
        self.capacity_extents - self.used_extents()
    }

    /// Extents waiting for zeroing.
    pub fn zeroing_extents(&self) -> u64 {
        self.zeroing.len() as u64
    }

    /// The state of `physical`.
    pub fn state(&self, physical: PhysicalExtent) -> PhysicalState {
        let i = physical.0;
        if i >= self.capacity_extents {
            PhysicalState::OutOfRange
        } else if i >= self.high_water || self.free.contains(&i) {
            PhysicalState::Free
        } else if self.zeroing.contains(&i) {
            PhysicalState::Zeroing
        } else {
            PhysicalState::Allocated
        }
    }

    /// The extent the next allocation takes: the lowest free index, else
    /// the never-used tail; `None` when full. Takes nothing.
    pub fn peek(&self) -> Option<PhysicalExtent> {
        if let Some(i) = self.free.first() {
            return Some(PhysicalExtent(*i));
        }
        (self.high_water < self.capacity_extents).then_some(PhysicalExtent(self.high_water))
    }

    /// Takes exactly `physical`, which must be free (a plan being applied,
    /// or a stored mapping being restored).
    pub fn take(&mut self, physical: PhysicalExtent) -> Result<()> {
        match self.state(physical) {
            PhysicalState::Free => {}
            PhysicalState::Allocated => return Err(self.state_error(physical, "already allocated")),
            PhysicalState::Zeroing => return Err(self.state_error(physical, "waiting for zeroing")),
            PhysicalState::OutOfRange => return Err(self.state_error(physical, "beyond capacity")),
        }
        let i = physical.0;
        if i >= self.high_water {
            // Restoring out of order leaves a gap of never-used extents
            // below `i`: they are free.
            self.free.extend(self.high_water..i);
            self.high_water = i + 1;
        } else {
            self.free.remove(&i);
        }
        Ok(())
    }

    /// Frees an allocated extent: it waits for zeroing before reuse.
    pub fn release(&mut self, physical: PhysicalExtent) -> Result<()> {
        if self.state(physical) != PhysicalState::Allocated {
            return Err(self.state_error(physical, "not allocated"));
        }
        self.zeroing.insert(physical.0);
        Ok(())
    }

    /// The zeroing of `physical` finished: it is free.
    pub fn zeroed(&mut self, physical: PhysicalExtent) -> Result<()> {
        if !self.zeroing.remove(&physical.0) {
            return Err(self.state_error(physical, "not waiting for zeroing"));
        }
        self.free.insert(physical.0);
        Ok(())
    }

    /// Extents waiting for zeroing, lowest first (what the arbiter must
    /// zero).
    pub fn pending_zeroing(&self) -> impl Iterator<Item = PhysicalExtent> + '_ {
        self.zeroing.iter().map(|i| PhysicalExtent(*i))
    }

    /// Every allocated extent (not free, not zeroing), lowest first.
    pub fn allocated(&self) -> impl Iterator<Item = PhysicalExtent> + '_ {
        (0..self.high_water)
            .filter(|i| !self.free.contains(i) && !self.zeroing.contains(i))
            .map(PhysicalExtent)
    }

    fn state_error(&self, physical: PhysicalExtent, state: &'static str) -> FlintError {
        FlintError::PhysicalState {
            namespace: self.namespace,
            physical,
            state,
        }
    }
}

/// An allocation the catalog proposes: durable first, then applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocationPlan {
    /// The volume.
    pub volume: VolumeId,
    /// The extent being mapped.
    pub logical: LogicalExtent,
    /// Its copies.
    pub mapping: ExtentMapping,
    /// Every candidate's score, lowest (best) first: for status and for
    /// explaining a placement.
    pub scores: Vec<(NamespaceId, f64)>,
}

/// Something the invariant check found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Violation {
    /// One physical extent is in two mappings (or twice in one).
    MappedTwice {
        /// The physical extent.
        placement: Placement,
        /// The first mapping that holds it.
        first: (VolumeId, LogicalExtent),
        /// The second.
        second: (VolumeId, LogicalExtent),
    },
    /// A mapping points beyond its namespace's capacity.
    BeyondCapacity {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
        /// The bad copy.
        placement: Placement,
        /// The namespace's capacity in extents.
        capacity_extents: u64,
    },
    /// A mapping names a namespace nobody knows.
    UnknownNamespace {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
        /// The bad copy.
        placement: Placement,
    },
    /// Two copies of one extent on one namespace.
    CopiesShareNamespace {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
        /// The namespace.
        namespace: NamespaceId,
    },
    /// A mapping with a number of copies other than the volume's.
    CopyCount {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
        /// The volume's copies.
        expected: u8,
        /// The mapping's.
        found: usize,
    },
    /// A mapped extent beyond the volume's size.
    BeyondVolume {
        /// The volume.
        volume: VolumeId,
        /// The extent.
        logical: LogicalExtent,
    },
    /// A mapped physical extent the allocator holds as free or zeroing
    /// (the next allocation could hand it out again).
    MappedButNotAllocated {
        /// The physical extent.
        placement: Placement,
    },
    /// An allocated physical extent no mapping holds (space leaked; not a
    /// danger to data).
    Leaked {
        /// The physical extent.
        placement: Placement,
    },
}

/// Checks the invariants of a set of extent maps against the namespaces'
/// capacities (in extents): no physical extent mapped twice, every mapping
/// within its namespace's capacity and its volume's size, copies on
/// distinct namespaces, the volume's number of copies. Usable on maps read
/// back from a store, without a catalog (a `check` command).
pub fn check_maps<'a>(
    capacities: &BTreeMap<NamespaceId, u64>,
    maps: impl IntoIterator<Item = &'a VolumeExtentMap>,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut owner: BTreeMap<Placement, (VolumeId, LogicalExtent)> = BTreeMap::new();
    for map in maps {
        let volume = map.volume();
        for (logical, mapping) in map.iter() {
            if logical.0 >= map.size_extents() {
                violations.push(Violation::BeyondVolume { volume, logical });
            }
            if mapping.copies.len() != usize::from(map.copies()) {
                violations.push(Violation::CopyCount {
                    volume,
                    logical,
                    expected: map.copies(),
                    found: mapping.copies.len(),
                });
            }
            let mut seen = BTreeSet::new();
            for &placement in &mapping.copies {
                if !seen.insert(placement.namespace) {
                    violations.push(Violation::CopiesShareNamespace {
                        volume,
                        logical,
                        namespace: placement.namespace,
                    });
                }
                match capacities.get(&placement.namespace) {
                    None => violations.push(Violation::UnknownNamespace {
                        volume,
                        logical,
                        placement,
                    }),
                    Some(&capacity_extents) if placement.physical.0 >= capacity_extents => {
                        violations.push(Violation::BeyondCapacity {
                            volume,
                            logical,
                            placement,
                            capacity_extents,
                        })
                    }
                    Some(_) => {}
                }
                if let Some(first) = owner.insert(placement, (volume, logical)) {
                    violations.push(Violation::MappedTwice {
                        placement,
                        first,
                        second: (volume, logical),
                    });
                }
            }
        }
    }
    violations
}

/// Every namespace's allocator and every volume's map: the volume
/// manager's state (§4.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExtentCatalog {
    geometry: ExtentGeometry,
    namespaces: BTreeMap<NamespaceId, NamespaceAllocator>,
    volumes: BTreeMap<VolumeId, (VolumeSpec, VolumeExtentMap)>,
}

impl ExtentCatalog {
    /// An empty catalog with extents of `geometry`.
    pub fn new(geometry: ExtentGeometry) -> Self {
        ExtentCatalog {
            geometry,
            namespaces: BTreeMap::new(),
            volumes: BTreeMap::new(),
        }
    }

    /// The extent size.
    pub fn geometry(&self) -> ExtentGeometry {
        self.geometry
    }

    /// Adds a (zeroed) namespace of `capacity_bytes` on `target`; a partial
    /// extent at its end is not used.
    pub fn add_namespace(
        &mut self,
        namespace: NamespaceId,
        target: TargetId,
        capacity_bytes: u64,
    ) -> Result<()> {
        if self.namespaces.contains_key(&namespace) {
            return Err(FlintError::DuplicateNamespace(namespace));
        }
        let capacity_extents = capacity_bytes / self.geometry.extent_bytes();
        self.namespaces.insert(
            namespace,
            NamespaceAllocator::new(namespace, target, capacity_extents),
        );
        Ok(())
    }

    /// The allocator of `namespace`.
    pub fn namespace(&self, namespace: NamespaceId) -> Option<&NamespaceAllocator> {
        self.namespaces.get(&namespace)
    }

    /// Every namespace's allocator, in id order.
    pub fn namespaces(&self) -> impl Iterator<Item = &NamespaceAllocator> {
        self.namespaces.values()
    }

    /// Extents promised to volumes but not yet allocated (size × copies
    /// minus what is mapped).
    pub fn reserved_extents(&self) -> u64 {
        self.volumes
            .values()
            .map(|(_, map)| (map.size_extents() - map.mapped_extents()) * u64::from(map.copies()))
            .sum()
    }

    /// Extents neither allocated nor promised.
    pub fn unreserved_extents(&self) -> u64 {
        let free: u64 = self.namespaces.values().map(|a| a.free_extents()).sum();
        free.saturating_sub(self.reserved_extents())
    }

    /// Creates a volume: checks and reserves capacity, places nothing
    /// (lazy allocation, §4.2).
    pub fn create_volume(&mut self, volume: VolumeId, spec: VolumeSpec) -> Result<()> {
        if self.volumes.contains_key(&volume) {
            return Err(FlintError::DuplicateVolume(volume));
        }
        if spec.copies == 0 {
            return Err(FlintError::invalid("copies", "must be at least 1"));
        }
        if let Some((ns, p)) = spec
            .preference
            .iter()
            .find(|(_, p)| !(-1.0..=1.0).contains(*p))
        {
            return Err(FlintError::invalid(
                "preference",
                format!("{ns}: {p} is outside [-1, 1]"),
            ));
        }
        let usable: Vec<_> = self
            .namespaces
            .keys()
            .filter(|ns| {
                spec.allowed_namespaces
                    .as_ref()
                    .is_none_or(|a| a.contains(ns))
            })
            .collect();
        if usable.len() < usize::from(spec.copies) {
            return Err(FlintError::NoRoom(format!(
                "{} copies need as many namespaces, {} are usable",
                spec.copies,
                usable.len()
            )));
        }
        let size_extents = self.geometry.extents_for(spec.size_bytes);
        let needed = size_extents * u64::from(spec.copies);
        if needed > self.unreserved_extents() {
            return Err(FlintError::NoRoom(format!(
                "{volume} needs {needed} extents, {} are unreserved",
                self.unreserved_extents()
            )));
        }
        let map = VolumeExtentMap::new(volume, self.geometry, size_extents, spec.copies);
        self.volumes.insert(volume, (spec, map));
        Ok(())
    }

    /// Deletes a volume; its physical extents go to zeroing. Returns them.
    pub fn delete_volume(&mut self, volume: VolumeId) -> Result<Vec<Placement>> {
        let (_, map) = self
            .volumes
            .remove(&volume)
            .ok_or(FlintError::UnknownVolume(volume))?;
        let mut freed = Vec::new();
        for (_, mapping) in map.iter() {
            for &copy in &mapping.copies {
                if let Some(a) = self.namespaces.get_mut(&copy.namespace) {
                    a.release(copy.physical)?;
                    freed.push(copy);
                }
            }
        }
        Ok(freed)
    }

    /// The spec and map of `volume`.
    pub fn volume(&self, volume: VolumeId) -> Option<(&VolumeSpec, &VolumeExtentMap)> {
        self.volumes.get(&volume).map(|(s, m)| (s, m))
    }

    /// Every volume's map, in id order.
    pub fn volume_maps(&self) -> impl Iterator<Item = &VolumeExtentMap> {
        self.volumes.values().map(|(_, m)| m)
    }

    /// Proposes copies for `logical` of `volume` with the placement score
    /// (`loads` gives each namespace's busy degree and write cost from the
    /// view). Mutates nothing: make the plan durable, then [`apply`].
    ///
    /// [`apply`]: Self::apply
    pub fn plan_allocation(
        &self,
        volume: VolumeId,
        logical: LogicalExtent,
        weights: &PlacementWeights,
        loads: impl Fn(NamespaceId) -> NamespaceLoad,
    ) -> Result<AllocationPlan> {
        let (spec, map) = self
            .volumes
            .get(&volume)
            .ok_or(FlintError::UnknownVolume(volume))?;
        if logical.0 >= map.size_extents() {
            return Err(FlintError::OutOfRange {
                volume,
                logical,
                size_extents: map.size_extents(),
            });
        }
        if map.lookup(logical).is_some() {
            return Err(FlintError::AlreadyMapped { volume, logical });
        }
        let candidates: Vec<Candidate> = self
            .namespaces
            .values()
            .filter(|a| {
                spec.allowed_namespaces
                    .as_ref()
                    .is_none_or(|allowed| allowed.contains(&a.namespace()))
            })
            .filter(|a| a.free_extents() > 0)
            .map(|a| {
                let load = loads(a.namespace());
                Candidate {
                    namespace: a.namespace(),
                    target: a.target(),
                    volume_extents: map.extents_on(a.namespace()),
                    capacity_used: a.used_extents() as f64 / a.capacity_extents().max(1) as f64,
                    busy_degree: load.busy_degree,
                    write_cost_degree: load.write_cost_degree,
                    preference: spec.preference.get(&a.namespace()).copied().unwrap_or(0.0),
                }
            })
            .collect();
        let volume_total = map.mapped_extents() * u64::from(map.copies());
        let choice = placement::choose(
            weights,
            volume_total,
            &candidates,
            usize::from(map.copies()),
        )?;
        let copies = choice
            .chosen
            .iter()
            .map(|ns| {
                let physical = self.namespaces[ns]
                    .peek()
                    .expect("candidates have a free extent");
                Placement {
                    namespace: *ns,
                    physical,
                }
            })
            .collect();
        Ok(AllocationPlan {
            volume,
            logical,
            mapping: ExtentMapping { copies },
            scores: choice.scores,
        })
    }

    /// Applies a durable plan (or restores a stored mapping): takes the
    /// physical extents and maps the extent. Refuses, changing nothing, a
    /// plan whose extent got mapped or whose physical extents got taken.
    pub fn apply(&mut self, plan: &AllocationPlan) -> Result<()> {
        let (_, map) = self
            .volumes
            .get(&plan.volume)
            .ok_or(FlintError::UnknownVolume(plan.volume))?;
        if plan.logical.0 >= map.size_extents() {
            return Err(FlintError::OutOfRange {
                volume: plan.volume,
                logical: plan.logical,
                size_extents: map.size_extents(),
            });
        }
        if map.lookup(plan.logical).is_some() {
            return Err(FlintError::AlreadyMapped {
                volume: plan.volume,
                logical: plan.logical,
            });
        }
        if plan.mapping.copies.len() != usize::from(map.copies()) {
            return Err(FlintError::invalid(
                "copies",
                format!(
                    "plan has {} copies, {} has {}",
                    plan.mapping.copies.len(),
                    plan.volume,
                    map.copies()
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for copy in &plan.mapping.copies {
            if !seen.insert(copy.namespace) {
                return Err(FlintError::invalid(
                    "copies",
                    format!("two copies on {}", copy.namespace),
                ));
            }
            let a = self
                .namespaces
                .get(&copy.namespace)
                .ok_or(FlintError::UnknownNamespace(copy.namespace))?;
            if a.state(copy.physical) != PhysicalState::Free {
                return Err(FlintError::PhysicalState {
                    namespace: copy.namespace,
                    physical: copy.physical,
                    state: "not free",
                });
            }
        }
        // Every check passed: nothing below can fail.
        for copy in &plan.mapping.copies {
            self.namespaces
                .get_mut(&copy.namespace)
                .expect("checked above")
                .take(copy.physical)
                .expect("checked free above");
        }
        let (_, map) = self.volumes.get_mut(&plan.volume).expect("checked above");
        map.insert_if_absent(plan.logical, plan.mapping.clone())
            .expect("checked unmapped and in range above");
        Ok(())
    }

    /// Unmaps `logical` (a discard covered it whole): its physical extents
    /// go to zeroing. Returns the old mapping.
    pub fn unmap(&mut self, volume: VolumeId, logical: LogicalExtent) -> Result<ExtentMapping> {
        let (_, map) = self
            .volumes
            .get_mut(&volume)
            .ok_or(FlintError::UnknownVolume(volume))?;
        let mapping = map.remove(logical)?;
        for copy in &mapping.copies {
            if let Some(a) = self.namespaces.get_mut(&copy.namespace) {
                a.release(copy.physical)?;
            }
        }
        Ok(mapping)
    }

    /// Puts a free physical extent in the zeroing state: what a catalog
    /// rebuilt from stored mappings does with the extents its owner freed
    /// (unmapped) but has not zeroed yet, which the stored mappings no
    /// longer show.
    pub fn quarantine(&mut self, placement: Placement) -> Result<()> {
        let a = self
            .namespaces
            .get_mut(&placement.namespace)
            .ok_or(FlintError::UnknownNamespace(placement.namespace))?;
        a.take(placement.physical)?;
        a.release(placement.physical)
    }

    /// The zeroing of `placement` finished: its extent is free again.
    pub fn zeroed(&mut self, placement: Placement) -> Result<()> {
        self.namespaces
            .get_mut(&placement.namespace)
            .ok_or(FlintError::UnknownNamespace(placement.namespace))?
            .zeroed(placement.physical)
    }

    /// Every invariant: [`check_maps`] plus agreement between maps and
    /// allocators (a mapped extent is allocated; an allocated one is
    /// mapped, else it leaked).
    pub fn check(&self) -> Vec<Violation> {
        let capacities = self
            .namespaces
            .iter()
            .map(|(ns, a)| (*ns, a.capacity_extents()))
            .collect();
        let mut violations = check_maps(&capacities, self.volume_maps());
        let mut mapped = BTreeSet::new();
        for map in self.volume_maps() {
            for (_, mapping) in map.iter() {
                for &placement in &mapping.copies {
                    mapped.insert(placement);
                    if let Some(a) = self.namespaces.get(&placement.namespace) {
                        if a.state(placement.physical) != PhysicalState::Allocated {
                            violations.push(Violation::MappedButNotAllocated { placement });
                        }
                    }
                }
            }
        }
        for a in self.namespaces.values() {
            for physical in a.allocated() {
                let placement = Placement {
                    namespace: a.namespace(),
                    physical,
                };
                if !mapped.contains(&placement) {
                    violations.push(Violation::Leaked { placement });
                }
            }
        }
        violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1024 * 1024;

    fn catalog(namespaces: u32, capacity_extents: u64) -> ExtentCatalog {
        let mut c = ExtentCatalog::new(ExtentGeometry::default());
        for i in 0..namespaces {
            c.add_namespace(NamespaceId(i), TargetId(i / 2), capacity_extents * 2 * MIB)
                .unwrap();
        }
        c
    }

    fn idle(_: NamespaceId) -> NamespaceLoad {
        NamespaceLoad::default()
    }

    fn allocate(c: &mut ExtentCatalog, v: u32, l: u64) -> AllocationPlan {
        let plan = c
            .plan_allocation(
                VolumeId(v),
                LogicalExtent(l),
                &PlacementWeights::default(),
                idle,
            )
            .unwrap();
        c.apply(&plan).unwrap();
        plan
    }

    #[test]
    fn geometry_splits_ranges_at_extent_boundaries() {
        let g = ExtentGeometry::default();
        let s: Vec<_> = g.segments(2 * MIB - 4096, 8192 + 4 * MIB).collect();
        assert_eq!(s.len(), 4);
        assert_eq!(
            s[0],
            Segment {
                logical: LogicalExtent(0),
                offset_in_extent: 2 * MIB - 4096,
                len: 4096
            }
        );
        assert_eq!(s[1].len, 2 * MIB);
        assert_eq!(s[3].logical, LogicalExtent(3));
        assert_eq!(s[3].len, 4096);
        assert_eq!(s.iter().map(|s| s.len).sum::<u64>(), 8192 + 4 * MIB);
        assert!(ExtentGeometry::new(3 * MIB).is_err());
        assert!(ExtentGeometry::new(2048).is_err());
        assert_eq!(g.segments(5, 0).count(), 0);
    }

    #[test]
    fn lazy_allocation_reserves_then_maps_on_first_write() {
        let mut c = catalog(4, 8);
        c.create_volume(
            VolumeId(1),
            VolumeSpec {
                size_bytes: 20 * MIB,
                copies: 1,
                ..VolumeSpec::default()
            },
        )
        .unwrap();
        assert_eq!(c.reserved_extents(), 10);
        assert_eq!(c.unreserved_extents(), 22);
        let err = c
            .create_volume(
                VolumeId(2),
                VolumeSpec {
                    size_bytes: 23 * 2 * MIB,
                    copies: 1,
                    ..VolumeSpec::default()
                },
            )
            .unwrap_err();
        assert!(matches!(err, FlintError::NoRoom(_)), "{err}");
        let (_, map) = c.volume(VolumeId(1)).unwrap();
        assert!(
            map.resolve(0, 4096)[0].mapping.is_none(),
            "reads of unmapped are zeros"
        );
        let plan = allocate(&mut c, 1, 3);
        assert_eq!(c.reserved_extents(), 9);
        let (_, map) = c.volume(VolumeId(1)).unwrap();
        let r = map.resolve(3 * 2 * MIB + 512, 4096);
        assert_eq!(r[0].mapping, Some(&plan.mapping));
        // A second plan for the same extent is refused before and after.
        assert!(matches!(
            c.plan_allocation(
                VolumeId(1),
                LogicalExtent(3),
                &PlacementWeights::default(),
                idle
            ),
            Err(FlintError::AlreadyMapped { .. })
        ));
        assert!(matches!(
            c.apply(&plan),
            Err(FlintError::AlreadyMapped { .. })
        ));
        assert!(c.check().is_empty());
    }

    #[test]
    fn a_stale_plan_whose_physical_extent_was_taken_is_refused() {
        let mut c = catalog(1, 8);
        for v in [1, 2] {
            c.create_volume(
                VolumeId(v),
                VolumeSpec {
                    size_bytes: 4 * MIB,
                    copies: 1,
                    ..VolumeSpec::default()
                },
            )
            .unwrap();
        }
        let p1 = c
            .plan_allocation(
                VolumeId(1),
                LogicalExtent(0),
                &PlacementWeights::default(),
                idle,
            )
            .unwrap();
        let p2 = c
            .plan_allocation(
                VolumeId(2),
                LogicalExtent(0),
                &PlacementWeights::default(),
                idle,
            )
            .unwrap();
        assert_eq!(p1.mapping, p2.mapping, "both saw the same free extent");
        c.apply(&p1).unwrap();
        let before = c.clone();
        assert!(matches!(
            c.apply(&p2),
            Err(FlintError::PhysicalState { .. })
        ));
        assert_eq!(c, before, "a refused plan changes nothing");
    }

    #[test]
    fn copies_go_to_distinct_namespaces_and_targets() {
        let mut c = catalog(4, 8);
        c.create_volume(
            VolumeId(1),
            VolumeSpec {
                size_bytes: 8 * MIB,
                copies: 2,
                ..VolumeSpec::default()
            },
        )
        .unwrap();
        for l in 0..4 {
            let plan = allocate(&mut c, 1, l);
            let targets: BTreeSet<_> = plan
                .mapping
                .copies
                .iter()
                .map(|p| c.namespace(p.namespace).unwrap().target())
                .collect();
            assert_eq!(targets.len(), 2, "{plan:?}");
        }
        assert!(c.check().is_empty());
    }

    #[test]
    fn discard_frees_through_zeroing_and_delete_frees_everything() {
        let mut c = catalog(2, 4);
        c.create_volume(
            VolumeId(1),
            VolumeSpec {
                size_bytes: 8 * MIB,
                copies: 1,
                ..VolumeSpec::default()
            },
        )
        .unwrap();
        for l in 0..4 {
            allocate(&mut c, 1, l);
        }
        let (_, map) = c.volume(VolumeId(1)).unwrap();
        // 1 MiB..7 MiB covers extents 1 and 2 whole, 0 and 3 in part.
        assert_eq!(
            map.whole_extents_in(MIB, 6 * MIB),
            vec![LogicalExtent(1), LogicalExtent(2)]
        );
        assert_eq!(map.whole_extents_in(MIB, MIB), vec![]);
        let old = c.unmap(VolumeId(1), LogicalExtent(1)).unwrap();
        let p = old.copies[0];
        let a = c.namespace(p.namespace).unwrap();
        assert_eq!(a.state(p.physical), PhysicalState::Zeroing);
        assert_eq!(a.pending_zeroing().collect::<Vec<_>>(), vec![p.physical]);
        assert!(c.check().is_empty());
        // Not reusable before zeroing: the freed extent is not the next.
        c.zeroed(p).unwrap();
        assert_eq!(
            c.namespace(p.namespace).unwrap().state(p.physical),
            PhysicalState::Free
        );
        assert!(c.zeroed(p).is_err());
        let freed = c.delete_volume(VolumeId(1)).unwrap();
        assert_eq!(freed.len(), 3);
        assert!(c.check().is_empty());
        assert_eq!(c.reserved_extents(), 0);
    }

    #[test]
    fn check_finds_double_mapping_and_capacity_violations() {
        let g = ExtentGeometry::default();
        let mut a = VolumeExtentMap::new(VolumeId(1), g, 4, 1);
        let mut b = VolumeExtentMap::new(VolumeId(2), g, 4, 1);
        let p = Placement {
            namespace: NamespaceId(0),
            physical: PhysicalExtent(2),
        };
        a.insert_if_absent(LogicalExtent(0), ExtentMapping { copies: vec![p] })
            .unwrap();
        b.insert_if_absent(LogicalExtent(1), ExtentMapping { copies: vec![p] })
            .unwrap();
        let far = Placement {
            namespace: NamespaceId(0),
            physical: PhysicalExtent(9),
        };
        b.insert_if_absent(LogicalExtent(2), ExtentMapping { copies: vec![far] })
            .unwrap();
        let caps = BTreeMap::from([(NamespaceId(0), 8)]);
        let v = check_maps(&caps, [&a, &b]);
        assert!(v.contains(&Violation::MappedTwice {
            placement: p,
            first: (VolumeId(1), LogicalExtent(0)),
            second: (VolumeId(2), LogicalExtent(1)),
        }));
        assert!(v
            .iter()
            .any(|v| matches!(v, Violation::BeyondCapacity { .. })));
        assert_eq!(v.len(), 2, "{v:?}");
    }

    #[test]
    fn restoring_out_of_order_leaves_the_gap_free() {
        let mut a = NamespaceAllocator::new(NamespaceId(0), TargetId(0), 10);
        a.take(PhysicalExtent(5)).unwrap();
        assert_eq!(a.used_extents(), 1);
        assert_eq!(a.peek(), Some(PhysicalExtent(0)));
        a.take(PhysicalExtent(0)).unwrap();
        assert!(a.take(PhysicalExtent(5)).is_err());
        assert!(a.take(PhysicalExtent(10)).is_err());
        assert_eq!(
            a.allocated().collect::<Vec<_>>(),
            vec![PhysicalExtent(0), PhysicalExtent(5)]
        );
        assert_eq!(a.free_extents(), 8);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Allocate { volume: u32, logical: u64 },
        Unmap { volume: u32, logical: u64 },
        ZeroAll,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..3, 0u64..12).prop_map(|(volume, logical)| Op::Allocate { volume, logical }),
            2 => (0u32..3, 0u64..12).prop_map(|(volume, logical)| Op::Unmap { volume, logical }),
            1 => Just(Op::ZeroAll),
        ]
    }

    proptest! {
        /// Whatever the order of allocations, discards and zeroings, the
        /// catalog never maps a physical extent twice, never leaks one and
        /// never exceeds a namespace.
        #[test]
        fn invariants_hold_under_any_sequence(ops in proptest::collection::vec(op(), 1..120)) {
            let mut c = catalog(3, 20);
            for v in 0..3 {
                c.create_volume(VolumeId(v), VolumeSpec {
                    size_bytes: 12 * 2 * MIB,
                    copies: if v == 2 { 2 } else { 1 },
                    ..VolumeSpec::default()
                }).unwrap_or(());
            }
            for op in ops {
                match op {
                    Op::Allocate { volume, logical } => {
                        if let Ok(plan) = c.plan_allocation(
                            VolumeId(volume), LogicalExtent(logical),
                            &PlacementWeights::default(), idle,
                        ) {
                            c.apply(&plan).unwrap();
                        }
                    }
                    Op::Unmap { volume, logical } => {
                        let _ = c.unmap(VolumeId(volume), LogicalExtent(logical));
                    }
                    Op::ZeroAll => {
                        let pending: Vec<Placement> = c.namespaces().flat_map(|a| {
                            let ns = a.namespace();
                            a.pending_zeroing().map(move |physical| Placement { namespace: ns, physical })
                        }).collect();
                        for p in pending {
                            c.zeroed(p).unwrap();
                        }
                    }
                }
                let violations = c.check();
                prop_assert!(violations.is_empty(), "{:?}", violations);
            }
        }
    }
}
