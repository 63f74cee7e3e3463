//! The credit estimate's gain, found by probing: more requests in flight
//! only while they deliver more (issue 14).
//!
//! A fixed gain cannot serve both cases the estimate meets. Measured in the
//! TCG guest (docs/benchmarks.md, `tests/vm/run --bench ublk-gain`): a
//! volume alone on a plain target, where the guest's CPU pipeline keeps
//! delivering more with more in flight, needs gain 8 to reach the
//! throughput of credits off (gain 2: 0.59x at 4k QD 128, 0.80x at 128k),
//! while a QD 128 writer sharing a saturated device with a QD 1 reader
//! needs gain 2 to halve the reader's p99 (gain 8: 0.73x of credits off).
//! What tells them apart is how throughput answers more in flight, so the
//! gain is the result of a hill climb on the delivery rate, BBR's
//! bandwidth probing moved from the pacing rate to the window:
//!
//! - **Phases of rounds** (a round as in
//!   [`DeliveryRate`](crate::delivery_rate::DeliveryRate)). *Cruise* at
//!   gain `g`; *up*, a probe with the window `× STEP`; *down*, `/ STEP`
//!   (the gate scales the window, not the gain, so that a window held at
//!   its floor still probes).
//!   Each probe is compared with the cruise rounds just before and just
//!   after it (A-B-A: a load that drifts over the three phases cancels out),
//!   each measured over [`MEASURED_ROUNDS`] rounds after [`SETTLE_ROUNDS`]
//!   for the window change to take effect.
//! - **Up** is kept (`g ← g × STEP`) when it delivered at least
//!   [`SURE_GAIN`] more than the cruise around it, or when two
//!   comparisons in a row delivered at least [`UP_GAIN`] more: a probe
//!   that pays between the two is repeated at once (the back-off kept as
//!   it was), and only the second paid one moves the gain; then the next
//!   probe is up again soon. A probe that does not pay doubles the cruise
//!   before the next one (up to [`MAX_BACKOFF`]×), so a tenant at a
//!   saturated device spends a few per cent of its time probing, and a
//!   down probe follows it.
//! - **Why two, both ways.** On a flat path one comparison pays
//!   whenever the noise of three 12-round means says so: at the ±8 % a
//!   phase measures with beside a saturated device in the guest, about
//!   30 % of the time (measured: 5 to 10 of a tenant writer's 17-35 up
//!   probes kept, its gain wandering from 2 to 4.5 and the reader's p99
//!   with it, from 0.24 to 0.57 of credits off; docs/benchmarks.md). The
//!   down probes gave the steps back, but the walk's mean stays high: in
//!   a model of such a path (`a_noisy_flat_path_keeps_few_up_probes`)
//!   one comparison kept 31 % of the up probes and held a mean gain of
//!   6.2 under a ceiling of 64. Two for up only brought that to 2.09,
//!   and the guest's pipelines down with it (an acceptance run: 128k
//!   reads 0.95 of credits off, 4k QD 128 0.955, the gate holding far
//!   more): near the knee a step up pays 5 % about as often as a step
//!   down loses under 2 %, so evidence asked of one direction only walks
//!   the gain the other way (`a_noisy_pipeline_keeps_its_window`: 0.938
//!   of the pipeline delivered, against 0.965 with one comparison each
//!   way). Two each way: mean gain 3.04 on the flat path, 0.967
//!   delivered on the pipeline. A path that does pay, pays twice; one
//!   far from full (a step that adds 20 % or more) still climbs a step
//!   per probe. A young gate's double steps (below) follow the same
//!   rule. They first kept one comparison of 5 %, since three fresh
//!   volumes' 128k climbs moved as much with the second comparison as
//!   without it (121-141 MiB/s in their first 10 s either way;
//!   docs/benchmarks.md, "Two comparisons before a step up"). But a QD
//!   128 writer beside a QD 1 reader kept its first double step on one
//!   comparison (gain 4.5: the reader's share taken, plus noise) and
//!   then never came down, since a step down gives the reader back more
//!   than `DOWN_LOSS`: in an acceptance run the reader's p99 over
//!   credits off was 0.38-0.60 (median 0.500), and with two comparisons
//!   the writer held gain 3.0 and the reader 0.22-0.66 (median 0.35,
//!   five rounds; docs/benchmarks.md, "A clock that stops while the gate
//!   is empty").
//! - **Down** is kept (`g ← g / STEP`) when two comparisons in a row
//!   delivered at least `1 − DOWN_LOSS` of the cruise around them (the
//!   first is repeated at once, as up): a gain above the knee gives up
//!   its queue. The gain stays within `[min, max]` (`estimate_gain`
//!   and `estimate_gain_max` in a volume's `[qos]`).
//! - A cruise whose measured rounds did not all reach the window measured
//!   the application, not the path: the cycle starts again without a
//!   decision. An up probe may outgrow the demand and still count (it
//!   delivered all that was asked at that gain).
//! - **A new regime cancels the back-off.** The back-off counts rounds of
//!   the path it was earned on; when the workload changes (another request
//!   size, another job), a back-off of hundreds of rounds would keep the
//!   gain where the old workload left it for many seconds (measured: a
//!   128k writer held at 0.62x of credits off for a whole 10-s fio job
//!   after a 128k reader). So during a backed-off cruise the rate is
//!   checked every phase's length of rounds against the rate of the last
//!   measured cruise; a factor of [`REGIME`] either way restarts the cycle
//!   with no back-off (the gain is kept: it is the starting point), and
//!   makes the gate young again (below): the unpaid probes that ended its
//!   double steps measured the old path. Why: in an acceptance run both
//!   volumes' first 128k reads came after a 4 KiB job whose flat path
//!   had ended the double steps; they then climbed in single steps, each
//!   needing two paid comparisons, and 55-60 % of fio's requests sat in
//!   the gate on average over those runs (docs/benchmarks.md, "What a
//!   volume's offset belongs to"). A tenant whose rate moves by 1.5x
//!   pays a double probe or two for it, as a new gate does. One that resumes
//!   after idling does not: the gate runs this probe on a clock that
//!   stops while nothing is in flight (`CreditGate::busy_clock`), so a
//!   quiet gap is neither a slow phase nor a new regime.
//! - **A young gate climbs in double steps.** Until two of its up probes
//!   have come out unpaid (or the gain reaches `max`), an up probe and
//!   the gain it keeps are `× STEP²` ([`STARTUP_STEP`]): the gain walks
//!   the same grid (2, 4.5, 10.1, 22.8, 51.3, 64 with the default
//!   ceiling, from a window above its floor) in half the steps, and a
//!   step at the low end shows about twice the throughput change over the
//!   same noise. Measured in the TCG guest (docs/benchmarks.md, "A probe
//!   compared at a held window; a young gate's double steps"): a fresh
//!   volume's 128k reads reached gain 10 in a median 2.7 s over five
//!   runs, against ~11 s before (one run, without this and without the
//!   gate's held product during a comparison). A tenant beside a
//!   saturated device it cannot see pays two such probes (16 rounds each
//!   at 2.25× its window) and then probes as before. **Why two unpaid
//!   probes, not one**: as every other decision here, ending the double
//!   steps takes two comparisons. In the guest (docs/benchmarks.md,
//!   2026-11-30, seventh) one of two fresh volumes had its first double
//!   probe at 128k reads come out unpaid on noise; it then climbed in
//!   single steps to gain 4.5-10 with the gate holding 22-67 % of its
//!   reads, while the other stayed young, reached 10-22.8 and was held
//!   2-20 %. A flat path soon gives a second unpaid probe (one that paid
//!   once between the two does not reset the count). The cost
//!   is the unseen tenant's: on the `sim` model its reader's p99 rose by
//!   up to 28 % with the old bandwidth estimate, and is about where it
//!   was with the estimate over the send span too
//!   ([`DeliveryRate`](crate::delivery_rate::DeliveryRate)), which no
//!   longer widens a writer's window with bunched completions. A young
//!   gate has no double steps beside a busy neighbour anyway. Tried and
//!   not kept: a BBR-STARTUP-like phase (a step per phase, no A-B-A;
//!   section "What the gate holds"), and measuring each phase over at
//!   least 256 completions (slower: 7.2 s).
//! - **Neighbours.** Where the driver tells the probe the running totals
//!   of the other volumes of its namespace on the host
//!   ([`GainProbe::set_neighbours`]; [`crate::neighbours`] says why), each
//!   comparison divides the probe's throughput ratio by the product of the
//!   busy neighbours' latency ratios before the thresholds above apply
//!   (proportional fairness), and while a neighbour was busy in the
//!   cruise before a probe the gain may go down to [`SHARED_MIN_GAIN`]:
//!   a writer's bandwidth estimate can read 2.5-3.8x what a device that
//!   completes in bunches sustains (docs/benchmarks.md, "The tenants on
//!   the sim device's own model"), so `min`'s two products may be six.
//!   Three more rules, each from a probe log of the guest's tenants
//!   (docs/benchmarks.md, "Neighbours seen"): a phase is stretched (up to
//!   [`EXTEND`]x) until a slow neighbour has completed enough requests to
//!   count; beside a busy neighbour an application-limited cruise still
//!   leads to a probe down, since a window that grew above its demand
//!   would otherwise never come down; and no double steps while a
//!   neighbour is busy.
//!   Measured on the `sim` device's model (`tenants_on_the_sim_device_report`
//!   in `credit_gate`): the reader's p99 over credits off, median over 20
//!   seeds after a 30-s warm-up, from 0.195/0.223/0.338 unseen to
//!   0.079/0.081/0.188 seen (paths 1/2/5 ms), the device's total up,
//!   not down. In the guest (an acceptance run): 0.365, against 0.500
//!   and 0.543 in the last two.
//! - Decisions: STEP 1.5 (a probe adds half the window: a quarter of the
//!   gain's range per step, and a reader beside a probing writer sees at
//!   most 1.5× the queue for a probe's length); UP_GAIN 5 % and DOWN_LOSS
//!   2 %: above the noise of a 12-round mean on a quiet path in the
//!   guest, and asymmetric so that a flat path (probes within noise)
//!   drifts down, not up; where the noise is larger than 5 %, the second
//!   comparison (above) keeps that drift.
//! - **Alone, no bias** ([`UP_GAIN_ALONE`]). Where no neighbour was busy
//!   in the cruise before a probe, an up probe is kept at +2 % (on two
//!   comparisons, as before), the mirror of `DOWN_LOSS`: the drift down
//!   protects a neighbour, and alone there is none the gate can see,
//!   while the drift costs the volume its own throughput. Measured: the
//!   guest's 128 KiB reads deliver about `0.48 + 0.15 ln n` of their
//!   rate at 32 in flight with `n` in flight (0.69 at 4), so a step of
//!   1.5x pays 6-9 %, and the probe log shows its comparisons with a
//!   standard deviation of 16 % (docs/benchmarks.md, "Probes in the
//!   guest's noise"): at +5 % the gain stayed at 2-4.5, the gate held
//!   81-91 % of the reads and the default ran at 0.70-0.89 of credits
//!   off, against the 0.97 (at +2 %: 61-66 % held, 0.89-0.92;
//!   in an acceptance run, where the 4 KiB jobs ran first, 19 %, 0.961).
//!   On the gate's model of that path (`credit_gate`'s
//!   `guest_reads_report`: the curve, bunched completions) the last 11
//!   of 33 s went from 0.920 to 0.967 of credits off at the 10th
//!   percentile of 20 seeds (medians 0.979 and 0.982). The cost falls
//!   on a tenant the gate cannot see, behind another host or a plain
//!   target: on a flat path with ±8 % phases the mean gain is 4.6
//!   instead of 3.0
//!   (`a_noisy_flat_path_alone_walks_without_a_bias`); the `sim`
//!   device's model still keeps an unseen reader's p99 at half of
//!   credits off or less after 30 s
//!   (`estimate_protects_a_reader_beside_a_writer_on_the_fragmented_model`).
//!   Seeing that tenant takes the target's view (Gimbal credits) or the
//!   cluster's.

