//! Flint's §5 claims in shape, each side by side with and without its
//! mechanism, and the checks `docs/flint-simulation.md` reports and the
//! tests assert.
//!
//! - **(a) eVol scaling** (§5.2, Figure 7-c): one volume of 128 KiB random
//!   reads at queue depth 256 spanning K = 1, 2, 4, 8 namespaces spread
//!   over the two targets, plus K = 4 all on one target. Without the
//!   mechanism (K = 1) a volume is one drive; with it throughput grows
//!   near-linearly until a target port (10 GB/s) limits it.
//! - **(b) busy-aware placement** (§5.5, Figures 7-d and 9-b/c): a noisy
//!   tenant keeps namespace 0 saturated with 128 KiB reads; 30 ms later a
//!   second tenant's eVol over namespaces {0, 1, 4, 5} starts 32 KiB
//!   random I/O (70 % reads) and allocates its extents on first write.
//!   With the view's busy degree in the score (γ = 2) vs without (γ = 0).
//! - **(c) the auction** (§5.3, Figure 9-a): volumes sharing namespaces
//!   {0, 1, 4, 5} with very different I/O sizes and queue depths
//!   (equal weights: Jain's index over cost-weighted throughput), and
//!   three identical volumes with weights 1 : 2 : 4 (shares vs weights);
//!   with and without the auction.

use serde::{Deserialize, Serialize};

use crate::ids::NamespaceId;
use crate::sim::engine::{run, Mechanisms, RunResult, RunSpec, VolumeWorkload};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// How long the runs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scale {
    /// The report's runs: one simulated second each.
    Full,
    /// The tests' runs: 100 ms each.
    Quick,
}

impl Scale {
    /// Simulated time of each run, milliseconds.
    pub fn duration_ms(self) -> u64 {
        match self {
            Scale::Full => 1000,
            Scale::Quick => 100,
        }
    }

    /// Time not measured at the start of each run, milliseconds (the
    /// placement experiment's tenant starts at 30 ms).
    pub fn warmup_ms(self) -> u64 {
        match self {
            Scale::Full => 100,
            Scale::Quick => 50,
        }
    }

    fn apply(self, spec: &mut RunSpec) {
        spec.duration_ns = self.duration_ms() * 1_000_000;
        spec.warmup_ns = self.warmup_ms() * 1_000_000;
    }
}

/// Runs independent simulations; the gimbal-sim binary spreads them over
/// threads, tests run them in turn. Results come back in order.
pub type Runner<'a> = &'a dyn Fn(Vec<RunSpec>) -> Vec<RunResult>;

/// Runs the specs one after the other.
pub fn run_sequentially(specs: Vec<RunSpec>) -> Vec<RunResult> {
    specs.iter().map(run).collect()
}

const OFF: Mechanisms = Mechanisms {
    placement_uses_view: false,
    auction: false,
};

fn volume(
    name: &str,
    namespaces: &[u32],
    size_bytes: u64,
    qd: u32,
    io_bytes: u64,
) -> VolumeWorkload {
    VolumeWorkload {
        name: name.to_string(),
        namespaces: Some(namespaces.iter().map(|n| NamespaceId(*n)).collect()),
        size_bytes,
        queue_depth: qd,
        io_bytes,
        read_percent: 100,
        weight: 1,
        start_ns: 0,
        prefill: true,
    }
}

/// One row of the scaling experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalingRow {
    /// What the volume spans.
    pub label: String,
    /// K.
    pub namespaces: u32,
    /// Targets the K namespaces are on.
    pub targets: u32,
    /// Throughput, bytes per second.
    pub bytes_per_sec: f64,
    /// Throughput over K × the one-namespace volume's.
    pub linear_fraction: f64,
    /// Busiest port's load over its speed.
    pub busiest_port_utilization: f64,
    /// Mean latency, µs.
    pub mean_latency_us: f64,
}

/// Experiment (a).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalingResult {
    /// K = 1, 2, 4, 8 spread over the targets, then K = 4 on one target.
    pub rows: Vec<ScalingRow>,
}

