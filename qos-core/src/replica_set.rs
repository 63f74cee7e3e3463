//! [`ReplicaSet`]: a set of replica indices (0..[`MAX_REPLICAS`]).
//!
//! A mirrored volume names its replicas by index; which of them a write
//! went to, which take writes, which serve reads, which parts of a request
//! are still outstanding are all sets of those indices. A bit set keeps
//! them `Copy` and cheap on the data path, and this type keeps the bit
//! arithmetic in one place.

use std::fmt;

/// Most replicas a volume may have (the intent log's header holds this
/// many identities; the config refuses more).
pub const MAX_REPLICAS: usize = 16;

/// A set of replica indices, each below [`MAX_REPLICAS`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ReplicaSet(u32);

impl ReplicaSet {
    /// No replica.
    pub const EMPTY: ReplicaSet = ReplicaSet(0);

    /// Replica 0 alone (a one-target volume).
    pub const FIRST: ReplicaSet = ReplicaSet(1);

    /// Replica `r` alone.
    pub fn one(r: usize) -> Self {
        debug_assert!(r < MAX_REPLICAS, "replica {r} out of range");
        ReplicaSet(1 << r)
    }

    /// Replicas `0..n`.
    pub fn first_n(n: usize) -> Self {
        debug_assert!(n <= MAX_REPLICAS, "{n} replicas out of range");
        if n == 0 {
            ReplicaSet(0)
        } else {
            ReplicaSet(u32::MAX >> (32 - n))
        }
    }

    /// The set whose bit `r` is bit `r` of `bits` (for stored forms:
    /// atomics, the intent log).
    pub const fn from_bits(bits: u32) -> Self {
        ReplicaSet(bits)
    }

    /// Bit `r` set when replica `r` is in the set.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether replica `r` is in the set.
    pub fn contains(self, r: usize) -> bool {
        r < 32 && self.0 & (1 << r) != 0
    }

    /// Adds replica `r`.
    pub fn insert(&mut self, r: usize) {
        debug_assert!(r < MAX_REPLICAS, "replica {r} out of range");
        self.0 |= 1 << r;
    }

    /// Removes replica `r`; whether it was there.
    pub fn remove(&mut self, r: usize) -> bool {
        let had = self.contains(r);
        if r < 32 {
            self.0 &= !(1 << r);
        }
        had
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// How many replicas are in the set.
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The lowest replica in the set.
    pub fn first(self) -> Option<usize> {
        (self.0 != 0).then(|| self.0.trailing_zeros() as usize)
    }

    /// Replicas in both sets.
    pub const fn intersection(self, other: ReplicaSet) -> ReplicaSet {
        ReplicaSet(self.0 & other.0)
    }

    /// Replicas in either set.
    pub const fn union(self, other: ReplicaSet) -> ReplicaSet {
        ReplicaSet(self.0 | other.0)
    }

    /// Replicas of `self` not in `other`.
    pub const fn difference(self, other: ReplicaSet) -> ReplicaSet {
        ReplicaSet(self.0 & !other.0)
    }

    /// `self` without replica `r`.
    pub fn without(mut self, r: usize) -> ReplicaSet {
        self.remove(r);
        self
    }

    /// `self` with replica `r`.
    pub fn with(mut self, r: usize) -> ReplicaSet {
        self.insert(r);
        self
    }

    /// Whether every replica of `self` is in `other`.
    pub const fn is_subset(self, other: ReplicaSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The replicas in the set, lowest first.
    pub fn iter(self) -> Iter {
        Iter(self.0)
    }
}

/// The replicas of a [`ReplicaSet`], lowest first.
#[derive(Clone, Debug)]
pub struct Iter(u32);

impl Iterator for Iter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        (self.0 != 0).then(|| {
            let r = self.0.trailing_zeros() as usize;
            self.0 &= self.0 - 1;
            r
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Iter {}

impl IntoIterator for ReplicaSet {
    type Item = usize;
    type IntoIter = Iter;

    fn into_iter(self) -> Iter {
        self.iter()
    }
}

impl FromIterator<usize> for ReplicaSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut s = ReplicaSet::EMPTY;
        for r in iter {
            s.insert(r);
        }
        s
    }
}

impl fmt::Debug for ReplicaSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let a: ReplicaSet = [0, 2, 5].into_iter().collect();
        assert_eq!(a.bits(), 0b100101);
        assert_eq!(a.len(), 3);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 2, 5]);
        assert!(a.contains(2) && !a.contains(1) && !a.contains(40));
        assert_eq!(a.without(2).iter().collect::<Vec<_>>(), vec![0, 5]);
        assert_eq!(a.first(), Some(0));
        assert_eq!(ReplicaSet::EMPTY.first(), None);
        assert_eq!(ReplicaSet::first_n(3).bits(), 0b111);
        assert_eq!(ReplicaSet::first_n(0), ReplicaSet::EMPTY);
        assert_eq!(ReplicaSet::first_n(MAX_REPLICAS).len(), MAX_REPLICAS);
        let b = ReplicaSet::one(2).with(3);
        assert_eq!(a.intersection(b), ReplicaSet::one(2));
        assert_eq!(a.union(b).len(), 4);
        assert_eq!(a.difference(b).bits(), 0b100001);
        assert!(ReplicaSet::one(5).is_subset(a));
        assert_eq!(format!("{a:?}"), "{0, 2, 5}");
        let mut c = a;
        assert!(c.remove(0) && !c.remove(0));
    }
}