use crate::neighbours::{phase_means, probe_cost, NeighbourTotals, PhaseMean, MIN_COMPLETIONS};
use crate::time::Nanos;

/// Gain factor of a probe.
pub const STEP: f64 = 1.5;
/// How far a phase's measurement is stretched (in measured rounds' worth)
/// for a slow neighbour to complete enough requests to count.
pub const EXTEND: u32 = 8;
/// The lowest gain while a neighbour of the namespace is busy (see the
/// module doc): one bandwidth-delay product, no queue of the gate's own.
pub const SHARED_MIN_GAIN: f64 = 1.0;
/// Gain factor of a young gate's up probe (see the module doc).
pub const STARTUP_STEP: f64 = STEP * STEP;
/// Rounds after a phase change before its rate is measured.
pub const SETTLE_ROUNDS: u32 = 4;
/// Rounds a phase's rate is measured over.
pub const MEASURED_ROUNDS: u32 = 12;
/// Throughput an up probe must add to be kept.
pub const UP_GAIN: f64 = 0.05;
/// Throughput an up probe must add to be kept where no neighbour was
/// busy in the cruise before it: [`DOWN_LOSS`]'s mirror, so a flat path
/// walks without a bias (see the module doc, "Alone, no bias").
pub const UP_GAIN_ALONE: f64 = DOWN_LOSS;
/// Throughput an up probe must add to be kept on one comparison (less,
/// down to [`UP_GAIN`], needs a second).
pub const SURE_GAIN: f64 = 0.2;
/// Throughput a down probe may lose and still be kept.
pub const DOWN_LOSS: f64 = 0.02;
/// Longest cruise between probes, in probe lengths.
pub const MAX_BACKOFF: u32 = 32;
/// A change of the delivery rate by this factor (either way) during a
/// backed-off cruise is a new regime: the back-off is dropped. Twice the
/// spread of a steady path's phase rates in the guest (within ±25 %), and
/// met by a change of request size or job.
pub const REGIME: f64 = 1.5;

const PHASE_ROUNDS: u32 = SETTLE_ROUNDS + MEASURED_ROUNDS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Cruise before a probe; `next_up` says which probe follows.
    Before { next_up: bool },
    /// A probe; true: up.
    Probe { up: bool },
    /// Cruise right after a probe, measured to close the comparison.
    After { up: bool },
}