fn scaling_specs(seed: u64, scale: Scale) -> Vec<(String, Vec<u32>, RunSpec)> {
    // Namespaces 0-3 are on target 0, 4-7 on target 1.
    let layouts: [(&str, &[u32]); 5] = [
        ("K=1 (one namespace: today's volume)", &[0]),
        ("K=2, two targets", &[0, 4]),
        ("K=4, two targets", &[0, 1, 4, 5]),
        ("K=8, two targets", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ("K=4, one target", &[0, 1, 2, 3]),
    ];
    layouts
        .iter()
        .map(|(label, ns)| {
            let mut spec = RunSpec::new(
                vec![volume("evol", ns, 512 * MIB, 256, 128 * KIB)],
                OFF,
                seed,
            );
            scale.apply(&mut spec);
            (label.to_string(), ns.to_vec(), spec)
        })
        .collect()
}

/// Runs experiment (a).
pub fn evol_scaling(seed: u64, scale: Scale, runner: Runner<'_>) -> ScalingResult {
    let specs = scaling_specs(seed, scale);
    let results = runner(specs.iter().map(|(_, _, s)| s.clone()).collect());
    let single = results[0].volumes[0].bytes_per_sec.max(1.0);
    let rows = specs
        .iter()
        .zip(&results)
        .map(|((label, ns, spec), r)| {
            let k = ns.len() as u32;
            let targets = ns
                .iter()
                .map(|n| spec.topology.target_of(NamespaceId(*n)))
                .collect::<std::collections::BTreeSet<_>>()
                .len() as u32;
            let port = spec.topology.port_bytes_per_sec as f64;
            ScalingRow {
                label: label.clone(),
                namespaces: k,
                targets,
                bytes_per_sec: r.volumes[0].bytes_per_sec,
                linear_fraction: r.volumes[0].bytes_per_sec / (single * f64::from(k)),
                busiest_port_utilization: r
                    .port_bytes_per_sec
                    .iter()
                    .fold(0.0f64, |m, b| m.max(*b))
                    / port,
                mean_latency_us: r.volumes[0].latency.mean_us,
            }
        })
        .collect();
    ScalingResult { rows }
}

/// One side of experiment (b).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementSide {
    /// Whether the score used the view's busy degree.
    pub uses_view: bool,
    /// The tenant's extents per namespace.
    pub extents_per_namespace: Vec<(u32, u64)>,
    /// The tenant's extents on the busy namespace.
    pub extents_on_busy: u64,
    /// The tenant's throughput, bytes per second.
    pub tenant_bytes_per_sec: f64,
    /// The tenant's mean latency, µs.
    pub tenant_mean_latency_us: f64,
    /// The tenant's p99 latency, µs.
    pub tenant_p99_latency_us: f64,
    /// The noisy neighbour's throughput, bytes per second.
    pub noisy_bytes_per_sec: f64,
    /// The busy namespace's busy degree in the view at the end.
    pub busy_degree: f64,
}

/// Experiment (b).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementResult {
    /// Without the busy degree (γ = 0), then with it (γ = 2).
    pub sides: Vec<PlacementSide>,
}

fn placement_spec(seed: u64, scale: Scale, uses_view: bool) -> RunSpec {
    let noisy = volume("noisy neighbour", &[0], 1024 * MIB, 64, 128 * KIB);
    let tenant = VolumeWorkload {
        read_percent: 70,
        start_ns: 30_000_000,
        prefill: false,
        ..volume("tenant eVol", &[0, 1, 4, 5], 128 * MIB, 32, 32 * KIB)
    };
    let mut spec = RunSpec::new(
        vec![noisy, tenant],
        Mechanisms {
            placement_uses_view: uses_view,
            auction: false,
        },
        seed,
    );
    scale.apply(&mut spec);
    spec
}

/// Runs experiment (b).
pub fn busy_placement(seed: u64, scale: Scale, runner: Runner<'_>) -> PlacementResult {
    let specs = vec![
        placement_spec(seed, scale, false),
        placement_spec(seed, scale, true),
    ];
    let results = runner(specs.clone());
    let sides = results
        .iter()
        .zip(&specs)
        .map(|(r, spec)| {
            let tenant = &r.volumes[1];
            PlacementSide {
                uses_view: spec.mechanisms.placement_uses_view,
                extents_per_namespace: tenant
                    .extents_per_namespace
                    .iter()
                    .map(|(n, c)| (*n, *c))
                    .collect(),
                extents_on_busy: tenant.extents_per_namespace.get(&0).copied().unwrap_or(0),
                tenant_bytes_per_sec: tenant.bytes_per_sec,
                tenant_mean_latency_us: tenant.latency.mean_us,
                tenant_p99_latency_us: tenant.latency.p99_us,
                noisy_bytes_per_sec: r.volumes[0].bytes_per_sec,
                busy_degree: r.busy_degree[0],
            }
        })
        .collect();
    PlacementResult { sides }
}

