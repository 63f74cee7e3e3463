//! The placement score of §4.2: which namespaces get a new extent's
//! copies.
//!
//! ```text
//! score(vol, ns) = α · extents + β · capacity_used + γ · busy
//!                + δ · write_cost − η · preference          (lowest wins)
//! ```
//!
//! Decisions where the paper is vague (it gives the terms, not their
//! units):
//! - **extents** ("Extent#", "prior allocation history") counts *this
//!   volume's* copies on the namespace, relative to its fair share: the
//!   count divided by (the volume's copies so far / candidates + 1). It is
//!   1 when the volume is spread evenly, 2 on a namespace holding twice its
//!   share. Counting the volume's own extents is what spreads an eVol over
//!   many drives (its bandwidth); balancing the drives' fill across
//!   volumes is the capacity term's job. Relative to the fair share, so the
//!   spreading force does not fade as the volume grows.
//! - **capacity_used** is the namespace's used fraction, in [0, 1].
//! - **busy** is the view's busy degree in [0, 1] (utilization of the
//!   namespace's profiled bandwidth, [`crate::view`]).
//! - **write_cost** is the view's write cost mapped to [0, 1]
//!   ((cost − 1) / (worst − 1)): §4.2's "fragment degree", which §3.3
//!   approximates with Gimbal's dynamic write cost.
//! - **preference** is the user's, in [-1, 1]; positive prefers.
//! - Defaults: α = 1, β = 1, γ = 2, δ = 1, η = 1. With γ = 2 a saturated
//!   namespace (busy ≈ 1) costs as much as holding twice one's share
//!   more, so a volume avoids it entirely unless the others are far over
//!   their share; a namespace at 30 % busy gets proportionally fewer
//!   extents. `docs/flint-simulation.md` compares γ = 2 with γ = 0.
//! - The paper keeps a score matrix per volume updated periodically; the
//!   scores are computed on demand here (a handful of namespaces per
//!   allocation, microseconds), from the view's latest epoch.
//! - Ties go to the lowest namespace id, so equal namespaces are filled
//!   round-robin and a run is reproducible.
//! - **K copies** (§4.4 takes the K lowest scores): the first copy is the
//!   lowest score; each next one is the lowest score on a target no
//!   earlier copy uses, and only when every target is used, the lowest on
//!   a namespace not yet used. A target failure then costs at most one copy
//!   when the candidates allow it.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::{FlintError, Result};
use crate::ids::{NamespaceId, TargetId};

/// The weights of the score's terms (α, β, γ, δ, η).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementWeights {
    /// α: this volume's extents on the namespace, relative to its share.
    pub extents: f64,
    /// β: the namespace's used capacity fraction.
    pub capacity_used: f64,
    /// γ: the view's busy degree.
    pub busy: f64,
    /// δ: the view's write cost, as a degree in [0, 1].
    pub write_cost: f64,
    /// η: the user's preference (subtracted).
    pub preference: f64,
}

impl Default for PlacementWeights {
    fn default() -> Self {
        PlacementWeights {
            extents: 1.0,
            capacity_used: 1.0,
            busy: 2.0,
            write_cost: 1.0,
            preference: 1.0,
        }
    }
}

impl PlacementWeights {
    /// Every weight finite and non-negative.
    pub fn validate(&self) -> Result<()> {
        for (field, w) in [
            ("extents", self.extents),
            ("capacity_used", self.capacity_used),
            ("busy", self.busy),
            ("write_cost", self.write_cost),
            ("preference", self.preference),
        ] {
            if !w.is_finite() || w < 0.0 {
                return Err(FlintError::invalid(
                    field,
                    format!("must be finite and >= 0, not {w}"),
                ));
            }
        }
        Ok(())
    }
}

/// What the view says about a namespace, for placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NamespaceLoad {
    /// Busy degree in [0, 1].
    pub busy_degree: f64,
    /// Write cost as a degree in [0, 1].
    pub write_cost_degree: f64,
}