/// Rate measured over a phase's measured rounds.
#[derive(Clone, Copy, Debug, Default)]
struct Measure {
    start: Option<(Nanos, u64)>,
    all_bound: bool,
}

/// What the probe has decided so far, for operators (`status`): a gain
/// that stays low with many unpaid up probes is a path that is full; one
/// with many undecided cruises is an application that rarely fills the
/// window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeCounts {
    /// Up probes measured.
    pub up: u64,
    /// Up probes that moved the gain (a probe that paid once and waits
    /// for its second comparison is not counted here).
    pub up_kept: u64,
    /// Down probes measured.
    pub down: u64,
    /// Down probes kept (they lost too little).
    pub down_kept: u64,
    /// Cruises that decided nothing: the window was not reached in all
    /// their measured rounds (the application limited them).
    pub undecided: u64,
}

/// One comparison of a probe with the cruise around it, as measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// A probe up (else down).
    pub up: bool,
    /// The gain it probed from.
    pub gain: f64,
    /// The gate's own throughput in the probe over the cruise's.
    pub own: f64,
    /// What it cost the neighbours ([`crate::neighbours::probe_cost`]).
    pub cost: f64,
}

/// The probing state of one gate.
#[derive(Clone, Debug)]
pub struct GainProbe {
    gain: f64,
    min: f64,
    max: f64,
    phase: Phase,
    /// Rounds into the current phase.
    round: u32,
    /// Rounds the current cruise lasts before it is measured.
    cruise_rounds: u32,
    backoff: u32,
    measure: Measure,
    before: Option<f64>,
    probe: Option<f64>,
    /// The rate of the last measured cruise (bytes/ns): the regime the
    /// back-off was earned in.
    regime: Option<f64>,
    /// Start of the current regime check in a backed-off cruise.
    check: Option<(Nanos, u64)>,
    /// Young: fewer than two up probes have come out unpaid (see
    /// `failed_once`) and the gain is below `max`; up probes step by
    /// [`STARTUP_STEP`].
    startup: bool,
    /// An up probe from the current gain paid once; the next one decides
    /// (see the module doc: two paid comparisons in a row keep it).
    paid_once: bool,
    /// A young gate's up probe came out unpaid once; the next unpaid one
    /// ends its youth.
    failed_once: bool,
    /// A down probe from the current gain lost less than
    /// [`DOWN_LOSS`] once; the next one decides.
    lost_nothing_once: bool,
    /// The gain at which the gate's window reaches its floor (the
    /// smallest estimated window over the bandwidth-delay product):
    /// below it the window does not move with the gain, so decisions are
    /// taken from it (see [`GainProbe::set_floor`]).
    floor: f64,
    counts: ProbeCounts,
    /// The other volumes of the namespace on this host, as last told
    /// ([`GainProbe::set_neighbours`]).
    neighbours: Vec<NeighbourTotals>,
    /// Their totals where the current phase's measurement started.
    neighbours_start: Vec<NeighbourTotals>,
    /// Their mean latencies over the cruise before the probe, and the
    /// probe.
    neighbours_before: Vec<PhaseMean>,
    neighbours_probe: Vec<PhaseMean>,
    /// Scratch for the phase just measured.
    neighbours_now: Vec<PhaseMean>,
    /// The last comparison's cost to them ([`probe_cost`]).
    last_cost: f64,
    /// The last comparison decided, for operators' logs.
    last: Option<Comparison>,
    /// A neighbour was busy in the last measured cruise before a probe:
    /// the gain may go down to [`SHARED_MIN_GAIN`].
    shared: bool,
}

impl GainProbe {
    /// Probing between `min` and `max` (both at least 1), starting at
    /// `min`: a new gate protects first and earns its queue.
    pub fn new(min: f64, max: f64) -> Self {
        let min = min.max(1.0);
        GainProbe {
            gain: min,
            min,
            max: max.max(min),
            phase: Phase::Before { next_up: true },
            round: 0,
            cruise_rounds: PHASE_ROUNDS,
            backoff: 1,
            measure: Measure::default(),
            before: None,
            probe: None,
            regime: None,
            check: None,
            startup: true,
            paid_once: false,
            failed_once: false,
            lost_nothing_once: false,
            floor: 0.0,
            counts: ProbeCounts::default(),
            neighbours: Vec::new(),
            neighbours_start: Vec::new(),
            neighbours_before: Vec::new(),
            neighbours_probe: Vec::new(),
            neighbours_now: Vec::new(),
            last_cost: 0.0,
            last: None,
            shared: false,
        }
    }

    /// The lowest gain a probe down may reach: `min`, or, while a
    /// neighbour is busy, [`SHARED_MIN_GAIN`] (see the module doc).
    fn lowest(&self) -> f64 {
        if self.shared {
            self.min.min(SHARED_MIN_GAIN)
        } else {
            self.min
        }
    }

    /// Tells the probe the running totals of the other volumes of its
    /// namespace on this host (see [`crate::neighbours`]); the driver
    /// calls it often enough that a snapshot taken at a round's end is
    /// fresh against a phase's length. A probe's comparison then counts
    /// what it cost them.
    pub fn set_neighbours(&mut self, totals: &[NeighbourTotals]) {
        self.neighbours.clear();
        self.neighbours.extend_from_slice(totals);
    }

    /// The last comparison measured (its outcome is in [`GainProbe::counts`]
    /// and [`GainProbe::gain`]).
    pub fn last_comparison(&self) -> Option<Comparison> {
        self.last
    }

    /// What the last decided comparison cost the neighbours (the sum of
    /// their log latency ratios; 0 without busy neighbours).
    pub fn last_cost(&self) -> f64 {
        self.last_cost
    }

    /// Tells the probe the gain below which the gate's window stays at
    /// its floor (the gate calls it before every round with the
    /// bandwidth-delay product its window is computed from). Where a
    /// 128 KiB read's product is about one request (the TCG guest), gain 2
    /// and gain 3.7 both give the floor's window of 4: a probe up from
    /// there measured 4 × 2.25 = 9 requests, yet keeping it as gain 2 ×
    /// 2.25 = 4.5 left the window at 4, and a probe down could not lower
    /// the window at all, so it lost nothing and was kept (measured: a
    /// volume's gain walked down to 3.0 with 6 of 7 down probes kept,
    /// and its 128k reads ran held at a window of 4). So a probe starts
    /// from the larger of the gain and this floor, and no probe down is
    /// tried at or below it.
    pub fn set_floor(&mut self, floor: f64) {
        self.floor = if floor.is_finite() {
            floor.max(0.0)
        } else {
            0.0
        };
    }

    /// The gain the window follows: the settled one, or the floor where
    /// that is higher (within `max`).
    fn effective(&self) -> f64 {
        self.gain.max(self.floor.min(self.max))
    }

    /// The decisions so far.
    pub fn counts(&self) -> ProbeCounts {
        self.counts
    }

    /// The gain settled on (without a probe's factor).
    pub fn gain(&self) -> f64 {
        self.gain
    }