/// One volume's outcome in experiment (c).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareRow {
    /// The volume.
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// Cost-weighted throughput, bytes per second.
    pub cost_bytes_per_sec: f64,
    /// Throughput, bytes per second.
    pub bytes_per_sec: f64,
    /// Its share of the cost-weighted total.
    pub share: f64,
    /// Its weight's share of the weights.
    pub weight_share: f64,
    /// Mean latency, µs.
    pub mean_latency_us: f64,
}

/// One side of experiment (c).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FairnessSide {
    /// Whether the auction ran.
    pub auction: bool,
    /// Per volume.
    pub rows: Vec<ShareRow>,
    /// Jain's index over cost-weighted throughput divided by weight.
    pub jain: f64,
    /// Largest |share − weight share| / weight share.
    pub max_share_error: f64,
    /// Total cost-weighted throughput, bytes per second.
    pub total_cost_bytes_per_sec: f64,
}

/// Experiment (c).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FairnessResult {
    /// Equal weights: without, then with the auction.
    pub equal: Vec<FairnessSide>,
    /// Weights 1 : 2 : 4: without, then with the auction.
    pub weighted: Vec<FairnessSide>,
}

/// Jain's fairness index of `xs`: 1 when all are equal, 1/n when one has
/// everything.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

const SHARED: [u32; 4] = [0, 1, 4, 5];

fn fairness_spec(seed: u64, scale: Scale, auction: bool, weighted: bool) -> RunSpec {
    let volumes = if weighted {
        [1, 2, 4]
            .iter()
            .map(|w| VolumeWorkload {
                weight: *w,
                ..volume(&format!("weight {w}"), &SHARED, 256 * MIB, 64, 128 * KIB)
            })
            .collect()
    } else {
        vec![
            volume("128 KiB reads, QD 64", &SHARED, 256 * MIB, 64, 128 * KIB),
            volume("128 KiB reads, QD 8", &SHARED, 256 * MIB, 8, 128 * KIB),
            volume("32 KiB reads, QD 16", &SHARED, 256 * MIB, 16, 32 * KIB),
            volume("4 KiB reads, QD 64", &SHARED, 256 * MIB, 64, 4 * KIB),
        ]
    };
    let mut spec = RunSpec::new(
        volumes,
        Mechanisms {
            placement_uses_view: true,
            auction,
        },
        seed,
    );
    scale.apply(&mut spec);
    spec
}

fn fairness_side(spec: &RunSpec, r: &RunResult) -> FairnessSide {
    let total: f64 = r.volumes.iter().map(|v| v.cost_bytes_per_sec).sum();
    let weights: f64 = spec.volumes.iter().map(|v| f64::from(v.weight)).sum();
    let rows: Vec<ShareRow> = r
        .volumes
        .iter()
        .zip(&spec.volumes)
        .map(|(v, w)| ShareRow {
            name: v.name.clone(),
            weight: w.weight,
            cost_bytes_per_sec: v.cost_bytes_per_sec,
            bytes_per_sec: v.bytes_per_sec,
            share: v.cost_bytes_per_sec / total.max(1.0),
            weight_share: f64::from(w.weight) / weights,
            mean_latency_us: v.latency.mean_us,
        })
        .collect();
    let normalized: Vec<f64> = rows
        .iter()
        .map(|r| r.cost_bytes_per_sec / f64::from(r.weight))
        .collect();
    FairnessSide {
        auction: spec.mechanisms.auction,
        jain: jain(&normalized),
        max_share_error: rows
            .iter()
            .map(|r| (r.share - r.weight_share).abs() / r.weight_share)
            .fold(0.0, f64::max),
        total_cost_bytes_per_sec: total,
        rows,
    }
}

/// Runs experiment (c).
pub fn auction_fairness(seed: u64, scale: Scale, runner: Runner<'_>) -> FairnessResult {
    let specs = vec![
        fairness_spec(seed, scale, false, false),
        fairness_spec(seed, scale, true, false),
        fairness_spec(seed, scale, false, true),
        fairness_spec(seed, scale, true, true),
    ];
    let results = runner(specs.clone());
    let sides: Vec<FairnessSide> = specs
        .iter()
        .zip(&results)
        .map(|(s, r)| fairness_side(s, r))
        .collect();
    FairnessResult {
        equal: sides[0..2].to_vec(),
        weighted: sides[2..4].to_vec(),
    }
}