/// One namespace that could take a copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The namespace.
    pub namespace: NamespaceId,
    /// Its target.
    pub target: TargetId,
    /// This volume's copies already on it.
    pub volume_extents: u64,
    /// Its used capacity fraction in [0, 1].
    pub capacity_used: f64,
    /// The view's busy degree in [0, 1].
    pub busy_degree: f64,
    /// The view's write cost degree in [0, 1].
    pub write_cost_degree: f64,
    /// The user's preference in [-1, 1].
    pub preference: f64,
}

/// The namespaces chosen for the copies, and every candidate's score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// One namespace per copy, copy 0 first.
    pub chosen: Vec<NamespaceId>,
    /// Every candidate's score, lowest first.
    pub scores: Vec<(NamespaceId, f64)>,
}

fn unit(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// The score of `candidate` for a volume that has `volume_copies` copies
/// placed so far among `candidates` namespaces. Lower is better.
pub fn score(
    weights: &PlacementWeights,
    volume_copies: u64,
    candidates: usize,
    candidate: &Candidate,
) -> f64 {
    let fair_share = volume_copies as f64 / candidates.max(1) as f64;
    let extents = candidate.volume_extents as f64 / (fair_share + 1.0);
    let preference = if candidate.preference.is_nan() {
        0.0
    } else {
        candidate.preference.clamp(-1.0, 1.0)
    };
    weights.extents * extents
        + weights.capacity_used * unit(candidate.capacity_used)
        + weights.busy * unit(candidate.busy_degree)
        + weights.write_cost * unit(candidate.write_cost_degree)
        - weights.preference * preference
}

/// Chooses `copies` distinct namespaces among `candidates` (distinct
/// targets first), for a volume with `volume_copies` copies placed so far.
pub fn choose(
    weights: &PlacementWeights,
    volume_copies: u64,
    candidates: &[Candidate],
    copies: usize,
) -> Result<Choice> {
    weights.validate()?;
    let distinct: BTreeSet<NamespaceId> = candidates.iter().map(|c| c.namespace).collect();
    if distinct.len() < copies || copies == 0 {
        return Err(FlintError::NoRoom(format!(
            "{copies} copies need as many namespaces with a free extent, {} have one",
            distinct.len()
        )));
    }
    let mut scored: Vec<(f64, &Candidate)> = candidates
        .iter()
        .map(|c| (score(weights, volume_copies, candidates.len(), c), c))
        .collect();
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.namespace.cmp(&b.1.namespace)));
    let mut chosen: Vec<NamespaceId> = Vec::with_capacity(copies);
    let mut targets = BTreeSet::new();
    while chosen.len() < copies {
        let next = scored
            .iter()
            .find(|(_, c)| !chosen.contains(&c.namespace) && !targets.contains(&c.target))
            .or_else(|| scored.iter().find(|(_, c)| !chosen.contains(&c.namespace)))
            .expect("enough distinct namespaces, checked above");
        chosen.push(next.1.namespace);
        targets.insert(next.1.target);
    }
    Ok(Choice {
        chosen,
        scores: scored.iter().map(|(s, c)| (c.namespace, *s)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(ns: u32, target: u32) -> Candidate {
        Candidate {
            namespace: NamespaceId(ns),
            target: TargetId(target),
            volume_extents: 0,
            capacity_used: 0.0,
            busy_degree: 0.0,
            write_cost_degree: 0.0,
            preference: 0.0,
        }
    }

    /// Places `n` extents one by one, as the catalog would.
    fn place(weights: &PlacementWeights, mut cands: Vec<Candidate>, n: u64) -> Vec<u64> {
        for i in 0..n {
            let c = choose(weights, i, &cands, 1).unwrap();
            let ns = c.chosen[0];
            cands
                .iter_mut()
                .find(|c| c.namespace == ns)
                .unwrap()
                .volume_extents += 1;
        }
        cands.iter().map(|c| c.volume_extents).collect()
    }

    #[test]
    fn idle_namespaces_fill_round_robin() {
        let cands = (0..4).map(|i| cand(i, i / 2)).collect();
        assert_eq!(place(&PlacementWeights::default(), cands, 40), vec![10; 4]);
    }

    #[test]
    fn a_busy_namespace_is_avoided_only_when_busy_counts() {
        let mut cands: Vec<Candidate> = (0..4).map(|i| cand(i, i / 2)).collect();
        cands[0].busy_degree = 0.95;
        let with = place(&PlacementWeights::default(), cands.clone(), 60);
        assert_eq!(with[0], 0, "{with:?}");
        let without = PlacementWeights {
            busy: 0.0,
            ..PlacementWeights::default()
        };
        assert_eq!(place(&without, cands.clone(), 60), vec![15; 4]);
        // Half busy: fewer extents, not none.
        cands[0].busy_degree = 0.3;
        let some = place(&PlacementWeights::default(), cands, 60);
        assert!(some[0] > 0 && some[0] < 15, "{some:?}");
    }

    #[test]
    fn preference_and_write_cost_steer() {
        let mut cands: Vec<Candidate> = (0..3).map(|i| cand(i, i)).collect();
        cands[2].preference = 1.0;
        cands[1].write_cost_degree = 1.0;
        let c = choose(&PlacementWeights::default(), 0, &cands, 3).unwrap();
        assert_eq!(
            c.chosen,
            vec![NamespaceId(2), NamespaceId(0), NamespaceId(1)]
        );
        assert_eq!(c.scores[0].0, NamespaceId(2));
    }

    #[test]
    fn copies_prefer_distinct_targets_then_distinct_namespaces() {
        // ns0 and ns1 on target 0 (best scores), ns2 on target 1.
        let mut cands = vec![cand(0, 0), cand(1, 0), cand(2, 1)];
        cands[2].capacity_used = 0.5;
        let c = choose(&PlacementWeights::default(), 0, &cands, 2).unwrap();
        assert_eq!(c.chosen, vec![NamespaceId(0), NamespaceId(2)]);
        let c = choose(&PlacementWeights::default(), 0, &cands, 3).unwrap();
        assert_eq!(
            c.chosen,
            vec![NamespaceId(0), NamespaceId(2), NamespaceId(1)]
        );
        assert!(matches!(
            choose(&PlacementWeights::default(), 0, &cands, 4),
            Err(FlintError::NoRoom(_))
        ));
        let bad = PlacementWeights {
            busy: -1.0,
            ..PlacementWeights::default()
        };
        assert!(choose(&bad, 0, &cands, 1).is_err());
    }

    proptest! {
        /// Whatever the inputs (even NaN), the choice is K distinct
        /// namespaces from the candidates, on distinct targets whenever the
        /// candidates span K targets.
        #[test]
        fn choice_is_distinct_and_target_diverse(
            raw in proptest::collection::vec(
                (0u32..4, 0u64..20, -0.5f64..1.5, proptest::num::f64::ANY, -2.0f64..2.0),
                1..12,
            ),
            copies in 1usize..4,
        ) {
            let cands: Vec<Candidate> = raw.iter().enumerate().map(|(i, (t, e, u, b, p))| Candidate {
                namespace: NamespaceId(i as u32),
                target: TargetId(*t),
                volume_extents: *e,
                capacity_used: *u,
                busy_degree: *b,
                write_cost_degree: 0.0,
                preference: *p,
            }).collect();
            match choose(&PlacementWeights::default(), 7, &cands, copies) {
                Ok(c) => {
                    prop_assert_eq!(c.chosen.len(), copies);
                    let set: BTreeSet<_> = c.chosen.iter().collect();
                    prop_assert_eq!(set.len(), copies);
                    let targets: BTreeSet<_> = cands.iter().map(|c| c.target).collect();
                    let chosen_targets: BTreeSet<_> = c.chosen.iter()
                        .map(|ns| cands[ns.0 as usize].target).collect();
                    prop_assert_eq!(chosen_targets.len(), copies.min(targets.len()));
                }
                Err(_) => prop_assert!(cands.len() < copies),
            }
        }
    }
}