    /// The gain to use now: the settled one, or a probe's.
    pub fn current(&self) -> f64 {
        match self.phase {
            Phase::Probe { up: true } => (self.effective() * self.up_step()).min(self.max),
            Phase::Probe { up: false } => (self.effective() / STEP).max(self.lowest()),
            _ => self.effective(),
        }
    }

    /// The factor of the probe under way (above 1 up, below 1 down),
    /// `None` outside a probe. The gate scales its window by it.
    pub fn probe_factor(&self) -> Option<f64> {
        match self.phase {
            Phase::Probe { up: true } => Some(self.up_step()),
            Phase::Probe { up: false } => Some(1.0 / STEP),
            _ => None,
        }
    }

    /// Whether the gate is still young (up probes step by
    /// [`STARTUP_STEP`]).
    pub fn in_startup(&self) -> bool {
        self.startup
    }

    /// A young gate's double step, but never beside a busy neighbour: in
    /// the guest a writer beside a QD 1 reader whose rate had just
    /// changed (young again) doubled from gain 2.4 to 5.4 on one probe
    /// that paid it 64 % for 15 % of the reader's latency, and its next
    /// probe, up from 5.4, cost the reader 113 % for nothing: the single
    /// steps stop at the knee in between.
    fn up_step(&self) -> f64 {
        if self.startup && !self.shared {
            STARTUP_STEP
        } else {
            STEP
        }
    }

    /// Whether a probe's comparison is under way: the probe, or the
    /// cruise measured right after it. The gate holds its bandwidth-delay
    /// product fixed meanwhile (see [`CreditGate`](crate::credit_gate::CreditGate)).
    pub fn comparing(&self) -> bool {
        matches!(self.phase, Phase::Probe { .. } | Phase::After { .. })
    }

    /// Whether the current phase is a probe.
    pub fn probing(&self) -> bool {
        matches!(self.phase, Phase::Probe { .. })
    }

    /// Advances by one finished round: it ended at `now` with
    /// `delivered_bytes` completed so far, and reached the window (`bound`)
    /// or not.
    pub fn on_round(&mut self, now: Nanos, delivered_bytes: u64, bound: bool) {
        if self.min >= self.max {
            return;
        }
        self.round += 1;
        let (settle, len) = match self.phase {
            Phase::Before { .. } => (self.cruise_rounds - MEASURED_ROUNDS, self.cruise_rounds),
            _ => (SETTLE_ROUNDS, PHASE_ROUNDS),
        };
        if self.round == settle {
            self.measure = Measure {
                start: Some((now, delivered_bytes)),
                all_bound: true,
            };
            self.neighbours_start.clone_from(&self.neighbours);
            return;
        }
        if self.round < settle {
            self.check_regime(now, delivered_bytes);
            return;
        }
        self.measure.all_bound &= bound;
        if self.round < len {
            return;
        }
        // Into a buffer the probe keeps: a phase stretched for a slow
        // neighbour computes this every round.
        let mut means = std::mem::take(&mut self.neighbours_now);
        phase_means(&self.neighbours_start, &self.neighbours, &mut means);
        self.end_phase(now, delivered_bytes, settle, &mut means);
        self.neighbours_now = means;
    }

    /// The phase's last round, with its neighbours' `means`: decides, or
    /// stretches the phase for a slow neighbour. A phase that keeps the
    /// means swaps them with `means`, so the buffers are reused.
    fn end_phase(
        &mut self,
        now: Nanos,
        delivered_bytes: u64,
        settle: u32,
        means: &mut Vec<PhaseMean>,
    ) {
        // A neighbour slower than the phase (a QD 1 reader completes a
        // few requests in a writer's 12 rounds at a small window) would
        // not count, and its cost would be 0: the phase goes on until it
        // has enough, where its rate so far gets there within
        // `EXTEND`x the measured rounds.
        let measured = self.round - settle;
        let cap = MEASURED_ROUNDS * EXTEND;
        if measured < cap
            && means.iter().any(|m| {
                m.completions < MIN_COMPLETIONS
                    && m.completions * u64::from(cap) >= MIN_COMPLETIONS * u64::from(measured)
            })
        {
            return;
        }
        let rate = match self.measure.start {
            Some((t, b)) if now > t => {
                Some((delivered_bytes - b) as f64 / now.nanos_since(t) as f64)
            }
            _ => None,
        };
        let bound = self.measure.all_bound;
        let busy = means.iter().any(|m| m.completions >= MIN_COMPLETIONS);
        self.round = 0;
        let Some(rate) = rate else {
            self.restart(true);
            return;
        };
        if bound && !matches!(self.phase, Phase::Probe { .. }) {
            self.regime = Some(rate);
        }
        match self.phase {
            // The cruise around a probe must have measured the path at its
            // window; an application-limited cruise decides nothing. But
            // beside a busy neighbour, a window above the application's
            // demand is tried lower: the window may have grown past it
            // (a QD 128 writer's to 160-270 in the guest, by probes up
            // that outgrew the demand), and a gate whose cruises are
            // never bound would never come down, its whole depth queued
            // in front of the neighbour. A probe down still has to give
            // the neighbour more than it costs the gate to be kept.
            Phase::Before { .. } if !bound && !busy => {
                self.counts.undecided += 1;
                self.restart(true)
            }
            Phase::After { up } if !bound && (up || !busy) => {
                self.counts.undecided += 1;
                self.restart(true)
            }
            Phase::Before { next_up } => {
                self.shared = busy;
                // At the top, probe down instead; at the bottom (or where
                // the window is at its floor), up.
                let up = next_up && bound && self.effective() < self.max;
                if !up && self.effective() <= self.lowest().max(self.floor) {
                    self.restart(true);
                    return;
                }
                self.before = Some(rate);
                std::mem::swap(&mut self.neighbours_before, means);
                self.phase = Phase::Probe { up };
            }
            // A probe up may outgrow the application's demand (not bound)
            // and still count: it delivered what was asked at that gain.
            // A probe down below a bound cruise is bound itself.
            Phase::Probe { up } => {
                self.probe = Some(rate);
                std::mem::swap(&mut self.neighbours_probe, means);
                self.phase = Phase::After { up };
            }
            Phase::After { up } => {
                let (Some(before), Some(probe)) = (self.before, self.probe) else {
                    self.restart(true);
                    return;
                };
                // The probe's throughput over its neighbours' latency
                // ratio: proportional fairness (crate::neighbours).
                self.last_cost = probe_cost(&self.neighbours_before, &self.neighbours_probe, means);
                let cruise = (before + rate) / 2.0;
                self.last = Some(Comparison {
                    up,
                    gain: self.effective(),
                    own: probe / cruise,
                    cost: self.last_cost,
                });
                let probe = probe / self.last_cost.exp();
                if up {
                    self.counts.up += 1;
                } else {
                    self.counts.down += 1;
                }
                let up_gain = if self.shared { UP_GAIN } else { UP_GAIN_ALONE };
                if up && probe >= cruise * (1.0 + up_gain) {
                    if !self.paid_once && probe < cruise * (1.0 + SURE_GAIN) {
                        // One paid comparison is evidence, not yet a
                        // decision, for a young gate's double step too:
                        // the same probe again, soon, and the back-off
                        // stays what it was until it pays too.
                        self.paid_once = true;
                        self.restart_with(true, 1);
                        return;
                    }
                    self.paid_once = false;
                    self.failed_once = false;
                    self.lost_nothing_once = false;
                    self.counts.up_kept += 1;
                    self.gain = (self.effective() * self.up_step()).min(self.max);
                    self.startup &= self.gain < self.max;
                    self.backoff = 1;
                    self.restart(true);
                    return;
                }
                // A young gate's first unpaid double probe is evidence,
                // not yet a decision (see the module doc): the same probe
                // again at once. Beside a busy neighbour it steps singly
                // anyway, and one unpaid probe ends its youth as before.
                if up && self.startup && !self.shared && !self.failed_once {
                    self.failed_once = true;
                    self.paid_once = false;
                    self.restart_with(true, 1);
                    return;
                }
                // Any other outcome ends the young gate's double steps,
                // and the evidence of an earlier paid probe.
                self.failed_once = false;
                self.startup = false;
                self.paid_once = false;
                if up {
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    // A down probe, soon: the gain may be past the knee.
                    self.restart_with(false, 1);
                } else if probe >= cruise * (1.0 - DOWN_LOSS) {
                    if !self.lost_nothing_once {
                        // As up: one comparison is evidence, the same
                        // probe again at once decides.
                        self.lost_nothing_once = true;
                        self.restart_with(false, 1);
                        return;
                    }
                    self.lost_nothing_once = false;
                    self.counts.down_kept += 1;
                    self.gain = (self.effective() / STEP).max(self.lowest());
                    self.restart(true);
                } else {
                    self.lost_nothing_once = false;
                    self.restart(true);
                }
            }
        }
    }