/// Every experiment's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlintSuite {
    /// The seed.
    pub seed: u64,
    /// The scale.
    pub scale: Scale,
    /// (a)
    pub scaling: ScalingResult,
    /// (b)
    pub placement: PlacementResult,
    /// (c)
    pub fairness: FairnessResult,
}

/// Runs (a), (b) and (c), all specs in one batch so a parallel runner
/// keeps every core busy.
pub fn run_suite(seed: u64, scale: Scale, runner: Runner<'_>) -> FlintSuite {
    FlintSuite {
        seed,
        scale,
        scaling: evol_scaling(seed, scale, runner),
        placement: busy_placement(seed, scale, runner),
        fairness: auction_fairness(seed, scale, runner),
    }
}

/// One claim and whether the run shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimCheck {
    /// The claim, in words.
    pub claim: String,
    /// What was measured.
    pub measured: String,
    /// Whether it holds.
    pub pass: bool,
}

/// The bar, claim by claim.
pub fn check_claims(suite: &FlintSuite) -> Vec<ClaimCheck> {
    let mut checks = Vec::new();
    let rows = &suite.scaling.rows;
    let spread: Vec<&ScalingRow> = rows
        .iter()
        .filter(|r| r.targets > 1 || r.namespaces == 1)
        .collect();
    for r in spread
        .iter()
        .filter(|r| r.namespaces == 2 || r.namespaces == 4)
    {
        checks.push(ClaimCheck {
            claim: format!("(a) {}: near-linear (≥ 0.9 × K × one namespace)", r.label),
            measured: format!(
                "{:.2} × linear, {:.2} GB/s",
                r.linear_fraction,
                r.bytes_per_sec / 1e9
            ),
            pass: r.linear_fraction >= 0.9,
        });
    }
    if let Some(k8) = spread.iter().find(|r| r.namespaces == 8) {
        let k4 = spread.iter().find(|r| r.namespaces == 4);
        checks.push(ClaimCheck {
            claim: "(a) K=8: grows past K=4 until the ports limit it (busiest port ≥ 90 % busy)"
                .to_string(),
            measured: format!(
                "{:.2} GB/s ({:.2} × linear), busiest port {:.0} %",
                k8.bytes_per_sec / 1e9,
                k8.linear_fraction,
                k8.busiest_port_utilization * 100.0
            ),
            pass: k8.busiest_port_utilization >= 0.9
                && k4.is_some_and(|k4| k8.bytes_per_sec > k4.bytes_per_sec),
        });
    }
    if let [without, with] = suite.placement.sides.as_slice() {
        checks.push(ClaimCheck {
            claim: "(b) with the busy degree, no extent on the busy namespace".to_string(),
            measured: format!(
                "{} of {} extents with, {} without",
                with.extents_on_busy,
                with.extents_per_namespace
                    .iter()
                    .map(|(_, c)| c)
                    .sum::<u64>(),
                without.extents_on_busy
            ),
            pass: with.extents_on_busy == 0 && without.extents_on_busy > 0,
        });
        checks.push(ClaimCheck {
            claim: "(b) the tenant's throughput is higher and its mean latency lower with it"
                .to_string(),
            measured: format!(
                "{:.2} vs {:.2} GB/s, {:.0} vs {:.0} µs",
                with.tenant_bytes_per_sec / 1e9,
                without.tenant_bytes_per_sec / 1e9,
                with.tenant_mean_latency_us,
                without.tenant_mean_latency_us
            ),
            pass: with.tenant_bytes_per_sec > 1.2 * without.tenant_bytes_per_sec
                && with.tenant_mean_latency_us < without.tenant_mean_latency_us,
        });
    }
    if let [without, with] = suite.fairness.equal.as_slice() {
        checks.push(ClaimCheck {
            claim: "(c) equal weights: Jain's index ≥ 0.95 with the auction, lower without"
                .to_string(),
            measured: format!("{:.3} with, {:.3} without", with.jain, without.jain),
            pass: with.jain >= 0.95 && without.jain < with.jain,
        });
    }
    if let [without, with] = suite.fairness.weighted.as_slice() {
        checks.push(ClaimCheck {
            claim: "(c) weights 1:2:4: every share within 10 % of its weight's with the auction"
                .to_string(),
            measured: format!(
                "largest error {:.1} % with, {:.1} % without",
                with.max_share_error * 100.0,
                without.max_share_error * 100.0
            ),
            pass: with.max_share_error <= 0.10 && without.max_share_error > 0.10,
        });
    }
    checks
}
