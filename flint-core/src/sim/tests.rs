//! The claims on short seeded runs: a regression in any mechanism shows
//! here. Deterministic: simulated time only.

use super::engine::run;
use super::experiments::*;

#[test]
fn evol_scales_near_linearly_until_a_port_limits_it() {
    let r = evol_scaling(1, Scale::Quick, &run_sequentially);
    let checks = check_claims(&FlintSuite {
        seed: 1,
        scale: Scale::Quick,
        scaling: r.clone(),
        placement: PlacementResult { sides: vec![] },
        fairness: FairnessResult {
            equal: vec![],
            weighted: vec![],
        },
    });
    for c in &checks {
        assert!(c.pass, "{c:?}\n{r:#?}");
    }
    assert_eq!(checks.len(), 3);
    // All on one target, K = 4 is port-bound below the spread layout.
    let one_target = r
        .rows
        .iter()
        .find(|r| r.label.contains("one target"))
        .unwrap();
    let spread4 = r
        .rows
        .iter()
        .find(|r| r.namespaces == 4 && r.targets == 2)
        .unwrap();
    assert!(
        one_target.bytes_per_sec < 0.9 * spread4.bytes_per_sec,
        "{r:#?}"
    );
}

#[test]
fn placement_avoids_the_busy_namespace_only_with_the_view() {
    let r = busy_placement(1, Scale::Quick, &run_sequentially);
    let checks = check_claims(&FlintSuite {
        seed: 1,
        scale: Scale::Quick,
        scaling: ScalingResult { rows: vec![] },
        placement: r.clone(),
        fairness: FairnessResult {
            equal: vec![],
            weighted: vec![],
        },
    });
    assert_eq!(checks.len(), 2);
    for c in &checks {
        assert!(c.pass, "{c:?}\n{r:#?}");
    }
}

#[test]
fn the_auction_shares_fairly_and_by_weight() {
    let r = auction_fairness(1, Scale::Quick, &run_sequentially);
    let checks = check_claims(&FlintSuite {
        seed: 1,
        scale: Scale::Quick,
        scaling: ScalingResult { rows: vec![] },
        placement: PlacementResult { sides: vec![] },
        fairness: r.clone(),
    });
    assert_eq!(checks.len(), 2);
    for c in &checks {
        assert!(c.pass, "{c:?}\n{r:#?}");
    }
}

#[test]
fn runs_are_deterministic() {
    let mut spec = super::engine::RunSpec::new(
        vec![super::engine::VolumeWorkload {
            name: "v".into(),
            namespaces: None,
            size_bytes: 64 << 20,
            queue_depth: 16,
            io_bytes: 16 << 10,
            read_percent: 50,
            weight: 1,
            start_ns: 0,
            prefill: false,
        }],
        super::engine::Mechanisms {
            placement_uses_view: true,
            auction: true,
        },
        7,
    );
    spec.duration_ns = 20_000_000;
    spec.warmup_ns = 5_000_000;
    let a = run(&spec);
    assert_eq!(a, run(&spec));
    assert!(a.volumes[0].completed_ios > 100, "{a:?}");
    spec.seed = 8;
    assert_ne!(a, run(&spec));
}

#[test]
fn jain_index_bounds() {
    assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
    assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
}