    /// In the unmeasured part of a cruise: every phase's length of rounds,
    /// compare the rate since the last check with the regime's, and drop
    /// the back-off on a new regime.
    fn check_regime(&mut self, now: Nanos, delivered_bytes: u64) {
        if self.backoff <= 1 || self.round % PHASE_ROUNDS != 0 {
            return;
        }
        let last = self.check.replace((now, delivered_bytes));
        let (Some((t, b)), Some(regime)) = (last, self.regime) else {
            return;
        };
        if now <= t || regime <= 0.0 {
            return;
        }
        let rate = (delivered_bytes - b) as f64 / now.nanos_since(t) as f64;
        if rate > regime * REGIME || rate * REGIME < regime {
            self.backoff = 1;
            self.paid_once = false;
            self.failed_once = false;
            self.lost_nothing_once = false;
            // The probe that ended the double steps measured the old
            // path: the new one climbs from the kept gain as a young
            // gate does (see the module doc).
            self.startup = self.gain < self.max;
            self.regime = Some(rate);
            self.restart(true);
        }
    }

    fn restart(&mut self, next_up: bool) {
        self.restart_with(next_up, self.backoff);
    }

    fn restart_with(&mut self, next_up: bool, backoff: u32) {
        self.phase = Phase::Before { next_up };
        self.cruise_rounds = PHASE_ROUNDS * backoff.max(1);
        self.round = 0;
        self.before = None;
        self.probe = None;
        self.neighbours_before.clear();
        self.neighbours_probe.clear();
        self.measure = Measure::default();
        self.check = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neighbours::NeighbourTotals;

    /// Drives `p` with a path whose rate (bytes/ns) at gain `g` is
    /// `rate(g)`, one round per µs, for `rounds` rounds.
    fn drive(
        p: &mut GainProbe,
        rounds: u32,
        rate: impl Fn(f64) -> f64,
        t: &mut u64,
        bytes: &mut f64,
    ) {
        for _ in 0..rounds {
            *t += 1_000;
            *bytes += rate(p.current()) * 1_000.0;
            p.on_round(Nanos(*t), *bytes as u64, true);
        }
    }

    #[test]
    fn climbs_while_more_in_flight_delivers_more() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        // Throughput grows with the gain up to 8, flat above.
        drive(&mut p, 2000, |g| g.min(8.0), &mut t, &mut b);
        assert!(
            p.gain() >= 8.0 / STEP && p.gain() <= 8.0 * STEP,
            "{}",
            p.gain()
        );
    }

    /// A young gate keeps `× STARTUP_STEP` per paid probe: one A-B-A
    /// (three phases) per step, on the grid 2, 4.5, 10.1, and the
    /// ceiling; the double steps then end.
    #[test]
    fn a_young_gate_climbs_in_double_steps() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        let mut gains = Vec::new();
        for _ in 0..3 {
            assert!(p.in_startup());
            drive(&mut p, 3 * PHASE_ROUNDS, |g| g, &mut t, &mut b);
            gains.push(p.gain());
        }
        assert_eq!(gains, [4.5, 2.0 * STARTUP_STEP * STARTUP_STEP, 16.0]);
        assert!(!p.in_startup());
        let c = p.counts();
        assert_eq!((c.up, c.up_kept, c.down, c.undecided), (3, 3, 0, 0));
    }

    /// A young gate's double step that paid less than [`SURE_GAIN`]
    /// once is not kept either: one lucky comparison on a flat path (the
    /// probe's phase measured 10 % high) keeps nothing, and the two
    /// unpaid ones after it end the double steps.
    #[test]
    fn a_young_gate_keeps_nothing_on_one_lucky_probe() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        let mut lucky = true;
        while p.counts().up < 3 {
            assert!(p.in_startup());
            let bump = if lucky && p.probing() { 1.1 } else { 1.0 };
            drive(&mut p, 1, |_| 5.0 * bump, &mut t, &mut b);
            lucky &= p.counts().up == 0;
        }
        assert_eq!(p.gain(), 2.0);
        assert_eq!(p.counts().up_kept, 0);
        assert!(!p.in_startup());
    }

    /// Where the gate's window is at its floor (gain 3 there), a paid
    /// probe up is kept from the floor: the window it measured (the
    /// floor's × 2.25) is the window the gate then keeps.
    #[test]
    fn a_probe_from_the_floor_keeps_the_window_it_measured() {
        let mut p = GainProbe::new(2.0, 16.0);
        p.set_floor(3.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, 3 * PHASE_ROUNDS, |g| g, &mut t, &mut b);
        assert_eq!((p.counts().up, p.counts().up_kept), (1, 1));
        assert_eq!(p.gain(), 3.0 * STARTUP_STEP);
    }

    /// A probe down from a gain under the floor cannot lower the window,
    /// so it would lose nothing and always be kept: none is tried there.
    #[test]
    fn no_probe_down_where_the_window_is_at_its_floor() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, 3 * PHASE_ROUNDS, |g| g, &mut t, &mut b);
        assert_eq!(p.gain(), 4.5);
        // The bandwidth-delay product fell: the window is at its floor up
        // to gain 6, and the path is flat.
        p.set_floor(6.0);
        drive(&mut p, 200 * PHASE_ROUNDS, |_| 5.0, &mut t, &mut b);
        assert_eq!(p.counts().down, 0);
        assert_eq!(p.gain(), 4.5);
        assert!(p.counts().up > 1);
        // With the floor gone, the flat path's probes down are kept.
        p.set_floor(0.0);
        drive(&mut p, 200 * PHASE_ROUNDS, |_| 5.0, &mut t, &mut b);
        assert!(p.counts().down_kept >= 1, "{:?}", p.counts());
        assert!(p.gain() < 4.5);
    }

    /// One up probe that does not pay leaves a young gate young: the
    /// same double probe follows at once (no back-off); the second in a
    /// row ends the double steps, and the next up probe is `× STEP`.
    #[test]
    fn two_unpaid_probes_in_a_row_end_the_double_steps() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, PHASE_ROUNDS, |_| 5.0, &mut t, &mut b);
        assert_eq!(p.probe_factor(), Some(STARTUP_STEP));
        drive(&mut p, 2 * PHASE_ROUNDS, |_| 5.0, &mut t, &mut b);
        assert!(p.in_startup());
        assert_eq!((p.counts().up, p.counts().up_kept), (1, 0));
        drive(&mut p, PHASE_ROUNDS, |_| 5.0, &mut t, &mut b);
        assert_eq!(p.probe_factor(), Some(STARTUP_STEP));
        drive(&mut p, 2 * PHASE_ROUNDS, |_| 5.0, &mut t, &mut b);
        assert!(!p.in_startup());
        assert_eq!(p.gain(), 2.0);
        assert_eq!((p.counts().up, p.counts().up_kept), (2, 0));
        let mut factors = Vec::new();
        for _ in 0..MAX_BACKOFF * 8 * PHASE_ROUNDS {
            drive(&mut p, 1, |_| 5.0, &mut t, &mut b);
            if let Some(f) = p.probe_factor() {
                if factors.last() != Some(&f) {
                    factors.push(f);
                }
            }
        }
        assert!(factors.contains(&STEP), "{factors:?}");
        assert!(!factors.contains(&STARTUP_STEP), "{factors:?}");
    }

    /// Ends a young gate's double steps with two unpaid probes on a flat
    /// path (the gain stays at `min`).
    fn grown_up(p: &mut GainProbe, t: &mut u64, b: &mut f64) {
        drive(p, 6 * PHASE_ROUNDS, |_| 5.0, t, b);
        assert!(!p.in_startup());
        assert_eq!(p.gain(), 2.0);
    }

    /// Past the young climb, one comparison that paid less than
    /// [`SURE_GAIN`] keeps nothing: the same probe follows at once (no
    /// back-off), and the second paid one keeps the step.
    #[test]
    fn a_grown_gate_keeps_an_up_probe_that_pays_twice() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        grown_up(&mut p, &mut t, &mut b);
        let before = p.counts();
        let mut gains = Vec::new();
        let mut rounds = 0;
        // A step of 1.5 delivers 10.7 % more.
        while p.counts().up < before.up + 2 {
            drive(&mut p, 1, |g| g.powf(0.25), &mut t, &mut b);
            rounds += 1;
            if p.counts().up > before.up + gains.len() as u64 {
                gains.push(p.gain());
            }
        }
        assert_eq!(gains, [2.0, 2.0 * STEP]);
        assert_eq!(p.counts().up_kept, before.up_kept + 1);
        // The confirming probe came without the back-off the unpaid probe
        // had earned: two cruise-probe-cruise cycles, and the down probe
        // the unpaid one asked for (also at most three phases).
        assert!(rounds <= 9 * PHASE_ROUNDS, "{rounds} rounds");
    }

    /// A comparison that paid [`SURE_GAIN`] or more is kept at once: a
    /// pipeline far from full climbs a step per probe.
    #[test]
    fn a_probe_that_pays_much_is_kept_at_once() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        grown_up(&mut p, &mut t, &mut b);
        let up0 = p.counts().up;
        while p.counts().up < up0 + 1 {
            drive(&mut p, 1, |g| g, &mut t, &mut b);
        }
        assert_eq!(p.gain(), 2.0 * STEP);
    }

    /// One lucky comparison on a flat path (the probe's phase measured
    /// 10 % high) is not kept: the confirming probe does not pay.
    #[test]
    fn one_lucky_probe_keeps_nothing() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        grown_up(&mut p, &mut t, &mut b);
        let up0 = p.counts().up;
        let mut lucky = true;
        while p.counts().up < up0 + 2 {
            let bump = if lucky && p.probing() { 1.1 } else { 1.0 };
            drive(&mut p, 1, |_| 5.0 * bump, &mut t, &mut b);
            lucky &= p.counts().up == up0;
        }
        assert_eq!(p.gain(), 2.0);
        assert_eq!(p.counts().up_kept, 0);
    }

    /// One round of a neighbour that stays busy (four requests) at a
    /// latency `p`'s window does not move (1 ms), told to `p`: its
    /// probes cost it nothing, so only the busy-neighbour rules apply.
    fn busy_at_a_steady_latency(p: &mut GainProbe, neighbour: &mut NeighbourTotals) {
        neighbour.completions += 4;
        neighbour.latency_ns += 4 * 1_000_000;
        p.set_neighbours(&[*neighbour]);
    }

    /// Drives a fresh gate (ceiling 64, past its young climb) over a path
    /// whose rate at gain `g` is `rate(g)` (at most 1), each phase's
    /// length measuring with a spread `sigma` (a sum of four uniforms, so
    /// about normal), for 400,000 rounds; `beside`: next to a busy
    /// neighbour whose latency the gate does not move (so its probes cost
    /// it nothing, and only the thresholds differ from alone). Returns the
    /// mean gain, the mean share of `rate(64)` delivered, and the counts.
    fn noisy_model(rate: impl Fn(f64) -> f64, sigma: f64, beside: bool) -> (f64, f64, ProbeCounts) {
        let mut p = GainProbe::new(2.0, 64.0);
        p.startup = false;
        let (mut t, mut b) = (0, 0.0);
        let mut x = 7u64;
        let mut noise = 1.0;
        let (mut gains, mut delivered) = (0.0, 0.0);
        let (_, _, mut neighbour) = beside_a_neighbour();
        let n = 400_000;
        for i in 0..n {
            if i % PHASE_ROUNDS == 0 {
                noise = 1.0;
                for _ in 0..4 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    noise += sigma * 1.732 * ((x >> 33) as f64 / (1u64 << 31) as f64 - 0.5);
                }
            }
            if beside {
                busy_at_a_steady_latency(&mut p, &mut neighbour);
            }
            delivered += rate(p.current()) / rate(64.0);
            drive(&mut p, 1, |g| 5.0 * rate(g) * noise, &mut t, &mut b);
            gains += p.gain();
        }
        (gains / n as f64, delivered / n as f64, p.counts())
    }

    /// A flat path whose phases measure with a spread of 8 % (the writer
    /// beside a saturated device in the guest): one comparison pays 5 %
    /// about 30 % of the time there. Measured here: 8 % of the up probes
    /// kept and a mean gain of 3.04 before a busy neighbour lowered the
    /// floor to 1; one comparison each way (before): 31 % and 6.2.
    #[test]
    fn a_noisy_flat_path_keeps_few_up_probes() {
        let (mean, _, c) = noisy_model(|_| 1.0, 0.08, true);
        assert!(c.up >= 100, "{c:?}");
        assert!(
            (c.up_kept as f64) < 0.15 * c.up as f64,
            "{c:?}: kept up {} of {}",
            c.up_kept,
            c.up
        );
        assert!(mean < 3.5, "mean gain {mean}, {c:?}");
    }

    /// Alone, the same flat path walks without a bias (up kept at +2 %,
    /// down at −2 %, each on two comparisons): higher than beside a
    /// neighbour, but nowhere near the ceiling, since half the probes
    /// each way fail and every failed up probe backs the probing off.
    /// Measured here: mean gain 4.57 (at +5 % for up alone too: 3.04).
    #[test]
    fn a_noisy_flat_path_alone_walks_without_a_bias() {
        let (mean, _, c) = noisy_model(|_| 1.0, 0.08, false);
        let (beside, _, _) = noisy_model(|_| 1.0, 0.08, true);
        assert!(mean > beside, "alone {mean}, beside {beside}");
        assert!(mean < 8.0, "mean gain {mean}, {c:?}");
    }

    /// A pipeline that keeps paying less and less per step (1 − e^(−g/8))
    /// with the same noise: a step near the knee pays 5 % or loses 2 %
    /// about as often as not, so both directions need the same evidence.
    /// Measured here, beside a neighbour: 0.967 of the rate at gain 64
    /// delivered (one comparison each way: 0.965; two up and one down:
    /// 0.938); alone (+2 % keeps an up probe): 0.977, mean gain 37.
    #[test]
    fn a_noisy_pipeline_keeps_its_window() {
        let rate = |g: f64| 1.0 - (-g / 8.0).exp();
        let (mean, delivered, c) = noisy_model(rate, 0.08, true);
        assert!(
            delivered > 0.955,
            "delivered {delivered}, mean gain {mean}, {c:?}"
        );
        let (mean, alone, c) = noisy_model(rate, 0.08, false);
        assert!(
            alone > delivered,
            "alone {alone}, beside {delivered}, mean gain {mean}, {c:?}"
        );
    }

    #[test]
    fn stays_low_where_more_in_flight_delivers_nothing() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        let mut probing = 0;
        for _ in 0..20_000 {
            drive(&mut p, 1, |_| 5.0, &mut t, &mut b);
            assert_eq!(p.gain(), 2.0);
            probing += u32::from(p.probing());
        }
        // Backed off: a probe of 16 rounds per 32 × 16 rounds of cruise
        // (plus the measured cruises around it).
        assert!(probing * 20 < 20_000, "probing {probing} of 20000 rounds");
    }

    #[test]
    fn comes_down_when_the_path_saturates() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, 2000, |g| g, &mut t, &mut b);
        assert!(p.gain() >= 16.0 / STEP, "{}", p.gain());
        // Now flat: probes down lose nothing and are kept.
        drive(&mut p, 20_000, |_| 3.0, &mut t, &mut b);
        assert_eq!(p.gain(), 2.0);
    }

    /// A path where probes do not pay backs the probe off to its longest
    /// cruise; then the workload changes to one whose rate is lower and
    /// grows with the gain. The gain must start climbing within a few
    /// phases, not after the old back-off's hundreds of rounds.
    #[test]
    fn a_new_regime_drops_the_back_off() {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, 20_000, |_| 5.0, &mut t, &mut b);
        assert_eq!(p.gain(), 2.0);
        assert_eq!(p.backoff, MAX_BACKOFF);
        // Half the rate, and now more in flight delivers more.
        let mut rounds = 0;
        while p.gain() < 2.0 * STEP {
            drive(&mut p, 1, |g| g.min(8.0) * 0.6, &mut t, &mut b);
            rounds += 1;
            assert!(
                rounds < 10 * PHASE_ROUNDS,
                "still backed off after {rounds} rounds"
            );
        }
        // The same change without the regime check would have waited for
        // the rest of a cruise of MAX_BACKOFF phases.
        assert!(rounds < MAX_BACKOFF * PHASE_ROUNDS / 2);
    }

    /// A new regime makes the gate young again: past its double steps
    /// and backed off on a flat path, it meets a path with 8x the rate
    /// that grows with the gain, and climbs it in double steps again.
    #[test]
    fn a_new_regime_climbs_in_double_steps() {
        let mut p = GainProbe::new(2.0, 64.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, 20_000, |_| 5.0, &mut t, &mut b);
        assert!(!p.in_startup());
        assert_eq!(p.backoff, MAX_BACKOFF);
        let before = p.counts();
        let mut factors = Vec::new();
        let mut rounds = 0;
        while p.gain() < 2.0 * STARTUP_STEP * STARTUP_STEP {
            drive(&mut p, 1, |g| 20.0 * g.min(32.0), &mut t, &mut b);
            if let Some(f) = p.probe_factor() {
                if factors.last() != Some(&f) {
                    factors.push(f);
                }
            }
            rounds += 1;
            assert!(
                rounds < 20 * PHASE_ROUNDS,
                "gain {} after {rounds} rounds",
                p.gain()
            );
        }
        // Two paid probes, one A-B-A each, both double steps.
        assert_eq!(factors, [STARTUP_STEP]);
        let c = p.counts();
        assert_eq!((c.up - before.up, c.up_kept - before.up_kept), (2, 2));
        assert_eq!(p.gain(), 2.0 * STARTUP_STEP * STARTUP_STEP);
        assert!(p.in_startup());
    }

    /// A flat path, each round's rate off by up to ±20 %: returns the
    /// gain after 40,000 rounds and the rounds spent probing, beside a
    /// busy neighbour the probes cost nothing, or alone.
    fn steady_path(beside: bool) -> (f64, u32) {
        let mut p = GainProbe::new(2.0, 16.0);
        let (mut t, mut b) = (0, 0.0);
        let mut x = 1u64;
        let mut probing = 0;
        let (_, _, mut neighbour) = beside_a_neighbour();
        for _ in 0..40_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = 0.8 + 0.4 * ((x >> 33) as f64 / (1u64 << 31) as f64);
            if beside {
                busy_at_a_steady_latency(&mut p, &mut neighbour);
            }
            drive(&mut p, 1, |_| 5.0 * noise, &mut t, &mut b);
            probing += u32::from(p.probing());
        }
        (p.gain(), probing)
    }

    /// A tenant at a saturated device spends a few per cent of its time
    /// probing; alone, where an up probe is kept at +2 %, a little more.
    #[test]
    fn a_steady_path_keeps_its_back_off() {
        let (gain, probing) = steady_path(true);
        assert!(gain <= 2.0 * STEP, "{gain}");
        assert!(probing * 20 < 40_000, "probing {probing} of 40000 rounds");
        let (gain, probing) = steady_path(false);
        assert!(gain <= 2.0 * STEP * STEP, "{gain}");
        assert!(
            probing * 10 < 40_000,
            "alone: probing {probing} of 40000 rounds"
        );
    }

    #[test]
    fn application_limited_rounds_decide_nothing() {
        let mut p = GainProbe::new(2.0, 16.0);
        let mut t = 0;
        let mut b = 0u64;
        for _ in 0..5000 {
            t += 1_000;
            // The rate grows with the gain, but no round reached the window.
            b += (p.current() * 1000.0) as u64;
            p.on_round(Nanos(t), b, false);
        }
        assert_eq!(p.gain(), 2.0);
        let c = p.counts();
        assert_eq!((c.up, c.down), (0, 0));
        assert!(c.undecided >= 5000 / PHASE_ROUNDS as u64 - 1, "{c:?}");
    }

    #[test]
    fn equal_bounds_disable_probing() {
        let mut p = GainProbe::new(2.0, 2.0);
        let (mut t, mut b) = (0, 0.0);
        drive(&mut p, 1000, |g| g, &mut t, &mut b);
        assert_eq!((p.gain(), p.current(), p.probing()), (2.0, 2.0, false));
    }

    /// Drives `p` as [`drive`] does, beside a neighbour that completes
    /// `per_round` requests a round at a mean latency of `latency(g)` ns
    /// when `p`'s gain is `g`, and tells `p` its totals every round.
    fn drive_beside(
        p: &mut GainProbe,
        rounds: u32,
        rate: impl Fn(f64) -> f64,
        latency: impl Fn(f64) -> f64,
        per_round: u64,
        state: &mut (u64, f64, NeighbourTotals),
    ) {
        drive_beside_every(p, rounds, rate, latency, 1, per_round, true, state)
    }

    /// The state [`drive_beside`] starts from: time 0, nothing
    /// delivered, and a neighbour (token 7) that has completed nothing.
    fn beside_a_neighbour() -> (u64, f64, NeighbourTotals) {
        let neighbour = NeighbourTotals {
            id: 7,
            ..NeighbourTotals::default()
        };
        (0, 0.0, neighbour)
    }

    /// As [`drive_beside`], the neighbour completing `per_rounds` requests
    /// every `every` rounds, and every round `bound` or not.
    #[allow(clippy::too_many_arguments)]
    fn drive_beside_every(
        p: &mut GainProbe,
        rounds: u32,
        rate: impl Fn(f64) -> f64,
        latency: impl Fn(f64) -> f64,
        every: u32,
        per_rounds: u64,
        bound: bool,
        state: &mut (u64, f64, NeighbourTotals),
    ) {
        for i in 0..rounds {
            let g = p.current();
            state.0 += 1_000;
            state.1 += rate(g) * 1_000.0;
            if i % every == 0 {
                state.2.completions += per_rounds;
                state.2.latency_ns += (latency(g) * per_rounds as f64) as u64;
            }
            p.set_neighbours(&[state.2]);
            p.on_round(Nanos(state.0), state.1 as u64, bound);
        }
    }

    /// A young gate beside a busy neighbour steps by `STEP`, not
    /// `STARTUP_STEP`, even where its probes pay and cost the neighbour
    /// nothing.
    #[test]
    fn a_young_gate_beside_a_busy_neighbour_steps_singly() {
        let mut p = GainProbe::new(2.0, 64.0);
        let mut st = beside_a_neighbour();
        while p.counts().up_kept == 0 {
            drive_beside(&mut p, 1, |g| g, |_| 1_000.0, 20, &mut st);
        }
        assert_eq!(p.gain(), 2.0 * STEP);
        assert!(p.in_startup());
    }

    /// A QD 1 neighbour that completes one request every three rounds
    /// (5 in a phase's 12, under `MIN_COMPLETIONS`): the phase goes on
    /// until it has enough, so a young writer's double step that pays it
    /// 25 % (one comparison would do) and doubles the neighbour's latency
    /// is seen, and not kept.
    #[test]
    fn a_phase_waits_for_a_slow_neighbour() {
        let rate = |g: f64| if g > 2.0 { 1.25 } else { 1.0 };
        let latency = |g: f64| if g > 2.0 { 2_000.0 } else { 1_000.0 };
        let mut p = GainProbe::new(2.0, 64.0);
        let mut st = beside_a_neighbour();
        drive_beside_every(&mut p, 400, rate, latency, 3, 1, true, &mut st);
        assert_eq!(p.counts().up_kept, 0, "{:?}", p.counts());
        assert!(p.counts().up >= 1, "{:?}", p.counts());
        assert!(p.gain() <= 2.0, "{}", p.gain());
    }

    /// A gate whose window is above its application's demand (every
    /// round application-limited, as a QD 128 writer at gain 22.8 in the
    /// guest): alone, every cruise is undecided and the gain stays; beside
    /// a busy neighbour whose latency follows the gain, it is probed down,
    /// to one bandwidth-delay product.
    #[test]
    fn a_window_above_the_demand_comes_down_beside_a_busy_neighbour() {
        let latency = |g: f64| 1_000.0 * g.min(30.0);
        let mut alone = GainProbe::new(2.0, 64.0);
        alone.gain = 22.8;
        let mut st = (0, 0.0, NeighbourTotals::default());
        drive_beside_every(&mut alone, 2000, |_| 1.0, latency, 1, 0, false, &mut st);
        assert_eq!(alone.gain(), 22.8);
        assert!(alone.counts().undecided > 10, "{:?}", alone.counts());

        let mut seen = GainProbe::new(2.0, 64.0);
        seen.gain = 22.8;
        let mut st = beside_a_neighbour();
        drive_beside_every(&mut seen, 4000, |_| 1.0, latency, 1, 20, false, &mut st);
        assert_eq!(seen.gain(), SHARED_MIN_GAIN, "{:?}", seen.counts());
    }

    /// A writer whose every step up pays it 6 % (above `UP_GAIN`, as a
    /// deeper window pays in the guest) while its neighbour's latency
    /// grows with the writer's gain: alone it climbs; seen beside the
    /// neighbour, every step up costs more than it pays, steps down give
    /// the neighbour more than they cost, and the gain goes below its
    /// `min` of 2, to the one bandwidth-delay product of
    /// `SHARED_MIN_GAIN`.
    #[test]
    fn a_probe_that_costs_its_neighbour_more_than_it_pays_is_not_kept() {
        let rate = |g: f64| 1.06f64.powf(g.ln() / STEP.ln());
        let latency = |g: f64| 1_000.0 * (1.0 + g);
        let mut alone = GainProbe::new(2.0, 64.0);
        let mut st = (0, 0.0, NeighbourTotals::default());
        drive_beside(&mut alone, 3000, rate, latency, 0, &mut st);
        assert!(alone.gain() >= 10.0, "alone: {}", alone.gain());
        assert_eq!(alone.last_cost(), 0.0, "an idle neighbour costs nothing");

        let mut seen = GainProbe::new(2.0, 64.0);
        let mut st = beside_a_neighbour();
        drive_beside(&mut seen, 3000, rate, latency, 20, &mut st);
        assert_eq!(seen.gain(), SHARED_MIN_GAIN, "{:?}", seen.counts());
        assert_eq!(seen.counts().up_kept, 0, "{:?}", seen.counts());
        assert!(seen.counts().down_kept >= 2, "{:?}", seen.counts());
    }

    /// A neighbour whose latency does not move with the probe's gain
    /// (it shares nothing on the path the probe fills) changes nothing:
    /// the gain climbs as it does alone.
    #[test]
    fn a_neighbour_the_probe_does_not_slow_does_not_hold_it_back() {
        let mut p = GainProbe::new(2.0, 16.0);
        let mut st = beside_a_neighbour();
        drive_beside(&mut p, 2000, |g| g.min(8.0), |_| 5_000.0, 20, &mut st);
        assert!(p.gain() >= 8.0 / STEP, "{}", p.gain());
    }
}
